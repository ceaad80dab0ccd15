"""One door to the boundary searches (``rk.fit``) and the workload at another size
(``Workload.at``): issue 58's "at(batch=, seq=) for the searches; one fit(workload, axis=)".

Fake workloads (a peak from a formula, no compiles) pin the answers against brute-force scans
written here, and count what the searches build and compile: a sequence is built once for
every search over the family, a batch view compiles nothing of its own.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading

import jax
import pytest

import remat_kit as rk
from helpers import memory_report
from remat_kit.errors import BadType, BadValue
from remat_kit_models.spec import PresetSpec

FIXED = 10_000


class Family:
    """Workloads ``seq -> Workload`` whose peak is ``peak_of(seq, batch)``, of Measured steps
    each with a ``resize`` that measures the next (as a model source builds them); counts
    builds and "compiles" (measure calls)."""

    def __init__(self, peak_of, multiple=1):
        self.peak_of = peak_of
        self.multiple = multiple
        self.built: list[int] = []
        self.measured: list[tuple[int, int]] = []

    def __call__(self, seq):
        config = rk.TrainConfig(self.multiple, seq, accum=self.multiple)
        return rk.sources.workload(self.step(seq), rk.target("h100"), config)

    def step(self, seq):
        """The Measured step at ``seq``; its ``resize`` measures the next."""
        self.built.append(seq)

        def measure(policy, schedule, batch):
            self.measured.append((seq, batch))
            peak = int(self.peak_of(seq, batch))
            return memory_report(peak_bytes=peak, policy=policy.spec, flops=float(seq * batch))

        return rk.sources.Measured(measure, lambda p, s, b: float(seq * b), resize=self.step)


def affine(seq, batch):
    return FIXED + 37 * seq * batch


def quadratic(seq, batch):
    return FIXED + 37 * seq * batch + seq * seq * batch // 50


def longest(peak_of, limit, step, batch):
    """Brute force: the longest multiple of ``step`` whose peak fits (monotone curves)."""
    seq = step
    while peak_of(seq + step, batch) <= limit:
        seq += step
    return seq if peak_of(step, batch) <= limit else 0


def largest(peak_of, limit, seq, multiple):
    """Brute force: the largest multiple of ``multiple`` whose peak fits."""
    batch = multiple
    while peak_of(seq, batch + multiple) <= limit:
        batch += multiple
    return batch if peak_of(seq, multiple) <= limit else 0


@pytest.mark.parametrize("curve", [affine, quadratic])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("limit", [FIXED + 2_000_000, FIXED + 7_777_777])
def test_fit_along_seq_is_the_longest_a_scan_finds_at_the_workloads_batch(curve, batch, limit):
    make = Family(curve)
    w = make(64).at(batch=batch)
    found = rk.fit(w, "full", axis="seq", granularity=64, limit_bytes=limit)
    assert (found.axis, found.seq, found.batch) == ("seq", longest(curve, limit, 64, batch), batch)
    assert {b for _, b in make.measured} == {batch}  # every probe at the view's batch
    assert len(make.built) == len(set(make.built))  # each sequence built once


@pytest.mark.parametrize(("multiple", "limit"), [(1, FIXED + 500_000), (4, FIXED + 3_333_333)])
def test_fit_along_batch_is_the_largest_a_scan_finds(multiple, limit):
    w = Family(affine, multiple)(512)
    found = rk.fit(w, "full", limit_bytes=limit)
    assert (found.axis, found.batch) == ("batch", largest(affine, limit, 512, multiple))
    assert found.batch % multiple == 0


def test_a_second_search_over_the_family_builds_no_sequence_again():
    make = Family(quadratic)
    w = make(128)
    first = rk.fit(w, "full", axis="seq", granularity=128, limit_bytes=FIXED + 4_000_000)
    built = list(make.built)
    again = rk.fit(w, "full", axis="seq", granularity=128, limit_bytes=FIXED + 4_000_000)
    assert again.seq == first.seq and again.compiles == 0 and make.built == built
    assert [x.seq for x in w.family] == sorted(set(built))


def test_a_batch_view_shares_the_caches_and_carries_over_to_other_sequences():
    make = Family(affine, multiple=2)
    w = make(256)
    view = w.at(batch=6)
    assert (view.batch, w.batch, view.seq) == (6, 2, 256)
    assert view.report("full") is w.report("full", batch=6)
    assert make.measured == [(256, 6)] and view.compiles == w.compiles == 1
    longer = view.at(seq=512)
    assert (longer.seq, longer.batch) == (512, 6)
    assert w.at(seq=512) is longer.at(batch=2) and w.at(seq=256) is w and w.at() is w
    assert make.built == [256, 512]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch": 3}, BadValue, r"batch=3 does not split into the step's 2 .*multiple of 2"),
        ({"batch": 0}, BadValue, r"batch=0 must be at least 1"),
        ({"seq": 0}, BadValue, r"seq=0 must be at least 1"),
        ({"batch": True}, BadType, r"batch must be an int, got True"),
        ({"seq": 2.5}, BadType, r"seq must be an int, got 2.5"),
    ],
)
def test_at_refuses_bad_sizes_in_one_line(kwargs, error, match):
    with pytest.raises(error, match=match):
        Family(affine, multiple=2)(256).at(**kwargs)


def test_a_measured_step_has_no_other_sequence():
    w = rk.sources.workload(
        rk.sources.Measured(lambda p, s, b: memory_report(), lambda p, s, b: 1.0),
        "h100",
        rk.TrainConfig(1, 16),
    )
    assert w.at(seq=16) is w
    with pytest.raises(BadValue, match=r"seq=32: this workload's figures are for seq=16 only"):
        w.at(seq=32)


@pytest.mark.parametrize("gave", [None, "a step", 3])
def test_a_resize_that_gives_no_measured_step_is_a_type_error_naming_what_it_gave(gave):
    make = Family(affine)
    w = make(64)
    w = dataclasses.replace(w, source=dataclasses.replace(w.source, resize=lambda seq: gave))
    with pytest.raises(BadType, match=rf"resize\(128\) gave {type(gave).__name__}, not a Measured"):
        w.at(seq=128)
    assert [x.seq for x in w.family] == [64]


def test_the_door_builds_the_same_step_at_another_sequence():
    # Traced, not compiled: the FLOPs of the step at 32 tokens, against one built apart.
    src = rk.sources.resolve(PresetSpec("tiny-llama"))
    w = rk.sources.workload(src, "h100", rk.TrainConfig(batch=2, seq=16, optimizer="sgd"))
    longer = w.at(seq=32)
    apart = rk.sources.workload(src, "h100", rk.TrainConfig(batch=2, seq=32, optimizer="sgd"))
    assert (longer.seq, longer.batch, longer.label) == (32, 2, apart.label)
    assert longer.flops("full") == apart.flops("full", batch=2) != w.flops("full")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"axis": "layers"}, BadValue, r"axis='layers': use one of 'batch', 'seq'"),
        ({"granularity": 64}, BadValue, r"granularity=64 with axis='batch'"),
        (
            {"policy": "plan", "schedule": "every:2"},
            BadValue,
            r"schedule='every:2' with policy='plan': the planner picks the schedule",
        ),
    ],
)
def test_fit_refuses_what_its_axis_does_not_take_before_any_compile(kwargs, error, match):
    make = Family(affine)
    with pytest.raises(error, match=match):
        rk.fit(make(64), **kwargs)
    assert make.measured == []


def test_fit_takes_a_workload_only():
    with pytest.raises(BadType, match=r"workload must be an rk.Workload .*got function"):
        rk.fit(lambda seq: None, axis="seq")


@pytest.mark.parametrize(
    ("axis", "searched", "expected"),
    [
        ("batch", "max_batch_plan", {"cap": 1 << 14, "headroom": 0.2, "limit_bytes": None}),
        ("seq", "max_seq_plan", {"cap": 1 << 20, "granularity": 1024, "batch": 3}),
    ],
)
def test_the_planner_is_the_plan_search_of_the_axis_with_its_defaults(
    monkeypatch, axis, searched, expected
):
    seen = {}

    def spy(workload, **kwargs):
        seen.update(kwargs, workload=workload)
        return "the fit", None

    monkeypatch.setattr(f"remat_kit.search._fit.{searched}", spy)
    w = Family(affine)(2048).at(batch=3)
    assert rk.fit(w, "plan", axis=axis, headroom=0.2, hide=0.3) == "the fit"
    assert {k: seen[k] for k in expected} == expected
    assert seen["workload"] is w and seen["hide"] == 0.3 and seen["offload"] is True


# --- fit_each: every policy's largest batch, here or spread over a cluster ---------------------

TRAVEL: list[tuple[str, int]] = []  # (policy, thread) of every "compile" of the spread step


def _travel_step() -> rk.sources.Workload:
    """The spread tests' step (module-level: a worker rebuilds it from a pickled reference)."""

    def measure(policy, schedule, batch):
        TRAVEL.append((policy.spec, threading.get_ident()))
        peak = affine(512, batch) * KEEPS[policy.spec]
        return memory_report(peak_bytes=peak, policy=policy.spec, flops=float(batch))

    measured = rk.sources.Measured(measure, lambda p, s, b: float(b))
    return rk.sources.workload(measured, "h100", rk.TrainConfig(1, 512))


