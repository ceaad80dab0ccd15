"""The step wrapper: ``rk.auto(train_step, budget=...)``, a step that decides its own remat.

At the first call with a new shape of arguments it decides (:mod:`remat_kit.autoplan._decide`:
planned, verified by a compile, remembered on disk), logs one line, and runs the step
jitted with the plan applied; later calls with that shape run the jitted step, as
``jax.jit`` would. Each shape (and placement of sharded arguments) is decided once: the
decisions are kept, most recent first, up to ``max_shapes``; past that the oldest is dropped
(its jitted step with it) and a ``RematWarning`` says once that the shapes change from call
to call (pad to a few buckets: every new shape costs a decision, a trace and a compile, as
it costs ``jax.jit`` a compile).

A later call first goes to the last call's jitted step as it is, through jax's own dispatch
(no signature is computed here): that step's trace refuses arguments of another shape before
anything is compiled, and only then is the call's shape looked up (measured in
``experiments/auto_models.py --overhead``); a sharded step whose shardings were read off its
arguments (not given to its jit) looks its decision up at every call, as arguments placed
otherwise are another program. A step taking NNX objects (``nnx.Module``,
``nnx.Optimizer``) is split at the edge as ``nnx.jit`` splits it
(:mod:`remat_kit.autoplan._graph`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import numpy as np

from remat_kit import peak
from remat_kit.autoplan._budget import Budget
from remat_kit.autoplan._decide import (
    CATALOGUE,
    CHALLENGERS,
    _on,
    abstract,
    bound,
    decide,
    unjitted,
)
from remat_kit.autoplan._decision import AutoPlan
from remat_kit.autoplan._graph import Edge, is_node, unwrap_nnx_jit
from remat_kit.autoplan._shardings import layout_of, with_jit_shardings
from remat_kit.errors import BadValue, RematWarning
from remat_kit.peak import PeakReport
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

#: An argument's role (``roles=``) -> its category in :meth:`AutoStep.inspect`'s report.
_CATEGORIES = {
    "params": "parameter",
    "frozen": "parameter",
    "optimizer": "optimizer state",
    "batch": "input",
}


@dataclasses.dataclass(frozen=True)
class _Decided:
    plan: AutoPlan
    run: Callable[..., Any]
    hot: bool = True  # a later call may go straight to ``run`` (see AutoStep.__call__)


class _OtherShape(Exception):
    """Raised when a decided step is traced for arguments of another shape: the call was
    not that decision's (see :meth:`AutoStep.__call__`)."""


def _guarded(fn: Callable[..., Any], key: Any, one_device: bool) -> Callable[..., Any]:
    """``fn``, traced only for arguments whose signature is ``key`` (and, for a decision
    made for one device, only for arguments on no mesh)."""

    def step(*args: Any) -> Any:
        if _signature(args, placed=False) != key:
            raise _OtherShape
        # jax traces again for arguments placed on a mesh (the mesh is in their abstract
        # values, Auto axes included), so a one-device decision is not run sharded: the
        # call is decided for the mesh instead.
        if one_device and any(not jax.typeof(x).sharding.mesh.empty for x in jax.tree.leaves(args)):
            raise _OtherShape
        return fn(*args)

    step.__name__ = getattr(fn, "__name__", "step")
    return step


