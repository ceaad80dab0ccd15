"""The one door to a Workload: a source (a model source, what ``from_factory`` takes, or a
:class:`~remat_kit.sources.Measured` step) on a target, under a train config, checked once.

Example:
  >>> w = rk.sources.workload(tiny_model, "h100", rk.TrainConfig(batch=2, seq=16))
  >>> (w.seq, w.batch, w.target.name)
  (16, 2, 'h100-80gb')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from remat_kit.sources._depth import check_depth
from remat_kit.sources._measured import Measured
from remat_kit.sources._protocol import StepSource
from remat_kit.sources._source import from_factory
from remat_kit.sources._workload import Workload
from remat_kit.targets import Target, as_target
from remat_kit.train import TrainConfig

__all__ = ["workload"]


def workload(
    source: StepSource | Measured | str | Callable[..., Any],
    target: Target | str,
    config: TrainConfig,
    *,
    strict: bool = False,
    label: str | None = None,
    depth: str = "auto",
) -> Workload:
    """The train step of a source as an ``rk.Workload`` for ``rk.plan``, ``rk.max_batch``,
    ``rk.front`` and ``rk.advise``: one call from a model to the search, and the only way to
    a Workload.

    ``config.batch`` is only a default: the search sets the batch. Under a mesh plan the
    batch is a multiple of the data-parallel ways, and the planner sizes the residuals of one
    device's share. Schedules the source cannot build are left out of the search; per-layer
    splits need a known layer count.

    Args:
      source: a StepSource, what :func:`from_factory` takes, or a :class:`Measured` step
        (callbacks in place of a model: its figures are for ``target`` and ``config.seq``;
        the batch is a multiple of ``config.accum``).
      target: where to compile.
      config: sequence, optimizer, precision, accumulation (``batch`` is overridden).
      strict: a policy matching no tag is an error (the CLI), not a warning.
      label: a name for tables (default: the source's label).
      depth: how an unrolled model is compiled (see ``rk.sources.measure``).

    Returns:
      The Workload.

    Raises:
      BadValue: a config the source refuses before anything is traced (its ``check``: a
        preset's sizes and attention kernel for the target; a step of your own given an
        optimizer, accumulation or precision of ours), or an unknown ``depth``.

    Example:
      >>> w = workload(tiny_model, "h100", rk.TrainConfig(batch=2, seq=16))
      >>> w.report("full", batch=2).policy, w.label
      ('full', 'tiny_model s16 adamw')
    """
    t = as_target(target)
    check_depth(depth)  # before a factory file is imported (the Workload checks it again)
    src = source if isinstance(source, (StepSource, Measured)) else from_factory(source)
    return Workload(src, t, config, strict=strict, depth=depth, label=label)