KEEPS = {"none": 3, "full": 1, "minimal": 2}
LIMIT = 40_000_000


def test_fit_each_is_fit_of_each_policy_in_order_with_its_progress():
    seen = []
    got = rk.search.fit_each(
        Family(affine)(512),
        ["full", "none"],
        limit_bytes=FIXED + 400_000,
        started=lambda i: seen.append(("started", i)),
        ended=lambda i, f, here: seen.append(("ended", i, f.policy, here)),
    )
    alone = [rk.fit(Family(affine)(512), p, limit_bytes=FIXED + 400_000) for p in ("full", "none")]
    assert got == [
        dataclasses.replace(a, seconds=g.seconds) for a, g in zip(alone, got, strict=True)
    ]
    assert seen == [
        ("started", 0), ("ended", 0, "full", True), ("started", 1), ("ended", 1, "none", True)
    ]  # fmt: skip


def test_fit_each_hands_the_planner_no_schedule_and_the_others_the_one_given(monkeypatch):
    asked = []

    def spy(workload, policy, schedule, **kwargs):
        asked.append((getattr(policy, "spec", policy), schedule, kwargs["axis"]))
        return policy

    monkeypatch.setattr("remat_kit.search._fit.fit", spy)
    rk.search.fit_each(Family(affine)(512), ["plan", "full"], "every:2")
    assert asked == [("plan", "none", "batch"), ("full", "every:2", "batch")]


