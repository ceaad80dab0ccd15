"""Argument declarations shared by the ``remat-kit`` commands: value types and flag groups.

Every flag two commands share is declared here, once, in its help group (:data:`GROUPS`);
a command's own flags are declared in :mod:`remat_kit.cli._flags`. The flags of the model and
its training are the options the kinds of source bring (``rk.sources.kinds()``,
:func:`kind_options`), declared here from them: no flag of a kind is written in the CLI.
What the parsed strings become (a target, policies, schedules, budgets, output paths) is
:mod:`remat_kit.cli._values`, the CLI's edge to the typed library.

Every value type raises ``argparse.ArgumentTypeError`` with the bad value and what is valid, so
argparse prints one ``remat-kit: argument --flag: ...`` line and exits 2 before any compile.

This module starts no jax (``remat-kit CMD --help`` imports it and nothing heavier): a value
type that needs the library imports it when it is called, and the few library constants a
help text shows are copied here, each checked against the library by tests/test_help.py.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from remat_kit.cli._parser import Parser, once
from remat_kit.errors import BadValue, OpenShardAxis
from remat_kit.sources import SHARD, Option, SourceKind, kinds
from remat_kit.sources._kinds import SHARD_EXAMPLES

__all__ = [
    "DEPTH_MODES",
    "FRONT_POLICIES",
    "GROUPS",
    "PRECISION_NAMES",
    "SHARD_EXAMPLES",
    "Parser",
    "add_common_args",
    "add_model_args",
    "add_output_arg",
    "add_policies_arg",
    "add_policy_arg",
    "add_schedule_arg",
    "add_search_args",
    "add_shard_args",
    "comma_list",
    "fraction",
    "group",
    "int_at_least",
    "kind_options",
    "name_arg",
    "names_options",
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


#: The help groups, in the order ``--help`` shows them (a group no flag of the command
#: falls in is not shown).
GROUPS = ("model", "training", "remat", "target and mesh", "search", "compile", "output")

#: Copies of library constants the help shows, so that ``--help`` starts no jax; each is
#: checked against the library's own by tests/test_help.py.
DEPTH_MODES = ("auto", "full", "check", "estimate")  # remat_kit.sources.DEPTH_MODES
PRECISION_NAMES = ("mixed", "bf16", "bf16-f32-moments", "f32")  # remat_kit.train.PRECISIONS
FRONT_POLICIES = (  # remat_kit.search.FRONT_POLICIES: compare's and plan's default policies
    "none",
    "full",
    "block",
    "dots",
    "dots_no_batch",
    "minimal",
    "qkv_proj",
    "context",
    "megatron",
    "offload_dots_no_batch",
    "minimal_offloaded",
)


def group(p: argparse.ArgumentParser, title: str) -> argparse._ArgumentGroup:
    """The help group ``title`` of ``p`` (one of :data:`GROUPS`), made in :data:`GROUPS`'
    order the first time a flag of ``p`` asks for a group.

    Args:
      p: an argparse parser (or subparser).
      title: the group's title.

    Returns:
      The argument group; ``add_argument`` on it adds the flag to ``p``.

    Example:
      >>> p = Parser(); group(p, "output").title
      'output'
    """
    if title not in GROUPS:
        raise ValueError(f"unknown help group {title!r}; groups: {', '.join(GROUPS)}")
    made = {g.title: g for g in p._action_groups}
    if not all(t in made for t in GROUPS):
        for t in GROUPS:  # empty groups are left out of the help
            if t not in made:
                made[t] = p.add_argument_group(t)
    return made[title]


def add_model_args(p: argparse.ArgumentParser, batch_help: str = "sequences per step") -> None:
    """Adds what every measuring command reads: the model, the training, the target and mesh,
    how the step is compiled and ``--json``, each in its help group.

    Args:
      p: an argparse parser (or subparser).
      batch_help: what ``--batch`` means to the command.

    Example:
      >>> p = Parser(); add_model_args(p)
      >>> p.parse_args(["--model", "tiny-llama", "--batch", "2"]).batch
      2
    """
    options = kind_options()
    _add_options(p, "model", options)  # the model's name first, then what shapes it
    _add_training_args(group(p, "training"), batch_help)
    _add_options(p, "training", options)
    _add_target_args(group(p, "target and mesh"))
    _add_options(p, "target and mesh", options)
    _add_compile_args(group(p, "compile"))
    for title in GROUPS[GROUPS.index("compile") :]:
        _add_options(p, title, options)  # a plugin's flag in a later group
    add_output_arg(p, "--json", "write the result as JSON")


def names_options(every: Sequence[SourceKind] | None = None) -> list[Option]:
    """The options that name the model (each kind's option of its ``names_by`` field), one per
    flag: those of kinds whose step we build first (``--model``, ``--hf-config``), then those
    of kinds that bring a step of their own (``--step``, a plugin's config of its own).

    Args:
      every: the kinds (default ``rk.sources.kinds()``, in its order).

    Example:
      >>> [o.flag for o in names_options()][:2]
      ['--model', '--hf-config']
    """
    every = list(kinds().values()) if every is None else list(every)
    ordered = sorted(every, key=lambda k: not k.trains)  # stable: kinds() order within
    found: dict[str, Option] = {}
    for k in ordered:
        for o in k.options:
            if o.field == k.names_by and not o.train:
                found.setdefault(o.flag, o)
    return list(found.values())


def kind_options(every: Sequence[SourceKind] | None = None) -> list[Option]:
    """Every option the kinds bring, one per flag: the options that name the model
    (:func:`names_options`), then the others in an order that keeps each kind's own (as
    Python orders base classes; where kinds disagree, the earlier kind's order). A flag
    several kinds take is declared by the first kind of ``every`` that lists it.

    Args:
      every: the kinds (default ``rk.sources.kinds()``, in its order).

    Example:
      >>> [o.flag for o in kind_options()][4:8]
      ['--block', '--tags', '--optimizer', '--lora']
    """
    every = list(kinds().values()) if every is None else list(every)
    names = names_options(every)
    first: dict[str, Option] = {}
    for k in every:
        for o in k.options:
            first.setdefault(o.flag, o)
    named = {o.flag for o in names}
    lines = [[o.flag for o in k.options if o.flag not in named] for k in every]
    return names + [first[flag] for flag in _merged(lines)]


def _merged(lines: list[list[str]]) -> list[str]:
    # C3: the head of the first line that no other line has further on, again and again; a
    # head every line blocks (kinds that disagree) is taken from the first line.
    lines = [list(dict.fromkeys(line)) for line in lines if line]
    out: list[str] = []
    while lines:
        tails = [set(line[1:]) for line in lines]
        head = next((ln[0] for ln in lines if not any(ln[0] in t for t in tails)), lines[0][0])
        out.append(head)
        lines = [rest for rest in ([f for f in ln if f != head] for ln in lines) if rest]
    return out


def _add_options(p: argparse.ArgumentParser, title: str, options: Sequence[Option]) -> None:
    # The kinds' options of one help group, each declared once (one a CLI function declared
    # already, --shard in add_shard_args, is not declared again).
    for option in options:
        if option.group == title and option.flag not in p._option_string_actions:
            _add_option(group(p, title), option)


def _add_option(p: argparse._ActionsContainer, option: Option) -> None:
    """Declares one kind's option: its flag, its help, and how its text is read."""
    # add_argument's keywords: each of its own type (a default is the option's any value).
    kwargs: dict[str, Any] = {"help": option.help, "default": option.default}
    if option.metavar is not None:
        kwargs["metavar"] = option.metavar
    if option.choices is not None:
        kwargs["choices"] = option.choices
    if option.type == "switch":
        kwargs["action"] = "store_true"
    elif option.type == "words":
        kwargs.update(nargs="+", action=_Words)
    elif option.type != "text":
        kwargs["type"] = _TYPES[option.type] if isinstance(option.type, str) else option.type
    p.add_argument(option.flag, **kwargs)


class _Words(argparse.Action):
    """Keeps the words of a flag that takes several (``a=1 b=2``) as one string."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        once(parser, namespace, self, values, option_string)  # a second one would replace it
        setattr(namespace, self.dest, " ".join(values))


def _add_training_args(p: argparse._ArgumentGroup, batch_help: str) -> None:
    # The train config: batch and sequence.
    p.add_argument("--batch", type=positive_int, default=4, help=batch_help)
    p.add_argument("--seq", type=positive_int, default=2048, help="tokens per sequence")
    # The train config's options (--optimizer, --accum, --precision ...) and the kinds' own
    # (--lora, --dropout) follow, from the kinds (add_model_args).


def _add_target_args(p: argparse._ArgumentGroup) -> None:
    # The target, how its devices are counted and shared, and the mesh plan.
    p.add_argument(
        "--target",
        default="h100-80gb",
        help="GPU target (remat-kit targets), a GPU file (.json facts or a GpuTargetConfigProto), "
        "a TPU slice (v5p-64, v6e-256, v5litepod-16, v6e:8x16), cpu, or local (this machine's "
        "GPU)",
    )
    p.add_argument("--gpus", type=positive_int, default=1, help="devices of the target")
    p.add_argument(
        "--slices",
        type=positive_int,
        default=1,
        help="TPU slices alike joined over the data-centre network (MaxText's num_slices)",
    )
    add_shard_args(p)  # --shard dp:8 | fsdp:8 | fsdp:4,tp:2 and --hosts
    p.add_argument(
        "--mem-fraction",
        type=mem_fraction,
        default=None,
        help="share of each GPU JAX's allocator takes (default: XLA_PYTHON_CLIENT_MEM_FRACTION "
        "from the environment, else JAX's 0.75); every 'fits' is judged against it",
    )


def _add_compile_args(p: argparse._ArgumentGroup) -> None:
    # How the step is compiled: the depth of an unrolled model, the cache.
    p.add_argument(
        "--depth",
        type=name_arg,
        choices=DEPTH_MODES,
        default="auto",
        help="unrolled layers (--no-scan, a factory taking layers=): auto answers from "
        "compiles of 2 and 3 layers where the step fits with 2%% to spare, and compiles the "
        "whole model for any other verdict, for copies that do not line up and for the final "
        "answers of fit and plan; estimate gives the copies' figures whatever the verdict; "
        "full compiles the whole model; check does both and reports the error "
        "(docs/unrolled.md)",
    )
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="compile afresh: neither read nor write the cache of compiled analyses "
        "(~/.cache/remat_kit, or REMAT_KIT_CACHE_DIR)",
    )


def add_policy_arg(p: argparse.ArgumentParser, default: str | None, help_text: str) -> None:
    """Adds ``--policy``, one policy by name or spec, to the ``remat`` group.

    Args:
      p: an argparse parser (or subparser).
      default: the policy measured when the flag is not given (None: the command's choice).
      help_text: what the policy is to the command.

    Example:
      >>> p = Parser(); add_policy_arg(p, "full", "policy name or spec")
      >>> p.parse_args([]).policy
      'full'
    """
    group(p, "remat").add_argument("--policy", default=default, help=help_text)


def add_policies_arg(p: argparse.ArgumentParser, default: str, help_text: str) -> None:
    """Adds ``--policies``, a comma-separated list of policies, to the ``remat`` group.

    Example:
      >>> p = Parser(); add_policies_arg(p, "none,full", "comma-separated")
      >>> p.parse_args([]).policies
      'none,full'
    """
    group(p, "remat").add_argument("--policies", default=default, help=help_text)


def add_schedule_arg(p: argparse.ArgumentParser, help_text: str, *, several: bool = False) -> None:
    """Adds ``--schedule`` (the layer schedule; with ``several``, ``--schedules``, a list of
    them, which ``--schedule`` also names) to the ``remat`` group.

    Example:
      >>> p = Parser(); add_schedule_arg(p, "layer schedule")
      >>> p.parse_args(["--schedule", "sqrt"]).schedule
      'sqrt'
    """
    flags = ("--schedules", "--schedule") if several else ("--schedule",)
    group(p, "remat").add_argument(*flags, default="none", help=help_text)


def add_output_arg(p: argparse.ArgumentParser, flag: str, help_text: str) -> None:
    """Adds a file the command writes (``--json``, ``--csv``, ``--plot``) to the ``output``
    group.

    Example:
      >>> p = Parser(); add_output_arg(p, "--csv", "write the rows as CSV")
      >>> str(p.parse_args(["--csv", "r.csv"]).csv)
      'r.csv'
    """
    group(p, "output").add_argument(flag, type=Path, default=None, help=help_text)


def add_common_args(p: argparse.ArgumentParser, *, top: bool = False) -> None:
    """Adds ``--debug`` and, to a command's parser, ``--wide``.

    Args:
      p: the top-level parser (``top``) or a command's.
      top: ``p`` is ``remat-kit``'s own parser; a command's ``--debug`` does not reset it.

    Example:
      >>> p = Parser(); add_common_args(p)
      >>> p.parse_args(["--wide"]).wide
      True
    """
    debug = "on an error, show the full traceback instead of one line"
    if top:
        p.add_argument("--debug", action="store_true", help=debug)
        return
    out = group(p, "output")
    out.add_argument("--wide", action="store_true", help=_WIDE_HELP)
    # --debug after the command as well; SUPPRESS keeps a top-level --debug.
    out.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug)


_WIDE_HELP = (
    "print tables whole, however wide (by default they fit the terminal: $COLUMNS or its "
    "width, 150 columns into a file or pipe; the least important columns go first)"
)


def name_arg(text: str) -> str:
    """An argparse ``type=`` for a flag whose values are names (an optimizer, a target, a
    precision ...): names are matched without regard to case, as ``--target H100`` is.

    Example:
      >>> name_arg(" AdamW ")
      'adamw'
    """
    return text.strip().lower()


def add_shard_args(parser: argparse.ArgumentParser) -> None:
    """Adds ``--shard`` (``rk.sources.SHARD``), ``--hosts`` and ``--node`` to a CLI parser
    (``--gpus`` is the device count).

    Args:
      parser: an argparse parser (or subparser).

    Example:
      >>> p = argparse.ArgumentParser(); add_shard_args(p)
      >>> p.parse_args(["--shard", "fsdp:4,tp:2", "--hosts", "2"]).shard
      'fsdp:4,tp:2'
    """
    _add_option(parser, SHARD)  # the mesh plan: a kind takes it where its spec has one
    parser.add_argument(
        "--hosts", type=positive_int, default=1, help="hosts the --gpus devices are spread over"
    )
    parser.add_argument(
        "--node",
        type=name_arg,
        default=None,
        metavar="NAME",
        help="the machine the GPUs come in (remat-kit targets lists them: dgx-h100, a3-mega, "
        "gb200-nvl72, ...): its NVLink domain and GPU network price the collectives of the "
        "step time; --gpus fill whole nodes unless --hosts says otherwise",
    )


def _shard_arg(text: str) -> str:
    from remat_kit.sharding import parse_shard

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


def add_search_args(p: argparse.ArgumentParser) -> None:
    """Adds the planner's options: ``--headroom``, ``--no-offload`` and ``--hide``.

    Args:
      p: an argparse parser (or subparser).

    Example:
      >>> p = Parser(); add_search_args(p)
      >>> p.parse_args(["--headroom", "0.1"]).headroom
      0.1
    """
    p = group(p, "search")
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
    from remat_kit.train import PRECISIONS

    text = name_arg(text)
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


#: How an option's text is read (``rk.sources.OPTION_TYPES``, but ``text``, ``switch`` and
#: ``words``, which are argparse actions).
_TYPES: dict[str, Callable[[str], str | int | float]] = {
    "name": name_arg,
    "positive_int": positive_int,
    "non_negative_int": non_negative_int,
    "float": float,
    "fraction": fraction,
    "precision": precision_name,
    "shard": _shard_arg,
}

# --- checks run before any compile --------------------------------------------------------------
