"""The planner's cost model and its exact solver (steps 2 and 3 of :func:`remat_kit.search.plan`).

Nothing here compiles: bytes come from traced residuals, costs from traced FLOPs, both cached in
the :class:`~remat_kit.search.workload.Workload`.

**The cost model** (:class:`CostModel`, built by :func:`cost_model`) starts from "save every
tagged tensor" and traces one step per tag with that tag recomputed. Every tag ``u`` then has

- ``size[u]``: its residual bytes over all layers when it is kept;
- ``needed[u]``: whether the backward pass reads it when every tag is saved. A tag that is not
  needed can become needed when another is recomputed: ``attn_out = x + out_proj`` is kept, so
  ``out_proj`` is not, until ``attn_out`` is recomputed from it. ``needs[t]`` lists the tags
  that recomputing ``t`` makes needed (the tags whose bytes grew in ``t``'s trace);
- ``cost[u]``: the FLOPs of recomputing it (for a tag needed only through another, traced with
  both recomputed);
- ``spill[t]``: untagged bytes that recomputing ``t`` leaves behind (the scan carry that stands
  in for ``decoder_layer_input``), so a single move is exactly what its trace says.

A plan decides, per tag, ``save`` / ``recompute`` / ``offload``, possibly differently in the first
``k`` layers (a ``layers`` schedule). Its device bytes are the untagged residuals plus the bytes
of every needed tag it saves plus its spills, its host bytes those of every needed tag it
offloads, its FLOPs those of every needed tag it recomputes, each per layer group in proportion
to the group's layers. Its overhead is recompute FLOPs against the step without remat, plus the
host round trip that does not hide behind ``hide`` x the step's compute (as
:meth:`Workload.overhead_of` counts it for a compiled report).

On a Llama block this is exact for every pair of tags: traced, all pairs of llama3-8b's tags
(13 with einsum attention, 12 with flash attention) are additive but ``attn_out`` /
``out_proj``, which the model captures.

**The solver** (:func:`solve`) minimises that overhead under a device-byte cap and an optional
host-byte cap as a mixed-integer linear program (``scipy.optimize.milp``, HiGHS), one program per
layer split ``k`` (0 and 1..L/2; ``k`` and ``L - k`` are the same plan with the groups
swapped), and returns the best with HiGHS' optimality status and gap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from remat_kit.policies import Policy, policy
from remat_kit.schedules import Schedule
from remat_kit.schedules import schedule as _make_schedule
from remat_kit.search.workload import NO_REMAT, NO_SCHEDULE, Workload

__all__ = [
    "CostModel",
    "Estimate",
    "Solution",
    "SolverStatus",
    "cost_model",
    "solve",
    "tag_policy",
]

#: Ties in overhead are broken toward fewer device bytes: the objective carries this much of
#: the step per cap of device bytes. HiGHS stops within an absolute gap of 1e-6, so a smaller
#: weight would not be resolved; the overhead a tie-break can cost is at most this (0.001%).
_TIE = 1e-5
_SOLVER = "scipy.optimize.milp (HiGHS)"
_STATUS = {0: "optimal", 1: "time limit", 2: "infeasible", 3: "unbounded", 4: "other"}


def tag_policy(save: Sequence[str], offload: Sequence[str]) -> Policy:
    """The ``names`` (or ``offload``) policy that saves ``save`` and offloads ``offload``.

    With nothing saved or offloaded that is ``full``.

    Example:
      >>> tag_policy(["query_proj"], []).spec
      'names:save=query_proj'
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the user's own tags, outside the vocabulary, are fine
        if offload:
            return policy("offload", offload=list(offload), save=list(save))
        # Saving no tagged tensor is what "full" means; name it so.
        return policy("names", save=list(save)) if save else policy("full")


