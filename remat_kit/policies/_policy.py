"""The Policy value: the callable ``jax.checkpoint(policy=...)`` takes, named, and what it decides.

A :class:`Policy` is itself callable with jax's policy signature, so a Policy goes wherever a
raw jax policy does; :func:`decide` and :func:`decide_eqn` ask one what it does with a tagged
tensor or a jaxpr equation's output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from jax.ad_checkpoint import Offloadable, Saveable, name_p

__all__ = [
    "Policy",
    "PolicyKind",
    "decide",
    "decide_eqn",
    "decision_kind",
    "is_path_pattern",
]

#: What a policy does with one tensor: keep it in HBM, move it to host, or recompute it.
PolicyKind = str  # "save" | "offload" | "recompute"


@dataclasses.dataclass(frozen=True)
class Policy:
    """A rematerialization policy: what a checkpointed block keeps in memory.

    Attributes:
      name: catalogue name (``"custom"`` for a user's own callable).
      description: one line a user can read in ``remat-kit policies``.
      jax_policy: the callable handed to ``jax.checkpoint(policy=...)``. ``None`` only
        for ``"none"``, which means no rematerialization at all.
      params: the parameters a parameterized family was built with.
      tags: for a name-based policy, the tags it saves or offloads (empty otherwise):
        a report warns when a program has none of them.
      offloads: whether the policy moves anything to host memory.

    Example:
      >>> import remat_kit as rk
      >>> rk.policy("dots_no_batch").name
      'dots_no_batch'
    """

    name: str
    description: str
    jax_policy: Callable[..., Any] | None
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tags: tuple[str, ...] = ()
    offloads: bool = False

    @property
    def is_remat(self) -> bool:
        """False only for ``none``: the block is not checkpointed at all."""
        return self.jax_policy is not None

    @property
    def spec(self) -> str:
        """The policy as a string :func:`parse_policy` reads back, e.g. ``names:save=context``."""
        if not self.params:
            return self.name
        parts = []
        for key, value in self.params.items():
            if isinstance(value, Policy):
                parts.append(f"{key}={value.spec}")
            elif isinstance(value, tuple):
                parts.append(f"{key}={'+'.join(value)}")
            else:
                parts.append(f"{key}={value}")
        return f"{self.name}:{','.join(parts)}"

    def __eq__(self, other: object) -> bool:
        # Catalogue policies are equal by what they do (their spec), not by the identity
        # of the closure jax builds for them; a custom policy is its callable.
        if not isinstance(other, Policy):
            return NotImplemented
        if self.name == "custom" or other.name == "custom":
            return self.name == other.name and self.jax_policy is other.jax_policy
        return self.spec == other.spec

    def __hash__(self) -> int:
        # params may hold lists and Policies; the spec string identifies the policy.
        return hash((self.name, self.spec, id(self.jax_policy) if self.name == "custom" else 0))

    def __call__(self, prim: Any, *avals: Any, **params: Any) -> Any:
        # "none" used as a raw policy means keep everything: no recomputation either way.
        if self.jax_policy is None:
            return True
        return self.jax_policy(prim, *avals, **params)


def decide(p: Policy | Callable[..., Any], name: str) -> PolicyKind:
    """What ``p`` does with a tensor tagged ``name`` (via ``checkpoint_name``).

    Args:
      p: a Policy or a raw jax policy callable.
      name: a tag, e.g. ``"query_proj"``.

    Returns:
      ``"save"``, ``"offload"`` or ``"recompute"``.

    Example:
      >>> import remat_kit as rk
      >>> rk.decide(rk.policy("minimal"), "query_proj"), rk.decide(rk.policy("minimal"), "context")
      ('save', 'recompute')
    """
    # Under jax_remat3 too, policies are asked about a tag with name_p (jax/_src/ad_checkpoint.py,
    # CheckpointName.remat), though the tag's equation binds a "hi" primitive there.
    return decision_kind(p(name_p, name=name))


def decision_kind(out: Any) -> PolicyKind:
    """What a jax policy's answer means: ``"save"``, ``"offload"`` or ``"recompute"``."""
    if out is True or out is Saveable:
        return "save"
    if isinstance(out, Offloadable):
        return "offload"
    return "recompute"


def is_path_pattern(name: str) -> bool:
    """Whether a name given to a policy is a module path or a glob (``*/mixer``), which names
    the tags :mod:`remat_kit.tagging` gives models nobody tagged.

    Example:
      >>> is_path_pattern("model/layers/*/mlp"), is_path_pattern("mlp_gate")
      (True, False)
    """
    return any(c in name for c in "/*?[")


def decide_eqn(p: Policy | Callable[..., Any], eqn: Any) -> PolicyKind:
    """What ``p`` does with the output of one equation of a jaxpr (as ``jax.checkpoint`` asks it).

    Example:
      >>> import jax, jax.numpy as jnp, remat_kit as rk
      >>> eqn = jax.make_jaxpr(jax.lax.ragged_dot)(
      ...     jnp.ones((4, 2)), jnp.ones((2, 2, 3)), jnp.array([1, 3])).eqns[0]
      >>> decide_eqn(rk.policy("dots"), eqn), decide_eqn(rk.policy("dots_and_ragged"), eqn)
      ('recompute', 'save')
    """
    return decision_kind(p(eqn.primitive, *(v.aval for v in eqn.invars), **eqn.params))
