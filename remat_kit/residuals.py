"""What a policy actually keeps: the residuals of a function's backward pass, by tag name.

The residuals are the values the forward pass hands to the backward pass: what stays
in memory between them. We trace ``jax.vjp`` abstractly and follow every residual back
to the op that made it, through ``scan`` (scanned layers stack residuals along a layer
axis), ``jit``, ``checkpoint``, ``shard_map``, ``custom_vjp`` and ``closed_call`` boundaries
and host-offload ``device_put`` s, so a residual is reported by its ``checkpoint_name`` tag
even in a scanned model or an expert computation inside ``shard_map``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
from jax.extend import core

from remat_kit._jaxpr import (
    is_checkpoint,
    kind_of,
    open_jaxpr,
    params_of,
    sub_jaxprs,
    tag_of,
    tags_in,
)
from remat_kit._shapes import array_bytes
from remat_kit.flops import scan_operand_split
from remat_kit.policies import Policy, as_policy, decide

__all__ = ["Residual", "ResidualReport", "expected_decisions", "saved_residuals", "tags_in"]

# Primitives whose output is its (only) input, reshaped or retyped: look through them.
_PASS_THROUGH = {
    "convert_element_type",
    "reduce_precision",
    "copy",
    "copy_p",
    "reshape",
    "squeeze",
    "broadcast_in_dim",
}
# Primitives whose output is its input's very value (its bytes, its dtype): a tag of the
# output names the input's value too.
_SAME_VALUE = {"sharding_constraint", "copy", "copy_p", "reshape", "squeeze"}
# Primitives that wrap one sub-jaxpr whose outputs are the eqn's outputs one to one (a
# shard_map's body sees per-device shapes of the same values).
_CALLS = {
    "pjit",
    "jit",
    "closed_call",
    "core_call",
    "remat2",
    "remat",
    "checkpoint",
    "RematTraced",
    "custom_jvp_call",
    "custom_vjp_call",
    "custom_vjp_call_jaxpr",
    "shard_map",
}
# Calls that hold other jaxprs besides the one that runs: follow only this one.
_RUNS = {"custom_vjp_call": ("call_jaxpr",), "custom_vjp_call_jaxpr": ("fun_jaxpr",)}


@dataclasses.dataclass(frozen=True)
class Residual:
    """One value kept for the backward pass.

    Attributes:
      name: the ``checkpoint_name`` tag, ``"argument"`` for an input of the function (a
        weight or the batch), else ``"<primitive>"`` of the op that produced it.
      shape: its shape (with a leading layer axis when it comes out of a scan).
      dtype: dtype name.
      nbytes: bytes.
      kind: ``"saved"`` (in device memory) or ``"offloaded"`` (in host memory).
      layers: how many layers share it (the scan length, else 1).
      source: where it came from, for a human reader.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    kind: str
    layers: int
    source: str

    @property
    def tagged(self) -> bool:
        return not (self.name == "argument" or self.name.startswith("<"))


