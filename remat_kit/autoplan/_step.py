"""The step wrapper: ``rk.auto(train_step, budget=...)``, a step that decides its own remat.

At the first call with a new shape of arguments it decides (:mod:`remat_kit.autoplan._decide`:
planned, verified by a compile, remembered on disk), logs one line, and runs the step
jitted with the plan applied; later calls with that shape run the jitted step, as
``jax.jit`` would. Each shape is decided once: the decisions are kept, most recent first,
up to ``max_shapes``; past that the oldest is dropped (its jitted step with it) and a
``RematWarning`` says once that the shapes change from call to call (pad to a few buckets:
every new shape costs a decision, a trace and a compile, as it costs ``jax.jit`` a compile).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax

from remat_kit.autoplan._budget import Budget
from remat_kit.autoplan._decide import CATALOGUE, abstract, bound, decide, unjitted
from remat_kit.autoplan._decision import AutoPlan
from remat_kit.errors import BadValue, RematWarning
from remat_kit.policies import as_policy
from remat_kit.targets import Target, as_target

__all__ = [
    "MAX_SHAPES",
    "AutoStep",
    "auto",
]

#: Shapes whose decisions (and jitted steps) a wrapped step keeps by default.
MAX_SHAPES = 8

LOG = logging.getLogger("remat_kit.auto")


@dataclasses.dataclass(frozen=True)
class _Decided:
    plan: AutoPlan
    run: Callable[..., Any]


class AutoStep:
    """A train step whose ``"auto"`` blocks take the policy decided for the budget.

    Made by :func:`auto`; call it as the step itself (positional arguments).

    Attributes:
      plan: the decision of the last call's shape (None before the first call).
      plans: every decision kept, oldest first.
      budget: the budget as read.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        budget: Budget,
        *,
        target: str | Target | None,
        donate_argnums: tuple[int, ...],
        roles: Mapping[str, int | tuple[int, ...]] | None,
        catalogue: tuple[str, ...],
        offload: bool,
        max_shapes: int,
        jit_options: Mapping[str, Any],
        loss_fn: Callable[..., Any] | None = None,
        loss_argnums: tuple[int, ...] = (),
    ) -> None:
        self._loss, self._loss_argnums = loss_fn, loss_argnums
        self._fn, self.budget, self._target = fn, budget, target
        self._donate, self._roles = donate_argnums, roles
        self._catalogue, self._offload, self._max = catalogue, offload, max_shapes
        self._jit = dict(jit_options)
        self._decided: collections.OrderedDict[Any, _Decided] = collections.OrderedDict()
        self._last: AutoPlan | None = None
        self._warned = False
        self.__name__ = getattr(fn, "__name__", "step")
        self.__doc__ = getattr(fn, "__doc__", None)

    @property
    def plan(self) -> AutoPlan | None:
        """The decision of the last call's shape (None before the first call)."""
        return self._last

    @property
    def plans(self) -> tuple[AutoPlan, ...]:
        """Every decision kept, least recently used first."""
        return tuple(d.plan for d in self._decided.values())

    def target(self) -> Target:
        """The device planned for: the one named, else the local GPU.

        Raises:
          BadValue: no target named and no GPU here.
        """
        if self._target is not None:
            return as_target(self._target)
        if jax.default_backend() != "gpu":
            raise BadValue(
                f"rk.auto({self.__name__}) has no GPU here to plan for: name the GPU the step "
                "runs on, e.g. target='h100' (planned deviceless, run here)",
                param="target",
            )
        return as_target("local")

    def __call__(self, *args: Any) -> Any:
        key = _signature(args)
        got = self._decided.get(key)
        if got is None:
            got = self._decide(args)
            if len(self._decided) >= self._max:
                self._decided.popitem(last=False)
                if not self._warned:
                    self._warned = True
                    warnings.warn(
                        f"rk.auto({self.__name__}): a new argument shape at every call "
                        f"({self._max} decisions kept, the oldest dropped): each new shape is "
                        "decided, traced and compiled again; pad the batch to a few fixed shapes",
                        RematWarning,
                        stacklevel=2,
                    )
            self._decided[key] = got
        else:
            self._decided.move_to_end(key)
        self._last = got.plan
        return got.run(*args)

    def lower(self, *args: Any) -> Any:
        """The jitted step with the decided plan, lowered for ``args`` (deciding if needed):
        what ``jax.jit(step).lower`` gives, to compile or inspect."""
        key = _signature(args)
        got = self._decided.get(key) or self._decide(args)
        self._decided.setdefault(key, got)
        return got.run.lower(*args)  # type: ignore[attr-defined]

    def _decide(self, args: tuple[Any, ...]) -> _Decided:
        t = self.target()
        fn, donate = unjitted(self._fn, args, self._donate)
        plan = decide(
            fn,
            args,
            target=t,
            budget=self.budget,
            donate_argnums=donate,
            roles=self._roles,
            catalogue=self._catalogue,
            offload=self._offload,
            loss_fn=self._loss,
            loss_argnums=self._loss_argnums,
        )
        LOG.info("%s: %s", self.__name__, plan.words())
        run = jax.jit(bound(fn, as_policy(plan.policy)), donate_argnums=donate, **self._jit)
        return _Decided(plan, run)


