"""The optimizers a train step updates with, by name (optax's), and what state each keeps."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import optax

from remat_kit.errors import unknown

__all__ = [
    "OPTIMIZERS",
    "keeps_state",
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
        raise unknown("optimizer", name, OPTIMIZERS, n=2, param="optimizer") from None


def keeps_state(optimizer: str) -> bool:
    """Whether ``optimizer`` keeps floating-point state per weight (sgd keeps none).

    Example:
      >>> keeps_state("adamw"), keeps_state("sgd")
      (True, False)
    """
    tx = make_optimizer(optimizer)
    state = jax.eval_shape(tx.init, {"w": jax.ShapeDtypeStruct((2,), jnp.float32)})
    return any(jnp.issubdtype(x.dtype, jnp.floating) for x in jax.tree.leaves(state))
