"""The console and plain-text tables. How a figure reads (sizes, times, fractions, counts) is
:mod:`remat_kit._units`, shared with the notes."""

from __future__ import annotations

import os
import sys
from typing import Any

# render/_listings.py (another worker's file) reads these three here.
from remat_kit._units import count_words, fmt, gib  # noqa: F401

__all__ = [
    "console",
    "short",
    "text_table",
]


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
    from rich.text import Text

    from remat_kit.render._wrap import wrap

    class _Console(Console):
        """A Console whose prose (a note, a hint) breaks between tokens, never inside one."""

        def print(self, *objects: Any, **kwargs: Any) -> None:
            if len(objects) == 1 and isinstance(objects[0], (str, Text)):
                text = objects[0]
                if isinstance(text, str):
                    text = self.render_str(
                        text,
                        markup=kwargs.get("markup"),
                        highlight=kwargs.get("highlight"),
                        emoji=kwargs.get("emoji"),
                    )
                objects = (wrap(text, self.width),)
            super().print(*objects, **kwargs)

    return _Console(width=1000 if wide else _terminal_width())


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
