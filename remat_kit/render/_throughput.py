"""The throughput table: per policy its fastest micro-batch, step time, tokens/s and MFU."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from remat_kit._units import byte_unit, pct, second_unit, size
from remat_kit.render._format import short
from remat_kit.render._titles import RunOptions, opts_precision, run_words, training_line

if TYPE_CHECKING:
    from remat_kit.search import Fastest, Throughput

__all__ = [
    "fastest_words",
    "throughput_table",
]


def throughput_table(f: Fastest, opts: RunOptions, *, limit_words: str = "") -> Table:
    """The ``fit --objective throughput`` table: one row per policy, the winner marked.

    Args:
      f: the search's answer.
      opts: the run's options (for the title).
      limit_words: how the limit was set, for the title (e.g. ``usable at fraction 0.75``).

    Returns:
      The table.

    Example:
      >>> from remat_kit.search import Fastest, Throughput
      >>> row = Throughput("full", "none", "full", 8, 8, 1, 9, 2**30, 2**31, 0.5, 32768.0,
      ...                  0.41, 0.25)
      >>> f = Fastest((row,), None, 2048, None, "h100-80gb", 1, 3, 1.0)
      >>> [c.header for c in throughput_table(f, None).columns][:4]
      ['policy', 'micro-batch', 'step ms (est.)', 'tok/s (est.)']
    """
    head = run_words(opts, batch=False) if opts is not None else "the step"
    title = f"fastest way to train {head} on {f.target}"
    if f.devices > 1:
        title += f" ({f.devices} GPUs)"
    if f.rows:
        title += f" (limit {size(f.rows[0].limit_bytes)}"
        title += f" = {limit_words})" if limit_words else ")"
    if f.global_batch is not None:
        title += f", global batch {f.global_batch}"
    if opts is not None:
        title += training_line(opts_precision(opts), None)
    table = Table(title=title, caption=f"{f.compiles} compiles in {f.seconds:.1f} s")
    mem = byte_unit(row.peak_bytes for row in f.rows)
    step = second_unit(row.step_seconds for row in f.rows)
    columns = (
        "policy",
        "micro-batch",
        f"step {step.name} (est.)",
        "tok/s (est.)",
        "MFU",
        "vs none",
        f"peak {mem.name}",
        "recompute",
        "max batch",
    )
    for col in columns:
        table.add_column(col, justify="left" if col == "policy" else "right")
    win = f.winner
    base = f.baseline
    for row in f.rows:
        # The planner's row names its policy in full in the JSON; here, what it equals.
        name = f"plan (= {row.same_as})" if row.same_as else short(row.name, 48)
        if win is not None and row is win:
            name = f"[bold]{name} *[/bold]"
        table.add_row(
            name,
            _batch_cell(row),
            step.cell(row.step_seconds, 3 if step.name == "s" else 2),
            "-" if row.tokens_per_second is None else f"{row.tokens_per_second:,.0f}",
            "-" if row.mfu is None else f"{row.mfu:.0%}",
            _versus(row, base),
            mem.cell(row.peak_bytes),
            pct(row.recompute_overhead),
            str(row.max_batch),
        )
    return table


def _batch_cell(row: Throughput) -> str:
    if not row.fits:
        return "none fits"
    if row.accum > 1:
        return f"{row.micro_batch} x {row.accum}"
    return str(row.micro_batch)


def _versus(row: Throughput, base: Throughput | None) -> str:
    if base is None or not base.tokens_per_second or row.tokens_per_second is None:
        return "-"
    return pct(row.tokens_per_second / base.tokens_per_second - 1.0)


def fastest_words(f: Fastest) -> str:
    """One line: the winner, its tokens/s, and its margin over ``none`` at its largest batch.

    Example:
      >>> from remat_kit.search import Fastest, Throughput
      >>> def row(p, b, tps):
      ...     return Throughput(p, "none", p, b, b, 1, b, 1, 2, 1.0, tps, 0.4, 0.0)
      >>> f = Fastest((row("full", 16, 1200.0),), row("none", 8, 1000.0), 512, None, "x", 1, 4, 1.0)
      >>> fastest_words(f)[:47]
      'fastest: full at micro-batch 16, 1,200 tok/s, +'
      >>> fastest_words(f)[47:]
      '20.0% over none at its largest batch (8, 1,000 tok/s)'
    """
    win, base = f.winner, f.baseline
    if win is None:
        if any(r.fits for r in f.rows):
            return "fastest: no row has a predicted step time (the target has no rates)"
        return "fastest: nothing fits"
    line = f"fastest: {win.name} at micro-batch {_batch_cell(win)}"
    line += f", {win.tokens_per_second:,.0f} tok/s"
    if base is None:
        return line + "; none (no remat) does not fit even one sequence"
    how = "its largest batch" if f.global_batch is None else "its fastest accumulation"
    if base is win:
        return line + f": no remat at {how} is fastest"
    return (
        line + f", {pct(f.margin)} over none at {how} "
        f"({_batch_cell(base)}, {base.tokens_per_second:,.0f} tok/s)"
    )
