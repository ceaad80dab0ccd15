"""A search's length, said up front, and its progress per step, on stderr's terminal.

A long search (``compare``, ``fit``, ``plan``, ``advise``) first says how many compiles it will
make: the number, a bound, or that it is adaptive and counted as it goes. Then one live line
names the step it is at, what it compiles now (the batch or sequence it tries), how many of how
many are done and the time since it began. Both fit the terminal's width: the first is wrapped
between words, the live line (one line, redrawn) is clipped, the step's words first, so the
batch, the count and the clock stay in view. On a pipe, a file or CI neither is written, so
stderr holds only what went wrong.
"""

from __future__ import annotations

import contextlib
import shutil
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from rich.console import Console

from remat_kit.notes import label

__all__ = [
    "compiling_words",
    "length_words",
    "live_line",
    "progress",
]

#: Columns the status's spinner takes before the line (the spinner, a space).
_SPINNER = 2
#: What a clipped stretch of words ends with.
_CLIPPED = "…"


def length_words(
    what: str, total: int | None = None, *, bound: bool = False, unit: str = "compiles", how=""
) -> str:
    """The line a search prints before it starts: how long it will be.

    Args:
      what: the search, e.g. ``compare``.
      total: how many ``unit`` it will make; None: not known up front (adaptive).
      bound: ``total`` is an upper bound (the search stops early once it has its answer).
      unit: what ``total`` counts.
      how: a few words on why the count is what it is.

    Returns:
      One line.

    Example:
      >>> length_words("compare", 11, how="one per policy and schedule")
      'compare: 11 compiles (one per policy and schedule)'
      >>> length_words("next step", 2, bound=True)
      'next step: at most 2 compiles (it stops at the first that fits)'
      >>> length_words("fit", how="each policy's largest batch")
      "fit: adaptive (each policy's largest batch), so the compiles are counted as they go"
    """
    if total is None:
        why = f" ({how})" if how else ""
        return f"{what}: adaptive{why}, so the {unit} are counted as they go"
    count = f"at most {total}" if bound else f"{total}"
    unit = unit[:-1] if total == 1 and unit.endswith("s") else unit
    why = how or ("it stops at the first that fits" if bound else "")
    return f"{what}: {count} {unit}" + (f" ({why})" if why else "")


@contextlib.contextmanager
def progress(
    what: str,
    console: Console | None = None,
    *,
    total: int | None = None,
    done: Callable[[], int] | None = None,
    unit: str = "compiles",
    length: str | None = None,
    now: Callable[[], str | None] | None = None,
) -> Iterator[Callable[[str], None]]:
    """A search's progress line on stderr, shown while the block runs.

    Yields the callback a search calls with a few words before each of its steps. The live
    line reads ``what: words, now (n of N compiles, 1:12)`` (:func:`live_line`): ``now`` what
    is being compiled (``batch 297``), ``n`` from ``done`` (called as the line redraws, so each
    compile shows as it ends) or the number of steps so far, ``N`` the ``total`` where one is
    known. It fits the terminal (``shutil.get_terminal_size``); the line up front is wrapped
    to it.

    Args:
      what: the search, e.g. ``fit --objective throughput``.
      console: where to draw (default: a console on stderr).
      total: the number of ``unit`` the search makes, or its bound (None: not known).
      done: how many are done so far (default: the callback's calls less one).
      unit: what ``total`` and ``done`` count.
      length: a line to print up front (:func:`length_words`); None: none.
      now: what is being compiled at this moment, in a few words (``batch 297``:
        :func:`compiling_words`), or None between compiles; read as the line redraws.

    Example:
      >>> with progress("fit") as step:
      ...     step("full (1/3)")
    """
    out = console or Console(stderr=True)
    if not out.is_terminal:
        # A pipe, a file, CI: stderr keeps only what went wrong (one line; docs/commands/index.md,
        # "Exit codes").
        yield lambda words: None
        return
    if length is not None:
        out.print("\n".join(textwrap.wrap(length, _columns(out))), highlight=False, markup=False)
    start = time.perf_counter()
    calls = [0]
    said = [""]

    def doing() -> str | None:
        try:
            return now() if now is not None else None
        except RuntimeError:  # what it reads changed size as the search went on: next time
            return None

    def line() -> str:
        n = done() if done is not None else max(0, calls[0] - 1)
        return live_line(
            what,
            said[0],
            doing(),
            n,
            total,
            unit,
            time.perf_counter() - start,
            _columns(out) - _SPINNER,
        )

    def step(words: str) -> None:
        calls[0] += 1
        said[0] = words

    with out.status(line()) as status:
        # The line redraws as the spinner turns: the count and the clock move between steps.
        status.renderable.text = _Live(line)  # type: ignore[attr-defined]
        yield step


