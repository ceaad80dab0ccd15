"""The planner's exact solver (step 3 of :func:`remat_kit.search.plan`), over the cost model
of :mod:`remat_kit.search._costs`.

Nothing here compiles.

**The solver** (:func:`solve`) minimises that overhead under a device-byte cap and an optional
host-byte cap as a mixed-integer linear program (``scipy.optimize.milp``, HiGHS), one program per
layer split ``k`` (0 and 1..L/2; ``k`` and ``L - k`` are the same plan with the groups
swapped), and returns the best with HiGHS' optimality status and gap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import math
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from remat_kit.policies import Policy
from remat_kit.schedules import NO_SCHEDULE, Schedule
from remat_kit.schedules import schedule as _make_schedule
from remat_kit.search._costs import CostModel, Estimate, tag_policy

__all__ = [
    "Solution",
    "SolverStatus",
    "solve",
]

#: Ties in overhead are broken toward fewer device bytes: the objective carries this much of
#: the step per cap of device bytes. HiGHS stops within an absolute gap of 1e-6, so a smaller
#: weight would not be resolved; the overhead a tie-break can cost is at most this (0.001%).
_TIE = 1e-5
_SOLVER = "scipy.optimize.milp (HiGHS)"
_STATUS = {0: "optimal", 1: "time limit", 2: "infeasible", 3: "unbounded", 4: "other"}


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
    return tag_policy(compact(save, decisions), off)


def compact(names: Sequence[str], decisions: Mapping[str, str]) -> list[str]:
    """``names`` with the module-path tags of every layer written once, as a glob.

    A model nobody tagged is tagged by module path, one tag per layer
    (``layers_3/mixer``): where the same tensor is saved in every layer, the glob
    (``layers_*/mixer``) says so in one name. A glob is used only where every tag of the
    model it matches (``decisions``' keys) is among ``names``, so the policy is the same.

    Example:
      >>> tags = {"layers_0/mixer": "save", "layers_1/mixer": "save", "query_proj": "save"}
      >>> compact(list(tags), tags)
      ['layers_*/mixer', 'query_proj']
      >>> compact(["layers_0/mixer"], {**tags, "layers_1/mixer": "recompute"})
      ['layers_0/mixer']
    """
    chosen, out, covered = set(names), [], set()
    for name in names:
        if name in covered:
            continue
        for glob in _layer_globs(name):
            members = [t for t in decisions if fnmatch.fnmatchcase(t, glob)]
            if len(members) > 1 and set(members) <= chosen:
                out.append(glob)
                covered.update(members)
                break
        else:
            out.append(name)
    return out


def _layer_globs(name: str) -> list[str]:
    """Globs of a module-path tag over its index parts (``3``, ``layers_3`` -> ``*``): the
    one that keeps the last part (the projection: ``Dense_1``) first, then all; none for a
    tag that is no module path or has no index."""
    if "/" not in name:
        return []
    parts = name.split("/")
    starred = [re.sub(r"^(\d+)$|^(.+_)(\d+)$", lambda m: (m[2] or "") + "*", p) for p in parts]
    found = ["/".join([*starred[:-1], parts[-1]]), "/".join(starred)]
    return [g for g in dict.fromkeys(found) if g != name]


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
      >>> from remat_kit.search._costs import cost_model
      >>> m = cost_model(w, 2, offload=False, hide=0.5)
      >>> sol, status = solve(m, m.untagged_bytes + 2_000)  # no room for mlpwi_1's 4096 B
      >>> sol.decisions, status.optimal
      ({'mlpwi_1': 'recompute', 'mlpwo': 'save'}, True)
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
                for v in ("n", "y", "z"):
                    var(g, u, v)
                if u in model.offloadable:
                    var(g, u, "h")  # on the host while needed: only where it can be
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
                on_host, recomputed = index.get((g, u, "h")), index[(g, u, "z")]
                for t in decidable:
                    if u in model.needs[t]:
                        row({nv: 1.0, index[(g, t, "r")]: -1.0}, 0.0, np.inf)
                row({kept: 1.0, s: -1.0, nv: -1.0}, -1.0, np.inf)
                row({recomputed: 1.0, r: -1.0, nv: -1.0}, -1.0, np.inf)
                if o is not None:  # an offloadable tensor: on_host is its column
                    row({on_host: 1.0, o: -1.0, nv: -1.0}, -1.0, np.inf)
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
