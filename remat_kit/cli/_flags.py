"""Each ``remat-kit`` command's own flags, declared once, in their help groups.

``remat-kit CMD --help`` builds CMD's parser from here and imports no command module, so it
starts no jax; the command module (``remat_kit.cli._report`` ...) is imported only to run.
The flags several commands share are declared in :mod:`remat_kit.cli._args`. A help text
that shows a library constant (the sequence search's step and cap, the rankings) reads a
copy of it here, checked against the library by tests/test_help.py.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from remat_kit.cli._args import (
    FRONT_POLICIES,
    add_model_args,
    add_output_arg,
    add_policies_arg,
    add_policy_arg,
    add_schedule_arg,
    add_search_args,
    group,
    int_at_least,
    name_arg,
    positive_int,
)
from remat_kit.cli._placement import add_jobs_arg

__all__ = ["DECLARES", "declare"]

#: Copies of library constants the help shows (see the module's docstring).
SEQ_STEP = 1024  # remat_kit.search.DEFAULT_GRANULARITY
SEQ_CAP = 1 << 20  # remat_kit.search.DEFAULT_SEQ_CAP
RANKINGS = ("cost", "speed", "name")  # remat_kit.search.RANKINGS

#: The default of --policies, worded so that the help wraps between names.
_FRONT = f"(default: {', '.join(FRONT_POLICIES)})"

_SCHEDULE_HELP = "layer schedule: none | every:K | sqrt | nested:M | layers:0-7=full,..."


def _report(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_policy_arg(p, "full", "policy name or spec (remat-kit policies)")
    add_schedule_arg(p, _SCHEDULE_HELP)
    out = group(p, "output")
    out.add_argument("--no-residuals", action="store_true", help="skip the residual table")
    out.add_argument(
        "--measured-breakdown",
        action="store_true",
        help="read weights, gradients, optimizer state, saved activations and temporaries at "
        "the peak from XLA's buffer assignment (a second compile; unsharded) instead of the "
        "estimate from shapes",
    )


def _compare(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_policies_arg(p, ",".join(FRONT_POLICIES), f"comma-separated names or specs {_FRONT}")
    add_schedule_arg(
        p, "comma-free list separated by ';' or spaces, e.g. 'none;every:2;sqrt'", several=True
    )
    add_output_arg(p, "--csv", "write the rows as CSV")
    add_jobs_arg(p)


def _objective(p: argparse.ArgumentParser, what: str, choices: dict[str, str]) -> None:
    # fit and plan aim at different things under one flag name: each lists its own.
    group(p, "search").add_argument(
        "--objective",
        type=name_arg,
        choices=tuple(choices),
        default=next(iter(choices)),
        help=f"{what}: " + "; ".join(f"{name}, {words}" for name, words in choices.items()),
    )


def _fit(p: argparse.ArgumentParser) -> None:
    add_model_args(
        p,
        batch_help="with --over seq: sequences per step (default: 1, or the --accum x "
        "data-parallel GPUs); refused with --over batch, which finds the batch (report "
        "measures one)",
    )
    add_policy_arg(p, None, "one policy (name or spec), instead of --policies")
    add_policies_arg(
        p,
        "none,full,minimal,plan",
        "comma-separated policies; 'plan' is the planner at the largest batch (the "
        "longest sequence with --over seq)",
    )
    add_schedule_arg(p, "layer schedule for every policy")
    search = group(p, "search")
    search.add_argument(
        "--over",
        type=name_arg,
        choices=("batch", "seq"),
        default="batch",
        help="what the search grows: batch, the largest batch at --seq; seq, the longest "
        "sequence at --batch (up to --max-seq, else the model's learned positions, else "
        f"{SEQ_CAP} tokens)",
    )
    search.add_argument(
        "--seq-step",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"with --over seq: tokens between the sequences searched (default "
        f"{SEQ_STEP}); a multiple of what the mesh splits the sequence into",
    )
    _objective(
        p,
        "what the search finds per policy",
        {
            "batch": "the largest batch per policy",
            "throughput": "the micro-batch that trains fastest per policy (predicted "
            "tokens/s), the winner against none at its largest batch",
        },
    )
    search.add_argument(
        "--global-batch",
        type=int,
        default=None,
        metavar="N",
        help="with --objective throughput: sequences per optimizer step; the search picks the "
        "micro-batch x accumulation that reaches it fastest",
    )
    add_search_args(p)
    add_jobs_arg(
        p,
        " (the two sides of a boundary, where one compile takes longer than a worker takes "
        "to start; with --objective throughput and --cluster, also the policies' searches)",
    )


def _plan(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_policies_arg(
        p,
        ",".join(FRONT_POLICIES),
        f"catalogue policies compiled beside the plan ('' for none) {_FRONT}",
    )
    search = group(p, "search")
    search.add_argument(
        "--budget", default=None, help="52GiB, 40GB or 0.8 (of the device); default: device"
    )
    search.add_argument(
        "--host-budget",
        default=None,
        help="pinned host memory the plan may offload to, e.g. 64GiB (0: no offload); "
        "default: no limit",
    )
    search.add_argument(
        "--sweep",
        action="store_true",
        help="the whole curve: also plan for the catalogue's peaks and compile the segment "
        "schedules (more compiles); the table, the JSON and the plot show the same front",
    )
    _objective(
        p,
        "what the plan minimises and the front's overhead axis",
        {
            "time": "the predicted step time (each recomputed product, attention and "
            "elementwise op at the GPU's rates; compiled plans from their kernels)",
            "flops": "extra FLOPs as if all ran at peak",
        },
    )
    add_search_args(p)
    add_jobs_arg(p, " (the front's catalogue and schedule points)")
    add_output_arg(p, "--plot", "write the Pareto front as PNG")


def _advise(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    search = group(p, "search")
    search.add_argument(
        "--targets", default=None, help="comma-separated targets (default: all GPUs)"
    )
    search.add_argument(
        "--scale-out",
        action="store_true",
        help="where one GPU cannot fit, find how many GPUs of that kind fit with fsdp + full",
    )
    search.add_argument(
        "--price",
        action="append",
        default=[],
        metavar="GPU=USD",
        help="your price of one GPU-hour, e.g. h100=2.10 (repeat for more GPUs); wins over "
        "--price-file and the shipped table",
    )
    search.add_argument(
        "--price-file",
        default=None,
        metavar="FILE",
        help='JSON prices: {"h100": 2.1, "a100-80gb": {"usd_per_gpu_hour": 1.3, ...}}',
    )
    search.add_argument(
        "--rank",
        type=name_arg,
        choices=RANKINGS,
        default="cost",
        help="order of the GPUs: cost (dollars per million tokens, cheapest first), speed "
        "(predicted tokens/s), name",
    )
    add_search_args(p)
    add_jobs_arg(p)


def _inspect(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_policy_arg(p, "full", "policy name or spec (remat-kit policies)")
    add_schedule_arg(p, _SCHEDULE_HELP)
    group(p, "remat").add_argument(
        "--diff",
        nargs=2,
        metavar=("P1", "P2"),
        default=None,
        help="what policy P2 keeps at its peak that P1 does not",
    )
    group(p, "output").add_argument("--top", type=int, default=10, help="buffers shown at the peak")
    add_output_arg(p, "--plot", "write the memory timeline PNG")
    add_output_arg(
        p,
        "--trace",
        "write FILE.json, a Chrome trace (Perfetto, chrome://tracing): each kernel on the "
        "predicted timeline beside live bytes by category",
    )
    group(p, "output").add_argument(
        "--xprof",
        type=Path,
        default=None,
        metavar="DIR",
        help="write a new profile directory that `xprof --logdir DIR` opens in its Memory "
        "Viewer on the compiled program (no GPU needed)",
    )


def _validate(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    # The step runs here: the CLI must not switch jax to its CPU platform (it does so for
    # every target but "local"), so the target is the local GPU.
    p.set_defaults(target="local")
    add_policy_arg(p, "full", "policy name or spec (remat-kit policies)")
    group(p, "target and mesh").add_argument(
        "--compare-with",
        default=None,
        metavar="TARGET",
        help="catalogue GPU to compile the prediction for (default: the local GPU's kind)",
    )
    group(p, "training").add_argument(
        "--steps", type=int_at_least(1, "at least 1"), default=3, help="train steps to run"
    )


def _nothing(p: argparse.ArgumentParser) -> None:
    # The listings take no flag of their own.
    del p


#: Each command's declaration: ``declare(parser)`` adds its flags.
DECLARES: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "report": _report,
    "compare": _compare,
    "fit": _fit,
    "plan": _plan,
    "advise": _advise,
    "inspect": _inspect,
    "validate": _validate,
    "targets": _nothing,
    "policies": _nothing,
    "models": _nothing,
}


def declare(name: str, p: argparse.ArgumentParser) -> None:
    """Adds the flags of the command ``name`` to its parser ``p``.

    Args:
      name: a command of ``remat_kit.cli.COMMANDS``.
      p: its parser.

    Example:
      >>> from remat_kit.cli._parser import Parser
      >>> p = Parser(); declare("report", p)
      >>> p.parse_args(["--model", "tiny-llama"]).schedule
      'none'
    """
    DECLARES[name](p)
