"""Parsed ``remat-kit`` arguments turned into typed library values, once, at the edge.

A target, policies, schedules, budgets and the output paths: each function takes the text a
flag was given and returns the ``rk`` value the library takes (``Target``, ``Policy``,
``Schedule``, bytes), or raises a one-line ``BadValue`` naming the flag and what is valid,
before anything is traced or compiled. Inside the commands and the library, only these
typed values travel.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path

from remat_kit.errors import BadType, BadValue, UnitlessBudget
from remat_kit.names import VOCABULARY
from remat_kit.policies import Policy, PolicyLike, is_path_pattern, parse_policy
from remat_kit.render import check_output
from remat_kit.schedules import Schedule, parse_schedule
from remat_kit.sources import ALLOCATOR_VARS, EnvSet
from remat_kit.targets import Target, is_slice_name, runtime_from_env, target

__all__ = [
    "OUTPUT_FLAGS",
    "budget_arg",
    "check_outputs",
    "flag_items",
    "host_budget_arg",
    "policy_arg",
    "schedule_arg",
    "target_after_imports",
    "target_from_args",
]


def target_from_args(args: argparse.Namespace) -> Target:
    """The target named by ``--target``, with ``--gpus`` devices over ``--hosts`` hosts.

    ``--target`` is a catalogue name, or a file describing a GPU outside it: a ``.json``
    object of the card's facts (``sms, fp32_per_sm, smem_per_sm, smem_optin, threads_per_sm,
    hbm_bandwidth, l2_bytes, clock_ghz, memory_bytes``; optional ``compute_capability``,
    ``host_link_bandwidth``, ``peak_bf16_flops``, ``description``, ``name``) or a
    GpuTargetConfigProto in text format.

    Args:
      args: parsed arguments of a parser given :func:`add_model_args`.

    Returns:
      The ``rk.Target``.

    Raises:
      UnknownName: the target is not in the catalogue (and is not a file).
      BadValue: a file that is missing, unreadable or not a GPU's description.

    Example:
      >>> target_from_args(argparse.Namespace(target="h100", gpus=8, hosts=1)).devices
      8
    """
    name = args.target.strip().lower()
    fraction = getattr(args, "mem_fraction", None) if name not in ("cpu", "local") else None
    if fraction is not None and is_slice_name(name):
        raise BadValue(
            f"--mem-fraction sets a GPU allocator's share; a TPU's runtime takes none "
            f"({args.target!r}): drop --mem-fraction",
            param="mem_fraction",
        )
    gpus, hosts = getattr(args, "gpus", 1) or 1, getattr(args, "hosts", 1) or 1
    machine = getattr(args, "node", None)
    if _is_file_target(args.target):
        if machine:
            raise BadValue(
                f"--node {machine} names a catalogue machine; a GPU described by a file has "
                "none: drop --node or use a catalogue --target",
                param="node",
            )
        t = _file_target(args.target, gpus, hosts, fraction)
    else:
        slices = getattr(args, "slices", 1) or 1
        t = target(
            args.target, devices=gpus, hosts=hosts, mem_fraction=fraction, node=machine,
            slices=slices,
        )  # fmt: skip
    if t.kind == "tpu":
        # A named slice says its devices (v5p-64: 32 chips); the commands that count by
        # --gpus (a batch per device, --shard's open sizes) read them from there.
        args.gpus = t.devices
        return t
    return t if fraction is None else t.with_mem_fraction(fraction, "--mem-fraction")


def target_after_imports(t: Target, env: Sequence[EnvSet], args: argparse.Namespace) -> Target:
    """The target as a process that imports the user's code gets it.

    A library may set the allocator's variables when it is imported (EasyDeL sets
    ``XLA_PYTHON_CLIENT_MEM_FRACTION=1.0``): a training process that imports it runs with
    that fraction, not the one the shell gave, so the reports use it and name who set it.
    ``--mem-fraction`` still wins.

    Args:
      t: the target read from the flags and the environment before the import.
      env: what the import set (``ModelSource.env_at_import``).
      args: the parsed arguments (``--mem-fraction``).

    Returns:
      ``t``, with the runtime the import set where it set one.

    Raises:
      BadValue: a fraction the import set that leaves no room on the card (naming the
        package and what to do).

    Example:
      >>> from remat_kit.sources import EnvSet
      >>> args = argparse.Namespace(target="h100", gpus=1, hosts=1, mem_fraction=None)
      >>> t = target_after_imports(target_from_args(args), [], args)
      >>> t.runtime.source
      'default'
    """
    sets = [e for e in env if e.name in ALLOCATOR_VARS]
    if not sets or t.kind != "gpu" or getattr(args, "mem_fraction", None) is not None:
        return t
    # What the import set, over the environment the shell gave.
    runtime = runtime_from_env({**os.environ, **{e.name: e.value for e in sets}})
    said = "; ".join(e.words() for e in sets)
    try:
        return dataclasses.replace(t, runtime=dataclasses.replace(runtime, source=said))
    except BadValue as err:
        by = " and ".join(dict.fromkeys(e.by for e in sets))
        raise BadValue(
            f"{err}; a process that imports {by} gets this setting: set it again after the "
            "import in your training script, and give remat-kit the value with --mem-fraction"
        ) from None


def _is_file_target(text: str) -> bool:
    # A path, not a catalogue name: names hold no "/" and no suffix.
    return "/" in text or Path(text).suffix.lower() in (".json", ".txt", ".pbtxt", ".textproto")


def _file_target(text: str, gpus: int, hosts: int, fraction: float | None) -> Target:
    """A GPU described in a file: a JSON object of the card's facts (the columns of the GPU
    table, ``rk.targets.custom_target``; an optional ``"name"``) or a GpuTargetConfigProto in
    text format (``rk.targets.target_from_config``)."""
    from remat_kit.targets import custom_target, target_from_config

    path = Path(text)
    if not path.is_file():
        raise BadValue(
            f"--target {text}: no such file; name a catalogue GPU (remat-kit targets) or a "
            "file: a JSON object of the card's facts, or a GpuTargetConfigProto text"
        )
    if path.suffix.lower() != ".json":
        return target_from_config(path, devices=gpus, hosts=hosts, mem_fraction=fraction)
    try:
        facts = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise BadValue(f"--target {text}: not readable JSON ({err})") from None
    if not isinstance(facts, dict):
        raise BadValue(f"--target {text}: the JSON must be an object of the card's facts")
    label = facts.pop("name", None) or path.stem
    return custom_target(str(label), facts, devices=gpus, hosts=hosts, mem_fraction=fraction)


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
      >>> from pathlib import Path
      >>> check_outputs(argparse.Namespace(json=Path("/tmp/r.json")))
    """
    # Each flag writes one format and its own suffix, so two outputs never share a path:
    # --csv X --json X fails here for one of them.
    for name in OUTPUT_FLAGS:
        path = getattr(args, name, None)
        if path is None:
            continue
        flag = f"--{name}"
        check_output(path, flag=flag)
        if Path(path).suffix.lower() != _SUFFIX[name]:
            raise BadValue(
                f"{flag} {path}: writes {_WHAT[name]}; give a path ending in {_SUFFIX[name]}"
            )


