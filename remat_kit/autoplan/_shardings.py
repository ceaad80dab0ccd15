"""The shardings of a step as the user's own ``jax.jit`` gives them, and the one-device check.

``rk.auto(jax.jit(step, in_shardings=..., out_shardings=...), ...)`` runs the decided step
jitted with the shardings that jit was given (read off it as its donation is: jax keeps them
on the jitted function, ``_jit_info``), so the wrapped step places its inputs and outputs as
the user's step would. The decision plans one device's program (the target's), so a step
whose shardings or arguments span several devices is refused (:class:`ShardedStep`) rather
than planned for a program it does not run.

Example:
  >>> s = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  >>> sorted(jit_shardings(jax.jit(lambda x: x, out_shardings=s)))
  ['out_shardings']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax

from remat_kit.errors import BadValue, ShardedStep

__all__ = [
    "SHARDING_OPTIONS",
    "jit_shardings",
    "one_device",
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


def _devices(tree: Any) -> int:
    """The most devices one sharding of ``tree`` spans (1 for none)."""
    shardings = [x for x in jax.tree.leaves(tree) if isinstance(x, jax.sharding.Sharding)]
    return max((len(s.device_set) for s in shardings), default=1)


def one_device(name: str, options: Mapping[str, Any], args: tuple[Any, ...]) -> None:
    """Refuses a step whose shardings (the jit's options, the arguments') span several devices.

    Args:
      name: the step's name, for the message.
      options: the ``jax.jit`` options the decided step is jitted with.
      args: the call's arguments (arrays carry their sharding).

    Raises:
      ShardedStep: the first sharding found over more than one device, with their count.

    Example:
      >>> one_device("step", {}, (jnp.ones(2),))  # one device: nothing to say
    """
    placed = [getattr(x, "sharding", None) for x in jax.tree.leaves(args)]
    for where, tree in (*((k, options.get(k)) for k in SHARDING_OPTIONS), ("arguments", placed)):
        n = _devices(tree)
        if n > 1:
            raise ShardedStep(
                f"rk.auto({name}) plans one device's program, but its {where} span {n} "
                "devices: a sharded step is not planned in the run yet; plan it on "
                f"rk.target(..., devices={n}) and apply the policy with rk.remat(Block, policy)",
                step=name,
                devices=n,
                where=where,
            )
