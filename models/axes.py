"""Logical axis names on the models' parameters and activations (the names remat_kit shards).

Parameters carry Flax ``nn.with_logical_partitioning`` boxes naming what each dimension is
(``("embed", "heads", "head_dim")`` for a query kernel); activations get
``nn.with_logical_constraint`` at block boundaries and inside attention and the MLP. The names are
those of ``remat_kit.sharding.PARAM_AXES`` and ``ACTIVATION_AXES``; ``remat_kit.sharding.MeshPlan``
maps them to mesh axes. Outside a mesh plan (no Flax axis rules in context) the constraints do
nothing, so the models run unchanged on one device.

Two names mean the sequence: ``act_seq`` between blocks (the residual stream, split over
``cp``, or over ``tp`` without ``cp``) and ``act_len`` inside a block (queries, attention
outputs, MLP activations and logits, split over ``cp`` while ``tp`` splits their heads or
width). Keys and values are constrained with ``None`` in the sequence position right before
attention reads them (:data:`KV_GATHERED_AXES`): under context parallelism that is the
all-gather over ``cp``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax

__all__ = [
    "DISPATCHED_AXES",
    "EMBEDDED_AXES",
    "EXPERT_HIDDEN_AXES",
    "GROUPED_AXES",
    "KV_AXES",
    "KV_GATHERED_AXES",
    "LOGITS_AXES",
    "MLP_AXES",
    "QUERY_AXES",
    "RESIDUAL_AXES",
    "LogicalBox",
    "constrain",
    "embedded",
    "mesh_axes",
    "partitioned",
]

#: The residual stream between blocks: batch over the data axes, sequence over ``cp``
#: (context parallelism) or else ``tp`` (Megatron sequence parallelism), width whole.
RESIDUAL_AXES = ("act_batch", "act_seq", "act_embed")
#: Logits: batch over the data axes, sequence over ``cp``, vocabulary over ``tp``.
LOGITS_AXES = ("act_batch", "act_len", "act_vocab")
#: The MLP's hidden activations (batch, seq, d_ff): sequence over ``cp``, width over ``tp``.
MLP_AXES = ("act_batch", "act_len", "act_mlp")
#: Tokens dispatched to the experts (experts, groups, capacity, width) in a mixture of experts'
#: capacity path: experts over ``ep`` (GSPMD's all-to-all moves them there), the groups (the
#: sequences) over the data axes ``ep`` leaves.
DISPATCHED_AXES = ("act_exp", "act_batch", None, "act_embed")
#: The same tensor as the dispatch einsum makes it and the combine einsum reads it: experts
#: whole, groups over every data axis (``ep`` included). Constraining to this, then to
#: :data:`DISPATCHED_AXES`, makes the reshard an all-to-all over ``ep`` (GShard); without it
#: XLA's partitioner all-gathers every group's tokens onto each device instead.
GROUPED_AXES = (None, "act_batch", None, "act_embed")
#: The experts' hidden activations (experts, groups, capacity, expert d_ff).
EXPERT_HIDDEN_AXES = ("act_exp", "act_batch", None, "act_mlp")
#: Queries and attention outputs (batch, seq, heads, head_dim): sequence over ``cp``.
QUERY_AXES = ("act_batch", "act_len", "act_heads", None)
#: Keys and values as projected (batch, seq, kv_heads, head_dim): sequence over ``cp``, so
#: that what a policy saves of them is split too.
KV_AXES = ("act_batch", "act_len", "act_kv_heads", None)
#: An embedding lookup's output under context parallelism (see :func:`embedded`): batch over
#: the data axes, width over ``cp``.
EMBEDDED_AXES = ("act_batch", None, "act_len")
#: Keys and values as attention reads them: the whole sequence on every device (gathered
#: over ``cp``).
KV_GATHERED_AXES = ("act_batch", None, "act_kv_heads", None)


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


def mesh_axes(names: Sequence[str | None]) -> jax.sharding.PartitionSpec | None:
    """The mesh PartitionSpec the axis rules in context give logical ``names``, or None.

    None outside a mesh plan (no Flax axis rules, or no mesh, in context): the model then runs
    on one device and nothing is split.

    Example:
      >>> mesh_axes(QUERY_AXES) is None  # no mesh plan here
      True
    """
    rules = nn.get_logical_axis_rules()
    if not rules or jax.sharding.get_abstract_mesh().empty:
        return None
    return nn.logical_to_mesh_axes(tuple(names), rules)


def embedded(x: jax.Array) -> jax.Array:
    """Constrains an embedding lookup's output (batch, seq, width) under context parallelism.

    The table's width (``embed``) is split over ``fsdp`` and ``cp``, so the lookup gives each
    device a slice of the width of every token, and the residual stream wants the batch over
    ``fsdp`` and the sequence over ``cp`` instead. XLA's partitioner cannot move both at once:
    it replicates the whole activation ("Involuntary full rematerialization") in the forward
    and the backward pass. Passing through :data:`EMBEDDED_AXES` (width over ``cp`` alone)
    makes it one move per axis. Without ``cp`` in the plan, ``x`` is returned unconstrained.

    Example:
      >>> x = jnp.ones((2, 8, 16))
      >>> embedded(x) is x  # no mesh plan here
      True
    """
    spec = mesh_axes(("act_len",))
    if spec is None or spec[0] is None:
        return x
    return constrain(x, EMBEDDED_AXES)