@dataclasses.dataclass(frozen=True)
class Estimate:
    """What the cost model says of one assignment.

    Attributes:
      device_bytes: residual bytes kept on the device (traced bytes, model).
      host_bytes: residual bytes offloaded to host memory.
      flops: FLOPs of the step.
      recompute_overhead: ``flops / baseline - 1``.
      overhead: the objective's recomputation (time or FLOPs, :attr:`CostModel.objective`)
        plus the host transfer that does not hide behind compute.
    """

    device_bytes: float
    host_bytes: float
    flops: float
    recompute_overhead: float
    overhead: float


@dataclasses.dataclass(frozen=True)
class CostModel:
    """The planner's cost model of one step at one batch size (see the module docstring).

    Attributes:
      tags: the tags of the step, in trace order.
      n_layers: layers of the stack (per-layer figures are totals / ``n_layers``).
      saved_bytes: device residual bytes with every tag saved (traced).
      saved_flops: FLOPs of the step with every tag saved (traced).
      baseline_flops: FLOPs of the step without rematerialization.
      size: tag -> residual bytes over all layers when it is kept.
      needed: tag -> read by the backward pass when every tag is saved.
      needs: tag -> tags that recomputing it makes needed.
      spill: tag -> untagged device bytes that recomputing it adds.
      cost: tag -> FLOPs of recomputing it (when it is needed).
      offloadable: tags that may be offloaded (empty when offload is off or cannot be costed).
      weight: tag -> what recomputing it adds to the objective, as a fraction of the step
        without remat: its seconds at the target's rates (``time``) or its FLOPs (``flops``).
      saved_weight: the objective's overhead of the step with every tag saved (the
        recomputation that no tag decision removes), the same unit.
      objective: ``time`` or ``flops`` (``time`` on a target without rates falls back to
        ``flops``).
      step_seconds: the step's compute time without remat (None: unknown), as the objective
        estimates it (:meth:`Workload.step_seconds`).
      link_bandwidth: the host link, bytes/s per direction (None: unknown).
      hide: fraction of the step's compute time transfers may take and stay hidden.
    """

    tags: tuple[str, ...]
    n_layers: int
    saved_bytes: int
    saved_flops: float
    baseline_flops: float
    size: Mapping[str, int]
    needed: Mapping[str, bool]
    needs: Mapping[str, tuple[str, ...]]
    spill: Mapping[str, int]
    cost: Mapping[str, float]
    weight: Mapping[str, float]
    saved_weight: float = 0.0
    objective: str = "flops"
    offloadable: frozenset[str] = frozenset()
    step_seconds: float | None = None
    link_bandwidth: float | None = None
    hide: float = 0.5

    @property
    def untagged_bytes(self) -> int:
        """Device residual bytes no tag decision changes (arguments, the scan carry, ...)."""
        return self.saved_bytes - sum(self.size[u] for u in self.tags if self.needed[u])

    def can_be_needed(self, tag: str) -> bool:
        """The tag is needed when every tag is saved, or some recompute makes it needed."""
        return self.needed[tag] or any(tag in self.needs[t] for t in self.tags)

    def evaluate(
        self,
        decisions: Mapping[str, str],
        first: Mapping[str, str] | None = None,
        layers: int = 0,
    ) -> Estimate:
        """The model's figures for ``decisions`` (and ``first`` in the first ``layers`` layers).

        Args:
          decisions: tag -> ``save`` | ``recompute`` | ``offload``; missing tags are saved.
          first: the decisions of the first ``layers`` layers, when they differ.
          layers: how many layers follow ``first``.

        Returns:
          The Estimate.

        Example:
          >>> m = cost_model(w, 2, offload=False, hide=0.5)
          >>> m.evaluate({}).device_bytes - m.evaluate({"mlpwi_1": "recompute"}).device_bytes
          3968.0
        """
        groups = [(decisions, 1.0)]
        if layers and first is not None:
            frac = layers / self.n_layers
            groups = [(first, frac), (decisions, 1.0 - frac)]
        dev, host = float(self.untagged_bytes), 0.0
        flops, weight = float(self.saved_flops), self.saved_weight
        for dec, w in groups:
            rec = {t for t in self.tags if dec.get(t, "save") == "recompute"}
            for u in self.tags:
                need = self.needed[u] or any(u in self.needs[t] for t in rec)
                d = dec.get(u, "save")
                if need and d == "save":
                    dev += w * self.size[u]
                elif need and d == "offload":
                    host += w * self.size[u]
                elif need:
                    flops += w * self.cost[u]
                    weight += w * self.weight[u]
            dev += w * sum(self.spill[t] for t in rec)
        recompute = flops / self.baseline_flops - 1.0
        return Estimate(dev, host, flops, recompute, weight + self.exposed(host))

    def exposed(self, host_bytes: float) -> float:
        """Transfer time of ``host_bytes`` beyond what hides behind compute, per step time."""
        if host_bytes <= 0:
            return 0.0
        if not self.step_seconds or not self.link_bandwidth:
            return math.inf
        transfer = 2.0 * host_bytes / self.link_bandwidth
        return max(0.0, transfer - self.hide * self.step_seconds) / self.step_seconds


