"""The ``fit --over seq`` table: per policy the longest sequence that fits at a fixed batch.

Example:
  >>> from remat_kit.search import Fit
  >>> def fit(policy, seq):
  ...     return Fit("seq", policy, "none", 1, seq, 1024, 2**30, 2**31, 3 * 2**29, None, 4, 1.0,
  ...                method="line")
  >>> rows = [FitRow("none", fit("none", 4096)), FitRow("full", fit("full", 16384))]
  >>> longest_words(rows)
  'longest: full at seq 16384 (batch 1: 16,384 tokens per step), 4.0x none (4096)'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.table import Table

from remat_kit._units import Unit, byte_unit, size
from remat_kit.render._format import short
from remat_kit.render._tables import FitRow
from remat_kit.render._titles import RunOptions, opts_precision, run_words, training_line

if TYPE_CHECKING:
    from remat_kit.search import Fit
    from remat_kit.targets import Target

__all__ = [
    "longest_words",
    "seq_table",
]


def _longest(rows: Sequence[FitRow]) -> int:
    return max((row.fit.seq for row in rows), default=0)


def seq_table(
    rows: Sequence[FitRow],
    target: Target,
    opts: RunOptions,
    *,
    limit_words: str,
    compiles: int,
    seconds: float,
) -> Table:
    """The ``fit --over seq`` table: the longest sequence per policy, the longest starred.

    Args:
      rows: one FitRow per policy (at least one).
      target: the target compiled for.
      opts: the run's options (model, optimizer, LoRA rank, accumulation, for the title).
      limit_words: how the limit was set (``usable at ..., less 10%``).
      compiles: how many programs were compiled (for the caption).
      seconds: wall time of the search (for the caption).

    Returns:
      The table: policy, longest sequence, tokens per step, the peak at it and at the next
      step, the compiles and how the boundary was found; the title names the attention
      kernel (the curve's shape: flash attention's is near affine, einsum's quadratic).

    Example:
      >>> from types import SimpleNamespace as NS
      >>> from remat_kit.search import Fit
      >>> fit = Fit("seq", "full", "none", 1, 8192, 1024, 2**30, 2**31, 3 * 2**29, None, 4, 1.0,
      ...           method="line", attention="cudnn")
      >>> opts = NS(model="tiny-llama", optimizer="sgd", lora=0, accum=1, precision_record=dict)
      >>> t = seq_table([FitRow("full", fit)], rk.target("h100"), opts, limit_words="",
      ...               compiles=4, seconds=1.0)
      >>> [c.header for c in t.columns][:3]
      ['policy', 'longest seq', 'tokens/step']
      >>> print(t.title.splitlines()[0])
      longest sequence: tiny-llama b1 sgd on h100-80gb, attention cudnn, step 1024 tokens
      (limit 1.50 GiB)
    """
    first = rows[0].fit
    # The run as run_words names it, the sequence (what the search sets) left out.
    run = run_words(opts, batch=first.batch, seq=False)
    limit = f"limit {size(first.limit_bytes)}" + (f" = {limit_words}" if limit_words else "")
    kernels = sorted({row.fit.attention for row in rows if row.fit.attention})
    attention = f", attention {'/'.join(kernels)}" if kernels else ""
    title = (
        f"longest sequence: {run} on {target.label}{attention}, step {first.unit} "
        f"tokens ({limit})" + training_line(opts_precision(opts), None)
    )
    table = Table(title=title, caption=f"{compiles} compiles in {seconds:.1f} s")
    mem = byte_unit(b for row in rows for b in (row.fit.peak_bytes, row.fit.next_peak_bytes))
    columns = (
        "policy",
        "longest seq",
        "tokens/step",
        f"peak {mem.name}",
        f"next step {mem.name}",
        "compiles",
        "method",
    )
    for col in columns:
        table.add_column(col, justify="left" if col in ("policy", "method") else "right")
    longest = _longest(rows)
    for row in rows:
        fit = row.fit
        name = short(row.label, 48)
        if longest and fit.seq == longest:
            name = f"[bold]{name} *[/bold]"
        table.add_row(
            name,
            str(fit.seq) if fit.fits else "none fits",
            str(fit.tokens_per_step),
            mem.cell(fit.peak_bytes),
            _next_cell(fit, mem),
            str(fit.compiles),
            fit.method or "-",
        )
    return table


def _next_cell(fit: Fit, mem: Unit) -> str:
    if fit.next_peak_bytes is not None:
        return mem.cell(fit.next_peak_bytes)
    data = fit.note.data if fit.note is not None else {}
    if data.get("refused"):
        return "not built"
    return "cap" if fit.fits else "-"


def longest_words(rows: Sequence[FitRow]) -> str:
    """One line under the table: the longest sequence, and how it compares with ``none``'s.

    Args:
      rows: the table's rows.

    Returns:
      ``longest: <policy> at seq S (batch B: T tokens per step)``, then ``, Nx none (S0)``
      where a ``none`` row fits; ``longest: nothing fits`` when no row does.

    Example:
      >>> longest_words([])
      'longest: nothing fits'
    """
    longest = _longest(rows)
    if not longest:
        return "longest: nothing fits"
    win = next(row for row in rows if row.fit.seq == longest)
    line = (
        f"longest: {win.label} at seq {longest} (batch {win.fit.batch}: "
        f"{win.fit.tokens_per_step:,} tokens per step)"
    )
    base = next((row for row in rows if row.label == "none"), None)
    if base is None or base is win:
        return line
    if not base.fit.fits:
        return line + "; none (no remat) does not fit even the shortest sequence"
    return line + f", {longest / base.fit.seq:.1f}x none ({base.fit.seq})"