def _signature(args: tuple[Any, ...]) -> Any:
    shapes = abstract(args)
    leaves, tree = jax.tree.flatten(shapes)
    return tree, tuple((tuple(x.shape), str(x.dtype)) for x in leaves)


def auto(
    step: Callable[..., Any],
    budget: Any = None,
    *,
    activations: float | None = None,
    target: str | Target | None = None,
    donate_argnums: int | Iterable[int] = (),
    roles: Mapping[str, int | tuple[int, ...]] | None = None,
    catalogue: Iterable[Any] = CATALOGUE,
    offload: bool = False,
    loss_fn: Callable[..., Any] | None = None,
    loss_argnums: int | Iterable[int] = (),
    max_shapes: int = MAX_SHAPES,
    **jit_options: Any,
) -> AutoStep:
    """The train step with its ``"auto"`` blocks' policy decided under a memory budget.

    Mark the blocks with ``rk.remat(Block, "auto")``; wrap the step (a plain function or a
    ``jax.jit`` of one) instead of jitting it. At the first call with concrete arguments the
    step is planned for the device (per-tensor plans and ``catalogue`` compete on the
    predicted step time; the cheapest whose compiled peak is under the budget wins, verified
    by its compile), the decision is logged (logger ``remat_kit.auto``) and kept on disk, and
    the step runs jitted with it. ``step.plan`` says what was chosen.

    Args:
      step: the train step, called with positional arguments.
      budget: ``"fits"`` (what a process may allocate on the device), bytes (``"60GiB"``,
        an int), or a fraction of that in (0, 1] (``0.8``, ``"80%"``).
      activations: instead of ``budget``, torch's relative budget: the fixed parts plus this
        share of what ``none`` keeps beside them (``0.5``: half).
      target: the GPU planned for (a name or ``rk.Target``); default: the local GPU (its
        allocator's ``bytes_limit``). Named, the plan is that GPU's and the step runs here.
      donate_argnums: arguments the step donates (or the ``jax.jit``'s own donation).
      roles: which argument holds ``params``, ``optimizer``, ``batch`` (``rk.sources.OwnStep``
        roles): a budget under those is refused before any plan is compiled.
      catalogue: catalogue policies that compete with the per-tensor plans.
      offload: let a plan offload residuals to host memory.
      loss_fn: the loss the step differentiates (the function it hands ``jax.grad``), called
        as ``loss_fn(*(args[i] for i in loss_argnums))``: with it the per-tensor planner
        competes (it reads each tag's cost off the loss's backward pass); without it only
        ``none`` and ``catalogue`` do.
      loss_argnums: the step's arguments the loss takes, in its order (``(0, 2)`` for
        ``loss_fn(params, batch)`` in ``step(params, opt_state, batch)``).
      max_shapes: argument shapes whose decisions are kept (see the module docstring).
      **jit_options: passed on to ``jax.jit`` (``in_shardings``, ``out_shardings`` ...).

    Returns:
      The :class:`AutoStep`.

    Raises:
      BadValue: a budget that cannot be read (at the call); at the first step call:
        ``NoAutoBlock`` (no block marked), ``DoesNotFit`` (the budget is under what no policy
        removes, with the floor and what would fit), ``BudgetOverDevice``.

    Example:
      >>> step = rk.auto(lambda params, batch: params, budget="60GiB", target="h100")
      >>> step.plan is None, step.budget.form
      (True, 'bytes')
    """
    if not callable(step):
        raise BadValue(f"rk.auto takes the train step, a callable; got {step!r}", param="step")
    read = Budget.of(budget, activations=activations)
    donate = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums)
    loss_at = (loss_argnums,) if isinstance(loss_argnums, int) else tuple(loss_argnums)
    if loss_fn is not None and not loss_at:
        raise BadValue(
            "loss_fn needs loss_argnums: the step's arguments the loss takes, e.g. (0, 2)",
            param="loss_argnums",
        )
    if isinstance(max_shapes, bool) or not isinstance(max_shapes, int) or max_shapes < 1:
        raise BadValue(f"max_shapes={max_shapes!r} must be a positive int", param="max_shapes")
    return AutoStep(
        step,
        read,
        target=target,
        donate_argnums=donate,
        roles=roles,
        catalogue=tuple(as_policy(p).spec for p in catalogue),
        offload=offload,
        max_shapes=max_shapes,
        jit_options=jit_options,
        loss_fn=loss_fn,
        loss_argnums=loss_at,
    )
