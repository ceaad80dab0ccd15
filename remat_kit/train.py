"""The train step whose memory is measured: loss, optax optimizer, LoRA, accumulation.

Takes any Flax linen module mapping int tokens (batch, seq) to logits (batch, seq,
vocab) and builds a next-token-prediction train step from abstract shapes: the
parameter and optimizer-state shapes come from ``jax.eval_shape``, so a 70B model costs
no memory here. The step is what a user trains with, so its compiled peak is the
figure that decides whether training fits.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import traverse_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from remat_kit import sharding as _sharding
from remat_kit.analysis import nbytes
from remat_kit.errors import BadType, BadValue
from remat_kit.optimizers import OPTIMIZERS, keeps_state, make_optimizer

# The precision regimes and the optimizers live in their own modules; re-exported beside the
# step they describe.
from remat_kit.precision import (
    DEFAULT_PRECISION,
    PRECISIONS,
    Precision,
    cast_floats,
    precision,
    regime,
    with_state_dtype,
)
from remat_kit.targets import target as _target

__all__ = [
    "DEFAULT_PRECISION",
    "OPTIMIZERS",
    "PRECISIONS",
    "Precision",
    "TrainConfig",
    "TrainStep",
    "build_train_step",
    "keeps_state",
    "logits_of",
    "make_optimizer",
    "planned_precision",
    "precision",
    "regime",
    "with_state_dtype",
]


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How the step trains.

    Attributes:
      batch: sequences per optimizer step (global batch).
      seq: tokens per sequence.
      optimizer: a name in ``OPTIMIZERS`` (any case: ``"AdamW"`` is ``"adamw"``).
      learning_rate: the optimizer's learning rate.
      lora: train only parameters whose path contains ``lora`` (the model must have
        LoRA adapters, e.g. ``models.get_config(..., lora_rank=16)``); base weights
        are frozen and carry no gradient or optimizer state.
      accum: gradient accumulation: the batch is split into ``accum`` micro-batches run
        one after another in a ``lax.scan``; activations are those of one micro-batch.
      accum_dtype: dtype of the gradient accumulator (default: the gradients' dtype, as
        ``optax.MultiSteps`` does).
      donate: donate parameters and optimizer state so the update reuses their buffers.
      precision: a regime name (``"mixed"``, ``"bf16"``, ``"bf16-f32-moments"``, ``"f32"``)
        or ``Precision``: the trained weights are cast to its ``params`` dtype, frozen ones
        to ``frozen``, the optimizer state kept in ``optimizer_state`` (gradients follow the
        weights). None (default): the module's own dtypes, optimizer state as optax makes
        it. ``models.measure`` (the CLI, the experiments) defaults to ``"mixed"``.
    """

    batch: int
    seq: int
    optimizer: str = "adamw"
    learning_rate: float = 1e-4
    lora: bool = False
    accum: int = 1
    accum_dtype: Any = None
    donate: bool = True
    precision: str | Precision | None = None

    def __post_init__(self) -> None:
        if self.precision is not None:
            object.__setattr__(self, "precision", precision(self.precision))
        for field in ("batch", "seq", "accum"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool):
                raise BadType(
                    f"{field} must be an int, got {type(value).__name__} {value!r}", param=field
                )
            if value <= 0:
                raise BadValue(f"{field}={value} must be positive", param=field)
        if self.batch % self.accum:
            raise BadValue(
                f"batch={self.batch} does not split into accum={self.accum} equal micro-batches",
                param="accum",
            )
        if isinstance(self.optimizer, str):
            # Names are lower case (as target names are read): "AdamW" is adamw.
            object.__setattr__(self, "optimizer", self.optimizer.strip().lower())
        make_optimizer(self.optimizer, self.learning_rate)  # validate the name early

    @property
    def micro_batch(self) -> int:
        return self.batch // self.accum


