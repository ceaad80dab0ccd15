"""The ``"auto"`` mark: a block whose policy the step that runs it decides.

``rk.remat(Block, "auto")`` does not pick a policy. Each time the marked block is traced it
reads the policy from the scope this module keeps, one :class:`contextvars.ContextVar`
(data, not a decision): the step wrapper ``rk.auto`` (on a floor above, where the planner
is) traces the user's step inside :func:`auto_as` with the policy it is trying or has
decided. Outside any such scope a marked block refuses to trace
(:class:`~remat_kit.errors.AutoOutsideStep`), so a step never runs without the decision it
was marked for; a linen model's ``init`` is the one exception (nothing is differentiated
there, so no policy is needed) and runs the block as it is.

A forward pass that is not trained (evaluation) says what to use itself::

  with rk.marks.auto_as("none"):
      logits = model.apply(params, tokens)

Example:
  >>> from remat_kit import marks
  >>> with marks.auto_as("full") as scope:
  ...     marks.policy_for("Block").name
  'full'
  >>> sorted(scope.marked)
  ['Block']
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any

from remat_kit.errors import AutoOutsideStep
from remat_kit.policies import Policy, as_policy

__all__ = [
    "AUTO",
    "Deciding",
    "auto_as",
    "current",
    "policy_for",
]

#: The policy name that marks a block for the step's decision: ``rk.remat(Block, AUTO)``.
AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class Deciding:
    """The scope a step is traced in: the policy every marked block takes, and which blocks
    took it (so a wrapper can tell a step that reaches none).

    Attributes:
      policy: the policy the marked blocks apply.
      marked: names of the marked blocks traced in the scope (filled as they trace).

    Example:
      >>> Deciding(rk.policy("full")).policy.name
      'full'
    """

    policy: Policy
    marked: set[str] = dataclasses.field(default_factory=set, compare=False)


_SCOPE: contextvars.ContextVar[Deciding | None] = contextvars.ContextVar(
    "remat_kit_auto_policy", default=None
)


@contextlib.contextmanager
def auto_as(policy: Any) -> Iterator[Deciding]:
    """Traces the blocks marked ``"auto"`` inside the block with ``policy``.

    Args:
      policy: a name, spec, ``rk.Policy`` or jax policy callable (``"none"``: no remat).

    Yields:
      The scope, whose ``marked`` names the marked blocks traced in it.

    Example:
      >>> with rk.marks.auto_as("none") as scope:
      ...     scope.policy.is_remat
      False
    """
    scope = Deciding(as_policy(policy))
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


def current() -> Deciding | None:
    """The scope a marked block traced now would read, or None outside any.

    Example:
      >>> rk.marks.current() is None
      True
    """
    return _SCOPE.get()


def policy_for(block: str) -> Policy:
    """The policy the marked block ``block`` takes now, noted in the scope.

    Args:
      block: the block's name, for the scope's record and the error.

    Returns:
      The scope's policy.

    Raises:
      AutoOutsideStep: no scope: the block is traced outside any step wrapper.

    Example:
      >>> with rk.marks.auto_as("dots_no_batch"):
      ...     rk.marks.policy_for("Block").name
      'dots_no_batch'
    """
    scope = _SCOPE.get()
    if scope is None:
        raise AutoOutsideStep(
            f"rk.remat({block}, 'auto') was traced outside any step wrapper: call it in a step "
            "wrapped by rk.auto(step, budget=...), or inside rk.marks.auto_as(policy) for a "
            "pass that is not trained",
            block=block,
        )
    scope.marked.add(block)
    return scope.policy
