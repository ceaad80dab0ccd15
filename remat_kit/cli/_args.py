"""Argument helpers shared by the ``remat-kit`` commands: value types and flag groups.

Every value type raises ``argparse.ArgumentTypeError`` with the bad value and what is valid, so
argparse prints one ``remat-kit: argument --flag: ...`` line and exits 2 before any compile.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from remat_kit.errors import OpenShardAxis
from remat_kit.sharding import _EXAMPLES, parse_shard
from remat_kit.targets import Target, target

__all__ = [
    "Parser",
    "add_model_args",
    "add_search_args",
    "add_shard_args",
    "comma_list",
    "fraction",
    "int_at_least",
    "non_negative_int",
    "positive_int",
    "target_from_args",
]


def int_at_least(minimum: int, what: str) -> Callable[[str], int]:
    """An argparse ``type=`` that accepts ints >= ``minimum``.

    Args:
      minimum: the smallest value accepted.
      what: how the bound reads in the message, e.g. ``"positive"``.

    Returns:
      The type function.

    Example:
      >>> int_at_least(1, "positive")("3")
      3
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be {what}")
        return value

    return parse


positive_int = int_at_least(1, "positive")
non_negative_int = int_at_least(0, ">= 0")


class Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line, ``remat-kit: ...``, exit code 2."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        sys.stderr.write(f"remat-kit: {message}\n")
        raise SystemExit(2)


def add_model_args(p: argparse.ArgumentParser) -> None:
    """Adds what every measuring command reads: the model, target, step options and ``--json``.

    Args:
      p: an argparse parser (or subparser).

    Example:
      >>> p = Parser(); add_model_args(p)
      >>> p.parse_args(["--model", "tiny-llama", "--batch", "2"]).batch
      2
    """
    p.add_argument("--model", required=True, help="preset name (remat-kit models)")
    p.add_argument("--target", default="h100-80gb", help="GPU target (remat-kit targets)")
    p.add_argument("--batch", type=positive_int, default=4, help="sequences per step")
    p.add_argument("--seq", type=positive_int, default=2048, help="tokens per sequence")
    p.add_argument("--optimizer", default="adamw", help="adamw, adam, sgd, sgd_momentum, ...")
    p.add_argument("--lora", type=non_negative_int, default=0, help="LoRA rank (0: off)")
    p.add_argument("--accum", type=positive_int, default=1, help="gradient accumulation")
    p.add_argument("--param-dtype", default=None, help="bf16 or f32 (master weights)")
    p.add_argument("--dtype", default=None, help="compute dtype (bf16, f32)")
    p.add_argument(
        "--attention", default="auto", help="xla | cudnn | auto (cudnn on NVIDIA targets)"
    )
    p.add_argument("--no-scan", action="store_true", help="unroll the layers instead of scan")
    p.add_argument("--gpus", type=positive_int, default=1, help="devices of the target")
    add_shard_args(p)  # --shard dp:8 | fsdp:8 | fsdp:4,tp:2 and --hosts
    for flag, help_text in (
        ("--layers", "number of layers"),
        ("--width", "model width d_model"),
        ("--heads", "attention heads"),
        ("--kv-heads", "key/value heads"),
        ("--ff", "MLP width"),
        ("--vocab", "vocabulary size"),
        ("--max-seq", "learned positions (GPT-2 family)"),
    ):
        p.add_argument(flag, type=positive_int, default=None, help=f"override: {help_text}")
    p.add_argument("--json", type=Path, default=None, help="write the result as JSON")


def add_shard_args(parser: argparse.ArgumentParser) -> None:
    """Adds ``--shard`` and ``--hosts`` to a CLI parser (``--gpus`` is the device count).

    Args:
      parser: an argparse parser (or subparser).

    Example:
      >>> p = argparse.ArgumentParser(); add_shard_args(p)
      >>> p.parse_args(["--shard", "fsdp:4,tp:2", "--hosts", "2"]).shard
      'fsdp:4,tp:2'
    """
    parser.add_argument(
        "--shard",
        type=_shard_arg,
        default=None,
        help=f"sharding over --gpus devices: {_EXAMPLES}; figures are per GPU",
    )
    parser.add_argument(
        "--hosts", type=positive_int, default=1, help="hosts the --gpus devices are spread over"
    )


def _shard_arg(text: str) -> str:
    try:
        parse_shard(text)
    except OpenShardAxis:
        pass  # an open size is filled from --gpus, which argparse has not read yet
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def fraction(text: str) -> float:
    """An argparse ``type=`` that accepts a number in [0, 1).

    Args:
      text: the command-line value.

    Returns:
      The number.

    Raises:
      argparse.ArgumentTypeError: not a number, or outside [0, 1).

    Example:
      >>> fraction("0.05")
      0.05
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{value} must be in [0, 1)")
    return value


def add_search_args(p: argparse.ArgumentParser) -> None:
    """Adds the planner's options: ``--headroom``, ``--no-offload`` and ``--hide``.

    Args:
      p: an argparse parser (or subparser).

    Example:
      >>> p = Parser(); add_search_args(p)
      >>> p.parse_args(["--headroom", "0.1"]).headroom
      0.1
    """
    p.add_argument(
        "--headroom",
        type=fraction,
        default=0.03,
        help="fraction of device memory kept free (CUDA context, fragmentation)",
    )
    p.add_argument("--no-offload", action="store_true", help="plans never offload to host")
    p.add_argument(
        "--hide",
        type=fraction,
        default=0.5,
        help="share of step compute time host transfers may take and count as hidden",
    )


def comma_list(text: str) -> list[str]:
    """The non-empty items of a comma-separated flag value, stripped.

    Args:
      text: e.g. the value of ``--policies``.

    Returns:
      The items, in order.

    Example:
      >>> comma_list("none, full,,minimal")
      ['none', 'full', 'minimal']
    """
    return [s.strip() for s in text.split(",") if s.strip()]


def target_from_args(args: argparse.Namespace) -> Target:
    """The target named by ``--target``, with ``--gpus`` devices over ``--hosts`` hosts.

    Args:
      args: parsed arguments of a parser given :func:`add_model_args`.

    Returns:
      The ``rk.Target``.

    Raises:
      UnknownName: the target is not in the catalogue.

    Example:
      >>> target_from_args(argparse.Namespace(target="h100", gpus=8, hosts=1)).devices
      8
    """
    return target(args.target, devices=args.gpus, hosts=args.hosts)