@dataclasses.dataclass(frozen=True)
class ResidualReport:
    """Residuals of a function's backward pass, and the decision for every tag.

    Attributes:
      residuals: every residual, in jaxpr order.
      tags: tag name -> ``"saved" | "offloaded" | "recomputed" | "not needed"`` for every
        tag in the forward pass. "recomputed": not kept, so recomputed if the backward
        pass needs it; "not needed": the policy would keep it but the backward pass never
        reads it (e.g. an output projection whose sum with the residual is kept).
      tag_bytes: tag name -> bytes of one occurrence (a layer's worth).
      tag_count: tag name -> number of occurrences (layers x uses).
      segment_offloaded_bytes: under a segment schedule (``every:k``, ``sqrt``,
        ``nested:m``) a segment keeps only its input, and its layers' policy offloads their
        residuals while the backward pass recomputes the segment, one segment at a time:
        the most bytes one segment offloads then (0 when no checkpoint holds another).
      same: tag name -> the other tags of the same value (``checkpoint_name`` of a
        ``checkpoint_name``: a model's own name and ours beside it, MaxText's MoE names): a
        residual carries one of them.
      checkpointed: the tags inside a checkpoint of the forward pass (none where nothing is
        checkpointed: ``none``). A policy decides nothing for a tag outside every
        checkpoint (a model's head after its stack): the plan never names one.
    """

    residuals: tuple[Residual, ...]
    tags: Mapping[str, str]
    tag_bytes: Mapping[str, int]
    tag_count: Mapping[str, int]
    segment_offloaded_bytes: int = 0
    same: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    checkpointed: frozenset[str] = frozenset()

    def kept_bytes(self, tag: str) -> int:
        """Bytes of the residuals that carry ``tag`` or another name of the same value.

        Example:
          >>> r = Residual("query_proj", (2, 4), "float32", 32, "saved", 1, "")
          >>> rep = ResidualReport((r,), {}, {}, {}, same={"attn_query": ("query_proj",)})
          >>> rep.kept_bytes("attn_query"), rep.kept_bytes("context")
          (32, 0)
        """
        names = {tag, *self.same.get(tag, ())}
        return sum(r.nbytes for r in self.residuals if r.name in names)

    @property
    def marked_bytes(self) -> int:
        """Bytes jax marks for host memory that are there at once: the offloaded residuals,
        or under a segment schedule those of the one segment being recomputed, whichever is
        more. (A schedule's layers outside segments come after them - ``nested:m``'s
        leftover layers - so their backward pass, and their host buffers, end before the
        first segment is recomputed.)"""
        return max(self.bytes_by("offloaded"), self.segment_offloaded_bytes)

    def bytes_by(self, kind: str | None = None, *, tagged_only: bool = False) -> int:
        """Total residual bytes, optionally only ``kind`` and/or only tagged ones."""
        return sum(
            r.nbytes
            for r in self.residuals
            if (kind is None or r.kind == kind) and (r.tagged or not tagged_only)
        )

    def per_name(self) -> dict[str, dict[str, Any]]:
        """name -> {kind, bytes, per_layer_bytes, count}, residuals grouped by name."""
        out: dict[str, dict[str, Any]] = {}
        for r in self.residuals:
            key = r.name if r.name != "argument" else "arguments (weights, batch)"
            row = out.setdefault(
                key, {"kind": r.kind, "bytes": 0, "per_layer_bytes": 0, "count": 0}
            )
            row["bytes"] += r.nbytes
            row["count"] += r.layers
            if row["kind"] != r.kind:
                row["kind"] = "mixed"
        for row in out.values():
            row["per_layer_bytes"] = row["bytes"] // max(row["count"], 1)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "tags": dict(self.tags),
            "tag_bytes": dict(self.tag_bytes),
            "tag_count": dict(self.tag_count),
            "by_name": self.per_name(),
            "saved_bytes": self.bytes_by("saved"),
            "offloaded_bytes": self.bytes_by("offloaded"),
            "segment_offloaded_bytes": self.segment_offloaded_bytes,
            "marked_bytes": self.marked_bytes,
        }


def saved_residuals(
    fn: Callable[..., Any], *args: Any, policy: Policy | str | None = None
) -> ResidualReport:
    """Traces ``jax.vjp(fn, *args)`` abstractly and names what the backward pass keeps.

    Args:
      fn: a differentiable function (e.g. a loss of the parameters).
      *args: arrays or ``jax.ShapeDtypeStruct`` pytrees; nothing is allocated.
      policy: the policy ``fn`` was built with, if known: tags it would save that are
        not residuals are then reported as "not needed" instead of "recomputed".

    Returns:
      A ResidualReport.

    Example:
      >>> import jax, jax.numpy as jnp, remat_kit as rk
      >>> from jax.ad_checkpoint import checkpoint_name
      >>> f = rk.remat(lambda x: jnp.sin(checkpoint_name(jnp.sin(x), "context")).sum(), "context")
      >>> rk.saved_residuals(f, jnp.ones(3)).tags["context"]
      'saved'
    """
    leaves, tree = jax.tree.flatten(args)

    def flat(*xs: Any) -> Any:
        return fn(*jax.tree.unflatten(tree, xs))

    closed, out_shape = jax.make_jaxpr(lambda *xs: jax.vjp(flat, *xs), return_shape=True)(*leaves)
    jaxpr = closed.jaxpr
    n_res = len(jax.tree.leaves(out_shape[1]))
    res_vars = jaxpr.outvars[len(jaxpr.outvars) - n_res :]
    producers = {v: e for e in jaxpr.eqns for v in e.outvars}
    invars = list(jaxpr.invars)

    residuals = []
    seen: set[Any] = set()
    for v in res_vars:
        if isinstance(v, core.Literal) or v in seen:
            continue
        seen.add(v)
        aval = v.aval
        nbytes = array_bytes(aval.shape, aval.dtype)
        name, layers, source = _trace_back(v, producers, invars)
        kind = "offloaded" if _on_host(aval) else "saved"
        residuals.append(
            Residual(name, tuple(aval.shape), str(aval.dtype), nbytes, kind, layers, source)
        )

    forward = jax.make_jaxpr(flat)(*leaves)
    present = tags_in(forward)
    intended = expected_decisions(policy, present) if policy is not None else {}
    aliases = _aliases(forward.jaxpr)
    decided: dict[str, str] = {}
    for tag in present:
        same = aliases.get(tag, {tag})
        kinds = {r.kind for r in residuals if r.name in same}
        if "saved" in kinds:
            decided[tag] = "saved"
        elif "offloaded" in kinds:
            decided[tag] = "offloaded"
        elif intended.get(tag) in ("saved", "offloaded"):
            decided[tag] = "not needed"
        else:
            decided[tag] = "recomputed"
    return ResidualReport(
        residuals=tuple(residuals),
        tags=decided,
        tag_bytes={t: b for t, (b, _) in present.items()},
        tag_count={t: c for t, (_, c) in present.items()},
        segment_offloaded_bytes=_segment_offloaded(forward.jaxpr),
        same={t: tuple(sorted(group - {t})) for t, group in aliases.items() if t in present},
        checkpointed=_checkpointed(forward.jaxpr),
    )


