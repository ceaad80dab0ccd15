"""Number formatting and the console: the only place figures become text."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterable
from typing import Any

__all__ = [
    "GIB",
    "Unit",
    "byte_unit",
    "console",
    "count_words",
    "flops_words",
    "fmt",
    "gib",
    "pct",
    "second_unit",
    "seconds",
    "short",
    "size",
    "text_table",
]

GIB = 2**30

# A unit is chosen per figure in prose (``size``, ``seconds``) and per table column in tables
# (``byte_unit``, ``second_unit``): the figures of one column are read against each other, so
# they share the unit its header names, chosen by the column's largest figure.
_BYTE_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
_SECOND_UNITS = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6))
_FLOP_UNITS = (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3))
_COUNT_UNITS = (("B", 1e9), ("M", 1e6), ("K", 1e3))


@dataclasses.dataclass(frozen=True)
class Unit:
    """A unit figures are shown in: its name and how many base units (bytes, seconds) it is.

    Example:
      >>> Unit("MiB", 2**20).cell(3 * 2**19)
      '1.50'
    """

    name: str
    size: float

    def cell(self, value: float | None, digits: int = 2) -> str:
        """``value`` in this unit with ``digits`` decimals, as a table cell; ``-`` for None."""
        return fmt(value, self.size, digits)


def _unit_of(values: Iterable[float | None], units: tuple[tuple[str, float], ...]) -> Unit:
    """The largest of ``units`` in which the largest of ``values`` is at least 1 (the last
    unit below that; the first when every value is 0 or None)."""
    top = max((abs(v) for v in values if v is not None), default=0.0)
    if top == 0:
        return Unit(*units[0])
    for name, factor in units:
        if top >= factor:
            return Unit(name, factor)
    return Unit(*units[-1])


def byte_unit(values: Iterable[float | None]) -> Unit:
    """The unit (GiB, MiB or KiB) a column of byte counts is shown in: the largest in which
    its largest figure is at least 1, so no figure of a tiny model reads 0.00.

    Example:
      >>> byte_unit([3 * 2**20, 2**10, None]).name, byte_unit([80 * 2**30, 5]).name
      ('MiB', 'GiB')
    """
    return _unit_of(values, _BYTE_UNITS)


def second_unit(values: Iterable[float | None]) -> Unit:
    """The unit (s, ms or us) a column of times is shown in, chosen as :func:`byte_unit`.

    Example:
      >>> second_unit([0.0011, 0.0009]).name
      'ms'
    """
    return _unit_of(values, _SECOND_UNITS)


def size(nbytes: float | None, digits: int = 2) -> str:
    """Bytes in words, in the unit that suits the figure: ``'1.50 GiB'``, ``'12.00 MiB'``.

    Example:
      >>> size(3 * 2**29), size(40 * 2**20), size(300), size(0), size(None)
      ('1.50 GiB', '40.00 MiB', '0.29 KiB', '0 B', '-')
    """
    if nbytes is None:
        return "-"
    if nbytes == 0:
        return "0 B"  # nothing, in no unit in particular
    unit = byte_unit([nbytes])
    return f"{unit.cell(nbytes, digits)} {unit.name}"


def seconds(value: float | None) -> str:
    """A time in words in the unit that suits it: ``'1.25 s'``, ``'1.1 ms'``, ``'40 us'``.

    Example:
      >>> seconds(1.25), seconds(0.0011), seconds(4e-5), seconds(0.0)
      ('1.25 s', '1.1 ms', '40 us', '0 s')
    """
    if value is None:
        return "-"
    if value == 0:
        return "0 s"
    unit = second_unit([value])
    digits = 2 if unit.name == "s" else 1 if value / unit.size < 100 else 0
    if unit.name == "us":
        digits = 0
    return f"{unit.cell(value, digits)} {unit.name}"


def flops_words(flops: float) -> str:
    """A FLOP count in the unit that suits it: ``'1.2 TFLOP'``, ``'35.4 MFLOP'``.

    Example:
      >>> flops_words(1.23e12), flops_words(3.54e7), flops_words(12)
      ('1.2 TFLOP', '35.4 MFLOP', '12 FLOP')
    """
    for name, factor in _FLOP_UNITS:
        if abs(flops) >= factor:
            return f"{flops / factor:.1f} {name}"
    return f"{flops:.0f} FLOP"


def count_words(n: float) -> str:
    """A count (parameters) in the unit that suits it: ``'8.03 B'``, ``'1.23 M'``, ``'530'``.

    Example:
      >>> count_words(8.03e9), count_words(1_234_567), count_words(530)
      ('8.03 B', '1.23 M', '530')
    """
    for name, factor in _COUNT_UNITS:
        if abs(n) >= factor:
            return f"{n / factor:.2f} {name}"
    return f"{n:.0f}"


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
