"""Walking jaxprs: the one place that knows where sub-jaxprs hide in an equation's params,
and which equations are a ``checkpoint_name`` tag or a ``jax.checkpoint`` call.

flops (FLOP counts), residuals (what a policy saves) and peak (which tag a buffer holds) all
descend into scans, conds, pjit/remat calls and custom_vjp bodies the same way.

jax has two remat implementations, chosen by its ``jax_remat3`` flag (env ``JAX_REMAT3``; "on
its way to becoming the default"). By default ``checkpoint_name`` binds ``name_p`` and
``jax.checkpoint`` binds ``remat2`` (printed ``checkpoint`` by older releases). With the flag
on (jax 0.12) both are "hi" primitives: the equation's primitive is ``call_hi_primitive`` for
every one of them and its one param ``_prim`` is the object that says what it is (jax's
``CheckpointName`` or ``RematTraced``, whose ``params``/``jaxpr``/``policy`` are attributes);
a jaxpr prints it under that object's name. jax's own ``saved_residuals`` tells the two apart
the same way (``jax/_src/ad_checkpoint.py``, ``get_name``). The helpers here read both forms,
so the walkers never look at a primitive's printed name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from jax.extend import core

from remat_kit._shapes import array_bytes

__all__ = [
    "is_checkpoint",
    "kind_of",
    "open_jaxpr",
    "params_of",
    "sub_jaxprs",
    "tag_of",
]

#: What jax calls a ``jax.checkpoint`` call: the primitive by default, the hi object's type
#: under ``jax_remat3``.
_CHECKPOINT_NAMES = frozenset({"checkpoint", "remat2", "remat", "RematTraced"})
#: The same for ``checkpoint_name`` (``CheckpointNameFwd``: its forward half, jax 0.12).
_TAG_TYPES = frozenset({"CheckpointName", "CheckpointNameFwd"})


def _hi(eqn: Any) -> Any:
    """The hi object of a ``call_hi_primitive`` equation (``jax_remat3``), else None."""
    params = eqn.params
    return params.get("_prim") if isinstance(params, Mapping) and len(params) == 1 else None


def kind_of(eqn: Any) -> str:
    """What an equation binds: its primitive's name, or its hi object's type name.

    Example:
      >>> import jax
      >>> kind_of(jax.make_jaxpr(jax.checkpoint(lambda x: x * 2))(1.0).eqns[0]) in (
      ...     "remat2", "RematTraced")
      True
    """
    hi = _hi(eqn)
    return type(hi).__name__ if hi is not None else eqn.primitive.name


def params_of(eqn: Any) -> Mapping[str, Any]:
    """An equation's params: its hi object's ``params`` under ``jax_remat3`` (a
    ``RematTraced``'s hold its ``jaxpr``, ``policy`` and ``prevent_cse``), else ``eqn.params``.

    Example:
      >>> import jax
      >>> from jax.ad_checkpoint import checkpoint_name
      >>> params_of(jax.make_jaxpr(lambda x: checkpoint_name(x, "t"))(1.0).eqns[0])["name"]
      't'
    """
    hi = _hi(eqn)
    return eqn.params if hi is None else getattr(hi, "params", None) or {}


def tag_of(eqn: Any) -> str | None:
    """The tag of a ``checkpoint_name`` equation (either remat implementation), else None.

    Example:
      >>> import jax
      >>> from jax.ad_checkpoint import checkpoint_name
      >>> tag_of(jax.make_jaxpr(lambda x: checkpoint_name(x, "t"))(1.0).eqns[0])
      't'
      >>> tag_of(jax.make_jaxpr(lambda x: x * 2)(1.0).eqns[0]) is None
      True
    """
    hi = _hi(eqn)
    if hi is not None:
        return str(hi.name) if type(hi).__name__ in _TAG_TYPES else None
    if eqn.primitive.name == "name" and "name" in eqn.params:
        return str(eqn.params["name"])
    return None


def is_checkpoint(eqn: Any) -> bool:
    """Whether ``eqn`` is a ``jax.checkpoint`` call (either remat implementation).

    Example:
      >>> import jax
      >>> is_checkpoint(jax.make_jaxpr(jax.checkpoint(lambda x: x * 2))(1.0).eqns[0])
      True
    """
    return kind_of(eqn) in _CHECKPOINT_NAMES


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
    every = params_of(eqn)
    params = every if keys is None else {k: every[k] for k in keys if k in every}
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


def tags_in(closed: Any) -> dict[str, tuple[int, int]]:
    """Tags of a (closed) jaxpr: name -> (bytes of one occurrence, occurrences).

    Occurrences inside a scan count once per iteration. (Read here, at the ground, so that
    the checks of a traced program need nothing of the residual analysis;
    ``rk.residuals.tags_in`` is this function.)
    """
    out: dict[str, tuple[int, int]] = {}
    _collect_tags(getattr(closed, "jaxpr", closed), 1, out)
    return out


def _collect_tags(jaxpr: Any, mult: int, out: dict[str, tuple[int, int]]) -> None:
    for eqn in jaxpr.eqns:
        name = tag_of(eqn)
        if name is not None:
            aval = eqn.outvars[0].aval
            nbytes = array_bytes(aval.shape, aval.dtype)
            prev = out.get(name, (nbytes, 0))
            out[name] = (max(prev[0], nbytes), prev[1] + mult)
            continue
        inner_mult = (
            mult * int(eqn.params.get("length", 1)) if eqn.primitive.name == "scan" else mult
        )
        for sub in sub_jaxprs(eqn):
            _collect_tags(open_jaxpr(sub), inner_mult, out)
