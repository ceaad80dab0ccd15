"""Our presets and Hugging Face configs as model sources, and the one resolver of a model name.

:class:`PresetSource` is a preset (or a Hugging Face ``config.json`` mapped onto our decoder)
with its options: it implements ``rk.sources.StepSource``, so remat_kit's one pipeline
(``rk.sources.measure``, ``residuals``, ``step_flops``, ``workload`` ...) measures it exactly
as it measures a user's factory. :func:`source_for` is the only place that decides which kind
of source a model string names.

Example:
  >>> import remat_kit as rk
  >>> from remat_kit_models.options import Options
  >>> src = source_for(Options("tiny-llama", 2, 32, optimizer="sgd"))
  >>> src.n_layers(), isinstance(src, rk.sources.StepSource)
  (4, True)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

import remat_kit as rk
import remat_kit.cache
from remat_kit.errors import BadValue
from remat_kit_models import build, get_config
from remat_kit_models.config import ModelConfig
from remat_kit_models.options import Options, model_config

__all__ = [
    "PresetSource",
    "source_for",
    "train_step",
]


@dataclasses.dataclass(frozen=True)
class PresetSource:
    """A preset or a Hugging Face config, with the options that shape its model.

    The options' batch is not used: the train config passed to :meth:`build_step` sets it.

    Attributes:
      opts: the model, overrides, LoRA rank, attention, layer loop, dropout, mesh plan and
        precision (``models.options.Options``).
    """

    opts: Options

    @property
    def spec(self) -> str:
        """The preset's name (or the Hugging Face config's label)."""
        return self.opts.model

    @property
    def schedule_kinds(self) -> frozenset[str]:
        """Every schedule: our models place checkpoints along the depth themselves."""
        return rk.sources.ALL_SCHEDULES

    def n_layers(self) -> int:
        """Layers of the model, overrides included."""
        # Depth does not depend on the attention kernel, and the CPU cannot resolve 'cudnn'.
        opts = dataclasses.replace(self.opts, attention="xla")
        return model_config(opts, "none", rk.target("cpu")).n_layers

    def at_depth(self, layers: int) -> PresetSource | None:
        """This model with ``layers`` layers, None when its layers are scanned (a scan
        compiles one body whatever the depth)."""
        if self.opts.scan_layers:
            return None
        kept = tuple((k, v) for k, v in self.opts.overrides if k not in ("layers", "n_layers"))
        return PresetSource(dataclasses.replace(self.opts, overrides=(*kept, ("layers", layers))))

    def config_for(
        self, policy: rk.policies.PolicyLike, target: rk.Target, schedule: Any = "none"
    ) -> ModelConfig:
        """The ModelConfig under ``policy`` and ``schedule`` for ``target`` (attention
        resolved, sizes checked): see ``models.options.model_config``."""
        return model_config(self.opts, policy, target, schedule)

    def check(self, config: rk.TrainConfig, target: rk.Target) -> None:
        """The model's config for ``target`` (overrides, dtypes, the attention kernel and its
        shape rules, learned positions, absurd sizes): shapes only, no trace.

        Raises:
          BadValue: the first bad value.
        """
        opts = dataclasses.replace(self.opts, batch=config.batch)
        model_config(opts, "full", target)

    def build_step(
        self,
        policy: rk.Policy,
        schedule: rk.Schedule,
        config: rk.TrainConfig,
        target: rk.Target,
        *,
        sharded: bool = True,
    ) -> rk.sources.SourceStep:
        """The preset's train step (the StepSource protocol): see :func:`train_step`."""
        opts = dataclasses.replace(self.opts, batch=config.batch)
        cfg = model_config(opts, policy, target, schedule)
        step = train_step(opts, cfg, target, sharded=sharded, config=config)
        meta = {
            "lora": opts.lora,
            "param_dtype": jax.numpy.dtype(cfg.param_dtype).name,
            "dropout": cfg.dropout_rate,
            "layers": cfg.n_layers,
            "params": cfg.param_count(),
        }
        if cfg.n_experts:
            meta["experts"] = {
                "routed": cfg.n_experts,
                "per_token": cfg.experts_per_token,
                "impl": cfg.moe_impl,
                "capacity_factor": cfg.capacity_factor if cfg.moe_impl == "capacity" else None,
            }
        return rk.sources.SourceStep(step, cfg.policy, cfg.schedule, cfg.attention, meta)

    def check_step(self, built: rk.sources.SourceStep, what: str) -> None:
        """Nothing to check: a preset's module is built fresh for every policy."""
        del built, what

    def mesh_plan(self, target: rk.Target) -> rk.MeshPlan | None:
        """The options' mesh plan on ``target``'s devices, or None."""
        return rk.parse_shard(self.opts.shard, target.devices) if self.opts.shard else None

    def cache_parts(self) -> Mapping[str, Any]:
        """The options (a Hugging Face config by its contents) and this package's code."""
        parts: dict[str, Any] = {
            "options": dataclasses.asdict(dataclasses.replace(self.opts, batch=0)),
            "code_models": rk.cache.code_fingerprint("remat_kit_models"),
        }
        if self.opts.hf_config is not None:
            parts["hf_config"] = hashlib.sha256(Path(self.opts.hf_config).read_bytes()).hexdigest()
        return parts

    def label(self, config: rk.TrainConfig, target: rk.Target) -> str:
        """``model s<seq> <optimizer>``, with the LoRA rank and the mesh plan."""
        plan = self.mesh_plan(target)
        return (
            f"{self.spec} s{config.seq} {config.optimizer}"
            + (f" lora{self.opts.lora}" if self.opts.lora else "")
            + (f" {plan.spec}" if plan is not None else "")
        )