def cost_model(
    workload: Workload, batch: int, *, offload: bool, hide: float, objective: str = "time"
) -> CostModel:
    """Traces the cost model of ``workload`` at ``batch`` (cached in the workload).

    One trace with every tag saved, one per tag with that tag recomputed, and one per tag that
    only another's recompute makes needed (with both recomputed): ``2 + 2 * tags`` traces of
    residuals and FLOPs at most, no compile.

    Args:
      workload: the step (needs ``residuals_fn``).
      batch: the batch size.
      offload: allow offloading (only where the target's host link and peak FLOPs are known).
      hide: fraction of the step's compute time transfers may take and stay hidden.
      objective: ``time`` (each tag's recomputation at the target's rates, offload at the
        host link's measured efficiency and not hidden, as :mod:`remat_kit.timing` prices a
        compiled step; ``hide`` is then 0) or ``flops``.

    Returns:
      The CostModel.

    Raises:
      ValueError: the workload has no ``residuals_fn``.

    Example:
      >>> m = cost_model(w, 2, offload=False, hide=0.5)
      >>> m.tags, m.size["mlpwi_1"]
      (('mlpwi_1', 'mlpwo', 'lm_head'), 4096)
      >>> round(m.evaluate({"mlpwi_1": "recompute"}).recompute_overhead, 3)
      0.082
    """
    key = ("cost_model", batch, offload, hide, objective)
    if key in workload.memo:
        return workload.memo[key]
    # One decision per value: a value a model names twice (its own name and ours beside it,
    # MaxText's MoE names) is saved or recomputed under its first name.
    traced = workload.traced_residuals(NO_REMAT, NO_SCHEDULE, batch)
    present: tuple[str, ...] = ()
    for t in traced.tags:
        if not set(traced.same.get(t, ())) & set(present):
            present += (t,)

    timed = objective == "time" and workload.traced_seconds(NO_REMAT, NO_SCHEDULE, batch)
    base_cost = (
        workload.traced_seconds(NO_REMAT, NO_SCHEDULE, batch) if timed else workload.baseline(batch)
    )

    def trace(recomputed: Sequence[str]) -> tuple[int, float, dict[str, int], float]:
        pol = tag_policy([t for t in present if t not in recomputed], ())
        res = workload.traced_residuals(pol, NO_SCHEDULE, batch)
        kept = {
            name: sum(
                r.nbytes
                for r in res.residuals
                if r.kind == "saved" and (r.name == name or r.name in res.same.get(name, ()))
            )
            for name in present
        }
        flops = workload.traced_flops(pol, NO_SCHEDULE, batch)
        cost = workload.traced_seconds(pol, NO_SCHEDULE, batch) if timed else flops
        return res.bytes_by("saved"), flops, kept, cost / base_cost

    def saving(nbytes: int) -> float:
        # A residual kept is written in the forward pass and read in the backward: recomputing
        # it saves that traffic (what makes `full` faster than `none` on an H100 for
        # gpt2-medium, measured), as a fraction of the step.
        return 2.0 * nbytes / workload.speed.bytes_per_s() / base_cost if timed else 0.0

    base_bytes, base_flops, base_kept, base_weight = trace(())
    needed = {u: base_kept[u] > 0 for u in present}
    size = dict(base_kept)
    needs: dict[str, tuple[str, ...]] = {}
    spill: dict[str, int] = {}
    cost: dict[str, float] = {}
    weight: dict[str, float] = {}
    singles = {t: trace((t,)) for t in present}
    for t, (_, f, kept, _) in singles.items():
        grown = tuple(u for u in present if u != t and kept[u] > base_kept[u])
        needs[t] = grown
        for u in grown:
            size[u] = max(size[u], kept[u])
        cost[t] = max(0.0, f - base_flops) if needed[t] else 0.0
    for t, (b, _, kept, wt) in singles.items():
        weight[t] = wt - base_weight - saving(size[t]) if needed[t] else 0.0
        freed = base_bytes - b
        growth = sum(kept[u] - base_kept[u] for u in needs[t])
        spill[t] = (size[t] if needed[t] else 0) - growth - freed
    for u in present:
        if needed[u]:
            continue
        via = next((t for t in present if u in needs[t]), None)
        if via is not None:
            # Needed only when ``via`` is recomputed: its cost is the pair's beyond via's own.
            pair = trace((via, u))
            cost[u] = max(0.0, pair[1] - singles[via][1])
            weight[u] = pair[3] - singles[via][3] - saving(size[u])
    step = workload.step_seconds(batch, "time" if timed else "flops")
    link = workload.target.host_link_bandwidth
    if timed and workload.speed.host_link:
        # As the compiled time model prices offload: at the link's measured efficiency and
        # not hidden (XLA did not overlap offload copies with compute on an H100).
        link = workload.speed.host_link * workload.speed.host_link_efficiency
        hide = 0.0
    can_offload = offload and bool(step) and bool(link)
    model = CostModel(
        tags=present,
        n_layers=max(1, int(workload.n_layers)),
        saved_bytes=base_bytes,
        saved_flops=base_flops,
        baseline_flops=workload.baseline(batch),
        size=size,
        needed=needed,
        needs=needs,
        spill=spill,
        cost=cost,
        weight=weight,
        saved_weight=base_weight - 1.0,
        objective="time" if timed else "flops",
        offloadable=frozenset(u for u in present if can_offload and size[u] > 0),
        step_seconds=step,
        link_bandwidth=link,
        hide=hide,
    )
    workload.memo[key] = model
    return model


