"""Walking jaxprs: the one place that knows where sub-jaxprs hide in an equation's params.

flops (FLOP counts), residuals (what a policy saves) and peak (which tag a buffer holds) all
descend into scans, conds, pjit/remat calls and custom_vjp bodies the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jax.extend import core

__all__ = ["open_jaxpr", "sub_jaxprs"]


def sub_jaxprs(eqn: Any, keys: Iterable[str] | None = None) -> list[Any]:
    """Each distinct jaxpr (closed or open, as stored) in ``eqn.params``, in param order.

    Args:
      eqn: a jaxpr equation.
      keys: look only in these params (e.g. a custom_vjp's forward, not its backward rule);
        default all. Callables such as custom_jvp's jvp rule are not jaxprs and are skipped.

    Returns:
      ClosedJaxpr and Jaxpr objects, each once (a jaxpr held twice is not walked twice).

    Example:
      >>> import jax
      >>> eqn = jax.make_jaxpr(lambda x: jax.lax.cond(x > 0, lambda: x, lambda: -x))(1.0).eqns[-1]
      >>> len(sub_jaxprs(eqn))
      2
    """
    params = eqn.params if keys is None else {k: eqn.params[k] for k in keys if k in eqn.params}
    out: list[Any] = []
    seen: set[int] = set()
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, (core.ClosedJaxpr, core.Jaxpr)) and id(item) not in seen:
                seen.add(id(item))
                out.append(item)
    return out


def open_jaxpr(j: Any) -> Any:
    """The open ``Jaxpr`` of a ClosedJaxpr (a Jaxpr is returned as is)."""
    return j.jaxpr if isinstance(j, core.ClosedJaxpr) else j
