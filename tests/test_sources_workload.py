"""The Workload (remat_kit.sources._workload) against what its docstrings promise, on steps
made by hand: nothing is traced or compiled.

Seeded random sequences of calls (compiles, verifications, whole-step compiles, batches
compiled side by side by stand-in workers) are checked against invariants of the contract:
every program made is counted once, none is made twice, a verified report is final for its
limit, a whole one is never read off shallow copies. The costs (``overhead_of`` and the host
transfers behind it) are checked against their formulas over random figures, and ``at``'s
views and family against what each call must give back.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import random

import pytest

import remat_kit as rk
import remat_kit._workers
from helpers import changed, memory_report
from remat_kit.errors import BadType, BadValue
from remat_kit.flops import FlopCount
from remat_kit.policies import as_policy
from remat_kit.schedules import NO_SCHEDULE, parse_schedule
from remat_kit.sources import Measured, Workload, _steps
from remat_kit.sources._spread import Spread
from remat_kit.timing import StepTime, speed_of, traced_seconds

H100 = rk.target("h100")
CUSTOM = as_policy(lambda prim, *a, **k: False)  # a jax callable: it cannot travel to a worker
POLICIES = (as_policy("none"), as_policy("full"), as_policy("dots_no_batch"), CUSTOM)
SCHEDULES = (NO_SCHEDULE, parse_schedule("every:2"))


def _mode(report) -> str:
    return (report.meta.depth or {}).get("mode", "")


class _Step:
    """A hand-made step that records every program it makes.

    Even batches are read off shallow copies (``extrapolated``), odd ones compiled whole.
    Its ``verify`` keeps a report that is final for the limit (compiled whole, or a quarter
    of the limit at most: a clear fit) and otherwise compiles the whole step.
    """

    def __init__(self, where: str = "here"):
        self.where = where
        self.programs: list[tuple[str, str, object, int]] = []
        self.workload: Workload | None = None
        self.seen_compiling: list[object] = []

    def _made(self, kind: str, pol, sch, batch: int, mode: str):
        if self.workload is not None:
            self.seen_compiling.append((self.workload.compiling, (pol.spec, sch.spec, batch)))
        self.programs.append((kind, pol.spec, sch, batch))
        return memory_report(
            policy=pol.spec,
            schedule=sch.spec,
            peak_bytes=1000 * batch + len(self.programs),
            flops=float("nan"),
            meta={"depth": {"mode": mode}, "made": (self.where, len(self.programs))},
        )

    def measure(self, pol, sch, batch):
        return self._made("copies", pol, sch, batch, "extrapolated" if batch % 2 == 0 else "full")

    def verify(self, pol, sch, batch, report, limit):
        if report is not None and (
            _mode(report) != "extrapolated"
            or (limit is not None and report.peak_bytes * 4 <= limit)
        ):
            return report
        return self._made("whole", pol, sch, batch, "verified")

    def make(self, verify: bool = True) -> Workload:
        """The Workload of this step (with or without a ``verify_fn``)."""
        w = rk.sources.workload(
            Measured(self.measure, lambda p, s, b: 1.0, verify_fn=self.verify if verify else None),
            H100,
            rk.TrainConfig(1, 8),
        )
        self.workload = w
        return w


def _worker_workload(step: _Step) -> Workload:
    """What a worker builds: the same step, its programs recorded apart."""
    return step.make()


@pytest.mark.parametrize("seed", range(8))
def test_random_calls_make_each_program_once_and_count_every_one(monkeypatch, seed):
    rng = random.Random(seed)
    verify = seed % 4 != 3  # now and then a workload whose every report is final
    here, worker = _Step(), _Step("worker")
    sent: list[list[tuple[str, str, int]]] = []

    def run(fn, items, jobs, *, executor=None, here=None, at_once=False, on_done=None):
        # As remat_kit._workers.run: the first item here, the others in a worker.
        items = list(items)
        sent.append(items[1:])
        return [here(items[0]), *(fn(item) for item in items[1:])]

    monkeypatch.setattr(remat_kit._workers, "run", run)
    w = here.make(verify)
    spread = Spread(functools.partial(_worker_workload, worker), jobs=2)
    if seed % 2:
        object.__setattr__(w, "spread", spread)
    keys = [(p, s, b) for p in POLICIES for s in SCHEDULES for b in (1, 2, 3, 4)]
    held: dict[tuple, object] = {}  # key -> the report last given for it

    def final(report) -> bool:
        return not verify or _mode(report) != "extrapolated"

    for _ in range(30):
        op = rng.choice(["compiled", "verified", "whole", "has", "compile_all"])
        key = rng.choice(keys)
        if op == "compiled":
            got = w.compiled(*key)
            assert key not in held or got is held[key]
            held[key] = got
        elif op == "verified":
            limit = rng.choice([None, 1000, 10**6])
            got = w.verified(*key, limit)
            # Final for the limit: compiled whole, or a clear fit under it.
            assert (
                not verify
                or _mode(got) != "extrapolated"
                or (limit is not None and got.peak_bytes * 4 <= limit)
            )
            held[key] = got
        elif op == "whole":
            got = w.whole(*key)
            assert final(got)
            held[key] = got
        elif op == "has":
            assert w.has(*key) is (key in held)
            assert w.has(*key, whole=True) is (key in held and final(held[key]))
        else:
            whole = rng.random() < 0.5
            chosen = rng.sample(keys, rng.randrange(1, 5))
            missing = [k for k in chosen if k not in held or (whole and not final(held[k]))]
            before = len(sent)
            got = w.compile_all(chosen, whole=whole, at_once=rng.random() < 0.5)
            assert len(got) == len(chosen)
            for k, r in zip(chosen, got, strict=True):
                assert not whole or final(r)
                assert k not in held or r is held[k] or not final(held[k])
                held[k] = r
            out = seed % 2 and len(missing) >= 2 and all(k[0] is not CUSTOM for k in missing)
            if out:
                items = [(k[0].spec, k[1].spec, k[2]) for k in missing]
                assert sent[before:] == [items[1:]]
            else:
                assert len(sent) == before
        # Every program is counted once, wherever it was made, and none is made twice.
        made = here.programs + worker.programs
        assert w.compiles == len(made)
        assert len(set(made)) == len(made)
        assert w.compiling is None
    # While it compiles, the workload names what it compiles.
    assert all(now == wanted for now, wanted in here.seen_compiling)
    assert here.programs  # the sequence compiled something


def test_a_custom_policy_is_told_apart_by_its_function_and_compiled_here():
    step = _Step()
    w = step.make()
    a, b = as_policy(lambda *x, **k: True), as_policy(lambda *x, **k: True)
    ra, rb = w.compiled(a, NO_SCHEDULE, 1), w.compiled(b, NO_SCHEDULE, 1)
    assert ra is not rb and w.compiled(a, NO_SCHEDULE, 1) is ra and w.compiles == 2


# --- the public fields ---------------------------------------------------------------------

PUBLIC = [
    *("source", "target", "config", "strict", "depth", "label", "spread", "residual_ways"),
]


def test_a_workload_is_made_and_shown_by_its_public_fields_only():
    # (source, target, config) and how to read it; its caches are its own: no one hands them
    # in, and its repr does not list them.
    assert list(inspect.signature(Workload).parameters) == PUBLIC
    w = _Step().make()
    w.compiled(as_policy("full"), NO_SCHEDULE, 1)
    shown = repr(w)
    assert shown.startswith("Workload(source=Measured(") and "residual_ways=1)" in shown
    for private in ("_answers", "_named", "_cache", "_family"):
        assert f", {private}=" not in shown
    # A workload made by hand without sizes: one layer, batch 1, its config's sequence.
    m = Measured(lambda *a: None, lambda *a: 1.0)
    assert (m.n_layers, m.schedule_kinds, m.label, m.verify_fn) == (1, None, "", None)
    assert m.remat_always is False
    bare = Workload(m, H100, rk.TrainConfig(1, 3))
    assert (bare.seq, bare.n_layers, bare.batch_multiple, bare.batch) == (3, 1, 1, 1)
    assert (bare.remat_always, bare.spread, bare.label) == (False, None, "")
    assert (bare.plannable, bare.shapes_known, bare.estimates) == (False, False, False)
    assert (bare.strict, bare.depth, bare.residual_ways) == (False, "auto", 1)
    # What the Measured step says, the workload says.
    said = Measured(
        lambda *a: None,
        lambda *a: 1.0,
        residuals_fn=lambda *a: None,
        breakdown_fn=lambda b: {},
        verify_fn=lambda *a: None,
        n_layers=4,
        schedule_kinds=frozenset({"none"}),
        label="mine",
        remat_always=True,
    )
    w = Workload(said, H100, rk.TrainConfig(6, 3, accum=3))
    assert (w.n_layers, w.batch_multiple, w.schedule_kinds, w.label) == (
        4,
        3,
        frozenset({"none"}),
        "mine",
    )
    assert (w.remat_always, w.plannable, w.shapes_known, w.estimates) == (True,) * 4


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"residual_ways": 0}, BadValue, "residual_ways=0 must be a positive int"),
        ({"residual_ways": True}, BadValue, "residual_ways=True must be a positive int"),
        ({"depth": "deep"}, BadValue, "deep"),
        ({"target": "h100"}, BadType, "a Workload takes a Target and a TrainConfig, got str"),
        ({"config": (1, 3)}, BadType, "got Target and tuple: make it with rk.sources.workload"),
    ],
)
def test_a_workload_made_by_hand_refuses_what_the_door_would(changes, error, match):
    fields = {"source": Measured(lambda *a: None, lambda *a: 1.0), "target": H100}
    with pytest.raises(error, match=match):
        Workload(**{**fields, "config": rk.TrainConfig(1, 3), **changes})


# --- costs ---------------------------------------------------------------------------------


def _step_time(seconds: float) -> StepTime:
    return StepTime(seconds, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, "x", 1.0)


@pytest.mark.parametrize("seed", range(4))
def test_the_overhead_of_a_report_is_its_recompute_and_the_transfer_compute_cannot_hide(seed):
    rng = random.Random(seed)
    for _ in range(40):
        bw = rng.choice([None, 0.0, rng.uniform(1e9, 1e11)])
        peak = rng.choice([None, 0.0, rng.uniform(1e12, 1e15)])
        t = dataclasses.replace(H100, host_link_bandwidth=bw, peak_bf16_flops=peak)
        batch = rng.randrange(1, 5)
        base = rng.uniform(1e9, 1e13)  # the step's FLOPs without remat
        ratio = rng.uniform(1.0, 1.6)
        # FLOPs by (policy, schedule): every:2 recomputes less than full on every layer.
        traced = {("none", "none"): base, ("full", "none"): base * ratio}
        traced[("full", "every:2")] = base * (1 + (ratio - 1) / 2)
        traced[("none", "every:2")] = base
        w = rk.sources.workload(
            Measured(
                lambda p, s, b: memory_report(policy=p.spec),
                functools.partial(lambda traced, p, s, b: traced[(p.spec, s.spec)] * b, traced),
            ),
            t,
            rk.TrainConfig(1, 8),
        )
        host = rng.choice([0, rng.randrange(1, 10**10)])
        temp = rng.choice([0, rng.randrange(1, 10**10)])
        counted = rng.choice([float("nan"), float("inf"), base * batch * rng.uniform(1, 2)])
        # A report that names no policy is of the step without remat.
        policy, schedule = rng.choice(["full", None]), rng.choice(["none", "every:2"])
        report = memory_report(
            policy=policy, schedule=schedule, flops=counted, host_bytes=host, host_temp_bytes=temp
        )
        given = rng.choice([None, rng.uniform(0.0, 1.5)])
        hide = 0.5 if given is None else given  # half the step hides transfers by default
        flops = counted if math.isfinite(counted) else traced[(policy or "none", schedule)] * batch
        moved = temp or host
        compute = base * batch / peak if peak else None
        exposed = 0.0
        if moved:
            exposed = (
                math.inf
                if not bw or compute is None
                else max(0.0, 2 * moved / bw - hide * compute) / compute
            )
        want = flops / (base * batch) - 1 + exposed
        if given is None:
            got = w.overhead_of(report, batch, objective="flops")
        else:
            got = w.overhead_of(report, batch, given, objective="flops")
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
        assert w.transfer_seconds(moved) == (
            0.0 if not moved else (None if not bw else pytest.approx(2 * moved / bw))
        )
        assert w.step_seconds(batch, "flops") == (None if not peak else pytest.approx(compute))
        speed = speed_of(t)
        timed = None
        if speed is not None:
            timed = traced_seconds(FlopCount(base * batch, base * batch, 0.0, 0.0), speed)
        want = timed if timed is not None else compute
        got = w.step_seconds(batch, "time")
        assert got is None if want is None else got == pytest.approx(want)
        assert w.recompute_overhead("full", batch=batch) == pytest.approx(ratio - 1)


@pytest.mark.parametrize(("reference", "seconds"), [(2.0, 3.0), (4.0, 1.0), (None, 3.0)])
def test_the_time_overhead_is_the_predicted_step_over_the_compiled_none_s(reference, seconds):
    none = memory_report(
        policy="none",
        flops=100.0,
        step_time=None if reference is None else _step_time(reference),
    )
    w = rk.sources.workload(
        Measured(lambda p, s, b: none, lambda p, s, b: 100.0 * (1.5 if p.spec == "full" else 1)),
        H100,
        rk.TrainConfig(1, 8),
    )
    report = memory_report(policy="full", flops=150.0, step_time=_step_time(seconds))
    # Without a reference time the FLOPs answer: 150 over 100.
    want = 0.5 if reference is None else seconds / reference - 1
    assert w.overhead_of(report, 1, objective="time") == pytest.approx(want)
    assert w.reference_seconds(1) == reference
    # The FLOPs objective never reads the predicted time.
    assert w.overhead_of(report, 1, objective="flops") == pytest.approx(0.5)


# --- traces, breakdowns and schedules ------------------------------------------------------


def test_traces_and_breakdowns_are_asked_once_and_answer_what_the_callbacks_said():
    calls = []

    def flops_fn(p, s, b):
        calls.append(("flops", p.spec, b))
        return FlopCount(10.0 * b, 6.0 * b, 3.0 * b, 1.0 * b) if p.spec == "full" else 8.0 * b

    def residuals_fn(p, s, b):
        calls.append(("residuals", p.spec, b))
        return ("kept", p.spec, b)

    def breakdown_fn(b):
        calls.append(("breakdown", b))
        return {"weights": 4, "gradients": 4.0, "optimizer": 8, "activations": 99, "batch": b}

    w = rk.sources.workload(
        Measured(
            lambda p, s, b: memory_report(policy=p.spec),
            flops_fn,
            residuals_fn=residuals_fn,
            breakdown_fn=breakdown_fn,
            schedule_kinds=frozenset({"none", "every"}),
        ),
        H100,
        rk.TrainConfig(3, 8),
    )
    full, none = as_policy("full"), as_policy("none")
    for _ in range(2):
        assert w.traced_count(full, NO_SCHEDULE, 2) == FlopCount(20.0, 12.0, 6.0, 2.0)
        assert w.traced_count(none, NO_SCHEDULE, 2) == FlopCount(16.0, 16.0, 0.0, 0.0)
        assert w.flops("full") == 30.0  # the workload's own batch, 3
        assert w.baseline(2) == 16.0
        assert w.residuals("full", batch=2) == ("kept", "full", 2)
        parts = w.breakdown(2)
        assert parts == {"weights": 4, "gradients": 4, "optimizer": 8, "batch": 2}
        assert all(type(v) is int for v in parts.values())
        parts["weights"] = 10**9  # the caller's copy: the workload's is kept
        assert w.fixed_bytes(2) == 4 + 4 + 8 + 2
    assert sorted(calls, key=str) == sorted(
        [
            ("flops", "full", 2),
            ("flops", "none", 2),
            ("flops", "full", 3),
            ("residuals", "full", 2),
            ("breakdown", 2),
        ],
        key=str,
    )
    flops, residuals = w.trace_caches()
    other = rk.sources.workload(
        Measured(
            lambda *a: None,
            lambda *a: pytest.fail("traced again"),
            residuals_fn=lambda *a: pytest.fail("traced again"),
        ),
        H100,
        rk.TrainConfig(1, 8),
    )
    other.trace_caches()[0][(full.spec, NO_SCHEDULE, 2)] = FlopCount(1.0, 1.0, 0.0, 0.0)
    other.adopt_traces(flops, residuals)
    # What it traced itself is kept; the rest is taken.
    assert other.traced_count(full, NO_SCHEDULE, 2).total == 1.0
    assert other.traced_count(none, NO_SCHEDULE, 2).total == 16.0
    assert other.traced_residuals(full, NO_SCHEDULE, 2) == ("kept", "full", 2)
    with pytest.raises(BadValue, match=r"has no residuals \(a Measured step without residuals_fn"):
        changed(other, residuals_fn=None).residuals("full")
    # A Schedule, a spec or a bare kind.
    for spec, ok in [("none", True), ("every:2", True), ("every", True), ("layers", False)]:
        assert w.supports(spec) is ok and other.supports(spec)
    for spec, ok in [("every:2", True), ("sqrt", False), ("none", True)]:
        assert w.supports(parse_schedule(spec)) is ok


def test_a_breakdown_without_its_function_is_the_full_policy_s_compile():
    seen = []

    def measure(p, s, b):
        seen.append((p.spec, s.spec, b))
        return memory_report(policy=p.spec, breakdown={"weights": 7, "activations": 5})

    w = rk.sources.workload(Measured(measure, lambda *a: 1.0), H100, rk.TrainConfig(1, 8))
    assert w.breakdown(4) == {"weights": 7} and w.fixed_bytes(4) == 7
    assert seen == [("full", "none", 4)]


# --- at: views and the family by sequence --------------------------------------------------


class _Sized(rk.sources.StepSource):
    """A source that records each sequence a workload is made at (its ``check``); its steps
    are never built: ``_sized_steps`` stands in for ``_steps.measure``."""

    spec = "sized"
    schedule_kinds = frozenset({"none"})

    def __init__(self):
        self.built: list[int] = []

    def check(self, config, target):
        self.built.append(config.seq)

    def label(self, config, target):
        return f"sized s{config.seq}"

    def sequences_per_step(self, config, target):
        return 3 * config.batch  # its own accumulation trains three times the batch


@pytest.fixture
def sized(monkeypatch):
    """Makes a Workload of a :class:`_Sized` source at (seq, multiple): the batch is a
    multiple of its accumulation steps; each report names the seq and batch it was made at."""

    def measure(src, pol, t, config, **kw):
        return memory_report(policy=pol.spec, meta={"seq": config.seq, "batch": config.batch})

    monkeypatch.setattr(_steps, "measure", measure)

    def make(seq: int, multiple: int) -> Workload:
        config = rk.TrainConfig(batch=multiple, seq=seq, accum=multiple)
        return rk.sources.workload(_Sized(), H100, config)

    return make


@pytest.mark.parametrize("seed", range(3))
def test_at_gives_views_that_share_caches_and_builds_each_sequence_once(seed, sized):
    rng = random.Random(seed)
    multiple = rng.choice([1, 2, 4])
    w = sized(16, multiple)
    full = as_policy("full")
    current = w
    for _ in range(40):
        batch = rng.choice([None, *(multiple * k for k in (1, 2, 3))])
        seq = rng.choice([None, 16, 32, 64])
        got = current.at(batch=batch, seq=seq)
        want_seq = current.seq if seq is None else seq
        want_batch = current.batch if batch is None else batch
        assert (got.seq, got.batch) == (want_seq, want_batch)
        if batch is None and seq is None:
            assert got is current
        # The family's own at a sequence holds its first batch; views share its caches.
        base = w._family[want_seq]
        assert (got is base) is (want_batch == base.batch)
        r = got.report(full)
        assert r is base.report(full, batch=want_batch) and r.meta["seq"] == want_seq
        assert got.tokens(5 * multiple) == 15 * multiple * want_seq
        # A search's scratch space is the workload's: its views share it.
        got.memo.setdefault("probes", []).append(want_batch)
        assert base.memo["probes"][-1] == want_batch
        current = got
    built = w.source.built
    assert built[0] == 16 and sorted(built) == sorted(set(built))
    assert [x.seq for x in w.family] == sorted(built)
    assert all(x.label == f"sized s{x.seq}" for x in w.family)
    assert all(x.family == w.family for x in w.family)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch": 0}, BadValue, "batch=0 must be at least 1"),
        ({"batch": True}, BadType, "batch must be an int, got True"),
        ({"seq": 2.0}, BadType, "seq must be an int, got 2.0"),
        ({"seq": -1}, BadValue, "seq=-1 must be at least 1"),
        ({"batch": 6}, BadValue, r"batch=6 does not split into the step's 4 .* multiple of 4"),
    ],
)
def test_at_refuses_sizes_that_are_not_whole_multiples(kwargs, error, match, sized):
    w = sized(16, 4)
    with pytest.raises(error, match=match):
        w.at(**kwargs)
    if "batch" in kwargs and "split" not in match:
        # A report's batch is checked at the same edge (not against the multiple).
        with pytest.raises(error, match=match):
            w.report("full", batch=kwargs["batch"])


def test_a_measured_step_is_for_its_own_sequence_and_a_named_one_keeps_its_name(sized):
    w = rk.sources.workload(Measured(lambda *a: None, lambda *a: 1.0), H100, rk.TrainConfig(2, 16))
    assert w.at(seq=16) is w and w.tokens(2) == 32
    with pytest.raises(BadValue, match="seq=32: this workload's figures are for seq=16 only"):
        w.at(seq=32)
    # A label given at the door is the family's; the source's own is each sequence's.
    named = rk.sources.workload(_Sized(), H100, rk.TrainConfig(1, 16), label="mine")
    assert (named.at(seq=32).label, sized(16, 1).at(seq=32).label) == ("mine", "sized s32")
