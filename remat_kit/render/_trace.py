"""A step's predicted kernels and live bytes as a Chrome trace (Perfetto, chrome://tracing).

The trace event format's JSON object form: ``traceEvents`` holds ``M`` (metadata: the names
of processes and threads), ``X`` (complete events: a kernel, ``ts`` its start and ``dur`` its
length, both in microseconds) and ``C`` (counters: live bytes, one sample where the bytes
change). One process per policy, so ``inspect --diff`` shows both on one time axis: thread 1
the kernels in stream order, thread 2 the asynchronous collectives that run beside them.

Example:
  >>> import jax, jax.numpy as jnp, remat_kit as rk
  >>> x = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16)
  >>> r = rk.inspect(lambda a: jnp.tanh(a @ a) @ a, x, target="h100", series=True)
  >>> doc = trace_events([rk.peak.step_trace(r, rk.target("h100"))], ["f"])
  >>> sorted({e["ph"] for e in doc["traceEvents"]})
  ['C', 'M', 'X']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from remat_kit.peak import StepTrace

__all__ = [
    "HOST",
    "TOTAL",
    "trace_events",
]

_US = 1e6
_STREAM, _BESIDE = 1, 2
#: The counter of all live device bytes (each category's is an arg of "live bytes by category").
TOTAL = "live device bytes"
#: The counter of bytes in host memory (an offload policy's residuals).
HOST = "live host bytes"


def trace_events(traces: Sequence[StepTrace], labels: Sequence[str]) -> dict[str, Any]:
    """The Chrome trace of one or more steps (one process each, ``labels`` naming them).

    Args:
      traces: from :func:`remat_kit.peak.step_trace`.
      labels: each one's process name (a policy).

    Returns:
      The trace as a JSON-ready dict (``traceEvents``, ``displayTimeUnit``, ``otherData``).
    """
    events: list[dict[str, Any]] = []
    other: dict[str, Any] = {"time": "predicted by remat_kit's step-time model", "steps": []}
    for pid, (tr, label) in enumerate(zip(traces, labels, strict=True), 1):
        events += _metadata(pid, label)
        events += _slices(pid, tr)
        events += _counters(pid, tr)
        other["steps"].append(
            {
                "label": label,
                "predicted_step_seconds": tr.seconds,
                "peak_bytes": tr.peak_bytes,
                "live_peak_bytes": tr.live_peak_bytes,
                "fragmentation_bytes": tr.peak_bytes - tr.live_peak_bytes,
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}


def _metadata(pid: int, label: str) -> list[dict[str, Any]]:
    def meta(name: str, tid: int, value: str) -> dict[str, Any]:
        return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {"name": value}}

    return [
        meta("process_name", 0, label),
        meta("process_sort_index", 0, str(pid)) | {"args": {"sort_index": pid}},
        meta("thread_name", _STREAM, "kernels (predicted)"),
        meta("thread_name", _BESIDE, "asynchronous collectives"),
    ]


def _slices(pid: int, tr: StepTrace) -> list[dict[str, Any]]:
    out = []
    for launch in tr.launches:
        k = launch.kernel
        cat = k.kind + (",recompute" if k.recompute else "")
        args: dict[str, Any] = {"op": k.op or k.kind, "recompute": k.recompute, "bytes": k.bytes}
        if k.flops:
            args["flops"] = k.flops
        if k.host_bytes:
            args["host_bytes"] = k.host_bytes
        if k.kind == "collective":
            args["group"] = k.group
        # The model hides asynchronous collectives behind the step's compute as a whole, so
        # one priced past the step's end is drawn up to it (its whole time in args).
        dur = min(launch.seconds, tr.seconds - launch.start)
        if dur < launch.seconds:
            args["priced_us"] = launch.seconds * _US
        out.append(
            {
                "name": k.name + (" (recompute)" if k.recompute else ""),
                "cat": cat,
                "ph": "X",
                "ts": launch.start * _US,
                "dur": dur * _US,
                "pid": pid,
                "tid": _BESIDE if launch.beside else _STREAM,
                "args": args,
            }
        )
    if tr.exposed_seconds > 0:
        end = tr.seconds - tr.exposed_seconds
        out.append(
            {
                "name": "wait for asynchronous collectives",
                "cat": "collective",
                "ph": "X",
                "ts": end * _US,
                "dur": tr.exposed_seconds * _US,
                "pid": pid,
                "tid": _STREAM,
                "args": {"op": "exposed collective time"},
            }
        )
    return out


def _counters(pid: int, tr: StepTrace) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cats = list(tr.by_category)
    series = [("total", tr.total), *((c, tr.by_category[c]) for c in cats)]
    host = any(tr.host)
    if host:
        series.append(("host", tr.host))
    last: tuple[int, ...] | None = None
    # The last sample again at the step's end: the counters span the whole step.
    times = [*tr.times, tr.seconds]
    for i, t in enumerate(times):
        j = min(i, len(tr.times) - 1)
        row = tuple(int(v[j]) for _, v in series)
        if row == last and i < len(tr.times):
            continue
        last = row
        ts = t * _US
        out.append({"name": TOTAL, "ph": "C", "ts": ts, "pid": pid, "args": {"bytes": row[0]}})
        out.append(
            {
                "name": "live bytes by category",
                "ph": "C",
                "ts": ts,
                "pid": pid,
                "args": {c: row[n] for n, c in enumerate(cats, 1)},
            }
        )
        if host:
            out.append({"name": HOST, "ph": "C", "ts": ts, "pid": pid, "args": {"bytes": row[-1]}})
    return out