@dataclasses.dataclass(frozen=True)
class SolverStatus:
    """How the keep/recompute/offload program was solved.

    Attributes:
      status: ``optimal`` (proven, within ``gap``), ``time limit``, ``infeasible`` (nothing
        meets the caps on the model) or ``other``.
      optimal: the returned assignment is proven optimal on the cost model.
      gap: relative gap between the assignment's objective and the best lower bound over all
        layer splits (0.0 when proven optimal; None when infeasible).
      objective: the model's overhead of the assignment (None when infeasible).
      bound: the best lower bound on it over all layer splits.
      programs: MILPs solved (one per layer split).
      device_cap_bytes: the residual-byte cap the model was solved under (whole layers).
      host_cap_bytes: the host-byte cap (None: none).
      seconds: wall time of the solves.
      solver: what solved it.
    """

    status: str
    optimal: bool
    gap: float | None
    objective: float | None
    bound: float | None
    programs: int
    device_cap_bytes: float
    host_cap_bytes: float | None
    seconds: float
    solver: str = _SOLVER


@dataclasses.dataclass(frozen=True)
class Solution:
    """One assignment: decisions per tag, and for the first ``layers`` layers when they differ.

    Attributes:
      decisions: tag -> decision in the layers after the first ``layers`` (all when 0).
      first: tag -> decision in the first ``layers`` layers (equal to ``decisions`` when 0).
      layers: the split.
      estimate: the cost model's figures.
    """

    decisions: Mapping[str, str]
    first: Mapping[str, str]
    layers: int
    estimate: Estimate

    def policies(self) -> tuple[Policy, Schedule]:
        """The policy (and ``layers`` schedule when split) that applies the decisions."""
        rest = _policy_of(self.decisions)
        if not self.layers:
            return rest, NO_SCHEDULE
        # "rest" named too, so the schedule alone says what every layer does.
        plan = {range(0, self.layers): _policy_of(self.first), "rest": rest}
        return rest, _make_schedule("layers", plan=plan)


