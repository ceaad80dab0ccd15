"""What the peak of a train step is made of: weights, gradients, optimizer state, activations.

``add_breakdown`` is the estimate from shapes (what no policy removes, and the rest);
``measured_breakdown`` reads XLA's buffer assignment through the peak inspector, so its parts
sum to the compiled peak exactly.
"""

from __future__ import annotations

from collections.abc import Mapping

from remat_kit import peak as _peak
from remat_kit.analysis import MemoryReport
from remat_kit.errors import BadValue, InspectError
from remat_kit.notes import Note
from remat_kit.targets import Target
from remat_kit.train import TrainStep

__all__ = [
    "MEASURED_PARTS",
    "add_breakdown",
    "add_measured_breakdown",
    "measured_breakdown",
]


def add_breakdown(report: MemoryReport, step: TrainStep) -> MemoryReport:
    """Adds the weights/gradients/optimizer/activations split to a train-step report.

    Weights, optimizer state, batch, gradients and accumulator come from the shapes;
    ``activations`` is the rest of the compiled peak: saved activations, recomputation
    workspace, logits and other temporaries.
    """
    parts = dict(step.breakdown)
    if any(k not in parts for k in ("weights", "optimizer", "batch", "gradients")):
        # A user's step whose roles were not all given: the parts not known are absent, and
        # so is the rest (tables say "unknown").
        return report.replace(breakdown=parts)
    # An accumulator no shape names (a user's step) is among the temporaries.
    known = (
        parts["weights"]
        + parts["optimizer"]
        + parts["batch"]
        + parts["gradients"]
        + parts.get("grad_accumulator", 0)
    )
    parts["activations"] = max(0, report.peak_bytes - known)
    if report.peak_bytes >= known:
        return report.replace(breakdown=parts)
    # Unrolled layers let XLA apply each layer's update as soon as its gradient exists, so
    # not every gradient is live at the peak: "the rest" would be negative.
    note = Note("breakdown_upper_bound", {"peak_bytes": report.peak_bytes, "known_bytes": known})
    return report.replace(breakdown=parts, notes=(*report.notes, note))


#: Measured breakdown key -> the peak inspector's category it reads (remat_kit.peak).
MEASURED_PARTS: Mapping[str, str] = {
    "weights": _peak.PARAMETER,
    "gradients": _peak.GRADIENT,
    "optimizer": _peak.OPTIMIZER_STATE,
    "batch": _peak.INPUT,
    "saved_activations": _peak.SAVED_ACTIVATION,
    "recompute_workspace": _peak.RECOMPUTE,
    "temporaries": _peak.TEMPORARY,
    "fragmentation": _peak.FRAGMENTATION,
}


def measured_breakdown(step: TrainStep, target: Target | str = "h100-80gb") -> dict[str, int]:
    """What is live at the compiled peak of ``step``, by role, from XLA's buffer assignment.

    Unlike :func:`add_breakdown` (shapes, with activations as "the rest"), every figure is
    read from the compiled program (``rk.peak.inspect_step``): the bytes of each role live
    at the peak. They sum to the peak exactly and none is negative. Gradients count only
    those live at the peak, so they may be fewer than the weights.

    Args:
      step: a ``build_train_step`` step (unsharded).
      target: a Target or target name; GPU targets compile deviceless.

    Returns:
      ``weights``, ``gradients``, ``optimizer``, ``batch``, ``saved_activations``,
      ``recompute_workspace``, ``temporaries`` (other temporaries, logits among them) and
      ``fragmentation`` (reserved in XLA's temp block, free at the peak), in bytes, plus
      ``peak`` (their sum, argument + output + temp - alias of that compile).

    Raises:
      BadValue: a sharded step (the inspector reads one unsharded program).
      InspectError: XLA's dump could not be read.

    Example:
      >>> step = rk.build_train_step(tiny_model("full"), rk.TrainConfig(2, 16))
      >>> parts = measured_breakdown(step, "h100")
      >>> parts["peak"] == sum(v for k, v in parts.items() if k != "peak")
      True
    """
    if step.plan is not None:
        raise BadValue(
            f"a measured breakdown reads one unsharded program; this step is sharded "
            f"({step.plan.spec}): build it without sharding, or use the estimate (add_breakdown)"
        )
    peak = _peak.inspect_step(step, target)
    by_cat = peak.by_category
    parts = {key: int(by_cat.get(cat, 0)) for key, cat in MEASURED_PARTS.items()}
    parts["peak"] = sum(parts.values())
    if parts["peak"] != peak.peak_bytes:  # the inspector promises this; say so if it breaks
        raise InspectError(
            f"the buffer assignment's categories sum to {parts['peak']} bytes, not the "
            f"compiled peak {peak.peak_bytes}: categories {dict(by_cat)}"
        )
    return parts


def add_measured_breakdown(
    report: MemoryReport, step: TrainStep, target: Target | str
) -> MemoryReport:
    """``report`` with the measured breakdown; the shapes' arithmetic kept as an estimate.

    The report's ``breakdown`` becomes :func:`measured_breakdown` (``activations`` = saved
    activations + recomputation workspace + temporaries + fragmentation, everything at the
    peak that is not weights, gradients, optimizer state or batch); ``meta["breakdown"]``
    says ``"measured"`` and ``meta["breakdown_estimate"]`` holds :func:`add_breakdown`'s.

    Args:
      report: the step's ``rk.memory_report``.
      step: the step it measured.
      target: the target it was compiled for.

    Returns:
      The new report.

    Raises:
      InspectError: the inspector's peak differs from the report's (not the same program).

    Example:
      >>> step = rk.build_train_step(tiny_model("full"), rk.TrainConfig(2, 16))
      >>> report = rk.memory_report(step.fn, *step.args, target="h100",
      ...                           donate_argnums=step.donate_argnums)
      >>> r = add_measured_breakdown(report, step, "h100")
      >>> r.meta["breakdown"], r.breakdown["weights"] == r.meta["breakdown_estimate"]["weights"]
      ('measured', True)
    """
    parts = measured_breakdown(step, target)
    peak = parts.pop("peak")
    if peak != report.peak_bytes:
        raise InspectError(
            f"the inspected compile peaks at {peak} bytes, the report's at {report.peak_bytes}: "
            "they did not compile the same program (different options or donation?)"
        )
    activation_keys = ("saved_activations", "recompute_workspace", "temporaries", "fragmentation")
    parts["activations"] = sum(parts[k] for k in activation_keys)
    estimate = dict(add_breakdown(report, step).breakdown)
    meta = {**report.meta, "breakdown": "measured", "breakdown_estimate": estimate}
    return report.replace(breakdown=parts, meta=meta)


# Dict keys of flattened parameter paths cannot be tuples inside a jit argument pytree
# that users read; keep the nested form at the boundary and flatten inside.
