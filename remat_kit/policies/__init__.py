"""Policies: what a checkpointed block keeps in memory, by name.

A :class:`Policy` wraps the callable that ``jax.checkpoint(policy=...)`` takes. It is
itself callable with the same signature, so a Policy goes wherever a raw jax policy
does, and a raw jax policy callable goes wherever a Policy does (see :func:`as_policy`).

The value is :mod:`remat_kit.policies._policy`; the catalogue and the coercion every public
edge uses are :mod:`remat_kit.policies._catalogue`; the families built from tag names
(``names``, ``except``, ``offload``, ``maxtext``) are :mod:`remat_kit.policies._families`.
"""

from remat_kit.policies._catalogue import (
    FULL,
    NO_REMAT,
    PolicyLike,
    as_policy,
    parse_policy,
    policy,
    policy_names,
    recompute_instead,
)
from remat_kit.policies._policy import Policy, PolicyKind, decide, decide_eqn, is_path_pattern

__all__ = [
    "FULL",
    "NO_REMAT",
    "Policy",
    "PolicyKind",
    "PolicyLike",
    "as_policy",
    "decide",
    "decide_eqn",
    "is_path_pattern",
    "parse_policy",
    "policy",
    "policy_names",
    "recompute_instead",
]
