"""While-loop trip counts read from a jaxpr: what fori_loop and friends run, statically.

XLA's cost analysis counts a loop body once; FLOP counts need the trip count, which a
``fori_loop`` carries as a counter compared against a bound known at trace time.
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from typing import Any

import numpy as np
from jax.extend import core

__all__ = [
    "Known",
    "known_consts",
    "known_positions",
    "while_trip_count",
]

_COMPARISONS = frozenset({"lt", "le", "gt", "ge", "ne"})

# Comparison seen from the other side: ``b > a`` is ``a < b``.
_FLIPPED = types.MappingProxyType({"lt": "gt", "gt": "lt", "le": "ge", "ge": "le", "ne": "ne"})

# Values known statically inside one jaxpr: scalar Vars bound to literals or constants. Used only
# to read while-loop trip counts.
Known = Mapping[Any, Any]


def _as_scalar(value: Any) -> Any:
    """The Python scalar held by a 0-d constant, or None if it is not one (or not concrete)."""
    try:
        array = np.asarray(value)
    except Exception:  # tracers and other abstract values cannot be read
        return None
    if array.ndim != 0 or array.dtype.kind not in "biuf":
        return None
    return array.item()


def known_consts(jaxpr: core.Jaxpr, consts: Any) -> dict[Any, Any]:
    """Maps the jaxpr's constvars that hold concrete scalars to their values."""
    # Not strict: an open Jaxpr arrives without its const values, and then nothing is known.
    values = {var: _as_scalar(value) for var, value in zip(jaxpr.constvars, consts, strict=False)}
    return {var: value for var, value in values.items() if value is not None}


def _value_of(atom: Any, known: Known) -> Any:
    if isinstance(atom, core.Literal):
        return _as_scalar(atom.val)
    return known.get(atom)


def known_positions(atoms: Any, known: Known) -> dict[int, Any]:
    values = {i: _value_of(a, known) for i, a in enumerate(atoms)}
    return {i: v for i, v in values.items() if v is not None}


def _producer(jaxpr: core.Jaxpr, var: Any) -> core.JaxprEqn | None:
    for eqn in jaxpr.eqns:
        if any(out is var for out in eqn.outvars):
            return eqn
    return None


def while_trip_count(eqn: core.JaxprEqn, known: Known) -> int | None:
    """Trip count of a ``fori_loop``-shaped while loop, or None when it cannot be read statically.

    Recognised shape: the predicate is ``counter <op> bound`` (either side), the body returns
    ``counter + step`` (or ``counter - step``) with a static step, the counter's initial value is
    static, and the bound is static: a literal, a constant, or a carry the body passes through
    unchanged whose initial value is static.
    """
    params = eqn.params
    cond_n, body_n = params["cond_nconsts"], params["body_nconsts"]
    cond_closed, body_closed = params["cond_jaxpr"], params["body_jaxpr"]
    cond, body = cond_closed.jaxpr, body_closed.jaxpr
    init = eqn.invars[cond_n + body_n :]

    cond_known = known_consts(cond, cond_closed.consts)
    for i, value in known_positions(eqn.invars[:cond_n], known).items():
        cond_known[cond.invars[i]] = value
    carry_in_cond = {var: i for i, var in enumerate(cond.invars[cond_n:])}

    compare = _producer(cond, cond.outvars[0])
    if compare is None or compare.primitive.name not in _COMPARISONS:
        return None
    op = compare.primitive.name
    lhs, rhs = compare.invars
    for counter_atom, bound_atom, op_on_counter in ((lhs, rhs, op), (rhs, lhs, _FLIPPED[op])):
        counter = (
            carry_in_cond.get(counter_atom) if not isinstance(counter_atom, core.Literal) else None
        )
        if counter is None:
            continue
        step = _body_step(
            body, body_n, counter, body_closed, known, eqn.invars[cond_n : cond_n + body_n]
        )
        start = _value_of(init[counter], known)
        bound = _value_of(bound_atom, cond_known)
        if bound is None and not isinstance(bound_atom, core.Literal):
            index = carry_in_cond.get(bound_atom)
            # The bound may itself be a carry (fori_loop does this) if the body leaves it unchanged.
            if index is not None and body.outvars[index] is body.invars[body_n + index]:
                bound = _value_of(init[index], known)
        if step is None or start is None or bound is None:
            continue
        trips = _trips(start, bound, step, op_on_counter)
        if trips is not None:
            return trips
    return None


def _body_step(
    body: core.Jaxpr,
    body_n: int,
    counter: int,
    body_closed: core.ClosedJaxpr,
    known: Known,
    body_const_atoms: Any,
) -> float | None:
    """The static amount the body adds to carry ``counter`` each trip, or None."""
    body_known = known_consts(body, body_closed.consts)
    for i, value in known_positions(body_const_atoms, known).items():
        body_known[body.invars[i]] = value
    counter_in = body.invars[body_n + counter]
    update = _producer(body, body.outvars[counter])
    if update is None or update.primitive.name not in ("add", "sub"):
        return None
    a, b = update.invars
    if a is counter_in:
        step = _value_of(b, body_known)
        sign = 1 if update.primitive.name == "add" else -1
    elif b is counter_in and update.primitive.name == "add":
        step, sign = _value_of(a, body_known), 1
    else:
        return None
    return None if step is None else sign * step


def _trips(start: float, bound: float, step: float, op: str) -> int | None:
    """Iterations of ``i = start; while i <op> bound: i += step``, or None if it never ends."""
    if step == 0:
        return None
    if op in ("lt", "le") and step > 0:
        span = bound - start
        count = math.ceil(span / step) if op == "lt" else math.floor(span / step) + 1
        return max(0, count)
    if op in ("gt", "ge") and step < 0:
        span = start - bound
        count = math.ceil(span / -step) if op == "gt" else math.floor(span / -step) + 1
        return max(0, count)
    if op == "ne":
        span = bound - start
        if span % step == 0 and span / step >= 0:
            return int(span // step)
        return None
    # e.g. ``i < n`` with a negative step: the loop either never runs or never ends.
    return 0 if not _holds(start, bound, op) else None


def _holds(a: float, b: float, op: str) -> bool:
    return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "ne": a != b}[op]