_SUFFIX = {"json": ".json", "csv": ".csv", "plot": ".png"}
_WHAT = {"json": "JSON", "csv": "CSV", "plot": "a PNG image"}


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
    twice = sorted({i for i in items if items.count(i) > 1})
    if twice:
        raise BadValue(f"{flag} {text!r} names {', '.join(twice)} twice: give each once")
    return items


def policy_arg(spec: str, flag: str, *, own_names: bool = False) -> Policy:
    """Reads a policy spec given to ``flag``; a tag name no model uses is an error here.

    The library only warns about an unknown tag (users tag their own tensors); a preset
    model tags only names of ``remat_kit.names.VOCABULARY``, so on the command line a name
    outside it is a typo that would silently measure ``full``. A factory's model may tag
    itself with its own names (EasyDeL's ``mlp_gate``): with ``own_names`` they are checked
    against its traced program instead (``rk.sources.check_policies``), before any compile.

    Args:
      spec: e.g. ``"names:save=query_proj+mlpwo"``.
      flag: the flag's name for messages.
      own_names: the model may have names of its own (a factory), checked once traced.

    Returns:
      The policy.

    Raises:
      BadValue: an unreadable spec, an unknown policy or, for a preset, an unknown tag (with
        close matches).

    Example:
      >>> policy_arg("names:save=context", "--policy").params["save"]
      ('context',)
      >>> policy_arg("Minimal", "--policy").name
      'minimal'
      >>> policy_arg("names:save=mlp_gate", "--policy", own_names=True).tags
      ('mlp_gate',)
    """
    spec = _family_lower(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unknown tags are reported below, naming the flag
        try:
            pol = parse_policy(spec)
        except (BadValue, BadType) as err:
            raise BadValue(f"{flag} {spec!r}: {err}") from None
    if own_names:
        return pol
    # Paths and globs name the tags remat_kit.tagging gives models we did not write: they
    # are checked against the traced program instead.
    bad = [t for t in _tag_names(pol) if t not in VOCABULARY and not is_path_pattern(t)]
    if bad:
        close = {t: difflib.get_close_matches(t, VOCABULARY, n=1) for t in bad}
        detail = ", ".join(
            f"{t!r} (did you mean {c[0]!r}?)" if c else repr(t) for t, c in close.items()
        )
        raise BadValue(
            f"{flag} {spec!r}: {detail} is not a tag the models use; tags: {', '.join(VOCABULARY)}"
        )
    return pol


def _family_lower(spec: str) -> str:
    # Names are read without regard to case on the command line (--target H100, --optimizer
    # AdamW): a policy's or schedule's family (FULL, Names:save=...) too. What follows the
    # family is left as typed: tag names are the model's, and a factory's may have capitals.
    family, colon, rest = spec.strip().partition(":")
    return family.lower() + colon + rest


def _tag_names(pol: Policy) -> list[str]:
    # The tag names a spec gave (save=, offload=, names=), through either's two policies.
    out: list[str] = []
    for value in pol.params.values():
        if isinstance(value, Policy):
            out += _tag_names(value)
        elif isinstance(value, tuple):
            out += [v for v in value if isinstance(v, str)]
    return out


def schedule_arg(spec: str, flag: str, n_layers: int, policy: PolicyLike = "full") -> Schedule:
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
    spec = _family_lower(spec)
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
