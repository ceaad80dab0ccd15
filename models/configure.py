"""The ``ModelConfig`` a preset request describes for one train config, policy and target.

:func:`model_config` turns a :class:`~remat_kit_models.source.PresetSpec` (or ``HFSpec``) and
an ``rk.TrainConfig`` into the config of the model the step trains: the precision regime's
dtypes, the attention kernel resolved for the target, the experts laid out for the mesh,
after the checks that need no trace (:func:`check_sizes`, :func:`cudnn_problem`).

Example:
  >>> from remat_kit_models.source import PresetSpec
  >>> config = rk.TrainConfig(4, 2048)
  >>> cfg = model_config(PresetSpec("llama3-8b"), config, "full", rk.target("h100"))
  >>> cfg.n_layers, cfg.attention
  (32, 'cudnn')
"""

from __future__ import annotations

from typing import Any

import jax

import remat_kit as rk
import remat_kit_models as models
from remat_kit.errors import BadValue
from remat_kit_models import get_config
from remat_kit_models import hf as _hf
from remat_kit_models.config import ModelConfig, blame_overrides
from remat_kit_models.spec import HFSpec, PresetSpec

__all__ = [
    "ABSURD_FACTOR",
    "MAX_TOKENS",
    "check_sizes",
    "cudnn_problem",
    "model_config",
    "regime_of",
    "resolve_attention",
]


def resolve_attention(
    requested: str,
    target: rk.Target,
    cfg: ModelConfig | None = None,
    seq: int | None = None,
    cp: int = 1,
) -> str:
    """``auto`` -> ``cudnn`` where flash attention compiles for ``target``, else ``xla``.

    With ``cfg``, ``auto`` also falls back to ``xla`` where cuDNN's kernel cannot serve
    the model (f32 compute, attention dropout, a head size it does not tile); with ``seq``
    as well, where it cannot train that sequence length (see :func:`cudnn_problem`).

    Args:
      requested: ``"auto"``, ``"cudnn"`` or ``"xla"``.
      target: where the step is compiled for.
      cfg: the model, when known.
      seq: tokens per sequence, when known.
      cp: devices each sequence is split over (context parallelism).

    Returns:
      ``"cudnn"`` or ``"xla"``.

    Raises:
      BadValue: ``cudnn`` asked for a target that cannot run it, or for a model or
        sequence length its kernel rejects (the message names the rule).

    Example:
      >>> resolve_attention("auto", rk.target("cpu"))
      'xla'
    """
    if requested == "auto":
        usable = cfg is None or (
            jax.numpy.dtype(cfg.dtype).itemsize == 2
            and cfg.dropout_rate == 0.0
            and cudnn_problem(cfg, seq, target, cp) is None
        )
        return "cudnn" if usable and rk.cudnn_attention_available(target) else "xla"
    if requested == "cudnn" and not rk.cudnn_attention_available(target):
        raise BadValue(
            "attention='cudnn' needs an NVIDIA target with compute capability >= 8.0 and the "
            f"cuDNN wheel (pip install 'jax[cuda12]'); {target.name} has neither: "
            "use attention='xla'",
            param="attention",
        )
    if requested == "cudnn" and cfg is not None:
        problem = cudnn_problem(cfg, seq, target, cp)
        if problem is not None:
            raise BadValue(
                f"attention='cudnn' cannot train {cfg.name}: {problem}", param="attention"
            )
    return requested


