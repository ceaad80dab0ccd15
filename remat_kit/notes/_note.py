"""Notes: what the library has to tell the user, as data.

A :class:`Note` is a kind and the figures behind it (bytes, specs, names), never a sentence:
``MemoryReport.notes``, ``Fit.note``, ``Plan.note``, ``Advice.note`` and
``ScaleOut.note`` hold them. :func:`remat_kit.notes.words` makes the one line a user
reads; the RematWarning a report issues carries those words.

Every kind remat_kit words and the keys of its data are listed in :data:`KINDS`; a plugin
brings kinds of its own as :class:`NoteKind` values (its name, the keys of its data and its
words) with the kinds of source it registers (``rk.sources.SourceKind.notes``). A note of an
unknown kind, or with other keys, is refused when it is made, so a typo cannot produce a note
nobody can word. Data are JSON values (tuples become lists), so
``Note.from_dict(note.to_dict()) == note``, through ``json`` too.

Example:
  >>> note = Note("offload_moved_nothing", {"policy": "offload_dots"})
  >>> note.to_dict()
  {'kind': 'offload_moved_nothing', 'policy': 'offload_dots'}
  >>> Note.from_dict(note.to_dict()) == note
  True
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import numbers
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from remat_kit.errors import BadType, BadValue

__all__ = [
    "HINT_KINDS",
    "KINDS",
    "Note",
    "NoteKind",
    "plugged",
    "register",
]

#: The entry-point group whose kinds of source bring note kinds (``rk.sources.ENTRY_POINTS``;
#: a plugin registers its kinds there once, their notes with them).
PLUGINS = "remat_kit.sources"

#: The kinds of note remat_kit words itself -> the keys of their data (bytes are ints,
#: overheads fractions).
BUILT_IN: Mapping[str, tuple[str, ...]] = {
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
    # StepSource.notes: an unrolled stack a factory's source builds no shallow copy of
    "whole_model_probes": ("model", "layers"),
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
    # device: what one device is called ("GPU"; a TPU's "chip", TPU7x's "TensorCore")
    "scale_out_fits": ("target", "devices", "device", "peak_bytes", "policy", "batch"),
    "scale_out_none": ("target", "devices", "device", "peak_bytes", "policy"),
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


@dataclasses.dataclass(frozen=True)
class NoteKind:
    """A kind of note a plugin brings: its name, the keys of its data and its words.

    A kind of source lists its note kinds (``rk.sources.SourceKind(..., notes=(...))``), which
    registers them; calling the kind makes a note of it.

    Attributes:
      name: the kind's name (``Note.kind``), unique among every kind of note.
      fields: the keys of its data.
      words: ``data -> the one line a user reads`` (the figures become a sentence here).

    Example:
      >>> late = NoteKind("toy_late", ("minutes",), lambda d: f"{d['minutes']} minutes late")
      >>> late.words({"minutes": 3})
      '3 minutes late'
    """

    name: str
    fields: tuple[str, ...]
    words: Callable[[Mapping[str, Any]], str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))

    def __call__(self, **data: Any) -> Note:
        """A note of this kind (registered first, if it was not)."""
        register(self)
        return Note(self.name, data)


#: The kinds plugins brought, by name (:func:`register`).
_PLUGGED: dict[str, NoteKind] = {}


def register(kind: NoteKind) -> None:
    """Registers a plugin's kind of note, so that notes of it are made, checked and worded.

    Registering the same kind again (equal fields and words) does nothing.

    Raises:
      BadType: not a :class:`NoteKind`.
      BadValue: a built-in kind's name, or another kind already registered under it.
    """
    if not isinstance(kind, NoteKind):
        raise BadType(f"a note kind is a NoteKind, got {type(kind).__name__}", param="notes")
    known = _PLUGGED.get(kind.name)
    if known is not None and _same(known, kind):
        return
    if kind.name in BUILT_IN or known is not None:
        raise BadValue(f"two kinds of note are named {kind.name!r}: rename one", param="notes")
    _PLUGGED[kind.name] = kind


def _same(a: NoteKind, b: NoteKind) -> bool:
    # One kind, made twice: its module imported under two names (a doctest's, the package's).
    code = getattr(a.words, "__code__", a.words), getattr(b.words, "__code__", b.words)
    return a.fields == b.fields and code[0] == code[1]


def plugged(name: str) -> NoteKind | None:
    """The plugin's kind of note named ``name``, or None (a built-in or an unknown name).

    A name not registered in this process is looked up in the installed plugins' kinds of
    source (:data:`PLUGINS`), once: a note read back from JSON is worded without its plugin
    having been used here.
    """
    if name not in _PLUGGED and name not in BUILT_IN:
        _load_plugins()
    return _PLUGGED.get(name)


@functools.cache
def _load_plugins() -> None:
    # Loading a kind of source registers its note kinds (SourceKind.__post_init__); read
    # here too, for an object that is no SourceKind (its kinds() refuses it with a message).
    for point in importlib.metadata.entry_points(group=PLUGINS):
        for kind in getattr(point.load(), "notes", ()):
            register(kind)


class _Kinds(Mapping[str, tuple[str, ...]]):
    """Every kind of note -> the keys of its data: remat_kit's and the plugins'."""

    def __getitem__(self, name: str) -> tuple[str, ...]:
        if name in BUILT_IN:
            return BUILT_IN[name]
        kind = plugged(name)
        if kind is None:
            raise KeyError(name)
        return kind.fields

    def __iter__(self) -> Iterator[str]:
        _load_plugins()
        return iter([*BUILT_IN, *(n for n in _PLUGGED if n not in BUILT_IN)])

    def __len__(self) -> int:
        return sum(1 for _ in self)


#: Every kind of note -> the keys of its data: :data:`BUILT_IN` and the plugins' kinds.
KINDS: Mapping[str, tuple[str, ...]] = _Kinds()

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
