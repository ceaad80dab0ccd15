"""Which GPU to rent: does the step fit each target, and on how many GPUs it fits sharded.

:func:`advise` plans the step for every GPU target; :func:`gpus_needed` finds the fewest GPUs
of one kind whose sharded step fits each of them.

Example:
  >>> cfg = rk.TrainConfig(batch=2, seq=16, optimizer="sgd")
  >>> rows = rk.advise(lambda t: rk.sources.workload(tiny_model, t, cfg), 2, targets=["h100"])
  >>> [(a.target, a.fits, a.plan, a.max_batch) for a in rows]
  [('h100-80gb', True, 'none', 16384)]
"""

from __future__ import annotations

import dataclasses
import functools
import pickle
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from typing import Any

from remat_kit import _workers
from remat_kit.analysis import MemoryReport
from remat_kit.errors import BadType, DoesNotFit
from remat_kit.notes import Note, words
from remat_kit.policies import FULL, NO_REMAT, Policy, PolicyLike, as_policy
from remat_kit.schedules import NO_SCHEDULE
from remat_kit.search._batch import max_batch
from remat_kit.search._budget import DEFAULT_HEADROOM, limit_for
from remat_kit.search._planner import plan
from remat_kit.sources._workload import DEFAULT_HIDE, Workload
from remat_kit.targets import Target, target_names
from remat_kit.targets import target as _target

__all__ = [
    "Advice",
    "ScaleOut",
    "advise",
    "gpus_needed",
]


@dataclasses.dataclass(frozen=True)
class Advice:
    """Does the step fit one GPU target, and how.

    Attributes:
      target: target name; ``memory_bytes`` its device memory.
      fits: a plan fits the device minus headroom at the requested batch.
      plan: the plan's label (policy @ schedule), or None.
      peak_bytes: the plan's compiled peak (the smallest reached when nothing fits).
      recompute_overhead, overhead: of the plan.
      max_batch: the largest batch with ``full`` (the planner's most frugal per-layer policy).
      fixed_bytes: weights + gradients + optimizer state + batch.
      note: why not, or what the plan is, as data: the plan's note, or kind
        ``fixed_over_budget`` (what no policy removes is over the device: the
        :class:`DoesNotFit` error's fields); ``message`` is its words.
      seconds: wall time for this target.
      devices: GPUs the step runs on (``--gpus``).
      step_seconds: the plan's predicted step time at the requested batch (None: nothing
        fits, or the target has no rates); ``tokens_per_second`` all its GPUs together,
        ``mfu`` its model FLOPs utilisation.
    """

    target: str
    memory_bytes: int | None
    fits: bool
    plan: str | None
    peak_bytes: int | None
    recompute_overhead: float | None
    overhead: float | None
    max_batch: int
    fixed_bytes: int
    note: Note
    seconds: float
    devices: int = 1
    step_seconds: float | None = None
    tokens_per_second: float | None = None
    mfu: float | None = None

    @property
    def message(self) -> str:
        """The note in words: one line."""
        return words(self.note)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, the note as ``Note.to_dict()``, plus ``message``."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**out, "note": self.note.to_dict(), "message": self.message}


