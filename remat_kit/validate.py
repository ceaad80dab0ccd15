"""Check a prediction on a real GPU: run the step there, read the allocator, compare.

``rk.memory_report`` predicts a step's peak from a deviceless compile for a named GPU. On a
machine that has that GPU, :func:`validate` runs the same step for real for a few steps, reads
the allocator's ``peak_bytes_in_use`` and ``bytes_limit`` from ``device.memory_stats()``, and
compiles the step deviceless for the catalogue target matching the local device, so the two
figures can be compared.

What the allocator measures: ``peak_bytes_in_use`` is the most bytes XLA's BFC allocator
had handed out at once since the process started (jaxlib keeps no way to reset it). The step's
peak is therefore taken as ``peak_bytes_in_use`` after the steps minus ``bytes_in_use`` before
its arguments were placed, and only when the steps raised the process's peak (otherwise an
earlier allocation was larger and the result says so: run each check in a fresh process).
The real step is compiled before its arguments are placed, so compile-time scratch memory
(autotuning) is not counted against it.

The statistics come from a :class:`StatsSource`, so the logic runs on a CPU with a fake one
(tests/test_validate.py); :class:`LocalGPU` is the real one.

Example (it needs an NVIDIA GPU, so it is not run as a doctest)::

  import remat_kit_models as models, remat_kit as rk
  from remat_kit.validate import validate
  cfg = models.get_config("llama3.2-1b", policy="full")
  step = rk.build_train_step(models.build(cfg), rk.TrainConfig(batch=4, seq=2048))
  v = validate(step)  # on a machine with an H100: compiled for h100-80gb, run there
  print(f"{v.error:+.1%}")  # predicted / measured - 1
"""

from __future__ import annotations

import dataclasses
import glob
import statistics
import time
from collections.abc import Mapping
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from jax.sharding import SingleDeviceSharding

from remat_kit.analysis import memory_report
from remat_kit.errors import BadValue, TargetError
from remat_kit.targets import Target, as_target, target, target_names

__all__ = [
    "LocalGPU",
    "StatsSource",
    "Validation",
    "match_target",
    "validate",
]


class StatsSource(Protocol):
    """Where :func:`validate` runs the step and reads the allocator's statistics.

    ``device()`` is the jax device the step runs on; ``device_kind()`` its kind as jax names it
    (``"NVIDIA H100 80GB HBM3"``); ``memory_stats()`` that device's allocator statistics
    (``bytes_in_use``, ``peak_bytes_in_use``, ``bytes_limit``; None where the backend keeps
    none, as jax's CPU backend does).
    """

    def device(self) -> Any: ...

    def device_kind(self) -> str: ...

    def memory_stats(self) -> Mapping[str, int] | None: ...


class LocalGPU:
    """The first local NVIDIA GPU, as jax sees it: the :class:`StatsSource` of a real check.

    Args:
      index: which local GPU (0: the first).

    Raises:
      TargetError: this machine has no NVIDIA GPU jax can use (checked before jax starts its
        backends where possible, so a CPU-only machine fails at once, without a CUDA probe).

    Example (on a machine with an H100; not run as a doctest)::

      LocalGPU().device_kind()  # 'NVIDIA H100 80GB HBM3'
    """

    def __init__(self, index: int = 0) -> None:
        if not glob.glob("/dev/nvidia[0-9]*"):
            raise TargetError(
                "no NVIDIA GPU on this machine (no /dev/nvidia* device): a real-GPU check runs "
                "the step on a local GPU; predictions alone need none (a deviceless target)"
            )
        try:
            gpus = jax.devices("gpu")
        except RuntimeError as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise TargetError(
                f"jax sees no GPU here ({first}): install jax[cuda12] and leave JAX_PLATFORMS "
                "unset (or set it to cuda)"
            ) from err
        if not 0 <= index < len(gpus):
            raise BadValue(f"GPU index {index} out of range: jax sees {len(gpus)} GPU(s)")
        self._device = gpus[index]

    def device(self) -> Any:
        return self._device

    def device_kind(self) -> str:
        return str(self._device.device_kind)

    def memory_stats(self) -> Mapping[str, int] | None:
        return self._device.memory_stats()


