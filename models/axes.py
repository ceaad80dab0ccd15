"""Logical axis names on the models' parameters and activations (the names remat_kit shards).

Parameters carry Flax ``nn.with_logical_partitioning`` boxes naming what each dimension is
(``("embed", "heads", "head_dim")`` for a query kernel); activations get
``nn.with_logical_constraint`` at block boundaries and inside attention and the MLP. The names are
those of ``remat_kit.sharding.PARAM_AXES`` and ``ACTIVATION_AXES``; ``remat_kit.sharding.MeshPlan``
maps them to mesh axes. Outside a mesh plan (no Flax axis rules in context) the constraints do
nothing, so the models run unchanged on one device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax

__all__ = ["LOGITS_AXES", "RESIDUAL_AXES", "LogicalBox", "constrain", "partitioned"]

#: The residual stream between blocks: batch over the data axes, sequence over ``tp``
#: (Megatron sequence parallelism), width whole.
RESIDUAL_AXES = ("act_batch", "act_seq", "act_embed")
#: Logits: batch over the data axes, vocabulary over ``tp``.
LOGITS_AXES = ("act_batch", None, "act_vocab")


class LogicalBox(nn.LogicallyPartitioned):
    """``nn.LogicallyPartitioned`` that skips its sharding constraint on a value of another rank.

    ``nn.DenseGeneral`` initializes a kernel in a flat 2-D shape and reshapes the box after
    (its parameter shape check runs that initializer on every ``apply``): under a mesh, Flax's
    own box would constrain the flat kernel by the names of the 3-D one and fail.
    """

    def unbox(self, apply_constraint: bool = True) -> Any:
        rank = len(getattr(self.value, "shape", ()))
        return super().unbox(apply_constraint=apply_constraint and rank == len(self.names))


def partitioned(init: Callable[..., Any], names: Sequence[str | None]) -> Callable[..., Any]:
    """``init`` whose parameters carry the logical axis ``names`` (one per dimension).

    The same as ``nn.with_logical_partitioning(init, names)``, boxed in :class:`LogicalBox`.

    Example:
      >>> init = partitioned(nn.initializers.normal(0.02), ("embed", "mlp"))
      >>> box = jax.eval_shape(lambda key: init(key, (4, 8)), jax.random.key(0))
      >>> box.names, box.value.shape
      (('embed', 'mlp'), (4, 8))
    """
    names = tuple(names)

    @functools.wraps(init)
    def wrapper(*args: Any, **kwargs: Any) -> LogicalBox:
        return LogicalBox(init(*args, **kwargs), names)

    return wrapper


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """Constrains the sharding of activation ``x`` by logical axis ``names``.

    A no-op unless a mesh and axis rules covering every name are in context (see
    ``remat_kit.sharding.MeshPlan.activation_context``).

    Example:
      >>> x = jnp.ones((2, 3, 4))
      >>> constrain(x, ("act_batch", "act_seq", "act_embed")) is x  # no mesh here: unchanged
      True
    """
    return nn.with_logical_constraint(x, tuple(names), fallback=nn.spmd.RulesFallback.NO_CONSTRAINT)