def train_step(
    opts: Options,
    cfg: ModelConfig,
    t: rk.Target,
    *,
    sharded: bool = True,
    config: rk.TrainConfig | None = None,
) -> rk.train.TrainStep:
    """The train step of ``opts`` for ``cfg``, as the measured programs run it.

    In train mode: where ``cfg.dropout_rate`` > 0 the model applies dropout and the step
    takes a dropout key (``rng_streams=("dropout",)``). Sharded over ``t``'s devices when
    ``opts.shard`` is set and ``sharded``.

    Args:
      opts: the options (precision, batch, optimizer, ...).
      cfg: the model config (``models.options.model_config``).
      t: the target.
      sharded: False builds the unsharded step even with ``opts.shard``.
      config: the train config (default: the options').

    Returns:
      The ``rk.train.TrainStep``.

    Example:
      >>> from remat_kit_models.options import Options, model_config
      >>> t = rk.target("h100")
      >>> opts = Options("tiny-gpt2", 2, 64, dropout=0.1)
      >>> train_step(opts, model_config(opts, "full", t), t).rng_streams
      ('dropout',)
    """
    dropout = cfg.dropout_rate > 0.0
    module = build(cfg, deterministic=not dropout)
    streams = ("dropout",) if dropout else ()
    config = config or opts.train_config()
    params = _abstract_params(
        cfg.replace(policy="none", schedule="none"), config.micro_batch, config.seq
    )
    if not (opts.shard and sharded):
        return rk.build_train_step(module, config, rng_streams=streams, abstract_params=params)
    plan = rk.parse_shard(opts.shard, t.devices)
    return rk.build_train_step(
        module,
        config,
        sharding=plan,
        mesh=plan.mesh(t),
        rng_streams=streams,
        abstract_params=params,
    )


@functools.cache
def _abstract_params(cfg: ModelConfig, micro_batch: int, seq: int) -> Any:
    """The abstract (boxed) variables of ``cfg``'s model, traced once per model: the policy
    and the schedule do not change how a preset lays out its parameters (tested), so
    ``cfg`` comes with both at ``none`` and every step built for the search shares them."""
    module = build(cfg)
    tokens = jax.ShapeDtypeStruct((micro_batch, seq), jax.numpy.int32)
    return jax.eval_shape(module.init, jax.random.key(0), tokens)


