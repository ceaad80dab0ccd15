"""Which model, at what size and precision, trained how: the options every measurement takes.

:class:`Options` is what a user asks for (a preset, a Hugging Face config or a factory, the
batch, the optimizer, the precision, ...); :func:`model_config` turns it into the
``ModelConfig`` of a preset or Hugging Face model under a policy for a target, after the checks
that need no trace (:func:`check_sizes`, :func:`cudnn_problem`).

Example:
  >>> opts = Options("llama3-8b", 4, 2048, optimizer="sgd")
  >>> model_config(opts, "full", rk.target("h100")).n_layers
  32
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

import remat_kit as rk
import remat_kit_models as models
from remat_kit.errors import BadValue
from remat_kit_models import get_config
from remat_kit_models import hf as _hf
from remat_kit_models.config import ModelConfig, as_dtype, blame_overrides

__all__ = [
    "ABSURD_FACTOR",
    "MAX_TOKENS",
    "Options",
    "check_sizes",
    "cudnn_problem",
    "model_config",
    "precision_of",
    "resolve_attention",
]


@dataclasses.dataclass(frozen=True)
class Options:
    """What a user sets on the command line besides the policy and target.

    ``overrides`` holds model overrides (``layers``, ``width``, ...); ``lora`` is the
    LoRA rank (0: full fine-tuning). ``shard`` is a mesh plan (``"fsdp:8"``,
    ``"fsdp:4,tp:2"``; see ``rk.parse_shard``) over the target's devices: the step is
    compiled sharded and every figure is what one device holds. ``batch`` stays the global
    batch (per device: ``batch / plan.data_size``).

    ``precision`` names the regime (``rk.train.PRECISIONS``; default ``"mixed"``: f32
    master weights, gradients and optimizer state, bf16 compute; LoRA base weights bf16).
    ``param_dtype`` is the older way to say it (``f32`` = ``mixed``, ``bf16`` = ``bf16``)
    and ``dtype`` overrides the compute dtype; see :func:`precision_of`. ``dropout``
    overrides the preset's dropout rate; where the rate is above 0 the step trains with
    dropout on (a dropout key per step).

    The model comes from one of three sources: ``model`` a preset name; ``hf_config`` a
    Hugging Face ``config.json`` mapped onto our decoder (``models.hf``; ``model`` is then its
    label); or ``model`` a factory ``path/file.py:NAME`` / ``package.module:NAME`` called as
    ``NAME(policy)`` (``rk.sources``), with ``block`` a ``module:Class`` to rematerialize by
    patching, and ``tags`` the rules naming its projections (``rk.tagging.rules``; ``none``:
    the model's own tags only). ``strict``: a name-based policy that matches no tag of the
    traced program is an error (the CLI), not a warning. ``depth``: how an unrolled model
    is compiled (``rk.sources.measure``'s ``depth``: ``auto`` from shallow copies, ``full``,
    ``check``).

    ``step``: a train step of the user's own, ``file.py:NAME`` (``rk.sources.from_step``),
    measured instead of the step remat_kit builds; ``model`` is then the same spec (the name
    in titles), and the options that shape our model or step do not apply.
    """

    model: str
    batch: int
    seq: int
    optimizer: str = "adamw"
    lora: int = 0
    accum: int = 1
    param_dtype: str | None = None
    dtype: str | None = None
    attention: str = "auto"
    scan_layers: bool = True
    overrides: tuple[tuple[str, Any], ...] = ()
    shard: str | None = None
    precision: str | None = None
    dropout: float | None = None
    hf_config: str | None = None
    block: str | None = None
    tags: str = "auto"
    strict: bool = False
    depth: str = "auto"
    step: str | None = None

    def train_config(self) -> rk.TrainConfig:
        return rk.TrainConfig(
            batch=self.batch,
            seq=self.seq,
            optimizer=self.optimizer,
            lora=self.lora > 0,
            accum=self.accum,
            # A user's step keeps its own dtypes: its config names no regime.
            precision=None if self.step else precision_of(self),
        )

    def precision_regime(self) -> rk.train.Precision:
        """The precision regime these options train in (see :func:`precision_of`)."""
        return precision_of(self)

    def precision_record(self) -> dict[str, str] | None:
        """The regime as tables and JSON name it (``rk.render.precision_words`` reads it).

        Nothing is frozen in full training; a factory's model computes in its own dtypes (the
        regime casts only its weights and optimizer state), as ``report`` states. None for a
        user's step: its dtypes are its own (a report reads them off its arguments' roles).
        """
        if self.step:
            return None
        record = precision_of(self).to_dict()
        if not self.lora:
            record["frozen"] = "-"
        if not _keeps_state(self.optimizer):
            # As the compiled step's record says it (sgd): no state, not state in some dtype.
            record["optimizer_state"] = "-"
        if self.names_factory:
            record["compute"] = "module's own"
        return record

    @property
    def names_factory(self) -> bool:
        """Whether ``model`` names a factory (``file.py:NAME``, ``package.module:NAME``), or
        a user's step (``step``): code of the user's, with tag names of its own."""
        return self.hf_config is None and ":" in self.model


def _keeps_state(optimizer: str) -> bool:
    """Whether ``optimizer`` keeps floating-point state per weight (sgd keeps none)."""
    import jax
    import jax.numpy as jnp

    tx = rk.train.make_optimizer(optimizer)
    state = jax.eval_shape(tx.init, {"w": jax.ShapeDtypeStruct((2,), jnp.float32)})
    return any(jnp.issubdtype(x.dtype, jnp.floating) for x in jax.tree.leaves(state))


#: ``--param-dtype`` without ``--precision``: the regime whose weights have that dtype.
_PARAM_DTYPE_REGIMES = {"float32": "mixed", "bfloat16": "bf16"}


def precision_of(opts: Options) -> rk.train.Precision:
    """The precision regime ``opts`` trains in.

    ``opts.precision`` names it (default ``rk.train.DEFAULT_PRECISION``, ``"mixed"``);
    ``opts.param_dtype`` alone picks the regime with those weights (``f32`` -> ``mixed``,
    ``bf16`` -> ``bf16``), and must agree with ``opts.precision`` when both are given;
    ``opts.dtype`` replaces the compute dtype (the regime is then ``"custom"``).

    Args:
      opts: the options.

    Returns:
      The ``rk.train.Precision``.

    Raises:
      BadValue: an unknown regime or dtype, or a ``param_dtype`` the regime contradicts.

    Example:
      >>> precision_of(Options("llama3-8b", 4, 2048, param_dtype="f32")).name
      'mixed'
    """
    name = opts.precision
    if opts.param_dtype:
        weights = as_dtype(opts.param_dtype)
        by_dtype = _PARAM_DTYPE_REGIMES.get(jax.numpy.dtype(weights).name)
        if by_dtype is None:
            raise BadValue(
                f"param_dtype={opts.param_dtype!r}: use bf16 or f32 (or a precision: "
                f"{', '.join(rk.train.PRECISIONS)})",
                param="param_dtype",
            )
        if name is not None and rk.train.precision(name).params != jax.numpy.dtype(weights):
            raise BadValue(
                f"param_dtype={opts.param_dtype} contradicts precision={name} (weights "
                f"{rk.train.precision(name).params.name}): drop param_dtype, or use "
                f"precision={by_dtype}",
                param="param_dtype",
            )
        name = name or by_dtype
    regime = rk.train.precision(name or rk.train.DEFAULT_PRECISION)
    if opts.dtype and jax.numpy.dtype(as_dtype(opts.dtype)) != regime.compute:
        regime = regime.replace(compute=as_dtype(opts.dtype))
    return regime


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


def model_config(
    opts: Options, policy: rk.policies.PolicyLike, target: rk.Target, schedule: Any = "none"
) -> ModelConfig:
    """The ModelConfig an Options + policy + schedule + target describe (attention resolved).

    The weights and compute dtypes are the precision regime's (:func:`precision_of`).
    """
    extra: dict[str, Any] = dict(opts.overrides)
    regime = precision_of(opts)
    extra["param_dtype"] = regime.params
    extra["dtype"] = regime.compute
    if opts.dropout is not None:
        extra["dropout_rate"] = opts.dropout
    cfg = _config(
        opts,
        policy=policy,
        schedule=schedule,
        scan_layers=opts.scan_layers,
        attention="xla",
        lora_rank=opts.lora,
        **extra,
    )
    cfg = cfg.replace(
        attention=resolve_attention(opts.attention, target, cfg, opts.seq, _cp(opts, target))
    )
    cfg = _experts_for_mesh(opts, cfg, target)
    if opts.seq > cfg.max_seq_len and cfg.family == "gpt2":
        raise BadValue(
            f"seq={opts.seq} exceeds {opts.model}'s learned positions ({cfg.max_seq_len}); "
            f"use seq <= {cfg.max_seq_len} or a larger max_seq_len",
            param="seq",
        )
    if opts.seq > cfg.max_seq_len and "max_seq" in dict(opts.overrides):
        # Rotary models have no position table, so the length would be ignored: say so.
        raise BadValue(
            f"max_seq_len={cfg.max_seq_len} is below seq={opts.seq}: the step trains on seq "
            f"tokens; set max_seq_len >= {opts.seq} or drop it",
            param="max_seq_len",
        )
    check_sizes(opts, cfg, target)
    return cfg


#: A step whose single tensor exceeds this many times the device's memory is a typo, not a
#: plan: XLA fails on such programs with INTERNAL errors ("Couldn't find output tile sizes")
#: after minutes of compiling, or compiles a figure no one can use.
ABSURD_FACTOR = 1000

#: Tokens per step at which XLA's 32-bit indexing of a batch x sequence dimension breaks.
MAX_TOKENS = 2**31


def check_sizes(opts: Options, cfg: ModelConfig, target: rk.Target) -> None:
    """Rejects sizes no compile can serve, from shapes alone (no trace, no compile).

    Three rules: ``batch x seq`` below 2**31 tokens (XLA indexes them with 32 bits: at 2**32
    it fails with "Couldn't find output tile sizes"); the logits of one micro-batch and the
    weights, spread over the target's devices, each under ``ABSURD_FACTOR`` times the
    device's memory (1 TiB stands in for a CPU target's).

    Args:
      opts: batch, sequence and options.
      cfg: the model.
      target: the target (its memory and device count).

    Raises:
      BadValue: naming the sizes, the figure and the limit.

    Example:
      >>> opts = Options("gpt2-small", batch=10**9, seq=512)
      >>> check_sizes(opts, get_config("gpt2-small"), rk.target("h100"))
      Traceback (most recent call last):
      remat_kit.errors.BadValue: batch=1000000000 x seq=512 is 512000000000 tokens per step, ...
    """
    tokens = opts.batch * opts.seq
    if tokens >= MAX_TOKENS:
        raise BadValue(
            f"batch={opts.batch} x seq={opts.seq} is {tokens} tokens per step, more than XLA "
            f"indexes with 32-bit integers (2**31 = {MAX_TOKENS}): use a smaller batch or "
            "seq (rk.max_batch finds the largest batch that fits)",
            param="batch",
        )
    memory = target.memory_bytes or 2**40
    limit = ABSURD_FACTOR * memory
    where = f"{target.name}'s {memory / 2**30:.0f} GiB" if target.memory_bytes else "1 TiB"
    devices = max(target.devices, 1)
    # f32 logits of one micro-batch: the largest activation of a language model's step.
    logits = tokens // max(opts.accum, 1) * cfg.vocab_size * 4 // devices
    if logits > limit:
        raise BadValue(
            f"batch={opts.batch} x seq={opts.seq} x vocab={cfg.vocab_size}: the logits alone "
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


def _cp(opts: Options, target: rk.Target) -> int:
    # The plan's context-parallel size on the target (1 without; a plan that does not fit
    # the target is named by the mesh's own check).
    if not opts.shard:
        return 1
    try:
        return rk.parse_shard(opts.shard, target.devices).size("cp")
    except BadValue:
        return 1


def _experts_for_mesh(opts: Options, cfg: ModelConfig, target: rk.Target) -> ModelConfig:
    """Under ``ep``: the experts must split evenly, and they run as capacity einsums unless
    the caller chose ragged ones.

    XLA's SPMD partitioner turns the capacity dispatch's einsums over expert-split weights
    into all-to-alls (GShard); it has no expert-parallel partitioning of ``ragged_dot``, whose
    expert-split weights it all-gathers whole on every device of the group.
    """
    if not opts.shard:
        return cfg
    try:
        plan = rk.parse_shard(opts.shard, target.devices)
    except BadValue:
        return cfg  # named by the mesh's own check
    if plan.size("ep") == 1:
        return cfg
    plan.check_experts(cfg.n_experts)
    if cfg.moe_impl == "ragged" and "moe_impl" not in dict(opts.overrides):
        return cfg.replace(moe_impl="capacity")
    return cfg


def _human(nbytes: float) -> str:
    for unit, size in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30)):
        if nbytes >= size:
            return f"{nbytes / size:.0f} {unit}"
    return f"{nbytes / 2**20:.0f} MiB"


def _config(opts: Options, **fields: Any) -> ModelConfig:
    # The preset's config, or the Hugging Face config's, with the fields model_config sets.
    if opts.names_factory:
        raise BadValue(
            f"{opts.model} is a factory: it builds its own model, there is no ModelConfig",
            param="model",
        )
    if opts.hf_config is None:
        return get_config(opts.model, **fields)
    cfg = _hf.from_hf_config(opts.hf_config, name=opts.model)
    changes = {models.OVERRIDES.get(k, k): v for k, v in fields.items() if v is not None}
    if "d_model" in changes and "head_dim" not in changes:
        changes["head_dim"] = None
    with blame_overrides(changes):
        cfg = cfg.replace(**changes)
    if opts.seq > cfg.max_seq_len:
        raise BadValue(
            f"seq={opts.seq} is longer than {opts.model} attends to ({cfg.max_seq_len}: "
            "max_position_embeddings, or sliding_window, whose effect is not modelled): "
            f"use seq <= {cfg.max_seq_len}",
            param="seq",
        )
    return cfg
