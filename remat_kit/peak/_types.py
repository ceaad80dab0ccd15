"""The peak inspector's data: byte categories, schedule phases, and the reports it returns.

Every figure here was read from one compiled program (see :mod:`remat_kit.peak`); these
types only hold it and turn it into JSON.

Example:
  >>> from remat_kit.peak import CATEGORIES
  >>> CATEGORIES[-1]
  'fragmentation'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from remat_kit.peak._series import LiveSeries

__all__ = [
    "ARGUMENT_CATEGORIES",
    "CATEGORIES",
    "FRAGMENTATION",
    "GRADIENT",
    "INPUT",
    "OPTIMIZER_STATE",
    "PARAMETER",
    "RECOMPUTE",
    "SAVED_ACTIVATION",
    "TEMPORARY",
    "TRAIN_STEP_CATEGORIES",
    "PeakBuffer",
    "PeakDiff",
    "PeakReport",
    "Phase",
]

PARAMETER = "parameter"
GRADIENT = "gradient"
OPTIMIZER_STATE = "optimizer state"
INPUT = "input"
SAVED_ACTIVATION = "saved activation"
RECOMPUTE = "recomputation workspace"
TEMPORARY = "other temporaries"
FRAGMENTATION = "fragmentation"

#: Every category a byte at the peak can fall in, in display order. ``fragmentation``
#: is reserved by XLA's packed temp block but holds no live buffer at the peak.
CATEGORIES: tuple[str, ...] = (
    PARAMETER,
    GRADIENT,
    OPTIMIZER_STATE,
    INPUT,
    SAVED_ACTIVATION,
    RECOMPUTE,
    TEMPORARY,
    FRAGMENTATION,
)

#: Argument index -> category for ``rk.build_train_step``'s ``(trainable, frozen,
#: opt_state, batch)``.
TRAIN_STEP_CATEGORIES: Mapping[int, str] = {
    0: PARAMETER,
    1: PARAMETER,
    2: OPTIMIZER_STATE,
    3: INPUT,
}

#: The categories ``rk.inspect(categories=...)`` may give an argument.
ARGUMENT_CATEGORIES: tuple[str, ...] = (PARAMETER, OPTIMIZER_STATE, INPUT)


@dataclasses.dataclass(frozen=True)
class Phase:
    """A span of the schedule: ``forward``, ``backward``, ``optimizer`` or ``program``.

    Attributes:
      name: the phase.
      start: first schedule position (inclusive).
      end: last schedule position (inclusive).
    """

    name: str
    start: int
    end: int


@dataclasses.dataclass(frozen=True)
class PeakBuffer:
    """One buffer live at the peak.

    Attributes:
      name: XLA's value name (``<instruction>{<tuple index>}``).
      size_bytes: bytes it occupies.
      shape: its shape (empty for tuples and scalars).
      dtype: element type as XLA writes it (``bf16``, ``f32``, ``tuple``...).
      category: one of ``CATEGORIES`` (never ``fragmentation``).
      op: the producing HLO instruction's opcode or fusion kind, e.g. ``fusion``.
      op_name: the jax op_name of the producing op ('' when XLA kept none); for a
        scanned layer's stacked output, the op inside the loop body that made it.
      module_path: the Flax module path from op_name, transforms stripped, e.g.
        ``Llama/decoder/LlamaBlock/attention/query``; for arguments, the argument path.
      checkpoint_name: the ``checkpoint_name`` tag of a saved activation or of what a
        recomputation rebuilds, when it has one ("a|b" when two tags fit equally).
      layer: ``layers_3`` for an unrolled layer, ``scanned layers`` for buffers of a
        scanned stack, else ``non-layer``.
      live: (first, last) schedule positions where it is live.
      phase: the phase its producing op runs in.
    """

    name: str
    size_bytes: int
    shape: tuple[int, ...]
    dtype: str
    category: str
    op: str
    op_name: str
    module_path: str
    checkpoint_name: str | None
    layer: str
    live: tuple[int, int]
    phase: str

    @property
    def label(self) -> str:
        """What a reader calls this buffer: its checkpoint name, else its module path/op."""
        if self.checkpoint_name:
            return self.checkpoint_name
        return self.module_path or self.name


@dataclasses.dataclass(frozen=True)
class PeakReport:
    """What is live at the peak of one compiled program, and when (per device).

    Attributes:
      target: target name.
      peak_bytes: argument + output + temp - alias, as ``rk.memory_report`` reports it
        for the same program.
      live_peak_bytes: the most bytes live at one schedule position (buffers + arguments).
      fragmentation_bytes: ``peak_bytes - live_peak_bytes``: reserved by XLA's packed
        temp block but free at the peak.
      peak_position: schedule position of the live peak.
      peak_instruction: HLO instruction scheduled there; ``peak_op_name`` its op_name.
      peak_phase: the phase of the peak (``forward``, ``backward``, ``optimizer``).
      schedule_length: number of positions in the schedule.
      argument_bytes, output_bytes, temp_bytes, alias_bytes: XLA's memory analysis.
      xla_peak_bytes: XLA's own ``peak_memory_in_bytes`` when the jaxlib reports it.
      xla_live_peak_bytes: the "Live ranges at N (peak)" total of XLA's live-range
        dump, when present (a cross-check of ``live_peak_bytes``).
      buffers: every buffer live at the peak, largest first.
      by_category: bytes by category at the peak; sums to ``peak_bytes``.
      by_layer: bytes by layer at the peak (``fragmentation`` included); sums to
        ``peak_bytes``.
      timeline: live bytes at each schedule position.
      phases: the phases told apart (empty when the program has no backward pass).
      module: the HLO module name; ``jax_version`` the jax that compiled it.
      compile_seconds: lowering + compiling with the dump; ``parse_seconds`` reading it.
      meta: labels set by the caller (model, policy, batch, ...).
      host_temp_bytes: bytes an offload policy's residuals take in host memory (XLA's
        host temp block); not device memory, so not in ``peak_bytes`` or any category.
      series: live bytes at every position by category, and the program's HLO, when
        ``inspect(..., series=True)`` asked for them (a trace's data; not in ``to_dict``).
      hlo_proto: XLA's serialized ``xla.HloProto`` of the program (its buffer assignment
        in it), when ``inspect(..., hlo_proto=True)`` asked for it (not in ``to_dict``).
    """

    target: str
    peak_bytes: int
    live_peak_bytes: int
    fragmentation_bytes: int
    peak_position: int
    peak_instruction: str
    peak_op_name: str
    peak_phase: str
    schedule_length: int
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    xla_peak_bytes: int | None
    xla_live_peak_bytes: int | None
    buffers: tuple[PeakBuffer, ...]
    by_category: Mapping[str, int]
    by_layer: Mapping[str, int]
    timeline: tuple[int, ...]
    phases: tuple[Phase, ...]
    module: str
    jax_version: str
    compile_seconds: float
    parse_seconds: float
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    host_temp_bytes: int = 0
    series: LiveSeries | None = dataclasses.field(default=None, compare=False, repr=False)
    hlo_proto: bytes | None = dataclasses.field(default=None, compare=False, repr=False)

    def top(self, n: int = 10) -> tuple[PeakBuffer, ...]:
        """The ``n`` largest buffers live at the peak."""
        return self.buffers[:n]

    def by_label(self, categories: Sequence[str] | None = None) -> dict[tuple[str, str], int]:
        """Bytes at the peak by (category, label); ``categories`` filters."""
        out: dict[tuple[str, str], int] = {}
        for b in self.buffers:
            if categories is None or b.category in categories:
                key = (b.category, b.label)
                out[key] = out.get(key, 0) + b.size_bytes
        return out

    def replace(self, **changes: Any) -> PeakReport:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field."""
        out = dataclasses.asdict(dataclasses.replace(self, series=None, hlo_proto=None))
        del out["series"], out["hlo_proto"]
        out["buffers"] = [
            {**dataclasses.asdict(b), "shape": list(b.shape), "live": list(b.live)}
            for b in self.buffers
        ]
        out["by_category"] = dict(self.by_category)
        out["by_layer"] = dict(self.by_layer)
        out["timeline"] = list(self.timeline)
        out["phases"] = [dataclasses.asdict(p) for p in self.phases]
        out["meta"] = dict(self.meta)
        return out


@dataclasses.dataclass(frozen=True)
class PeakDiff:
    """What the second report keeps at its peak that the first does not.

    Attributes:
      peak_delta: ``b.peak_bytes - a.peak_bytes``.
      by_category: category -> bytes in ``b`` minus bytes in ``a`` (at each one's peak).
      kept: ``(category, label, bytes_a, bytes_b)`` rows where ``b`` holds more, largest
        difference first; the label is the checkpoint name or the module path/op.
      dropped: the same rows where ``a`` holds more.
      peak_phases: (phase of a's peak, phase of b's peak).
    """

    peak_delta: int
    by_category: Mapping[str, int]
    kept: tuple[tuple[str, str, int, int], ...]
    dropped: tuple[tuple[str, str, int, int], ...]
    peak_phases: tuple[str, str]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        rows = lambda rs: [
            {"category": c, "label": lab, "bytes_a": x, "bytes_b": y, "delta": y - x}
            for c, lab, x, y in rs
        ]
        return {
            "peak_delta": self.peak_delta,
            "by_category": dict(self.by_category),
            "kept": rows(self.kept),
            "dropped": rows(self.dropped),
            "peak_phases": list(self.peak_phases),
        }
