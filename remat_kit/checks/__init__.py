"""No silent no-ops, no stale figures: checks on the program a policy was traced into.

Three ways a report can show figures for a policy that did nothing, each checked here from
the traced program (a jaxpr) or the compiled report:

- a name-based policy whose names match no tag of the program behaves like ``full``
  (:func:`unmatched_policy`, :func:`check_policy_matches`);
- a model that ignores the policy it is given, or a trace reused from an earlier policy (a
  module-level ``jax.jit``, a Flax ``nn.jit`` cache): the program then holds no checkpoint
  with that policy, or is identical to the previous policy's (:func:`check_traced_with`);
- offload that XLA did not carry out in full: it moved fewer bytes to host memory than jax
  marked for offload, which happens on unrolled layers (:func:`offload_shortfall`);
- a dot policy (``dots``, ``dots_no_batch``, ...) on a mixture-of-experts model: jax's dot
  policies look for ``dot_general`` only, so the grouped expert GEMMs
  (``ragged_dot_general``) are recomputed (:func:`ragged_dots_recomputed`).

Example:
  >>> import remat_kit as rk
  >>> unmatched_policy(rk.policy("context"), ["mlpwo"])
  True

The policy-level checks (a policy against the tags it meets: what ``rk.remat`` asks when it
wraps a block) live in :mod:`remat_kit.checks._policy`; the program-level ones (a traced
jaxpr, a compiled report) in :mod:`remat_kit.checks._program`.
"""

from remat_kit.checks._policy import check_policy_matches, policy_of, register, unmatched_policy
from remat_kit.checks._program import (
    OFFLOAD_SHORTFALL,
    Trace,
    check_traced_with,
    checkpoint_policies,
    expert_dots_recomputed,
    keeps_dots,
    offload_shortfall,
    ragged_dots_recomputed,
    same_policy,
)

__all__ = [
    "OFFLOAD_SHORTFALL",
    "Trace",
    "check_policy_matches",
    "check_traced_with",
    "checkpoint_policies",
    "expert_dots_recomputed",
    "keeps_dots",
    "offload_shortfall",
    "policy_of",
    "ragged_dots_recomputed",
    "register",
    "same_policy",
    "unmatched_policy",
]
