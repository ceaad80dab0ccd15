"""Shardings of a train step's arguments: parameters, optimizer state and the batch.

Example:
  >>> plan = rk.parse_shard("fsdp:2,cp:4")
  >>> batch_sharding(plan, plan.mesh(rk.target("h100", devices=8))).spec  # sequence over cp
  P('fsdp', 'cp')
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
from flax.core import meta
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from remat_kit._shapes import array_bytes, path_keys
from remat_kit.errors import BadValue
from remat_kit.sharding._plan import MeshPlan

__all__ = [
    "batch_sharding",
    "opt_state_shardings",
    "param_shardings",
    "param_specs",
    "per_device_bytes",
    "strip_boxes",
]


def strip_boxes(tree: Any) -> Any:
    """Removes Flax partitioning boxes (``nn.Partitioned``) without adding sharding constraints.

    Args:
      tree: a pytree that may hold ``flax.core.meta.AxisMetadata`` boxes.

    Returns:
      The same pytree with every box replaced by its value.

    Example:
      >>> init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))
      >>> boxed = jax.eval_shape(nn.Dense(16, kernel_init=init).init, jax.random.key(0),
      ...                        jnp.ones((2, 8)))
      >>> type(boxed["params"]["kernel"]).__name__
      'LogicallyPartitioned'
      >>> strip_boxes(boxed)["params"]["kernel"]
      ShapeDtypeStruct(shape=(8, 16), dtype=float32)
    """

    def one(x: Any) -> Any:
        if isinstance(x, meta.AxisMetadata):
            value = x.value if hasattr(x, "value") else x.unbox()
            return strip_boxes(value)
        return x

    return jax.tree.map(one, tree, is_leaf=lambda x: isinstance(x, meta.AxisMetadata))


def param_specs(boxed: Any, plan: MeshPlan) -> Any:
    """Mesh PartitionSpecs of a (possibly boxed) parameter pytree under ``plan``.

    Logical names come from the Flax boxes; an unnamed parameter is split over the weight
    axes (``fsdp`` and ``cp`` together) along its largest dimension their product divides,
    and replicated otherwise.

    Args:
      boxed: parameters (arrays or ShapeDtypeStructs), optionally in ``nn.Partitioned`` boxes.
      plan: the mesh plan.

    Returns:
      A pytree of PartitionSpec shaped like ``strip_boxes(boxed)``.

    Raises:
      ValueError: a mesh axis does not divide the dimension it splits (one line: the
        parameter, its logical axis and size, the axis and its size).

    Example:
      >>> init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))
      >>> boxed = jax.eval_shape(nn.Dense(16, kernel_init=init).init, jax.random.key(0),
      ...                        jnp.ones((2, 8)))
      >>> param_specs(boxed, rk.parse_shard("tp:2"))["params"]["kernel"]  # "mlp" is split by tp
      P(None, 'tp')
    """
    rules = plan.rules()
    sizes = dict(plan.axes)

    def one(path: Any, x: Any) -> PartitionSpec:
        where = _path_str(path)
        if isinstance(x, meta.AxisMetadata):
            value = strip_boxes(x)
            names = tuple(getattr(x, "names", ()) or ())
            if len(names) != len(value.shape):
                raise BadValue(
                    f"parameter {where} has shape {tuple(value.shape)} but logical axes {names}"
                )
            spec = nn.logical_to_mesh_axes(names, rules)
            _check_divides(where, value.shape, spec, sizes, plan, names)
            return spec
        return _spec_by_shape(tuple(getattr(x, "shape", ())), plan)

    return jax.tree_util.tree_map_with_path(
        one, boxed, is_leaf=lambda x: isinstance(x, meta.AxisMetadata)
    )


def param_shardings(boxed: Any, plan: MeshPlan, mesh: Mesh) -> Any:
    """NamedShardings of a (possibly boxed) parameter pytree under ``plan`` on ``mesh``.

    Args:
      boxed: parameters or their ShapeDtypeStructs, e.g. ``jax.eval_shape(module.init, ...)``
        with ``nn.with_logical_partitioning`` boxes.
      plan: the mesh plan (see :func:`parse_shard`).
      mesh: the mesh of ``plan`` (``plan.mesh(target)``).

    Returns:
      A pytree of NamedSharding shaped like ``strip_boxes(boxed)``.

    Raises:
      ValueError: a mesh axis does not divide the dimension it splits.

    Example:
      >>> init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))
      >>> boxed = jax.eval_shape(nn.Dense(16, kernel_init=init).init, jax.random.key(0),
      ...                        jnp.ones((2, 8)))
      >>> plan = rk.parse_shard("fsdp:8")
      >>> sh = param_shardings(boxed, plan, plan.mesh(rk.target("h100", devices=8)))
      >>> sh["params"]["kernel"].spec  # "embed" is split by fsdp
      P('fsdp', None)
    """
    return jax.tree.map(
        lambda s: NamedSharding(mesh, s),
        param_specs(boxed, plan),
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )


def opt_state_shardings(opt_state: Any, params: Any, shardings: Any, mesh: Mesh) -> Any:
    """Shardings of an optimizer state: each leaf as the parameter it mirrors, else replicated.

    A leaf mirrors a parameter when the parameter's path ends its path (optax keeps moments in
    a copy of the parameter tree: ``mu/decoder/layers/...``) and the shapes agree; counts,
    factored second moments (adafactor) and other odd shapes are replicated.

    Args:
      opt_state: the optimizer state or its ShapeDtypeStructs.
      params: the (unboxed) parameters the state was built from.
      shardings: the parameters' NamedShardings (same structure as ``params``).
      mesh: the mesh.

    Returns:
      A pytree of NamedSharding shaped like ``opt_state``.

    Example:
      >>> import optax
      >>> init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))
      >>> boxed = jax.eval_shape(nn.Dense(16, kernel_init=init).init, jax.random.key(0),
      ...                        jnp.ones((2, 8)))
      >>> plan = rk.parse_shard("fsdp:8")
      >>> mesh = plan.mesh(rk.target("h100", devices=8))
      >>> params, param_sh = strip_boxes(boxed), param_shardings(boxed, plan, mesh)
      >>> opt_abs = jax.eval_shape(optax.adam(1e-3).init, params)
      >>> opt_sh = opt_state_shardings(opt_abs, params, param_sh, mesh)
      >>> opt_sh[0].mu["params"]["kernel"].spec  # the moments follow their weights
      P('fsdp', None)
    """
    by_path: dict[tuple[str, ...], tuple[tuple[int, ...], NamedSharding]] = {}
    for (path, x), s in zip(
        jax.tree_util.tree_flatten_with_path(params)[0],
        jax.tree.leaves(shardings, is_leaf=lambda v: isinstance(v, NamedSharding)),
        strict=True,
    ):
        by_path[path_keys(path)] = (tuple(x.shape), s)
    replicated = NamedSharding(mesh, PartitionSpec())

    def one(path: Any, x: Any) -> NamedSharding:
        keys, shape = path_keys(path), tuple(getattr(x, "shape", ()))
        for i in range(len(keys)):
            hit = by_path.get(keys[i:])
            if hit is not None and hit[0] == shape:
                return hit[1]
        return replicated

    return jax.tree_util.tree_map_with_path(one, opt_state)


def batch_sharding(plan: MeshPlan, mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Sharding of an input batch: the batch split over the data axes, the sequence over ``cp``.

    Args:
      plan: the mesh plan.
      mesh: its mesh.
      ndim: rank of the batch's arrays (``[batch, seq, ...]``).

    Returns:
      The NamedSharding of every array of the batch (tokens and targets).

    Example:
      >>> plan = rk.parse_shard("fsdp:8")
      >>> batch_sharding(plan, plan.mesh(rk.target("h100", devices=8))).spec
      P('fsdp', None)
    """
    data = plan.data_axes
    first: Any = (data[0] if len(data) == 1 else data) if data else None
    seq = "cp" if "cp" in plan.axis_names and ndim > 1 else None
    rest = [None] * max(ndim - 2, 0)
    return NamedSharding(mesh, PartitionSpec(first, *([seq] if ndim > 1 else []), *rest))