_OPTIONS = ("headroom", "limit_bytes", "offload", "hide")


@pytest.mark.parametrize(
    "given", [{}, {"headroom": 0.2, "limit_bytes": 10**6, "offload": False, "hide": 0.5}]
)
def test_fit_each_hands_each_search_fits_defaults_or_what_it_was_given(given, monkeypatch):
    """Not given, each search gets :func:`fit`'s own defaults (the planner may offload, as
    plan() and fit() let it); given, what was given."""
    asked = []

    def spy(workload, policy, schedule, **kwargs):
        asked.append({k: kwargs[k] for k in _OPTIONS})
        return policy

    monkeypatch.setattr("remat_kit.search._fit.fit", spy)
    rk.search.fit_each(Family(affine)(512), ["plan", "full"], **given)
    defaults = inspect.signature(rk.search.fit).parameters
    expected = {k: given.get(k, defaults[k].default) for k in _OPTIONS}
    assert asked == [expected, expected]
    assert expected["offload"] is given.get("offload", True)


@pytest.mark.parametrize("custom", [False, True])
def test_on_a_cluster_the_first_runs_here_and_the_rest_on_its_workers(monkeypatch, pool, custom):
    # Every measure call counts as a compile that missed the cache: after the first search
    # compiled, the others go to the executor (a thread pool here), which rebuilds the step.
    TRAVEL.clear()
    monkeypatch.setattr("remat_kit.cache.compiles", lambda: len(TRAVEL))
    policies = ["full", "none", "minimal"]
    if custom:  # a jax callable cannot travel: every search here
        policies[2] = rk.as_policy(jax.checkpoint_policies.nothing_saveable)
        KEEPS[policies[2].spec] = 2
    spread = rk.sources.Spread(_travel_step, executor=pool)
    w = dataclasses.replace(_travel_step(), spread=spread)
    ended = {}
    got = rk.search.fit_each(
        w, policies, limit_bytes=LIMIT, ended=lambda i, f, here: ended.update({i: here})
    )
    keeps = [KEEPS[rk.as_policy(p).spec] for p in policies]
    expected = [largest(lambda s, b, k=k: affine(s, b) * k, LIMIT, 512, 1) for k in keeps]
    assert [f.batch for f in got] == expected
    main = threading.main_thread().ident
    threads = {p: {t for q, t in TRAVEL if q == p} for p, _ in TRAVEL}
    assert threads["full"] == {main}
    here = [True, True, True] if custom else [True, False, False]
    assert [ended[i] for i in range(3)] == here
    alone = [threads[rk.as_policy(p).spec] == {main} for p in policies]
    assert alone == here