@dataclasses.dataclass(frozen=True)
class Validation:
    """A predicted peak beside the one the allocator measured on the real GPU (one device).

    Attributes:
      target: the catalogue target the prediction was compiled for.
      device_kind: the local device's kind, e.g. ``"NVIDIA H100 80GB HBM3"``.
      steps: train steps run.
      predicted_peak_bytes: the deviceless compile's peak (argument + output + temp - alias).
      measured_peak_bytes: ``peak_bytes_in_use`` after the steps minus ``bytes_in_use``
        before the arguments were placed; None when the step ran out of memory or did not
        raise the process's peak (see ``note``).
      bytes_limit: the allocator's limit (``memory_stats()["bytes_limit"]``), or None.
      usable_bytes: what remat_kit takes as usable on ``target`` (its allocator fraction).
      baseline_bytes: ``bytes_in_use`` before the arguments were placed.
      peak_before_bytes: ``peak_bytes_in_use`` once the arguments were placed, before any step.
      peak_after_bytes: ``peak_bytes_in_use`` after the steps.
      oom: the real step (or placing its arguments) ran out of device memory.
      predicted_fits: the prediction is within ``bytes_limit`` (None without a limit).
      step_seconds: median wall time of the steps after the first, a warm-up (None with
        fewer than 2).
      predicted_step_seconds: the step time remat_kit.timing predicts for ``target`` from the
        same deviceless compile (None where the target has no speed figures).
      note: why ``measured_peak_bytes`` is None, or ``""``.
      meta: labels from the caller (model, policy, batch ...).
    """

    target: str
    device_kind: str
    steps: int
    predicted_peak_bytes: int
    measured_peak_bytes: int | None
    bytes_limit: int | None
    usable_bytes: int | None
    baseline_bytes: int
    peak_before_bytes: int
    peak_after_bytes: int | None
    oom: bool
    predicted_fits: bool | None
    step_seconds: float | None
    predicted_step_seconds: float | None = None
    note: str = ""
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured; None without a measurement."""
        if not self.measured_peak_bytes:
            return None
        return (self.predicted_peak_bytes - self.measured_peak_bytes) / self.measured_peak_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field, plus ``error``."""
        out = dataclasses.asdict(self)
        out["meta"] = dict(self.meta)
        out["error"] = self.error
        return out


def match_target(device_kind: str) -> Target:
    """The catalogue GPU target whose device kind is ``device_kind`` (jax's name for it).

    Args:
      device_kind: e.g. ``jax.devices()[0].device_kind``.

    Returns:
      The Target (allocator fraction from the environment, as the local process has it).

    Raises:
      TargetError: no catalogue target has that device kind; the message lists those known.

    Example:
      >>> match_target("NVIDIA H100 80GB HBM3").name
      'h100-80gb'
    """
    kinds = {}
    for name in target_names():
        if name in ("cpu", "local"):
            continue
        kinds[target(name).description] = name
    key = device_kind.strip()
    if key not in kinds:
        known = "; ".join(f"{k!r} ({n})" for k, n in sorted(kinds.items()))
        raise TargetError(
            f"no catalogue target for device kind {device_kind!r}: name the target to compile "
            f"for (validate(step, target=NAME)). Known: {known}"
        )
    return target(kinds[key])


