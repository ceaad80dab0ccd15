"""Argument declarations shared by the ``remat-kit`` commands: value types and flag groups.

What the parsed strings become (a target, policies, schedules, budgets, output paths) is
:mod:`remat_kit.cli._values`, the CLI's edge to the typed library.

Every value type raises ``argparse.ArgumentTypeError`` with the bad value and what is valid, so
argparse prints one ``remat-kit: argument --flag: ...`` line and exits 2 before any compile.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable
from pathlib import Path

from remat_kit.cli._parser import Parser
from remat_kit.errors import BadValue, OpenShardAxis
from remat_kit.sharding import _EXAMPLES, parse_shard
from remat_kit.sources import DEPTH_MODES
from remat_kit.train import PRECISIONS

__all__ = [
    "Parser",
    "add_jobs_arg",
    "add_model_args",
    "add_search_args",
    "add_shard_args",
    "comma_list",
    "fraction",
    "int_at_least",
    "non_negative_int",
    "positive_int",
    "precision_name",
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


def add_model_args(p: argparse.ArgumentParser, batch_help: str = "sequences per step") -> None:
    """Adds what every measuring command reads: the model, target, step options and ``--json``.

    Args:
      p: an argparse parser (or subparser).
      batch_help: what ``--batch`` means to the command.

    Example:
      >>> p = Parser(); add_model_args(p)
      >>> p.parse_args(["--model", "tiny-llama", "--batch", "2"]).batch
      2
    """
    _add_source_args(p)
    _add_training_args(p, batch_help)
    _add_measuring_args(p)
    _add_shape_args(p)
    p.add_argument("--json", type=Path, default=None, help="write the result as JSON")


class _Words(argparse.Action):
    """Keeps the words of a flag that takes several (``--maxtext a=1 b=2``) as one string."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, " ".join(values))


def _add_source_args(p: argparse.ArgumentParser) -> None:
    # The model: a preset, a factory or a Hugging Face config, or a step of the user's; how
    # a factory's model is rematerialized and tagged.
    p.add_argument(
        "--model",
        default=None,
        help="preset name (remat-kit models), or a factory path/file.py:NAME or "
        "package.module:NAME called as NAME(policy) -> Flax module (README: Your own model)",
    )
    p.add_argument(
        "--hf-config",
        default=None,
        metavar="CONFIG_JSON",
        help="a Hugging Face config.json (Llama, Mistral, Qwen2, Gemma) measured with our decoder",
    )
    p.add_argument(
        "--step",
        default=None,
        metavar="FILE.py:NAME",
        help="a train step of your own instead of ours: NAME(policy, config) -> (fn, args[, "
        "donate_argnums]) or rk.sources.OwnStep (README: Your own model)",
    )
    p.add_argument(
        "--maxtext",
        default=None,
        nargs="+",
        action=_Words,
        metavar="WORD",
        help="a MaxText config as its own command line takes it: an optional YAML path, then "
        "key=value words, e.g. --maxtext model_name=llama2-7b ici_fsdp_parallelism=8 "
        "(pip install 'remat-kit[maxtext]')",
    )
    p.add_argument(
        "--block",
        default=None,
        metavar="MODULE:CLASS",
        help="with a factory: the block class to rematerialize by patching it (models with no "
        "remat hook), e.g. transformers.models.llama.modeling_flax_llama:FlaxLlamaDecoderLayer",
    )
    p.add_argument(
        "--tags",
        default=None,
        metavar="RULES",
        help="with a factory: how its tensors are named: auto (default: a model that tags "
        "itself keeps its names, with ours beside EasyDeL's and MaxText's; others get "
        "hf+gpt2+gemma names, else module paths) | hf | gpt2 | gemma | easydel | maxtext | "
        "paths (module paths only) | none (the model's own tags only); join sets with +",
    )


def _add_training_args(p: argparse.ArgumentParser, batch_help: str) -> None:
    # The target and the train config: batch, sequence, optimizer, LoRA, accumulation,
    # precision, dropout, the attention kernel and the layer loop.
    p.add_argument("--target", default="h100-80gb", help="GPU target (remat-kit targets)")
    p.add_argument("--batch", type=positive_int, default=4, help=batch_help)
    p.add_argument("--seq", type=positive_int, default=2048, help="tokens per sequence")
    p.add_argument("--optimizer", default="adamw", help="adamw, adam, sgd, sgd_momentum, ...")
    p.add_argument("--lora", type=non_negative_int, default=0, help="LoRA rank (0: off)")
    p.add_argument("--accum", type=positive_int, default=1, help="gradient accumulation")
    p.add_argument(
        "--precision",
        type=precision_name,
        default=None,
        help="mixed (default: f32 master weights, gradients and optimizer state, bf16 compute; "
        "LoRA keeps bf16 base weights) | bf16 (everything bf16) | bf16-f32-moments (bf16 "
        "weights, f32 optimizer state) | f32",
    )
    p.add_argument(
        "--param-dtype",
        default=None,
        help="weights' dtype, the older form of --precision: f32 = mixed, bf16 = bf16",
    )
    p.add_argument("--dtype", default=None, help="compute dtype (bf16, f32), over --precision's")
    p.add_argument(
        "--dropout",
        type=fraction,
        default=None,
        help="dropout rate (default: the preset's, 0.1 for GPT-2/BERT); applied in the step",
    )
    p.add_argument(
        "--attention", default="auto", help="xla | cudnn | auto (cudnn on NVIDIA targets)"
    )
    p.add_argument("--no-scan", action="store_true", help="unroll the layers instead of scan")


