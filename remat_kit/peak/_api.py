"""The inspector's entry points: ``rk.inspect`` for any jittable function, ``rk.peak.inspect_step``.

Example:
  >>> import jax, jax.numpy as jnp, remat_kit as rk
  >>> x = jax.ShapeDtypeStruct((256, 256), jnp.float32)
  >>> r = rk.inspect(lambda a: (a @ a) @ a, x, target="cpu")
  >>> r.peak_bytes == rk.memory_report(lambda a: (a @ a) @ a, x, target="cpu").peak_bytes
  True
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from remat_kit import sharding
from remat_kit.analysis import abstract
from remat_kit.errors import BadType, BadValue
from remat_kit.peak._attribute import analyse
from remat_kit.peak._classify import argument_leaves, key_paths
from remat_kit.peak._dump import compile_with_dump, kept_leaves, read_hlo_proto
from remat_kit.peak._libtpu import align_bytes
from remat_kit.peak._tags import tag_index
from remat_kit.peak._types import (
    ARGUMENT_CATEGORIES,
    INPUT,
    TRAIN_STEP_CATEGORIES,
    PeakReport,
)
from remat_kit.targets import Target, analysis_options, as_target

__all__ = [
    "inspect",
    "inspect_step",
]


def check_target(target: Target) -> None:
    """Checks that inspect can name the buffers live at ``target``'s peak: every target
    remat-kit compiles for can (GPU, CPU and, since libtpu's temp was read off its buffer
    assignment, TPU slices: ``remat_kit.peak._libtpu``). Kept for callers that check a target
    before a compile; it raises nothing today.

    Example:
      >>> check_target(rk.target("h100"))
      >>> check_target(rk.target("v5e-4"))
    """
    del target


def inspect(
    fn: Callable[..., Any],
    *args: Any,
    target: Target | str = "h100-80gb",
    donate_argnums: int | Sequence[int] = (),
    categories: Mapping[int, str] | None = None,
    meta: Mapping[str, Any] | None = None,
    keep_dump: str | os.PathLike[str] | None = None,
    series: bool = False,
    hlo_proto: bool = False,
    in_shardings: Any = None,
    out_shardings: Any = None,
) -> PeakReport:
    """Compiles ``fn(*args)`` for ``target`` and reports what is live at its peak (for a
    sharded program, one device's: the program each device runs, and its peak per device).

    Args:
      fn: a jittable callable (typically a train step).
      *args: arrays or ``jax.ShapeDtypeStruct`` pytrees; nothing is allocated.
      target: a Target or target name; GPU targets compile deviceless.
      donate_argnums: arguments whose buffers the outputs may reuse, as for
        ``rk.memory_report`` (the compile must be the same to report the same peak).
      categories: argument index -> ``"parameter"``, ``"optimizer state"`` or
        ``"input"``; arguments not named are ``"input"``. Gradients are recognised
        as backward-pass buffers shaped like a ``"parameter"`` leaf. Use
        ``TRAIN_STEP_CATEGORIES`` for ``rk.build_train_step``'s step.
      meta: labels kept in the report (model, policy, ...).
      keep_dump: a directory to dump into and keep (for debugging); default a
        temporary directory, removed before returning.
      series: also keep every category's live bytes at each position and the program's
        HLO (``PeakReport.series``: the data of a trace, :func:`remat_kit.peak.step_trace`).
      hlo_proto: also keep XLA's ``HloProto`` of the program, its buffer assignment in it
        (``PeakReport.hlo_proto``: what XProf's Memory Viewer reads).
      in_shardings: as for ``jax.jit``: a ``Sharding`` (or None) per argument, or a pytree
        prefix of the arguments, on the devices of ``target`` (``target.mesh(...)``: for a GPU
        target its compile-only devices), every one spanning ``target.devices`` devices.
        The program is then the sharded one and the report one device's: its ``peak_bytes``
        the compiled program's per-device memory analysis, its buffers (and the argument
        shapes gradients are recognised by) each device's shards. A leaf it leaves None
        keeps its own sharding where that is on the target's devices, else
        ``target.sharding()``. None (and no ``out_shardings``): every argument on
        ``target.sharding()``, as without shardings.
      out_shardings: as for ``jax.jit`` (a prefix of the outputs, None where left to XLA);
        on the same devices as ``in_shardings``.

    Returns:
      The PeakReport.

    Raises:
      InspectError: XLA wrote no dump, a dump line could not be read (the message names
        file and line), or the dump disagrees with the memory analysis.
      BadValue: ``categories`` names an unknown category or argument (a ValueError),
        ``in_shardings`` is not a prefix
        of the arguments, or a sharding is on devices other than ``target``'s (another
        count, another platform); each before any compile.
      BadType: a sharding given is neither a ``jax.sharding.Sharding`` nor None.

    Example:
      >>> p = jax.ShapeDtypeStruct((64, 64), jnp.float32)
      >>> x = jax.ShapeDtypeStruct((8, 64), jnp.float32)
      >>> grad = jax.grad(lambda p, x: jnp.tanh(x @ p).sum())
      >>> r = rk.inspect(grad, p, x, target="h100", categories={0: "parameter"})
      >>> r.by_category["parameter"], r.by_category["gradient"], r.by_category["input"]
      (16384, 16384, 2048)
    """
    t = as_target(target)
    check_target(t)
    cats = _check_categories(categories, len(args))
    sharded = {}
    if in_shardings is None and out_shardings is None:
        sharding = t.sharding()
        abstract_args = tuple(abstract(a, sharding) for a in args)
    else:
        abstract_args, sharded = _sharded(t, args, in_shardings, out_shardings)
    leaves_per_arg = [jax.tree.leaves(a) for a in abstract_args]

    start = time.perf_counter()
    jitted = jax.jit(fn, donate_argnums=donate_argnums, **sharded)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*donated buffers were not usable.*")
        lowered = jitted.lower(*abstract_args)
        kept = kept_leaves(lowered, sum(len(x) for x in leaves_per_arg))
        with contextlib.ExitStack() as stack:
            # The proto is read from the dump: a temporary one lives until it is read.
            # On a TPU, libtpu's temp is read off the proto's heap traces (peak._libtpu).
            protos = hlo_proto or t.kind == "tpu"
            where = keep_dump
            if protos and where is None:
                where = stack.enter_context(tempfile.TemporaryDirectory(prefix="remat_kit_"))
            compiled, dump, texts = compile_with_dump(
                lowered, where, analysis_options(t), protos=protos
            )
            proto = read_hlo_proto(dump) if protos else None
    compile_seconds = time.perf_counter() - start
    stats = compiled.memory_analysis()

    start = time.perf_counter()
    tags = tag_index(jax.make_jaxpr(fn)(*abstract_args))
    arg_leaves = argument_leaves(leaves_per_arg, kept, cats, [key_paths(a) for a in abstract_args])
    tpu = (proto, align_bytes(os.environ)) if t.kind == "tpu" else None
    report = analyse(texts, dump, stats, arg_leaves, tags, t.name, series=series, tpu=tpu)
    text = _text(compiled) if report.series is not None else ""
    if report.series is not None and text:
        # The kernels are priced from the text rk.memory_report prices: the dump's text of
        # the same module leaves out some of what the cost model reads.
        report = report.replace(series=dataclasses.replace(report.series, hlo_text=text))
    return report.replace(
        compile_seconds=compile_seconds,
        parse_seconds=time.perf_counter() - start,
        meta=dict(meta or {}),
        hlo_proto=proto if hlo_proto else None,
    )


def inspect_step(
    step: Any,
    target: Target | str = "h100-80gb",
    *,
    meta: Mapping[str, Any] | None = None,
    series: bool = False,
    hlo_proto: bool = False,
) -> PeakReport:
    """``inspect`` for a ``rk.build_train_step`` step (its donation and categories).

    Args:
      step: a ``rk.TrainStep``.
      target: a Target or target name.
      meta: labels kept in the report.
      series, hlo_proto: as for :func:`inspect`.

    Returns:
      The PeakReport.

    Example:
      >>> step = rk.build_train_step(tiny_model("none"), rk.TrainConfig(batch=2, seq=16))
      >>> r = inspect_step(step, "h100")
      >>> r.top(1)[0].category, r.peak_phase
      ('saved activation', 'backward')
    """
    categories = getattr(step, "categories", None)
    if categories is not None and not categories:
        raise BadValue(
            "the step's arguments have no known roles (a step given without roles=): "
            "nothing says which are weights or optimizer state; give roles, or read the "
            "estimate"
        )
    return inspect(
        step.fn,
        *step.args,
        target=target,
        donate_argnums=step.donate_argnums,
        categories=TRAIN_STEP_CATEGORIES if categories is None else categories,
        meta=meta,
        series=series,
        hlo_proto=hlo_proto,
    )


def _is_none(v: Any) -> bool:
    return v is None


def _on_target(s: Any, t: Target, devices: set[Any]) -> bool:
    """Whether sharding ``s`` spans all of ``t``'s devices (``devices``) and no other."""
    return len(s.device_set) == t.devices and s.device_set <= devices


