"""The tags of a model's step, and whether policies can act on it (before any compile): a
policy whose names match no tag behaves like ``full``; one the source's steps cannot take
(its ``refuses``) is left out of a default catalogue with the source's reason.

Example:
  >>> src = rk.sources.from_factory(tiny_model)
  >>> check_policies(src, rk.TrainConfig(batch=2, seq=16), "h100", ["full"])  # names nothing
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from typing import Any

import jax

from remat_kit import checks
from remat_kit.errors import BadValue
from remat_kit.notes import Note
from remat_kit.policies import NO_REMAT, Policy, as_policy
from remat_kit.residuals import tags_in
from remat_kit.schedules import NO_SCHEDULE
from remat_kit.sources._depth import shallow_copies
from remat_kit.sources._protocol import StepSource
from remat_kit.sources._remember import _remembered
from remat_kit.targets import Target, as_target
from remat_kit.train import TrainConfig

__all__ = [
    "buildable_policies",
    "check_policies",
    "tags",
    "usable_policies",
]


def tags(source: StepSource, config: TrainConfig, target: Target | str) -> tuple[str, ...]:
    """The checkpoint-name tags of the source's step; traced once per source, remembered.

    Tags do not depend on the policy or the batch: one micro-batch of one sequence (the
    smallest batch the config's accumulation allows) is traced under ``none``.

    Args:
      source: the model source.
      config: the train config (its batch is reduced to one micro-batch).
      target: where it would run (the attention kernel may depend on it).

    Returns:
      The sorted tags.
    """
    t = as_target(target)
    small = dataclasses.replace(config, batch=source.smallest_batch(config, t))
    return _tags(source, small, t, bool(jax.config.jax_remat3))


@functools.lru_cache(maxsize=64)
def _tags(source: StepSource, config: TrainConfig, t: Target, remat3: bool) -> tuple[str, ...]:
    # remat3 (jax's remat implementation) is part of the memo's key only: the trace below
    # runs under the flag as it is, and a process may switch it between two calls.
    def compute() -> list[str]:
        none, sch = NO_REMAT, NO_SCHEDULE
        # Traced at full depth: tags name layers by index (``layers_7/mixer``).
        step = source.build_step(none, sch, config, t, sharded=False).step
        return sorted(tags_in(jax.make_jaxpr(step.loss_fn)(*step.loss_args)))

    return tuple(_remembered("tags", source, t, config, compute))


def check_policies(
    source: StepSource, config: TrainConfig, target: Target | str, policies: Iterable[Any]
) -> None:
    """Before any compile: every name-based policy must match a tag of the model.

    Args:
      source: the model source.
      config: the train config.
      target: the target (the attention kernel, hence the tags, may depend on it).
      policies: policy names, specs or Policies.

    Raises:
      BadValue: the first policy that matches no tag (one line listing the tags there).
    """
    pols = [as_policy(p) for p in policies]
    if not any(p.tags for p in pols):
        return
    t = as_target(target)
    near = _copy_tags(source, config, t)
    if near is not None:
        try:
            for p in pols:
                checks.check_policy_matches(p, near, strict=True, where=source.spec)
            return
        except BadValue:
            pass  # the model's later layers may hold what a copy lacks: ask the whole model
    there = tags(source, config, t)
    for p in pols:
        checks.check_policy_matches(p, there, strict=True, where=source.spec)


def _copy_tags(source: StepSource, config: TrainConfig, t: Target) -> tuple[str, ...] | None:
    """The tags of the deepest shallow copy of an unrolled stack, or None without copies.

    A copy is the model's first layers, so its tags are some of the model's: a policy that
    matches them matches the model, and a 32-layer trace (a tenth of ``compare``'s time on a
    2048-wide Llama) is saved. What a copy does not match is asked of the whole model."""
    copies = shallow_copies(source, NO_SCHEDULE, t)
    if copies is None:
        return None
    small = dataclasses.replace(config, batch=source.smallest_batch(config, t))
    return _tags(copies[-1], small, t, bool(jax.config.jax_remat3))


def usable_policies(
    source: StepSource,
    config: TrainConfig,
    target: Target | str,
    policies: Iterable[Any],
    *,
    given: bool,
) -> tuple[list[Policy], list[str]]:
    """The policies that can act on the model, and the specs of those that cannot.

    Args:
      source: the model source.
      config: the train config.
      target: the target.
      policies: policy names, specs or Policies.
      given: the user named them: those matching no tag are still skipped where others run
        (the caller names them), but when none would run, or a policy names some tags the
        model has and some it lacks (a typo), that is an error.

    Returns:
      (kept policies, skipped specs).

    Raises:
      BadValue: ``given``, and no policy can act on the model, or one half-matches: one line
        listing the model's tags.
    """
    pols = [as_policy(p) for p in policies]
    if not any(p.tags for p in pols):
        return pols, []
    if given:
        try:
            check_policies(source, config, target, pols)
            return pols, []
        except BadValue:
            there = tags(source, config, target)
            skipped = [p.spec for p in pols if checks.unmatched_policy(p, there)]
            if not skipped or len(skipped) == len(pols):
                raise
            kept = [p for p in pols if p.spec not in skipped]
            check_policies(source, config, target, kept)  # a typo among the rest still fails
            return kept, skipped
    near = _copy_tags(source, config, as_target(target))
    if near is not None and not any(checks.unmatched_policy(p, near) for p in pols):
        return pols, []
    there = tags(source, config, target)
    skipped = [p.spec for p in pols if checks.unmatched_policy(p, there)]
    return [p for p in pols if p.spec not in skipped], skipped


def buildable_policies(
    source: StepSource, config: TrainConfig, target: Target | str, policies: Iterable[Any]
) -> tuple[list[Policy], list[Note]]:
    """The policies the source's steps can take, and a note for each one it cannot (its
    :meth:`~remat_kit.sources.StepSource.refuses`): what a default catalogue leaves out, said
    with the source's reason, never dropped in silence.

    Args:
      source: the model source.
      config: the train config.
      target: the target.
      policies: policy names, specs or Policies.

    Returns:
      (kept policies, the refused ones' notes).

    Example:
      >>> src = rk.sources.from_factory(tiny_model)
      >>> kept, notes = buildable_policies(src, rk.TrainConfig(2, 16), "h100", ["full"])
      >>> [p.name for p in kept], notes
      (['full'], [])
    """
    t = as_target(target)
    kept, refused = [], []
    for p in (as_policy(x) for x in policies):
        note = source.refuses(p, config, t)
        if note is None:
            kept.append(p)
        else:
            refused.append(note)
    return kept, refused
