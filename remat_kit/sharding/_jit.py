"""A ``jax.jit``'s ``in_shardings`` as a sharding (or None) per leaf of its arguments.

``jax.jit`` takes ``in_shardings`` as a pytree prefix of the arguments; what reads the
shardings of a step (``rk.inspect``, ``rk.auto``) needs one per leaf, and a prefix that does
not fit the arguments refused before any compile, naming the fix.

Example:
  >>> per_leaf(None, ({"a": 1, "b": 2}, 3), who="rk.inspect")
  ({'a': None, 'b': None}, None)
"""

from __future__ import annotations

from typing import Any

import jax

from remat_kit.errors import BadValue

__all__ = ["per_leaf"]


def _is_none(v: Any) -> bool:
    return v is None


def per_leaf(in_shardings: Any, args: tuple[Any, ...], *, who: str) -> Any:
    """``in_shardings`` broadcast over ``args``: the arguments' tree, a sharding or None at
    each leaf (a None leaf: the argument's own, or jax's choice).

    Args:
      in_shardings: a sharding, None, or a pytree prefix of ``args`` of those.
      args: the arguments, a tuple.
      who: the call named in the error (``"rk.inspect"``, ``"rk.auto(step)"``).

    Returns:
      The tree of ``args`` with a sharding or None at each leaf.

    Raises:
      BadValue: ``in_shardings`` is not a prefix of ``args`` (``param="in_shardings"``).
    """
    try:
        return jax.tree.broadcast(in_shardings, tuple(args), is_leaf=_is_none)
    except (ValueError, TypeError):
        raise BadValue(
            f"{who}: in_shardings is not a prefix of the {len(args)} arguments: give one "
            "sharding (or None) per argument, or per leaf",
            param="in_shardings",
        ) from None
