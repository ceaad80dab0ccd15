"""The one place the CLI turns ``--model`` / ``--hf-config`` and the training flags into a
model source: the only module of remat_kit that imports the ``models`` presets.

:func:`resolve` checks everything that needs no trace or compile and returns a
:class:`ModelRun`: the options (what the user asked, for titles and worker processes), the
target, the ``rk.sources.StepSource`` and the ``rk.TrainConfig``. The commands hand the source
and the config to ``rk.sources`` (measure, residuals, workload ...), the one pipeline for
presets, Hugging Face configs and factories alike.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from remat_kit.cli._values import check_outputs, target_after_imports, target_from_args
from remat_kit.errors import BadValue
from remat_kit.render.captions import flags_words
from remat_kit.sharding import parse_shard
from remat_kit.sources import StepSource
from remat_kit.targets import Target
from remat_kit.train import TrainConfig

__all__ = [
    "ModelRun",
    "options_from_args",
    "preset_configs",
    "resolve",
    "run_notes",
    "source_for",
]

#: Model flags that override a preset's config field (``--layers`` sets ``n_layers`` ...).
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


@dataclasses.dataclass(frozen=True)
class ModelRun:
    """What one command measures: the options, the target, the source and the train config.

    Attributes:
      opts: ``models.options.Options``, as the user gave them (titles, worker processes).
      target: the ``rk.Target``.
      source: the model source (``rk.sources.StepSource``).
      config: the train config (batch, seq, optimizer, precision, accumulation).
    """

    opts: Any
    target: Target
    source: StepSource
    config: TrainConfig

    @property
    def own_names(self) -> bool:
        """The model may tag tensors with names of its own (a factory's): policies' names
        are checked against its traced program, not our vocabulary."""
        return bool(getattr(self.opts, "names_factory", False))

    @property
    def n_layers(self) -> int:
        """Layers of the model (1 when a factory's cannot be counted)."""
        return self.source.n_layers() or 1


#: Flags that shape the model or the step remat_kit builds: a step of the user's own
#: (``--step``) has its own, so giving one with it is an error. (dest, flag, default)
_NOT_FOR_A_STEP = (
    ("block", "--block", None),
    ("tags", "--tags", None),
    ("optimizer", "--optimizer", "adamw"),
    ("lora", "--lora", 0),
    ("accum", "--accum", 1),
    ("precision", "--precision", None),
    ("param_dtype", "--param-dtype", None),
    ("dtype", "--dtype", None),
    ("dropout", "--dropout", None),
    ("attention", "--attention", "auto"),
    ("no_scan", "--no-scan", False),
    ("shard", "--shard", None),
    *((key, "--" + key.replace("_", "-"), None) for key in _SHAPE_FLAGS),
)


def options_from_args(args: argparse.Namespace) -> Any:
    """``models.options.Options`` from parsed arguments (``--model --batch --seq ...``).

    Raises:
      BadValue: no model or two (``--model``, ``--hf-config``, ``--step``), or with
        ``--step`` a flag that shapes the model or the step remat_kit builds.
    """
    from remat_kit_models.options import Options

    overrides = tuple(
        (key, getattr(args, key)) for key in _SHAPE_FLAGS if getattr(args, key, None) is not None
    )
    model, hf_config = getattr(args, "model", None), getattr(args, "hf_config", None)
    step = getattr(args, "step", None)
    named = [f for f, v in (("--model", model), ("--hf-config", hf_config), ("--step", step)) if v]
    if len(named) != 1:
        raise BadValue(
            "give the model once"
            + (f" ({' and '.join(named)} given)" if named else "")
            + ": a preset, path/file.py:NAME or package.module:NAME (--model), a Hugging Face "
            "config.json (--hf-config), or a train step of your own, file.py:NAME (--step)",
            param=None if len(named) > 1 else "model",
        )
    if step:
        _check_step_flags(args)
    return Options(
        model=step or (model if model is not None else Path(hf_config).stem),
        step=step,
        hf_config=hf_config,
        block=getattr(args, "block", None),
        tags=getattr(args, "tags", None) or "auto",
        strict=True,
        batch=args.batch,
        seq=args.seq,
        optimizer=getattr(args, "optimizer", "adamw"),
        lora=getattr(args, "lora", 0),
        accum=getattr(args, "accum", 1),
        param_dtype=getattr(args, "param_dtype", None),
        dtype=getattr(args, "dtype", None),
        attention=getattr(args, "attention", "auto"),
        scan_layers=not getattr(args, "no_scan", False),
        overrides=overrides,
        shard=getattr(args, "shard", None),
        precision=getattr(args, "precision", None),
        dropout=getattr(args, "dropout", None),
        depth=getattr(args, "depth", "auto"),
    )


def _check_step_flags(args: argparse.Namespace) -> None:
    """With ``--step``: no flag that shapes the model or the step remat_kit builds (the
    user's step has its own model, optimizer, precision, accumulation and layout)."""
    given = getattr(args, "given", None)
    bad = [
        flag
        for dest, flag, default in _NOT_FOR_A_STEP
        if (flag in given if given is not None else getattr(args, dest, default) != default)
    ]
    if getattr(args, "objective", None) == "throughput":
        bad.append("--objective throughput")  # it varies --accum, which the step does not take
    if bad:
        raise BadValue(
            f"{', '.join(bad)} with --step {args.step}: a step of your own has its own model, "
            "optimizer, precision, accumulation and sharding; drop "
            + ("it" if len(bad) == 1 else "them")
            + " (the step function gets policy and config with the batch and seq)"
        )


def source_for(opts: Any) -> StepSource:
    """The model source the options name (``models.source.source_for``): a worker process
    resolves it again from the picklable options."""
    from remat_kit_models.source import source_for as resolve_source

    return resolve_source(opts)


def resolve(args: argparse.Namespace) -> ModelRun:
    """Checks the model flags and the output paths, without tracing or compiling.

    Builds the options, the target, the source and the train config; checks the model
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
    opts = options_from_args(args)
    tgt = target_from_args(args)
    if tgt.devices > 1 and not opts.shard:
        raise BadValue(
            f"--gpus {tgt.devices} without --shard: the step would be compiled for one GPU and "
            f"reported as such; give a mesh, e.g. --shard fsdp:{tgt.devices}, or drop --gpus"
        )
    source = source_for(opts)
    tgt = target_after_imports(tgt, getattr(source, "env_at_import", ()), args)
    config = opts.train_config()  # the optimizer's name, batch against accum
    # The model's own check names its field (vocab_size=1, BadValue.param): the CLI's error
    # boundary (remat_kit.cli.main, FLAGS) names the flag that set it.
    source.check(config, tgt)
    if opts.shard:
        plan = parse_shard(opts.shard, tgt.devices)
        plan.check_devices(tgt.devices)
        plan.check_seq(opts.seq)  # cp (else tp) splits the sequence
    return ModelRun(opts, tgt, source, config)


def run_notes(run: ModelRun) -> list[str]:
    """What the user should know about how the run's programs were made, one line each:
    why ``--attention auto`` chose XLA's attention on a GPU that runs cuDNN's, and the
    ``XLA_FLAGS`` a factory's import set (EasyDeL sets 17): XLA reads them when it compiles,
    so these programs were made with them, as a training process that imports the factory.

    Args:
      run: the resolved run.

    Returns:
      The lines (none when nothing needs saying).
    """
    env = getattr(run.source, "env_at_import", ())
    notes = [flags_words(e) for e in env if e.name == "XLA_FLAGS"]
    chosen = _attention_note(run)
    return [chosen, *notes] if chosen else notes


def _attention_note(run: ModelRun) -> str | None:
    # Why ``--attention auto`` chose XLA's attention on a GPU that runs cuDNN's, or None (a
    # factory's model picks its own kernels).
    from remat_kit.targets import cudnn_attention_available
    from remat_kit_models.options import cudnn_problem

    config_for = getattr(run.source, "config_for", None)
    if run.opts.attention != "auto" or config_for is None:
        return None
    cfg = config_for("full", run.target)
    if cfg.attention != "xla" or not cudnn_attention_available(run.target):
        return None
    problem = cudnn_problem(cfg, run.opts.seq, run.target)
    if problem is None:
        return None
    return f"attention=auto measured xla: cuDNN flash attention {problem}"


def preset_configs() -> list[tuple[str, Any]]:
    """Every preset's name and ``ModelConfig``, for ``remat-kit models``."""
    import remat_kit_models as models

    return [(name, models.get_config(name)) for name in models.preset_names()]
