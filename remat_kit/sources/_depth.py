"""An unrolled stack of identical layers answered from compiles of shallow copies.

Compiling an unrolled model costs about its depth times one layer; a scanned one compiles one
body. Most models users bring unroll their layers, so every report, fit and plan of a 32-layer
model pays 32 layers per compile. Here the same step is compiled at shallow depths
(:data:`DEPTHS`) and the full-depth figures are read off lines through them:

- sizes that grow by the same amount per layer (arguments, outputs, aliases, host bytes,
  FLOPs, the predicted step time and its split, the breakdown) are affine in depth: the line
  through the shallowest and deepest copy;
- the peak is not. It is the largest of the live bytes at every point of the schedule, and
  points grow at different rates: the start of the backward pass holds every saved
  activation, the backward of the first layer every other layer's gradient, so the peak can
  move from one to the other between 8 and 16 layers (measured: a 2048-wide Llama under
  ``full`` is 8% over a straight line through the peaks of 2 and 4 layers at 32). So each
  copy is read from XLA's dump (its buffer assignment and live ranges,
  :mod:`remat_kit.peak._profile`): the most bytes live in each section of the schedule (per
  phase: before the layers, the first layer, the last, after them) are fitted per section
  across the copies, and the full-depth peak is the largest section at full depth.

Where an inner layer of a copy holds more than its first and last, where XLA's own
rematerialization pass acted in a copy, or where the copies' sections differ, the layers
are not the stack this assumes, and None sends the caller to compile at full depth. Given
more copies than two, the fit also says how straight it is (the largest residual of the
sections that could hold the peak) and refuses over :data:`AFFINE_TOLERANCE` of the peak.
Two copies (:data:`DEPTHS`) have no residual: an answer that is final (a fits verdict near
the limit, a fit's boundary, a plan) is compiled at full depth before it is given.

Example:
  >>> fit = fit_sections({d: {Section("backward", "before"): 4 + 3 * d} for d in (2, 3, 4)},
  ...                    layers=32)
  >>> fit.peak_live_bytes, fit.section
  (100, 'backward, before the layers')
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from remat_kit import cache
from remat_kit._jaxpr import is_checkpoint, open_jaxpr, params_of, sub_jaxprs
from remat_kit.analysis import MemoryReport, report_notes
from remat_kit.errors import BadValue
from remat_kit.peak import Section, live_sections
from remat_kit.policies import Policy
from remat_kit.schedules import Schedule
from remat_kit.sources._protocol import SourceStep, StepSource
from remat_kit.targets import Target
from remat_kit.train import TrainConfig

__all__ = [
    "AFFINE_TOLERANCE",
    "DEPTHS",
    "DEPTH_MODES",
    "FULL_DEPTH_REASONS",
    "MIN_LAYERS",
    "VERIFY_MARGIN",
    "DepthFit",
    "by_depth",
    "check_depth",
    "extrapolate_report",
    "extrapolated",
    "fit_sections",
    "layer_kinds",
    "line_at",
    "settled",
    "shallow_copies",
    "verify",
    "verify_search",
]

#: The shallow depths compiled. A copy costs about the non-layer part of the step plus its
#: layers, so the fewest and shallowest copies whose first layer is not also their last:
#: two and three layers (measured, a 2048-wide Llama on an H100: 2.6 s and 3.3 s against
#: 4.0 s for four). In a one-layer copy the last layer's backward also does the first's
#: work, and a line through one and two layers missed a 10-layer peak by 1.3%. Measured on
#: the 2048-wide Llama under none, full, minimal and dots_no_batch, the line through 2 and
#: 3 layers gives the 32-layer peak as the line through 2, 3 and 4 does, to 0.00001%; on a
#: 16-layer MoE under ``full`` both are 1.6% over (XLA schedules a vocabulary-sized buffer
#: later at full depth) and the three copies' residual was 0: a third copy buys no check
#: worth its compile. A fit's guard is the full-depth verification of final answers.
DEPTHS: tuple[int, ...] = (2, 3)
#: Below this depth a full compile costs about what the shallow copies cost.
MIN_LAYERS = 8
#: Largest residual of the section fits, as a fraction of the peak, still called affine.
AFFINE_TOLERANCE = 0.005


@dataclasses.dataclass(frozen=True)
class DepthFit:
    """The peak of a full-depth program, from the live sections of shallow copies.

    Attributes:
      layers: the full depth.
      depths: the shallow depths compiled.
      peak_live_bytes: the largest section's live bytes at full depth.
      section: where that lies (``"backward, layer 0"``).
      residual_bytes: the largest residual of the section fits that could hold the peak
        (those whose line comes within its own residual of the peak).
      sections: sections fitted.
    """

    layers: int
    depths: tuple[int, ...]
    peak_live_bytes: int
    section: str
    residual_bytes: int
    sections: int

    @property
    def affine(self) -> bool:
        """Whether the sections lie on their lines closely enough to extrapolate: the largest
        residual at most :data:`AFFINE_TOLERANCE` of the peak.

        Example:
          >>> DepthFit(8, (2, 3), 1000, "backward, layer 0", residual_bytes=5, sections=1).affine
          True
        """
        return self.residual_bytes <= AFFINE_TOLERANCE * self.peak_live_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return dataclasses.asdict(self)


def fit_sections(by_depth: Mapping[int, Mapping[Section, int]], layers: int) -> DepthFit | None:
    """Fits each section's live bytes across shallow copies and evaluates them at ``layers``.

    Inside a phase, layer ``k`` of ``d`` holds what the layers before it left (saved
    activations) and what the layers after it made (gradients): monotone in ``k``, so the
    most bytes of any layer lie at the first or the last. Those two, and the stretches
    before and after the layers, are each a line ``a + b * depth`` through the copies
    (least squares: with more than two copies the residual says how straight it is; in a
    one-layer copy the first layer is also the last). A copy whose inner layer holds more
    than its first and last breaks the premise: None.

    Args:
      by_depth: depth -> Section -> the most bytes live in it (``live_sections``).
      layers: the full depth.

    Returns:
      The DepthFit, or None where the copies' sections do not line up (a section missing
      at one depth), an inner layer peaks, or fewer than two copies were given.

    Example:
      >>> s = {d: {Section("backward", "layer", k): 100 + 10 * d - k for k in range(d)}
      ...      for d in (2, 3, 4)}
      >>> fit_sections(s, layers=8).peak_live_bytes, fit_sections(s, layers=8).section
      (180, 'backward, layer 0')
    """
    depths = sorted(by_depth)
    if len(depths) < 2:
        return None
    points: dict[tuple[str, str], dict[int, int]] = {}
    per_layer: dict[int, dict[str, dict[int, int]]] = {d: {} for d in depths}
    for d in depths:
        for sec, value in by_depth[d].items():
            if sec.role == "layer":
                per_layer[d].setdefault(sec.phase, {})[sec.layer] = value
            else:
                points.setdefault((sec.phase, f"{sec.role} the layers"), {})[d] = value
    # A phase runs every layer when it does so in every copy: an optimizer phase that names
    # one layer's ops runs "all" of a one-layer copy's layers, but not of a deeper one's.
    partial = {p for d in depths for p, ks in per_layer[d].items() if sorted(ks) != list(range(d))}
    for d in depths:
        for phase, ks in per_layer[d].items():
            if phase in partial:
                # The stretch's most bytes, as outside the layers.
                points.setdefault((phase, "spans some layers"), {})[d] = max(ks.values())
                continue
            # Every layer is in ks (the phase is not partial): an inner one peaks above
            # both ends where the largest of them all does.
            if max(ks.values()) > max(ks[0], ks[d - 1]):
                return None  # an inner layer peaks: not monotone in the layer index
            points.setdefault((phase, "first layer"), {})[d] = ks[0]
            points.setdefault((phase, "last layer"), {})[d] = ks[d - 1]
    lines: list[tuple[float, float, str]] = []  # (value at full depth, residual, where)
    for (phase, where), by_d in sorted(points.items()):
        if sorted(by_d) != depths:
            return None  # a section the other copies lack
        a = np.array([[1.0, d] for d in depths])
        y = np.array([float(by_d[d]) for d in depths])
        coef, *_ = np.linalg.lstsq(a, y, rcond=None)
        residual = float(np.max(np.abs(a @ coef - y)))
        label = where.replace("first layer", "layer 0").replace("last layer", f"layer {layers - 1}")
        lines.append((float(coef[0] + coef[1] * layers), residual, f"{phase}, {label}"))
    if not lines:
        return None
    peak, _, where = max(lines)
    residual = max(r for v, r, _ in lines if v + r >= peak)
    return DepthFit(
        layers=layers,
        depths=tuple(depths),
        peak_live_bytes=round(peak),
        section=where,
        residual_bytes=round(residual),
        sections=sum(len(s) for s in by_depth.values()),
    )


def _line(a: Any, b: Any, da: int, db: int, at: int) -> Any:
    """The value at ``at`` of the line through ``(da, a)`` and ``(db, b)``, kept in type:
    numbers (ints rounded) and mappings key by key; anything else (a list, a label) ``b``'s."""
    if isinstance(a, bool) or isinstance(b, bool):
        return b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        value = b + (b - a) * (at - db) / (db - da)
        return round(value) if isinstance(a, int) and isinstance(b, int) else value
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return {k: _line(a.get(k), v, da, db, at) if k in a else v for k, v in b.items()}
    return b


