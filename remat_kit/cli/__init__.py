"""``remat-kit``: memory reports for a named GPU from the command line.

Subcommands: ``report`` (one policy, with its breakdown and saved residuals),
``compare`` (a table over policies), ``fit`` (largest batch), ``plan`` (cheapest plan under
a budget, Pareto front), ``advise`` (which GPU), ``inspect`` (what is live at the peak),
``targets``, ``policies``, ``models``. Every figure comes from a compiled program (see
remat_kit.analysis); this package only parses arguments and hands data to remat_kit.render.

Each command is a module with ``add_parser(subparsers)`` and ``run(args) -> int``; a new
command is one module and one line in ``_COMMANDS``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from jax.errors import JaxRuntimeError

from remat_kit.cli import advise, compare, fit, inspect, listings, plan, report, validate
from remat_kit.cli._args import Parser
from remat_kit.errors import DoesNotFit, RematKitError
from remat_kit.search import FRONT_POLICIES

__all__ = ["MAIN_POLICIES", "main"]

#: What ``compare`` and ``plan`` measure when no ``--policies`` is given.
MAIN_POLICIES = FRONT_POLICIES

#: The commands, in the order ``remat-kit --help`` lists them.
_COMMANDS = (report, compare, fit, plan, advise, inspect, validate, listings)


def _parser() -> tuple[argparse.ArgumentParser, dict[str, Callable[[argparse.Namespace], int]]]:
    parser = Parser(prog="remat-kit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    runs: dict[str, Callable[[argparse.Namespace], int]] = {}
    for command in _COMMANDS:
        # A module may add several subcommands (listings adds three): each name it added runs it.
        before = set(sub.choices)
        command.add_parser(sub)
        runs.update(dict.fromkeys(set(sub.choices) - before, command.run))
    return parser, runs


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``remat-kit``: parses ``argv`` and runs the command it names.

    The one error boundary of the CLI: a ``RematKitError``, ``ValueError`` or ``TypeError``
    (bad input, a target that cannot be compiled for, an unreadable XLA dump) is printed as
    one line, ``remat-kit: <message>``, on stderr, and the exit code is 2; so is an error jax
    or XLA raises while building the program. ``DoesNotFit`` (the step is over the limit
    whatever the policy) is printed the same way with exit code 1.

    Args:
      argv: the arguments after ``remat-kit``; None reads ``sys.argv``.

    Returns:
      The exit code: 0 done; 1 nothing fits (``plan``, ``fit``, ``advise`` found no
      configuration within the limit, or none can exist); 2 bad input or a program that
      cannot be built (README, "Exit codes").

    Raises:
      SystemExit: argparse's own exits (``--help``, a malformed flag: one line, code 2).

    Example:
      >>> main(["policies"])  # doctest: +SKIP
      0
    """
    parser, runs = _parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "target", None) != "local":
            from remat_kit.targets import configure_for_deviceless

            # Deviceless compiles need jax's CPU platform, chosen before its backends start.
            configure_for_deviceless()
        if getattr(args, "no_cache", False):
            from remat_kit import cache

            with cache.bypassed():  # --no-cache: neither read nor write compiled analyses
                return runs[args.command](args)
        return runs[args.command](args)
    except DoesNotFit as err:
        # Nothing fits whatever the policy: an answer about the model, not a typo (exit 1,
        # as when a search finds nothing; README, "Exit codes").
        sys.stderr.write(f"remat-kit: {_one_line(err)}\n")
        return 1
    except (RematKitError, ValueError, TypeError) as err:
        sys.stderr.write(f"remat-kit: {_one_line(err)}\n")
        return 2
    except (NotImplementedError, JaxRuntimeError) as err:
        # jax or XLA refused the program after the checks passed (a kernel's shape rule, an
        # XLA INTERNAL error): its first line, not a 100-line traceback.
        text = _one_line(err, limit=300)
        sys.stderr.write(f"remat-kit: jax/XLA could not build this step: {text}\n")
        return 2


def _one_line(err: BaseException, limit: int | None = None) -> str:
    """An error's message on one line; with ``limit``, its first line cut to that length.

    remat_kit's own messages are written for the user and kept whole (joined if they span
    lines); jax's and XLA's carry HLO and stack text after their first line.
    """
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if limit is None:
        return " ".join(lines) or type(err).__name__
    text = lines[0] if lines else type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
