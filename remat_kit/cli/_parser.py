"""The ``remat-kit`` argument parser class: light, so ``remat-kit --help`` starts no jax."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

__all__ = ["Parser"]


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Help that states each flag's default (where it has one worth stating) and keeps the
    examples' lines as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default in (None, False, argparse.SUPPRESS, ()):
            return text  # a help that words its default itself says it best
        if action.option_strings and action.nargs != 0:
            return f"{text} (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line, ``remat-kit: ...``, exit code 2.

    A value that starts with ``-`` and a digit (``--budget -5GiB``, ``--seq -3``) is read as
    the flag's value, not as an unknown option, so its own check can say what is wrong with
    it (argparse alone says "expected one argument"). No flag of remat-kit looks like that.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)
        # argparse's own pattern accepts only plain negative numbers (-3, -0.5).
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> Any:  # type: ignore[override]
        sys.stderr.write(f"remat-kit: {message}\n")
        raise SystemExit(2)
