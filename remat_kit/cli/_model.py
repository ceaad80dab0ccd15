"""The one place the CLI turns ``--model`` / ``--hf-config`` / ``--step`` and the training
flags into a model request, and the request into a source.

The kind that claims the model's name (``rk.sources.kind_named``: a preset, a factory, a
kind a plugin registers) says which flags it takes; :func:`spec_from_args` refuses the others
in one place and builds its spec. :func:`resolve` checks everything that needs no trace or
compile and returns a :class:`ModelRun`: the request, the target, the
``rk.sources.StepSource`` and the ``rk.TrainConfig``. The commands hand the source and the
config to ``rk.sources`` (measure, residuals, workload ...), the one pipeline for every kind.
No module of remat_kit imports the presets package: it is a plugin.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
from collections.abc import Iterable
from concurrent.futures import Executor
from typing import Any, NamedTuple

from remat_kit import sources
from remat_kit.cli import _interrupt
from remat_kit.cli._values import check_outputs, target_after_imports, target_from_args
from remat_kit.errors import BadValue
from remat_kit.notes import Note, words
from remat_kit.render import console, flags_words
from remat_kit.sharding import parse_shard
from remat_kit.sources import SourceKind, StepSource, Workload, kind_named, kinds
from remat_kit.sources import resolve as resolve_spec
from remat_kit.targets import Target, check_deviceless
from remat_kit.targets._platform import start_backends
from remat_kit.train import TrainConfig, planned_precision, regime

__all__ = [
    "ModelRun",
    "Request",
    "catalogue",
    "config_from_args",
    "print_notes",
    "rebuilt",
    "resolve",
    "run_notes",
    "spec_from_args",
    "with_spread",
]

#: Model flags that override a preset's config field (``--layers`` sets ``n_layers`` ...): a
#: kind takes them through its spec's ``overrides`` (a factory takes ``--layers`` alone, as
#: its spec's ``layers``).
_SHAPE_FLAGS = (
    "layers",
    "width",
    "heads",
    "kv_heads",
    "ff",
    "vocab",
    "max_seq",
    "experts",
    "top_k",
    "moe_ff",
    "moe_impl",
    "capacity_factor",
)

#: The flags that name the model: the spec field each fills (a kind's ``names_by``).
_NAMES = (
    ("model", "--model"),
    ("hf_config", "--hf-config"),
    ("step", "--step"),
    ("maxtext", "--maxtext"),
)


class _Flag(NamedTuple):
    dest: str  # argparse's name
    flag: str  # as typed
    default: Any  # the parser's default: "given" where the argument list is unknown
    field: str  # the spec field it fills, or the train-config field (``train``)
    train: bool = False


#: Every flag that shapes the model or its training, in the order errors name them: a flag
#: is taken where the chosen kind's spec has its field (or, for a train flag, where the kind
#: trains that field), and refused in :func:`_refuse_foreign_flags` otherwise.
_FLAGS = (
    _Flag("block", "--block", None, "block"),
    _Flag("tags", "--tags", None, "tags"),
    _Flag("optimizer", "--optimizer", "adamw", "optimizer", train=True),
    _Flag("lora", "--lora", 0, "lora"),
    _Flag("accum", "--accum", 1, "accum", train=True),
    _Flag("precision", "--precision", None, "precision", train=True),
    _Flag("param_dtype", "--param-dtype", None, "precision", train=True),
    _Flag("dtype", "--dtype", None, "precision", train=True),
    _Flag("dropout", "--dropout", None, "dropout"),
    _Flag("attention", "--attention", "auto", "attention"),
    _Flag("no_scan", "--no-scan", False, "scan_layers"),
    _Flag("shard", "--shard", None, "shard"),
    *(_Flag(key, "--" + key.replace("_", "-"), None, "overrides") for key in _SHAPE_FLAGS),
)


@dataclasses.dataclass(frozen=True)
class ModelRun:
    """What one command measures: the request, its kind, the target, the source and the
    train config, with the measuring switches.

    Its ``model``, ``batch``, ``seq``, ``optimizer``, ``lora``, ``accum`` and ``shard`` are
    what titles read (``remat_kit.render.RunOptions``).

    Attributes:
      spec: the model request (a spec of ``kind``; picklable, for worker processes).
      kind: its kind of source.
      target: the ``rk.Target``.
      source: the model source (``rk.sources.StepSource``).
      config: the train config (batch, seq, optimizer, precision, accumulation).
      depth: how an unrolled model is compiled (``--depth``).
      lora: the LoRA rank asked for (0: none).
      shard: the mesh plan asked for (``--shard``), or None.
    """

    spec: Any
    kind: SourceKind
    target: Target
    source: StepSource
    config: TrainConfig
    depth: str = "auto"
    lora: int = 0
    shard: str | None = None

    @property
    def model(self) -> str:
        """The model's name in titles: the source's, which names what changes its figures
        (a preset's overrides)."""
        return self.source.spec

    @property
    def batch(self) -> int:
        return self.config.batch

    @property
    def seq(self) -> int:
        return self.config.seq

    @property
    def accum(self) -> int:
        return self.config.accum

    @property
    def optimizer(self) -> str:
        """The optimizer's name; ``"own step"`` for a kind whose code has its own."""
        return self.config.optimizer if "optimizer" in self.kind.trains else "own step"

    @property
    def own_names(self) -> bool:
        """The model may tag tensors with names of its own (a factory's): policies' names
        are checked against its traced program, not our vocabulary."""
        return self.source.own_model

    @property
    def n_layers(self) -> int:
        """Layers of the model (1 when a factory's cannot be counted)."""
        return self.source.n_layers() or 1

    @property
    def request(self) -> Request:
        """The picklable request a worker process measures the run from."""
        return Request(self.spec, self.config, self.depth)

    def precision_record(self) -> dict[str, str] | None:
        """The regime as titles name it (``rk.train.planned_precision``)."""
        return planned_precision(self.config, own_compute=self.source.own_model)


def _given(args: argparse.Namespace, flag: _Flag) -> bool:
    # ``args.given`` (the flags typed, set by ``main``), else: a value other than the default.
    given = getattr(args, "given", None)
    if given is not None:
        return flag.flag in given
    return getattr(args, flag.dest, flag.default) != flag.default


def _takes(kind: SourceKind, flag: _Flag) -> bool:
    if flag.train:
        return flag.field in kind.trains
    if flag.field == "overrides" and "overrides" not in kind.fields:
        return flag.dest == "layers" and "layers" in kind.fields
    return flag.field in kind.fields


def spec_from_args(args: argparse.Namespace) -> tuple[SourceKind, Any]:
    """The model request the flags make: its kind and its spec.

    One of ``--model``, ``--hf-config``, ``--step`` names the model; the kind that claims the
    name (``rk.sources.kind_named``) says which other flags it takes: the fields of its spec,
    and the train-config fields it trains.

    Args:
      args: parsed arguments of a parser given ``add_model_args``.

    Returns:
      The kind and the spec.

    Raises:
      BadValue: no model or two, or a flag the kind does not take (all such flags named
        at once, in one place).
    """
    named = [(dest, flag) for dest, flag in _NAMES if getattr(args, dest, None)]
    if len(named) != 1:
        raise BadValue(
            "give the model once"
            + (f" ({' and '.join(flag for _, flag in named)} given)" if named else "")
            + ": a preset, path/file.py:NAME or package.module:NAME (--model), a Hugging Face "
            "config.json (--hf-config), a train step of your own, file.py:NAME (--step), or a "
            "MaxText config (--maxtext)",
            param=None if len(named) > 1 else "model",
        )
    (dest, flag) = named[0]
    name = getattr(args, dest)
    kind = kind_named(dest, name)
    if kind.catalogue is not None:  # a name it knows, typed in other case (TINY-LLAMA)
        known = {n.lower(): n for n, _ in kind.catalogue()}
        name = known.get(name.strip().lower(), name)
    _refuse_foreign_flags(args, kind, f"{flag} {name}")
    values: dict[str, Any] = {dest: name}
    overrides = []
    for f in _FLAGS:
        if f.train or not _given(args, f) or not _takes(kind, f):
            continue
        value = getattr(args, f.dest)
        if f.field == "overrides" and "overrides" in kind.fields:
            overrides.append((f.dest, value))
        elif f.field == "overrides":
            values["layers"] = value
        else:
            values[f.field] = not value if f.dest == "no_scan" else value
    if overrides:
        values["overrides"] = tuple(overrides)
    return kind, kind.spec(**values)


def _refuse_foreign_flags(args: argparse.Namespace, kind: SourceKind, named: str) -> None:
    """The one place a flag the chosen kind does not take is refused (naming every such
    flag, those the kind takes, and the kinds each refused flag is for)."""
    bad = [f for f in _FLAGS if _given(args, f) and not _takes(kind, f)]
    words = [f.flag for f in bad]
    if getattr(args, "objective", None) == "throughput" and "accum" not in kind.trains:
        words.append("--objective throughput")  # it varies --accum, which the kind does not take
    if _given(args, _DEPTH) and not _unrolls(kind):
        words.append("--depth")  # a step of its own or a MaxText config builds one depth
        bad.append(_DEPTH)
    if not words:
        return
    takes = [f.flag for f in _FLAGS if _takes(kind, f)]
    raise BadValue(
        f"{', '.join(words)} with {named}: "
        + (
            f"a {kind.name} source takes {', '.join(dict.fromkeys(takes))}"
            if takes
            else f"a {kind.name} of your own has its own model, optimizer, precision, "
            "accumulation and sharding, and takes no flag that shapes them"
        )
        + "; drop "
        + ("it" if len(words) == 1 else "them")
        + _kinds_for(bad)
    )


#: ``--depth``: how an unrolled model's depth is compiled; a kind that can build a
#: shallower copy of its model (a preset, a Hugging Face config, a factory taking layers=).
_DEPTH = _Flag("depth", "--depth", "auto", "depth")


def _unrolls(kind: SourceKind) -> bool:
    return bool({"layers", "overrides"} & set(kind.fields))


def _kinds_for(bad: list[_Flag]) -> str:
    # "(--tags is for factory (--model) sources)": where each refused flag does apply.
    names = {dest: flag for dest, flag in _NAMES}
    parts = []
    for f in bad:
        takers = [
            f"{k.name} ({names.get(k.names_by, k.names_by)})"
            for k in kinds().values()
            if (_unrolls(k) if f is _DEPTH else _takes(k, f))
        ]
        if takers:
            listed = ", ".join(takers[:-1]) + " and " * (len(takers) > 1) + takers[-1]
            parts.append(f"{f.flag} is for {listed} sources")
    return f" ({'; '.join(parts)})" if parts else ""


def config_from_args(args: argparse.Namespace, kind: SourceKind) -> TrainConfig:
    """The train config the flags name, with only the fields ``kind`` trains (LoRA adapters
    trained alone where its spec has a rank).

    Raises:
      BadValue: an unknown optimizer or regime, a batch ``--accum`` does not split.
    """
    trains = kind.trains
    lora = _lora(args, kind)
    return TrainConfig(
        batch=args.batch,
        seq=args.seq,
        optimizer=getattr(args, "optimizer", "adamw") if "optimizer" in trains else "adamw",
        accum=getattr(args, "accum", 1) if "accum" in trains else 1,
        lora=lora > 0,
        precision=regime(
            getattr(args, "precision", None),
            params=getattr(args, "param_dtype", None),
            compute=getattr(args, "dtype", None),
        )
        if "precision" in trains
        else None,
    )


def resolve(args: argparse.Namespace) -> ModelRun:
    """Checks the model flags and the output paths, without tracing or compiling.

    Builds the request, the target, the source and the train config; checks the model
    (preset, overrides, dtypes, the attention kernel and its shape rules, learned positions,
    absurd sizes: ``StepSource.check``), the optimizer, the batch against ``--accum`` and the
    mesh plan against ``--gpus`` and ``--seq``.

    Args:
      args: parsed arguments of a parser given ``add_model_args``.

    Returns:
      The ModelRun.

    Raises:
      BadValue: the first bad value, naming it and what is valid.
    """
    check_outputs(args)
    kind, spec = spec_from_args(args)
    tgt = target_from_args(args)
    shard = getattr(args, "shard", None)
    # A kind that lays out its own mesh (MaxText's parallelism keys) takes no --shard.
    if tgt.devices > 1 and not shard and "shard" in kind.fields:
        if tgt.kind == "tpu":
            one = f"{tgt.name}-{tgt.tpu_slice.layout.cores_per_chip}"
            raise BadValue(
                f"{tgt.tpu_slice.name} holds {tgt.devices} {tgt.device_word}s and no --shard "
                "says how the step spreads over them: give a mesh, e.g. --shard "
                f"fsdp:{tgt.devices}, or name one chip (--target {one})"
            )
        raise BadValue(
            f"--gpus {tgt.devices} without --shard: the step would be compiled for one GPU and "
            f"reported as such; give a mesh, e.g. --shard fsdp:{tgt.devices}, or drop --gpus"
        )
    source = resolve_spec(spec)
    tgt = target_after_imports(tgt, source.env_at_import, args)
    if tgt.kind != "local":  # local: the allocator fraction is set first (validate)
        # Now, after the model's import (XLA reads XLA_FLAGS as its first backend starts, and
        # an import may set them), and where a Ctrl-C cannot be swallowed.
        with _interrupt.at_once():
            start_backends()
    if tgt.kind == "tpu":
        check_deviceless(tgt)  # libtpu there and jax's own, before anything is traced
    config = config_from_args(args, kind)  # the optimizer's name, batch against accum
    if getattr(args, "batch_searched", False):
        # A search sets the batch: the step is first built at one every split the source's
        # steps take divides (a pipeline's micro-batches too), not at one the model refuses.
        ways = math.lcm(args.gpus, source.batch_ways(tgt))
        config = dataclasses.replace(config, batch=config.accum * ways)
        args.batch = config.batch
    # The model's own check names its field (vocab_size=1, BadValue.param): the CLI's error
    # boundary (remat_kit.cli.main, FLAGS) names the flag that set it.
    source.check(config, tgt)
    if shard:
        plan = parse_shard(shard, tgt.devices)
        plan.check_devices(tgt.devices)
        plan.check_seq(args.seq)  # cp (else tp) splits the sequence
    depth = getattr(args, "depth", "auto")
    lora = _lora(args, kind)
    return ModelRun(spec, kind, tgt, source, config, depth=depth, lora=lora, shard=shard)


def _lora(args: argparse.Namespace, kind: SourceKind) -> int:
    return getattr(args, "lora", 0) if "lora" in kind.fields else 0


@dataclasses.dataclass(frozen=True)
class Request:
    """What a worker process needs to measure the run again: picklable values only (it
    resolves the spec itself; a factory is loaded once per process).

    Attributes:
      spec: the model request.
      config: the train config.
      depth: how an unrolled model is compiled.
    """

    spec: Any
    config: TrainConfig
    depth: str = "auto"

    def source(self) -> StepSource:
        """The request's source (``rk.sources.resolve``)."""
        return resolve_spec(self.spec)

    def workload(self, on: Target) -> Workload:
        """The step's Workload on ``on`` (name-based policies strict, as the CLI's are)."""
        return sources.workload(self.source(), on, self.config, strict=True, depth=self.depth)

    def sharded(self, shard: str | None) -> Request:
        """This request with the mesh plan ``shard`` (its spec must take one)."""
        return dataclasses.replace(self, spec=dataclasses.replace(self.spec, shard=shard))


def rebuilt(request: Request, target: Target) -> Workload:
    """The step of ``request`` on ``target`` as a command builds it here (its config and
    depth; module-level, so that a worker process can be handed it)."""
    return sources.workload(request.source(), target, request.config, depth=request.depth)


def with_spread(
    w: Workload, args: argparse.Namespace, run: ModelRun, executor: Executor | None
) -> Workload:
    """``w`` whose independent compiles may run in ``--jobs`` worker processes or on
    ``--cluster``'s workers (``executor``, open), each worker building the same step from
    the request (:func:`rebuilt`); ``w`` itself with ``--jobs 1`` and no cluster.

    Args:
      w: the command's workload, built as :func:`rebuilt` builds it.
      args: parsed arguments with ``--jobs``.
      run: the resolved run ``w`` measures.
      executor: ``--cluster``'s executor (:func:`remat_kit.cli._placement.cluster_executor`),
        or None.

    Returns:
      ``w`` with its :attr:`~remat_kit.sources.Workload.spread` set, or ``w``.
    """
    if args.jobs == 1 and executor is None:
        return w
    spread = sources.Spread(
        functools.partial(rebuilt, run.request, run.target), jobs=args.jobs, executor=executor
    )
    return dataclasses.replace(w, spread=spread)


def run_notes(run: ModelRun) -> list[str]:
    """What the user should know about how the run's programs were made, one line each: the
    source's notes (why ``--attention auto`` chose XLA's attention on a GPU that runs cuDNN's)
    and the ``XLA_FLAGS`` a factory's import set (EasyDeL sets 17): XLA reads them when it
    compiles, so these programs were made with them, as a training process that imports the
    factory.

    Args:
      run: the resolved run.

    Returns:
      The lines (none when nothing needs saying).
    """
    env = [flags_words(e) for e in run.source.env_at_import if e.name == "XLA_FLAGS"]
    return [words(note) for note in run.source.notes(run.config, run.target)] + env


def print_notes(run: ModelRun, wide: bool) -> None:
    """Prints :func:`run_notes`, one ``note:`` line each: before a search, which may be long,
    so that what would make it shorter comes first."""
    out = console(wide)
    for line in run_notes(run):
        out.print(f"[yellow]note:[/yellow] {line}")


def print_caveats(notes: Iterable[Note], wide: bool) -> None:
    """Prints the notes a search's answer carries (``Fit.caveats``, ``PlanFront.caveats``:
    XLA's own remat pass made a policy fit), one ``note:`` line each, under its table."""
    from rich.markup import escape

    out = console(wide)
    for note in notes:
        # One print, so that the line wraps at the terminal's width with its label.
        out.print(f"[yellow]note:[/yellow] {escape(words(note))}", highlight=False)


def catalogue() -> list[tuple[str, Any]]:
    """Every model a kind knows by name, with its config (the presets), for
    ``remat-kit models``."""
    return [
        item for kind in kinds().values() if kind.catalogue is not None for item in kind.catalogue()
    ]
