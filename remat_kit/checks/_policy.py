"""Policy-level checks: a policy against the tags it meets, and which policy a callable is.

``rk.remat`` registers every callable it hands to ``jax.checkpoint`` (:func:`register`), so a
checkpoint found in a jaxpr names its policy (:func:`policy_of`); a name-based policy whose
names match none of the tags it meets behaves like ``full`` (:func:`unmatched_policy`,
:func:`check_policy_matches`).

Example:
  >>> import remat_kit as rk
  >>> unmatched_policy(rk.policy("context"), ["mlpwo"])
  True
"""

from __future__ import annotations

import difflib
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from remat_kit.errors import BadValue, RematWarning
from remat_kit.names import KNOWN
from remat_kit.notes import Note, words
from remat_kit.policies import Policy, PolicyLike, as_policy, decide, is_path_pattern

__all__ = [
    "check_policy_matches",
    "policy_of",
    "register",
    "unmatched_policy",
]


# Callables handed to jax.checkpoint on behalf of a Policy (rk.remat's recorders) -> the
# Policy, so a checkpoint in a jaxpr can be traced back to the policy it was made for. Weak:
# an entry lives as long as its callable (a jaxpr or a wrapped class holding it).
_REGISTRY: weakref.WeakKeyDictionary[Callable[..., Any], Policy] = weakref.WeakKeyDictionary()


def register(fn: Callable[..., Any], policy: Policy) -> Callable[..., Any]:
    """Records that ``fn`` was handed to ``jax.checkpoint`` for ``policy``; returns ``fn``."""
    _REGISTRY[fn] = policy
    return fn


def policy_of(fn: Any) -> Policy | None:
    if isinstance(fn, Policy):
        return fn
    try:
        return _REGISTRY.get(fn)
    except TypeError:  # not weakly referenceable, so never registered
        return None


def unmatched_policy(policy: PolicyLike, tags: Iterable[str]) -> bool:
    """Whether a name-based ``policy`` keeps none of ``tags``: it then behaves like ``full``.

    Args:
      policy: a policy name, spec or Policy; policies that do not decide by name never count.
      tags: the tags a program has.

    Returns:
      True when ``policy`` names tags and saves or offloads none of ``tags``.

    Example:
      >>> unmatched_policy("minimal", ["context"]), unmatched_policy("minimal", ["query_proj"])
      (True, False)
    """
    pol = as_policy(policy)
    if not pol.is_remat or not pol.tags:
        return False
    return all(decide(pol, t) == "recompute" for t in tags)


def check_policy_matches(
    policy: PolicyLike, tags: Iterable[str], *, strict: bool = False, where: str = "the program"
) -> Note | None:
    """Says so when a name-based policy matches no tag of a program.

    With ``strict``, a name the policy was given that is neither ours
    (:data:`remat_kit.names.KNOWN`: our vocabulary, which a model may use in part, and
    MaxText's names beyond it) nor a tag of the program is an error too: it is a typo of a
    model's own name (``mlp_gat``), which would otherwise pass as long as another name
    matched.

    Args:
      policy: a policy name, spec or Policy.
      tags: the tags of the traced program.
      strict: raise instead of warning (the CLI).
      where: what was traced, for the message.

    Returns:
      The note (kind ``no_tag_matched_in``: the policy, its names, ``where`` and the tags
      there), also issued as a RematWarning in words; None when the policy matches (or does
      not decide by name).

    Raises:
      BadValue: with ``strict``, when nothing matches (one line listing the tags that exist),
        or when a name outside our vocabulary is no tag of the program.

    Example:
      >>> check_policy_matches("context", ["query_proj"], strict=True)
      Traceback (most recent call last):
      remat_kit.errors.BadValue: policy 'context' names context but ...
      >>> with warnings.catch_warnings(record=True) as said:
      ...     warnings.simplefilter("always")
      ...     check_policy_matches("names:save=mlp_gate+mlp_gat", ["mlp_gate"], strict=True)
      Traceback (most recent call last):
      remat_kit.errors.BadValue: policy 'names:save=mlp_gate+mlp_gat' names 'mlp_gat' ...
      >>> print(said[0].message)  # the policy says so as it is made: names of the model's own
      save: 'mlp_gate', 'mlp_gat' not in remat_kit's tag vocabulary; only tensors you tagged ...
    """
    pol = as_policy(policy)
    present = sorted(set(tags))
    if strict:
        _check_own_names(pol, present, where)
    if not unmatched_policy(pol, present):
        return None
    note = Note(
        "no_tag_matched_in",
        {"policy": pol.spec, "names": pol.tags, "where": where, "tags": present},
    )
    if strict:
        raise BadValue(words(note))
    warnings.warn(words(note), RematWarning, stacklevel=2)
    return note


def _check_own_names(pol: Policy, present: list[str], where: str) -> None:
    # Names we do not know are a model's own: each must be a tag of the program.
    stray = [n for n in pol.tags if n not in KNOWN and n not in present and not is_path_pattern(n)]
    if not stray:
        return
    close = {n: (difflib.get_close_matches(n, present, n=1) or [None])[0] for n in stray}
    raise BadValue(
        words(
            Note(
                "stray_tag_names",
                {"policy": pol.spec, "names": close, "where": where, "tags": present},
            )
        )
    )