class AutoStep:
    """A train step whose ``"auto"`` blocks take the policy decided for the budget.

    Made by :func:`auto`; call it as the step itself (positional arguments).

    Attributes:
      budget: the budget as read.

    ``plan`` (the decision of the last call's shape) and ``plans`` (every decision kept) are
    properties.
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
        challengers: tuple[str, ...] = CHALLENGERS,
    ) -> None:
        self._loss, self._loss_argnums = loss_fn, loss_argnums
        self._challengers = challengers
        fn, donated = unwrap_nnx_jit(fn)  # an nnx.jit: its function, and its donation
        self._fn, self.budget, self._target = fn, budget, target
        self._donate, self._roles = donate_argnums or donated or (), roles
        self._catalogue, self._offload, self._max = catalogue, offload, max_shapes
        self._jit = with_jit_shardings(fn, jit_options)  # a jax.jit's shardings, as given
        self._decided: collections.OrderedDict[Any, _Decided] = collections.OrderedDict()
        self._last: AutoPlan | None = None
        self._hot: _Decided | None = None  # the last call's decision, tried first
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
        last = self._hot
        if last is not None and not any(map(is_node, args)):
            # jax's own dispatch: the last decision's jitted step, whose trace refuses any
            # other shape (a new shape raises _OtherShape before anything is compiled)
            try:
                return last.run(*args)
            except _OtherShape:
                pass
        edge, pure = Edge.of(args)
        key = _signature(pure, edge)
        got = self._decided.get(key)
        if got is None:
            got = self._decide(pure, edge)
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
        self._hot = got if edge is None and got.hot else None
        if edge is None:
            return got.run(*pure)
        out, state = got.run(*pure)
        edge.update(args, state)  # the model and optimizer change in place, as under nnx.jit
        return out

    def lower(self, *args: Any) -> Any:
        """The jitted step with the decided plan, lowered for ``args`` (deciding if needed):
        what ``jax.jit(step).lower`` gives, to compile or inspect (for a step taking NNX
        objects, the pure step ``(state, *others) -> (outputs, new state)``)."""
        edge, pure = Edge.of(args)
        return self._get(pure, edge).run.lower(*pure)  # type: ignore[attr-defined]

    def inspect(self, *args: Any, series: bool = False, hlo_proto: bool = False) -> PeakReport:
        """What is live at the peak of the decided program for ``args`` (deciding if needed),
        compiled for the target planned for: ``remat-kit inspect``'s report of this step.

        Hand it to ``rk.render.write_inspection`` for the files ``inspect --trace FILE
        --xprof DIR`` writes (``series=True`` for the trace, ``hlo_proto=True`` for the
        profile). The step's ``roles`` name its parameters and optimizer state; without
        them every argument is an input. A step planned sharded is inspected as it was
        decided: its shardings on a mesh of the same axes over the mesh's devices of the
        target, one device's program (``rk.inspect``'s ``in_shardings`` /
        ``out_shardings``), every figure per device.

        Args:
          *args: the step's arguments (arrays or ``jax.ShapeDtypeStruct`` pytrees).
          series: keep the live bytes at every position (the trace's data).
          hlo_proto: keep XLA's ``HloProto`` (what XProf's Memory Viewer reads).

        Returns:
          The ``rk.PeakReport``; its ``peak_bytes`` is the plan's ``peak_bytes`` (per
          device for a sharded step) and its ``meta`` names the policy and the budget.

        Raises:
          ShardedStep: as at a call, a sharded step whose shardings cannot be carried to
            the target (see :func:`auto`).

        Example:
          >>> step = rk.auto(lambda w, x: rk.remat(jnp.sin, "auto")(w * x), "fits",
          ...                target="h100")
          >>> x = jax.ShapeDtypeStruct((256,), "float32")
          >>> step.inspect(x, x).meta["policy"], step.plan is None
          ('none', True)
        """
        edge, pure = Edge.of(args)
        got = self._get(pure, edge)
        fn, donate, _ = self._pure(pure, edge)
        roles = {
            r: (i,) if isinstance(i, int) else tuple(i) for r, i in (self._roles or {}).items()
        }
        categories = {
            i: _CATEGORIES[r] for r, idx in roles.items() for i in idx if r in _CATEGORIES
        }
        target = self.target()
        shapes, sharded = abstract(pure), {}
        layout = layout_of(self.__name__, self._jit, pure)
        if layout is not None:  # the mesh's devices of the target, as decided
            target = layout.target(target, self.__name__)
            ins, outs = layout.on(target)
            shapes = _on(shapes, ins)
            sharded = {"in_shardings": ins, "out_shardings": outs}
        if got.plan.slop_factor is not None:
            target = target.with_slop_factor(got.plan.slop_factor)
        return peak.inspect(
            bound(fn, as_policy(got.plan.policy)),
            *shapes,
            target=target,
            donate_argnums=donate,
            **sharded,
            categories=categories or None,
            meta={"policy": got.plan.policy, "budget": got.plan.budget},
            series=series,
            hlo_proto=hlo_proto,
        )

    def _get(self, pure: tuple[Any, ...], edge: Edge | None) -> _Decided:
        """The decision for the call's shape, made if needed, kept without being the last
        call's (``plan`` stays the last call's)."""
        key = _signature(pure, edge)
        got = self._decided.get(key)
        if got is None:
            got = self._decide(pure, edge)
            self._decided[key] = got
        return got

    def _pure(
        self, pure: tuple[Any, ...], edge: Edge | None
    ) -> tuple[Callable[..., Any], tuple[int, ...], tuple[Any, tuple[int, ...]] | None]:
        """The step as a function of the pure arguments, what it donates, and its loss."""
        loss = None if self._loss is None else (self._loss, self._loss_argnums)
        if edge is None:
            fn, donate = unjitted(self._fn, pure, self._donate)
            return fn, donate, loss
        if loss is not None:
            loss = edge.loss(*loss)
        return edge.step(self._fn), edge.donate(self._donate), loss

    def _decide(self, pure: tuple[Any, ...], edge: Edge | None) -> _Decided:
        layout = layout_of(self.__name__, self._jit, pure)
        t = self.target()
        fn, donate, loss = self._pure(pure, edge)
        plan = decide(
            fn,
            pure,
            target=t,
            budget=self.budget,
            donate_argnums=donate,
            roles=self._roles if edge is None else None,
            catalogue=self._catalogue,
            offload=self._offload,
            loss_fn=None if loss is None else loss[0],
            loss_argnums=() if loss is None else loss[1],
            challengers=self._challengers,
            layout=layout,
        )
        LOG.info("%s: %s", self.__name__, plan.words())
        step = _guarded(
            bound(fn, as_policy(plan.policy)), _signature(pure, placed=False), layout is None
        )
        options = self._jit
        if plan.compiler_options:  # XLA's own pass at the budget: the slop the plan was made at
            given = dict(options.get("compiler_options") or {})
            options = {**options, "compiler_options": {**given, **plan.compiler_options}}
        run = jax.jit(step, donate_argnums=donate, **options)
        return _Decided(plan, run, hot=layout is None or not layout.from_args)


def _signature(args: tuple[Any, ...], edge: Edge | None = None, placed: bool = True) -> Any:
    """What a decision is kept under: the arguments' tree, each leaf's shape and dtype, the
    placement of those sharded over several devices (``placed``: a trace's guard compares
    shapes only), and the graph objects' structure (read off the leaves as they are: no copy
    is made)."""
    leaves, tree = jax.tree.flatten(args)
    if placed:
        shapes = tuple((np.shape(x), _dtype(x), _placement(x)) for x in leaves)
    else:
        shapes = tuple((np.shape(x), _dtype(x)) for x in leaves)
    return None if edge is None else edge.graphdef, tree, shapes


def _placement(x: Any) -> Any:
    """A leaf's sharding where it spans several devices (else None: one device)."""
    s = getattr(x, "sharding", None)
    if not isinstance(s, jax.sharding.Sharding) or len(s.device_set) < 2:
        return None
    return s