def advise(
    workload_for: Callable[[Target], Workload],
    batch: int,
    *,
    targets: Iterable[str] | None = None,
    headroom: float = DEFAULT_HEADROOM,
    offload: bool = True,
    hide: float = DEFAULT_HIDE,
    jobs: int = 1,
    progress: Callable[[str], None] | None = None,
    lora_for: Callable[[Target], Workload] | None = None,
    executor: Executor | None = None,
) -> tuple[Advice, ...]:
    """For every GPU target: does the step fit, with which plan, overhead and max batch.

    Args:
      workload_for: builds the Workload of the step for one Target.
      batch: the batch the user wants.
      targets: target names (default every GPU in ``rk.target_names()``).
      headroom: fraction of device memory left free.
      offload, hide: as for :func:`plan`.
      jobs: targets planned side by side in up to this many worker processes, once one needs
        a compile the on-disk cache does not have (see ``remat_kit._workers``); with more than
        1, ``workload_for`` must pickle (a module-level function or a ``functools.partial``
        of one).
      progress: called with a few words as each target is done (for a progress bar).
      lora_for: builds the Workload of the same step with LoRA adapters trained alone, for
        one Target: it sizes the LoRA hint where a GPU cannot hold the fixed parts (None: no
        LoRA hint); it must pickle as ``workload_for`` does.
      executor: where the targets that compile are planned instead of local processes, a
        ``concurrent.futures.Executor`` (a Dask cluster's:
        ``distributed.Client(address).get_executor()``); ``workload_for`` must then pickle,
        and the cache entries its workers write are stored in this machine's cache.

    Returns:
      One Advice per target, in the order given (default: by name). A target whose memory
      is below what no policy removes gets ``fits=False`` and the :class:`DoesNotFit` message.

    Raises:
      ValueError: an unknown target name.
      TypeError: ``jobs > 1`` with a ``workload_for`` that does not pickle (a lambda).

    Example:
      >>> cfg = rk.TrainConfig(batch=2, seq=16, optimizer="sgd")
      >>> workload_for = functools.partial(rk.sources.workload, tiny_model, config=cfg)
      >>> [(a.target, a.fits) for a in rk.advise(workload_for, 2, targets=["h100"])]
      [('h100-80gb', True)]
    """
    names = (
        [n for n in target_names() if n not in ("cpu", "local")]
        if targets is None
        else list(targets)
    )
    resolved = [_target(n) for n in names]  # unknown names fail before any compile
    if (jobs > 1 or executor is not None) and len(resolved) > 1:
        try:
            pickle.dumps(workload_for)
        except (pickle.PicklingError, AttributeError, TypeError) as err:
            where = f"jobs={jobs}" if executor is None else "executor=..."
            raise BadType(
                f"advise({where}) plans targets in worker processes, so workload_for must "
                f"pickle (a module-level function or functools.partial of one): {err}"
            ) from None
    traces: dict[Any, tuple[dict, dict]] = {}  # shared by the targets planned in this process
    one = functools.partial(
        _advise_one, workload_for, batch, headroom, offload, hide, traces, lora_for
    )
    done: list[str] = []

    def on_done(i: int, advice: Advice) -> None:
        done.append(advice.target)
        if progress is not None:
            progress(f"{advice.target} done ({len(done)}/{len(resolved)})")

    return tuple(_workers.run(one, resolved, jobs, on_done=on_done, executor=executor))


def _advise_one(
    workload_for: Callable[[Target], Workload],
    batch: int,
    headroom: float,
    offload: bool,
    hide: float,
    traces: dict[Any, tuple[dict, dict]],
    lora_for: Callable[[Target], Workload] | None,
    t: Target,
) -> Advice:
    """The Advice for one target (module-level, so a worker process can run it)."""
    t0 = time.perf_counter()
    w = workload_for(t)
    _share_traces(w, batch, traces)
    fixed = w.fixed_bytes(batch)
    try:
        lora = None if lora_for is None else lora_for(t)
        p = plan(w, batch, None, headroom=headroom, offload=offload, hide=hide, lora=lora)
    except DoesNotFit as err:
        return Advice(
            target=t.name,
            memory_bytes=t.memory_bytes,
            fits=False,
            plan=None,
            peak_bytes=None,
            recompute_overhead=None,
            overhead=None,
            max_batch=0,
            fixed_bytes=fixed,
            note=Note.from_dict(err.note),  # check_budget's: it always carries one
            seconds=time.perf_counter() - t0,
            devices=t.devices,
        )
    fit = max_batch(w, FULL, headroom=headroom)  # from where the trace puts the boundary
    st = p.report.step_time if p.fits and p.report is not None else None
    return Advice(
        target=t.name,
        memory_bytes=t.memory_bytes,
        fits=p.fits,
        plan=p.label,
        peak_bytes=p.peak_bytes,
        recompute_overhead=p.recompute_overhead,
        overhead=p.overhead,
        max_batch=fit.batch,
        fixed_bytes=fixed,
        note=p.note,
        seconds=time.perf_counter() - t0,
        devices=t.devices,
        step_seconds=None if st is None else st.seconds,
        tokens_per_second=None if st is None else st.tokens_per_second(w.tokens(batch)),
        mfu=None if st is None else st.mfu,
    )


def _share_traces(w: Workload, batch: int, traces: dict[Any, tuple[dict, dict]]) -> None:
    """Lets ``w`` reuse the FLOP and residual traces of an earlier target's identical step.

    Tracing does not depend on the target, only on the program traced: two targets whose
    steps trace to the same residuals without remat (same tags, so the same attention kernel;
    same per-device sizes) trace the same for every policy, so the planner's ~30 traces per
    target are made once (one trace per target tells them apart). Compiles are never shared:
    they depend on the target.
    """
    if not w.plannable:
        return
    try:
        res = w.traced_residuals(NO_REMAT, NO_SCHEDULE, batch)
    except ValueError:
        return
    # The residuals without remat name every tag and size every per-device tensor: a step
    # with another attention kernel or other per-device shapes traces differently here.
    key = (
        res.bytes_by("saved"),
        tuple(sorted(res.tags.items())),
        tuple(sorted(res.tag_bytes.items())),
    )
    if key in traces:
        flops, residuals = traces[key]
        w.adopt_traces(flops, residuals)
    # The same dicts, so what this target traces from here on is there for the next one.
    traces[key] = w.trace_caches()


