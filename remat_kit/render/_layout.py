"""Tables laid out for the terminal they are printed in.

rich shrinks a table that is wider than the console by wrapping its cells, so a row of figures
becomes three lines of fragments, and it wraps a title or caption at the *table's* width, so a
narrow table breaks its title mid-phrase. :func:`fitted` does what a reader wants instead: the
least important columns go first (named under the table, ``--wide`` shows them), and the title
and caption are wrapped at the terminal's width, between tokens (:mod:`remat_kit.render._wrap`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence

from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from remat_kit.render._wrap import wrap

__all__ = [
    "DROP_FIRST",
    "fitted",
]

_BYTE_UNIT = re.compile(r"\b[GMK]iB\b")
_SECOND_UNIT = re.compile(r" (?:ms|us)\b")

# The columns a narrow terminal loses, first to last, across every table remat-kit prints
# (headers as written, a line break read as a space). A column not named here is never
# dropped: policy, peak, fits, step time and the like are the answer itself.
DROP_FIRST: tuple[str, ...] = (
    "compile s",
    "$/GPU-h",
    "offload / recompute ms (est.)",
    "tokens/step",
    "next batch GiB",
    "activations GiB",
    "fixed GiB",
    "tok/s",
    "tok/s (est.)",
    "host GiB",
    "recompute",
    "saved vs none",
    "time vs none",
)


def fitted(table: Table, width: int, drop: Sequence[str] = DROP_FIRST) -> RenderableType:
    """``table`` as it should be printed on a console ``width`` columns wide.

    While the table's natural width is over ``width``, the columns named in ``drop`` are left
    out, in that order (a line under the table names them). The title is printed above the
    table and the caption below it, each wrapped at ``width`` rather than at the table's
    own width. ``table`` itself is not changed.

    Args:
      table: a rich table (its title and caption may hold rich markup).
      width: the console's width in columns.
      drop: headers of the columns that may be left out, the least important first.

    Returns:
      Something to ``Console.print``: the title, the table and the caption.

    Example:
      >>> t = Table(title="t")
      >>> for col in ("policy", "peak GiB", "compile s"):
      ...     t.add_column(col)
      >>> t.add_row("full", "1.00", "12.5")
      >>> out = Console(width=30)
      >>> out.print(fitted(t, 30))
      t
      ┏━━━━━━━━┳━━━━━━━━━━┓
      ┃ policy ┃ peak GiB ┃
      ┡━━━━━━━━╇━━━━━━━━━━┩
      │ full   │ 1.00     │
      └────────┴──────────┘
      not shown at 30 columns: compile s (--wide shows all)
    """
    measure = Console(width=width)
    shown = copy.copy(table)
    shown.title = shown.caption = None
    shown.columns = list(table.columns)
    left_out = []
    for header in drop:
        if _natural_width(measure, shown) <= width:
            break
        column = next((c for c in shown.columns if _header(c.header) == _header(header)), None)
        if column is not None and len(shown.columns) > 1:
            shown.columns.remove(column)
            left_out.append(" ".join(str(column.header).split()))  # with its unit
    parts: list[RenderableType] = []
    if table.title:
        parts.append(_text(table.title, "table.title", width))
    parts.append(shown)
    if table.caption:
        parts.append(_text(table.caption, "table.caption", width))
    if left_out:
        parts.append(
            wrap(
                Text(
                    f"not shown at {width} columns: {', '.join(left_out)} (--wide shows all)",
                    style="table.caption",
                ),
                width,
            )
        )
    return Group(*parts)


def _natural_width(console: Console, table: Table) -> int:
    """The width ``table`` takes with no cell wrapped."""
    return Measurement.get(console, console.options.update(width=10**6), table).maximum


def _header(header: object) -> str:
    """A header as :data:`DROP_FIRST` names it: one line, its unit read as GiB or s (a
    column's unit follows its figures: ``activations MiB`` is ``activations GiB``)."""
    words = " ".join(str(header).split())
    return _SECOND_UNIT.sub(" s", _BYTE_UNIT.sub("GiB", words))


def _text(value: object, style: str, width: int) -> RenderableType:
    if isinstance(value, str):
        return wrap(Text.from_markup(value, style=style), width)
    return value  # type: ignore[return-value]  # already a renderable