def _dtype(x: Any) -> Any:
    dtype = getattr(x, "dtype", None)  # a Python number: the dtype jax traces it with
    return jax.numpy.result_type(x) if dtype is None else dtype


def auto(
    step: Callable[..., Any],
    budget: Any = None,
    *,
    activations: float | None = None,
    target: str | Target | None = None,
    donate_argnums: int | Iterable[int] = (),
    roles: Mapping[str, int | tuple[int, ...]] | None = None,
    catalogue: Iterable[Any] = CATALOGUE,
    challengers: Iterable[Any] = CHALLENGERS,
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
      challengers: catalogue policies that challenge the answer once chosen: each traced,
        compiled only where it recomputes fewer FLOPs, taken where its compiled peak is under
        the budget and it is predicted faster (``()``: none).
      offload: let a plan offload residuals to host memory.
      loss_fn: the loss the step differentiates (the function it hands ``jax.grad``), called
        as ``loss_fn(*(args[i] for i in loss_argnums))``: with it the per-tensor planner
        competes (it reads each tag's cost off the loss's backward pass); without it only
        ``none`` and ``catalogue`` do.
      loss_argnums: the step's arguments the loss takes, in its order (``(0, 2)`` for
        ``loss_fn(params, batch)`` in ``step(params, opt_state, batch)``).
      max_shapes: argument shapes whose decisions are kept (see the module docstring).
      **jit_options: passed on to ``jax.jit`` (``in_shardings``, ``out_shardings`` ...); a
        ``jax.jit`` step's own ``in_shardings`` / ``out_shardings`` are read off it and
        passed on as well (given both ways: refused). Shardings (or arguments) over a mesh
        of N devices: the step is planned for N devices of the target, on a mesh of the same
        axes, per device (the budget too), and runs with the shardings given.

    Returns:
      The :class:`AutoStep`.

    Raises:
      BadValue: a budget that cannot be read, a sharding given both in the jit and as an
        option (at the call); at the first step call: ``NoAutoBlock`` (no block marked),
        ``DoesNotFit`` (the budget is under what no policy removes, with the floor and what
        would fit), ``BudgetOverDevice``, ``ShardedStep`` (multi-device shardings that are
        not ``NamedSharding`` values on one mesh, or a target of another device count).

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
        challengers=tuple(as_policy(p).spec for p in challengers),
        offload=offload,
        max_shapes=max_shapes,
        jit_options=jit_options,
        loss_fn=loss_fn,
        loss_argnums=loss_at,
    )