@dataclasses.dataclass(frozen=True)
class ScaleOut:
    """The fewest GPUs of one kind whose per-GPU compiled peak fits, sharded.

    Attributes:
      target: target name.
      devices: GPUs needed (None when none of the counts tried fits).
      batch: the global batch compiled at that count (the requested batch rounded up to a
        multiple of the data-parallel ways).
      policy: the per-layer policy compiled.
      peak_bytes: per-GPU compiled peak at ``devices`` (None when nothing fits).
      tried: (devices, per-GPU peak) for every count compiled.
      note: what was found, as data (kind ``scale_out_fits`` or ``scale_out_none``);
        ``message`` is its words.
      step_seconds: the predicted step time at ``devices`` (None: nothing fits, or no
        rates); ``tokens_per_second`` all the GPUs together.
    """

    target: str
    devices: int | None
    batch: int
    policy: str
    peak_bytes: int | None
    tried: tuple[tuple[int, int], ...]
    note: Note
    step_seconds: float | None = None
    tokens_per_second: float | None = None

    @property
    def message(self) -> str:
        """The note in words: one line for the user."""
        return words(self.note)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, the note as ``Note.to_dict()``, plus ``message``."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["tried"] = [list(t) for t in self.tried]
        return {**out, "note": self.note.to_dict(), "message": self.message}


def _fits_on(
    w: Workload,
    n: int,
    b: int,
    pol: Policy,
    report: MemoryReport,
    tried: tuple[tuple[int, int], ...],
) -> ScaleOut:
    """The answer of :func:`gpus_needed` where ``n`` GPUs fit: ``report`` compiled at global
    batch ``b``, after the counts ``tried``."""
    st, name = report.step_time, w.target.name
    return ScaleOut(
        name,
        n,
        b,
        pol.spec,
        report.peak_bytes,
        tried,
        Note(
            "scale_out_fits",
            {
                "target": name,
                "devices": n,
                "device": w.target.device_word,
                "peak_bytes": report.peak_bytes,
                "policy": pol.spec,
                "batch": b,
            },
        ),
        step_seconds=None if st is None else st.seconds,
        tokens_per_second=None if st is None else st.tokens_per_second(w.tokens(b)),
    )


def gpus_needed(
    workload_for: Callable[[int], Workload],
    batch: int,
    *,
    policy: PolicyLike = "full",
    counts: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    headroom: float = DEFAULT_HEADROOM,
) -> ScaleOut:
    """The fewest GPUs (from ``counts``, in order) whose sharded step fits each GPU.

    Each count is compiled (per-GPU figures, e.g. FSDP over that many devices, as
    ``workload_for`` builds it) under ``policy``; the first whose compiled peak fits the
    device minus ``headroom`` is the answer. Per-GPU weights, gradients and optimizer state
    shrink with the count under FSDP, so the search stops at the first fit.

    Args:
      workload_for: builds the Workload for ``n`` devices (its target has ``n`` devices).
      batch: the global batch wanted; rounded up to the workload's batch multiple.
      policy: the per-layer policy (default ``full``, the most frugal one).
      counts: device counts to try, ascending.
      headroom: fraction of device memory left free.

    Returns:
      A ScaleOut.

    Raises:
      ValueError: a target without a memory size; a headroom outside [0, 1).

    Example:
      >>> cfg = rk.TrainConfig(batch=2, seq=16, optimizer="sgd")
      >>> def workload_for(n):
      ...     return rk.sources.workload(tiny_model, rk.target("h100", devices=n), cfg)
      >>> so = gpus_needed(workload_for, batch=2, counts=(1, 2, 4))
      >>> so.devices, so.tried[0][0]
      (1, 1)
    """
    pol = as_policy(policy)
    tried: list[tuple[int, int]] = []
    name, device, b = "?", "GPU", batch
    for n in counts:
        w = workload_for(n)
        name, device = w.target.name, w.target.device_word
        limit = limit_for(w.target, None, headroom)
        b = -(-batch // w.batch_multiple) * w.batch_multiple
        report = w.compiled(pol, NO_SCHEDULE, b)
        peak = report.peak_bytes
        tried.append((n, peak))
        if peak <= limit:
            return _fits_on(w, n, b, pol, report, tuple(tried))
    return ScaleOut(
        name,
        None,
        b,
        pol.spec,
        None,
        tuple(tried),
        Note(
            "scale_out_none",
            {
                "target": name,
                "devices": counts[-1],
                "device": device,
                "peak_bytes": tried[-1][1],
                "policy": pol.spec,
            },
        ),
    )
