"""Argument helpers shared by the ``remat-kit`` commands: value types and flag groups.

Every value type raises ``argparse.ArgumentTypeError`` with the bad value and what is valid, so
argparse prints one ``remat-kit: argument --flag: ...`` line and exits 2 before any compile.
"""

from __future__ import annotations

import argparse
import difflib
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from remat_kit.cli._parser import Parser
from remat_kit.errors import BadType, BadValue, OpenShardAxis, UnitlessBudget
from remat_kit.names import VOCABULARY
from remat_kit.policies import Policy, parse_policy
from remat_kit.render.files import check_output
from remat_kit.schedules import Schedule, parse_schedule
from remat_kit.sharding import _EXAMPLES, parse_shard
from remat_kit.targets import Target, target
from remat_kit.train import PRECISIONS

__all__ = [
    "OUTPUT_FLAGS",
    "Parser",
    "add_jobs_arg",
    "add_model_args",
    "add_search_args",
    "add_shard_args",
    "budget_arg",
    "check_outputs",
    "comma_list",
    "flag_items",
    "fraction",
    "host_budget_arg",
    "int_at_least",
    "non_negative_int",
    "policy_arg",
    "positive_int",
    "precision_name",
    "schedule_arg",
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
        help="with a factory: how its projections are tagged: auto (default: hf+gpt2+gemma "
        "names, else module paths; none if the model tags itself) | hf | gpt2 | gemma | paths "
        "(module paths only) | none",
    )
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
    p.add_argument("--gpus", type=positive_int, default=1, help="devices of the target")
    p.add_argument(
        "--mem-fraction",
        type=mem_fraction,
        default=None,
        help="share of each GPU JAX's allocator takes (default: XLA_PYTHON_CLIENT_MEM_FRACTION "
        "from the environment, else JAX's 0.75); every 'fits' is judged against it",
    )
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="compile afresh: neither read nor write the cache of compiled analyses "
        "(~/.cache/remat_kit, or REMAT_KIT_CACHE_DIR)",
    )
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
    name = args.target.strip().lower()
    fraction = getattr(args, "mem_fraction", None) if name not in ("cpu", "local") else None
    t = target(args.target, devices=args.gpus, hosts=args.hosts, mem_fraction=fraction)
    return t if fraction is None else t.with_mem_fraction(fraction, "--mem-fraction")


# --- checks run before any compile --------------------------------------------------------------

#: The output-file flags a command may take; each is checked before any compile.
OUTPUT_FLAGS = ("json", "csv", "plot")


def check_outputs(args: argparse.Namespace) -> None:
    """Checks every output path the command was given (``--json``, ``--csv``, ``--plot``).

    A report takes minutes to compile, so a path that cannot be written (a directory, a
    device, a symlink, a missing or read-only directory) must fail first.

    Args:
      args: parsed arguments.

    Raises:
      BadValue: naming the flag, the path and what is wrong with it.

    Example:
      >>> check_outputs(argparse.Namespace(json=Path("/tmp/r.json")))
    """
    for name in OUTPUT_FLAGS:
        path = getattr(args, name, None)
        if path is not None:
            check_output(path, flag=f"--{name}")


def flag_items(text: str, flag: str, *, example: str, allow_empty: bool = False) -> list[str]:
    """The items of a comma-separated flag value; an empty item is an error, not skipped.

    Args:
      text: the value, e.g. of ``--policies``.
      flag: the flag's name for messages.
      example: a valid value to show.
      allow_empty: accept an empty value (no items at all), e.g. ``plan --policies ''``.

    Returns:
      The stripped items, in order.

    Raises:
      BadValue: the value is empty (unless allowed) or has an empty item (``none,,full``).

    Example:
      >>> flag_items("none, full", "--policies", example="none,full")
      ['none', 'full']
    """
    items = [s.strip() for s in text.split(",")]
    if not any(items):
        if allow_empty:
            return []
        raise BadValue(f"{flag} is empty; give names such as {example}")
    if not all(items):
        raise BadValue(
            f"{flag} {text!r} has an empty item: separate names with single commas, e.g. {example}"
        )
    return items


