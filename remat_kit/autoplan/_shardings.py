"""The shardings of a step as the user's own ``jax.jit`` gives them, and the mesh it is
planned on.

``rk.auto(jax.jit(step, in_shardings=..., out_shardings=...), ...)`` runs the decided step
jitted with the shardings that jit was given (read off it as its donation is: jax keeps them
on the jitted function, ``_jit_info``), so the wrapped step places its inputs and outputs as
the user's step would.

A step whose shardings (the jit's, ``rk.auto``'s ``in_shardings`` / ``out_shardings``, or
its arguments' own) span several devices is planned for that many devices of the target:
:func:`layout_of` reads its :class:`Layout` (the mesh, and a sharding for every argument
leaf, as jax places them: the jit's where given, else the argument's, else replicated), and
:meth:`Layout.on` puts the same partition specs on a mesh of the same axes over the target's
devices (compile-only devices for a named GPU or TPU), so the program compiled to decide is
the one each device runs, and its memory analysis per device. What cannot be carried over is
refused (:class:`ShardedStep`, naming the fix): a multi-device sharding that is not a
``NamedSharding`` over a mesh, two different meshes, a target of another device count.

Example:
  >>> s = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  >>> sorted(jit_shardings(jax.jit(lambda x: x, out_shardings=s)))
  ['out_shardings']
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from remat_kit.errors import BadValue, ShardedStep
from remat_kit.sharding import per_leaf
from remat_kit.targets import Target

__all__ = [
    "SHARDING_OPTIONS",
    "Layout",
    "jit_shardings",
    "layout_of",
    "with_jit_shardings",
]

#: The ``jax.jit`` options read off the user's jit and handed to the decided step's.
SHARDING_OPTIONS = ("in_shardings", "out_shardings")


def jit_shardings(fn: Callable[..., Any]) -> dict[str, Any]:
    """The ``in_shardings`` / ``out_shardings`` a ``jax.jit`` was given, as given (a pytree
    prefix of the arguments / outputs, ``None`` where the user left a leaf to jax); those it
    was not given are absent, as is everything for a plain function.

    Args:
      fn: the step, a plain function or a ``jax.jit`` of one.

    Returns:
      ``{"in_shardings": ..., "out_shardings": ...}``, each only where given.

    Example:
      >>> jit_shardings(lambda x: x), jit_shardings(jax.jit(lambda x: x))
      ({}, {})
    """
    info = getattr(fn, "_jit_info", None)
    if info is None:
        return {}
    out = {}
    for name in SHARDING_OPTIONS:
        leaves = getattr(info, f"{name}_leaves", ())
        if not any(x is None or isinstance(x, jax.sharding.Sharding) for x in leaves):
            continue  # jax's UnspecifiedValue: the option was not given
        out[name] = jax.tree_util.tree_unflatten(getattr(info, f"{name}_treedef"), leaves)
    return out


def with_jit_shardings(fn: Callable[..., Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with the shardings of ``fn``'s jit added; one given both ways is refused.

    Raises:
      BadValue: an option the jit and ``options`` both give (``param="step"``).
    """
    read = jit_shardings(fn)
    both = sorted(set(read) & set(options))
    if both:
        raise BadValue(
            f"rk.auto got {both[0]} from the step's jax.jit and as an option: give it once "
            "(in the jit, or to rk.auto)",
            param="step",
        )
    return {**read, **options}


def _none(v: Any) -> bool:
    return v is None


def _spans(s: Any) -> int:
    return len(s.device_set) if isinstance(s, jax.sharding.Sharding) else 0