def _checkpointed(jaxpr: Any) -> frozenset[str]:
    """The tags inside any checkpoint of ``jaxpr`` (scans, conds and calls descended)."""
    found: set[str] = set()
    for eqn in jaxpr.eqns:
        if is_checkpoint(eqn):
            found.update(tags_in(params_of(eqn)["jaxpr"]))
        for sub in sub_jaxprs(eqn):
            found |= _checkpointed(open_jaxpr(sub))
    return frozenset(found)


def expected_decisions(p: Policy | str, tags: Mapping[str, Any]) -> dict[str, str]:
    """What a name-based policy says it does with each tag (no tracing)."""
    pol = as_policy(p)
    word = {"save": "saved", "offload": "offloaded", "recompute": "recomputed"}
    return {t: word[decide(pol, t)] if pol.is_remat else "saved" for t in tags}


def _aliases(jaxpr: Any) -> dict[str, set[str]]:
    """Tags that name one value: ``checkpoint_name(checkpoint_name(x, a), b)`` (MaxText tags
    expert outputs under their MoE and their dense names alike), also with a sharding
    constraint, a copy or a reshape between the two (MaxText's pipeline: a stage's
    ``decoder_layer_input`` is its ``iteration_input``, constrained). A policy that keeps the
    value under either name keeps it, and the residual carries one of them."""
    groups: dict[str, set[str]] = {}

    def walk(jx: Any) -> None:
        made = {}
        for eqn in jx.eqns:
            src = eqn.invars[0] if eqn.invars else None
            if kind_of(eqn) in _SAME_VALUE and not isinstance(src, core.Literal) and src in made:
                made[eqn.outvars[0]] = made[src]  # the same bytes, still named
                continue
            name = tag_of(eqn)
            if name is not None:
                made[eqn.outvars[0]] = name
                inner = (
                    made.get(eqn.invars[0]) if not isinstance(eqn.invars[0], core.Literal) else None
                )
                if inner is not None and inner != name:
                    joined = groups.get(name, {name}) | groups.get(inner, {inner})
                    for t in joined:
                        groups[t] = joined
                continue
            for sub in sub_jaxprs(eqn):
                walk(open_jaxpr(sub))

    walk(jaxpr)
    return groups


def _segment_offloaded(jaxpr: Any) -> int:
    """The most bytes the checkpoints inside one checkpoint (a segment) offload.

    The backward pass recomputes a segment from its input and runs the segment's backward
    pass at once: what the checkpoints inside it offload is the segment's own ``vjp``
    residuals, in host memory while that segment's backward pass runs. Segments are
    recomputed one after another, so the largest one counts.
    """
    most = 0
    for eqn in jaxpr.eqns:
        if is_checkpoint(eqn):
            body = params_of(eqn)["jaxpr"]
            if _holds_checkpoint(open_jaxpr(body)):
                most = max(most, _offloaded_by(body))
            continue
        for sub in sub_jaxprs(eqn):
            most = max(most, _segment_offloaded(open_jaxpr(sub)))
    return most


