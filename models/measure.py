"""Options in, figures out: remat_kit's one pipeline for the experiments and the tests.

Each function resolves the options to a model source (:func:`models.source.source_for`, the one
place that tells a preset from a factory) and calls the same function of ``rk.sources``,
which measures every kind of source the same way. The options and the model config they name
are :mod:`models.options` (re-exported here, where callers look).

Example:
  >>> r = measure(Options("tiny-llama", 2, 32, optimizer="sgd"), "full", "h100")
  >>> r.policy, r.meta["layers"]
  ('full', 4)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import remat_kit as rk
from remat_kit_models.options import (
    ABSURD_FACTOR,
    MAX_TOKENS,
    Options,
    check_sizes,
    cudnn_problem,
    model_config,
    precision_of,
    resolve_attention,
)
from remat_kit_models.source import PresetSource, source_for, train_step

__all__ = [
    "ABSURD_FACTOR",
    "MAX_TOKENS",
    "Options",
    "PresetSource",
    "baseline_flops",
    "check_sizes",
    "cudnn_problem",
    "measure",
    "model_config",
    "precision_of",
    "residuals",
    "resolve_attention",
    "source_for",
    "step_flops",
    "train_step",
    "usable_policies",
    "workload",
]


def measure(
    opts: Options,
    policy: rk.policies.PolicyLike,
    target: rk.Target | str,
    *,
    schedule: Any = "none",
    baseline: float | None = None,
    warn: bool = False,
    measured_breakdown: bool = False,
) -> rk.MemoryReport:
    """Compiles the train step of ``opts`` under ``policy`` for ``target`` and reports it
    (``rk.sources.measure`` of :func:`source_for`; ``opts.strict`` makes a name-based policy
    that matches no tag an error).

    Args:
      opts: model, batch, sequence and training options.
      policy: a policy name/spec, ``rk.Policy`` or jax policy callable.
      target: a Target or target name.
      schedule: a layer schedule (``rk.Schedule`` or spec such as ``every:2``).
      baseline: FLOPs of the same step without remat: the report's meta then holds
        ``recompute_overhead``.
      warn: issue the report's warnings as RematWarning too.
      measured_breakdown: read the breakdown from XLA's buffer assignment (a second
        compile; unsharded steps only) instead of the shapes' estimate.

    Returns:
      The MemoryReport with its weights/gradients/optimizer/activations breakdown; its meta
      names the precision (every dtype) and the dropout rate trained with.
    """
    return rk.sources.measure(
        source_for(opts),
        policy,
        target,
        opts.train_config(),
        schedule=schedule,
        baseline=baseline,
        strict=opts.strict,
        warn=warn,
        measured_breakdown=measured_breakdown,
        depth=opts.depth,
    )


def baseline_flops(opts: Options, target: rk.Target | str) -> float:
    """FLOPs of the train step without rematerialization (traced, not compiled)."""
    return step_flops(opts, "none", target)


def step_flops(
    opts: Options, policy: rk.policies.PolicyLike, target: rk.Target | str, schedule: Any = "none"
) -> float:
    """FLOPs of the train step under ``policy`` and ``schedule`` (traced, not compiled)."""
    return rk.sources.step_flops(source_for(opts), policy, target, opts.train_config(), schedule)


def residuals(
    opts: Options, policy: rk.policies.PolicyLike, target: rk.Target | str, schedule: Any = "none"
) -> rk.residuals.ResidualReport:
    """What ``policy`` keeps for the backward pass of one micro-batch, by tag."""
    return rk.sources.residuals(source_for(opts), policy, target, opts.train_config(), schedule)


def usable_policies(
    opts: Options, target: rk.Target | str, policies: Iterable[Any], *, given: bool
) -> tuple[list[rk.Policy], list[str]]:
    """The policies that can act on the model and the specs of those that cannot
    (``rk.sources.usable_policies``)."""
    return rk.sources.usable_policies(
        source_for(opts), opts.train_config(), target, policies, given=given
    )


def workload(opts: Options, target: rk.Target | str) -> rk.Workload:
    """The train step of ``opts`` as an ``rk.Workload`` for the search (any batch size).

    ``opts.batch`` is only a default: the search sets the batch.

    Example:
      >>> w = workload(Options("tiny-llama", batch=2, seq=32, optimizer="sgd"), "h100")
      >>> w.n_layers
      4
    """
    return rk.sources.workload(
        source_for(opts), target, opts.train_config(), strict=opts.strict, depth=opts.depth
    )
