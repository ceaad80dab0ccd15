"""The words of a :class:`remat_kit.notes.Note`: the one line a user reads for it.

Library code returns notes (data); this is where their figures become a sentence, for the CLI,
the tables, the JSON's readable ``warnings`` / ``message`` and the RematWarning a report issues.
A (policy, schedule) pair reads as :func:`label` has it, here and in every table.

Example:
  >>> from remat_kit.notes import Note
  >>> print(words(Note("xla_remat", {"target": "h100-80gb", "saved_bytes": 3 * 2**29})))
  XLA's own rematerialization pass took 1.50 GiB off the peak to fit h100-80gb: these
  figures include XLA's choices on top of the policy
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from remat_kit._units import counted, percent, seconds, size
from remat_kit.errors import BadValue
from remat_kit.notes._note import BUILT_IN, HINT_KINDS, Note, plugged

__all__ = [
    "change_words",
    "hint_words",
    "label",
    "shared_words",
    "words",
]


def label(policy: str, schedule: str | None) -> str:
    """How a (policy, schedule) pair is shown: ``minimal`` or ``minimal @ every:2``.

    Example:
      >>> label("full", None), label("full", "sqrt")
      ('full', 'full @ sqrt')
    """
    return policy if schedule in (None, "", "none") else f"{policy} @ {schedule}"


def words(note: Note | Mapping[str, Any]) -> str:
    """The sentence for ``note`` (a Note, or its ``to_dict()``).

    Args:
      note: what to word.

    Returns:
      One line, e.g. ``"does not fit h100-80gb at ...: peak 81.00 GiB is 21.67 GiB over; ..."``.

    Example:
      >>> print(words({"kind": "offload_moved_nothing", "policy": "offload_dots"}))
      policy 'offload_dots' offloads to host but XLA moved 0 bytes there: nothing it names
      is a residual of this program
    """
    if not isinstance(note, Note):
        note = Note.from_dict(note)
    say = _WORDS.get(note.kind)
    if say is None:
        kind = plugged(note.kind)  # a plugin's kind words its own notes
        if kind is None:  # a kind in BUILT_IN without words here: a bug, caught by the tests
            raise BadValue(f"no words for note kind {note.kind!r}", param="note")
        say = kind.words
    return say(note.data)


def shared_words(note: Note | Mapping[str, Any]) -> str:
    """The sentence for ``note`` as a table's rows share it: without the figures of one
    program that the table shows anyway, so rows that differ only there are named once.

    XLA's remat pass line "could not bring the program under its limit of L: it reached P,
    from Q" loses its ": it reached ..." (P is the row's peak; the table's fits column says
    what the pass took off); every other note reads as :func:`words` has it.

    Example:
      >>> print(shared_words({"kind": "xla_log", "line": "XLA's rematerialization pass could "
      ...     "not bring the program under its limit of 57.86 GiB: it reached 66.85 GiB, from "
      ...     "67.83 GiB"}))
      XLA's rematerialization pass could not bring the program under its limit of 57.86 GiB
    """
    if not isinstance(note, Note):
        note = Note.from_dict(note)
    text = words(note)
    if note.kind == "xla_log" and text.startswith(_REMAT_PASS_FAILED):
        return text.split(": it reached ", 1)[0]
    return text


# How remat_kit.xla.parse_xla_log words the remat pass's "Can't reduce memory use" line.
_REMAT_PASS_FAILED = "XLA's rematerialization pass could not bring the program under"


def _no_tag_matched(d: Mapping[str, Any]) -> str:
    return (
        f"policy {d['policy']!r} names {', '.join(d['names'])} but the program tags none of "
        f"them (it has: {', '.join(d['tags']) or 'no tags'}); it behaves like 'full'"
    )


def _tag_list(tags: Sequence[str], limit: int = 12) -> str:
    if not tags:
        return "none (tag the model: remat_kit.tagging, or checkpoint_name in its code)"
    shown = ", ".join(tags[:limit])
    return shown + (f" ... ({len(tags) - limit} more)" if len(tags) > limit else "")


def _no_tag_matched_in(d: Mapping[str, Any]) -> str:
    return (
        f"policy {d['policy']!r} names {', '.join(d['names'])} but {d['where']} tags none of "
        f"them, so it behaves like 'full'; tags there: {_tag_list(d['tags'])}"
    )


def _stray_tag_names(d: Mapping[str, Any]) -> str:
    named = ", ".join(
        f"{n!r} (did you mean {c!r}?)" if c else repr(n) for n, c in d["names"].items()
    )
    return (
        f"policy {d['policy']!r} names {named}, which is no tag of {d['where']}; "
        f"tags there: {_tag_list(d['tags'])}"
    )


def _flash_recomputes_scores(d: Mapping[str, Any]) -> str:
    return (
        f"{d['policy']!r} recomputes attention scores/probabilities, which do not exist "
        "under flash attention (the kernel recomputes them itself): here it is "
        f"equivalent to names:save={'+'.join(d['kept'])}"
    )


def _ragged_dots_recomputed(d: Mapping[str, Any]) -> str:
    keep = (
        f"policy {d['suggest']!r} keeps them"
        if d["suggest"]
        else "rk.policy('either', a=<this policy>, b='ragged_dots') keeps them"
    )
    return (
        f"policy {d['policy']!r} keeps matmul outputs but recomputes the grouped expert GEMMs "
        f"(ragged_dot_general): {size(d['per_layer_bytes'])} per layer, "
        f"{counted(d['layers'], 'layer')}; {keep}"
    )


def _expert_dots_recomputed(d: Mapping[str, Any]) -> str:
    return (
        f"policy {d['policy']!r} keeps weight matmuls but recomputes batched matmuls against "
        f"weights (expert GEMMs with the expert as a batch dimension, maxtext#2207): "
        f"{size(d['per_layer_bytes'])} per layer, {counted(d['layers'], 'layer')}; save them by "
        "their tags (minimal does on the presets) or with 'dots', which keeps every batched "
        "product too"
    )


def _offload_on_cpu(d: Mapping[str, Any]) -> str:
    return (
        f"policy {d['policy']!r} offloads to host, but a cpu compile does not measure host "
        "memory (XLA reports 0 host bytes on cpu): compile for a GPU target to see them"
    )


def _offload_moved_nothing(d: Mapping[str, Any]) -> str:
    return (
        f"policy {d['policy']!r} offloads to host but XLA moved 0 bytes there: nothing it "
        "names is a residual of this program"
    )


def _xla_remat(d: Mapping[str, Any]) -> str:
    return (
        f"XLA's own rematerialization pass took {size(d['saved_bytes'])} off "
        f"the peak to fit {d['target']}: these figures include XLA's choices on top of the policy"
    )


def _xla_remat_made_fit(d: Mapping[str, Any]) -> str:
    """An answer XLA's own remat pass made fit: by how much, and what that costs."""
    name = label(d["policy"], d["schedule"])
    without = d["peak_bytes"] + d["saved_bytes"]
    # The amount over is said too: rounded alike, "17.99 GiB without it, over the 17.99 GiB
    # limit" reads as no excess at all.
    over = without - d["limit_bytes"]
    return (
        f"{name}: {d['axis']} {d['value']} fits only because XLA's own rematerialization pass "
        f"took {size(d['saved_bytes'])} off its peak ({size(without)} without it, "
        f"{size(over)} over the {size(d['limit_bytes'])} limit): XLA recomputes what the "
        "policy keeps, so the step "
        "does more work than its recompute figure says (traced before XLA's pass) and runs "
        f"slower than {name!r} suggests"
    )


