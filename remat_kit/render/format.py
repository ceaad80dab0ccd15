"""Number formatting and the console: the only place figures become text."""

from __future__ import annotations

import os
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


def console() -> Any:
    """A rich Console as wide as the terminal (150–200 columns)."""
    from rich.console import Console

    try:
        width = os.get_terminal_size().columns
    except OSError:
        width = 120
    return Console(width=max(150, min(200, width)))


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
