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
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import traverse_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from remat_kit import sharding as _sharding
from remat_kit.analysis import MemoryReport, nbytes
from remat_kit.errors import unknown
from remat_kit.targets import target as _target

__all__ = [
    "OPTIMIZERS",
    "TrainConfig",
    "TrainStep",
    "add_breakdown",
    "build_train_step",
    "make_optimizer",
]


def _sgd(lr: float) -> optax.GradientTransformation:
    return optax.sgd(lr)


def _sgd_momentum(lr: float) -> optax.GradientTransformation:
    return optax.sgd(lr, momentum=0.9)


def _adamw(lr: float) -> optax.GradientTransformation:
    return optax.adamw(lr, weight_decay=0.01)


#: Optimizer name -> factory of learning rate. adamw keeps two moments per weight (f32
#: when the weights are f32, else in the weights' dtype, as optax does).
OPTIMIZERS: Mapping[str, Callable[[float], optax.GradientTransformation]] = {
    "adamw": _adamw,
    "adam": optax.adam,
    "sgd": _sgd,
    "sgd_momentum": _sgd_momentum,
    "adafactor": optax.adafactor,
    "lion": optax.lion,
}


def make_optimizer(name: str, learning_rate: float = 1e-4) -> optax.GradientTransformation:
    """An optax optimizer by name (see ``OPTIMIZERS``).

    Raises:
      ValueError: unknown name (lists close matches).
    """
    try:
        return OPTIMIZERS[name](learning_rate)
    except KeyError:
        raise unknown("optimizer", name, OPTIMIZERS, n=2) from None


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How the step trains.

    Attributes:
      batch: sequences per optimizer step (global batch).
      seq: tokens per sequence.
      optimizer: a name in ``OPTIMIZERS``.
      learning_rate: the optimizer's learning rate.
      lora: train only parameters whose path contains ``lora`` (the model must have
        LoRA adapters, e.g. ``models.get_config(..., lora_rank=16)``); base weights
        are frozen and carry no gradient or optimizer state.
      accum: gradient accumulation: the batch is split into ``accum`` micro-batches run
        one after another in a ``lax.scan``; activations are those of one micro-batch.
      accum_dtype: dtype of the gradient accumulator (default: the gradients' dtype, as
        ``optax.MultiSteps`` does).
      donate: donate parameters and optimizer state so the update reuses their buffers.
    """

    batch: int
    seq: int
    optimizer: str = "adamw"
    learning_rate: float = 1e-4
    lora: bool = False
    accum: int = 1
    accum_dtype: Any = None
    donate: bool = True

    def __post_init__(self) -> None:
        for field in ("batch", "seq", "accum"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{field} must be an int, got {type(value).__name__} {value!r}")
            if value <= 0:
                raise ValueError(f"{field}={value} must be positive")
        if self.batch % self.accum:
            raise ValueError(
                f"batch={self.batch} does not split into accum={self.accum} equal micro-batches"
            )
        make_optimizer(self.optimizer, self.learning_rate)  # validate the name early

    @property
    def micro_batch(self) -> int:
        return self.batch // self.accum


@dataclasses.dataclass(frozen=True)
class TrainStep:
    """A train step ready for ``rk.memory_report(step.fn, *step.args, ...)``.

    Attributes:
      fn: ``fn(trainable, frozen, opt_state, batch) -> (trainable, opt_state, loss)``.
      args: abstract arguments (ShapeDtypeStructs) for ``fn``.
      donate_argnums: the trainable parameters and optimizer state when donating.
      loss_fn: ``loss_fn(trainable, frozen, micro_batch) -> loss``, one micro-batch: its
        residuals are what the policy keeps (see ``rk.saved_residuals``).
      loss_args: abstract arguments for ``loss_fn``.
      breakdown: bytes by role known from shapes: weights, trainable, gradients,
        optimizer, batch, grad_accumulator; per device when sharded.
      in_shardings: with a mesh plan, the NamedShardings of ``args`` (pass them to
        ``rk.memory_report(..., in_shardings=...)`` or ``jax.jit``); else None.
      out_shardings: with a mesh plan, the NamedShardings of ``fn``'s outputs; else None.
      plan: the ``rk.MeshPlan`` the step is sharded with, or None.
      mesh: the mesh the shardings live on, or None.
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
) -> TrainStep:
    """Builds the next-token train step of ``module`` from abstract shapes.

    Parameters may carry Flax logical-axis boxes (``nn.with_logical_partitioning``): the
    step's arguments are unboxed, and with ``sharding`` the boxes say how each is split.

    Args:
      module: a linen Module, ``module.apply(params, tokens)`` -> logits.
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

    Returns:
      The TrainStep.

    Raises:
      ValueError: LoRA asked for but the module has no ``lora`` parameters, or nothing
        is trainable; with ``sharding``: a mesh that does not match the plan, a batch or
        sequence the plan's axes do not divide, or a parameter dimension a mesh axis
        does not divide.

    Example:
      >>> import models, remat_kit as rk
      >>> cfg = models.get_config("tiny-llama", policy="full")
      >>> step = rk.build_train_step(models.build(cfg), rk.TrainConfig(batch=2, seq=16))
      >>> step.breakdown["weights"] == step.breakdown["gradients"]
      True
      >>> sharded = rk.build_train_step(models.build(cfg), rk.TrainConfig(batch=8, seq=16),
      ...                               sharding="fsdp:8", mesh=mesh)      # doctest: +SKIP
    """
    micro = jax.ShapeDtypeStruct((config.micro_batch, config.seq), jnp.int32)
    boxed = jax.eval_shape(module.init, jax.random.key(rng_seed), micro)
    params = _sharding.strip_boxes(boxed)
    flat = traverse_util.flatten_dict(params)
    if trainable is None:
        trainable = (
            (lambda path: any("lora" in str(k) for k in path))
            if config.lora
            else (lambda path: True)
        )
    train_keys = [k for k in flat if trainable(k)]
    if config.lora and not train_keys:
        raise ValueError(
            "LoRA asked for but the module has no parameter with 'lora' in its path; "
            "build the model with lora_rank > 0 (e.g. --lora 16)"
        )
    if not train_keys:
        raise ValueError("no trainable parameters: the trainable predicate matched nothing")
    tr_abs = {k: flat[k] for k in train_keys}
    fr_abs = {k: v for k, v in flat.items() if k not in tr_abs}
    optimizer = make_optimizer(config.optimizer, config.learning_rate)
    opt_abs = jax.eval_shape(optimizer.init, _nest(tr_abs))
    tokens = jax.ShapeDtypeStruct((config.batch, config.seq), jnp.int32)
    batch = {"tokens": tokens, "targets": tokens}
    tr_nested, fr_nested = _nest(tr_abs), _nest(fr_abs)

    plan, in_sh, out_sh = None, None, None
    tr_sh: Any = None
    context: Callable[[], Any] = contextlib.nullcontext
    if sharding is not None:
        plan, mesh = _plan_and_mesh(sharding, mesh)
        _check_batch(plan, config)
        p_sh = traverse_util.flatten_dict(_sharding.param_shardings(boxed, plan, mesh))
        tr_sh = _nest({k: p_sh[k] for k in tr_abs})
        fr_sh = _nest({k: p_sh[k] for k in fr_abs})
        opt_sh = _sharding.opt_state_shardings(opt_abs, tr_nested, tr_sh, mesh)
        b_sh = _sharding.batch_sharding(plan, mesh)
        in_sh = (tr_sh, fr_sh, opt_sh, {"tokens": b_sh, "targets": b_sh})
        out_sh = (tr_sh, opt_sh, NamedSharding(mesh, PartitionSpec()))
        context = lambda: plan.activation_context(mesh)

    def constrain(tree: Any) -> Any:
        # Gradients (and their accumulator) live where the parameters do: sharded under
        # fsdp (ZeRO-3), replicated under dp.
        return tree if tr_sh is None else jax.lax.with_sharding_constraint(tree, tr_sh)

    def loss_fn(tr: Any, fr: Any, tokens: jax.Array, targets: jax.Array) -> jax.Array:
        merged = traverse_util.unflatten_dict({**_flat(tr), **_flat(fr)})
        return _cross_entropy(module.apply(merged, tokens), targets)

    grad_fn = jax.value_and_grad(loss_fn)
    accum, micro_b = config.accum, config.micro_batch

    def step(tr: Any, fr: Any, opt_state: Any, batch: Mapping[str, jax.Array]) -> Any:
        with context():
            return _step(tr, fr, opt_state, batch)

    def _step(tr: Any, fr: Any, opt_state: Any, batch: Mapping[str, jax.Array]) -> Any:
        tokens, targets = batch["tokens"], batch["targets"]
        if accum == 1:
            loss, grads = grad_fn(tr, fr, tokens, targets)
            grads = constrain(grads)
        else:
            shaped = lambda x: x.reshape(accum, micro_b, *x.shape[1:])
            dtype = config.accum_dtype

            def one(carry: Any, mb: Any) -> Any:
                acc, total = carry
                loss, g = grad_fn(tr, fr, *mb)
                acc = constrain(jax.tree.map(lambda a, b: a + b.astype(a.dtype), acc, g))
                return (acc, total + loss), None

            zeros = constrain(jax.tree.map(lambda p: jnp.zeros(p.shape, dtype or p.dtype), tr))
            (grads, loss), _ = jax.lax.scan(
                one, (zeros, jnp.zeros((), jnp.float32)), (shaped(tokens), shaped(targets))
            )
            grads = jax.tree.map(lambda g, p: (g / accum).astype(p.dtype), grads, tr)
            loss = loss / accum
        updates, opt_state = optimizer.update(grads, opt_state, tr)
        return optax.apply_updates(tr, updates), opt_state, loss

    # Bytes by role; per device under a mesh plan (what one device holds of each).
    size = nbytes if in_sh is None else _sharding.per_device_bytes
    shard = (lambda i: ()) if in_sh is None else (lambda i: (in_sh[i],))
    grad_bytes = size(tr_nested, *shard(0))
    acc_bytes = 0
    if accum > 1:
        acc_dtype = config.accum_dtype
        acc_tree = (
            tr_nested
            if acc_dtype is None
            else jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, acc_dtype), tr_nested)
        )
        acc_bytes = size(acc_tree, *shard(0))
    breakdown = {
        "weights": grad_bytes + size(fr_nested, *shard(1)),
        "trainable": grad_bytes,
        "gradients": grad_bytes,
        "optimizer": size(opt_abs, *shard(2)),
        "batch": size(batch, *shard(3)),
        "grad_accumulator": int(acc_bytes),
    }

    def micro_loss(tr: Any, fr: Any, mb: Mapping[str, jax.Array]) -> jax.Array:
        with context():
            return loss_fn(tr, fr, mb["tokens"], mb["targets"])

    return TrainStep(
        fn=step,
        args=(tr_nested, fr_nested, opt_abs, batch),
        donate_argnums=(0, 2) if config.donate else (),
        loss_fn=micro_loss,
        loss_args=(tr_nested, fr_nested, {"tokens": micro, "targets": micro}),
        breakdown=breakdown,
        in_shardings=in_sh,
        out_shardings=out_sh,
        plan=plan,
        mesh=mesh if plan is not None else None,
    )


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
        raise ValueError(
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
        raise ValueError(
            f"{what} does not split over the data axes of {plan.spec} ({plan.data_size} ways): "
            f"use a batch that is a multiple of {plan.data_size * config.accum}"
        )
    tp = plan.size("tp")
    if config.seq % tp:
        raise ValueError(
            f"seq={config.seq} does not split over tp:{tp} (sequence parallelism between "
            f"blocks): use a sequence length that is a multiple of {tp}"
        )


def add_breakdown(report: MemoryReport, step: TrainStep) -> MemoryReport:
    """Adds the weights/gradients/optimizer/activations split to a train-step report.

    Weights, optimizer state, batch, gradients and accumulator come from the shapes;
    ``activations`` is the rest of the compiled peak: saved activations, recomputation
    workspace, logits and other temporaries.
    """
    parts = dict(step.breakdown)
    known = (
        parts["weights"]
        + parts["optimizer"]
        + parts["batch"]
        + parts["gradients"]
        + parts["grad_accumulator"]
    )
    parts["activations"] = report.peak_bytes - known
    return report.replace(breakdown=parts)


# Dict keys of flattened parameter paths cannot be tuples inside a jit argument pytree
# that users read; keep the nested form at the boundary and flatten inside.
def _nest(flat: Mapping[tuple[str, ...], Any]) -> Any:
    return traverse_util.unflatten_dict(dict(flat))


def _flat(tree: Any) -> dict[tuple[str, ...], Any]:
    return traverse_util.flatten_dict(tree) if tree else {}
