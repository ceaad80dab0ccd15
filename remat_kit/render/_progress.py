"""A search's length, said up front, and its progress per step, on stderr's terminal.

A long search (``compare``, ``fit``, ``plan``, ``advise``) first says on one line how many
compiles it will make: the number, a bound, or that it is adaptive and counted as it goes.
Then one live line names the step it is at, how many of how many are done and the time since
it began. On a pipe, a file or CI neither is written, so stderr holds only what went wrong.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from rich.console import Console

__all__ = [
    "length_words",
    "progress",
]


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
) -> Iterator[Callable[[str], None]]:
    """A search's progress line on stderr, shown while the block runs.

    Yields the callback a search calls with a few words before each of its steps. The live
    line reads ``what: words (n of N compiles, 1:12)``: ``n`` from ``done`` (called as the line
    redraws, so each compile shows as it ends) or the number of steps so far, ``N`` the
    ``total`` where one is known.

    Args:
      what: the search, e.g. ``fit --objective throughput``.
      console: where to draw (default: a console on stderr).
      total: the number of ``unit`` the search makes, or its bound (None: not known).
      done: how many are done so far (default: the callback's calls less one).
      unit: what ``total`` and ``done`` count.
      length: a line to print up front (:func:`length_words`); None: none.

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
        out.print(length, highlight=False, markup=False, soft_wrap=True)
    start = time.perf_counter()
    calls = [0]
    said = [""]

    def line() -> str:
        n = done() if done is not None else max(0, calls[0] - 1)
        of = f"{n} of {total}" if total is not None else f"{n}"
        one = total is None and n == 1 and unit.endswith("s")
        elapsed = int(time.perf_counter() - start)
        clock = f"{elapsed // 60}:{elapsed % 60:02d}"
        return f"{what}: {said[0] or 'starting'} ({of} {unit[:-1] if one else unit}, {clock})"

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