def policy_arg(spec: str, flag: str) -> Policy:
    """Reads a policy spec given to ``flag``; a tag name no model uses is an error here.

    The library only warns about an unknown tag (users tag their own tensors); a preset
    model tags only names of ``remat_kit.names.VOCABULARY``, so on the command line a name
    outside it is a typo that would silently measure ``full``.

    Args:
      spec: e.g. ``"names:save=query_proj+mlpwo"``.
      flag: the flag's name for messages.

    Returns:
      The policy.

    Raises:
      BadValue: an unreadable spec, an unknown policy or an unknown tag (with close matches).

    Example:
      >>> policy_arg("names:save=context", "--policy").params["save"]
      ('context',)
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unknown tags are reported below, naming the flag
        try:
            pol = parse_policy(spec)
        except (BadValue, BadType) as err:
            raise BadValue(f"{flag} {spec!r}: {err}") from None
    # Paths and globs name the tags remat_kit.tagging gives models we did not write: they
    # are checked against the traced program instead.
    bad = [t for t in _tag_names(pol) if t not in VOCABULARY and not any(c in t for c in "/*?[")]
    if bad:
        close = {t: difflib.get_close_matches(t, VOCABULARY, n=1) for t in bad}
        detail = ", ".join(
            f"{t!r} (did you mean {c[0]!r}?)" if c else repr(t) for t, c in close.items()
        )
        raise BadValue(
            f"{flag} {spec!r}: {detail} is not a tag the models use; tags: {', '.join(VOCABULARY)}"
        )
    return pol


def _tag_names(pol: Policy) -> list[str]:
    # The tag names a spec gave (save=, offload=, names=), through either's two policies.
    out: list[str] = []
    for value in pol.params.values():
        if isinstance(value, Policy):
            out += _tag_names(value)
        elif isinstance(value, tuple):
            out += [v for v in value if isinstance(v, str)]
    return out


def schedule_arg(spec: str, flag: str, n_layers: int, policy: Any = "full") -> Schedule:
    """Reads a schedule given to ``flag`` and checks it against the model's layer count.

    Args:
      spec: e.g. ``"every:2"``.
      flag: the flag's name for messages.
      n_layers: the model's layers.
      policy: the per-layer policy the schedule wraps.

    Returns:
      The schedule.

    Raises:
      BadValue: an unreadable spec, or one that does not fit ``n_layers`` (``every:64`` on 4).

    Example:
      >>> schedule_arg("every:2", "--schedule", 4).n
      2
    """
    try:
        sch = parse_schedule(spec)
        sch.runs(n_layers, policy)  # pure: the segments the model would be cut into
    except (BadValue, BadType) as err:
        raise BadValue(f"{flag} {spec!r}: {err}") from None
    return sch


def budget_arg(text: str, device_bytes: int | None) -> int:
    """Reads ``--budget`` (``52GiB``, ``40GB``, ``0.8``, ``80%``) against the device's memory.

    Args:
      text: the value.
      device_bytes: the device's memory (for fractions; a budget may not exceed it).

    Returns:
      The budget in bytes.

    Raises:
      BadValue: unreadable, not positive or larger than the device (``param="budget"``:
        the CLI's error boundary names ``--budget``).

    Example:
      >>> budget_arg("1GiB", None)
      1073741824
    """
    from remat_kit.search import parse_budget

    if text.strip().startswith("-"):
        raise BadValue(
            f"--budget {text!r} must be positive: give e.g. 52GiB, 40GB or 0.8 (of the device)"
        )
    return parse_budget(text, device_bytes)


def host_budget_arg(text: str) -> int:
    """Reads ``--host-budget``: pinned host memory a plan may offload to (``64GiB``; ``0``: none).

    Args:
      text: the value: bytes with a unit, or ``0``.

    Returns:
      The host budget in bytes.

    Raises:
      BadValue: unreadable, negative, or a fraction (the host has no device size to scale).

    Example:
      >>> host_budget_arg("64GiB"), host_budget_arg("0")
      (68719476736, 0)
    """
    from remat_kit.search import parse_budget

    if text.strip() in ("0", "0B", "0b"):
        return 0
    if text.strip().startswith("-"):
        raise BadValue(f"--host-budget {text!r} must be >= 0: give e.g. 64GiB, or 0 for no offload")
    try:
        return parse_budget(text, None)
    except UnitlessBudget:
        raise BadValue(
            f"--host-budget {text!r}: give bytes with a unit (e.g. 64GiB), or 0 for no offload"
        ) from None
    except BadValue as err:  # its param is "budget": name this flag here, not --budget
        raise BadValue(f"--host-budget: {err}") from None
