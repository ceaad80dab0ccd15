"""The one place the CLI turns ``--model`` / ``--hf-config`` / ``--step`` and the training
flags into a model request, and the request into a source.

The kind that claims the model's name (``rk.sources.kind_named``: a factory, a step, a kind a
plugin registers) says which flags it takes: its options (``rk.sources.Option``, the spec
field each fills); :func:`spec_from_args` refuses the others in one place and builds its spec.
No flag of a kind is written here: the flags are the kinds' options
(:func:`remat_kit.cli._args.kind_options`). :func:`resolve` checks everything that needs no trace or
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
from typing import Any

from remat_kit import sources
from remat_kit.cli import _interrupt
from remat_kit.cli._args import kind_options, names_options
from remat_kit.cli._values import check_outputs, target_after_imports, target_from_args
from remat_kit.errors import BadValue
from remat_kit.notes import Note, words
from remat_kit.render import console, flags_words
from remat_kit.sharding import parse_shard
from remat_kit.sources import (
    ModelSpec,
    Option,
    SourceKind,
    StepSource,
    Workload,
    kind_named,
    kinds,
)
from remat_kit.sources import resolve as resolve_spec
from remat_kit.targets import Target, check_deviceless
from remat_kit.targets._platform import start_backends
from remat_kit.train import TrainConfig, planned_precision, regime

__all__ = [
    "ModelRun",
    "Request",
    "catalogue",
    "config_from_args",
    "model_options",
    "print_notes",
    "rebuilt",
    "resolve",
    "run_notes",
    "spec_from_args",
    "with_spread",
]


def model_options() -> list[Option]:
    """The options that shape the model or its training, in the order errors name them (each
    kind's own order, merged): a flag is taken where the chosen kind lists it (a train flag
    where it trains that field) and refused in :func:`_refuse_foreign_flags` otherwise. The
    options that name the model are not among them: :func:`spec_from_args` asks for one.
    """
    named = {o.flag for o in names_options()}
    return [o for o in kind_options() if o.flag not in named]


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

    spec: ModelSpec
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


def _given(args: argparse.Namespace, option: Option) -> bool:
    # ``args.given`` (the flags typed, set by ``main``), else: a value other than the default.
    given = getattr(args, "given", None)
    if given is not None:
        return option.flag in given
    return getattr(args, option.dest, option.default) != option.default


def _takes(kind: SourceKind, option: Option) -> bool:
    return any(o.flag == option.flag for o in kind.options)


def spec_from_args(args: argparse.Namespace) -> tuple[SourceKind, ModelSpec]:
    """The model request the flags make: its kind and its spec.

    One option that names the model (``--model``, ``--hf-config``, ``--step``, a plugin's)
    is given; the kind that claims the name (``rk.sources.kind_named``) says which other
    flags it takes: its options, each filling a field of its spec or, for the train options,
    of the train config it trains.

    Args:
      args: parsed arguments of a parser given ``add_model_args``.

    Returns:
      The kind and the spec.

    Raises:
      BadValue: no model or two, or a flag the kind does not take (all such flags named
        at once, in one place).
    """
    names = names_options()
    named = [o for o in names if getattr(args, o.dest, None)]
    if len(named) != 1:
        ways = [f"{o.what or o.field} ({o.flag})" for o in names]
        raise BadValue(
            "give the model once"
            + (f" ({' and '.join(o.flag for o in named)} given)" if named else "")
            + ": "
            + ", ".join(ways[:-1])
            + ", or " * (len(ways) > 1)
            + ways[-1],
            param=None if len(named) > 1 else "model",
        )
    option = named[0]
    name = getattr(args, option.dest)
    kind = kind_named(option.field, name)
    if kind.catalogue is not None:  # a name it knows, typed in other case (TINY-LLAMA)
        known = {n.lower(): n for n, _ in kind.catalogue()}
        name = known.get(name.strip().lower(), name)
    _refuse_foreign_flags(args, kind, f"{option.flag} {name}")
    # The fields of this kind's spec, each the value its option's type read (a plugin's too).
    values: dict[str, Any] = {option.field: name}
    pairs: dict[str, list[tuple[str, Any]]] = {}
    for o in kind.options:
        if o.train or o.field == kind.names_by or not _given(args, o):
            continue
        value = getattr(args, o.dest)
        if o.key is not None:  # one (key, value) pair of a field of pairs (overrides)
            pairs.setdefault(o.field, []).append((o.key, value))
        else:
            values[o.field] = o.const if o.type == "switch" else value
    values.update((field, tuple(p)) for field, p in pairs.items())
    return kind, kind.spec(**values)


def _refuse_foreign_flags(args: argparse.Namespace, kind: SourceKind, named: str) -> None:
    """The one place a flag the chosen kind does not take is refused (naming every such
    flag, those the kind takes, and the kinds each refused flag is for)."""
    options = model_options()
    bad = [o for o in options if _given(args, o) and not _takes(kind, o)]
    words = [o.flag for o in bad]
    if getattr(args, "objective", None) == "throughput" and "accum" not in kind.trains:
        words.append("--objective throughput")  # it varies --accum, which the kind does not take
    if _given(args, _DEPTH) and not _unrolls(kind):
        words.append("--depth")  # a step of its own or a plugin's config builds one depth
        bad.append(_DEPTH)
    if not words:
        return
    takes = [o.flag for o in options if _takes(kind, o)]
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
_DEPTH = Option("--depth", "depth", "how an unrolled model is compiled", default="auto")


def _unrolls(kind: SourceKind) -> bool:
    return bool({"layers", "overrides"} & set(kind.fields))


def _kinds_for(bad: list[Option]) -> str:
    # "(--tags is for factory (--model) sources)": where each refused flag does apply.
    names = {o.field: o.flag for o in names_options()}
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
    # A kind that lays out its own mesh (a config's own parallelism keys) takes no --shard.
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

    spec: ModelSpec
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
    # Any: each kind's config is its own (a preset's), as ``SourceKind.catalogue`` gives it.
    return [
        item for kind in kinds().values() if kind.catalogue is not None for item in kind.catalogue()
    ]