def _add_measuring_args(p: argparse.ArgumentParser) -> None:
    # How the target's devices are counted and shared, and how the step is compiled.
    p.add_argument("--gpus", type=positive_int, default=1, help="devices of the target")
    p.add_argument(
        "--mem-fraction",
        type=mem_fraction,
        default=None,
        help="share of each GPU JAX's allocator takes (default: XLA_PYTHON_CLIENT_MEM_FRACTION "
        "from the environment, else JAX's 0.75); every 'fits' is judged against it",
    )
    p.add_argument(
        "--depth",
        choices=DEPTH_MODES,
        default="auto",
        help="unrolled layers (--no-scan, a factory taking layers=): auto answers from "
        "compiles of 2 and 3 layers where the step fits with 2%% to spare, and compiles the "
        "whole model for any other verdict, for copies that do not line up and for the final "
        "answers of fit and plan; estimate gives the copies' figures whatever the verdict; "
        "full compiles the whole model; check does both and reports the error (README: "
        "Unrolled models)",
    )
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="compile afresh: neither read nor write the cache of compiled analyses "
        "(~/.cache/remat_kit, or REMAT_KIT_CACHE_DIR)",
    )


def _add_shape_args(p: argparse.ArgumentParser) -> None:
    # The mesh plan, and the overrides of a preset's sizes (a factory takes --layers).
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
    for flag, help_text in (
        ("--experts", "routed experts per MoE layer"),
        ("--top-k", "experts each token is routed to"),
        ("--moe-ff", "each expert's MLP width"),
    ):
        p.add_argument(flag, type=positive_int, default=None, help=f"override: {help_text}")
    p.add_argument(
        "--moe-impl",
        choices=("ragged", "capacity"),
        default=None,
        help="how an MoE model runs its experts: ragged (grouped GEMMs, dropless; the default "
        "on one GPU) or capacity (einsum dispatch with a capacity factor; the default under "
        "--shard ep:N, whose all-to-all XLA partitions only this way)",
    )
    p.add_argument(
        "--capacity-factor",
        type=float,
        default=None,
        help="expert slots per token share under --moe-impl capacity (default 1.25)",
    )


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
        help=f"sharding over --gpus devices: {_EXAMPLES} (dp/fsdp split the batch, cp the "
        "sequence, tp the heads and MLP, ep the experts of an MoE model and the batch); "
        "figures are per GPU",
    )
    parser.add_argument(
        "--hosts", type=positive_int, default=1, help="hosts the --gpus devices are spread over"
    )


def _shard_arg(text: str) -> str:
    try:
        parse_shard(text)
    except OpenShardAxis:
        pass  # an open size is filled from --gpus, which argparse has not read yet
    except BadValue as err:
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


def add_jobs_arg(p: argparse.ArgumentParser) -> None:
    """Adds ``--jobs N``: independent compiles in up to N worker processes.

    Args:
      p: an argparse parser (or subparser).

    Example:
      >>> p = Parser(); add_jobs_arg(p)
      >>> p.parse_args(["--jobs", "2"]).jobs
      2
    """
    from remat_kit._workers import default_jobs

    p.add_argument(
        "--jobs",
        type=positive_int,
        default=default_jobs(),
        help="compile independent programs in up to N worker processes (default: "
        f"{default_jobs()}, min(2, cores); 1: all in this process)",
    )


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
        default=0.0,
        help="extra share of the usable memory kept free (default 0: the allocator's limit, "
        "see --mem-fraction, is the limit)",
    )
    p.add_argument("--no-offload", action="store_true", help="plans never offload to host")
    p.add_argument(
        "--hide",
        type=fraction,
        default=0.5,
        help="share of step compute time host transfers may take and count as hidden",
    )


def precision_name(text: str) -> str:
    """An argparse ``type=`` for ``--precision``: a regime of ``rk.train.PRECISIONS``.

    Example:
      >>> precision_name("mixed")
      'mixed'
    """
    if text not in PRECISIONS:
        close = difflib.get_close_matches(text, PRECISIONS, n=2)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise argparse.ArgumentTypeError(
            f"unknown precision {text!r}.{hint} Known: {', '.join(PRECISIONS)}"
        )
    return text


def mem_fraction(text: str) -> float:
    """An argparse ``type=`` for ``--mem-fraction``: a number in (0, 1].

    Example:
      >>> mem_fraction("0.9")
      0.9
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; e.g. 0.9") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value:g} must be in (0, 1]; JAX's default is 0.75")
    return value


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


# --- checks run before any compile --------------------------------------------------------------
