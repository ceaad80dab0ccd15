"""The decision for one shape of a step: the planner's cheapest plan under the budget,
remembered on disk under the step's program.

The step is handed to the planner as a step of the user's own (:mod:`remat_kit.sources`'
own-step source, the same pipeline as ``--step``): one workload, the per-tensor planner
(:func:`remat_kit.search.plan`) with the catalogue as its ``extra``, so a catalogue policy
wins where it is as fast, and every figure is a compiled one.

The decision is kept with :func:`remat_kit.cache.remember` under the fingerprint of the
step's program (``none``, lowered for the target: shapes, dtypes, donation, shardings, the
code of the step and of the model), the target (its device and device count, allocator
fraction and rates), the mesh and every leaf's sharding (:class:`Layout`) and the budget as
given; a restarted job reads it back without compiling anything.

A sharded step (a :class:`Layout`) is planned for the mesh's devices of the target: every
compile is of the sharded program (the arguments and outputs on a mesh of the same axes over
the target's devices), every figure per device, and the budget is per device.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import numpy as np

from remat_kit import cache, marks, sources
from remat_kit.autoplan._budget import Budget
from remat_kit.autoplan._decision import AutoPlan, _size
from remat_kit.autoplan._shardings import Layout
from remat_kit.errors import DoesNotFit, NoAutoBlock
from remat_kit.policies import NO_REMAT, Policy, as_policy
from remat_kit.residuals import tags_in
from remat_kit.schedules import NO_SCHEDULE
from remat_kit.search import PlanCandidate, check_budget
from remat_kit.search import plan as plan_for
from remat_kit.sources import OwnStep
from remat_kit.sources._own_step import _unjitted
from remat_kit.sources._workload import host_bytes
from remat_kit.targets import Target
from remat_kit.targets.runtime import SLOP_FACTOR
from remat_kit.train import TrainConfig

__all__ = [
    "CATALOGUE",
    "abstract",
    "bound",
    "decide",
    "unjitted",
]

#: The catalogue policies that compete with the per-tensor plans by default: one compile
#: each, the smallest (``full``) and the two that keep the matmul outputs.
CATALOGUE = ("full", "dots_no_batch", "minimal")

#: The rest of the catalogue that keeps everything on the device: each challenges the chosen
#: plan after the planner, traced first and compiled only where its traced recompute is under
#: the plan's (with more, it is slower but for memory traffic), taken where its compiled peak
#: is under the budget and its predicted step time is less.
CHALLENGERS = ("dots", "megatron", "qkv_proj", "context", "block")

#: The namespace of decisions in the disk cache (bump when AutoPlan's fields change).
KIND = "auto decision v2"

#: Compiles spent asking XLA's own pass for the budget: the first slop factor, and one more
#: where the first left the step over the budget though the pass did not fall short.
XLA_TRIES = 2

GIB = 2**30


def abstract(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The step's arguments as ``jax.ShapeDtypeStruct`` pytrees (shapes and dtypes only).

    Example:
      >>> abstract((jnp.ones((2, 3)),))[0].shape
      (2, 3)
    """
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), jax.numpy.result_type(x)), args)


def bound(fn: Callable[..., Any], policy: Policy) -> Callable[..., Any]:
    """``fn`` whose ``"auto"`` blocks take ``policy`` when it is traced: a new function
    each call, so no jit cache replays a trace made under another policy.

    Example:
      >>> step = bound(lambda x: rk.marks.current().policy.name, rk.policy("full"))
      >>> step(0)
      'full'
    """

    def step(*args: Any, **kwargs: Any) -> Any:
        with marks.auto_as(policy):
            return fn(*args, **kwargs)

    step.__name__ = getattr(fn, "__name__", "step")
    return step


def unjitted(
    fn: Callable[..., Any], args: tuple[Any, ...], donate_argnums: tuple[int, ...]
) -> tuple[Callable[..., Any], tuple[int, ...]]:
    """The function inside a ``jax.jit`` and what it donates (as ``--step`` reads it), or a
    plain function and ``donate_argnums``."""
    name = getattr(fn, "__name__", "step")
    with marks.auto_as(NO_REMAT):  # the jit's trace reads its donation: its blocks trace too
        return _unjitted(name, OwnStep(fn, abstract(args), donate_argnums))