def cudnn_problem(cfg: ModelConfig, seq: int | None, target: rk.Target, cp: int = 1) -> str | None:
    """Why cuDNN flash attention would reject training ``cfg`` at ``seq`` tokens, or None.

    jax checks the shapes when it traces ``jax.nn.dot_product_attention(implementation=
    "cudnn")`` (``check_is_flash_attention`` in jax/_src/cudnn/fused_attention_stablehlo.py,
    jax 0.10) and raises ``NotImplementedError`` deep in the trace; these are its rules for
    bf16/f16 training, checked here first so the CLI can fall back or say why:

    - the head size must be a multiple of 8 and at most 128 (256 on a Hopper GPU jax runs
      on; a deviceless compile runs on the CPU backend, so jax checks 128);
    - the training kernel always receives a (possibly empty) bias operand, and with a bias
      both sequence lengths must be even; under context parallelism each device's queries
      (``seq / cp``) are one of them (``models.attention.flash_attention``).

    Args:
      cfg: the model.
      seq: tokens per sequence (None: not checked).
      target: the target (a local Hopper GPU allows larger heads).
      cp: devices each sequence is split over (context parallelism).

    Returns:
      One phrase naming the rule and the value, or None when cuDNN accepts the shapes.

    Example:
      >>> cudnn_problem(get_config("llama3-8b"), 2047, rk.target("h100"))[:46]
      'its training kernel needs an even sequence len'
    """
    cc = tuple(target.compute_capability or (0, 0))
    head_max = 256 if target.kind == "local" and cc >= (9, 0) else 128
    h = cfg.dim_per_head
    if h % 8 or h > head_max:
        return (
            f"its kernel needs a head size that is a multiple of 8 and at most {head_max} "
            f"(got {h} = width {cfg.d_model} / {cfg.n_heads} heads): use attention='xla'"
        )
    if seq is not None and seq % 2:
        return (
            f"its training kernel needs an even sequence length (got seq={seq}): use seq="
            f"{seq - 1} or {seq + 1}, or attention='xla'"
        )
    if seq is not None and cp > 1 and seq % cp == 0 and (seq // cp) % 2:
        below = seq // (2 * cp) * (2 * cp)
        near = " or ".join(str(n) for n in (below, below + 2 * cp) if n > 0)
        return (
            f"its training kernel needs an even number of tokens per device (got seq={seq} "
            f"over cp:{cp}: {seq // cp}): use seq={near}, or attention='xla'"
        )
    return None


def regime_of(config: rk.TrainConfig) -> rk.train.Precision:
    """The precision regime a preset trains in: the train config's, else the default
    (``rk.train.DEFAULT_PRECISION``, ``"mixed"``): our models always compute in a regime."""
    return config.precision or rk.train.precision(rk.train.DEFAULT_PRECISION)


def model_config(
    spec: PresetSpec | HFSpec,
    config: rk.TrainConfig,
    policy: rk.policies.PolicyLike,
    target: rk.Target,
    schedule: Any = rk.schedules.NO_SCHEDULE,
) -> ModelConfig:
    """The ModelConfig a preset request trains under ``policy`` and ``schedule`` on
    ``target`` (attention resolved, experts laid out for the mesh, sizes checked).

    Args:
      spec: a ``PresetSpec`` or ``HFSpec`` (``remat_kit_models.source``).
      config: the train config: its regime sets the weights' and compute dtypes; its batch,
        sequence and accumulation are checked against the model.
      policy: the policy the model's blocks are built with.
      target: where the step is compiled for.
      schedule: the layer schedule.

    Returns:
      The ModelConfig.

    Raises:
      BadValue: an override, dtype, attention kernel or size no compile can serve.
    """
    extra: dict[str, Any] = dict(spec.overrides)
    regime = regime_of(config)
    extra["param_dtype"] = regime.params
    extra["dtype"] = regime.compute
    if spec.dropout is not None:
        extra["dropout_rate"] = spec.dropout
    cfg = _config(
        spec,
        config.seq,
        policy=policy,
        schedule=schedule,
        scan_layers=spec.scan_layers,
        attention="xla",
        lora_rank=spec.lora,
        **extra,
    )
    cfg = cfg.replace(
        attention=resolve_attention(spec.attention, target, cfg, config.seq, _cp(spec, target))
    )
    cfg = _experts_for_mesh(spec, cfg, target)
    if config.seq > cfg.max_seq_len and cfg.family == "gpt2":
        raise BadValue(
            f"seq={config.seq} exceeds {spec.name}'s learned positions ({cfg.max_seq_len}); "
            f"use seq <= {cfg.max_seq_len} or a larger max_seq_len",
            param="seq",
        )
    if config.seq > cfg.max_seq_len and "max_seq" in dict(spec.overrides):
        # Rotary models have no position table, so the length would be ignored: say so.
        raise BadValue(
            f"max_seq_len={cfg.max_seq_len} is below seq={config.seq}: the step trains on seq "
            f"tokens; set max_seq_len >= {config.seq} or drop it",
            param="max_seq_len",
        )
    check_sizes(config, cfg, target)
    return cfg


#: A step whose single tensor exceeds this many times the device's memory is a typo, not a
#: plan: XLA fails on such programs with INTERNAL errors ("Couldn't find output tile sizes")
#: after minutes of compiling, or compiles a figure no one can use.
ABSURD_FACTOR = 1000

#: Tokens per step at which XLA's 32-bit indexing of a batch x sequence dimension breaks.
MAX_TOKENS = 2**31


def check_sizes(config: rk.TrainConfig, cfg: ModelConfig, target: rk.Target) -> None:
    """Rejects sizes no compile can serve, from shapes alone (no trace, no compile).

    Three rules: ``batch x seq`` below 2**31 tokens (XLA indexes them with 32 bits: at 2**32
    it fails with "Couldn't find output tile sizes"); the logits of one micro-batch and the
    weights, spread over the target's devices, each under ``ABSURD_FACTOR`` times the
    device's memory (1 TiB stands in for a CPU target's).

    Args:
      config: the batch, sequence and accumulation.
      cfg: the model.
      target: the target (its memory and device count).

    Raises:
      BadValue: naming the sizes, the figure and the limit.

    Example:
      >>> config = rk.TrainConfig(batch=10**9, seq=512)
      >>> check_sizes(config, get_config("gpt2-small"), rk.target("h100"))
      Traceback (most recent call last):
      remat_kit.errors.BadValue: batch=1000000000 x seq=512 is 512000000000 tokens per step, ...
    """
    tokens = config.batch * config.seq
    if tokens >= MAX_TOKENS:
        raise BadValue(
            f"batch={config.batch} x seq={config.seq} is {tokens} tokens per step, more than XLA "
            f"indexes with 32-bit integers (2**31 = {MAX_TOKENS}): use a smaller batch or "
            "seq (rk.max_batch finds the largest batch that fits)",
            param="batch",
        )
    memory = target.memory_bytes or 2**40
    limit = ABSURD_FACTOR * memory
    where = f"{target.name}'s {memory / 2**30:.0f} GiB" if target.memory_bytes else "1 TiB"
    devices = max(target.devices, 1)
    # f32 logits of one micro-batch: the largest activation of a language model's step.
    logits = tokens // max(config.accum, 1) * cfg.vocab_size * 4 // devices
    if logits > limit:
        raise BadValue(
            f"batch={config.batch} x seq={config.seq} x vocab={cfg.vocab_size}: the logits alone "
            f"are {_human(logits)} per device, more than {ABSURD_FACTOR}x {where}: use a "
            "smaller batch or seq (rk.max_batch finds the largest batch that fits)",
            param="batch",
        )
    weights = cfg.param_count() * jax.numpy.dtype(cfg.param_dtype).itemsize // devices
    if weights > limit:
        raise BadValue(
            f"{cfg.name} with these overrides has {cfg.param_count():.3g} parameters: "
            f"{_human(weights)} of weights per device, more than {ABSURD_FACTOR}x {where}: "
            "check n_layers, d_model, d_ff and vocab_size"
        )


def _cp(spec: PresetSpec | HFSpec, target: rk.Target) -> int:
    # The plan's context-parallel size on the target (1 without; a plan that does not fit
    # the target is named by the mesh's own check).
    if not spec.shard:
        return 1
    try:
        return rk.parse_shard(spec.shard, target.devices).size("cp")
    except BadValue:
        return 1


def _experts_for_mesh(
    spec: PresetSpec | HFSpec, cfg: ModelConfig, target: rk.Target
) -> ModelConfig:
    """Under ``ep``: the experts must split evenly, and they run as capacity einsums unless
    the caller chose ragged ones.

    XLA's SPMD partitioner turns the capacity dispatch's einsums over expert-split weights
    into all-to-alls (GShard); it has no expert-parallel partitioning of ``ragged_dot``, whose
    expert-split weights it all-gathers whole on every device of the group.
    """
    if not spec.shard:
        return cfg
    try:
        plan = rk.parse_shard(spec.shard, target.devices)
    except BadValue:
        return cfg  # named by the mesh's own check
    if plan.size("ep") == 1:
        return cfg
    plan.check_experts(cfg.n_experts)
    if cfg.moe_impl == "ragged" and "moe_impl" not in dict(spec.overrides):
        return cfg.replace(moe_impl="capacity")
    return cfg


def _human(nbytes: float) -> str:
    for unit, size in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30)):
        if nbytes >= size:
            return f"{nbytes / size:.0f} {unit}"
    return f"{nbytes / 2**20:.0f} MiB"


def _config(spec: PresetSpec | HFSpec, seq: int, **fields: Any) -> ModelConfig:
    # The preset's config, or the Hugging Face config's, with the fields model_config sets.
    if isinstance(spec, PresetSpec):
        return get_config(spec.model, **fields)
    cfg = _hf.from_hf_config(spec.hf_config, name=spec.name)
    changes = {models.OVERRIDES.get(k, k): v for k, v in fields.items() if v is not None}
    if "d_model" in changes and "head_dim" not in changes:
        changes["head_dim"] = None
    with blame_overrides(changes):
        cfg = cfg.replace(**changes)
    if seq > cfg.max_seq_len:
        raise BadValue(
            f"seq={seq} is longer than {spec.name} attends to ({cfg.max_seq_len}: "
            "max_position_embeddings, or sliding_window, whose effect is not modelled): "
            f"use seq <= {cfg.max_seq_len}",
            param="seq",
        )
    return cfg
