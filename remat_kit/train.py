"""The train step whose memory is measured: loss, optax optimizer, LoRA, accumulation.

Takes any Flax linen module mapping int tokens (batch, seq) to logits (batch, seq,
vocab) and builds a next-token-prediction train step from abstract shapes: the
parameter and optimizer-state shapes come from ``jax.eval_shape``, so a 70B model costs
no memory here. The step is what a user trains with, so its compiled peak is the
figure that decides whether training fits.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import traverse_util

from remat_kit.analysis import MemoryReport, nbytes

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
        close = difflib.get_close_matches(name, OPTIMIZERS, n=2)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(
            f"unknown optimizer {name!r}.{hint} Known: {', '.join(sorted(OPTIMIZERS))}"
        ) from None


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
        optimizer, batch, grad_accumulator.
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    donate_argnums: tuple[int, ...]
    loss_fn: Callable[..., Any]
    loss_args: tuple[Any, ...]
    breakdown: Mapping[str, int]


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
) -> TrainStep:
    """Builds the next-token train step of ``module`` from abstract shapes.

    Args:
      module: a linen Module, ``module.apply(params, tokens)`` -> logits.
      config: batch, sequence length, optimizer, LoRA, accumulation, donation.
      trainable: predicate on a parameter path (tuple of keys) deciding what is trained;
        default all parameters, or those with ``lora`` in the path when ``config.lora``.
      rng_seed: seed of the abstract init (shapes only; no values are computed).

    Returns:
      The TrainStep.

    Raises:
      ValueError: LoRA asked for but the module has no ``lora`` parameters, or nothing
        is trainable.

    Example:
      >>> import models, remat_kit as rk
      >>> cfg = models.get_config("tiny-llama", policy="full")
      >>> step = rk.build_train_step(models.build(cfg), rk.TrainConfig(batch=2, seq=16))
      >>> step.breakdown["weights"] == step.breakdown["gradients"]
      True
    """
    micro = jax.ShapeDtypeStruct((config.micro_batch, config.seq), jnp.int32)
    params = jax.eval_shape(module.init, jax.random.key(rng_seed), micro)
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

    def loss_fn(tr: Any, fr: Any, tokens: jax.Array, targets: jax.Array) -> jax.Array:
        merged = traverse_util.unflatten_dict({**_flat(tr), **_flat(fr)})
        return _cross_entropy(module.apply(merged, tokens), targets)

    grad_fn = jax.value_and_grad(loss_fn)
    accum, micro_b = config.accum, config.micro_batch

    def step(tr: Any, fr: Any, opt_state: Any, batch: Mapping[str, jax.Array]) -> Any:
        tokens, targets = batch["tokens"], batch["targets"]
        if accum == 1:
            loss, grads = grad_fn(tr, fr, tokens, targets)
        else:
            shaped = lambda x: x.reshape(accum, micro_b, *x.shape[1:])
            dtype = config.accum_dtype

            def one(carry: Any, mb: Any) -> Any:
                acc, total = carry
                loss, g = grad_fn(tr, fr, *mb)
                acc = jax.tree.map(lambda a, b: a + b.astype(a.dtype), acc, g)
                return (acc, total + loss), None

            zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, dtype or p.dtype), tr)
            (grads, loss), _ = jax.lax.scan(
                one, (zeros, jnp.zeros((), jnp.float32)), (shaped(tokens), shaped(targets))
            )
            grads = jax.tree.map(lambda g, p: (g / accum).astype(p.dtype), grads, tr)
            loss = loss / accum
        updates, opt_state = optimizer.update(grads, opt_state, tr)
        return optax.apply_updates(tr, updates), opt_state, loss

    tokens = jax.ShapeDtypeStruct((config.batch, config.seq), jnp.int32)
    batch = {"tokens": tokens, "targets": tokens}
    tr_nested, fr_nested = _nest(tr_abs), _nest(fr_abs)
    grad_bytes = nbytes(tr_nested)
    acc_bytes = 0
    if accum > 1:
        acc_dtype = config.accum_dtype
        acc_bytes = (
            grad_bytes
            if acc_dtype is None
            else sum(x.size * jnp.dtype(acc_dtype).itemsize for x in jax.tree.leaves(tr_nested))
        )
    breakdown = {
        "weights": nbytes(params),
        "trainable": grad_bytes,
        "gradients": grad_bytes,
        "optimizer": nbytes(opt_abs),
        "batch": nbytes(batch),
        "grad_accumulator": int(acc_bytes),
    }
    return TrainStep(
        fn=step,
        args=(tr_nested, fr_nested, opt_abs, batch),
        donate_argnums=(0, 2) if config.donate else (),
        loss_fn=lambda tr, fr, mb: loss_fn(tr, fr, mb["tokens"], mb["targets"]),
        loss_args=(tr_nested, fr_nested, {"tokens": micro, "targets": micro}),
        breakdown=breakdown,
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
