"""A progress line for searches that take more than a few seconds, on stderr's terminal."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console

__all__ = [
    "progress",
]


@contextlib.contextmanager
def progress(what: str, console: Console | None = None) -> Iterator[Callable[[str], None]]:
    """A spinner naming what a search is at, shown while the block runs.

    Yields the callback a search calls with a few words before each of its steps. On a
    console that is not a terminal (a pipe, a file, CI) nothing is drawn: the callback does
    nothing and the output stays clean.

    Args:
      what: the search, e.g. ``fit --objective throughput``.
      console: where to draw (default: a console on stderr).

    Example:
      >>> with progress("fit") as step:
      ...     step("full (1/3)")
    """
    out = console or Console(stderr=True)
    if not out.is_terminal:
        yield lambda words: None
        return
    with out.status(f"{what}: starting") as status:
        yield lambda words: status.update(f"{what}: {words}")