@dataclasses.dataclass(frozen=True)
class TrainStep:
    """A train step ready for ``rk.memory_report(step.fn, *step.args, ...)``.

    Attributes:
      fn: ``fn(trainable, frozen, opt_state, batch) -> (trainable, opt_state, loss)``;
        with ``rng_streams``, ``fn(trainable, frozen, opt_state, batch, rng)`` where ``rng``
        is a raw threefry key, uint32[2] (``jax.random.key_data(jax.random.key(0))``).
      args: abstract arguments (ShapeDtypeStructs) for ``fn``.
      donate_argnums: the trainable parameters and optimizer state when donating.
      loss_fn: ``loss_fn(trainable, frozen, micro_batch[, rng]) -> loss``, one micro-batch:
        its residuals are what the policy keeps (see ``rk.saved_residuals``).
      loss_args: abstract arguments for ``loss_fn``.
      breakdown: bytes by role known from shapes: weights, trainable, gradients,
        optimizer, batch, grad_accumulator; per device when sharded.
      in_shardings: with a mesh plan, the NamedShardings of ``args`` (pass them to
        ``rk.memory_report(..., in_shardings=...)`` or ``jax.jit``); else None.
      out_shardings: with a mesh plan, the NamedShardings of ``fn``'s outputs; else None.
      plan: the ``rk.MeshPlan`` the step is sharded with, or None.
      mesh: the mesh the shardings live on, or None.
      precision: the dtypes the step holds, read from its arguments' shapes: ``name``,
        ``params``, ``frozen``, ``grads``, ``optimizer_state`` (numpy names; ``"-"`` where
        there is none, ``a+b`` where leaves differ) and ``compute`` (the regime's, or
        ``"module's own"`` without one).
      rng_streams: the RNG streams (``"dropout"``) ``fn`` feeds the module from ``rng``.
      categories: argument index -> what it holds for the peak inspector (``rk.peak``'s
        ``parameter``, ``optimizer state``, ``input``); None: this module's layout
        ``(trainable, frozen, opt_state, batch)``; empty: unknown (a user's step whose
        roles were not given: no measured breakdown).
      loss_given: ``loss_fn`` is one micro-batch's loss. False: it is the whole step (a
        user's step given without its loss), whose trace names the tags and checkpoints
        but whose VJP is no backward pass: no residuals are read from it.
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    donate_argnums: tuple[int, ...]
    loss_fn: Callable[..., Any]
    loss_args: tuple[Any, ...]
    breakdown: Mapping[str, int]
    in_shardings: tuple[Any, ...] | None = None
    out_shardings: tuple[Any, ...] | None = None
    plan: _sharding.MeshPlan | None = None
    mesh: Mesh | None = None
    precision: Mapping[str, str] = dataclasses.field(default_factory=dict)
    rng_streams: tuple[str, ...] = ()
    categories: Mapping[int, str] | None = None
    loss_given: bool = True


def planned_precision(config: TrainConfig, *, own_compute: bool = False) -> dict[str, str] | None:
    """The precision record a step trained under ``config`` will have, before it is built:
    as tables and JSON name it (``TrainStep.precision``'s keys).

    Nothing is frozen in full training; sgd keeps no optimizer state (``"-"``, as the compiled
    step's record says it); a model of the user's computes in its own dtypes (the regime casts
    only its weights and optimizer state).

    Args:
      config: the train config.
      own_compute: the model is the user's code (``StepSource.own_model``).

    Returns:
      The record, or None when ``config`` names no regime (a user's step keeps its dtypes).

    Example:
      >>> planned_precision(TrainConfig(2, 32, optimizer="sgd", precision="bf16"))["frozen"]
      '-'
    """
    if config.precision is None:
        return None
    record = config.precision.to_dict()
    if not config.lora:
        record["frozen"] = "-"
    if not keeps_state(config.optimizer):
        record["optimizer_state"] = "-"
    if own_compute:
        record["compute"] = "module's own"
    return record


def _cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    # Upcast once for the log-softmax: bf16 log-probabilities lose the loss's precision.
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), targets
    ).mean()


def build_train_step(
    module: nn.Module,
    config: TrainConfig,
    *,
    trainable: Callable[[tuple[str, ...]], bool] | None = None,
    rng_seed: int = 0,
    sharding: _sharding.MeshPlan | str | None = None,
    mesh: Mesh | None = None,
    rng_streams: Sequence[str] = (),
    inputs: Callable[[jax.Array], Mapping[str, Any]] | None = None,
    output: Callable[[Any], jax.Array] | None = None,
    abstract_params: Any = None,
) -> TrainStep:
    """Builds the next-token train step of ``module`` from abstract shapes.

    Parameters may carry Flax logical-axis boxes (``nn.with_logical_partitioning``): the
    step's arguments are unboxed, and with ``sharding`` the boxes say how each is split.

    Args:
      module: a linen Module (or anything with linen's ``init``/``apply``, such as
        ``rk.tagging.TaggedModule``), ``module.apply(params, tokens, **inputs(tokens))`` ->
        logits, or an output ``output`` reads the logits from.
      config: batch, sequence length, optimizer, LoRA, accumulation, donation.
      trainable: predicate on a parameter path (tuple of keys) deciding what is trained;
        default all parameters, or those with ``lora`` in the path when ``config.lora``.
      rng_seed: seed of the abstract init (shapes only; no values are computed).
      sharding: a mesh plan (``"fsdp:8"``, ``"fsdp:4,tp:2"`` or ``rk.MeshPlan``): the step
        gets ``in_shardings``/``out_shardings`` for its arguments and outputs, constrains
        gradients like the parameters and the models' activations by the plan's rules, and
        its breakdown is per device. None: unsharded, as before.
      mesh: the plan's mesh (``plan.mesh(target)``, compile-only devices for a GPU target);
        default the local devices.
      rng_streams: RNG streams the module draws from in training, e.g. ``("dropout",)`` for
        a module built with dropout on (``models.build(cfg, deterministic=False)``). The
        step then takes a fifth argument, ``rng`` (raw uint32[2] key data), and gives each
        stream and micro-batch its own key folded from it, so a fixed ``rng`` gives the
        same masks under every policy and schedule.
      inputs: keyword arguments the module takes beside the tokens, made from them inside
        the step (e.g. ``rk.sources.hf_inputs``: Hugging Face's ``attention_mask`` and
        ``position_ids``); used for ``init`` too.
      output: the logits from what ``apply`` returns; default :func:`logits_of` (the array
        itself, an output's ``.logits``, or a tuple's first element).
      abstract_params: the module's variables as ``jax.eval_shape`` of its ``init`` gives them
        (boxes included), when the caller has them: a model under another policy or schedule
        lays out its parameters the same, and tracing ``init`` is a good part of a build.
        Default: traced here.

    Returns:
      The TrainStep.

    Raises:
      ValueError: LoRA asked for but the module has no ``lora`` parameters, or nothing
        is trainable; with ``sharding``: a mesh that does not match the plan, a batch or
        sequence the plan's axes do not divide, a parameter dimension a mesh axis
        does not divide, or ``cp`` for a module that splits no activation's sequence.

    Example:
      >>> import remat_kit_models as models, remat_kit as rk
      >>> cfg = models.get_config("tiny-llama", policy="full")
      >>> step = rk.build_train_step(models.build(cfg), rk.TrainConfig(batch=2, seq=16))
      >>> step.breakdown["weights"] == step.breakdown["gradients"]
      True
      >>> mesh = rk.parse_shard("fsdp:8").mesh(rk.target("h100", devices=8))
      >>> sharded = rk.build_train_step(models.build(cfg), rk.TrainConfig(batch=8, seq=16),
      ...                               sharding="fsdp:8", mesh=mesh)
      >>> sharded.plan.spec
      'fsdp:8'
    """
    micro = jax.ShapeDtypeStruct((config.micro_batch, config.seq), jnp.int32)
    extra = inputs if inputs is not None else (lambda tokens: {})
    read = output if output is not None else logits_of
    boxed = abstract_params
    if boxed is None:
        boxed = jax.eval_shape(
            lambda key, t: module.init(key, t, **extra(t)), jax.random.key(rng_seed), micro
        )
    tr_abs, fr_abs = _trained_and_frozen(_sharding.strip_boxes(boxed), config, trainable)
    streams = _check_streams(rng_streams)
    prec = config.precision
    optimizer = make_optimizer(config.optimizer, config.learning_rate)
    if prec is not None:
        tr_abs = cast_floats(tr_abs, prec.params)
        fr_abs = cast_floats(fr_abs, prec.frozen)
        optimizer = with_state_dtype(optimizer, prec.optimizer_state)
    opt_abs = jax.eval_shape(optimizer.init, _nest(tr_abs))
    tokens = jax.ShapeDtypeStruct((config.batch, config.seq), jnp.int32)
    batch = {"tokens": tokens, "targets": tokens}
    rng_abs = jax.ShapeDtypeStruct((2,), jnp.uint32)
    tr_nested, fr_nested = _nest(tr_abs), _nest(fr_abs)

    plan, in_sh, out_sh = None, None, None
    tr_sh: Any = None
    context: Callable[[], Any] = contextlib.nullcontext
    if sharding is not None:
        plan, mesh = _plan_and_mesh(sharding, mesh)
        _check_batch(plan, config)
        in_sh, out_sh = _step_shardings(boxed, plan, mesh, tr_abs, fr_abs, opt_abs, streams)
        tr_sh = in_sh[0]
        context = lambda: plan.activation_context(mesh)

    def constrain(tree: Any) -> Any:
        # Gradients (and their accumulator) live where the parameters do: sharded under
        # fsdp (ZeRO-3), replicated under dp.
        return tree if tr_sh is None else jax.lax.with_sharding_constraint(tree, tr_sh)

    def loss_fn(
        tr: Any, fr: Any, tokens: jax.Array, targets: jax.Array, key: jax.Array | None = None
    ) -> jax.Array:
        merged = traverse_util.unflatten_dict({**_flat(tr), **_flat(fr)})
        rngs = {} if key is None else {n: jax.random.fold_in(key, i) for i, n in enumerate(streams)}
        out = module.apply(merged, tokens, **extra(tokens), rngs=rngs)
        return _cross_entropy(read(out), targets)

    _step = _optimizer_step(jax.value_and_grad(loss_fn), optimizer, constrain, config)

    if streams:

        def step(tr: Any, fr: Any, opt_state: Any, batch: Any, rng: jax.Array) -> Any:
            with context():
                # Raw uint32 keys, not typed ones: every residual stays a plain array
                # that the memory tools can size.
                return _step(tr, fr, opt_state, batch, rng)

    else:

        def step(tr: Any, fr: Any, opt_state: Any, batch: Any) -> Any:
            with context():
                return _step(tr, fr, opt_state, batch, None)

    rng_in = (rng_abs,) if streams else ()
    breakdown = _breakdown((tr_nested, fr_nested, opt_abs, batch, *rng_in), in_sh, config)

    def micro_loss(tr: Any, fr: Any, mb: Mapping[str, jax.Array], *rng: jax.Array) -> jax.Array:
        with context():
            return loss_fn(tr, fr, mb["tokens"], mb["targets"], rng[0] if rng else None)

    rng_args = rng_in
    if plan is not None:
        # A model must split its sequence itself for cp: a trace, before any compile.
        micro_args = (tr_nested, fr_nested, {"tokens": micro, "targets": micro}, *rng_args)
        what = getattr(module, "spec", None) or type(module).__name__
        _sharding.check_sequence_split(micro_loss, micro_args, plan, config.seq, what)
    return TrainStep(
        fn=step,
        args=(tr_nested, fr_nested, opt_abs, batch, *rng_args),
        donate_argnums=(0, 2) if config.donate else (),
        loss_fn=micro_loss,
        loss_args=(tr_nested, fr_nested, {"tokens": micro, "targets": micro}, *rng_args),
        breakdown=breakdown,
        in_shardings=in_sh,
        out_shardings=out_sh,
        plan=plan,
        mesh=mesh if plan is not None else None,
        precision=_precision_record(prec, tr_nested, fr_nested, opt_abs),
        rng_streams=streams,
    )


def _optimizer_step(
    grad_fn: Callable[..., Any],
    optimizer: optax.GradientTransformation,
    constrain: Callable[[Any], Any],
    config: TrainConfig,
) -> Callable[..., Any]:
    """One optimizer step over a batch: ``(tr, fr, opt_state, batch, key) -> (tr, opt_state,
    loss)``.

    The gradient of the whole batch, or with ``config.accum`` > 1 the mean over that many
    micro-batches (a scan whose carry is the accumulator, in ``config.accum_dtype``; each
    micro-batch draws its own masks from ``key``, as a real accumulation loop does), then
    the optimizer's update. ``constrain`` places gradients where the parameters live.
    """
    accum, micro_b, dtype = config.accum, config.micro_batch, config.accum_dtype

    def run(tr: Any, fr: Any, opt_state: Any, batch: Any, key: jax.Array | None) -> Any:
        tokens, targets = batch["tokens"], batch["targets"]
        if accum == 1:
            loss, grads = grad_fn(tr, fr, tokens, targets, key)
            grads = constrain(grads)
        else:
            shaped = lambda x: x.reshape(accum, micro_b, *x.shape[1:])

            def one(carry: Any, mb: Any) -> Any:
                acc, total = carry
                toks, tgts, i = mb
                k = None if key is None else jax.random.fold_in(key, i)
                loss, g = grad_fn(tr, fr, toks, tgts, k)
                acc = constrain(jax.tree.map(lambda a, b: a + b.astype(a.dtype), acc, g))
                return (acc, total + loss), None

            zeros = constrain(jax.tree.map(lambda p: jnp.zeros(p.shape, dtype or p.dtype), tr))
            micro_batches = (shaped(tokens), shaped(targets), jnp.arange(accum))
            (grads, loss), _ = jax.lax.scan(one, (zeros, jnp.zeros((), jnp.float32)), micro_batches)
            grads = jax.tree.map(lambda g, p: (g / accum).astype(p.dtype), grads, tr)
            loss = loss / accum
        updates, opt_state = optimizer.update(grads, opt_state, tr)
        return optax.apply_updates(tr, updates), opt_state, loss

    return run


def _trained_and_frozen(
    params: Any, config: TrainConfig, trainable: Callable[[tuple[str, ...]], bool] | None
) -> tuple[dict[tuple[str, ...], Any], dict[tuple[str, ...], Any]]:
    """The parameters by path, split into those trained and those frozen.

    Raises:
      BadValue: LoRA asked for on a module without ``lora`` parameters; nothing trainable.
    """
    flat = traverse_util.flatten_dict(params)
    if trainable is None:
        trainable = (
            (lambda path: any("lora" in str(k) for k in path))
            if config.lora
            else (lambda path: True)
        )
    train_keys = [k for k in flat if trainable(k)]
    if config.lora and not train_keys:
        raise BadValue(
            "LoRA asked for but the module has no parameter with 'lora' in its path; "
            "build the model with lora_rank > 0 (e.g. lora_rank=16)",
            param="lora",
        )
    if not train_keys:
        raise BadValue("no trainable parameters: the trainable predicate matched nothing")
    trained = {k: flat[k] for k in train_keys}
    return trained, {k: v for k, v in flat.items() if k not in trained}


def _step_shardings(
    boxed: Any,
    plan: _sharding.MeshPlan,
    mesh: Mesh,
    trained: Mapping[tuple[str, ...], Any],
    frozen: Mapping[tuple[str, ...], Any],
    opt_abs: Any,
    streams: tuple[str, ...],
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The step's ``in_shardings`` (trained, frozen, optimizer state, batch[, key]) and
    ``out_shardings`` (trained, optimizer state, loss) under ``plan``: the parameters as
    their logical-axis boxes say, the optimizer state like the weights it follows."""
    p_sh = traverse_util.flatten_dict(_sharding.param_shardings(boxed, plan, mesh))
    tr_sh = _nest({k: p_sh[k] for k in trained})
    fr_sh = _nest({k: p_sh[k] for k in frozen})
    opt_sh = _sharding.opt_state_shardings(opt_abs, _nest(dict(trained)), tr_sh, mesh)
    b_sh = _sharding.batch_sharding(plan, mesh)
    in_sh: tuple[Any, ...] = (tr_sh, fr_sh, opt_sh, {"tokens": b_sh, "targets": b_sh})
    if streams:
        in_sh = (*in_sh, NamedSharding(mesh, PartitionSpec()))  # one key, replicated
    return in_sh, (tr_sh, opt_sh, NamedSharding(mesh, PartitionSpec()))


def _breakdown(
    args: tuple[Any, ...], in_sh: tuple[Any, ...] | None, config: TrainConfig
) -> dict[str, int]:
    """Bytes of the step's arguments by role (``TrainStep.breakdown``); per device under a
    mesh plan (what one device holds of each)."""
    trained, frozen, opt_abs, batch, *rng = args
    size = nbytes if in_sh is None else _sharding.per_device_bytes
    shard = (lambda i: ()) if in_sh is None else (lambda i: (in_sh[i],))
    grad_bytes = size(trained, *shard(0))
    acc_bytes = 0
    if config.accum > 1:
        acc_dtype = config.accum_dtype
        acc_tree = (
            trained
            if acc_dtype is None
            else jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, acc_dtype), trained)
        )
        acc_bytes = size(acc_tree, *shard(0))
    return {
        "weights": grad_bytes + size(frozen, *shard(1)),
        "trainable": grad_bytes,
        "gradients": grad_bytes,
        "optimizer": size(opt_abs, *shard(2)),
        # The dropout key is an input too (8 bytes), so the shapes' sum stays exact.
        "batch": size(batch, *shard(3)) + sum(nbytes(r) for r in rng),
        "grad_accumulator": int(acc_bytes),
    }


def logits_of(out: Any) -> jax.Array:
    """The logits in what a model returns: an array, ``.logits`` or a tuple's first item.

    Hugging Face Flax models return an output object (``.logits``) or, with
    ``return_dict=False``, a tuple whose first element is the logits.

    Args:
      out: the model's output.

    Returns:
      The logits array.

    Raises:
      BadValue: nothing in ``out`` looks like logits.

    Example:
      >>> logits_of((jnp.zeros((1, 2, 3)), None)).shape
      (1, 2, 3)
    """
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, (tuple, list)) and out and hasattr(out[0], "shape"):
        return out[0]
    if hasattr(out, "shape") and hasattr(out, "dtype"):
        return out
    raise BadValue(
        f"the model returned {type(out).__name__}, not logits: pass output= (a function from "
        "the model's output to the logits [batch, seq, vocab])"
    )


