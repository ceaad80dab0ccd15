"""The ``advise`` table: for every GPU, whether the step fits and with which plan, else why not
and what would (the fixed part over the limit, SGD, LoRA, a GPU count under ``--scale-out``).

Data in (``Advice`` rows, ``ScaleOut`` answers), a ``rich.table.Table`` out; nothing here
compiles or searches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.table import Table

from remat_kit._units import byte_unit, gib, pct, size
from remat_kit.notes import hint_words
from remat_kit.render._captions import runtime_words
from remat_kit.render._layout import DROP_FIRST
from remat_kit.render._tables import _YES_NO
from remat_kit.render._titles import RunOptions, opts_precision, run_words, training_line
from remat_kit.render._wrap import cell
from remat_kit.targets import PRICE_CAVEAT, device_word_of, is_slice_name

if TYPE_CHECKING:
    from remat_kit.search import Advice, Cost, ScaleOut

__all__ = [
    "ADVISE_DROP",
    "advise_table",
]

#: The columns advise's table loses on a narrow terminal, first to last: every table's
#: (``DROP_FIRST``), then the batch with 'full' and the GPU's memory, before its answer (the
#: GPU, whether and how it fits, what would instead, the price per token). Only here: other
#: tables' ``max batch`` (fit's) and ``GiB`` / ``MiB`` columns are their answer.
ADVISE_DROP: tuple[str, ...] = (*DROP_FIRST, "max batch", "GiB")

#: Where a plan's name breaks between tokens in advise's table: narrower than the other tables'
#: (28), so that with prices its answer columns are whole at 100 columns (the longest tag,
#: ``decoder_layer_input+``, is 20).
_PLAN_WIDTH = 24


def _advise_columns(
    rows: Sequence[Advice], why: str, figures: tuple[str, str], priced: Mapping[str, Cost]
) -> list[str]:
    """The ``advise`` table's columns some row fills: the plan's ``figures`` (fixed, peak)
    where a row has a plan, the max batch, what would fit instead, the costs."""
    fixed, peak = figures
    columns = ["target", "GiB", fixed, "fits", why]
    if any(a.plan is not None for a in rows):
        columns += [peak, "recompute"]
    if any(a.max_batch for a in rows):
        columns.append("max batch")
    if any(not a.fits for a in rows):
        columns.append("instead")
    if any(c.tokens_per_second for c in priced.values()):
        columns += ["tok/s (est.)", "$/GPU-h", "$/Mtok"]
    return columns


def advise_table(
    rows: Sequence[Advice],
    opts: RunOptions,
    *,
    headroom: float,
    seconds: float,
    scale_out: Mapping[str, ScaleOut] | None = None,
    scale_seconds: float | None = None,
    costs: Mapping[str, Cost] | None = None,
) -> Table:
    """The ``advise`` table: for every GPU, does the step fit, with which plan, else why not
    and what would.

    A row that does not fit says why in the plan column (``fixed > 29.57 GiB``: weights,
    gradients and optimizer state alone are over the limit; ``every plan > ...``: the
    activations are) and what would in ``instead``: the GPU count ``--scale-out`` found, its
    per-GPU peak, the global batch it compiled and the batch per GPU (``8 x 18.7 GiB, b8
    (1/GPU)``; ``b16*`` where fsdp had to grow the batch asked for), else the hints of
    :func:`remat_kit.search.check_budget` in a word each. The caption says the rest once: the
    time, what fits means, the fixed part, what the hints stand for. Columns no row fills are
    left out.

    Args:
      rows: one ``Advice`` per target.
      opts: the run's options (for the title and the batch asked for).
      headroom: the fraction of device memory kept free (for the caption).
      seconds: wall time of the whole command (for the caption).
      scale_out: ``--scale-out``'s answer per target that does not fit on one GPU; None
        when it was not asked for.
      scale_seconds: the part of ``seconds`` the scale-out took.
      costs: per target, the predicted tokens/s and dollars per million tokens (the rows
        come in the order wanted); the caption then names every price's provider, source
        and date.

    Returns:
      The table.
    """
    scale = {} if scale_out is None else scale_out
    misses = [a for a in rows if not a.fits]
    planned = any(a.plan is not None for a in rows)
    table = Table(
        title=f"{_which(rows)}: {run_words(opts)}" + training_line(opts_precision(opts), None),
        caption="\n".join(
            _advise_caption(rows, opts, headroom, seconds, scale_out, scale_seconds)
            + _price_lines(costs)
        ),
    )
    why = "plan" if not misses else "plan / why not" if planned else "why not"
    # One unit for the step's figures (fixed part, peak), chosen by the largest of them.
    mem = byte_unit(b for a in rows for b in (a.fixed_bytes, a.peak_bytes))
    fixed, peak = f"fixed {mem.name}", f"peak {mem.name}"
    priced = costs or {}
    columns = _advise_columns(rows, why, (fixed, peak), priced)
    for col in columns:
        # The GPU, its plan and what would do instead are the answer: never cut, a long plan
        # broken between its tokens (remat_kit.render._wrap.cell).
        table.add_column(
            col,
            justify="left" if col in ("target", why, "instead") else "right",
            no_wrap=col in ("target", why, "instead"),
        )
    for a in rows:
        cells = {
            "target": a.target,
            "GiB": gib(a.memory_bytes, 0),
            fixed: mem.cell(a.fixed_bytes),
            "fits": _YES_NO[bool(a.fits)],
            why: cell(a.plan or "-", _PLAN_WIDTH) if a.fits else _advise_why(a),
            peak: mem.cell(a.peak_bytes),
            "recompute": pct(a.recompute_overhead),
            "max batch": str(a.max_batch),
            "instead": "" if a.fits else _advise_instead(a, scale.get(a.target), opts),
            **_cost_cells(priced.get(a.target)),
        }
        table.add_row(*(cells[col] for col in columns))
    return table


def _cost_cells(c: Cost | None) -> dict[str, str]:
    """The speed and price cells of one target (``N x`` where the scale-out's GPUs are billed)."""
    if c is None:
        return {"tok/s (est.)": "-", "$/GPU-h": "-", "$/Mtok": "-"}
    many = f"{c.gpus} x " if c.gpus > 1 else ""
    return {
        "tok/s (est.)": "-" if not c.tokens_per_second else f"{c.tokens_per_second:,.0f}",
        "$/GPU-h": "no price" if c.price is None else f"{many}{c.price.usd_per_gpu_hour:.2f}",
        "$/Mtok": "-" if c.usd_per_million_tokens is None else f"{c.usd_per_million_tokens:.3f}",
    }


def _price_lines(costs: Mapping[str, Cost] | None) -> list[str]:
    """Where each price comes from (provider, page, date), one line per source, and that
    prices change."""
    if not costs or not any(c.usd_per_million_tokens for c in costs.values()):
        return []
    by_source: dict[tuple[str, str], list[str]] = {}
    for c in costs.values():
        if c.price is not None and c.usd_per_million_tokens is not None:
            key = (c.price.provider, c.price.source)
            by_source.setdefault(key, []).append(
                f"{c.target} ${c.price.usd_per_gpu_hour:.2f} ({c.price.date})"
            )
    tpu = any(is_slice_name(c.target) for c in costs.values() if c.price is not None)
    lines = [
        f"tok/s: predicted for the step at the batch asked for (all its {_devices(tpu)}s); "
        "$/Mtok: dollars per million tokens at that speed and the on-demand price per "
        "GPU-hour below" + ("; a TPU's is per chip-hour" if tpu else "")
        # Cloud TPU bills chips (remat_kit.targets.TPU_PRICES)
    ]
    lines += [
        f"prices from {provider}, {source}: {', '.join(items)}"
        for (provider, source), items in by_source.items()
    ]
    return [*lines, PRICE_CAVEAT + " --price GPU=USD or --price-file sets yours."]


def _advise_why(a: Advice) -> str:
    """Why ``a`` does not fit, in a table cell."""
    d = a.note.data
    if a.note.kind == "fixed_over_budget":
        return f"fixed > {size(d['limit_bytes'])}"
    if a.note.kind == "plan_nothing_fits":
        return f"every plan > {size(d['budget_bytes'])}"
    return cell(a.plan or "-", _PLAN_WIDTH)


def _which(rows: Sequence[Advice]) -> str:
    """The table's question: which GPU, or which GPU or TPU where a TPU slice is a row."""
    return "which GPU or TPU" if any(is_slice_name(a.target) for a in rows) else "which GPU"


def _advise_instead(a: Advice, so: ScaleOut | None, opts: RunOptions) -> str:
    """What would fit where ``a`` does not, in a table cell."""
    if so is not None:
        if so.devices is None:
            word = device_word_of(a.target)
            return f"none up to {so.tried[-1][0]} {word}s" if so.tried else "none"
        batch = f"b{so.batch}"  # as the title writes the batch
        if so.batch != opts.batch:  # fsdp gives each GPU whole samples: the batch grew
            batch = f"[yellow]{batch}*[/yellow]"
        per = f"{so.batch // so.devices}/{device_word_of(a.target)}"
        return f"{so.devices} x {size(so.peak_bytes, 1)}, {batch} ({per})"
    if a.note.kind == "fixed_over_budget" and a.note.data["hints"]:
        return ", ".join(_advise_hint(h) for h in a.note.data["hints"])
    if a.max_batch:
        return f"batch {a.max_batch} with full"
    return "more GPUs (--scale-out)"


def _advise_hint(hint: Mapping[str, Any]) -> str:
    """A hint of ``check_budget`` (``{"kind": "lora", ...}``) in a word or two."""
    if hint["kind"] == "shard":
        return f"~{hint['gpus']}+ GPUs"
    return _ADVISE_HINTS[hint["kind"]]


#: The kinds of ``check_budget``'s hints and the word an ``advise`` cell gives each.
_ADVISE_HINTS = {
    "sgd": "SGD",
    "lora": "LoRA",
    "bigger_gpu": "bigger GPU",
    "larger_budget": "less --headroom",
    "no_realistic": "nothing realistic",
}

#: Fixed parts in the order the caption names them.
_ADVISE_PARTS = (
    ("weights", "weights"),
    ("gradients", "gradients"),
    ("optimizer", "optimizer state"),
    ("grad_accumulator", "gradient accumulator"),
    ("batch", "batch"),
)


#: What a TPU row's fits is judged against (runtime_words for a TPU target says the same).
_TPU_LIMIT = "the device's HBM less libtpu's reserve"


def _advise_caption(
    rows: Sequence[Advice],
    opts: RunOptions,
    headroom: float,
    seconds: float,
    scale_out: Mapping[str, ScaleOut] | None,
    scale_seconds: float | None,
) -> list[str]:
    """The caption's lines: the time, what fits means, and what the cells do not say."""
    took = f"{seconds:.1f} s"
    if scale_seconds is not None:
        took += f" (plans {seconds - scale_seconds:.1f} s, scale-out {scale_seconds:.1f} s)"
    # A TPU has no allocator fraction: its limit is the HBM less libtpu's reserve.
    tpu = [a for a in rows if is_slice_name(a.target)]
    limits = runtime_words(None)
    if tpu:
        limits = f"GPU: {limits}; TPU: {_TPU_LIMIT}" if len(tpu) < len(rows) else _TPU_LIMIT
    lines = [
        f"{took}. fits = the plan's compiled peak <= what a JAX process may allocate on that "
        f"{'device' if tpu else 'GPU'} ({limits}"
        + (f", less {100 * headroom:.0f}%" if headroom else "")
        + ")"
        + ("; max batch with 'full'" if any(a.max_batch for a in rows) else "")
    ]
    over = [a for a in rows if not a.fits and a.note.kind == "fixed_over_budget"]
    # One line per distinct fixed part (the same on every GPU unless the steps differ).
    by_parts: dict[tuple[tuple[str, int], ...], list[str]] = {}
    for a in over:
        key = tuple(sorted(a.note.data["parts"].items()))
        by_parts.setdefault(key, []).append(a.target)
    for key, names in by_parts.items():
        parts = dict(key)
        unit = byte_unit(parts.values())  # the parts of one sum, in one unit
        shown = " + ".join(
            f"{name} {unit.cell(parts[k])}" for k, name in _ADVISE_PARTS if parts.get(k)
        )
        where = f"on {', '.join(names)}: " if len(by_parts) > 1 else ""
        lines.append(f"{where}fixed = {shown} {unit.name}, whatever the policy")
    lines += _advise_legend(over, scale_out)
    # Explained where a row's cell shows a count (not "none up to ..."): a row's own figures.
    scaled = [
        s
        for a in rows
        if not a.fits and (s := (scale_out or {}).get(a.target)) is not None and s.devices
    ]
    if scaled:
        grown = any(s.batch != opts.batch for s in scaled)
        dev = _devices(bool(tpu))
        lines.append(
            f"N x P GiB: the fewest {dev}s whose step, sharded fsdp:N with full, fits each, "
            f"and the peak on each; bN: the global batch, split evenly over them (per {dev})"
            + (
                f"; *: more than the {opts.batch} asked for, as fsdp gives each {dev} whole samples"
                if grown
                else ""
            )
        )
    return lines


def _devices(tpu: bool) -> str:
    """What the caption calls the rows' devices: GPUs, or devices where a TPU is a row (a
    chip, or a TensorCore on TPU7x: each row's cells say which)."""
    return "device" if tpu else "GPU"


def _advise_legend(over: Sequence[Advice], scale_out: Mapping[str, ScaleOut] | None) -> list[str]:
    """What the hint words stand for; with ``--scale-out`` (its counts in the cells instead),
    the GPUs each would serve alone."""
    used: dict[str, list[Advice]] = {}
    for a in over:
        for hint in a.note.data["hints"]:
            used.setdefault(_advise_hint(hint), []).append(a)
    said = []
    # In check_budget's order: the cheapest change first, sharding last.
    order = {"SGD": 0, "LoRA": 1}
    for word in sorted(used, key=lambda w: order.get(w, 3 if w.startswith("~") else 2)):
        rows = used[word]
        data = rows[0].note.data
        on = f" ({', '.join(a.target for a in rows)})" if scale_out is not None else ""
        if word == "SGD":
            fixed = data["fixed_bytes"] - data["parts"].get("optimizer", 0)
            said.append(f"SGD{on} = --optimizer sgd: no optimizer state, {size(fixed)} fixed")
        elif word.startswith("~"):
            if scale_out is None:
                said.append(
                    "~N+ GPUs = weights, gradients and optimizer state sharded over N GPUs "
                    "(FSDP), an estimate: --scale-out compiles it"
                )
        else:
            hint = next(h for h in data["hints"] if _advise_hint(h) == word)
            said.append(hint_words(hint) + on)
    if not said:
        return []
    # With --scale-out the cells give device counts; these say which would do alone.
    one = f"on one {_devices(any(is_slice_name(a.target) for a in over))}: "
    return [(one if scale_out is not None else "") + "; ".join(dict.fromkeys(said))]
