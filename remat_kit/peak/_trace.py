"""Memory beside time: a compiled step's predicted kernel timeline and its live bytes, aligned.

The step-time model prices every kernel (:func:`remat_kit.timing.program_timeline` lays them
out in XLA's schedule); the inspector counts the bytes live at every schedule position
(``PeakReport.timeline`` and, by category, ``PeakReport.series``). :func:`step_trace` puts
the two on one time axis: each position starts when its instruction's kernel starts (a
position that launches nothing, at the time of the next launch), so the live-bytes counters
change where the kernels that make and free the buffers run. ``render.trace_events`` turns
the result into a Chrome trace (Perfetto, chrome://tracing).

What the counters measure: the bytes live at each position, as ``PeakReport.timeline``
counts them; their largest is ``live_peak_bytes``, which is ``peak_bytes`` less
``fragmentation_bytes`` (the part of XLA's temp block free at the peak).

Example:
  >>> import jax, jax.numpy as jnp, remat_kit as rk
  >>> x = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16)
  >>> r = rk.inspect(lambda a: jnp.tanh(a @ a) @ a, x, target="h100", series=True)
  >>> t = step_trace(r, rk.target("h100"))
  >>> max(t.total) == r.live_peak_bytes, t.seconds > 0
  (True, True)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from remat_kit.errors import BadValue
from remat_kit.peak._types import PeakReport
from remat_kit.targets import Target
from remat_kit.timing import Launch, program_timeline, speed_of

__all__ = [
    "StepTrace",
    "step_trace",
]


@dataclasses.dataclass(frozen=True)
class StepTrace:
    """One step on the predicted timeline: its launches and its live bytes over time.

    Attributes:
      seconds: the step's predicted length (``step_time(...).seconds`` of its kernels).
      launches: every kernel launch, in execution order (a loop's body once per trip).
      exposed_seconds: asynchronous collectives' time the compute could not hide; the step
        waits for it after its last launch.
      times: seconds from the step's start of each counter sample (one per schedule
        position as it runs, a loop's positions once per trip).
      positions: the schedule position of each sample.
      total: live device bytes at each sample (``PeakReport.timeline``).
      by_category: category -> device bytes its live buffers cover at each sample.
      host: bytes in host memory at each sample.
      peak_bytes: the report's peak (argument + output + temp - alias).
      live_peak_bytes: the report's most bytes live at one position (``max(total)``).
    """

    seconds: float
    launches: tuple[Launch, ...]
    exposed_seconds: float
    times: tuple[float, ...]
    positions: tuple[int, ...]
    total: tuple[int, ...]
    by_category: Mapping[str, tuple[int, ...]]
    host: tuple[int, ...]
    peak_bytes: int
    live_peak_bytes: int


def step_trace(report: PeakReport, target: Target) -> StepTrace:
    """Aligns a report's live bytes with its program's predicted kernel timeline.

    Args:
      report: from ``inspect(..., series=True)`` (or ``inspect_step``).
      target: the GPU target it was compiled for (its rates price the kernels).

    Returns:
      The StepTrace.

    Raises:
      BadValue: the report holds no series (inspected without ``series=True``), or the
        target has no step-time model (the CPU, a local device).
    """
    if report.series is None:
        raise BadValue("the report holds no live-bytes series: inspect with series=True")
    speed = speed_of(target)
    if speed is None:
        raise BadValue(
            f"target {target.name!r} has no step-time model: a trace needs a catalogue GPU",
            param="target",
        )
    s = report.series
    tl = program_timeline(s.hlo_text, s.sequence, speed, devices_per_host=target.devices_per_host)
    # A position that launches nothing starts with the next launch: its buffers are made
    # or freed by the kernel that runs there.
    starts = [t for _, t in tl.steps]
    positions = [p for p, _ in tl.steps]
    return StepTrace(
        seconds=tl.seconds,
        launches=tl.launches,
        exposed_seconds=tl.exposed_seconds,
        times=tuple(starts),
        positions=tuple(positions),
        total=tuple(report.timeline[p] for p in positions),
        by_category={c: tuple(v[p] for p in positions) for c, v in s.by_category.items()},
        host=tuple(s.host[p] for p in positions),
        peak_bytes=report.peak_bytes,
        live_peak_bytes=report.live_peak_bytes,
    )