def _holds_checkpoint(jaxpr: Any) -> bool:
    return any(
        is_checkpoint(eqn) or any(_holds_checkpoint(open_jaxpr(sub)) for sub in sub_jaxprs(eqn))
        for eqn in jaxpr.eqns
    )


def _offloaded_by(body: Any) -> int:
    """Bytes a checkpoint's body marks for host memory at once, run as a plain function."""
    closed = body if isinstance(body, core.ClosedJaxpr) else core.ClosedJaxpr(body, ())
    run = core.jaxpr_as_fun(closed)
    args = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars]
    return saved_residuals(lambda *xs: run(*xs), *args).marked_bytes


def _on_host(aval: Any) -> bool:
    space = getattr(aval, "memory_space", None)
    return space is not None and "host" in str(space).lower()


def _trace_back(v: Any, producers: Mapping[Any, Any], invars: list[Any]) -> tuple[str, int, str]:
    """Follows ``v`` to the op that made it: (name, layers it spans, source)."""
    layers = 1
    # Each frame: (producers, inner invars, the eqn that called into it); the bottom
    # frame is the function itself, whose invars are its arguments.
    frames: list[tuple[Mapping[Any, Any], list[Any], Any]] = [(producers, list(invars), None)]
    for _ in range(256):  # bound on steps; real programs need a few dozen
        prods, ins, caller = frames[-1]
        if isinstance(v, core.Literal):
            return "<literal>", layers, "a literal"
        if v in ins:
            if caller is None:
                return "argument", layers, "an input of the function"
            pos = ins.index(v)
            if caller.primitive.name == "scan":
                n_consts, n_carry = scan_operand_split(caller)
                if n_consts <= pos < n_consts + n_carry:
                    # A scan keeps each iteration's carry: for a layer stack, its input.
                    return "<layer input>", layers, "the carry entering each scan iteration"
            # Leave the sub-jaxpr: continue from the caller's matching operand.
            v = caller.invars[pos]
            frames.pop()
            continue
        eqn = prods.get(v)
        if eqn is None:
            return "<constant>", layers, "a constant"
        prim = kind_of(eqn)
        if (tag := tag_of(eqn)) is not None:
            return tag, layers, _where(eqn)
        # jax's dot policies save (or offload) a matmul's output before the name op
        # that tags it: report the value under the tag its consumer gives it.
        tag = _tag_of_value(v, prods)
        if tag is not None:
            return tag, layers, _where(eqn)
        if prim == "device_put":
            v = eqn.invars[eqn.outvars.index(v)]
            continue
        if prim in _PASS_THROUGH:
            v = eqn.invars[0]
            continue
        subs = [open_jaxpr(j) for j in sub_jaxprs(eqn, _RUNS.get(prim))]
        if (prim == "scan" or prim in _CALLS) and len(subs) == 1:
            inner = subs[0]
            out = inner.outvars[eqn.outvars.index(v)]
            if isinstance(out, core.Literal):
                return "<literal>", layers, "a literal"
            if prim == "scan":
                layers *= int(eqn.params["length"])
            frames.append(({o: e for e in inner.eqns for o in e.outvars}, list(inner.invars), eqn))
            v = out
            continue
        return f"<{prim}>", layers, _where(eqn)
    return "<unknown>", layers, "too deeply nested to follow"


def _tag_of_value(v: Any, producers: Mapping[Any, Any], hops: int = 2) -> str | None:
    eqns = list(producers.values())
    for eqn in eqns:
        if eqn.invars and eqn.invars[0] is v and (tag := tag_of(eqn)) is not None:
            return tag
    if hops == 0:
        return None
    # A layer with a bias (GPT-2's Dense) tags dot + bias: jax's dot policies keep the dot's
    # output, an add before the tag. Report it under that tag, or an offloaded projection
    # would read "recomputed" beside an untagged "<dot_general>". Only a bias add (the other
    # operand smaller) is followed: a residual add (x + attention) joins two tensors.
    size = getattr(v.aval, "size", None)
    for eqn in eqns:
        if eqn.primitive.name != "add" or not any(x is v for x in eqn.invars):
            continue
        other = [x for x in eqn.invars if x is not v]
        if other and size is not None and getattr(other[0].aval, "size", size) < size:
            tag = _tag_of_value(eqn.outvars[0], producers, hops - 1)
            if tag is not None:
                return tag
    return None


def _where(eqn: Any) -> str:
    try:
        from jax._src import source_info_util

        return source_info_util.summarize(eqn.source_info)
    except Exception:  # source info is a debugging aid only
        return ""
