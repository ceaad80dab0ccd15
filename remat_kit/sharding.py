"""Sharding: data, fully-sharded data (ZeRO-3) and tensor parallelism over a device mesh.

A :class:`MeshPlan` is what ``--shard fsdp:4,tp:2`` says: the mesh axes and their sizes. Three
kinds of axis exist, and any combination of them (their sizes multiply to the device count):

- ``dp``: data parallel. Weights, gradients and optimizer state are replicated on every device;
  the batch is split.
- ``fsdp``: fully-sharded data parallel (ZeRO-3). The batch is split as with ``dp``, and weights,
  gradients and optimizer state are split too, along the model width (logical axis ``embed``);
  XLA gathers each layer's weights when it needs them.
- ``tp``: Megatron-style tensor parallel. Attention heads, the MLP width and the vocabulary are
  split; between blocks the residual stream is split along the sequence (sequence parallelism).

The model says what each parameter dimension means with logical axis names (Flax
``nn.with_logical_partitioning``: ``("embed", "heads", "head_dim")`` for a query kernel) and which
activation dimensions may be split (``nn.with_logical_constraint`` with the ``act_*`` names);
:meth:`MeshPlan.rules` maps those names to mesh axes. Parameters without names are split by shape
under ``fsdp`` (their largest dimension the axis divides) and replicated otherwise.

Example:
  >>> plan = parse_shard("fsdp:4,tp:2")
  >>> plan.spec, plan.devices, plan.data_size
  ('fsdp:4,tp:2', 8, 4)
  >>> dict(plan.mesh(rk.target("h100", devices=8)).shape)  # 8 H100s, none of them here
  {'fsdp': 4, 'tp': 2}
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
from flax.core import meta
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from remat_kit._shapes import array_bytes
from remat_kit.errors import BadType, BadValue, OpenShardAxis
from remat_kit.targets import Target

__all__ = [
    "ACTIVATION_AXES",
    "PARAM_AXES",
    "STRATEGIES",
    "MeshPlan",
    "batch_sharding",
    "opt_state_shardings",
    "param_shardings",
    "param_specs",
    "parse_shard",
    "per_device_bytes",
    "strip_boxes",
]

#: Mesh axis kinds, in the order they are laid out on the mesh: ``tp`` last, so that a
#: tensor-parallel group sits on the devices of one host (NVLink), data axes across hosts.
STRATEGIES: tuple[str, ...] = ("dp", "fsdp", "tp")

#: Logical names of parameter dimensions the models use (Flax ``with_logical_partitioning``).
PARAM_AXES: tuple[str, ...] = (
    "vocab",
    "embed",
    "heads",
    "kv_heads",
    "head_dim",
    "mlp",
    "norm",
    "layers",
    "pos",
    "lora_in",
    "lora_rank",
    "lora_out",
)

#: Logical names of activation dimensions the models constrain (``nn.with_logical_constraint``).
#: ``act_seq`` is the sequence axis of the residual stream between blocks only.
ACTIVATION_AXES: tuple[str, ...] = (
    "act_batch",
    "act_seq",
    "act_embed",
    "act_heads",
    "act_kv_heads",
    "act_mlp",
    "act_vocab",
)

_EXAMPLES = "e.g. dp:8, fsdp:8, tp:8, fsdp:4,tp:2, dp:2,fsdp:4"


@dataclasses.dataclass(frozen=True)
class MeshPlan:
    """Mesh axes and sizes of a sharding strategy, e.g. ``fsdp:4,tp:2``.

    Build one with :func:`parse_shard`. Axes are kept in :data:`STRATEGIES` order whatever
    order the spec names them in.

    Attributes:
      axes: ``((kind, size), ...)`` with kinds from :data:`STRATEGIES`, each at most once.

    Example:
      >>> MeshPlan((("fsdp", 8),)).rules()[0]
      ('act_batch', 'fsdp')
    """

    axes: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        if not self.axes:
            raise BadValue(f"a mesh plan needs at least one axis ({_EXAMPLES})", param="shard")
        seen: set[str] = set()
        for kind, size in self.axes:
            if kind not in STRATEGIES:
                raise BadValue(
                    f"unknown sharding axis {kind!r}; valid: {', '.join(STRATEGIES)}", param="shard"
                )
            if kind in seen:
                raise BadValue(
                    f"sharding axis {kind!r} appears twice in {self.axes}", param="shard"
                )
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise BadValue(
                    f"size of sharding axis {kind!r} must be a positive int: {size!r}",
                    param="shard",
                )
            seen.add(kind)
        ordered = tuple(sorted(self.axes, key=lambda a: STRATEGIES.index(a[0])))
        object.__setattr__(self, "axes", ordered)

    @property
    def spec(self) -> str:
        """The plan as :func:`parse_shard` reads it back, e.g. ``"fsdp:4,tp:2"``."""
        return ",".join(f"{k}:{n}" for k, n in self.axes)

    @property
    def axis_names(self) -> tuple[str, ...]:
        """Mesh axis names (the kinds), in mesh order."""
        return tuple(k for k, _ in self.axes)

    @property
    def shape(self) -> tuple[int, ...]:
        """Mesh shape, in mesh order."""
        return tuple(n for _, n in self.axes)

    @property
    def devices(self) -> int:
        """Devices the mesh spans: the product of the sizes."""
        return math.prod(self.shape)

    def size(self, kind: str) -> int:
        """Size of axis ``kind`` (1 when the plan has no such axis)."""
        return dict(self.axes).get(kind, 1)

    @property
    def data_axes(self) -> tuple[str, ...]:
        """The axes that split the batch (``dp``, ``fsdp``)."""
        return tuple(k for k in self.axis_names if k in ("dp", "fsdp"))

    @property
    def data_size(self) -> int:
        """Ways the batch is split: the global batch must be a multiple of it."""
        return math.prod(self.size(k) for k in self.data_axes)

    def rules(self) -> tuple[tuple[str, Any], ...]:
        """Flax logical-axis rules: every name of :data:`PARAM_AXES` and :data:`ACTIVATION_AXES`.

        Names that this plan does not split map to None, so a constraint on them is explicit
        (replicated) rather than skipped.

        Returns:
          ``((logical_name, mesh_axis | tuple of mesh axes | None), ...)`` for
          ``nn.logical_axis_rules`` / ``nn.logical_to_mesh_axes``.

        Example:
          >>> dict(parse_shard("fsdp:4,tp:2").rules())["heads"]
          'tp'
        """
        data = self.data_axes
        batch: Any = (data[0] if len(data) == 1 else data) if data else None
        tp = "tp" if "tp" in self.axis_names else None
        fsdp = "fsdp" if "fsdp" in self.axis_names else None
        mapping = {
            "act_batch": batch,
            "act_seq": tp,
            "act_embed": None,
            "act_heads": tp,
            "act_kv_heads": tp,
            "act_mlp": tp,
            "act_vocab": tp,
            "vocab": tp,
            "heads": tp,
            "kv_heads": tp,
            "mlp": tp,
            "embed": fsdp,
            "head_dim": None,
            "norm": None,
            "layers": None,
            "pos": None,
            "lora_in": None,
            "lora_rank": None,
            "lora_out": None,
        }
        return tuple(mapping.items())

    def mesh(self, target: Target) -> Mesh:
        """The device mesh of this plan on ``target`` (compile-only devices for GPU targets).

        Args:
          target: a Target whose ``devices`` equals :attr:`devices`.

        Returns:
          A :class:`jax.sharding.Mesh` with axes :attr:`axis_names` of sizes :attr:`shape`.

        Raises:
          ValueError: the plan's device count differs from the target's.
          remat_kit.TargetError: the GPU target cannot be compiled for here.

        Example:
          >>> dict(parse_shard("fsdp:8").mesh(rk.target("h100", devices=8)).shape)
          {'fsdp': 8}
        """
        self.check_devices(target.devices)
        return target.mesh(self.axis_names, self.shape)

    def check_devices(self, devices: int) -> None:
        """Raises ValueError unless the sizes multiply to ``devices``.

        Example:
          >>> parse_shard("fsdp:8").check_devices(8)
        """
        if self.devices != devices:
            raise BadValue(
                f"mesh {self.spec} holds {self.devices} devices but the target has {devices}: "
                f"the sizes must multiply to {devices} ({_suggest(devices)})",
                param="shard",
            )

    @contextlib.contextmanager
    def activation_context(self, mesh: Mesh) -> Iterator[None]:
        """Makes the models' ``nn.with_logical_constraint`` calls act on ``mesh``.

        Usable while tracing (inside ``jax.jit``): it sets the abstract mesh and Flax's logical
        axis rules, not the concrete device context.

        Example:
          >>> plan = parse_shard("fsdp:8")
          >>> dense = nn.Dense(16)
          >>> params = jax.eval_shape(dense.init, jax.random.key(0), jnp.ones((8, 8)))
          >>> with plan.activation_context(plan.mesh(rk.target("h100", devices=8))):
          ...     jax.eval_shape(dense.apply, params, jnp.ones((8, 8))).shape
          (8, 16)
        """
        with (
            jax.sharding.use_abstract_mesh(mesh.abstract_mesh),
            nn.logical_axis_rules(self.rules()),
        ):
            yield


def parse_shard(spec: str | MeshPlan, devices: int | None = None) -> MeshPlan:
    """Reads a sharding spec: ``dp:8``, ``fsdp:8``, ``tp:8``, ``fsdp:4,tp:2``, ``dp:2,fsdp:4``.

    Axes are separated by ``,`` or ``+``. One axis may leave its size out (``fsdp`` or
    ``fsdp,tp:2``): it takes the devices the others leave.

    Args:
      spec: the spec, or a MeshPlan (returned as is, after the device check).
      devices: the target's device count; when given, the sizes must multiply to it.

    Returns:
      The MeshPlan.

    Raises:
      ValueError: an unknown axis, a bad or missing size, an axis named twice, or sizes that
        do not multiply to ``devices`` (one line naming the values and valid choices).
      OpenShardAxis: (a ValueError) sizes left open without ``devices``, or more than one.

    Example:
      >>> parse_shard("tp:2,fsdp:4").spec
      'fsdp:4,tp:2'
      >>> parse_shard("fsdp", devices=16).spec
      'fsdp:16'
    """
    if isinstance(spec, MeshPlan):
        if devices is not None:
            spec.check_devices(devices)
        return spec
    if not isinstance(spec, str):
        raise BadType(
            f"shard spec must be a str or MeshPlan, got {type(spec).__name__}", param="shard"
        )
    items = [s.strip() for s in re.split(r"[,+]", spec.strip().lower()) if s.strip()]
    if not items:
        raise BadValue(f"empty shard spec {spec!r} ({_EXAMPLES})", param="shard")
    axes: list[tuple[str, int | None]] = []
    for item in items:
        kind, colon, size = (p.strip() for p in item.partition(":"))
        if kind not in STRATEGIES:
            close = difflib.get_close_matches(kind, STRATEGIES, n=1)
            hint = f" Did you mean {close[0]}?" if close else ""
            raise BadValue(
                f"unknown sharding axis {kind!r} in {spec!r}.{hint} Valid: "
                f"{', '.join(STRATEGIES)} ({_EXAMPLES})",
                param="shard",
            )
        if not colon:
            axes.append((kind, None))
            continue
        if not size.isdigit() or int(size) < 1:
            raise BadValue(
                f"cannot read size {size!r} of axis {kind!r} in {spec!r}: expected a positive int",
                param="shard",
            )
        axes.append((kind, int(size)))
    kinds = [k for k, _ in axes]
    dups = sorted({k for k in kinds if kinds.count(k) > 1})
    if dups:
        raise BadValue(f"sharding axis {', '.join(dups)} named twice in {spec!r}", param="shard")
    open_axes = [k for k, n in axes if n is None]
    if open_axes:
        if len(open_axes) > 1 or devices is None:
            raise OpenShardAxis(
                f"shard spec {spec!r} leaves the size of {', '.join(open_axes)} open: give sizes "
                f"({_EXAMPLES}); only one axis may be left open, and only with a device count",
                spec=spec,
                open_axes=open_axes,
            )
        known = math.prod(n for _, n in axes if n is not None)
        if devices % known:
            raise BadValue(
                f"shard spec {spec!r}: the given sizes hold {known} devices, which does not "
                f"divide the target's {devices} ({_suggest(devices)})",
                param="shard",
            )
        axes = [(k, devices // known if n is None else n) for k, n in axes]
    plan = MeshPlan(tuple((k, int(n)) for k, n in axes))  # type: ignore[arg-type]
    if devices is not None:
        plan.check_devices(devices)
    return plan


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

    Logical names come from the Flax boxes; an unnamed parameter is split under ``fsdp``
    along its largest dimension the ``fsdp`` size divides, and replicated otherwise.

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
      >>> param_specs(boxed, parse_shard("tp:2"))["params"]["kernel"]  # "mlp" is split by tp
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
      >>> plan = parse_shard("fsdp:8")
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
      >>> plan = parse_shard("fsdp:8")
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
        by_path[_path_keys(path)] = (tuple(x.shape), s)
    replicated = NamedSharding(mesh, PartitionSpec())

    def one(path: Any, x: Any) -> NamedSharding:
        keys, shape = _path_keys(path), tuple(getattr(x, "shape", ()))
        for i in range(len(keys)):
            hit = by_path.get(keys[i:])
            if hit is not None and hit[0] == shape:
                return hit[1]
        return replicated

    return jax.tree_util.tree_map_with_path(one, opt_state)


def batch_sharding(plan: MeshPlan, mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Sharding of an input batch: the leading (batch) dimension split over the data axes.

    Example:
      >>> plan = parse_shard("fsdp:8")
      >>> batch_sharding(plan, plan.mesh(rk.target("h100", devices=8))).spec
      P('fsdp', None)
    """
    data = plan.data_axes
    first: Any = (data[0] if len(data) == 1 else data) if data else None
    return NamedSharding(mesh, PartitionSpec(first, *([None] * (ndim - 1))))


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


def _suggest(devices: int) -> str:
    options = [f"fsdp:{devices}", f"dp:{devices}"]
    if devices % 2 == 0 and devices > 2:
        options.append(f"fsdp:{devices // 2},tp:2")
    return "e.g. " + " or ".join(options)


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
    fsdp = plan.size("fsdp")
    if "fsdp" not in plan.axis_names or not shape:
        return PartitionSpec()
    for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
        if shape[dim] % fsdp == 0:
            out: list[Any] = [None] * len(shape)
            out[dim] = "fsdp"
            return PartitionSpec(*out)
    return PartitionSpec()


def _path_keys(path: Sequence[Any]) -> tuple[str, ...]:
    out = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                out.append(str(getattr(k, attr)))
                break
        else:
            out.append(str(k))
    return tuple(out)


def _path_str(path: Sequence[Any]) -> str:
    keys = [k for k in _path_keys(path) if k != "params"]
    return "/".join(keys) or "<root>"