def extrapolate_report(
    shallow: Sequence[MemoryReport],
    depths: Sequence[int],
    fit: DepthFit,
    fragmentation_bytes: int,
    usable: tuple[int | None, float | None],
) -> MemoryReport:
    """The full-depth report from two shallow copies' reports and the peak's fit.

    Affine figures come from the line through the two copies (the predicted step time too,
    where both copies have one; else none); the peak from ``fit`` plus
    ``fragmentation_bytes``; temp bytes are what the peak leaves after the arguments,
    outputs and aliases. XLA's own peak is absent (no compile made it).

    Args:
      shallow: the copies' reports, shallow first.
      depths: their depths.
      fit: the peak's fit (:func:`fit_sections`).
      fragmentation_bytes: reserved but free bytes at the peak (the line through the
        copies').
      usable: the target's ``(usable_bytes, fraction_to_fit(peak) or None)``.

    Returns:
      The MemoryReport at ``fit.layers`` layers, its ``meta["depth"]`` the fit.
    """
    a, b = shallow
    da, db = depths
    fields = (
        "argument_bytes",
        "output_bytes",
        "alias_bytes",
        "host_bytes",
        "host_temp_bytes",
        "generated_code_bytes",
        "flops",
    )
    changes: dict[str, Any] = {
        f: _line(getattr(a, f), getattr(b, f), da, db, fit.layers) for f in fields
    }
    peak = fit.peak_live_bytes + fragmentation_bytes
    changes["peak_bytes"] = peak
    changes["temp_bytes"] = (
        peak - changes["argument_bytes"] - changes["output_bytes"] + changes["alias_bytes"]
    )
    changes["xla_peak_bytes"] = None
    changes["flops_detail"] = _line(a.flops_detail, b.flops_detail, da, db, fit.layers)
    changes["breakdown"] = _line(a.breakdown, b.breakdown, da, db, fit.layers)
    changes["compile_seconds"] = a.compile_seconds + b.compile_seconds
    changes["fits_with_fraction"] = usable[1]
    meta = _line(a.meta, b.meta, da, db, fit.layers)
    meta.pop("program", None)  # no one compiled program is this report's
    meta["depth"] = {**fit.to_dict(), "fragmentation_bytes": fragmentation_bytes}
    changes["meta"] = meta
    if a.step_time is not None and b.step_time is not None:
        st = _line(
            dataclasses.asdict(a.step_time), dataclasses.asdict(b.step_time), da, db, fit.layers
        )
        changes["step_time"] = dataclasses.replace(b.step_time, **st)
    else:
        changes["step_time"] = None  # one copy's prediction is not the full step's
    return b.replace(**changes)


