"""Figures in words: sizes, times, fractions and counts, for the notes and the tables alike.

The one home of how a number reads, at the ground floor so that :mod:`remat_kit.notes` (a
note's sentence) and :mod:`remat_kit.render` (titles, captions, table cells) say the same
figure the same way. The convention:

* **Bytes** use binary units up to GiB: in prose (:func:`size`) the largest of KiB, MiB and
  GiB in which the figure is at least 1, with two decimals, and whole bytes below 1 KiB
  (``300 B``, ``1.50 KiB``, ``14.96 GiB``). GiB is the top unit however large the figure
  (``3072.00 GiB``, not ``3.00 TiB``): device memory and every limit beside it is read in
  GiB. A table column (:func:`byte_unit`) shares one unit, chosen the same way by its
  largest figure, from KiB up: its cells carry decimals, so no column is in whole bytes.
* **Times** use s (two decimals), ms (one decimal below 100, none from 100) and us (none):
  ``1.25 s``, ``1.1 ms``, ``250 ms``, ``42 us``; columns share a unit (:func:`second_unit`).
* **Fractions** read as percentages: :func:`percent` (``12.5%``) for a share of something,
  :func:`pct` (``+12.5%``) for a change against a reference.
* **Counts** are whole (:func:`counted`: ``1 compile``, ``3 compiles``) or, when large, in
  decimal units (:func:`count_words`: ``8.03 B`` parameters; :func:`flops_words`).
* Nothing known reads as ``-`` (None), and nothing at all as ``0 B`` / ``0 s``.

Example:
  >>> size(300), size(3 * 2**29), seconds(0.25), percent(0.125), counted(3, "compile")
  ('300 B', '1.50 GiB', '250 ms', '12.5%', '3 compiles')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

__all__ = [
    "GIB",
    "Unit",
    "byte_unit",
    "count_words",
    "counted",
    "flops_words",
    "fmt",
    "gib",
    "pct",
    "percent",
    "second_unit",
    "seconds",
    "size",
]

#: Bytes in a GiB.
GIB = 2**30

# Largest first: a figure takes the first unit it is at least 1 of.
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
    """Bytes in words, in the unit that suits the figure (the module's convention).

    Args:
      nbytes: the bytes; None when not known.
      digits: decimals in KiB, MiB or GiB (whole bytes have none).

    Returns:
      E.g. ``'1.50 GiB'``; ``'300 B'`` below 1 KiB; ``'-'`` for None.

    Example:
      >>> size(3 * 2**29), size(40 * 2**20), size(300), size(0), size(None)
      ('1.50 GiB', '40.00 MiB', '300 B', '0 B', '-')
    """
    if nbytes is None:
        return "-"
    if abs(nbytes) < 2**10:
        return f"{int(nbytes)} B"  # a byte is not divided: whole bytes, no decimals
    unit = byte_unit([nbytes])
    return f"{unit.cell(nbytes, digits)} {unit.name}"


def seconds(value: float | None) -> str:
    """A time in words in the unit that suits it: ``'1.25 s'``, ``'1.1 ms'``, ``'40 us'``.

    Example:
      >>> seconds(1.25), seconds(0.0011), seconds(0.25), seconds(4e-5), seconds(0.0)
      ('1.25 s', '1.1 ms', '250 ms', '40 us', '0 s')
    """
    if value is None:
        return "-"
    if value == 0:
        return "0 s"
    unit = second_unit([value])
    # Three significant figures at most below a second: 1.1 ms, 35.0 ms, 250 ms, 42 us.
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
    """A large count (parameters) in the unit that suits it: ``'8.03 B'``, ``'1.23 M'``.

    Example:
      >>> count_words(8.03e9), count_words(1_234_567), count_words(530)
      ('8.03 B', '1.23 M', '530')
    """
    for name, factor in _COUNT_UNITS:
        if abs(n) >= factor:
            return f"{n / factor:.2f} {name}"
    return f"{n:.0f}"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` things: the noun in the plural unless ``n`` is 1.

    Example:
      >>> counted(1, "compile"), counted(0, "layer"), counted(2, "policy", "policies")
      ('1 compile', '0 layers', '2 policies')
    """
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


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
    """Bytes as a bare GiB figure (a cell under a ``GiB`` header).

    Example:
      >>> gib(2**31), gib(None)
      ('2.00', '-')
    """
    return fmt(n, GIB, digits)


def percent(fraction: float | None, digits: int = 1) -> str:
    """A share as a percentage: ``percent(0.125) == '12.5%'``; ``-`` for None.

    Example:
      >>> percent(0.125), percent(0.1, 0), percent(None)
      ('12.5%', '10%', '-')
    """
    return "-" if fraction is None else f"{100 * fraction:.{digits}f}%"


def pct(value: float | None) -> str:
    """A change against a reference as a signed percentage; ``-`` for None.

    Example:
      >>> pct(0.25), pct(-0.031), pct(None)
      ('+25.0%', '-3.1%', '-')
    """
    return "-" if value is None else f"{100 * value:+.1f}%"
