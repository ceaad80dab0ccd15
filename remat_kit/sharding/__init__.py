"""Sharding: data, fully-sharded data (ZeRO-3), context and tensor parallelism over a mesh.

A :class:`MeshPlan` is what ``--shard fsdp:4,tp:2`` says: the mesh axes and their sizes. Four
kinds of axis exist, and any combination of them (their sizes multiply to the device count):

- ``dp``: data parallel. Weights, gradients and optimizer state are replicated on every device;
  the batch is split.
- ``fsdp``: fully-sharded data parallel (ZeRO-3). The batch is split as with ``dp``, and weights,
  gradients and optimizer state are split too, along the model width (logical axis ``embed``);
  XLA gathers each layer's weights when it needs them.
- ``cp``: context parallel. The devices of a ``cp`` group hold the same samples (``cp`` is not
  a data axis: the batch is not split over it) and ``1/cp`` of every sequence: the residual
  stream, queries, attention outputs, MLP activations and logits are split along the
  sequence. Attention all-gathers keys and values over ``cp`` (every query sees the whole
  sequence before it; MaxText's default context parallelism), and the backward pass
  reduce-scatters their gradients. Weights, gradients and optimizer state are split along
  ``embed`` over ``fsdp`` and ``cp`` together, ZeRO-3 style, as MaxText shards ``embed`` over
  its ``fsdp`` and ``context`` axes: a ``cp`` group gathers each layer's weights like an
  ``fsdp`` group. The sequence length must divide by ``cp``, and the model must constrain its
  activations' sequence axis (``act_seq``): a model that does not is refused before any
  compile (:func:`check_sequence_split`).
- ``tp``: Megatron-style tensor parallel. Attention heads, the MLP width and the vocabulary are
  split; between blocks the residual stream is split along the sequence (sequence parallelism)
  unless ``cp`` splits it (see :attr:`MeshPlan.seq_axes` for why not both).

The model says what each parameter dimension means with logical axis names (Flax
``nn.with_logical_partitioning``: ``("embed", "heads", "head_dim")`` for a query kernel) and which
activation dimensions may be split (``nn.with_logical_constraint`` with the ``act_*`` names);
:meth:`MeshPlan.rules` maps those names to mesh axes. Parameters without names are split by shape
over ``fsdp`` and ``cp`` (their largest dimension those axes divide) and replicated otherwise.

The package: :mod:`~remat_kit.sharding._plan` (specs, plans, rules, what a factory takes),
:mod:`~remat_kit.sharding._params` (shardings of a step's arguments),
:mod:`~remat_kit.sharding._context` (context parallelism's checks, the collectives of a step).

Example:
  >>> plan = parse_shard("fsdp:4,tp:2")
  >>> plan.spec, plan.devices, plan.data_size
  ('fsdp:4,tp:2', 8, 4)
  >>> dict(plan.mesh(rk.target("h100", devices=8)).shape)  # 8 H100s, none of them here
  {'fsdp': 4, 'tp': 2}
  >>> parse_shard("cp:4,fsdp:2").spec  # mesh order: data axes, then cp, then tp
  'fsdp:2,cp:4'
"""

from remat_kit.sharding._context import (
    check_sequence_split,
    collective_summary,
    sequence_constraints,
)
from remat_kit.sharding._jit import per_leaf
from remat_kit.sharding._params import (
    batch_sharding,
    opt_state_shardings,
    param_shardings,
    param_specs,
    per_device_bytes,
    strip_boxes,
)
from remat_kit.sharding._plan import _EXAMPLES as _EXAMPLES
from remat_kit.sharding._plan import (
    ACTIVATION_AXES,
    PARAM_AXES,
    STRATEGIES,
    MeshPlan,
    check_data_parallel,
    parse_shard,
)

__all__ = [
    "ACTIVATION_AXES",
    "PARAM_AXES",
    "STRATEGIES",
    "MeshPlan",
    "batch_sharding",
    "check_data_parallel",
    "check_sequence_split",
    "collective_summary",
    "opt_state_shardings",
    "param_shardings",
    "param_specs",
    "parse_shard",
    "per_device_bytes",
    "per_leaf",
    "sequence_constraints",
    "strip_boxes",
]
