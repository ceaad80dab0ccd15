"""The ``remat-kit`` argument parser class: light, so ``remat-kit --help`` starts no jax."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

__all__ = ["Parser"]


class Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line, ``remat-kit: ...``, exit code 2.

    A value that starts with ``-`` and a digit (``--budget -5GiB``, ``--seq -3``) is read as
    the flag's value, not as an unknown option, so its own check can say what is wrong with
    it (argparse alone says "expected one argument"). No flag of remat-kit looks like that.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # argparse's own pattern accepts only plain negative numbers (-3, -0.5).
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> Any:  # type: ignore[override]
        sys.stderr.write(f"remat-kit: {message}\n")
        raise SystemExit(2)