def source_for(opts: Options) -> rk.sources.StepSource:
    """The model source ``opts`` names: a factory (``file.py:NAME``, ``package.module:NAME``;
    loaded once per process), else a preset or Hugging Face config.

    Args:
      opts: the options.

    Returns:
      A ``rk.sources.OwnStepSource`` for a user's step (``opts.step``), a
      ``rk.sources.ModelSource`` for a factory, else a :class:`PresetSource`.

    Raises:
      BadValue: an option a factory's model does not take (LoRA, the shape overrides,
        attention, dropout, a mesh plan, the layer loop), a block given for a preset, an
        unknown preset, or a factory that cannot be loaded.
    """
    if opts.step:
        return _step_source(opts)
    if opts.names_factory:
        return _factory_source(opts)
    if opts.block:
        raise BadValue(
            f"block={opts.block!r} patches a factory's model (a model named file.py:NAME)",
            param="block",
        )
    if opts.hf_config is None:
        get_config(opts.model)  # an unknown preset is named before anything is built
    return PresetSource(opts)


def _factory_source(opts: Options) -> rk.sources.ModelSource:
    shape = dict(opts.overrides)
    layers = shape.pop("layers", None)
    given = {
        "lora": opts.lora,
        "layers/width/heads/...": shape,
        "attention": opts.attention != "auto",
        "dropout": opts.dropout is not None,
        "scan_layers": not opts.scan_layers,
    }
    bad = [name for name, value in given.items() if value]
    if bad:
        raise BadValue(
            f"{', '.join(bad)}: the factory {opts.model} builds its own model (adapters, "
            "shape, attention, dropout and layer loop are its own): drop them",
            param=bad[0].split("/")[0],
        )
    if layers is None:
        return _loaded(opts.model, opts.block, opts.tags, opts.shard)
    deeper = _loaded_at(opts.model, opts.block, opts.tags, opts.shard, layers)
    if deeper is None:
        raise BadValue(
            f"the factory {opts.model} takes no layers= argument, so it "
            "builds one depth: leave its layers as they are, or give it a layers parameter",
            param="n_layers",
        )
    return deeper


@functools.cache
def _loaded_at(
    model: str, block: str | None, tags: str, shard: str | None, layers: int
) -> rk.sources.ModelSource | None:
    # --layers N: a factory that names ``layers`` builds any depth (its shallow copies too);
    # one source per process, as _loaded, so that what it traces once is kept.
    return _loaded(model, block, tags, shard).at_depth(layers, label=False)


def _step_source(opts: Options) -> rk.sources.OwnStepSource:
    given = {
        "block": opts.block,
        "tags": opts.tags != "auto",
        "lora": opts.lora,
        "accum": opts.accum != 1,
        "precision/param_dtype/dtype": opts.precision or opts.param_dtype or opts.dtype,
        "layers/width/heads/...": opts.overrides,
        "attention": opts.attention != "auto",
        "dropout": opts.dropout is not None,
        "shard": opts.shard,
        "scan_layers": not opts.scan_layers,
        "hf_config": opts.hf_config,
    }
    bad = [name for name, value in given.items() if value]
    if bad:
        raise BadValue(
            f"{', '.join(bad)}: the step {opts.step} is the user's own (its model, optimizer, "
            "precision, accumulation and sharding are its own): drop them",
            param="step",
        )
    return _loaded_step(opts.step)


@functools.cache
def _loaded_step(step: str) -> rk.sources.OwnStepSource:
    return rk.sources.from_step(step)


@functools.cache
def _loaded(
    model: str, block: str | None, tags: str, shard: str | None = None
) -> rk.sources.ModelSource:
    return rk.sources.from_factory(
        model, block=block, tags=None if tags == "none" else tags, shard=shard
    )