def _placed(args: tuple[Any, ...], target: Target) -> tuple[Any, ...]:
    if target.kind != "gpu":
        return args
    sharding = target.sharding()  # the deviceless GPU's one device
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), args)


def _on(args: tuple[Any, ...], shardings: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` (shapes) each leaf carrying its sharding."""
    return tuple(
        jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), a, sh)
        for a, sh in zip(args, shardings, strict=True)
    )


def program_of(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    donate: tuple[int, ...],
    target: Target,
    shardings: tuple[tuple[Any, ...], Any] | None = None,
) -> tuple[str, frozenset[str]]:
    """The fingerprint of the step's program under ``none`` (lowered, not compiled, with the
    tags its trace holds: ``checkpoint_name`` leaves no mark in the lowered text, and a plan
    saves tags by name), and the marked blocks its trace reached; ``shardings`` (in, out on
    the target) for a sharded step, whose ``args`` carry them."""
    with marks.auto_as(NO_REMAT) as scope:
        if shardings is None:
            jitted = jax.jit(lambda *a: fn(*a), donate_argnums=donate)
            traced = jitted.trace(*_placed(args, target))
        else:
            jitted = jax.jit(
                lambda *a: fn(*a),
                donate_argnums=donate,
                in_shardings=shardings[0],
                out_shardings=shardings[1],
            )
            traced = jitted.trace(*args)
    tags = sorted(tags_in(traced.jaxpr).items())
    text = f"{traced.lower().as_text()}\ntags: {tags}"
    return cache.fingerprint(text), frozenset(scope.marked)


def decide(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    target: Target,
    budget: Budget,
    donate_argnums: tuple[int, ...] = (),
    roles: Mapping[str, int | tuple[int, ...]] | None = None,
    catalogue: Iterable[Any] = CATALOGUE,
    offload: bool = False,
    loss_fn: Callable[..., Any] | None = None,
    loss_argnums: tuple[int, ...] = (),
    challengers: Iterable[Any] = CHALLENGERS,
    layout: Layout | None = None,
) -> AutoPlan:
    """The policy of the ``"auto"`` blocks of ``fn(*args)`` for ``target`` under ``budget``.

    Args:
      fn: the step, a plain function (see :func:`unjitted`).
      args: its arguments (arrays or ``jax.ShapeDtypeStruct`` pytrees).
      target: the device planned for.
      budget: the budget.
      donate_argnums: the arguments the step donates.
      roles: which argument holds the params, optimizer state, batch (``OwnStep.roles``):
        they size the fixed parts a budget cannot go under. None: those are read from the
        smallest compiled plan when nothing fits.
      catalogue: the policies that compete with the per-tensor plans.
      offload: whether a plan may offload residuals to host memory.
      loss_fn: the loss the step differentiates, ``loss_fn(*(args[i] for i in
        loss_argnums))``: the per-tensor planner reads what each tag costs from its backward
        pass. None: the catalogue policies (and ``none``) compete alone.
      loss_argnums: the step's arguments the loss takes, in its order.
      challengers: policies that challenge the answer once chosen (:data:`CHALLENGERS`):
        each traced, compiled only where it recomputes less, taken where it fits and is
        predicted faster.
      layout: a sharded step's mesh and shardings (:func:`~remat_kit.autoplan._shardings.
        layout_of`): planned for ``layout.devices`` devices of ``target`` (widened from one),
        every figure and the budget per device. None: one device.

    Returns:
      The AutoPlan (``cached`` when read back from the disk cache).

    Raises:
      NoAutoBlock: the step reaches no block marked ``"auto"``.
      DoesNotFit: the budget is under what no policy removes, or no plan reaches it.
      BudgetOverDevice: the budget is over what a process may allocate on ``target``.
      ShardedStep: ``target`` has another device count than the layout's mesh.
    """
    t0 = time.perf_counter()
    name = getattr(fn, "__name__", "step")
    shapes = abstract(args)
    placed = None
    if layout is not None:
        target = layout.target(target, name)
        placed = layout.on(target)
        shapes = _on(shapes, placed[0])
    program, marked = program_of(fn, shapes, donate_argnums, target, placed)
    if not marked:
        raise NoAutoBlock(
            f"{name} reaches no block marked 'auto': mark one with rk.remat(Block, 'auto') "
            "(or rk.remat(fn, 'auto')) in the model the step trains",
            step=name,
        )
    specs = [as_policy(p).spec for p in catalogue]
    rivals = [as_policy(p).spec for p in challengers]
    parts = {
        "program": program,
        "budget": budget.text,
        "catalogue": specs,
        "challengers": rivals,
        "offload": offload,
        "loss": None if loss_fn is None else list(loss_argnums),
        "roles": {k: list(np.atleast_1d(v).tolist()) for k, v in (roles or {}).items()},
        "code": cache.code_fingerprint("remat_kit"),
    }
    if layout is not None:  # one device's keys stay as they were
        parts["layout"] = layout.parts()
    made: list[AutoPlan] = []

    def compute() -> AutoPlan:
        loss = None if loss_fn is None else (loss_fn, tuple(loss_argnums))
        got = _plan(
            fn, shapes, target, budget, donate_argnums, roles, specs, offload, program, loss,
            rivals, layout, placed,
        )  # fmt: skip
        made.append(got)
        return got

    got = cache.remember(
        KIND, parts, target, compute, encode=AutoPlan.to_dict, decode=AutoPlan.from_dict
    )
    if made:
        return dataclasses.replace(got, seconds=time.perf_counter() - t0)
    return dataclasses.replace(got, cached=True, compiles=0, seconds=time.perf_counter() - t0)


def _plan(
    fn: Callable[..., Any],
    shapes: tuple[Any, ...],
    target: Target,
    budget: Budget,
    donate: tuple[int, ...],
    roles: Mapping[str, int | tuple[int, ...]] | None,
    specs: list[str],
    offload: bool,
    program: str,
    loss: tuple[Callable[..., Any], tuple[int, ...]] | None,
    rivals: list[str],
    layout: Layout | None = None,
    placed: tuple[tuple[Any, ...], Any] | None = None,
) -> AutoPlan:
    name = getattr(fn, "__name__", "step")
    sharded = {} if placed is None else {"in_shardings": placed[0], "out_shardings": placed[1]}

    def step_fn(policy: Policy, config: TrainConfig) -> OwnStep:
        del config  # the shapes are the call's
        if loss is None:
            return OwnStep(bound(fn, policy), shapes, donate_argnums=donate, roles=roles,
                           **sharded)  # fmt: skip
        return OwnStep(
            bound(fn, policy),
            shapes,
            donate_argnums=donate,
            loss_fn=bound(loss[0], policy),
            loss_args=tuple(shapes[i] for i in loss[1]),
            roles=roles,
            **sharded,
        )

    step_fn.__name__ = name
    source = sources.from_step(step_fn)
    w = sources.workload(source, target, TrainConfig(batch=1, seq=1))
    if layout is not None and w.plannable:
        batch = (roles or {}).get("batch")
        at = None if batch is None else tuple(np.atleast_1d(batch).tolist())
        ways = layout.ways(shapes, at)
        w = dataclasses.replace(w, residual_ways=ways)
    none = w.compiled(NO_REMAT, NO_SCHEDULE, 1) if budget.form == "activations" else None
    fixed = None
    if none is not None:
        fixed = w.fixed_bytes(1) or (none.argument_bytes + none.output_bytes - none.alias_bytes)
    limit = budget.bytes_on(
        target, none_peak=None if none is None else none.peak_bytes, fixed=fixed
    )
    if loss is None:
        p = _catalogue_only(w, limit, specs)
    else:
        p = plan_for(w, 1, limit, extra=specs, offload=offload, host_budget=None if offload else 0)
    if not p.fits:
        floor = p.peak_bytes
        raise DoesNotFit(
            f"{name} does not fit {_size(limit)} on {target.name} whatever the policy: "
            f"the smallest plan reached ({p.policy.spec}) peaks at {_size(floor)}; the next "
            f"step that fits: a budget of {-(-floor // 2**10)}KiB or more",
            target=target.name,
            limit_bytes=limit,
            parts={"smallest_plan": floor},
            hints=[f"budget of {-(-floor // 2**10)}KiB"],
        )
    p, challenged = _challenged(w, p, limit, specs, rivals)
    none = w.compiled(NO_REMAT, NO_SCHEDULE, 1)
    xla = _xla_pass(source, target, limit, none, _seconds(p.report))
    compiles = 0
    named = {*specs, *rivals}
    fitting = [c for c in (*p.candidates, *challenged) if c.fits and c.policy in named]
    best = min(fitting, key=lambda c: (c.overhead, c.peak_bytes)) if fitting else None
    best_report = None if best is None else w.compiled(as_policy(best.policy), NO_SCHEDULE, 1)
    chosen = dict(
        policy=p.policy.spec,
        source=p.source,
        peak_bytes=p.peak_bytes,
        host_bytes=p.host_bytes,
        step_seconds=_seconds(p.report),
        decisions=dict(p.decisions),
        slop_factor=None,
    )
    if xla is not None:
        slop, report, tried = xla
        compiles += tried
        if report is not None:
            chosen = dict(
                policy=NO_REMAT.spec,
                source="xla",
                peak_bytes=report.peak_bytes,
                host_bytes=host_bytes(report),
                step_seconds=_seconds(report),
                decisions={},
                slop_factor=slop,
            )
    return AutoPlan(
        target=target.name,
        budget=budget.text,
        budget_bytes=limit,
        none_seconds=_seconds(none),
        none_peak_bytes=none.peak_bytes,
        catalogue_policy=None if best is None else best.policy,
        catalogue_seconds=_seconds(best_report),
        catalogue_peak_bytes=None if best is None else best.peak_bytes,
        compiles=w.compiles + compiles,
        seconds=0.0,
        program=program,
        device=target.description,
        mesh={} if layout is None else layout.axes,
        **chosen,
    )


@dataclasses.dataclass(frozen=True)
class _Chosen:
    """The fields of a ``rk.search.Plan`` :func:`_plan` reads, for a choice made without the
    planner."""

    policy: Policy
    source: str
    fits: bool
    peak_bytes: int
    host_bytes: int
    report: Any
    candidates: tuple[Any, ...]
    decisions: Mapping[str, str]
    recompute_overhead: float = 0.0
    overhead: float = 0.0


def _candidate(w: Any, pol: Policy, limit: int, label: str) -> tuple[PlanCandidate, Any]:
    """One catalogue policy compiled, as the planner lists its candidates."""
    r = w.compiled(pol, NO_SCHEDULE, 1)
    cand = PlanCandidate(
        label=label,
        policy=pol.spec,
        schedule="none",
        peak_bytes=r.peak_bytes,
        estimated_peak_bytes=None,
        recompute_overhead=w.recompute_of(pol, NO_SCHEDULE, 1),
        overhead=w.overhead_of(r, 1),
        host_bytes=host_bytes(r),
        fits=r.peak_bytes <= limit,
    )
    return cand, r


def _challenged(
    w: Any, p: Any, limit: int, specs: list[str], rivals: list[str]
) -> tuple[Any, list[PlanCandidate]]:
    """``p``, or the policy of ``rivals`` that beats it: under ``limit`` and predicted
    faster; and the challengers compiled (a challenger with no less traced recompute than
    the plan in hand is not compiled)."""
    best, compiled = p, []
    if best.recompute_overhead <= 0.0:  # no remat: nothing recomputes less
        return best, compiled
    for spec in rivals:
        pol = as_policy(spec)
        if spec in specs or spec == best.policy.spec:
            continue
        if w.recompute_of(pol, NO_SCHEDULE, 1) >= best.recompute_overhead:
            continue
        cand, r = _candidate(w, pol, limit, "catalogue")
        compiled.append(cand)
        if cand.fits and cand.overhead < best.overhead:
            cands = tuple(best.candidates)
            best = _Chosen(
                pol, "catalogue", True, cand.peak_bytes, cand.host_bytes, r, cands, {},
                cand.recompute_overhead, cand.overhead,
            )  # fmt: skip
    return best, compiled


def _catalogue_only(w: Any, limit: int, specs: list[str]) -> Any:
    """Without the loss there is no per-tensor cost model: ``none`` and the catalogue are
    compiled, and the one of least predicted step time (least FLOPs where the target has no
    rates) whose compiled peak is under ``limit`` is chosen."""
    check_budget(w, 1, limit)
    rows = []
    for spec in ["none", *specs]:
        pol = as_policy(spec)
        cand, r = _candidate(w, pol, limit, "none" if spec == "none" else "catalogue")
        rows.append((cand, pol, r))
    fitting = [row for row in rows if row[0].fits]
    cands = tuple(row[0] for row in rows)
    if not fitting:
        cand, pol, r = min(rows, key=lambda row: row[0].peak_bytes)
        return _Chosen(pol, "nothing", False, cand.peak_bytes, cand.host_bytes, r, cands, {})
    cand, pol, r = min(fitting, key=lambda row: (row[0].overhead, row[0].peak_bytes))
    source = "none" if cand.label == "none" else "catalogue"
    return _Chosen(
        pol, source, True, cand.peak_bytes, cand.host_bytes, r, cands, {},
        cand.recompute_overhead, cand.overhead,
    )  # fmt: skip


def _xla_pass(
    source: Any, target: Target, limit: int, none: Any, seconds: float | None
) -> tuple[int, Any, int] | None:
    """``none`` under XLA's own rematerialization pass, asked for ``limit``: ``(slop factor,
    its report or None, compiles)``, the report where its compiled peak is under ``limit``
    and its predicted step time under ``seconds`` (the plan in hand's); None where it is not
    tried (not a GPU, no rates, ``none`` already fits, or no factor reaches below ``limit``).

    XLA's GPU pass works to ``(base - inputs - outputs) * slop / 100`` bytes of temporaries
    (:mod:`remat_kit.targets.runtime`), with ``base`` the process's ``bytes_limit``, so the
    factor that asks for ``limit`` is ``(limit - io) / (base - io)``, rounded down to a whole
    percent; its compile says where the pass really got. The pass picks what to recompute
    by its own cost model (no kernel times), so it competes on the step time predicted from
    its kernels like every plan. On a GPU in this process (``target="local"``) the base is
    its allocator's real ``bytes_limit``, and the decision's compiles are the real ones.
    """
    gpu = target.kind == "gpu" or (target.kind == "local" and target.compute_capability)
    if not gpu or seconds is None or none.peak_bytes <= limit:
        return None
    io = none.argument_bytes + none.output_bytes - none.alias_bytes
    base = target.usable_bytes or 0
    slop = min(SLOP_FACTOR, 100 * (limit - io) // max(1, base - io))
    if slop < 1:  # the budget is within a percent of the inputs and outputs: not this way
        return None
    tried = 0
    while slop >= 1 and tried < XLA_TRIES:
        w = sources.workload(source, target.with_slop_factor(slop), TrainConfig(batch=1, seq=1))
        r = w.compiled(NO_REMAT, NO_SCHEDULE, 1)
        tried += 1
        if r.peak_bytes <= limit:
            got = _seconds(r)
            return slop, (r if got is not None and got < seconds else None), tried
        # XLA logs the limit it worked to only where it fell short of it: a lower one neither
        if r.xla_remat_limit_bytes is not None:
            break
        slop -= max(1, -(-100 * (r.peak_bytes - limit) // max(1, base - io)))
    return slop, None, tried


def _seconds(report: Any) -> float | None:
    st = getattr(report, "step_time", None)
    return None if st is None else float(st.seconds)