def _does_not_fit(d: Mapping[str, Any]) -> str:
    if d.get("reserved_by"):  # a TPU: no allocator fraction, a runtime's reserve
        where = f"{d['target']} ({size(d['usable_bytes'])} usable of "
        where += f"{size(d['memory_bytes'])}: {d['reserved_by']} keeps the rest)"
        fix = ""
    else:
        runtime = d["runtime"] or "the runtime"
        where = f"{d['target']} at {runtime} ({size(d['usable_bytes'])} usable of "
        where += f"{size(d['memory_bytes'])})"
        fix = (
            f"; it fits with XLA_PYTHON_CLIENT_MEM_FRACTION={d['fits_with_fraction']:g}"
            if d["fits_with_fraction"] is not None
            else "; no allocator fraction makes it fit"
        )
    return (
        f"does not fit {where}: peak {size(d['peak_bytes'])} is {size(d['over_bytes'])} over{fix}"
    )


def _breakdown_upper_bound(d: Mapping[str, Any]) -> str:
    return (
        f"the peak ({size(d['peak_bytes'])}) is below weights + gradients + "
        f"optimizer state + batch ({size(d['known_bytes'])}): XLA never holds every gradient "
        "at once here, so this split is only an upper bound per part (activations shown as "
        "0); a measured breakdown reads what is live at the peak"
    )