#: What ``rk.sources.measure(depth=...)`` takes (see there).
DEPTH_MODES: tuple[str, ...] = ("auto", "full", "check", "estimate")


def check_depth(depth: str) -> str:
    """``depth`` when it is one of :data:`DEPTH_MODES`.

    Raises:
      BadValue: naming the value and the valid ones.

    Example:
      >>> check_depth("sideways")
      Traceback (most recent call last):
      remat_kit.errors.BadValue: depth='sideways': give one of auto, full, check, estimate
    """
    if depth not in DEPTH_MODES:
        raise BadValue(f"depth={depth!r}: give one of {', '.join(DEPTH_MODES)}", param="depth")
    return depth


#: How far under the limit (a fraction of it) a peak from shallow copies must be for its
#: "fits" to be given without a compile at full depth.
VERIFY_MARGIN = 0.02


# A tag as a jaxpr prints it: name[name=...], CheckpointName[name=...] under jax_remat3.
_TAG = re.compile(r"[Nn]ame(?:Fwd)?\[name=[^\]]*\]")


def layer_kinds(closed: Any) -> int | None:
    """How many different layers a traced step's stack holds: its outermost checkpoints
    (one per layer under a policy such as ``full``), told apart by their bodies' text
    (operations, shapes and constants). None when it holds fewer than two checkpoints.

    A layer whose body differs (gemma 3's global attention among its sliding-window layers:
    another mask, another RoPE base) is one the shallow copies may not hold: they are the
    model's first layers.

    Example:
      >>> layer = jax.checkpoint(lambda x: jnp.sin(x) * 2.0)
      >>> other = jax.checkpoint(lambda x: jnp.sin(x) * 3.0)
      >>> layer_kinds(jax.make_jaxpr(lambda x: layer(layer(layer(x))))(1.0))
      1
      >>> layer_kinds(jax.make_jaxpr(lambda x: other(layer(layer(x))))(1.0))
      2
      >>> layer_kinds(jax.make_jaxpr(layer)(1.0)) is None  # one layer: nothing to tell apart
      True
    """
    bodies: list[str] = []

    def walk(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            if is_checkpoint(eqn):
                # Tag names carry the layer's path (layers_3/mixer): not the computation.
                body = _TAG.sub("name[]", str(open_jaxpr(params_of(eqn)["jaxpr"])))
                bodies.append(body)
                continue  # a checkpoint inside a layer is part of that layer
            for sub in sub_jaxprs(eqn):
                walk(open_jaxpr(sub))

    walk(open_jaxpr(closed))
    return len(set(bodies)) if len(bodies) > 1 else None


def shallow_copies(source: StepSource, sch: Schedule, t: Target) -> list[StepSource] | None:
    """The copies of ``source`` at :data:`DEPTHS` layers, where its full-depth figures may
    be read off them: an unrolled stack of at least :data:`MIN_LAYERS` identical layers
    (schedule ``none``) that builds copies and is not sharded; else None.

    Example:
      >>> from remat_kit.schedules import parse_schedule
      >>> shallow_copies(rk.sources.from_factory(tiny_model), parse_schedule("none"),
      ...                rk.target("h100")) is None  # builds one depth only
      True
    """
    layers = source.n_layers()
    if sch.name != "none" or layers is None or layers < MIN_LAYERS:
        return None
    if source.mesh_plan(t) is not None or _kinds(source, t) > 1:
        return None
    copies = [source.at_depth(d) for d in DEPTHS]
    return None if any(c is None for c in copies) else copies  # type: ignore[return-value]


def _kinds(source: StepSource, t: Target) -> int:
    # Kinds of layer, where the source can tell them (a factory's); else alike.
    return source.layer_kinds(t) or 1


def line_at(shallow: Sequence[Any], depths: Sequence[int], layers: int) -> Any:
    """The value at ``layers`` of the line through two copies' figures (numbers, or mappings
    of them: ``FlopCount.to_dict()``), kept in type; anything else is the deeper copy's.

    Example:
      >>> line_at([{"total": 10.0, "loops": 0}, {"total": 14.0, "loops": 0}], (2, 3), 32)
      {'total': 130.0, 'loops': 0}
    """
    (a, b), (da, db) = shallow[-2:], depths[-2:]
    return _line(a, b, da, db, layers)


#: Why a model was compiled at full depth (``meta["depth"]["reason"]``), with the figures each
#: record carries besides.
FULL_DEPTH_REASONS: dict[str, tuple[str, ...]] = {
    "sharded": (),  # sharded steps are compiled whole
    "offload": (),  # XLA carries out a different share of the marked copies at each depth
    "layers_differ": ("kinds", "layers"),  # the copies hold only the first kind
    "no_copies": (),  # the model builds no shallow copies
    "xla_remat": ("at_layers",),  # XLA's own remat pass acted at a copy
    "misaligned": (),  # the copies' schedules do not line up
    "not_affine": ("residual_bytes",),
}


def by_depth(
    source: StepSource,
    pol: Policy,
    sch: Schedule,
    t: Target,
    config: TrainConfig,
    compile_step: Callable[[SourceStep, str], MemoryReport],
) -> tuple[MemoryReport | None, dict[str, Any]]:
    """The full-depth report of ``source`` from its shallow copies, where they allow it.

    Args:
      source: the model source (its :meth:`~remat_kit.sources.StepSource.at_depth` gives
        the copies).
      pol: the policy.
      sch: the schedule (``none``: every layer alike).
      t: the target.
      config: the train config.
      compile_step: compiles a copy's step with XLA's dump in the given directory.

    Returns:
      ``(report, record)``: the extrapolated report (None: compile at full depth) and what
      was decided, for ``meta["depth"]``: ``mode`` ``"extrapolated"`` or ``"full"``, and for
      ``full`` the ``reason`` as one of :data:`FULL_DEPTH_REASONS` with its figures (the
      render layer words it).
    """
    layers = source.n_layers()
    if sch.name != "none" or layers is None or layers < MIN_LAYERS:
        return None, {}  # a schedule's layers differ; a shallow model costs little
    if source.at_depth(DEPTHS[0]) is None:
        return None, {}  # scanned, or a factory that builds one depth
    if source.mesh_plan(t) is not None:
        return None, {"mode": "full", "reason": "sharded"}
    copies = shallow_copies(source, sch, t)
    if pol.offloads:
        # Measured: offload_dots_no_batch on a 2048-wide Llama, 32 layers, was 7% over
        # the line through 2 and 3 layers: XLA carries out a different share of the
        # marked copies at each depth.
        return None, {"mode": "full", "reason": "offload"}
    if copies is None:
        kinds = _kinds(source, t)
        if kinds > 1:
            return None, {
                "mode": "full",
                "reason": "layers_differ",
                "kinds": kinds,
                "layers": layers,
            }
        return None, {"mode": "full", "reason": "no_copies"}
    reports, sections, remat_at = _compile_copies(copies, pol, sch, t, config, compile_step)
    if remat_at is not None:
        return None, {"mode": "full", "reason": "xla_remat", "at_layers": remat_at}
    fit = fit_sections(sections, layers)
    if fit is None:
        return None, {"mode": "full", "reason": "misaligned"}
    if not fit.affine:
        return None, {"mode": "full", "reason": "not_affine", "residual_bytes": fit.residual_bytes}
    deep = reports[-1]
    # Reserved but free bytes at the peak (alignment, buffers outside the live ranges) grow
    # by a few per layer: measured on a 10-layer tiny-llama, 1,864 bytes per layer through
    # 2, 3 and 4 layers (jax 0.10 and 0.12); the deepest copy's figure as it stood was 1.1%
    # under the 10-layer peak on jax 0.12.
    frags = [
        max(0, r.peak_bytes - max(sections[d].values()))
        for d, r in zip(DEPTHS, reports, strict=True)
    ]
    frag = max(0, round(line_at(frags, DEPTHS, layers)))
    peak = fit.peak_live_bytes + frag
    fraction = None if t.fits(peak) is not False else t.fraction_to_fit(peak)
    ends = (reports[0], reports[-1])
    report = extrapolate_report(
        ends, (DEPTHS[0], DEPTHS[-1]), fit, frag, (t.usable_bytes, fraction)
    )
    notes = [*report_notes(report, pol, t), *(n for n in deep.notes if n.kind == "xla_log")]
    return report.replace(notes=tuple(notes)), dict(report.meta.depth or {}, mode="extrapolated")


def _compile_copies(
    copies: Sequence[StepSource],
    pol: Policy,
    sch: Schedule,
    t: Target,
    config: TrainConfig,
    compile_step: Callable[[SourceStep, str], MemoryReport],
) -> tuple[list[MemoryReport], dict[int, dict[Section, int]], int | None]:
    """Each shallow copy (at :data:`DEPTHS`) compiled: its report and its live sections, and
    the depth at which XLA's own remat pass acted (the copies stop there; None: it did not).
    """
    reports, sections = [], {}
    for d, copy in zip(DEPTHS, copies, strict=True):
        built = copy.build_step(pol, sch, config, t)
        # A copy's sections are kept on disk with its analysis (remat_kit.cache), under its
        # program: the same copy again (another depth mode, a later run) is not compiled.
        with (
            tempfile.TemporaryDirectory(prefix="remat_kit_depth_") as tmp,
            cache.dump_read(_section_rows, _sections_code()) as read,
        ):
            r = compile_step(built, tmp)
            if read.value is None:  # compiled here, not by remat_kit.cache
                read.value = _section_rows(tmp)
        sections[d] = {Section(p, role, k): b for p, role, k, b in read.value}
        if r.xla_remat:
            return reports, sections, d
        reports.append(r)
    return reports, sections, None


def _section_rows(directory: str) -> list[list[Any]]:
    """:func:`~remat_kit.peak.live_sections` of a dump as JSON rows ``[phase, role, layer,
    bytes]`` (what the cache keeps)."""
    return [[s.phase, s.role, s.layer, b] for s, b in sorted(live_sections(directory).items())]


def _sections_code() -> str:
    # What reads the sections: the peak package, and this module's rows.
    return "sections-rows-1:" + cache.code_fingerprint("remat_kit.peak")


def settled(report: MemoryReport, limit: int | None = None) -> bool:
    """Whether the report's verdict against ``limit`` (default: the usable memory) may be
    given from shallow copies: it fits with more than :data:`VERIFY_MARGIN` of the limit
    plus its fit's residual to spare. A verdict near the limit could flip, and "does not
    fit" is where copies were measured furthest off (a 2048-wide Llama at batch 4: 111 GiB
    from copies, 36 GiB compiled whole), so both are compiled at full depth.

    Example:
      >>> r = rk.memory_report(lambda a: a @ a, jax.ShapeDtypeStruct((64, 64), jnp.float32),
      ...                      target="h100")
      >>> settled(r, limit=r.peak_bytes + 100), settled(r, limit=2 * r.peak_bytes)
      (False, True)
    """
    limit = report.usable_bytes if limit is None else limit
    if limit is None:
        return True  # no memory size: no verdict to give
    depth = report.meta.depth or {}
    slack = VERIFY_MARGIN * limit + int(depth.get("residual_bytes", 0))
    return report.peak_bytes + slack < limit


def extrapolated(report: MemoryReport) -> bool:
    """Whether ``report``'s figures were read off shallow copies (no full-depth compile)."""
    return (report.meta.depth or {}).get("mode") == "extrapolated"


def verify(
    report: MemoryReport,
    compile_full: Callable[[], MemoryReport],
    limit: int | None = None,
    *,
    always: bool = False,
) -> MemoryReport:
    """``report``, or the full-depth compile of its step where its answer is final.

    A report extrapolated from shallow copies is replaced by ``compile_full()`` when
    ``always`` (a final answer: the boundary of a fit, a plan's choice, ``--depth check``)
    or when its verdict against ``limit`` is not :func:`settled` (near the limit, or over
    it). The full report's ``meta["depth"]`` keeps the fit and adds the extrapolation's
    peak and its error.

    Args:
      report: a report from :func:`by_depth` (any other is returned as it is).
      compile_full: compiles the same step at full depth.
      limit: the bytes the verdict is against (default: the usable memory).
      always: verify whatever the verdict.

    Returns:
      A MemoryReport; ``meta["depth"]["mode"]`` is ``"verified"`` when it was compiled here.
    """
    if not extrapolated(report) or not (always or not settled(report, limit)):
        return report
    full = compile_full()
    record = {
        **(report.meta.depth or {}),
        "mode": "verified",
        "extrapolated_peak_bytes": report.peak_bytes,
        "peak_error": report.peak_bytes / full.peak_bytes - 1.0,
        "extrapolated_compile_seconds": report.compile_seconds,
    }
    return full.replace(meta={**full.meta, "depth": record})


def verify_search(
    report: MemoryReport | None, compile_full: Callable[[], MemoryReport], limit: int | None
) -> MemoryReport:
    """A search's check of a report (``rk.Workload.estimates``): with no ``report``, the
    step compiled whole; with no ``limit``, a final answer (:func:`verify` ``always``);
    else :func:`verify` against ``limit``."""
    if report is None:
        return compile_full()
    return verify(report, compile_full, limit, always=limit is None)
