"""Error messages that tell the user what to type instead."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def unknown(kind: str, name: object, known: Iterable[str], n: int = 3) -> ValueError:
    """``ValueError("unknown <kind> 'x'. Did you mean y? Known: a, b, c")`` to raise."""
    choices = sorted(known)
    close = difflib.get_close_matches(str(name), choices, n=n)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return ValueError(f"unknown {kind} {name!r}.{hint} Known: {', '.join(choices)}")
