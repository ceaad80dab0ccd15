"""``remat-kit validate``: run the step on the local GPU and compare its peak with the prediction.

The step runs for real on the first local GPU (``--target local``, the only one this command
accepts); the prediction is compiled deviceless for the catalogue GPU matching the local
device (or ``--compare-with NAME``). On a machine with no GPU it says so and exits 2.
"""

from __future__ import annotations

import argparse
import os
import warnings

from remat_kit.errors import BadValue, TargetError
from remat_kit.render import console, fitted, validation_table, write_json
from remat_kit.schedules import NO_SCHEDULE

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Runs the step on the local GPU, compiles it for the matching target, prints both.

    Args:
      args: parsed arguments of the ``validate`` parser.

    Returns:
      The exit code: 0 measured (whatever the error), 1 the step ran out of memory or gave
      no measurement.

    Raises:
      BadValue: a flag validate does not take (``--target`` other than local, ``--shard``,
        ``--gpus``), or a bad model option.
      TargetError: no local GPU, or a device with no catalogue target and no
        ``--compare-with``.

    Example:
      ``remat-kit validate --model llama3.2-1b`` parses its flags and calls this.
    """
    _check_flags(args)
    if args.mem_fraction is not None:
        _set_fraction(args.mem_fraction)

    from remat_kit.cli._model import config_from_args, spec_from_args
    from remat_kit.policies import parse_policy
    from remat_kit.sources import resolve
    from remat_kit.targets import target
    from remat_kit.validate import LocalGPU, match_target, validate

    kind, spec = spec_from_args(args)
    model = resolve(spec)
    config = config_from_args(args, kind)
    gpu = LocalGPU()  # fails here, before any compile, on a machine with no GPU
    if args.compare_with:
        compare = target(args.compare_with)
    else:
        try:
            compare = match_target(gpu.device_kind())
        except TargetError as err:
            raise TargetError(f"{err} (--compare-with NAME names it here)") from None
    policy = parse_policy(args.policy)
    built = model.build_step(policy, NO_SCHEDULE, config, compare, sharded=False)
    step = built.step
    meta = {
        "model": spec.name,
        "policy": built.policy.name,
        "batch": config.batch,
        "seq": config.seq,
        "optimizer": config.optimizer,
        "attention": built.attention,
        "precision": dict(step.precision),
        "dropout": built.meta.get("dropout", 0.0),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the figures speak; XLA's notes are in the report
        result = validate(step, compare, steps=args.steps, stats_source=gpu, meta=meta)
    out = console(args.wide)
    out.print(fitted(validation_table([result.to_dict()]), out.width))
    if result.note:
        out.print(f"[yellow]note:[/yellow] {result.note}")
    if args.json:
        write_json(args.json, result.to_dict(), flag="--json")
    return 0 if result.measured_peak_bytes else 1


def _check_flags(args: argparse.Namespace) -> None:
    if args.target != "local":
        raise BadValue(
            f"--target {args.target}: validate runs the step on this machine's GPU; name the "
            "catalogue GPU to compile the prediction for with --compare-with"
        )
    if args.shard or args.gpus != 1 or args.hosts != 1 or getattr(args, "node", None):
        raise BadValue(
            "validate runs the step on one local GPU: drop --shard, --gpus, --hosts and --node"
        )
    from remat_kit.cli._values import check_outputs

    check_outputs(args)  # before any compile, as every command does


def _set_fraction(fraction: float) -> None:
    # The real process's allocator reads the fraction when jax starts its GPU backend, which
    # has not happened yet in this command: set it where jaxlib reads it.
    names = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")
    name = next((n for n in names if os.environ.get(n, "").strip()), names[1])
    os.environ[name] = f"{fraction:g}"
