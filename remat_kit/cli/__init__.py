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

from remat_kit.cli import advise, compare, fit, inspect, listings, plan, report
from remat_kit.cli._args import Parser
from remat_kit.errors import RematKitError
from remat_kit.search import FRONT_POLICIES

__all__ = ["MAIN_POLICIES", "main"]

#: What ``compare`` and ``plan`` measure when no ``--policies`` is given.
MAIN_POLICIES = FRONT_POLICIES

#: The commands, in the order ``remat-kit --help`` lists them.
_COMMANDS = (report, compare, fit, plan, advise, inspect, listings)


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
    one line, ``remat-kit: <message>``, on stderr, and the exit code is 2.

    Args:
      argv: the arguments after ``remat-kit``; None reads ``sys.argv``.

    Returns:
      The exit code: 0 done, 1 a plan that does not fit its budget, 2 bad input.

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
        return runs[args.command](args)
    except (RematKitError, ValueError, TypeError) as err:
        sys.stderr.write(f"remat-kit: {err}\n")
        return 2