def _offload_shortfall(d: Mapping[str, Any]) -> str:
    moved, marked = d["moved_bytes"], d["marked_bytes"]
    return (
        f"offload moved {size(moved)} to host of the {size(marked)} "
        f"jax marked for offload ({percent(moved / marked, 0)}): XLA kept the rest on the "
        "device, so the peak is not what the policy promises; offload needs scanned layers"
    )


def _offload_link_bound(d: Mapping[str, Any]) -> str:
    return (
        f"offloading {size(d['host_bytes'])} per step needs an estimated "
        f"{seconds(d['transfer_seconds'])} on {d['target']}'s host link, more than the "
        f"step's {seconds(d['step_compute_seconds'])} of compute: it cannot hide "
        "behind compute"
    )


def _boundary(d: Mapping[str, Any], what: str, here: str, refused: str, by: str) -> str:
    """``X fits (peak of limit)``, then why the next size up is the boundary."""
    nxt = d[f"next_{what}"]
    if nxt is None:
        after = f"; stopped at the cap {d['cap']}"
    elif d[refused] is not None:
        after = f", {what} {nxt} cannot be built{by} ({d[refused]})"
    else:
        after = f", {what} {nxt} does not ({size(d['next_peak_bytes'])})"
    return (
        label(d["policy"], d["schedule"])
        + f": {here} ({size(d['peak_bytes'])} of {size(d['limit_bytes'])})"
        + after
    )


def _batch_fits(d: Mapping[str, Any]) -> str:
    return _boundary(d, "batch", f"batch {d['batch']} fits", "unbuildable", " by XLA")


def _batch_none_fits(d: Mapping[str, Any]) -> str:
    return (
        f"{d['policy']}: even batch {d['batch']} does not fit: {size(d['peak_bytes'])} > "
        f"{size(d['limit_bytes'])} on {d['target']}"
    )


def _plan_at_max_batch(d: Mapping[str, Any]) -> str:
    return f"plan at the max batch of full ({d['max_batch']}): {words(d['plan'])}"


def _seq_fits(d: Mapping[str, Any]) -> str:
    here = f"seq {d['seq']} fits at batch {d['batch']}"
    return _boundary(d, "seq", here, "refused", "")


def _seq_none_fits(d: Mapping[str, Any]) -> str:
    return (
        f"{d['policy']}: even seq {d['seq']} at batch {d['batch']} does not fit: "
        f"{size(d['peak_bytes'])} > {size(d['limit_bytes'])} on {d['target']}"
    )


def _plan_at_max_seq(d: Mapping[str, Any]) -> str:
    return f"plan at the longest sequence of full ({d['max_seq']}): {words(d['plan'])}"


_WHY = {
    "none": "no remat needed",
    "beside_none": "none fits too, but this policy given beside it is as fast and smaller, or "
    "faster",
    "catalogue": "a policy given to compare is at least as good as the solver's plan",
    "schedule": "segment checkpointing",
}


def _decision_words(decisions: Mapping[str, str]) -> str:
    parts = []
    for kind in ("recompute", "offload"):
        tags = [t for t, d in decisions.items() if d == kind]
        if tags:
            parts.append(f"{kind} {', '.join(tags)}")
    return "; ".join(parts) or "save every tagged tensor"


def _solver_words(s: Mapping[str, Any]) -> str:
    """What the solver chose and how sure it is (one clause)."""
    why = _decision_words(s["decisions"])
    if s["layers"]:
        why += f"; layers 0-{s['layers'] - 1}: {_decision_words(s['layer_decisions'])}"
    proof = (
        "optimal on the cost model"
        if s["optimal"]
        else f"{s['status']}, gap {percent(s['gap'] or 0, 2)}"
    )
    return f"{why}; {proof} ({s['solver']}, {s['programs']} programs)"


def _plan_fits(d: Mapping[str, Any]) -> str:
    why = _solver_words(d["solver"]) if d["source"] == "solver" else _WHY[d["source"]]
    return (
        f"{label(d['policy'], d['schedule'])} fits {size(d['budget_bytes'])}: peak "
        f"{size(d['peak_bytes'])}, recompute "
        f"{percent(d['recompute_overhead'])} ({why})"
    )