def validate(
    step: Any,
    target: Target | str | None = None,
    steps: int = 3,
    stats_source: StatsSource | None = None,
    *,
    meta: Mapping[str, Any] | None = None,
) -> Validation:
    """Runs ``step`` on the local GPU and compares its measured peak with the prediction.

    Args:
      step: an unsharded ``rk.build_train_step`` step (``fn``, ``args``, ``donate_argnums``).
      target: the catalogue target to compile the prediction for; default the one whose
        device kind matches the local device (:func:`match_target`).
      steps: train steps to run (the outputs feed the next step, donation as compiled).
      stats_source: where to run and read statistics; default :class:`LocalGPU`.
      meta: labels kept in the result.

    Returns:
      The :class:`Validation`.

    Raises:
      BadValue: ``steps`` not a positive int, or a sharded step.
      TargetError: no local GPU, no allocator statistics, or a device kind with no
        catalogue target (and no ``target`` given).

    Example (it needs an NVIDIA GPU, so it is not run as a doctest)::

      v = validate(step, steps=3)
      v.predicted_peak_bytes, v.measured_peak_bytes, v.error
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise BadValue(f"steps={steps!r} must be a positive int")
    if getattr(step, "plan", None) is not None:
        raise BadValue(
            f"validate runs a step on one GPU; this one is sharded ({step.plan.spec}): "
            "build it without sharding"
        )
    source = stats_source if stats_source is not None else LocalGPU()
    kind = source.device_kind()
    t = match_target(kind) if target is None else as_target(target)
    if t.kind != "gpu":
        raise BadValue(f"target {t.name!r} is not a GPU target: validate compares with a GPU")
    first = source.memory_stats()
    if first is None:
        raise TargetError(
            f"the device {kind!r} keeps no allocator statistics (memory_stats() is None): "
            "validate needs a GPU"
        )
    t = _with_local_limit(t, first.get("bytes_limit"))
    predicted = memory_report(
        step.fn,
        *step.args,
        target=t,
        donate_argnums=step.donate_argnums,
        count_flops=False,
        warn=False,
    )
    run = _run(step, source, steps)
    measured, note = run.measured, run.note
    limit = run.stats_after.get("bytes_limit") or run.stats_before.get("bytes_limit")
    return Validation(
        target=t.name,
        device_kind=kind,
        steps=steps,
        predicted_peak_bytes=predicted.peak_bytes,
        measured_peak_bytes=measured,
        bytes_limit=limit,
        usable_bytes=t.usable_bytes,
        baseline_bytes=run.baseline,
        peak_before_bytes=run.peak_before,
        peak_after_bytes=run.stats_after.get("peak_bytes_in_use"),
        oom=run.oom,
        predicted_fits=None if limit is None else predicted.peak_bytes <= limit,
        step_seconds=run.step_seconds,
        predicted_step_seconds=_seconds_of(getattr(predicted, "step_time", None)),
        note=note,
        meta=dict(meta or {}),
    )


@dataclasses.dataclass(frozen=True)
class _Run:
    baseline: int
    peak_before: int
    stats_before: Mapping[str, int]
    stats_after: Mapping[str, int]
    measured: int | None
    oom: bool
    step_seconds: float | None
    note: str


def _run(step: Any, source: StatsSource, steps: int) -> _Run:
    device = source.device()
    sharding = SingleDeviceSharding(device)
    placed = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), step.args
    )
    # Compile first: XLA's autotuning allocates scratch memory that is not the step's.
    compiled = jax.jit(step.fn, donate_argnums=step.donate_argnums).lower(*placed).compile()
    make = jax.jit(
        lambda: _random_like(step.args),
        out_shardings=jax.tree.map(lambda _: sharding, step.args),
    )
    before = dict(source.memory_stats() or {})
    baseline = int(before.get("bytes_in_use", 0))
    peak_start = int(before.get("peak_bytes_in_use", 0))
    try:
        args = jax.block_until_ready(make())
    except Exception as err:  # jax raises its runtime error type for an OOM; re-raise others
        if not _is_oom(err):
            raise
        after = dict(source.memory_stats() or {})
        return _Run(
            baseline,
            peak_start,
            before,
            after,
            None,
            True,
            None,
            _oom_note("placing the arguments"),
        )
    placed_stats = dict(source.memory_stats() or {})
    peak_before = int(placed_stats.get("peak_bytes_in_use", 0))
    times = []
    try:
        for _ in range(steps):
            start = time.perf_counter()
            tr, opt, loss = compiled(*args)
            jax.block_until_ready((tr, opt, loss))
            times.append(time.perf_counter() - start)
            args = _next_args(args, tr, opt)
    except Exception as err:
        if not _is_oom(err):
            raise
        after = dict(source.memory_stats() or {})
        return _Run(
            baseline, peak_before, before, after, None, True, None, _oom_note("running the step")
        )
    after = dict(source.memory_stats() or {})
    peak_after = int(after.get("peak_bytes_in_use", 0))
    # The first step is a warm-up (module load, cuBLAS handles); the median of the rest.
    step_seconds = statistics.median(times[1:]) if len(times) > 1 else None
    if peak_after <= max(peak_start, peak_before) and peak_after > 0:
        note = (
            f"the steps did not raise the process's peak ({peak_after} bytes, reached before "
            "they ran): an earlier allocation was larger; run the check in a fresh process"
        )
        return _Run(baseline, peak_before, before, after, None, False, step_seconds, note)
    return _Run(
        baseline, peak_before, before, after, peak_after - baseline, False, step_seconds, ""
    )


def _seconds_of(step_time: Any) -> float | None:
    return step_time.seconds if step_time is not None else None


def _random_like(args: Any) -> Any:
    # Random values, not zeros: a matrix product runs measurably faster on zeros than on real
    # data, and zeros hide nothing the timing should see. Floats are small and non-negative
    # (an optimizer's second moment must be); integers (token ids, keys) stay zero, always in
    # range.
    leaves, treedef = jax.tree.flatten(args)
    keys = jax.random.split(jax.random.key(0), max(len(leaves), 1))
    out = [
        (0.02 * jnp.abs(jax.random.normal(k, s.shape, jnp.float32))).astype(s.dtype)
        if jnp.issubdtype(s.dtype, jnp.floating)
        else jnp.zeros(s.shape, s.dtype)
        for k, s in zip(keys, leaves, strict=True)
    ]
    return jax.tree.unflatten(treedef, out)


def _with_local_limit(t: Target, bytes_limit: int | None) -> Target:
    # Compile with the limit this process's allocator really has (XLA's remat pass works to
    # it), not the catalogue card's at the environment's fraction: they differ when the
    # local card's total memory is not the catalogue's.
    if not bytes_limit or not t.memory_bytes:
        return t
    return t.with_mem_fraction(min(1.0, bytes_limit / t.memory_bytes), "measured bytes_limit")


def _next_args(args: tuple[Any, ...], tr: Any, opt: Any) -> tuple[Any, ...]:
    # fn(trainable, frozen, opt_state, batch[, rng]) -> (trainable, opt_state, loss)
    return (tr, args[1], opt, *args[3:])


def _is_oom(err: Exception) -> bool:
    text = str(err)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def _oom_note(where: str) -> str:
    return f"out of device memory while {where}"
