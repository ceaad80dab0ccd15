"""Number formatting and the console: the only place figures become text."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = [
    "GIB",
    "console",
    "fmt",
    "gib",
    "pct",
    "short",
    "text_table",
]

GIB = 2**30


def fmt(value: float | None, unit: float, digits: int = 2) -> str:
    """``value / unit`` with ``digits`` decimals; ``-`` for None.

    Example:
      >>> fmt(3 * 2**30, GIB)
      '3.00'
    """
    if value is None:
        return "-"
    return f"{value / unit:.{digits}f}"


def gib(n: float | None, digits: int = 2) -> str:
    """Bytes as GiB, e.g. ``gib(2**31) == '2.00'``."""
    return fmt(n, GIB, digits)


def pct(value: float | None) -> str:
    """A signed percentage of a fraction, e.g. ``pct(0.25) == '+25.0%'``; ``-`` for None."""
    return "-" if value is None else f"{100 * value:+.1f}%"


def short(text: str, width: int = 70) -> str:
    """``text`` cut to ``width`` characters with an ellipsis."""
    return text if len(text) <= width else text[: width - 1] + "…"


def console(wide: bool = False) -> Any:
    """The rich Console remat-kit prints to, as wide as the terminal it prints in.

    The width is ``$COLUMNS`` when set, else the terminal's width, else (output to a file or
    a pipe) 150 columns. Tables are laid out for that width by
    :func:`remat_kit.render.fitted`.

    Args:
      wide: ``--wide``: lay nothing out for the terminal (no column is left out, nothing is
        wrapped); lines are as long as the tables need.

    Returns:
      A ``rich.console.Console``.

    Example:
      >>> console(wide=True).width
      1000
    """
    from rich.console import Console

    if wide:
        return Console(width=1000)
    return Console(width=_terminal_width())


def _terminal_width() -> int:
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) >= 40:
        return int(columns)
    try:
        if sys.stdout.isatty():
            return max(40, os.get_terminal_size(sys.stdout.fileno()).columns)
    except (OSError, ValueError):
        pass  # no terminal behind stdout after all (a closed or redirected stream)
    return 150


def text_table(
    rows: list[dict[str, Any]], columns: list[str] | tuple[str, ...], title: str = ""
) -> str:
    """``rows`` as a plain-text table of ``columns`` (floats to 3 significant digits).

    Example:
      >>> print(text_table([{"policy": "full", "peak": 1.23456}], ["policy", "peak"]))
      ┏━━━━━━━━┳━━━━━━┓
      ┃ policy ┃ peak ┃
      ┡━━━━━━━━╇━━━━━━┩
      │   full │ 1.23 │
      └────────┴──────┘
    """
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for c in columns:
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(*[_cell(r.get(c)) for c in columns])
    out = Console(width=140)
    with out.capture() as captured:
        out.print(t)
    return captured.get()


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return "-" if v is None else str(v)