def _plan_nothing_fits(d: Mapping[str, Any]) -> str:
    return (
        f"nothing fits {size(d['budget_bytes'])} on {d['target']} at batch {d['batch']}: "
        f"the smallest peak reached is {size(d['peak_bytes'])}, with "
        f"{label(d['policy'], d['schedule'])} "
        f"({size(d['peak_bytes'] - d['budget_bytes'])} over); try a smaller batch "
        "(remat-kit fit), gradient accumulation or a larger budget"
    )


def _scale_out_fits(d: Mapping[str, Any]) -> str:
    return (
        f"{d['devices']} x {d['target']}: {size(d['peak_bytes'])} per {d['device']} with "
        f"{d['policy']} at global batch {d['batch']}"
    )


def _scale_out_none(d: Mapping[str, Any]) -> str:
    return (
        f"does not fit {d['devices']} x {d['target']} with {d['policy']}: "
        f"{size(d['peak_bytes'])} per {d['device']}"
    )


def change_words(change: Mapping[str, Any]) -> str:
    """A change to the step (``remat_kit.search.Change.to_dict()``) in a few words.

    Example:
      >>> change_words({"kind": "shard", "target": "h100-80gb", "devices": 4, "batch": 8})
      'fsdp over 4 x h100-80gb at global batch 8'
    """
    kind = change["kind"]
    if kind == "accum":
        return (
            f"gradient accumulation over {change['accum']} (micro-batch "
            f"{change['micro_batch']}, the same global batch)"
        )
    if kind == "smaller_batch":
        return f"batch {change['batch']}"
    if kind == "bigger_gpu":
        return f"one {change['target']}"
    if kind == "shard":
        return (
            f"fsdp over {change['devices']} x {change['target']} at global batch {change['batch']}"
        )
    if kind == "lora":
        return f"LoRA rank {change['rank']} (adapters trained, base weights frozen)"
    raise BadValue(f"no words for change {dict(change)!r}", param="change")


def _rows_none_fit(d: Mapping[str, Any]) -> str:
    return (
        f"at batch {d['batch']} the smallest peak is {size(d['peak_bytes'])} "
        f"({d['policy']}), over the {size(d['limit_bytes'])} a JAX process may use on "
        f"{d['target']}, though weights, gradients and optimizer state fit"
    )


def _compiles(n: int) -> str:
    return counted(n, "extra compile")


def _next_step_fits(d: Mapping[str, Any]) -> str:
    return (
        f"{change_words(d['change'])}: compiled with {d['policy']}, the peak is "
        f"{size(d['peak_bytes'])}, under the {size(d['limit_bytes'])} a JAX process may "
        f"use on {d['target']} ({_compiles(d['compiles'])})"
    )


def _next_step_none(d: Mapping[str, Any]) -> str:
    said = []
    for t in d["tried"]:
        c = {k: v for k, v in t.items() if k != "peak_bytes"}
        peak = t["peak_bytes"]
        why = "inputs over its limit" if peak is None else f"full peaks at {size(peak)}"
        said.append(f"{change_words(c)} ({why})")
    return (
        "none of the changes tried fits: "
        + ("; ".join(said) or "none could be tried")
        + f" ({_compiles(d['compiles'])})"
    )


#: The fixed parts of a step in the order a sentence names them.
_SHOWN_PARTS = (
    ("weights", "weights"),
    ("gradients", "gradients"),
    ("optimizer", "optimizer state"),
    ("grad_accumulator", "gradient accumulator"),
    ("batch", "batch"),
)


def _fixed_over_budget(d: Mapping[str, Any]) -> str:
    parts = d["parts"]
    shown = " + ".join(f"{name} {size(parts[key])}" for key, name in _SHOWN_PARTS if parts.get(key))
    where = f"{d['label']} " if d["label"] else ""
    compiled = (
        ""
        if d["compiled_bytes"] is None
        else " (compiled with every layer recomputed, `full`, and with none, `none`, the "
        f"step needs {size(d['compiled_bytes'])})"
    )
    return (
        f"{where}does not fit {size(d['limit_bytes'])} on {d['target']} whatever the "
        f"policy: {shown} = {size(d['fixed_bytes'])} before any activation{compiled}. "
        "Where these parts alone would fit (a compile decides the rest): "
        + "; ".join(hint_words(h) for h in d["hints"])
        + "."
    )


