"""The policy catalogue: name -> Policy, what a checkpointed block keeps in memory.

Named policies (``minimal``, ``dots``, ``offload_inputs`` ...), the parameterized ones
(``names``, ``except``, ``offload`` and ``maxtext`` are built from tag names in
:mod:`remat_kit.policies._families`; ``either`` combines two policies here), and the one
coercion every public edge uses (:func:`as_policy`: a name, spec, Policy or raw jax
callable -> Policy).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from typing import Any

import jax
from jax.ad_checkpoint import Offloadable

from remat_kit import names as _names
from remat_kit.errors import BadType, BadValue, unknown
from remat_kit.policies._families import (
    except_policy,
    maxtext_policy,
    names_policy,
    offload_policy,
)
from remat_kit.policies._policy import Policy, decision_kind

__all__ = [
    "FULL",
    "NO_REMAT",
    "PolicyLike",
    "as_policy",
    "parse_policy",
    "policy",
    "policy_names",
    "recompute_instead",
]


def _simple(
    name: str, description: str, jax_policy: Callable[..., Any] | None
) -> Callable[..., Policy]:
    def make() -> Policy:
        return Policy(name, description, jax_policy)

    return make


def _save_names(name: str, description: str, saved: tuple[str, ...]) -> Callable[..., Policy]:
    def make() -> Policy:
        return Policy(
            name, description, jax.checkpoint_policies.save_only_these_names(*saved), tags=saved
        )

    return make


def _either_policy(a: Any, b: Any) -> Policy:
    pa, pb = as_policy(a), as_policy(b)
    if not (pa.is_remat and pb.is_remat):
        raise BadValue(
            "either(a, b) combines two remat policies; 'none' saves everything already",
            param="policy",
        )

    # jax's save_from_both_policies rejects offload decisions; rank save > offload > recompute.
    def save_either(prim: Any, *avals: Any, **params: Any) -> Any:
        outs = (pa(prim, *avals, **params), pb(prim, *avals, **params))
        kinds = [decision_kind(o) for o in outs]
        if "save" in kinds:
            return True
        if "offload" in kinds:
            return outs[kinds.index("offload")]
        return False

    return Policy(
        "either",
        f"save what {pa.spec} or {pb.spec} saves",
        save_either,
        {"a": pa, "b": pb},
        tags=tuple(dict.fromkeys(pa.tags + pb.tags)) if pa.tags and pb.tags else (),
        offloads=pa.offloads or pb.offloads,
    )


#: The grouped GEMM of mixture-of-experts layers (``jax.lax.ragged_dot``): jax's dot policies


_RAGGED_DOT = "ragged_dot_general"


def _plus_ragged(base: Callable[..., Any] | None, *, offload: bool = False) -> Callable[..., Any]:
    """``base`` that also saves (or offloads) every ``ragged_dot_general`` output."""
    ragged: Any = Offloadable(src="device", dst="pinned_host") if offload else True

    def save_ragged_dots(prim: Any, *avals: Any, **params: Any) -> Any:
        if getattr(prim, "name", None) == _RAGGED_DOT:
            return ragged
        return False if base is None else base(prim, *avals, **params)

    return save_ragged_dots


_MINIMAL = (
    _names.QUERY_PROJ,
    _names.KEY_PROJ,
    _names.VALUE_PROJ,
    _names.OUT_PROJ,
    _names.MLPWI_0,
    _names.MLPWI_1,
    _names.MLPWI,
    _names.MLPWO,
)
_QKV = (_names.QUERY_PROJ, _names.KEY_PROJ, _names.VALUE_PROJ)
_MEGATRON = tuple(n for n in _names.VOCABULARY if n not in _names.SCORE_NAMES)

_CATALOGUE: dict[str, Callable[..., Policy]] = {
    "none": _simple("none", "no rematerialization: every activation is kept (the baseline)", None),
    "full": _simple(
        "full",
        "save nothing inside a block: keep its input, recompute all of it",
        jax.checkpoint_policies.nothing_saveable,
    ),
    "everything": _simple(
        "everything",
        "checkpointed, but every intermediate is saveable (recomputes nothing)",
        jax.checkpoint_policies.everything_saveable,
    ),
    "dots": _simple(
        "dots",
        "save the result of every matmul (jax dots_saveable), including attention's",
        jax.checkpoint_policies.dots_saveable,
    ),
    "dots_no_batch": _simple(
        "dots_no_batch",
        "save matmuls without batch dims, i.e. the weight projections (jax's policy)",
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    ),
    "offload_dots_no_batch": lambda: Policy(
        "offload_dots_no_batch",
        "offload the weight-projection matmul outputs to pinned host memory",
        jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host"),
        offloads=True,
    ),
    # Mixture-of-experts: jax's dot policies see dot_general only, so they recompute the expert
    # GEMMs (ragged_dot_general); these keep them too (rk.checks.ragged_dots_recomputed).
    "ragged_dots": lambda: Policy(
        "ragged_dots",
        "save the grouped expert GEMMs only (ragged_dot_general outputs); recompute the rest",
        _plus_ragged(None),
    ),
    "dots_and_ragged": lambda: Policy(
        "dots_and_ragged",
        "save every matmul, as dots does, and the grouped expert GEMMs (ragged_dot_general)",
        _plus_ragged(jax.checkpoint_policies.dots_saveable),
    ),
    "dots_no_batch_and_ragged": lambda: Policy(
        "dots_no_batch_and_ragged",
        "save the weight matmuls, as dots_no_batch does, and the grouped expert GEMMs",
        _plus_ragged(jax.checkpoint_policies.dots_with_no_batch_dims_saveable),
    ),
    "offload_dots_no_batch_and_ragged": lambda: Policy(
        "offload_dots_no_batch_and_ragged",
        "offload the weight matmuls and the grouped expert GEMMs to pinned host memory",
        _plus_ragged(
            jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host"),
            offload=True,
        ),
        offloads=True,
    ),
    "block": _save_names(
        "block",
        "save the residual stream between sub-blocks (attn_out, block_out); recompute internals",
        (_names.ATTN_OUT, _names.BLOCK_OUT),
    ),
    "minimal": _save_names(
        "minimal",
        "save q/k/v/out and MLP in/out projections (MaxText 'minimal')",
        _MINIMAL,
    ),
    "minimal_offloaded": lambda: Policy(
        "minimal_offloaded",
        "offload the 'minimal' projections to pinned host instead of keeping them",
        jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=[],
            names_which_can_be_offloaded=list(_MINIMAL),
            offload_src="device",
            offload_dst="pinned_host",
        ),
        tags=_MINIMAL,
        offloads=True,
    ),
    # Long context: whatever the policy, every layer's input stays on device for the backward
    # pass (L x batch x seq x width); past ~32k tokens that is the largest residual left.
    "offload_inputs": lambda: Policy(
        "offload_inputs",
        "recompute every block; move its input (decoder_layer_input) to pinned host",
        jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=[],
            names_which_can_be_offloaded=[_names.DECODER_LAYER_INPUT],
            offload_src="device",
            offload_dst="pinned_host",
        ),
        tags=(_names.DECODER_LAYER_INPUT,),
        offloads=True,
    ),
    "qkv_proj": _save_names("qkv_proj", "save the q/k/v projections only", _QKV),
    "context": _save_names(
        "context", "save the attention context (probs @ v) only", (_names.CONTEXT,)
    ),
    "megatron": _save_names(
        "megatron",
        "selective recompute (Korthikanti et al. 2022): keep all but attention scores/probs",
        _MEGATRON,
    ),
    "names": names_policy,
    "except": except_policy,
    "offload": offload_policy,
    "either": _either_policy,
    "maxtext": maxtext_policy,
}

_PARAMETERIZED = ("names", "except", "offload", "either", "maxtext")
#: The parameters a spec gives as one string, not as a ``+``-joined list of tag names.
_STR_PARAMS: dict[str, tuple[str, ...]] = {
    "either": ("a", "b"),
    "offload": ("dst",),
    "maxtext": ("remat_policy",),
}


def policy_names() -> list[str]:
    """All catalogue names, sorted.

    Example:
      >>> import remat_kit as rk
      >>> "full" in rk.policy_names()
      True
    """
    return sorted(_CATALOGUE)


def policy(name: str, **params: Any) -> Policy:
    """Looks up a policy by name, building parameterized families from ``params``.

    Args:
      name: a catalogue name (see :func:`policy_names`).
      **params: parameters of the parameterized families: ``names(save=[...])``,
        ``except(names=[...])``, ``offload(offload=[...], save=[...], dst="pinned_host")``,
        ``either(a=..., b=...)``, ``maxtext(remat_policy="save_qkv_proj")`` (what MaxText
        builds for that value of its ``remat_policy``).

    Returns:
      The Policy.

    Raises:
      ValueError: unknown name or parameter (the message lists close matches).
      TypeError: a parameter of the wrong type.

    Example:
      >>> import remat_kit as rk
      >>> rk.policy("offload", offload=["context"], save=["query_proj"]).params["dst"]
      'pinned_host'
    """
    if not isinstance(name, str):
        raise BadType(
            f"policy name must be a str, got {type(name).__name__} {name!r}", param="policy"
        )
    try:
        make = _CATALOGUE[name]
    except KeyError:
        raise unknown("policy", name, _CATALOGUE, param="policy") from None
    # The parameters are checked against the maker's signature before the call, so a
    # TypeError from inside the maker is never mistaken for a misnamed parameter.
    signature = inspect.signature(make).parameters
    valid = list(signature)
    bad = [k for k in params if k not in valid]
    if bad:
        close = {k: difflib.get_close_matches(k, valid, n=1) for k in bad}
        detail = ", ".join(
            f"{k!r}" + (f" (did you mean {c[0]!r}?)" if c else "") for k, c in close.items()
        )
        raise BadValue(
            f"policy {name!r} takes no parameter {detail}; valid: {', '.join(valid) or 'none'}",
            param="policy",
        )
    missing = [
        k for k, v in signature.items() if v.default is inspect.Parameter.empty and k not in params
    ]
    if missing:
        raise BadValue(
            f"policy {name!r} needs parameter(s) {', '.join(missing)}; e.g. "
            f"rk.policy({name!r}, {missing[0]}=[...])",
            param="policy",
        )
    return make(**params)


#: What the public functions take for a policy: a catalogue name or spec
#: (``"names:save=query_proj"``), a Policy, or a raw ``jax.checkpoint`` policy callable.
#: :func:`as_policy` turns it into a Policy once, at the edge.
PolicyLike = str | Policy | Callable[..., Any]


def as_policy(p: PolicyLike | None) -> Policy:
    """Normalises what users pass as a policy: a name/spec, a Policy, a jax callable or None.

    ``None`` means no rematerialization (``"none"``). A raw callable becomes a Policy
    named ``custom``.

    Raises:
      TypeError: anything else.

    Example:
      >>> import jax, remat_kit as rk
      >>> rk.as_policy(jax.checkpoint_policies.nothing_saveable).name
      'custom'
    """
    if p is None:
        return policy("none")
    if isinstance(p, Policy):
        return p
    if isinstance(p, str):
        return parse_policy(p)
    if callable(p):
        label = getattr(p, "__name__", type(p).__name__)
        return Policy("custom", f"user policy {label}", p)
    raise BadType(
        f"policy must be a name, rk.Policy or jax policy callable, got {type(p).__name__} {p!r}",
        param="policy",
    )


def parse_policy(spec: str) -> Policy:
    """Reads a policy from a command-line string.

    Grammar: ``NAME`` or ``NAME:key=v1+v2,key2=v``; ``either`` takes ``a=`` and ``b=``
    catalogue names, ``maxtext`` one ``remat_policy=`` value, ``offload`` one ``dst=``.
    ``Policy.spec`` writes the same form.

    Raises:
      ValueError: unknown name or malformed spec.

    Example:
      >>> parse_policy("names:save=query_proj+mlpwo").params["save"]
      ('query_proj', 'mlpwo')
      >>> parse_policy("maxtext:remat_policy=save_qkv_proj").tags
      ('query_proj', 'value_proj', 'key_proj', 'kv_proj', 'qkv_proj')
    """
    name, _, rest = spec.strip().partition(":")
    if not rest:
        return policy(name)
    params: dict[str, Any] = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise BadValue(
                f"cannot read {item!r} in policy spec {spec!r}; expected key=value", param="policy"
            )
        key = key.strip()
        if key in _STR_PARAMS.get(name, ()):
            params[key] = value.strip()
        else:
            params[key] = [v.strip() for v in value.split("+") if v.strip()]
    return policy(name, **params)


def recompute_instead(p: Policy | str) -> Policy:
    """``p`` with every offload decision turned into recomputation.

    The counterpart of an offload policy for cost comparisons: the same tensors are
    recomputed instead of moved to host memory and back.

    Example:
      >>> rk.decide(recompute_instead("minimal_offloaded"), "query_proj")
      'recompute'
    """
    base = as_policy(p)
    if not base.is_remat:
        return base

    def no_offload(prim: Any, *avals: Any, **params: Any) -> Any:
        out = base(prim, *avals, **params)
        return False if decision_kind(out) == "offload" else out

    return Policy(
        "custom",
        f"{base.spec} with offloaded tensors recomputed instead",
        no_offload,
        {"of": base},
        tags=base.tags,
    )


#: The two ends every search and model source names (no remat; everything recomputed), built
#: once and passed on as objects.
NO_REMAT: Policy = policy("none")
FULL: Policy = policy("full")
