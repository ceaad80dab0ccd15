"""Notes: what the library has to tell the user, as data.

A :class:`Note` is a kind and the figures behind it (bytes, specs, names), never a sentence:
``MemoryReport.notes``, ``Fit.note``, ``Plan.note``, ``Advice.note`` and
``ScaleOut.note`` hold them. :func:`remat_kit.notes.words` makes the one line a user
reads; the RematWarning a report issues carries those words.

Every kind and the keys of its data are listed in :data:`KINDS`; a note of another kind, or
with other keys, is refused when it is made, so a typo cannot produce a note nobody can word.
Data are JSON values (tuples become lists), so ``Note.from_dict(note.to_dict()) == note``,
through ``json`` too.

Example:
  >>> note = Note("offload_moved_nothing", {"policy": "offload_dots"})
  >>> note.to_dict()
  {'kind': 'offload_moved_nothing', 'policy': 'offload_dots'}
  >>> Note.from_dict(note.to_dict()) == note
  True
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from typing import Any

from remat_kit.errors import BadType, BadValue

__all__ = [
    "HINT_KINDS",
    "KINDS",
    "Note",
]

#: Every kind of note -> the keys of its data (bytes are ints, overheads fractions).
KINDS: Mapping[str, tuple[str, ...]] = {
    # MemoryReport.notes: remat_kit.analysis
    "no_tag_matched": ("policy", "names", "tags"),
    "flash_recomputes_scores": ("policy", "kept"),
    "offload_on_cpu": ("policy",),
    "offload_moved_nothing": ("policy",),
    "xla_remat": ("target", "saved_bytes"),
    # Fit.caveats, PlanFront.caveats: an answer that fits only because XLA's own remat pass
    # took saved_bytes off its peak (peak_bytes <= limit_bytes < peak + saved); axis, value:
    # where it fits (batch 297, seq 8192); remat_kit.search._xla_fit
    "xla_remat_made_fit": (
        "policy",
        "schedule",
        "axis",
        "value",
        "saved_bytes",
        "peak_bytes",
        "limit_bytes",
    ),
    "does_not_fit": (
        "target",
        "runtime",
        "usable_bytes",
        "memory_bytes",
        "peak_bytes",
        "over_bytes",
        "reserved_by",
        "fits_with_fraction",
    ),
    "xla_log": ("line",),  # a line of XLA's own log (remat_kit.xla.parse_xla_log)
    # StepSource.notes: a source that chose XLA's attention where cuDNN's would run
    "attention_chose_xla": ("problem",),
    # StepSource.notes: an unrolled stack the source builds no shallow copy of
    "whole_model_probes": ("model", "layers"),
    # StepSource.notes: a MaxText config (remat_kit_models.maxtext)
    "maxtext_attention": ("chosen",),
    "maxtext_xla_remat": ("disabled",),
    # MemoryReport.notes: remat_kit.breakdown, remat_kit.checks, remat_kit.sources
    "breakdown_upper_bound": ("peak_bytes", "known_bytes"),
    "offload_shortfall": ("moved_bytes", "marked_bytes"),
    "offload_link_bound": ("target", "host_bytes", "transfer_seconds", "step_compute_seconds"),
    # remat_kit.checks.ragged_dots_recomputed
    "ragged_dots_recomputed": ("policy", "per_layer_bytes", "layers", "suggest"),
    # remat_kit.checks.expert_dots_recomputed
    "expert_dots_recomputed": ("policy", "per_layer_bytes", "layers"),
    # remat_kit.checks.check_policy_matches
    "no_tag_matched_in": ("policy", "names", "where", "tags"),
    "stray_tag_names": ("policy", "names", "where", "tags"),
    # Fit.note along the batch: remat_kit.search._batch
    "batch_fits": (
        "policy",
        "schedule",
        "batch",
        "peak_bytes",
        "limit_bytes",
        "next_batch",
        "next_peak_bytes",
        "unbuildable",
        "cap",
    ),
    "batch_none_fits": ("policy", "batch", "peak_bytes", "limit_bytes", "target"),
    "plan_at_max_batch": ("max_batch", "plan"),
    # Fit.note along the sequence: remat_kit.search._seq
    "seq_fits": (
        "policy",
        "schedule",
        "batch",
        "seq",
        "peak_bytes",
        "limit_bytes",
        "next_seq",
        "next_peak_bytes",
        "refused",
        "cap",
    ),
    "seq_none_fits": ("policy", "batch", "seq", "peak_bytes", "limit_bytes", "target"),
    "plan_at_max_seq": ("max_seq", "plan"),
    # Plan.note: remat_kit.search._planner
    "plan_fits": (
        "policy",
        "schedule",
        "budget_bytes",
        "peak_bytes",
        "recompute_overhead",
        "source",
        "solver",
    ),
    "plan_nothing_fits": ("target", "batch", "budget_bytes", "peak_bytes", "policy", "schedule"),
    # Advice.note, ScaleOut.note: remat_kit.search._advise
    # hints: what would fit instead, as data: {"kind": one of HINT_KINDS, its figures}
    "fixed_over_budget": (
        "label",
        "target",
        "limit_bytes",
        "parts",
        "fixed_bytes",
        "compiled_bytes",
        "hints",
    ),
    "scale_out_fits": ("target", "devices", "peak_bytes", "policy", "batch"),
    "scale_out_none": ("target", "devices", "peak_bytes", "policy"),
    # no row of a comparison fits, though the fixed parts do (remat-kit compare)
    "rows_none_fit": ("policy", "batch", "peak_bytes", "limit_bytes", "target"),
    # NextStep.note: remat_kit.search._next (change: {"kind": ..., its figures})
    "next_step_fits": ("change", "target", "policy", "peak_bytes", "limit_bytes", "compiles"),
    "next_step_none": ("tried", "compiles"),  # tried: [{kind, figures, peak_bytes}, ...]
}

#: What would fit where the fixed parts are over a budget (a ``fixed_over_budget`` note's
#: ``hints``): each kind and the keys of its figures.
HINT_KINDS: Mapping[str, tuple[str, ...]] = {
    # no optimizer state: fixed_bytes instead of from_bytes, under limit_bytes
    "sgd": ("fixed_bytes", "from_bytes", "limit_bytes"),
    # the LoRA step's own fixed parts (frozen base weights, adapters and their state)
    "lora": ("fixed_bytes", "limit_bytes"),
    "larger_budget": ("target", "usable_bytes", "fixed_bytes", "budget_gib"),
    # [[name, usable bytes], ...]: GPUs whose usable memory holds fixed_bytes
    "bigger_gpu": ("gpus", "fixed_bytes"),
    # FSDP/ZeRO-3 over gpus in all (devices now): each_bytes per GPU, under limit_bytes
    "shard": ("gpus", "each_bytes", "devices", "limit_bytes"),
    "no_realistic": ("budget_bytes", "fixed_bytes", "gpus"),  # the budget is a typo
}

# Keys the dict form of a note uses besides its data.
_RESERVED = ("kind", "text")


@dataclasses.dataclass(frozen=True)
class Note:
    """Something to tell the user, as data: what happened (``kind``) and its figures.

    Attributes:
      kind: one of :data:`KINDS`.
      data: the figures, with exactly the keys :data:`KINDS` lists for ``kind``; JSON values
        (nested mappings and lists; a nested Note is stored as its ``to_dict()``).

    Raises:
      BadValue: an unknown kind, or data with other keys than the kind's.

    Example:
      >>> Note("xla_remat", {"target": "h100-80gb", "saved_bytes": 2**30}).data["saved_bytes"]
      1073741824
    """

    kind: str
    data: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        keys = KINDS.get(self.kind)
        if keys is None:
            raise BadValue(
                f"unknown note kind {self.kind!r}; known: {', '.join(sorted(KINDS))}",
                param="kind",
            )
        if not isinstance(self.data, Mapping):
            raise BadType(
                f"a note's data must be a mapping, got {type(self.data).__name__}", param="data"
            )
        if set(self.data) != set(keys):
            raise BadValue(
                f"a {self.kind!r} note holds {', '.join(keys)}; got {', '.join(sorted(self.data))}",
                param="data",
            )
        object.__setattr__(self, "data", {k: _plain(self.data[k]) for k in keys})

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": ..., **data}``: JSON-ready, and what :meth:`from_dict` reads back."""
        return {"kind": self.kind, **self.data}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Note:
        """The note :meth:`to_dict` wrote (a ``text`` key, the words, is ignored).

        Raises:
          BadValue: no ``kind``, an unknown one, or other keys than the kind's.
        """
        if "kind" not in data:
            raise BadValue(f"not a note (no 'kind'): {dict(data)!r}", param="data")
        return cls(str(data["kind"]), {k: v for k, v in data.items() if k not in _RESERVED})


def _plain(value: Any) -> Any:
    """``value`` as JSON reads it back: mappings as dicts, sequences as lists, Notes as dicts."""
    if isinstance(value, Note):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise BadType(
        f"a note's data holds JSON values; got {type(value).__name__} {value!r}", param="data"
    )