def _mesh_words(mesh: Any) -> str:
    return ", ".join(f"{k}={v}" for k, v in mesh.shape.items())


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a sharded step's arguments and outputs lie: one mesh, a sharding per leaf.

    Attributes:
      mesh: the mesh every sharding of the step is on (the user's: real devices).
      in_shardings: per argument, a pytree of its leaves' ``NamedSharding`` (every leaf
        placed: the jit's sharding where given, else the argument's own, else replicated,
        as jax places an argument whose sharding is left to it).
      out_shardings: the ``out_shardings`` as given (a prefix of the outputs, ``None`` where
        left to XLA), or None when not given.
      from_args: whether a sharding was read off an argument rather than given to the jit
        (a later call's arguments may then be placed otherwise: see ``AutoStep``).

    Example:
      >>> mesh = jax.make_mesh((1,), ("d",))
      >>> lay = Layout(mesh, (NamedSharding(mesh, PartitionSpec("d")),), None, False)
      >>> lay.axes, lay.devices
      ({'d': 1}, 1)
    """

    mesh: Any
    in_shardings: tuple[Any, ...]
    out_shardings: Any
    from_args: bool

    @property
    def axes(self) -> dict[str, int]:
        """The mesh's axes and their sizes, in order."""
        return dict(self.mesh.shape)

    @property
    def devices(self) -> int:
        """The devices the mesh spans."""
        return int(math.prod(self.mesh.shape.values()))

    @property
    def hosts(self) -> int:
        """The processes the mesh's devices belong to (1 for a mesh of one process)."""
        devices = getattr(self.mesh, "devices", None)
        if devices is None:
            return 1
        return len({getattr(d, "process_index", 0) for d in np.ravel(devices)})

    def target(self, t: Target, name: str) -> Target:
        """``t`` with the mesh's device count (a target of one device is widened to it).

        Raises:
          ShardedStep: ``t`` already has another device count (a TPU slice's is its own).
        """
        n = self.devices
        if t.devices == n:
            return t
        if t.devices != 1 or t.kind == "tpu":
            raise ShardedStep(
                f"rk.auto({name}) runs on a mesh of {n} devices ({_mesh_words(self.mesh)}) "
                f"but the target {t.label} has {t.devices}: name a target of {n} devices "
                f"(or one device, widened to the mesh)",
                step=name,
                devices=n,
                where="target",
            )
        hosts = self.hosts if t.kind == "gpu" else 1
        return dataclasses.replace(t, devices=n, hosts=hosts)

    def on(self, t: Target) -> tuple[tuple[Any, ...], Any]:
        """The in- and out-shardings on ``t``'s devices: the same partition specs and memory
        kinds on a mesh of the same axes (sizes, names, axis types) over the target's devices
        (compile-only for a named GPU or TPU); the user's own where the target is the process
        (``local``, ``cpu``), whose devices the mesh is on.

        Args:
          t: the target, of :attr:`devices` devices (:meth:`target`).

        Returns:
          ``(in_shardings, out_shardings)`` as :attr:`in_shardings` and :attr:`out_shardings`.
        """
        if t.kind not in ("gpu", "tpu"):
            return self.in_shardings, self.out_shardings
        names, shape = tuple(self.mesh.axis_names), tuple(self.mesh.shape.values())
        devices = t.mesh(names, shape).devices
        mesh = Mesh(devices, names, axis_types=tuple(self.mesh.axis_types))

        def moved(s: Any) -> Any:
            if not isinstance(s, NamedSharding):
                return s
            return NamedSharding(mesh, s.spec, memory_kind=s.memory_kind)

        def tree(x: Any) -> Any:
            return jax.tree.map(moved, x, is_leaf=lambda v: v is None)

        return tree(self.in_shardings), tree(self.out_shardings)

    def ways(self, shapes: tuple[Any, ...], indices: tuple[int, ...] | None = None) -> int:
        """How many pieces the leading axis of the arguments is cut into, at most (of the
        arguments at ``indices``, or all): the data-parallel share of the batch, by which the
        planner's traced residuals (the whole batch's) are scaled to one device's. An
        estimate for the planner's model only: every figure is compiled.

        Example:
          >>> mesh = jax.make_mesh((1,), ("d",))
          >>> x = jax.ShapeDtypeStruct((8, 2), "float32")
          >>> Layout(mesh, (NamedSharding(mesh, PartitionSpec("d")),), None, False).ways((x,))
          1
        """
        picked = range(len(shapes)) if indices is None else indices
        most = 1
        for i in picked:
            xs = jax.tree.leaves(shapes[i])
            ss = jax.tree.leaves(self.in_shardings[i], is_leaf=lambda v: v is None)
            for x, s in zip(xs, ss, strict=False):
                if s is None or not np.shape(x):
                    continue
                local = s.shard_shape(tuple(np.shape(x)))
                most = max(most, int(np.shape(x)[0]) // max(1, int(local[0])))
        return most

    def parts(self) -> dict[str, Any]:
        """JSON-ready: what the decision's cache key holds of the layout (the mesh's axes
        and types, every leaf's partition spec and memory kind, the out-shardings')."""

        def one(s: Any) -> Any:
            if s is None:
                return None
            return [str(s.spec), s.memory_kind]

        leaves = jax.tree.leaves(self.in_shardings, is_leaf=lambda v: v is None)
        outs = jax.tree.leaves(self.out_shardings, is_leaf=lambda v: v is None)
        return {
            "mesh": self.axes,
            "axis_types": [str(a) for a in self.mesh.axis_types],
            "in": [one(s) for s in leaves],
            "out": None if self.out_shardings is None else [one(s) for s in outs],
        }


def _one_named_mesh(
    name: str, wide: Sequence[tuple[str, Any]], given: tuple[Sequence[Any], Sequence[Any]]
) -> Mesh:
    """The one mesh of a step's multi-device shardings ``wide`` (where, sharding), each of them
    and every sharding the jit was ``given`` (in, out) a NamedSharding on it.

    Raises:
      ShardedStep: a sharding that is not a NamedSharding, or two meshes.
    """
    n = max(_spans(s) for _, s in wide)
    for where, s in wide:
        if not isinstance(s, NamedSharding):
            raise ShardedStep(
                f"rk.auto({name}): its {where} hold a {type(s).__name__} over {_spans(s)} "
                "devices, which is planned only as a NamedSharding: give NamedSharding(mesh, "
                "PartitionSpec(...)) over a jax.sharding.Mesh",
                step=name,
                devices=_spans(s),
                where=where,
            )
    mesh = wide[0][1].mesh
    for where, s in wide:
        if s.mesh.abstract_mesh != mesh.abstract_mesh:
            raise ShardedStep(
                f"rk.auto({name}): its {where} are on a mesh ({_mesh_words(s.mesh)}) other than "
                f"its {wide[0][0]}' ({_mesh_words(mesh)}): put the step's shardings on one "
                "mesh",
                step=name,
                devices=n,
                where=where,
            )
    for where, group in zip(("in_shardings", "out_shardings"), given, strict=True):
        for s in group:
            if s is not None and not isinstance(s, NamedSharding):
                raise ShardedStep(
                    f"rk.auto({name}): its {where} mix a {type(s).__name__} into a step on the "
                    f"mesh {_mesh_words(mesh)}: give every sharding as a NamedSharding on it",
                    step=name,
                    devices=n,
                    where=where,
                )
    return mesh


def layout_of(name: str, options: Mapping[str, Any], args: tuple[Any, ...]) -> Layout | None:
    """The layout of a step whose shardings span several devices; None for one device.

    Args:
      name: the step's name, for the messages.
      options: the ``jax.jit`` options the decided step is jitted with.
      args: the call's arguments (arrays carry their sharding).

    Returns:
      The Layout, or None where no sharding (the jit's, the arguments') spans more than one
      device: the step is planned as one device's program.

    Raises:
      ShardedStep: a multi-device step whose shardings cannot be carried to the target: one
        that is not a ``NamedSharding`` (a ``PositionalSharding``, a ``GSPMDSharding``), or
        shardings over two different meshes.
      BadValue: ``in_shardings`` that is not a prefix of the arguments.

    Example:
      >>> layout_of("step", {}, (jnp.ones(2),)) is None  # one device
      True
    """
    given = options.get("in_shardings")
    jit_in = per_leaf(given, args, who=f"rk.auto({name})")
    out = options.get("out_shardings")
    leaves = jax.tree.leaves(tuple(args))
    picked = jax.tree.leaves(jit_in, is_leaf=_none)
    own = [getattr(x, "sharding", None) for x in leaves]
    outs = jax.tree.leaves(out, is_leaf=_none)
    wide = [
        (where, s)
        for where, group in (("in_shardings", picked), ("arguments", own), ("out_shardings", outs))
        for s in group
        if _spans(s) > 1
    ]
    if not wide:
        return None
    mesh = _one_named_mesh(name, wide, (picked, outs))
    replicated = NamedSharding(mesh, PartitionSpec())
    from_args = False
    placed = []
    for jit_s, arg_s in zip(picked, own, strict=True):
        if isinstance(jit_s, NamedSharding):
            placed.append(jit_s)
        elif isinstance(arg_s, NamedSharding) and _spans(arg_s) > 1:
            placed.append(arg_s)
            from_args = True
        else:  # left to jax: an argument on one device (uncommitted) is replicated
            placed.append(replicated)
    in_shardings = jax.tree.unflatten(jax.tree.structure(tuple(args)), placed)
    return Layout(mesh, tuple(in_shardings), out, from_args)
