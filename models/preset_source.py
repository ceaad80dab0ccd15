"""Our presets and Hugging Face configs as sources: :class:`PresetSource`.

:class:`PresetSource` is a preset (or a Hugging Face ``config.json`` mapped onto our decoder)
asked for with a :class:`~remat_kit_models.spec.PresetSpec` (``HFSpec``): it implements
``rk.sources.StepSource``, so remat_kit's one pipeline (``rk.sources.measure``, ``residuals``,
``step_flops``, ``workload`` ...) measures it exactly as it measures a user's factory. The two
kinds that ask for one, with their flags and notes, are :mod:`remat_kit_models.source`'s
``PRESET`` and ``HF_CONFIG``; they import this module when a spec is resolved.

Example:
  >>> import remat_kit as rk
  >>> src = rk.sources.resolve(PresetSpec("tiny-llama"))
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
from remat_kit.notes import Note
from remat_kit_models import build, get_config, preset_names
from remat_kit_models.config import ModelConfig
from remat_kit_models.configure import cudnn_problem, model_config, regime_of
from remat_kit_models.source import ATTENTION_CHOSE_XLA
from remat_kit_models.spec import HFSpec, PresetSpec

__all__ = [
    "PresetSource",
    "catalogue",
    "resolve",
    "train_step",
]


@dataclasses.dataclass(frozen=True)
class PresetSource(rk.sources.StepSource):
    """A preset or a Hugging Face config, with the options that shape its model.

    The train config each call is given sets the batch, sequence, optimizer and precision
    regime (None: ``rk.train.DEFAULT_PRECISION``, as our models always compute in one).

    Attributes:
      request: the model, overrides, LoRA rank, attention, layer loop, dropout and mesh plan
        (a :class:`PresetSpec` or :class:`HFSpec`).
    """

    request: PresetSpec | HFSpec

    #: A preset's policy and schedule are fields of its config (``get_config(...,
    #: policy=..., schedule=...)``).
    applies_in_code = "config"

    @property
    def spec(self) -> str:
        """The preset's name (or the Hugging Face config's label), with the overrides that
        change its figures: ``llama3-8b (layers=64)``; titles and reports name it so."""
        overrides = " ".join(f"{k}={v}" for k, v in self.request.overrides)
        return self.request.name + (f" ({overrides})" if overrides else "")

    @property
    def schedule_kinds(self) -> frozenset[str]:
        """Every schedule: our models place checkpoints along the depth themselves."""
        return rk.sources.ALL_SCHEDULES

    def n_layers(self) -> int:
        """Layers of the model, overrides included."""
        # Depth does not depend on the attention kernel, and the CPU cannot resolve 'cudnn'.
        request = dataclasses.replace(self.request, attention="xla")
        return model_config(request, _SHAPES_ONLY, rk.policies.NO_REMAT, rk.target("cpu")).n_layers

    def at_depth(self, layers: int) -> PresetSource | None:
        """This model with ``layers`` layers, None when its layers are scanned (a scan
        compiles one body whatever the depth)."""
        if self.request.scan_layers:
            return None
        return PresetSource(self.request.with_layers(layers))

    def check(self, config: rk.TrainConfig, target: rk.Target) -> None:
        """The model's config for ``target`` (overrides, dtypes, the attention kernel and its
        shape rules, learned positions, absurd sizes) and the train config's LoRA switch
        against the adapters: shapes only, no trace.

        Raises:
          BadValue: the first bad value.
        """
        _check_lora(self.request, config)
        model_config(self.request, config, rk.policies.FULL, target)

    def train_config(self, config: rk.TrainConfig) -> rk.TrainConfig:
        """``config`` in the default regime (``rk.train.DEFAULT_PRECISION``) where it names
        none: our models always compute in one."""
        return _in_regime(config)

    def notes(self, config: rk.TrainConfig, target: rk.Target) -> tuple[Note, ...]:
        """Why ``attention="auto"`` chose XLA's attention on a target that runs cuDNN's (the
        rule of cuDNN's kernel the model or the sequence length breaks); else none."""
        if self.request.attention != "auto" or not rk.cudnn_attention_available(target):
            return ()
        cfg = model_config(self.request, config, rk.policies.FULL, target)
        problem = cudnn_problem(cfg, config.seq, target) if cfg.attention == "xla" else None
        return () if problem is None else (ATTENTION_CHOSE_XLA(problem=problem),)

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
        _check_lora(self.request, config)
        config = self.train_config(config)
        cfg = model_config(self.request, config, policy, target, schedule)
        step = train_step(self.request, cfg, config, target, sharded=sharded)
        meta = {
            "lora": self.request.lora,
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
        """The request's mesh plan on ``target``'s devices, or None."""
        shard = self.request.shard
        return rk.parse_shard(shard, target.devices) if shard else None

    def cache_parts(self) -> Mapping[str, Any]:
        """The request (a Hugging Face config by its contents) and this package's code."""
        parts: dict[str, Any] = {
            "request": {"kind": type(self.request).__name__, **dataclasses.asdict(self.request)},
            "code_models": rk.cache.code_fingerprint("remat_kit_models"),
        }
        if isinstance(self.request, HFSpec):
            parts["hf_config"] = hashlib.sha256(
                Path(self.request.hf_config).read_bytes()
            ).hexdigest()
        return parts

    def label(self, config: rk.TrainConfig, target: rk.Target) -> str:
        """``model s<seq> <optimizer>``, with the LoRA rank and the mesh plan."""
        plan = self.mesh_plan(target)
        return (
            f"{self.spec} s{config.seq} {config.optimizer}"
            + (f" lora{self.request.lora}" if self.request.lora else "")
            + (f" {plan.spec}" if plan is not None else "")
        )


def train_step(
    request: PresetSpec | HFSpec,
    cfg: ModelConfig,
    config: rk.TrainConfig,
    t: rk.Target,
    *,
    sharded: bool = True,
) -> rk.train.TrainStep:
    """The train step of ``cfg``'s model, as the measured programs run it.

    In train mode: where ``cfg.dropout_rate`` > 0 the model applies dropout and the step
    takes a dropout key (``rng_streams=("dropout",)``). Sharded over ``t``'s devices when
    ``request.shard`` is set and ``sharded``.

    Args:
      request: the request (its mesh plan).
      cfg: the model config (``remat_kit_models.configure.model_config``).
      config: the train config.
      t: the target.
      sharded: False builds the unsharded step even with ``request.shard``.

    Returns:
      The ``rk.train.TrainStep``.

    Example:
      >>> t, config = rk.target("h100"), rk.TrainConfig(2, 64, precision="mixed")
      >>> request = PresetSpec("tiny-gpt2", dropout=0.1)
      >>> cfg = model_config(request, config, "full", t)
      >>> train_step(request, cfg, config, t).rng_streams
      ('dropout',)
    """
    dropout = cfg.dropout_rate > 0.0
    module = build(cfg, deterministic=not dropout)
    streams = ("dropout",) if dropout else ()
    params = _abstract_params(
        cfg.replace(policy=rk.policies.NO_REMAT, schedule=rk.schedules.NO_SCHEDULE),
        config.micro_batch,
        config.seq,
    )
    if not (request.shard and sharded):
        return rk.build_train_step(module, config, rng_streams=streams, abstract_params=params)
    plan = rk.parse_shard(request.shard, t.devices)
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


#: The train config :meth:`PresetSource.n_layers` checks the sizes against: the depth is the
#: same at any batch and sequence length.
_SHAPES_ONLY = rk.TrainConfig(batch=1, seq=1)


def _check_lora(request: PresetSpec | HFSpec, config: rk.TrainConfig) -> None:
    # Adapters are trained alone: the train config must say so, and only where there are.
    if config.lora != (request.lora > 0):
        raise BadValue(
            f"lora={request.lora} with a train config of lora={config.lora}: "
            + (
                "adapters are trained alone, give rk.TrainConfig(lora=True)"
                if request.lora
                else "the model has no adapters to train: give it a LoRA rank (lora=16)"
            ),
            param="lora",
        )


def _in_regime(config: rk.TrainConfig) -> rk.TrainConfig:
    # Our models compute in a regime: a config that names none trains in the default one.
    return config if config.precision else dataclasses.replace(config, precision=regime_of(config))


def resolve(request: PresetSpec | HFSpec) -> PresetSource:
    """The source of a preset or a Hugging Face config (the presets' kinds' ``resolve``).

    Raises:
      BadValue: an unknown preset (with its close matches), before anything is built.
    """
    if isinstance(request, PresetSpec):
        get_config(request.model)  # an unknown preset is named before anything is built
    return PresetSource(request)


def catalogue() -> list[tuple[str, ModelConfig]]:
    """Every preset with its config (``remat-kit models``)."""
    return [(name, get_config(name)) for name in preset_names()]