SCHEDULED: list[tuple[str, str, int]] = []  # (policy, schedule, thread) of every "compile"


def _scheduled_step() -> rk.sources.Workload:
    """The spread step over four layers, whose peak depends on the schedule (module-level: a
    worker rebuilds it from a pickled reference)."""

    def measure(policy, schedule, batch):
        SCHEDULED.append((policy.spec, schedule.spec, threading.get_ident()))
        # every:2 rematerializes half the layers: they keep twice what the policy over all does.
        keeps = KEEPS[policy.spec] * (2 if schedule.spec == "every:2" else 1)
        return memory_report(
            peak_bytes=affine(512, batch) * keeps,
            policy=policy.spec,
            schedule=schedule.spec,
            flops=float(batch),
        )

    measured = rk.sources.Measured(measure, lambda p, s, b: float(b), n_layers=4)
    return rk.sources.workload(measured, "h100", rk.TrainConfig(1, 512))


def test_on_a_cluster_the_policies_sent_to_workers_keep_the_schedule_given(monkeypatch, pool):
    # A policy travels to a worker as its spec, a string as "plan" is: only "plan" itself
    # drops the schedule (the planner picks its own), a named policy's search keeps it.
    SCHEDULED.clear()
    monkeypatch.setattr("remat_kit.cache.compiles", lambda: len(SCHEDULED))
    spread = rk.sources.Spread(_scheduled_step, executor=pool)
    w = dataclasses.replace(_scheduled_step(), spread=spread)
    ended = {}
    got = rk.search.fit_each(
        w,
        ["full", "minimal"],
        "every:2",
        limit_bytes=LIMIT,
        ended=lambda i, f, here: ended.update({i: here}),
    )
    assert ended == {0: True, 1: False}  # the first here, the second on a worker
    assert [(f.policy, f.schedule) for f in got] == [("full", "every:2"), ("minimal", "every:2")]
    keeps = [2 * KEEPS[p] for p in ("full", "minimal")]
    expected = [largest(lambda s, b, k=k: affine(s, b) * k, LIMIT, 512, 1) for k in keeps]
    assert [f.batch for f in got] == expected
    assert {s for _, s, _ in SCHEDULED} == {"every:2"}  # no search compiled without it
