"""The ``remat-kit`` argument parser class: light, so ``remat-kit --help`` starts no jax."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["Parser", "once"]

# Where a parse keeps the single-valued flags given so far (removed before the parse returns).
_GIVEN = "_remat_kit_given"


def once(
    parser: argparse.ArgumentParser,
    namespace: argparse.Namespace,
    action: argparse.Action,
    values: Any,  # what the flag's type= made of its text: any value
    option_string: str | None,
) -> None:
    """Refuses a single-valued flag given a second time (argparse keeps the last value and
    drops the first without a word: ``--target h100 --target a100-80gb`` would measure one
    of the two GPUs the user named).

    Raises:
      SystemExit: through ``parser.error``: one line naming the flag and both values.
    """
    if option_string is None:
        return
    given = namespace.__dict__.setdefault(_GIVEN, {})
    words = " ".join(map(str, values)) if isinstance(values, list) else str(values)
    if action.dest in given:
        first, was = given[action.dest]
        parser.error(
            f"{first} given twice ({was!r}, then {option_string} {words!r}); it takes one "
            "value: give it once"
        )
    given[action.dest] = (option_string, words)


def _once(cls: type[argparse.Action]) -> type[argparse.Action]:
    class Once(cls):  # type: ignore[valid-type,misc]
        def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[no-untyped-def]
            once(parser, namespace, self, values, option_string)
            super().__call__(parser, namespace, values, option_string)

    Once.__name__ = Once.__qualname__ = f"Once{cls.__name__}"
    return Once


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

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # argparse.ArgumentParser's own
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)
        # argparse's own pattern accepts only plain negative numbers (-3, -0.5).
        self._negative_number_matcher = re.compile(r"^-\.?\d")
        # A flag that takes one value is given once (see once); argument groups share this
        # registry. Flags that collect (append), count or switch (store_true) are not affected.
        store = self._registry_get("action", "store")
        once_store = _once(store)
        self.register("action", None, once_store)
        self.register("action", "store", once_store)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, rest = super().parse_known_args(args, namespace)
        parsed.__dict__.pop(_GIVEN, None)
        return parsed, rest

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"remat-kit: {message}\n")
        raise SystemExit(2)
