"""``remat-kit``: memory reports for a named GPU from the command line.

Subcommands: ``report`` (one policy, with its breakdown and saved residuals),
``compare`` (a table over policies), ``fit`` (largest batch), ``plan`` (cheapest plan under
a budget, Pareto front), ``advise`` (which GPU), ``inspect`` (what is live at the peak),
``targets``, ``policies``, ``models``. Every figure comes from a compiled program (see
remat_kit.analysis); this package only parses arguments and hands data to remat_kit.render.

Each command is a module with ``run(args) -> int``, listed in ``COMMANDS`` with its one-line
help and examples; its flags are declared in :mod:`remat_kit.cli._flags` (those several
commands share, in :mod:`remat_kit.cli._args`). ``remat-kit --help`` and ``remat-kit CMD
--help`` import no command module (so they start no jax); a run imports only the command it
names. A new command is one module, one line in ``COMMANDS`` and one declaration.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from remat_kit.cli import _interrupt  # first: Ctrl-C during the imports below is one line
from remat_kit.cli._parser import Parser
from remat_kit.errors import BadType, BadValue, DoesNotFit, RematKitError

__all__ = ["COMMANDS", "FLAGS", "MAIN_POLICIES", "Command", "main", "summary"]


class Command(NamedTuple):
    """One ``remat-kit`` subcommand: its name, the module that runs it, its help line and the
    examples its ``--help`` ends with."""

    name: str
    module: str
    help: str
    examples: tuple[str, ...] = ()


#: The commands, in the order ``remat-kit --help`` lists them.
COMMANDS: tuple[Command, ...] = (
    Command(
        "report",
        "remat_kit.cli._report",
        "peak HBM of one policy, with breakdown and residuals",
        (
            "remat-kit report --model llama3-8b --target h100 --batch 4 --policy minimal",
            "remat-kit report --model llama3-8b --target a100-40gb --lora 16 --json out.json",
        ),
    ),
    Command(
        "compare",
        "remat_kit.cli._compare",
        "a table of policies for one model and target",
        (
            "remat-kit compare --model llama3-8b --target h100 --batch 4 --seq 2048",
            "remat-kit compare --model gpt2-medium --target rtx4090 --policies none,full,minimal",
        ),
    ),
    Command(
        "fit",
        "remat_kit.cli._fit",
        "the largest batch that fits, per policy",
        (
            "remat-kit fit --model gpt2-medium --target rtx4090 --seq 512",
            "remat-kit fit --model llama3-8b --target h100 --optimizer sgd --over seq",
        ),
    ),
    Command(
        "plan",
        "remat_kit.cli._plan",
        "the cheapest plan whose compiled peak fits a budget",
        (
            "remat-kit plan --model llama3-8b --target h100 --batch 4 --seq 2048 --budget 52GiB",
            "remat-kit plan --model gpt2-medium --target rtx4090 --batch 16 --sweep --plot f.png",
        ),
    ),
    Command(
        "advise",
        "remat_kit.cli._advise",
        "for every GPU: does it fit, with which plan",
        (
            "remat-kit advise --model llama3-8b --batch 8 --seq 2048",
            "remat-kit advise --model llama3-70b --batch 16 --seq 4096 --scale-out",
        ),
    ),
    Command(
        "inspect",
        "remat_kit.cli._inspect",
        "what is live at the peak, and when",
        (
            "remat-kit inspect --model llama3-8b --target h100 --batch 4 --policy minimal",
            "remat-kit inspect --model llama3-8b --target h100 --batch 4 --diff full minimal",
        ),
    ),
    Command(
        "validate",
        "remat_kit.cli._validate",
        "run the step on the local GPU; compare the measured peak with ours",
        (
            "remat-kit validate --model llama3.2-1b --batch 4 --seq 2048 --policy full",
            "remat-kit validate --model gpt2-medium --batch 8 --seq 1024 --compare-with a100-80gb",
        ),
    ),
    Command(
        "targets",
        "remat_kit.cli._listings",
        "list the GPU targets",
        ("remat-kit targets", "remat-kit targets --wide"),
    ),
    Command(
        "policies",
        "remat_kit.cli._listings",
        "list the policies",
        ("remat-kit policies", "remat-kit policies --wide"),
    ),
    Command(
        "models",
        "remat_kit.cli._listings",
        "list the model presets",
        ("remat-kit models", "remat-kit models --wide"),
    ),
)

#: The flag that sets each library parameter a ``BadValue`` names (``BadValue.param``), for
#: the CLI's own flags: with the kinds' options' (``rk.sources.Option.params``: ``n_layers``
#: -> ``--layers``), the one place library parameters meet command-line flags
#: (:func:`_flag_of`). Library messages name parameters; :func:`main` puts the flag (and the
#: value given to it) in front of the message.
FLAGS: dict[str, str] = {
    "target": "--target",
    "devices": "--gpus",
    "hosts": "--hosts",
    "slices": "--slices",
    "node": "--node",
    "batch": "--batch",
    "seq": "--seq",
    "mem_fraction": "--mem-fraction",
    "policy": "--policy",
    "schedule": "--schedule",
    "budget": "--budget",
    "host_budget": "--host-budget",
    "headroom": "--headroom",
    "hide": "--hide",
    "objective": "--objective",
    "jobs": "--jobs",
    "cluster": "--cluster",
    "price": "--price",
    "price_file": "--price-file",
    "rank": "--rank",
    "global_batch": "--global-batch",
}


def summary(name: str) -> str:
    """The one-line help of the command ``name`` (as ``remat-kit --help`` lists it).

    Example:
      >>> summary("fit")
      'the largest batch that fits, per policy'
    """
    return next(c.help for c in COMMANDS if c.name == name)


def __getattr__(name: str) -> Any:
    # MAIN_POLICIES (what compare and plan measure without --policies) lives in remat_kit.search,
    # which starts jax: read it on first use, not when --help is printed.
    if name == "MAIN_POLICIES":
        from remat_kit.search import FRONT_POLICIES

        return FRONT_POLICIES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _command_in(argv: Sequence[str]) -> str | None:
    # The subcommand argparse will choose: the first word that is not an option (the
    # top-level parser's options, --debug and --help, take no value).
    return next((a for a in argv if not a.startswith("-")), None)


def _version() -> str:
    """``remat-kit X (jax Y)``: the installed distribution's version, read without importing
    jax (``--help`` and ``--version`` stay fast)."""
    from importlib import metadata

    def of(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    return f"remat-kit {of('remat-kit')} (jax {of('jax')}, jaxlib {of('jaxlib')})"


def _parser(
    command: str | None = None,
) -> tuple[argparse.ArgumentParser, dict[str, Callable[[argparse.Namespace], int]]]:
    """The ``remat-kit`` parser, with ``command``'s own subparser; every other command is a
    stub that carries only its name and help line. No command module is imported: a
    command's flags are declared in :mod:`remat_kit.cli._flags` (so ``--help`` starts no
    jax), and its module is imported when it runs."""
    from remat_kit.cli._args import add_common_args
    from remat_kit.cli._flags import declare

    parser = Parser(prog="remat-kit", description=__doc__.splitlines()[0])
    add_common_args(parser, top=True)
    parser.add_argument(
        "--version", action="version", version=_version(), help="print the version and exit"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    runs: dict[str, Callable[[argparse.Namespace], int]] = {}
    for c in COMMANDS:
        if c.name != command:
            sub.add_parser(c.name, help=c.help, add_help=False)
            continue
        epilog = "examples:\n" + "\n".join(f"  {e}" for e in c.examples) if c.examples else None
        p = sub.add_parser(c.name, help=c.help, description=c.help, epilog=epilog)
        declare(c.name, p)
        add_common_args(p)
        runs[c.name] = functools.partial(_run_module, c.module)
    return parser, runs


def _run_module(module: str, args: argparse.Namespace) -> int:
    # The command's module (and jax, which it imports) is loaded here, to run, not for --help.
    run: Callable[[argparse.Namespace], int] = importlib.import_module(module).run
    # jax's backends start in the run, after the model is read: XLA reads XLA_FLAGS once, as
    # its first backend starts, and a factory or a plugin's config may set them on import
    # (tests/test_sources.py::test_flags_an_import_sets_reach_the_compiles_of_a_fresh_process).
    _interrupt.running()  # Ctrl-C now raises, so that the run can clean up
    return run(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``remat-kit``: parses ``argv`` and runs the command it names.

    The one error boundary of the CLI: a ``RematKitError`` (bad input, a target that cannot
    be compiled for, an unreadable XLA dump) is printed as one line, ``remat-kit: <message>``,
    on stderr, and the exit code is 2; so is an error jax or XLA raises while building the
    program. ``DoesNotFit`` (the step is over the limit whatever the policy) is printed the
    same way with exit code 1. A bad value that names its library parameter
    (``BadValue.param``) is printed after the flag that set it (:data:`FLAGS`). Anything
    else is a bug and propagates with its traceback; ``--debug`` shows the traceback of the
    errors above too.

    Args:
      argv: the arguments after ``remat-kit``; None reads ``sys.argv``.

    Returns:
      The exit code: 0 done; 1 nothing fits (``plan``, ``fit``, ``advise`` found no
      configuration within the limit, or none can exist); 2 bad input or a program that
      cannot be built; 130 interrupted (Ctrl-C), 143 terminated (SIGTERM), 129 hung
      up (SIGHUP): one line, worker processes stopped
      (docs/commands/index.md, "Exit codes").

    Raises:
      SystemExit: argparse's own exits (``--help``, a malformed flag: one line, code 2).

    Example:
      >>> main(["policies"])
      policies...minimal...
      0
      >>> main(["polices"])  # the one line goes to stderr
      Traceback (most recent call last):
      SystemExit: 2
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    _interrupt.reset()
    _interrupt.catch()
    try:
        # Ctrl-C at any moment, the command module's import (jax: seconds) included.
        parser, runs = _parser(_command_in(argv))
        args = parser.parse_args(argv)
        # The flags the user typed (a default and a typed default read alike after
        # parsing): a flag a command does not act on is refused only when it was given.
        args.given = frozenset(a.split("=", 1)[0] for a in argv if a.startswith("--"))
        code = _run(args, runs)
    except BaseException as err:
        # A Ctrl-C reaches us as KeyboardInterrupt, or as whatever the code it cut short made
        # of it (an extension module's import turns it into an ImportError, jax's backend
        # start into a RuntimeError): the flag the handler set tells them apart.
        if "--debug" in argv or not (_interrupt.came() or isinstance(err, KeyboardInterrupt)):
            raise
        return _interrupt.stop()
    finally:
        _interrupt.release()  # a caller's own code after main keeps Python's defaults
    return _interrupt.stop() if _interrupt.came() else code


def _run(args: argparse.Namespace, runs: Mapping[str, Callable[[argparse.Namespace], int]]) -> int:
    try:
        _prepare_platform(args)
        if _without_cache(args):
            from remat_kit import cache

            with cache.bypassed():  # neither read nor write compiled analyses
                return runs[args.command](args)
        return runs[args.command](args)
    except DoesNotFit as err:
        if args.debug or _interrupt.came():
            raise
        # Nothing fits whatever the policy: an answer about the model, not a typo (exit 1,
        # as when a search finds nothing; docs/commands/index.md, "Exit codes").
        sys.stderr.write(f"remat-kit: {_flag_of(err, args)}{_one_line(err)}\n")
        return 1
    except RematKitError as err:
        if args.debug or _interrupt.came():
            raise
        sys.stderr.write(f"remat-kit: {_flag_of(err, args)}{_one_line(err)}\n")
        return 2
    except Exception as err:
        if args.debug or _interrupt.came():
            raise
        if "jax" in sys.modules:
            from remat_kit.targets._platform import platform_error

            # JAX_PLATFORMS names a platform jax could not start (wherever it first started).
            refused = platform_error(err)
            if refused is not None:
                sys.stderr.write(f"remat-kit: {_one_line(refused)}\n")
                return 2
        if not _is_build_error(err):
            raise
        # jax or XLA refused the program after the checks passed (a kernel's shape rule, an
        # XLA INTERNAL error): its first line, not a 100-line traceback.
        text = _one_line(err, limit=300)
        if _TILING in str(err):
            text += _TILING_HINT
        sys.stderr.write(f"remat-kit: jax/XLA could not build this step: {text}\n")
        return 2


def _without_cache(args: argparse.Namespace) -> bool:
    """Whether this run goes without the cache: ``--no-cache``, or a cache directory that
    cannot be written (said in one line: what was given, what happens instead). A command
    without ``--no-cache`` compiles nothing and is not asked.

    Raises:
      BadValue: ``REMAT_KIT_NO_CACHE`` is neither on nor off.
    """
    if not hasattr(args, "no_cache"):
        return False
    from remat_kit import cache

    if args.no_cache or not cache.enabled():
        return bool(args.no_cache)
    problem = cache.dir_problem()
    if problem is None:
        return False
    named = [v for v in (cache.ENV_DIR, "XDG_CACHE_HOME") if os.environ.get(v)]
    source = f"from ${named[0]}" if named else "the default"
    sys.stderr.write(
        f"remat-kit: the cache directory {cache.cache_dir()} ({source}) {problem}: this run "
        f"neither reads nor writes the cache (set {cache.ENV_DIR} to a writable directory)\n"
    )
    return True


def _prepare_platform(args: argparse.Namespace) -> None:
    """Checks and sets jax's platform before its backends start (they start in the run).

    Raises:
      TargetError: ``JAX_PLATFORMS`` names a GPU this machine lacks, or ``--target local``
        on a machine with no GPU.
    """
    from remat_kit.targets._platform import (
        check_local_gpu,
        check_platforms,
        configure_for_deviceless,
        configure_if_no_gpu,
    )

    check_platforms()  # a JAX_PLATFORMS that names a GPU the machine lacks, every command
    if getattr(args, "target", None) != "local":
        # Deviceless compiles need jax's CPU platform, chosen before its backends start.
        configure_for_deviceless()
        return
    if "--target" in getattr(args, "given", ()):
        check_local_gpu()  # validate, whose target is the local GPU, says so in its words
    # No GPU here: choose jax's CPU before it probes for a driver (the CUDA plugin's
    # traceback, otherwise, on stderr).
    configure_if_no_gpu()


#: XLA's refusal of a Triton GEMM tiling, and what it means in a deviceless compile.
_TILING = "Couldn't find output tile sizes"
_TILING_HINT = (
    " (a compile without the GPU takes XLA's first Triton tiling untried, where the card's "
    "autotuner would try others or fall back to cuBLAS: a product whose rows, batch x seq, "
    "no power-of-two tile divides fails here, as an odd --seq with --batch 2 or more does; "
    "a --seq that is a multiple of 8 avoids it)"
)


def _is_build_error(err: Exception) -> bool:
    # What jax and XLA raise when they refuse a program the checks let through.
    if isinstance(err, NotImplementedError):
        return True
    if "jax" not in sys.modules:
        return False
    from jax.errors import JaxRuntimeError

    return isinstance(err, JaxRuntimeError)


def _flag_of(err: RematKitError, args: argparse.Namespace) -> str:
    """``"--seq 4097: "`` for an error about the parameter ``--seq`` set, else ``""``.

    Only a flag this command has and the user set (its value is not None) is named.
    """
    param = err.param if isinstance(err, BadValue | BadType) else None
    flag = _param_flags().get(param) if param is not None else None
    if flag is None:
        return ""
    value = getattr(args, flag.lstrip("-").replace("-", "_"), None)
    if value is None or isinstance(value, bool):
        return ""
    return f"{flag} {value}: "


def _param_flags() -> dict[str, str]:
    """:data:`FLAGS` and the parameters the kinds' options set (the first kind that lists a
    flag declares it, as on the parser)."""
    from remat_kit.cli._args import kind_options

    found = {param: o.flag for o in reversed(kind_options()) for param in o.params}
    return {**found, **FLAGS}


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
