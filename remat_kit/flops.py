"""FLOPs of a jax function counted from its jaxpr, recomputation included.

Why not XLA's own number: a deviceless GPU compile has no ``cost_analysis()`` (it returns None), and
even where XLA does report one it counts a while-loop (scan) body once rather than once per trip, so
scanned layers come out L times too cheap. The jaxpr has neither problem, and it makes recomputation
visible: in the jaxpr of ``jax.grad`` of a ``jax.checkpoint``-ed function the recomputed forward
ops appear a second time (inside the ``remat2``/``checkpoint`` equation of the backward pass), so
counting every equation of the full jaxpr counts the recompute.

What is counted:

* ``matmul``: ``dot_general`` (``2 * batch * lhs_free * rhs_free * contracting``),
  ``conv_general_dilated`` (``2 * out_elems * kernel_spatial * in_features / feature_group_count``)
  and the grouped GEMMs of mixture-of-experts layers, ``ragged_dot_general``
  (``jax.lax.ragged_dot``): every row of the lhs meets one group's weights only, so all three
  modes jax produces (the forward, the weight gradient with the ragged dim contracted, the input
  gradient) cost ``2 * lhs_elems * rhs_free``, where ``rhs_free`` are the rhs dims that are
  neither contracting, batch nor group dims: ``2 * T * D * F`` for tokens (T, D) and experts
  (E, D, F), not E times that.
* ``attention_kernel``: the cuDNN fused attention primitives that
  ``jax.nn.dot_product_attention(..., implementation="cudnn")`` binds
  (``dot_product_attention_fwd_wrapper`` / ``dot_product_attention_bwd_wrapper`` and their fp8 and
  lowered variants). They are opaque, so they are counted from their shapes: forward
  ``4 * b * s_q * s_kv * heads * head_dim`` (halved when causal), backward 2.5 x forward since flash
  attention recomputes the scores.
* ``other``: one FLOP per output element of floating-point elementwise arithmetic and comparisons
  (transcendentals count 1) and one per *input* element of reductions; integer and boolean ops
  (loop counters, index maths) are not FLOPs. Pure data movement (reshape, transpose, broadcast,
  slice, concatenate, convert_element_type, gather/scatter, ...) is free.

Control flow: ``scan`` bodies count ``length`` times; ``cond`` counts its most expensive branch;
``while`` counts its trip count when it can be read statically (``fori_loop`` pattern: a counter
started from a known value, stepped by a known amount and compared against a known bound), otherwise
the body counts once and ``unknown_loops`` goes up by one. Any other equation holding jaxprs in its
params (jit/pjit, remat, custom_jvp/custom_vjp, closed_call, shard_map, ...) is recursed into.
``shard_map`` and ``pmap`` bodies see per-device shapes, so they are multiplied by the number of
devices they run on: figures are global FLOPs.

Dead code is counted as traced: ``jax.make_jaxpr(jax.grad(f))`` keeps the forward ops whose only use
is the discarded loss value, which XLA would delete. Use ``jax.value_and_grad`` (what a train step
does) for figures that match the executed program.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core

from remat_kit._jaxpr import open_jaxpr, sub_jaxprs
from remat_kit._trips import Known as _Known
from remat_kit._trips import known_consts as _known_consts
from remat_kit._trips import known_positions as _known_positions
from remat_kit._trips import while_trip_count as _while_trip_count
from remat_kit.errors import BadType, BadValue

__all__ = [
    "FlopCount",
    "count_flops",
    "count_jaxpr_flops",
    "ragged_dot_flops",
    "scan_operand_split",
]


@dataclasses.dataclass(frozen=True)
class FlopCount:
    """FLOPs of one traced function, split by kind.

    Attributes:
      total: all FLOPs: ``matmul + attention_kernel + other``.
      matmul: ``dot_general``, ``conv_general_dilated`` and ``ragged_dot_general`` FLOPs.
      attention_kernel: FLOPs of opaque fused attention kernels, counted from their shapes.
      other: elementwise arithmetic and reductions.
      unknown_loops: while loops whose trip count could not be read statically; each body was
        counted once, so ``total`` is a lower bound when this is non-zero.

    Example:
      >>> import jax.numpy as jnp
      >>> count_flops(jnp.dot, jnp.ones((2, 3)), jnp.ones((3, 4))).matmul
      48.0
    """

    total: float
    matmul: float
    attention_kernel: float
    other: float
    unknown_loops: int = 0

    def to_dict(self) -> dict[str, float | int]:
        """Returns the fields as a JSON-ready dict.

        Returns:
          ``{"total": ..., "matmul": ..., "attention_kernel": ..., "other": ...,
          "unknown_loops": ...}``.
        """
        return dataclasses.asdict(self)


def count_flops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> FlopCount:
    """Counts the FLOPs of ``fn(*args, **kwargs)`` from its jaxpr.

    Nothing is allocated or executed: ``args`` may be arrays or pytrees of ``jax.ShapeDtypeStruct``.

    Args:
      fn: a traceable callable, e.g. a train step or ``jax.grad(loss)``.
      *args: positional arguments for ``fn`` (arrays or ``jax.ShapeDtypeStruct`` pytrees).
      **kwargs: keyword arguments for ``fn``, traced like ``args``.

    Returns:
      A ``FlopCount``; recomputation from ``jax.checkpoint`` is included.

    Raises:
      TypeError: if ``fn`` is not callable (tracing errors from ``jax.make_jaxpr`` propagate).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> x = jax.ShapeDtypeStruct((8, 16), jnp.float32)
      >>> w = jax.ShapeDtypeStruct((16, 4), jnp.float32)
      >>> count_flops(lambda x, w: x @ w, x, w).matmul == 2 * 8 * 16 * 4
      True
    """
    if not callable(fn):
        raise BadType(f"count_flops needs a callable, got {type(fn).__name__}: {fn!r}")
    closed = jax.make_jaxpr(fn)(*args, **kwargs)
    return count_jaxpr_flops(closed)


def count_jaxpr_flops(closed_jaxpr: core.ClosedJaxpr | core.Jaxpr) -> FlopCount:
    """Counts the FLOPs of a jaxpr (see the module docstring for the rules).

    Args:
      closed_jaxpr: a ``ClosedJaxpr`` as returned by ``jax.make_jaxpr(fn)(...)``, or an open
        ``Jaxpr``.

    Returns:
      A ``FlopCount``.

    Raises:
      TypeError: if ``closed_jaxpr`` is neither a ``ClosedJaxpr`` nor a ``Jaxpr``.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> jaxpr = jax.make_jaxpr(jnp.tanh)(jnp.ones((3, 5)))
      >>> count_jaxpr_flops(jaxpr).other
      15.0
    """
    if not isinstance(closed_jaxpr, (core.ClosedJaxpr, core.Jaxpr)):
        raise BadType(
            "count_jaxpr_flops needs a ClosedJaxpr (from jax.make_jaxpr(fn)(*args)) or a Jaxpr, "
            f"got {type(closed_jaxpr).__name__}"
        )
    return _count(closed_jaxpr, {}).freeze()


# --------------------------------------------------------------------------------------------------
# Internal tally: plain numbers added and scaled while walking; frozen into a FlopCount at the end.


@dataclasses.dataclass
class _Tally:
    matmul: float = 0.0
    attention: float = 0.0
    other: float = 0.0
    unknown_loops: int = 0

    @property
    def total(self) -> float:
        return self.matmul + self.attention + self.other

    def add(self, other: _Tally, times: float = 1.0) -> None:
        self.matmul += times * other.matmul
        self.attention += times * other.attention
        self.other += times * other.other
        # A loop whose trip count is unknown is one place in the program, however often the
        # enclosing code runs, so the count is not multiplied.
        self.unknown_loops += other.unknown_loops

    def freeze(self) -> FlopCount:
        return FlopCount(
            total=float(self.total),
            matmul=float(self.matmul),
            attention_kernel=float(self.attention),
            other=float(self.other),
            unknown_loops=int(self.unknown_loops),
        )


_ELEMENTWISE = frozenset(
    {
        # arithmetic
        "add",
        "add_any",
        "sub",
        "mul",
        "div",
        "rem",
        "neg",
        "abs",
        "sign",
        "max",
        "min",
        "pow",
        "integer_pow",
        "square",
        "sqrt",
        "rsqrt",
        "cbrt",
        "reciprocal",
        "clamp",
        "floor",
        "ceil",
        "round",
        "nextafter",
        "atan2",
        # transcendental, counted as 1 like XLA does
        "exp",
        "exp2",
        "log",
        "log1p",
        "expm1",
        "tanh",
        "logistic",
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "asinh",
        "acosh",
        "atanh",
        "erf",
        "erfc",
        "erf_inv",
        "lgamma",
        "digamma",
        "igamma",
        "igammac",
        "bessel_i0e",
        "bessel_i1e",
        # comparisons
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "is_finite",
    }
)

# A reduction of n elements costs about n operations whatever its output size, so these count per
# *input* element (per output element would make a full sum cost 1).
_REDUCTIONS = frozenset(
    {
        "reduce_sum",
        "reduce_max",
        "reduce_min",
        "reduce_prod",
        "argmax",
        "argmin",
        "cumsum",
        "cumprod",
        "cummax",
        "cummin",
        "cumlogsumexp",
    }
)

_ATTENTION_FWD = frozenset(
    {
        "dot_product_attention_fwd_wrapper",
        "dot_product_attention_fwd",
        "dot_product_attention_fp8_fwd_wrapper",
        "dot_product_attention_fp8_fwd",
    }
)
_ATTENTION_BWD = frozenset(
    {
        "dot_product_attention_bwd_wrapper",
        "dot_product_attention_bwd",
        "dot_product_attention_fp8_bwd_wrapper",
        "dot_product_attention_fp8_bwd",
    }
)
# Flash attention's backward recomputes the scores and does four s x s matmuls.
_ATTENTION_BWD_FACTOR = 2.5
# jax/_src/cudnn/fused_attention_stablehlo.py: AttentionLayout.BNTH.value; BTNH is 0.
_LAYOUT_BNTH = 1

# Equations carrying several jaxprs of which only some run: count just these params.
_ONLY_PARAMS = types.MappingProxyType(
    {
        "custom_vjp_call": ("call_jaxpr",),
        "custom_vjp_call_jaxpr": ("fun_jaxpr",),
        "linear_call": ("callee",),
    }
)


def _count(jaxpr: core.ClosedJaxpr | core.Jaxpr, known_invars: Mapping[int, Any]) -> _Tally:
    """Walks one (closed) jaxpr. ``known_invars`` maps invar positions to static scalar values."""
    if isinstance(jaxpr, core.ClosedJaxpr):
        inner, consts = jaxpr.jaxpr, jaxpr.consts
    else:
        inner, consts = jaxpr, ()
    known = _known_consts(inner, consts)
    for i, value in known_invars.items():
        known[inner.invars[i]] = value
    tally = _Tally()
    for eqn in inner.eqns:
        tally.add(_count_eqn(eqn, known))
    return tally


def _count_eqn(eqn: core.JaxprEqn, known: _Known) -> _Tally:
    name = eqn.primitive.name
    tally = _Tally()
    if name == "dot_general":
        tally.matmul = _dot_general_flops(eqn)
    elif name == "conv_general_dilated":
        tally.matmul = _conv_flops(eqn)
    elif name == "ragged_dot_general":
        tally.matmul = ragged_dot_flops(eqn)
    elif name in _ATTENTION_FWD:
        tally.attention = _attention_fwd_flops(eqn)
    elif name in _ATTENTION_BWD:
        tally.attention = _ATTENTION_BWD_FACTOR * _attention_fwd_flops(eqn)
    elif name in _ELEMENTWISE and _is_float_op(eqn):
        tally.other = float(sum(_size(v.aval) for v in eqn.outvars))
    elif name in _REDUCTIONS and _is_float_op(eqn):
        tally.other = float(sum(_size(v.aval) for v in eqn.invars))
    elif name == "scan":
        tally = _count_scan(eqn, known)
    elif name == "while":
        tally = _count_while(eqn, known)
    elif name == "cond":
        tally = _count_cond(eqn, known)
    else:
        tally = _count_generic(eqn, known)
    return tally


def scan_operand_split(eqn: core.JaxprEqn) -> tuple[int, int]:
    """``(num_consts, num_carry)`` of a ``scan`` equation, whose operands are consts, carry, xs.

    Older jax stores both counts as params; newer jax (0.12+) drops them and describes the
    operands with a flat tree ``ft_in`` whose three children are the consts, the carry and the xs.

    Args:
      eqn: a ``scan`` equation.

    Returns:
      The number of leading const operands and the number of carry operands after them.

    Raises:
      ValueError: if the equation carries neither form.
    """
    params = eqn.params
    if "num_consts" in params and "num_carry" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    ft_in = params.get("ft_in")
    if ft_in is not None and hasattr(ft_in, "unpack"):
        consts, carry, _ = ft_in.unpack()
        return len(consts), len(carry)
    raise BadValue(
        "cannot tell a scan's consts from its carry: expected params num_consts/num_carry or "
        f"ft_in, got {sorted(params)}"
    )


def _count_scan(eqn: core.JaxprEqn, known: _Known) -> _Tally:
    # Only the consts are the same on every iteration; the carry changes, so it is not "known".
    num_consts, _ = scan_operand_split(eqn)
    body = _count(eqn.params["jaxpr"], _known_positions(eqn.invars[:num_consts], known))
    tally = _Tally()
    tally.add(body, times=eqn.params["length"])
    return tally


def _count_cond(eqn: core.JaxprEqn, known: _Known) -> _Tally:
    operands = eqn.invars[1:]  # invars[0] is the branch index
    branches = [_count(b, _known_positions(operands, known)) for b in eqn.params["branches"]]
    tally = _Tally()
    tally.add(max(branches, key=lambda t: t.total))
    tally.unknown_loops = max(b.unknown_loops for b in branches)
    return tally


def _count_while(eqn: core.JaxprEqn, known: _Known) -> _Tally:
    cond_n, body_n = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
    cond_consts = eqn.invars[:cond_n]
    body_consts = eqn.invars[cond_n : cond_n + body_n]
    body = _count(eqn.params["body_jaxpr"], _known_positions(body_consts, known))
    cond = _count(eqn.params["cond_jaxpr"], _known_positions(cond_consts, known))
    trips = _while_trip_count(eqn, known)
    tally = _Tally()
    if trips is None:
        tally.add(body)
        tally.add(cond)
        tally.unknown_loops += 1
    else:
        tally.add(body, times=trips)
        tally.add(cond, times=trips + 1)  # the predicate also runs once to exit
    return tally


def _count_generic(eqn: core.JaxprEqn, known: _Known) -> _Tally:
    tally = _Tally()
    times = _replication(eqn)
    # Only the params that run (custom_vjp's forward, not its bwd rule): nothing counted twice.
    for sub in sub_jaxprs(eqn, _ONLY_PARAMS.get(eqn.primitive.name)):
        inner = open_jaxpr(sub)
        # Call-like primitives pass their operands straight through; only then do positions line up.
        positions = (
            _known_positions(eqn.invars, known) if len(inner.invars) == len(eqn.invars) else {}
        )
        tally.add(_count(sub, positions), times=times)
    return tally


def _replication(eqn: core.JaxprEqn) -> int:
    """How many copies of the body run: shard_map and pmap bodies are traced with per-device
    shapes, so their FLOPs are multiplied by the devices they run on to give global FLOPs."""
    params = eqn.params
    if eqn.primitive.name == "shard_map" and "mesh" in params:
        mesh_shape = dict(params["mesh"].shape)
        # Nested shard_maps: the outer one already multiplied by its own axes.
        axes = params.get("newly_manual_axes") or params.get("manual_axes") or mesh_shape
        return math.prod(mesh_shape[a] for a in axes)
    if eqn.primitive.name == "xla_pmap":
        return int(params.get("axis_size", 1))
    return 1


# --------------------------------------------------------------------------------------------------
# Per-primitive formulas.


def _size(aval: Any) -> int:
    return math.prod(getattr(aval, "shape", ()))


def _is_float_op(eqn: core.JaxprEqn) -> bool:
    # Integer and boolean arithmetic (loop counters, index maths, masks) are not floating-point
    # operations; counting them would make a fori_loop's counter look like work.
    dtype = getattr(eqn.invars[0].aval, "dtype", None) if eqn.invars else None
    # jnp.issubdtype, not np.issubdtype: only jnp knows bfloat16 and float8 are floating types.
    return dtype is not None and jnp.issubdtype(dtype, jnp.inexact)


def _dot_general_flops(eqn: core.JaxprEqn) -> float:
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = eqn.params["dimension_numbers"]
    lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
    batch = math.prod(lhs[d] for d in lhs_batch)
    contract = math.prod(lhs[d] for d in lhs_contract)
    lhs_free = math.prod(s for d, s in enumerate(lhs) if d not in (*lhs_contract, *lhs_batch))
    rhs_free = math.prod(s for d, s in enumerate(rhs) if d not in (*rhs_contract, *rhs_batch))
    return 2.0 * batch * lhs_free * rhs_free * contract


def ragged_dot_flops(eqn: core.JaxprEqn) -> float:
    """FLOPs of one ``ragged_dot_general`` equation: ``2 * lhs_elems * rhs_free``.

    Each lhs element is multiplied by every rhs element of the one group its row belongs to
    along the dims it meets (contracting, batch, group): what is left of the rhs is its free
    dims. The group sizes sum to the ragged dim, so groups add up to one dense product of the
    lhs, whichever dim is ragged (free in the forward and input gradient, contracting in the
    weight gradient).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> x, w = jnp.ones((6, 4)), jnp.ones((3, 4, 5))
      >>> jaxpr = jax.make_jaxpr(jax.lax.ragged_dot)(x, w, jnp.array([1, 2, 3]))
      >>> ragged_dot_flops(jaxpr.eqns[0]) == 2 * 6 * 4 * 5
      True
    """
    numbers = eqn.params["ragged_dot_dimension_numbers"]
    (_, rhs_contract), (_, rhs_batch) = numbers.dot_dimension_numbers
    met = {*rhs_contract, *rhs_batch, *numbers.rhs_group_dimensions}
    lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
    rhs_free = math.prod(s for d, s in enumerate(rhs) if d not in met)
    return 2.0 * math.prod(lhs) * rhs_free


def _conv_flops(eqn: core.JaxprEqn) -> float:
    dims = eqn.params["dimension_numbers"]
    rhs = eqn.invars[1].aval.shape
    out_elems = _size(eqn.outvars[0].aval)
    # rhs_spec = (out_feature_dim, in_feature_dim, *spatial_dims); the kernel's in-feature size is
    # already in_features / feature_group_count.
    rhs_spec = dims.rhs_spec
    kernel_in = rhs[rhs_spec[1]]
    kernel_spatial = math.prod(rhs[d] for d in rhs_spec[2:])
    return 2.0 * out_elems * kernel_spatial * kernel_in


def _attention_fwd_flops(eqn: core.JaxprEqn) -> float:
    """Forward FLOPs of one cuDNN fused attention call, from its query/key/value shapes.

    ``4 * b * s_q * s_kv * heads * head_dim`` is two matmuls (QK^T and PV); it is written here as
    ``2 * b * heads * s_q * s_kv * (d_qk + d_v)`` so a value head dim different from the query's is
    right too.
    """
    params = eqn.params
    query, key, value = (v.aval.shape for v in eqn.invars[:3])
    layout = getattr(params.get("layout", 0), "value", params.get("layout", 0))
    if layout == _LAYOUT_BNTH:
        b, heads, s_q, d_qk = query
        s_kv, d_v = key[2], value[3]
    else:  # BTNH, what jax.nn.dot_product_attention uses
        b, s_q, heads, d_qk = query
        s_kv, d_v = key[1], value[3]
    mask = params.get("mask_type")
    causal = bool(params.get("use_causal_mask", False)) or "CAUSAL" in str(
        getattr(mask, "name", mask)
    )
    window = params.get("sliding_window_length")
    keys_per_query = float(s_kv)
    if window is not None and 0 < window < s_kv:
        keys_per_query = float(window)
    elif causal:
        keys_per_query = s_kv / 2.0
    return 2.0 * b * heads * s_q * keys_per_query * (d_qk + d_v)
