"""``remat-kit plan``'s front through the seam every search shares (issue 48): the catalogue
and schedule points go to ``Workload.compile_all`` together, side by side where the workload
has a :class:`rk.sources.Spread`, and the front is the one they give one by one.

As in tests/test_side_by_side.py, the executor is a thread pool and the step a fake
``Measured`` one (module-level: a Spread's ``workload_for`` must pickle): which program ran
on which thread shows where it was compiled, and nothing compiles.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest

import remat_kit as rk
from helpers import memory_report
from remat_kit.cli import main

MAIN = threading.main_thread().ident

FIXED, BASE_FLOPS = 1000, 1e6  # bytes no policy removes; FLOPs per sample without remat
# Bytes each policy keeps per sample, and the FLOPs it recomputes (a fraction of the step).
KEEPS = {"none": 900, "full": 100, "dots": 400, "minimal": 500, "block": 400}
RECOMPUTES = {"none": 0.0, "full": 0.33, "dots": 0.10, "minimal": 0.05, "block": 0.2}
# A segment schedule keeps less and recomputes more, the more layers it checkpoints.
SHRINK = {"none": 1.0, "sqrt": 0.6, "every:2": 0.5}
CATALOGUE = ["none", "full", "dots", "minimal", "block"]
SCHEDULES = [("none", "sqrt"), ("none", "every:2"), ("full", "sqrt")]
CALLS: list[tuple[str, str, int, int]] = []  # (policy, schedule, batch, thread id)


def _flops(pol, sch, batch):
    extra = RECOMPUTES[pol.spec] + (1.0 - SHRINK[sch.spec]) * 0.4
    return batch * BASE_FLOPS * (1.0 + extra)


def _measure(pol, sch, batch):
    CALLS.append((pol.spec, sch.spec, batch, threading.get_ident()))
    peak = FIXED + int(batch * KEEPS[pol.spec] * SHRINK[sch.spec])
    return memory_report(
        peak_bytes=peak,
        argument_bytes=FIXED,
        temp_bytes=peak - FIXED,
        flops=_flops(pol, sch, batch),
        policy=pol.spec,
        schedule=sch.spec,
        meta={"program": f"{pol.spec}@{sch.spec}"},
    )


def _parts(batch):
    # From the shapes, as a model's breakdown is (no compile): FIXED in all.
    return {"weights": 400, "gradients": 400, "optimizer": 200}


def fake() -> rk.sources.Workload:
    """The fake step at sequence 16 on an H100."""
    measured = rk.sources.Measured(_measure, _flops, breakdown_fn=_parts)
    return rk.sources.workload(measured, "h100", rk.TrainConfig(1, 16))


@pytest.fixture(autouse=True)
def _calls(monkeypatch):
    """Every call of the fake step counts as a compile (``cache.compiles()``), as a real
    compile that missed the cache does: ``compile_all`` sends the rest out after one."""
    CALLS.clear()
    monkeypatch.setattr("remat_kit.cache.compiles", lambda: len(CALLS))
    yield
    CALLS.clear()


def _spread(pool, slow_seconds=0.0):
    # slow_seconds 0: every compile counts as slow enough to be worth a worker.
    spread = rk.sources.Spread(fake, executor=pool, slow_seconds=slow_seconds)
    return dataclasses.replace(fake(), spread=spread)


@pytest.fixture
def spread_out(pool):
    return _spread(pool)


def _where() -> dict[tuple[str, str], int]:
    return {(c[0], c[1]): c[3] for c in CALLS}


@pytest.mark.parametrize("objective", ["time", "flops"])
def test_a_spread_front_is_the_front_one_by_one(spread_out, objective):
    alone = rk.front(fake(), 2, policies=CATALOGUE, schedules=SCHEDULES, objective=objective)
    assert {pt.dominated for pt in alone} == {True, False}  # a front with something to mark
    CALLS.clear()
    got = rk.front(spread_out, 2, policies=CATALOGUE, schedules=SCHEDULES, objective=objective)
    assert got == alone  # labels, peaks, overheads, dominated flags, in the same order
    expected = [FIXED + int(2 * KEEPS[p] * SHRINK[s]) for p, s in [(p, "none") for p in CATALOGUE]]
    assert [pt.peak_bytes for pt in got[: len(CATALOGUE)]] == expected
    # Each program compiled once: the first here (how slow they are), the second here while
    # every other one compiles on the pool's threads.
    assert len(CALLS) == len(CATALOGUE) + len(SCHEDULES) == spread_out.compiles
    _first_two_here()


def _first_two_here():
    where = _where()
    assert CALLS[0][:2] == ("none", "none")
    assert where.pop(("none", "none")) == where.pop(("full", "none")) == MAIN
    assert MAIN not in set(where.values())


@pytest.mark.parametrize("spread", [False, True])
def test_without_workers_or_slow_compiles_the_front_compiles_here_in_order(pool, spread):
    # A spread whose first compile was quicker than a worker takes to start keeps the rest here.
    w = _spread(pool, slow_seconds=1e9) if spread else fake()
    pts = rk.front(w, 2, policies=CATALOGUE, schedules=SCHEDULES)
    assert [(c[0], c[1]) for c in CALLS] == [(p, "none") for p in CATALOGUE] + SCHEDULES
    assert {c[3] for c in CALLS} == {MAIN}
    assert [pt.label for pt in pts] == [*CATALOGUE, "none @ sqrt", "none @ every:2", "full @ sqrt"]


def test_plan_front_compiles_its_catalogue_side_by_side_before_the_plan(spread_out):
    alone = rk.search.plan_front(fake(), 2, catalogue=CATALOGUE)
    CALLS.clear()
    got = rk.search.plan_front(spread_out, 2, catalogue=CATALOGUE)
    assert got.points == alone.points
    assert (got.plan.policy, got.plan.schedule, got.plan.peak_bytes) == (
        alone.plan.policy,
        alone.plan.schedule,
        alone.plan.peak_bytes,
    )
    assert len(CALLS) == len(CATALOGUE)  # the plan and the front read what came back
    assert got.plan.compiles == alone.plan.compiles == len(CATALOGUE)  # compiled for the plan
    _first_two_here()


def test_plan_front_refuses_a_bad_argument_before_compiling_side_by_side(spread_out):
    with pytest.raises(rk.BadValue, match=r"hide=1.5 must be in \[0, 1\]"):
        rk.search.plan_front(spread_out, 2, catalogue=CATALOGUE, hide=1.5)
    assert CALLS == []


PLAN = ["plan", "--model", "tiny-llama", "--target", "h100", "--seq", "64", "--batch", "2"]


@pytest.mark.parametrize(("jobs", "spread_jobs"), [("2", 2), ("1", None)])
def test_plan_jobs_reach_the_front(monkeypatch, jobs, spread_jobs):
    seen = {}

    def record(w, *a, **kw):
        seen.update(spread=w.spread, w=w)
        raise SystemExit(0)  # the search itself is not what is checked here

    monkeypatch.setattr("remat_kit.cli._plan.plan_front", record)
    with pytest.raises(SystemExit):
        main([*PLAN, "--policies", "full,minimal", "--jobs", jobs])
    spread = seen["spread"]
    assert (spread.jobs if spread is not None else None) == spread_jobs
    if spread is not None:
        assert spread.executor is None and spread.side_by_side
        w, built = seen["w"], spread.workload_for()  # what a worker builds: the same step
        assert (built.seq, built.target.name) == (64, "h100-80gb")
        assert (built.label, built.n_layers, built.target) == (w.label, w.n_layers, w.target)


@pytest.mark.parametrize("first_seconds", [0.0, 0.5, 1e9], ids=["quick", "just-slow", "slow"])
def test_after_a_slow_first_program_the_rest_go_out_at_once(first_seconds, monkeypatch):
    # The first program compiles here; when it took the spread's slow_seconds or more, the
    # rest are sent out while the next compiles here (at_once): none waits on another. A
    # quick first one: the rest compile here, one by one, as the points are read.
    from remat_kit.search import _front

    calls = []

    class Spy:
        spread = rk.sources.Spread(fake, executor=object(), slow_seconds=0.5)

        def compile_all(self, keys, *, at_once=False):
            calls.append((list(keys), at_once))

    clock = iter([0.0, first_seconds])
    monkeypatch.setattr(_front.time, "perf_counter", lambda: next(clock))
    keys = [(rk.policy(p), rk.schedules.NO_SCHEDULE, 2) for p in ("none", "full", "dots")]
    _front.compile_side_by_side(Spy(), keys)
    slow = first_seconds >= 0.5
    assert calls == [(keys[:1], False), *([(keys[1:], True)] if slow else [])]