def _check_streams(rng_streams: Sequence[str]) -> tuple[str, ...]:
    if isinstance(rng_streams, str):
        raise BadValue(
            f"rng_streams={rng_streams!r} is a string; pass a sequence of stream names, "
            f"e.g. ({rng_streams!r},)"
        )
    streams = tuple(rng_streams)
    bad = [s for s in streams if not isinstance(s, str) or not s or s == "params"]
    if bad or len(set(streams)) != len(streams):
        raise BadValue(
            f"rng_streams={streams!r}: give distinct, non-empty stream names other than "
            "'params' (e.g. ('dropout',))"
        )
    return streams


def _dtype_names(tree: Any) -> str:
    # One name when the floating leaves agree, "a+b" when they do not, "-" with none.
    leaves = jax.tree.leaves(tree)
    found = sorted(
        {jnp.dtype(x.dtype).name for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)}
    )
    return "+".join(found) or "-"


def _precision_record(prec: Precision | None, tr: Any, fr: Any, opt: Any) -> dict[str, str]:
    return {
        "name": prec.name if prec is not None else "as built",
        "params": _dtype_names(tr),
        "frozen": _dtype_names(fr),
        "grads": _dtype_names(tr),
        "optimizer_state": _dtype_names(opt),
        "compute": prec.compute.name if prec is not None else "module's own",
    }


