"""Programs a search needs at once compiled side by side: ``_workers.run(at_once=True)``,
``Workload.compile_all`` through a :class:`rk.sources.Spread`, and ``max_batch``'s boundary.

The executor here is a thread pool: the seam is a ``concurrent.futures.Executor`` whatever
runs behind it (a Dask cluster's workers in tests/test_cluster.py), and threads show which
item ran where without starting processes. No test compiles.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest

import remat_kit as rk
from helpers import memory_report
from remat_kit import _workers
from remat_kit.policies import as_policy
from remat_kit.schedules import NO_SCHEDULE

MAIN = threading.main_thread().ident

# The fake step: peak = FIXED + PER_SAMPLE x batch; read off "copies" it is off by COPIES_OFF.
FIXED, PER_SAMPLE = 1000, 100
COPIES_OFF = 1.5
CALLS: list[tuple[str, str, int, int]] = []  # (kind, policy, batch, thread id)


def _report(peak: int, policy: str, batch: int, mode: str) -> rk.MemoryReport:
    return memory_report(
        peak_bytes=int(peak),
        argument_bytes=FIXED,
        temp_bytes=int(peak) - FIXED,
        policy=policy,
        meta={"batch": batch, "depth": {"mode": mode}},
    )


def _whole(pol, sch, batch):
    CALLS.append(("whole", pol.spec, batch, threading.get_ident()))
    return _report(FIXED + PER_SAMPLE * batch, pol.spec, batch, "full")


def _copies(pol, sch, batch):
    CALLS.append(("copies", pol.spec, batch, threading.get_ident()))
    return _report(FIXED + COPIES_OFF * PER_SAMPLE * batch, pol.spec, batch, "extrapolated")


def _verify(pol, sch, batch, report, limit):
    # As rk.sources' verify_search: no report, or one read off copies: compiled whole.
    if report is None or report.meta["depth"]["mode"] == "extrapolated":
        return _whole(pol, sch, batch)
    return report


def unrolled() -> rk.sources.Workload:
    """A step whose probes are read off shallow copies and verified whole (module-level: a
    Spread's ``workload_for`` must pickle)."""
    return rk.sources.workload(
        rk.sources.Measured(_copies, lambda p, s, b: float(b), verify_fn=_verify),
        "h100",
        rk.TrainConfig(1, 16),
    )


def full_depth() -> rk.sources.Workload:
    """An unrolled step compiled at full depth (``--depth full``): it checks its reports as
    the copies' step does, and they are final as they are."""
    return rk.sources.workload(
        rk.sources.Measured(_whole, lambda p, s, b: float(b), verify_fn=_verify),
        "h100",
        rk.TrainConfig(1, 16),
    )


def flat() -> rk.sources.Workload:
    """A step every probe of which is final (no ``verify_fn``)."""
    return rk.sources.workload(
        rk.sources.Measured(_whole, lambda p, s, b: float(b)), "h100", rk.TrainConfig(1, 16)
    )


@pytest.fixture(autouse=True)
def _calls():
    CALLS.clear()
    yield
    CALLS.clear()


@pytest.fixture
def counted(monkeypatch):
    """Every call of the fake step counts as a compile (``cache.compiles()``), as a real
    compile that missed the cache does."""
    monkeypatch.setattr("remat_kit.cache.compiles", lambda: len(CALLS))


@pytest.fixture
def compiles(monkeypatch):
    """``cache.compiles()`` as a counter the test's functions raise."""
    box = [0]
    monkeypatch.setattr("remat_kit.cache.compiles", lambda: box[0])
    return box


SENT = threading.Event()  # an item reached the executor
ORDER: list[tuple[str, int]] = []


def _out(x):
    # Module-level: the executor's items are pickled, as a cluster's are.
    ORDER.append(("out", x))
    SENT.set()
    return ("out", x, threading.get_ident())


def test_at_once_sends_the_rest_out_while_the_first_runs_here(pool, compiles):
    SENT.clear()

    def here(x):
        # Item 2 reaches the executor while item 1 is still running here.
        assert SENT.wait(10), "the other items were not sent out before item 1 ended"
        compiles[0] += 1  # item 1 compiled: the rest are not cached
        return ("here", x, threading.get_ident())

    got = _workers.run(_out, [1, 2, 3], 1, executor=pool, here=here, at_once=True)
    assert [g[:2] for g in got] == [("here", 1), ("out", 2), ("out", 3)]
    assert got[0][2] == MAIN and {g[2] for g in got[1:]} != {MAIN}


def test_at_once_runs_everything_here_when_the_first_was_cached(pool, compiles):
    def here(x):
        return ("here", x)

    got = _workers.run(_out, [1, 2, 3], 1, executor=pool, here=here, at_once=True)
    assert got == [("here", 1), ("here", 2), ("here", 3)]


def test_without_at_once_the_first_compile_here_comes_first(pool, compiles):
    ORDER.clear()

    def here(x):
        ORDER.append(("here", x))
        compiles[0] += 1
        return ("here", x)

    got = _workers.run(_out, [1, 2, 3], 1, executor=pool, here=here)
    assert [g[:2] for g in got] == [("here", 1), ("out", 2), ("out", 3)]
    assert ORDER[0] == ("here", 1)


def _keys(*pairs):
    return [(as_policy(p), NO_SCHEDULE, b) for p, b in pairs]


def test_compile_all_sends_the_missing_ones_out_and_keeps_them(pool, counted):
    w = dataclasses.replace(flat(), spread=rk.sources.Spread(flat, executor=pool))
    keys = _keys(("full", 3), ("none", 4), ("full", 5))
    # What the same keys give one by one, in a workload of its own.
    alone = [flat().compiled(*k) for k in keys]
    CALLS.clear()
    got = w.compile_all(keys)
    assert [r.peak_bytes for r in got] == [r.peak_bytes for r in alone]
    assert sorted((c[1], c[2]) for c in CALLS) == [("full", 3), ("full", 5), ("none", 4)]
    where = {(c[1], c[2]): c[3] for c in CALLS}
    assert where[("full", 3)] == MAIN  # the first here, through this workload
    assert MAIN not in {where[("none", 4)], where[("full", 5)]}  # the rest in the pool
    assert w.compiles == 3
    CALLS.clear()
    assert [r.peak_bytes for r in w.compile_all(keys)] == [r.peak_bytes for r in alone]
    assert CALLS == []  # all kept: nothing compiled again


def test_compile_all_without_a_spread_compiles_here_one_by_one(counted):
    w = flat()
    w.compile_all(_keys(("full", 3), ("none", 4)))
    assert [c[3] for c in CALLS] == [MAIN, MAIN]


def test_a_custom_policy_cannot_travel_and_compiles_here(pool, counted):
    import jax

    w = dataclasses.replace(flat(), spread=rk.sources.Spread(flat, executor=pool))
    custom = as_policy(jax.checkpoint_policies.nothing_saveable)
    w.compile_all([(custom, NO_SCHEDULE, 2), (as_policy("full"), NO_SCHEDULE, 3)])
    assert {c[3] for c in CALLS} == {MAIN}


def test_compile_all_whole_replaces_the_copies_and_counts_both(pool, counted):
    w = dataclasses.replace(unrolled(), spread=rk.sources.Spread(unrolled, executor=pool))
    full = as_policy("full")
    w.compiled(full, NO_SCHEDULE, 4)  # read off copies first; its whole step goes out
    keys = _keys(("full", 5), ("full", 4))
    got = w.compile_all(keys, whole=True, at_once=True)
    expected = [FIXED + PER_SAMPLE * b for b in (5, 4)]
    assert [r.peak_bytes for r in got] == expected
    assert [w.whole(*k).peak_bytes for k in keys] == expected
    assert w.verified(full, NO_SCHEDULE, 4).peak_bytes == expected[1]
    assert w.compiles == 3  # batch 4's copies and its whole step, batch 5's whole step
    assert w.has(full, NO_SCHEDULE, 5, whole=True)
    assert not w.has(full, NO_SCHEDULE, 6)


@pytest.mark.parametrize("make", [unrolled, full_depth, flat])
@pytest.mark.parametrize("slow_seconds, goes_out", [(0.0, True), (1e9, False)])
def test_max_batch_compiles_the_boundary_side_by_side_only_where_compiles_are_slow(
    pool, counted, make, slow_seconds, goes_out
):
    limit = FIXED + PER_SAMPLE * 17 + 50  # batch 17 fits, 18 does not
    expected = rk.max_batch(make(), "full", limit_bytes=limit)
    CALLS.clear()
    spread = rk.sources.Spread(make, executor=pool, slow_seconds=slow_seconds)
    w = dataclasses.replace(make(), spread=spread)
    got = rk.max_batch(w, "full", limit_bytes=limit)
    assert (got.batch, got.peak_bytes, got.next_peak_bytes) == (
        expected.batch,
        expected.peak_bytes,
        expected.next_peak_bytes,
    )
    assert got.batch == 17 and got.next_peak_bytes == FIXED + PER_SAMPLE * 18
    away = [c for c in CALLS if c[3] != MAIN]
    assert bool(away) is goes_out
    assert all(c[0] == "whole" for c in away)  # only full-depth compiles travel


def test_a_spread_checks_its_values():
    # Named alone, it compiles here: one job, no executor, the default slow mark (seed-109
    # mutant _spread.py:71, one job read as two: every spread workload started workers).
    alone = rk.sources.Spread(flat)
    assert (alone.jobs, alone.executor, alone.side_by_side) == (1, None, False)
    assert rk.sources.Spread(flat, jobs=2).side_by_side
    with pytest.raises(TypeError, match="jobs must be a positive int, got 0"):
        rk.sources.Spread(flat, jobs=0)
    with pytest.raises(TypeError, match="workload_for must be callable, got 3"):
        rk.sources.Spread(3)


def test_probes_read_off_copies_that_hold_are_never_sent_out(pool, counted):
    from remat_kit.search._batch import _Batches

    spread = rk.sources.Spread(unrolled, executor=pool, slow_seconds=0.0)
    w = dataclasses.replace(unrolled(), spread=spread)
    probes = _Batches(w, as_policy("full"), NO_SCHEDULE, 1)
    probes.copies, probes.slowest = [True], 100.0  # copies held, compiles slow
    probes.pair(5, 6)  # not probed yet: they will be read off copies, here
    assert CALLS == []
    probes.copies, probes.full_probes = [False], True  # copies off: every probe whole
    probes.pair(5, 6)
    assert sorted((c[0], c[2]) for c in CALLS) == [("whole", 5), ("whole", 6)]


def _dies_at_two(x):
    import os

    if x == 2:
        os._exit(9)  # as the OOM killer ends a compile that outgrew the host's memory
    return -x


def test_a_local_worker_that_dies_is_one_line_naming_what_it_left(compiles):
    def here(x):
        compiles[0] += 1  # item 1 compiled here: the others go to the pool at once
        return -x

    with pytest.raises(_workers.ClusterError, match=r"a worker process died .* 2\b") as err:
        _workers.run(_dies_at_two, [1, 2], 2, here=here, at_once=True)
    assert err.value.failures == (("2", "worker process died"),)


# The boundary's two sides: the one compiled here waits (up to 10 s) for the other to start
# in a worker, and records whether it did (module-level: a Spread's workload_for must pickle).
OTHER_SIDE = threading.Event()
OVERLAPPED: list[bool] = []
SIDES = (17, 18)  # the test's limit puts the boundary between batches 17 and 18


def _gated_whole(pol, sch, batch):
    if batch in SIDES and threading.get_ident() != MAIN:
        OTHER_SIDE.set()
    elif batch in SIDES:
        OVERLAPPED.append(OTHER_SIDE.wait(10))
    return _whole(pol, sch, batch)


def gated() -> rk.sources.Workload:
    """:func:`flat`, whose compile of a boundary side here waits for the other's in a worker."""
    return rk.sources.workload(
        rk.sources.Measured(_gated_whole, lambda p, s, b: float(b)), "h100", rk.TrainConfig(1, 16)
    )


def test_the_boundary_s_two_sides_compile_at_the_same_time_not_one_after_the_other(pool, counted):
    # Side by side means at once: the side sent out starts while the one here still compiles
    # (two slow compiles in the time of one), not once the first turned out not cached.
    OTHER_SIDE.clear()
    OVERLAPPED.clear()
    spread = rk.sources.Spread(gated, executor=pool, slow_seconds=0.0)
    w = dataclasses.replace(gated(), spread=spread)
    got = rk.max_batch(w, "full", limit_bytes=FIXED + PER_SAMPLE * 17 + 50)
    assert (got.batch, got.next_peak_bytes) == (17, FIXED + PER_SAMPLE * 18)
    assert OVERLAPPED == [True]  # one side compiled here, the other already started away
    assert {c[2]: c[3] == MAIN for c in CALLS if c[2] in SIDES} in (
        {17: True, 18: False},
        {17: False, 18: True},
    )
