"""The sentences under tables: how a figure was made, what "fits" means, how a limit was set.

Each function takes data (a report's ``meta``, a target, what an import set) and returns one line;
:mod:`remat_kit.render._tables` and the other renderers put them in captions and titles, the
CLI in the notes under a run (``remat_kit.cli._model.run_notes``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from remat_kit._units import gib, size

if TYPE_CHECKING:
    from remat_kit.sources import EnvSet
    from remat_kit.targets import Target

__all__ = [
    "SCHEDULER_WORDS",
    "collective_words",
    "depth_words",
    "expert_words",
    "fits_rule",
    "flags_words",
    "limit_words",
    "nothing_fits_words",
    "runtime_words",
    "xla_limits_words",
]

#: How XLA's scheduler line names its limit (remat_kit.xla.parse_xla_log): a note that says it
#: shows a limit of XLA's own.
SCHEDULER_WORDS = "its scheduler plans for"


#: Why a model was compiled at full depth (remat_kit.sources._depth.FULL_DEPTH_REASONS), in words.
_FULL_DEPTH: Mapping[str, Callable[[Mapping[str, Any]], str]] = {
    "sharded": lambda d: "sharded steps are compiled at full depth",
    "offload": lambda d: (
        "XLA carries out a different share of an offload policy's copies at each depth"
    ),
    "layers_differ": lambda d: (
        f"its layers are not alike ({d['kinds']} kinds among {d['layers']}): the shallow "
        "copies hold only its first ones"
    ),
    "no_copies": lambda d: "the model builds no shallow copies",
    "xla_remat": lambda d: f"XLA's remat pass acted at {d['at_layers']} layers",
    "misaligned": lambda d: "the copies' schedules do not line up",
    "not_affine": lambda d: f"not affine in depth (residual {d['residual_bytes']} bytes)",
}


def depth_words(d: Mapping[str, Any]) -> str:
    """One line on how an unrolled model was compiled (``meta["depth"]``,
    :mod:`remat_kit.sources._depth`).

    Example:
      >>> print(depth_words({"mode": "full", "reason": "xla_remat", "at_layers": 3}))
      compiled at full depth: XLA's remat pass acted at 3 layers
    """
    if d["mode"] == "full":
        return f"compiled at full depth: {_FULL_DEPTH[d['reason']](d)}"
    if d["mode"] == "verified":
        return (
            "compiled at full depth to confirm the answer: the copies' "
            f"extrapolation was {size(d['extrapolated_peak_bytes'])} "
            f"({d['peak_error']:+.2%})"
        )
    # Two copies leave no residual: a fit through more says how straight it is.
    straight = f", largest fit residual {size(d['residual_bytes'])}" if len(d["depths"]) > 2 else ""
    return (
        f"extrapolated to {d['layers']} layers from compiles of "
        f"{' and '.join(map(str, d['depths']))} layers: the peak per schedule section, "
        f"at {d['section']}{straight}; final answers are compiled whole "
        "(--depth full compiles the whole model)"
    )


def expert_words(e: Mapping[str, Any]) -> str:
    """How an MoE model's experts ran in the measured program (models' ``meta["experts"]``)."""
    how = (
        f"capacity einsum dispatch (capacity factor {e['capacity_factor']:g}; tokens over an "
        "expert's capacity skip it)"
        if e["impl"] == "capacity"
        else "grouped GEMMs (ragged_dot, dropless)"
    )
    return f"experts: {e['routed']} routed, {e['per_token']} per token, as {how}"


def collective_words(summary: Mapping[str, Any], device: str = "GPU") -> str:
    """One line on what a sharded step exchanges, per ``device`` (``Target.device_word``:
    a GPU, a TPU chip) (:func:`remat_kit.sharding.collective_summary`)."""
    parts = []
    for op, row in summary.items():
        again = row.get("recomputed_launches", 0)
        parts.append(
            f"{op} {row['launches']:,}x {gib(row['bytes'])} GiB (groups of "
            f"{', '.join(map(str, row['groups']))}"
            + (
                f"; {again:,}x {gib(row['recomputed_bytes'])} GiB of it recomputed in the "
                "backward pass"
                if again
                else ""
            )
            + ")"
        )
    return f"collectives per step, per {device}: " + "; ".join(parts)


def fits_rule(target: Target) -> str:
    """One line saying what "fits" means for ``target``, e.g. for a table's caption: the one
    limit that decides it.

    Example:
      >>> print(fits_rule(rk.target("h100")))
      fits = peak <= 59.38 GiB, what a JAX process may allocate of the 79.18 GiB of h100-80gb ...
      >>> fits_rule(rk.target("cpu"))
      'fits: not judged (the target has no memory size)'
    """
    if target.usable_bytes is None:
        return "fits: not judged (the target has no memory size)"
    return (
        f"fits = peak <= {size(target.usable_bytes)}, what a JAX process may allocate of the "
        f"{size(target.memory_bytes)} of {target.name} ({runtime_words(target)}): the one "
        "limit that decides fits"
    )


def xla_limits_words(target: Target, remat_limits: Iterable[int], scheduler: bool) -> str | None:
    """What the other limits a run's notes show are, beside the one that decides ``fits``.

    XLA works to limits of its own while it compiles: its rematerialization pass to a goal
    (``MemoryReport.xla_remat_limit_bytes``), its scheduler to the memory it plans for. They
    change what XLA does, never the verdict, which is :func:`fits_rule`'s.

    Args:
      target: the target ``fits`` is judged on.
      remat_limits: the limits XLA's remat pass worked to (bytes; repeats and order ignored).
      scheduler: a note names the limit XLA's scheduler plans for.

    Returns:
      One line, or None when the notes name no limit of XLA's.

    Example:
      >>> print(xla_limits_words(rk.target("h100"), [int(57.91 * 2**30)], True))
      only 59.38 GiB decides fits; XLA's own limits in the lines below (57.91 GiB: its
      rematerialization pass's goal; the memory its scheduler plans for) steer what XLA does
      while it compiles, not whether the step fits
    """
    limits = sorted(set(remat_limits))
    if not limits and not scheduler:
        return None
    own = []
    if limits:
        goal = "goal" if len(limits) == 1 else "goals, one per program"
        own.append(f"{', '.join(size(b) for b in limits)}: its rematerialization pass's {goal}")
    if scheduler:
        own.append("the memory its scheduler plans for")
    decides = (
        f"only {size(target.usable_bytes)} decides fits"
        if target.usable_bytes is not None
        else "fits is not judged here"
    )
    return (
        f"{decides}; XLA's own limits in the lines below ({'; '.join(own)}) steer what XLA "
        "does while it compiles, not whether the step fits"
    )


def flags_words(env: EnvSet, shown: int = 3) -> str:
    """The ``XLA_FLAGS`` an import added, in one line.

    Example:
      >>> from remat_kit.sources import EnvSet
      >>> flags_words(EnvSet("XLA_FLAGS", " --a=1  --b=2 --c --d", "easydel"))[:65]
      'XLA_FLAGS set by easydel at import (4 flags: --a=1 --b=2 --c ...)'
    """
    flags = env.added()
    listed = " ".join(flags[:shown]) + (" ..." if len(flags) > shown else "")
    return (
        f"XLA_FLAGS set by {env.by} at import ({len(flags)} flag{'s' * (len(flags) != 1)}: "
        f"{listed}): these programs were compiled with them, as a process that imports "
        f"{env.by} is"
    )


def runtime_words(target: Target | None) -> str:
    """What sets the memory a JAX process may use on ``target`` (None: any GPU).

    Example:
      >>> runtime_words(rk.target("h100"))
      "allocator fraction 0.75, JAX's default"
    """
    if target is None or target.runtime is None:
        if target is not None and target.kind == "tpu":
            return "the device's HBM less libtpu's reserve"
        if target is not None:
            return "the limit jax reports"
        return "JAX's allocator fraction: 0.75 by default, XLA_PYTHON_CLIENT_MEM_FRACTION"
    rt = target.runtime
    if rt.mem_fraction is None:
        return "platform allocator: the card less the CUDA context"
    source = {"default": "JAX's default"}.get(rt.source, rt.source)
    return f"allocator fraction {rt.mem_fraction:g}, {source}"


def limit_words(target: Target, headroom: float) -> str:
    """How a search's limit was set: the usable memory at the runtime's fraction, less the
    headroom.

    Example:
      >>> limit_words(rk.target("h100"), 0.1)
      "usable at allocator fraction 0.75, JAX's default, less 10%"
    """
    words = f"usable at {runtime_words(target)}"
    return words + (f", less {100 * headroom:.0f}%" if headroom else "")


def nothing_fits_words(
    smallest: str, peak_bytes: int, label: str, limit_bytes: int, target: Target, advice: str
) -> str:
    """The one line a search says when no policy fits even its smallest point: that point,
    the smallest peak there and whose it is, the limit, and what to try.

    Args:
      smallest: the point searched from (``"batch 1"``, ``"seq 512 (batch 1)"``).
      peak_bytes: the smallest peak there; ``label`` the row it is.
      limit_bytes: the search's limit on ``target``.
      advice: what to try instead.

    Example:
      >>> line = nothing_fits_words("batch 1", 10 * 2**30, "none", 2**30, rk.target("h100"), "?")
      >>> for part in line.split(", "):
      ...     print(part)
      nothing fits: even at batch 1 the smallest peak is 10.00 GiB (none)
      over the 1.00 GiB limit on h100-80gb; ?
    """
    return (
        f"nothing fits: even at {smallest} the smallest peak is {gib(peak_bytes)} GiB "
        f"({label}), over the {gib(limit_bytes)} GiB limit on {target.label}; {advice}"
    )