def per_device_bytes(tree: Any, shardings: Any = None) -> int:
    """Bytes one device holds of a pytree of arrays/ShapeDtypeStructs under ``shardings``.

    Args:
      tree: arrays or ShapeDtypeStructs.
      shardings: a Sharding for every leaf, a pytree of them, or None (leaves' own sharding,
        or whole arrays when they carry none).

    Returns:
      The sum over leaves of the bytes of one shard.

    Example:
      >>> per_device_bytes(jax.ShapeDtypeStruct((8, 4), jnp.float32))
      128
    """
    leaves = jax.tree.leaves(tree)
    if shardings is None:
        sh: list[Any] = [getattr(x, "sharding", None) for x in leaves]
    elif isinstance(shardings, jax.sharding.Sharding):
        sh = [shardings] * len(leaves)
    else:
        sh = jax.tree.leaves(shardings, is_leaf=lambda v: isinstance(v, jax.sharding.Sharding))
    total = 0
    for x, s in zip(leaves, sh, strict=True):
        shape = tuple(x.shape)
        if s is not None and hasattr(s, "shard_shape"):
            shape = tuple(s.shard_shape(shape))
        total += array_bytes(shape, x.dtype)
    return total


# --- private helpers ----------------------------------------------------------------------------


def _check_divides(
    where: str,
    shape: Sequence[int],
    spec: PartitionSpec,
    sizes: Mapping[str, int],
    plan: MeshPlan,
    names: Sequence[Any],
) -> None:
    for dim, (n, axis) in enumerate(zip(shape, tuple(spec), strict=False)):
        if axis is None:
            continue
        axes = axis if isinstance(axis, tuple) else (axis,)
        ways = math.prod(sizes[a] for a in axes)
        if n % ways:
            label = "+".join(f"{a}:{sizes[a]}" for a in axes)
            divisors = [d for d in range(1, n + 1) if n % d == 0 and d <= plan.devices]
            raise BadValue(
                f"{label} splits logical axis {names[dim]!r} (size {n}) of parameter {where} "
                f"{ways} ways, which does not divide {n}: use a {'+'.join(axes)} size in "
                f"{divisors} or another plan than {plan.spec}",
                param="shard",
            )


def _spec_by_shape(shape: tuple[int, ...], plan: MeshPlan) -> PartitionSpec:
    # An unnamed parameter: its largest dimension that the weight axes (fsdp, cp) divide.
    axes = plan.weight_axes
    ways = math.prod(plan.size(a) for a in axes)
    if not axes or not shape:
        return PartitionSpec()
    for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
        if shape[dim] % ways == 0:
            out: list[Any] = [None] * len(shape)
            out[dim] = axes[0] if len(axes) == 1 else axes
            return PartitionSpec(*out)
    return PartitionSpec()


def _path_str(path: Sequence[Any]) -> str:
    keys = [k for k in path_keys(path) if k != "params"]
    return "/".join(keys) or "<root>"