def hint_words(hint: Mapping[str, Any]) -> str:
    """What would fit instead, as a ``fixed_over_budget`` note's hint reads: the figure the
    breakdown's arithmetic gives and the limit it is judged against.

    Args:
      hint: ``{"kind": ..., its figures}`` (see :data:`remat_kit.notes.HINT_KINDS`).

    Returns:
      A short phrase.

    Raises:
      BadValue: a kind of hint there are no words for, or its figures missing.

    Example:
      >>> print(hint_words({"kind": "shard", "gpus": 4, "each_bytes": 30 * 2**30,
      ...                   "devices": 2, "limit_bytes": 40 * 2**30}))
      FSDP over 4 GPUs in all (now 2): these parts split evenly are 30.00 GiB per GPU, under
      the 40.00 GiB limit
    """
    kind = hint.get("kind")
    if kind not in HINT_KINDS or not set(HINT_KINDS[kind]) <= set(hint):
        raise BadValue(
            f"no words for hint {dict(hint)!r}: a kind of {', '.join(HINT_KINDS)} with its figures",
            param="hint",
        )
    limit = f"the {size(hint['limit_bytes'])} limit" if "limit_bytes" in hint else ""
    if kind == "sgd":
        return (
            f"SGD (--optimizer sgd): no optimizer state, so these parts are "
            f"{size(hint['fixed_bytes'])} (from {size(hint['from_bytes'])}), under {limit}"
        )
    if kind == "lora":
        return (
            f"LoRA (--lora 16): frozen base weights, adapters and their gradients and optimizer "
            f"state are {size(hint['fixed_bytes'])}, under {limit}"
        )
    if kind == "larger_budget":
        return (
            f"a larger budget: {hint['target']} can give {size(hint['usable_bytes'])}, and the "
            f"parts above need {size(hint['fixed_bytes'])} before activations (e.g. a budget "
            f"of {hint['budget_gib']}GiB or more)"
        )
    if kind == "bigger_gpu":
        gpus = ", ".join(f"{name} ({size(usable)} usable)" for name, usable in hint["gpus"])
        return f"a GPU whose usable memory holds these {size(hint['fixed_bytes'])}: {gpus}"
    if kind == "shard":
        return (
            f"FSDP over {hint['gpus']} GPUs in all (now {hint['devices']}): these parts split "
            f"evenly are {size(hint['each_bytes'])} per GPU, under {limit}"
        )
    return (
        f"nothing realistic at this budget: {size(hint['budget_bytes'])} is absurdly small "
        f"for {size(hint['fixed_bytes'])} of weights, gradients and optimizer state (it "
        f"would take {hint['gpus']} GPUs sharded; did you mean GiB?)"
    )


_WORDS: Mapping[str, Callable[[Mapping[str, Any]], str]] = {
    "no_tag_matched": _no_tag_matched,
    "flash_recomputes_scores": _flash_recomputes_scores,
    "offload_on_cpu": _offload_on_cpu,
    "ragged_dots_recomputed": _ragged_dots_recomputed,
    "expert_dots_recomputed": _expert_dots_recomputed,
    "offload_moved_nothing": _offload_moved_nothing,
    "xla_remat": _xla_remat,
    "xla_remat_made_fit": _xla_remat_made_fit,
    "does_not_fit": _does_not_fit,
    "xla_log": lambda d: d["line"],  # XLA's own line, already in words (remat_kit.xla)
    "whole_model_probes": lambda d: (
        f"{d['model']} takes no layers=: its {d['layers']} identical layers are compiled whole "
        "in every program (a search compiles several); a factory that takes layers=N is "
        "answered from compiles of 2 and 3 layers (docs/unrolled.md)"
    ),
    "breakdown_upper_bound": _breakdown_upper_bound,
    "offload_shortfall": _offload_shortfall,
    "offload_link_bound": _offload_link_bound,
    "no_tag_matched_in": _no_tag_matched_in,
    "stray_tag_names": _stray_tag_names,
    "batch_fits": _batch_fits,
    "batch_none_fits": _batch_none_fits,
    "plan_at_max_batch": _plan_at_max_batch,
    "seq_fits": _seq_fits,
    "seq_none_fits": _seq_none_fits,
    "plan_at_max_seq": _plan_at_max_seq,
    "plan_fits": _plan_fits,
    "plan_nothing_fits": _plan_nothing_fits,
    "fixed_over_budget": _fixed_over_budget,
    "scale_out_fits": _scale_out_fits,
    "scale_out_none": _scale_out_none,
    "rows_none_fit": _rows_none_fit,
    "next_step_fits": _next_step_fits,
    "next_step_none": _next_step_none,
}
assert set(_WORDS) == set(BUILT_IN), "every kind of note remat_kit words needs words"