def _sharded(
    t: Target, args: tuple[Any, ...], in_shardings: Any, out_shardings: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments placed on ``in_shardings`` (a leaf it leaves None keeps its own
    sharding where that is on the target, else ``t.sharding()``) and the ``jax.jit``
    options, checked before any compile: every sharding a ``Sharding`` over ``t``'s
    devices."""
    per_leaf = sharding.per_leaf(in_shardings, args, who="rk.inspect")
    devices = set(t.mesh().devices.flat)
    for name, given in (("in_shardings", per_leaf), ("out_shardings", out_shardings)):
        for s in jax.tree.leaves(given, is_leaf=_is_none):
            if s is None:
                continue
            if not isinstance(s, jax.sharding.Sharding):
                raise BadType(
                    f"{name} holds {type(s).__name__} {s!r}; give a jax.sharding.Sharding "
                    "(a NamedSharding on target.mesh(...)) or None",
                    param=name,
                )
            if not _on_target(s, t, devices):
                n = len(s.device_set)
                raise BadValue(
                    f"{name} holds a sharding over {n} {next(iter(s.device_set)).platform} "
                    f"device(s), not over the {t.devices} of {t.label} it compiles for: give "
                    f"shardings on target.mesh(...) of a target of {n} devices",
                    param=name,
                )
    default = t.sharding()

    def place(x: Any, s: Any) -> Any:
        (x,) = jax.tree.leaves(abstract(x))  # BadType for a leaf that is not array-like
        if s is None:  # its own sharding where that is on the target, as jax.jit keeps it
            own = getattr(x, "sharding", None)
            s = (
                own
                if isinstance(own, jax.sharding.Sharding) and _on_target(own, t, devices)
                else default
            )
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)

    leaves, tree = jax.tree.flatten(tuple(args))
    picked = jax.tree.leaves(per_leaf, is_leaf=_is_none)
    placed = jax.tree.unflatten(tree, [place(x, s) for x, s in zip(leaves, picked, strict=True)])
    given = {"in_shardings": in_shardings, "out_shardings": out_shardings}
    return tuple(placed), {k: v for k, v in given.items() if v is not None}


def _text(compiled: Any) -> str:
    try:
        return compiled.as_text() or ""
    except Exception:  # a debugging API: the dump's text stays
        return ""


def _check_categories(categories: Mapping[int, str] | None, n_args: int) -> dict[int, str]:
    cats = dict(categories or {})
    for index, cat in cats.items():
        if cat not in ARGUMENT_CATEGORIES:
            raise BadValue(
                f"argument {index} has category {cat!r}; arguments are one of "
                f"{', '.join(ARGUMENT_CATEGORIES)}"
            )
        if not isinstance(index, int) or not 0 <= index < n_args:
            raise BadValue(f"categories names argument {index!r}; fn has {n_args} arguments")
    return {i: cats.get(i, INPUT) for i in range(n_args)}