def _plan_and_mesh(
    sharding: _sharding.MeshPlan | str, mesh: Mesh | None
) -> tuple[_sharding.MeshPlan, Mesh]:
    if mesh is None:
        plan = _sharding.parse_shard(sharding)
        return plan, plan.mesh(_target("local", devices=plan.devices))
    plan = _sharding.parse_shard(sharding, mesh.size)
    got = dict(mesh.shape)
    if got != dict(plan.axes):
        want = ", ".join(f"{k}={n}" for k, n in plan.axes)
        raise BadValue(
            f"mesh axes {got} do not match the plan {plan.spec}: build the mesh with "
            f"plan.mesh(target) (axes {want})"
        )
    return plan, mesh


def _check_batch(plan: _sharding.MeshPlan, config: TrainConfig) -> None:
    if config.micro_batch % plan.data_size:
        what = (
            f"batch={config.batch}"
            if config.accum == 1
            else f"micro-batch {config.micro_batch} (batch={config.batch}, accum={config.accum})"
        )
        raise BadValue(
            f"{what} does not split over the data axes of {plan.spec} ({plan.data_size} ways): "
            f"use a batch that is a multiple of {plan.data_size * config.accum}",
            param="batch",
        )
    plan.check_seq(config.seq)  # over cp, else tp: context or sequence parallelism


def _nest(flat: Mapping[tuple[str, ...], Any]) -> Any:
    return traverse_util.unflatten_dict(dict(flat))


def _flat(tree: Any) -> dict[tuple[str, ...], Any]:
    return traverse_util.flatten_dict(tree) if tree else {}