def _policy_of(decisions: Mapping[str, str]) -> Policy:
    save = [t for t, d in decisions.items() if d == "save"]
    off = [t for t, d in decisions.items() if d == "offload"]
    return tag_policy(save, off)


def solve(
    model: CostModel,
    device_cap: float,
    split_cap: float | None = None,
    host_cap: float | None = None,
    *,
    splits: bool = True,
    time_limit: float = 20.0,
) -> tuple[Solution | None, SolverStatus]:
    """The assignment of least model overhead whose device bytes fit ``device_cap``.

    Args:
      model: the cost model.
      device_cap: residual bytes allowed on the device for a plan without a layer split.
      split_cap: the same for a plan with a split (a split runs the stack as two scans, which
        can cost memory of its own); default ``device_cap``.
      host_cap: host bytes allowed (None: no limit).
      splits: also consider splits ``k = 1 .. n_layers // 2``.
      time_limit: seconds per program.

    Returns:
      ``(solution, status)``: the best Solution over all splits (ties: no split, then fewer
      device bytes), or None when no assignment meets the caps on the model; and how the
      programs were solved.

    Example:
      >>> m = cost_model(w, 2, offload=False, hide=0.5)
      >>> sol, status = solve(m, m.untagged_bytes + 2_000)  # no room for mlpwi_1's 4096 B
      >>> sol.decisions, status.optimal
      ({'mlpwi_1': 'recompute', 'mlpwo': 'save', 'lm_head': 'save'}, True)
    """
    t0 = time.perf_counter()
    split_cap = device_cap if split_cap is None else split_cap
    L = model.n_layers
    ks = [0, *range(1, L // 2 + 1)] if splits and L > 1 else [0]
    found: list[tuple[float, int, Solution]] = []
    bounds: list[float] = []
    statuses: list[str] = []
    for k in ks:
        cap = device_cap if k == 0 else split_cap
        got = _solve_one(model, k, cap, host_cap, time_limit)
        statuses.append(got[0])
        if got[0] == "infeasible":
            continue
        bounds.append(got[2] if got[2] is not None else -math.inf)
        if got[1] is not None:
            objective, first, rest = got[1]
            found.append((objective, k, _solution(model, first, rest, k)))
    seconds = time.perf_counter() - t0
    if not found:
        failed = "infeasible" if all(s == "infeasible" for s in statuses) else "other"
        none = SolverStatus(failed, False, None, None, None, len(ks), device_cap, host_cap, seconds)
        return None, none
    objective, k, sol = min(
        found, key=lambda item: (round(item[0], 12), item[1] > 0, item[2].estimate.device_bytes)
    )
    bound = min(min(bounds) if bounds else objective, objective)
    proven = all(s in ("optimal", "infeasible") for s in statuses)
    status = SolverStatus(
        "optimal" if proven else next(s for s in statuses if s not in ("optimal", "infeasible")),
        proven,
        0.0 if proven else max(0.0, objective - bound) / max(abs(objective), 1e-12),
        objective,
        bound,
        len(ks),
        device_cap,
        host_cap,
        seconds,
    )
    return sol, status


def _solution(
    model: CostModel, first: Mapping[str, str], rest: Mapping[str, str], k: int
) -> Solution:
    est = model.evaluate(rest, first if k else None, k)
    return Solution(dict(rest), dict(first if k else rest), k, est)


def _solve_one(
    model: CostModel, k: int, cap: float, host_cap: float | None, time_limit: float
) -> tuple[str, tuple[float, dict[str, str], dict[str, str]] | None, float | None]:
    """One MILP: the groups ``[0, k)`` and ``[k, L)`` (one group when ``k == 0``).

    Variables per group and tag: binaries ``s`` (save), ``r`` (recompute), ``o`` (offload,
    only for offloadable tags) with ``s + r + o = 1``; for a tag needed only through another,
    ``n`` (needed) >= ``r`` of each tag that makes it needed, and ``y >= s + n - 1`` (kept),
    ``h >= o + n - 1`` (on host), ``z >= r + n - 1`` (recomputed): minimisation and the caps
    push them to the products they stand for. One ``e`` >= the exposed transfer fraction.
    Bytes are scaled by the cap, so the coefficients are near 1.
    """
    # Imported here: scipy.optimize costs ~0.6 s at start-up that only a plan needs.
    from scipy.optimize import Bounds, LinearConstraint, milp

    L = model.n_layers
    groups = [(1.0, "all")] if k == 0 else [(k / L, "first"), ((L - k) / L, "rest")]
    scale = max(abs(cap), 1.0)
    cols: list[tuple[str, str, str]] = []  # (group, tag, var)
    index: dict[tuple[str, str, str], int] = {}

    def var(g: str, t: str, v: str) -> int:
        index[(g, t, v)] = len(cols)
        cols.append((g, t, v))
        return index[(g, t, v)]

    decidable = [u for u in model.tags if model.can_be_needed(u)]
    for _, g in groups:
        for u in decidable:
            var(g, u, "s")
            var(g, u, "r")
            if u in model.offloadable:
                var(g, u, "o")
            if not model.needed[u]:
                for v in ("n", "y", "h", "z"):
                    var(g, u, v)
    e = len(cols)
    cols.append(("", "", "e"))
    n = len(cols)
    c = np.zeros(n)
    lo, hi = np.zeros(n), np.ones(n)
    integrality = np.zeros(n)
    hi[e] = np.inf
    c[e] = 1.0
    rows: list[np.ndarray] = []
    row_lo: list[float] = []
    row_hi: list[float] = []

    def row(coeffs: Mapping[int, float], lb: float, ub: float) -> None:
        a = np.zeros(n)
        for i, v in coeffs.items():
            a[i] += v
        rows.append(a)
        row_lo.append(lb)
        row_hi.append(ub)

    device: dict[int, float] = {}
    host: dict[int, float] = {}
    for w, g in groups:
        for u in decidable:
            s, r = index[(g, u, "s")], index[(g, u, "r")]
            o = index.get((g, u, "o"))
            integrality[[s, r]] = 1
            parts = {s: 1.0, r: 1.0}
            if o is not None:
                integrality[o] = 1
                parts[o] = 1.0
            row(parts, 1.0, 1.0)
            if model.needed[u]:
                kept, on_host, recomputed = s, o, r
            else:
                nv, kept = index[(g, u, "n")], index[(g, u, "y")]
                on_host, recomputed = index[(g, u, "h")], index[(g, u, "z")]
                for t in decidable:
                    if u in model.needs[t]:
                        row({nv: 1.0, index[(g, t, "r")]: -1.0}, 0.0, np.inf)
                row({kept: 1.0, s: -1.0, nv: -1.0}, -1.0, np.inf)
                row({recomputed: 1.0, r: -1.0, nv: -1.0}, -1.0, np.inf)
                if o is not None:
                    row({on_host: 1.0, o: -1.0, nv: -1.0}, -1.0, np.inf)
                else:
                    hi[on_host] = 0.0
            device[kept] = device.get(kept, 0.0) + w * model.size[u] / scale
            device[r] = device.get(r, 0.0) + w * model.spill[u] / scale
            c[recomputed] += w * model.weight[u]
            if on_host is not None:
                host[on_host] = host.get(on_host, 0.0) + w * model.size[u] / scale
    # Ties: fewer device bytes.
    for i, v in device.items():
        c[i] += _TIE * v
    row(device, -np.inf, (cap - model.untagged_bytes) / scale)
    if host:
        if host_cap is not None:
            row(host, -np.inf, host_cap / scale)
        if model.step_seconds and model.link_bandwidth:
            # e >= (2 H / link - hide * step) / step
            k_h = 2.0 * scale / (model.link_bandwidth * model.step_seconds)
            row({e: 1.0, **{i: -k_h * v for i, v in host.items()}}, -model.hide, np.inf)
    with _quiet_c_stdout():
        res = milp(
            c,
            integrality=integrality,
            bounds=Bounds(lo, hi),
            constraints=LinearConstraint(np.array(rows), row_lo, row_hi),
            # Presolve buys nothing on programs this small, and its solution transform is
            # what prints HiGHS 1.12's stray debugging line.
            options={"time_limit": time_limit, "mip_rel_gap": 1e-9, "presolve": False},
        )
    status = _STATUS.get(res.status, "other")
    if res.x is None:
        return status, None, None
    x = res.x
    picked: dict[str, dict[str, str]] = {}
    for _, g in groups:
        dec = {}
        for u in model.tags:
            if u not in decidable:
                dec[u] = "save"  # never read by the backward pass: saving it costs nothing
                continue
            o = index.get((g, u, "o"))
            if x[index[(g, u, "s")]] > 0.5:
                dec[u] = "save"
            elif o is not None and x[o] > 0.5:
                dec[u] = "offload"
            else:
                dec[u] = "recompute"
        picked[g] = _tidy(model, dec)
    first = picked["first"] if k else picked["all"]
    rest = picked["rest"] if k else picked["all"]
    est = model.evaluate(rest, first if k else None, k)
    # The model's own overhead (the program leaves out the constant recompute of "save every
    # tagged tensor" and adds the tie-break terms) and a lower bound on it.
    objective = est.overhead
    dual = getattr(res, "mip_dual_bound", None)
    if dual is None or not math.isfinite(dual):
        return status, (objective, first, rest), None
    const = model.saved_weight
    bound = dual + const - _TIE * sum(device.values())
    return status, (objective, first, rest), min(bound, objective)


def _tidy(model: CostModel, dec: dict[str, str]) -> dict[str, str]:
    """Decisions that change nothing on the model become ``save``: a tag the backward pass does
    not read under ``dec`` (``out_proj`` while ``attn_out`` is kept), or one of no bytes. The
    solver is indifferent to them; the policy is plainer without them."""
    rec = {t for t, d in dec.items() if d == "recompute"}
    out = dict(dec)
    for u in model.tags:
        needed = model.needed[u] or any(u in model.needs[t] for t in rec)
        if not needed or (out[u] == "offload" and model.size[u] == 0):
            out[u] = "save"
    return out


@contextlib.contextmanager
def _quiet_c_stdout() -> Iterator[None]:
    """Silences file descriptor 1 for the block: HiGHS 1.12 (scipy 1.17) writes a stray
    ``HighsMipSolverData::transformNewIntegerFeasibleSolution`` line to the C stdout whatever
    its options say (ERGO-Code/HiGHS#2783), which would land in the middle of our tables."""
    try:
        fd = 1
        os.fstat(fd)
    except OSError:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(fd)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)
