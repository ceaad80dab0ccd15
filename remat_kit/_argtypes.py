"""argparse value types shared by the command-line pieces (one-line errors)."""

from __future__ import annotations

import argparse


def int_at_least(minimum: int, what: str) -> argparse.Action:
    """An argparse ``type=`` that accepts ints >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be {what}")
        return value

    return parse  # type: ignore[return-value]


positive_int = int_at_least(1, "positive")
non_negative_int = int_at_least(0, ">= 0")