class _Live:
    """Text rich redraws from ``line()`` each time it renders (the spinner's own rate)."""

    def __init__(self, line: Callable[[], str]) -> None:
        self.line = line

    def __rich__(self) -> str:
        return self.line()


def live_line(
    what: str,
    said: str,
    now: str | None,
    n: int,
    total: int | None,
    unit: str,
    seconds: float,
    width: int,
) -> str:
    """The live line of :func:`progress`, at most ``width`` characters.

    ``what: said, now (n of N unit, m:ss)``. Where it is wider than ``width`` the step's
    words (``said``) are clipped first, then what is compiled now, so the count and the clock
    stay; a width too small even for them gets the line's first ``width`` characters.

    Args:
      what: the search (``fit``).
      said: the step's words (``none (1/3)``); empty: ``starting``.
      now: what is being compiled (``batch 297``), or None.
      n: how many ``unit`` are done.
      total: of how many (None: not known).
      unit: what is counted (``compiles``).
      seconds: since the search began.
      width: the columns the line may take.

    Example:
      >>> live_line("fit", "none (1/3)", "batch 297", 5, None, "compiles", 72.0, 80)
      'fit: none (1/3), batch 297 (5 compiles, 1:12)'
      >>> live_line("fit", "minimal (3/3)", "batch 263", 21, None, "compiles", 72.0, 45)
      'fit: minimal…, batch 263 (21 compiles, 1:12)'
    """
    of = f"{n} of {total}" if total is not None else f"{n}"
    one = total is None and n == 1 and unit.endswith("s")
    elapsed = int(seconds)
    tail = f" ({of} {unit[:-1] if one else unit}, {elapsed // 60}:{elapsed % 60:02d})"
    head = f"{what}: "
    said = said or "starting"
    rest = f", {now}" if now else ""
    room = width - len(head) - len(tail)
    if len(said) + len(rest) > room:
        said = _clip(said, max(1, room - len(rest)))
    if len(said) + len(rest) > room:
        rest = _clip(rest, max(0, room - len(said)))
    return (head + said + rest + tail)[: max(0, width)]


def _clip(words: str, room: int) -> str:
    """``words`` in at most ``room`` characters, ending in an ellipsis where cut."""
    if len(words) <= room:
        return words
    return words[: max(0, room - len(_CLIPPED))].rstrip() + _CLIPPED if room > 0 else ""


def _columns(out: Console) -> int:
    """The terminal's width (``shutil.get_terminal_size``: ``$COLUMNS``, else stdout's
    terminal), else the console's own."""
    return shutil.get_terminal_size((out.width, 24)).columns


def compiling_words(
    workloads: Iterable[Any], *, axis: str = "batch", policy: bool = False
) -> str | None:
    """What one of ``workloads`` (:class:`~remat_kit.sources.Workload`) is compiling now, in
    a few words for :func:`progress`: along the ``batch``, ``batch 297`` (with ``policy``,
    ``minimal at batch 8``); along the ``seq`` (one workload per sequence), ``seq 8192``;
    None between compiles.

    Example:
      >>> from types import SimpleNamespace as NS
      >>> compiling_words([NS(compiling=("none", "none", 297), seq=2048)])
      'batch 297'
      >>> compiling_words([NS(compiling=("full", "every:2", 8), seq=2048)], policy=True)
      'full @ every:2 at batch 8'
      >>> ws = [NS(compiling=None, seq=1024), NS(compiling=("full", "none", 1), seq=8192)]
      >>> compiling_words(ws, axis="seq")
      'seq 8192'
    """
    for w in workloads:
        now = w.compiling
        if now is None:
            continue
        spec, schedule, batch = now
        where = f"seq {w.seq}" if axis == "seq" else f"batch {batch}"
        return f"{label(spec, schedule)} at {where}" if policy else where
    return None
