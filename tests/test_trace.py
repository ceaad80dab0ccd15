"""``inspect --trace``: the predicted kernel timeline beside live bytes, as a Chrome trace.

The format's fields (trace event format, JSON object form): ``traceEvents``; ``ph`` "X"
complete events with ``ts``/``dur`` in microseconds, "C" counters, "M" metadata naming
processes and threads. The figures are checked against independent ones: the length
against ``step_time`` of the merged kernels of the same program, the counters against the
report's timeline and its categories at the peak.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_kit as rk
from remat_kit.cli import main
from remat_kit.peak import StepTrace, step_trace
from remat_kit.peak._parsers import Allocation, LiveRanges, Value
from remat_kit.peak._series import live_series
from remat_kit.render import trace_events, write_trace
from remat_kit.render._trace import TOTAL as TOTAL_TRACE_COUNTER
from remat_kit.timing import Kernel, Launch, kernels_of, program_timeline, speed_of, step_time

TINY = ["inspect", "--model", "tiny-llama", "--batch", "2", "--seq", "64"]


def _grad_of_layers(scan: bool):
    def f(w, x):
        def body(c, wi):
            return jnp.tanh(c @ wi), None

        if scan:
            y, _ = jax.lax.scan(jax.checkpoint(body), x, w)
        else:
            y = x
            for i in range(w.shape[0]):
                y, _ = jax.checkpoint(body)(y, w[i])
        return y.sum()

    return jax.grad(f)


_W = jax.ShapeDtypeStruct((4, 256, 256), jnp.bfloat16)
_X = jax.ShapeDtypeStruct((64, 256), jnp.bfloat16)


@pytest.fixture(scope="module", params=[True, False], ids=["scanned", "unrolled"])
def layers(request):
    target = rk.target("h100")
    r = rk.inspect(
        _grad_of_layers(request.param),
        _W,
        _X,
        target=target,
        series=True,
        categories={0: "parameter"},
        meta={"scan": request.param},
    )
    return r, target


@pytest.mark.slow
def test_timeline_is_the_step_time_of_the_same_kernels(layers):
    r, target = layers
    speed = speed_of(target)
    merged = kernels_of(r.series.hlo_text)
    tl = program_timeline(r.series.hlo_text, r.series.sequence, speed)
    assert tl.seconds == pytest.approx(step_time(merged, speed).seconds, rel=1e-12)
    # Every launch once: a loop's body once per trip, as kernels_of counts them.
    assert len(tl.launches) == sum(k.count for k in merged)
    got: dict[str, int] = {}
    for launch in tl.launches:
        got[launch.kernel.kind] = got.get(launch.kernel.kind, 0) + 1
    want: dict[str, int] = {}
    for k in merged:
        want[k.kind] = want.get(k.kind, 0) + k.count
    assert got == want
    starts = [launch.start for launch in tl.launches]
    assert starts == sorted(starts) and tl.launches[-1].start < tl.seconds


@pytest.mark.slow
def test_trace_length_is_the_report_s_predicted_step_time(layers):
    r, target = layers
    fn = _grad_of_layers(r.meta["scan"])
    plain = rk.memory_report(fn, _W, _X, target=target, warn=False)
    assert plain.peak_bytes == r.peak_bytes  # the same program
    assert step_trace(r, target).seconds == pytest.approx(plain.step_time.seconds, rel=1e-12)


@pytest.mark.slow
def test_categories_add_up_to_the_timeline_and_are_the_peak_s(layers):
    r, _ = layers
    cats = r.series.by_category
    total = np.sum([np.array(v) for v in cats.values()], axis=0)
    assert total.tolist() == list(r.timeline)
    at_peak = {c: v[r.peak_position] for c, v in cats.items() if v[r.peak_position]}
    want = {c: b for c, b in r.by_category.items() if b and c != "fragmentation"}
    assert at_peak == want


@pytest.mark.slow
def test_step_trace_counts_the_report_s_live_bytes(layers):
    r, target = layers
    t = step_trace(r, target)
    assert max(t.total) == r.live_peak_bytes == r.peak_bytes - r.fragmentation_bytes
    assert sorted(set(t.positions)) == list(range(r.schedule_length))
    assert list(t.times) == sorted(t.times) and t.times[-1] <= t.seconds
    # A scanned layer's positions run once per trip.
    assert len(t.positions) > r.schedule_length or not any("while" in s for s in r.series.sequence)


def test_live_series_gives_shared_addresses_to_the_newer_buffer():
    allocs = {0: Allocation(0, 16, None, frozenset()), 1: Allocation(1, 4, None, frozenset(), 5)}
    vals = [
        Value("a{}", "a", 0, 8, 0, "f32[2]"),
        Value("b{}", "b", 0, 8, 4, "f32[2]"),  # shares [4, 8) with a from position 1
        Value("h{}", "h", 1, 4, 0, "f32[1]"),  # in host memory (color 5)
    ]
    live = LiveRanges(("a", "b", "c"), {"a{}": (0, 1), "b{}": (1, 2), "h{}": (2, 2)}, None)
    cats = {"a{}": "saved activation", "b{}": "gradient", "h{}": "saved activation"}
    s = live_series(vals, allocs, live, cats, {"parameter": 3}, "")
    assert s.by_category == {
        "parameter": (3, 3, 3),
        "saved activation": (8, 4, 0),
        "gradient": (0, 8, 8),
    }
    assert s.host == (0, 0, 4)


def _synthetic() -> StepTrace:
    gemm = Kernel("gemm", 1, 2e9, 1000, name="dot.1")
    redo = Kernel("memory", 1, 0.0, 500, name="fusion.2", recompute=True)
    gather = Kernel(
        "collective", 1, 0.0, 800, name="ag.3", asynchronous=True, group=8, op="all-gather"
    )
    return StepTrace(
        seconds=4e-6,
        launches=(
            Launch(gemm, 0.0, 2e-6, 0),
            Launch(gather, 2e-6, 3e-6, 1, beside=True),
            Launch(redo, 2.5e-6, 0.5e-6, 1),
        ),
        exposed_seconds=1e-6,
        times=(0.0, 2e-6, 2.5e-6),
        positions=(0, 1, 2),
        total=(10, 30, 30),
        by_category={"parameter": (10, 10, 10), "saved activation": (0, 20, 20)},
        host=(0, 0, 0),
        peak_bytes=40,
        live_peak_bytes=30,
    )


# One line of HLO per instruction: the backslash-newline joins the dot's two halves.
_DOT_TANH = """HloModule m

ENTRY %main (a: f32[1024,1024]) -> f32[1024,1024] {
  %a = f32[1024,1024]{1,0} parameter(0)
  %dot = f32[1024,1024]{1,0} dot(f32[1024,1024]{1,0} %a, f32[1024,1024]{1,0} %a), \
lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = f32[1024,1024]{1,0} tanh(f32[1024,1024]{1,0} %dot)
}
"""


@pytest.mark.parametrize("at", [0, 1, 2, 3])
def test_a_schedule_name_the_hlo_lacks_runs_where_it_stands_and_the_rest_runs_on(at):
    # The live-range dump names views of a tuple the HLO text does not hold: each is one
    # position of the timeline, and the kernels around it (a dot, a tanh) still all launch.
    sequence = ["a", "dot", "t"]
    sequence.insert(at, "view.1")
    speed = speed_of(rk.target("h100"))
    t = program_timeline(_DOT_TANH, sequence, speed)
    assert [pos for pos, _ in t.steps] == [0, 1, 2, 3]
    assert [launch.kernel.name for launch in t.launches] == ["dot", "t"]
    expected = step_time(kernels_of(_DOT_TANH), speed).seconds
    assert t.seconds == pytest.approx(expected, rel=1e-12)


# A loop of 5 trips whose body takes a tanh and counts (and whose condition compares).
_LOOP = """HloModule m

%body (p: (s32[], f32[256,256])) -> (s32[], f32[256,256]) {
  %p = (s32[], f32[256,256]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[256,256]{1,0} get-tuple-element(%p), index=1
  %t = f32[256,256]{1,0} tanh(f32[256,256]{1,0} %x)
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %r = (s32[], f32[256,256]{1,0}) tuple(%j, %t)
}

%cond (p: (s32[], f32[256,256])) -> pred[] {
  %p = (s32[], f32[256,256]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (a: f32[256,256]) -> f32[256,256] {
  %a = f32[256,256]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[256,256]{1,0}) tuple(%zero, %a)
  %loop = (s32[], f32[256,256]{1,0}) while(%init), condition=%cond, body=%body, \
backend_config={"known_trip_count":{"n":"5"}}
  ROOT %out = f32[256,256]{1,0} get-tuple-element(%loop), index=1
}
"""


# libtpu's form of the same loop: no known_trip_count, the trips read from its counter (the
# condition's names made the module's own, as a schedule that lists them needs).
_TPU_LOOP = (
    _LOOP.replace(', backend_config={"known_trip_count":{"n":"5"}}', "")
    .replace("%p = (s32[], f32[256,256]{1,0}) parameter(0)\n  %i = s32[] get-tuple-element(%p), "
             "index=0\n  %n", "%cp = (s32[], f32[256,256]{1,0}) parameter(0)\n  %ci = s32[] "
             "get-tuple-element(%cp), index=0\n  %n")
    .replace("compare(%i, %n)", "compare(%ci, %n)")
)  # fmt: skip
_ENTRY = ["a", "zero", "init", "loop", "out"]
# The schedule as a dump lists it: the computations a loop calls just before the loop.
_CALLED = ["a", "zero", "init", "p", "i", "x", "t", "one", "j", "r", "cp", "ci", "n", "lt",
           "loop", "out"]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "sequence"),
    [(_LOOP, _ENTRY), (_TPU_LOOP, _ENTRY), (_TPU_LOOP, _CALLED)],
    ids=["known-trip-count", "counter", "counter-scheduled-body"],
)
def test_a_loop_s_body_and_condition_launch_once_per_trip_on_the_timeline(text, sequence):
    assert (text == _TPU_LOOP) == ("known_trip_count" not in text) and "%ci" in _TPU_LOOP
    speed = speed_of(rk.target("h100"))
    t = program_timeline(text, sequence, speed)
    got: dict[str, int] = {}
    for launch in t.launches:
        got[launch.kernel.name] = got.get(launch.kernel.name, 0) + 1
    assert got == {"t": 5, "j": 5, "lt": 5}
    assert t.seconds == pytest.approx(step_time(kernels_of(text), speed).seconds, rel=1e-12)
    # The step starts at 0, and with no collective nothing waits at its end.
    assert t.steps[0] == (0, 0.0) and t.launches[0].start == 0.0 and t.exposed_seconds == 0.0


# A conditional of two branches: the first a tanh, the second an exp and a log. The
# branch-index form (jax.lax.cond and switch compile to it) and the predicate form.
_SWITCH = """HloModule m

%b0 (p0: (f32[256,256])) -> (f32[256,256]) {
  %p0 = (f32[256,256]{1,0}) parameter(0)
  %x0 = f32[256,256]{1,0} get-tuple-element(%p0), index=0
  %t = f32[256,256]{1,0} tanh(f32[256,256]{1,0} %x0)
  ROOT %r0 = (f32[256,256]{1,0}) tuple(%t)
}

%b1 (p1: (f32[256,256])) -> (f32[256,256]) {
  %p1 = (f32[256,256]{1,0}) parameter(0)
  %x1 = f32[256,256]{1,0} get-tuple-element(%p1), index=0
  %e = f32[256,256]{1,0} exponential(f32[256,256]{1,0} %x1)
  %l = f32[256,256]{1,0} log(f32[256,256]{1,0} %e)
  ROOT %r1 = (f32[256,256]{1,0}) tuple(%l)
}

ENTRY %main (i: s32[], a: f32[256,256]) -> f32[256,256] {
  %i = s32[] parameter(0)
  %a = f32[256,256]{1,0} parameter(1)
  %in = (f32[256,256]{1,0}) tuple(%a)
  %c = (f32[256,256]{1,0}) conditional(%i, %in, %in), branch_computations={%b0, %b1}
  ROOT %out = f32[256,256]{1,0} get-tuple-element(%c), index=0
}
"""
_IF = _SWITCH.replace("%i = s32[] parameter(0)", "%i = pred[] parameter(0)").replace(
    "branch_computations={%b0, %b1}", "true_computation=%b0, false_computation=%b1"
)
_SWITCH_ENTRY = ["i", "a", "in", "c", "out"]
# As a dump lists it: both branches' instructions just before the conditional.
_SWITCH_CALLED = ["i", "a", "in", "p0", "x0", "t", "r0", "p1", "x1", "e", "l", "r1", "c", "out"]


@pytest.mark.parametrize("text", [_SWITCH, _IF], ids=["branch-index", "predicate"])
@pytest.mark.parametrize(
    "sequence", [_SWITCH_ENTRY, _SWITCH_CALLED], ids=["entry", "scheduled-branches"]
)
def test_a_conditional_launches_its_first_branch_once_on_the_timeline(text, sequence):
    # kernels_of prices a conditional as its first branch (which branch runs is not known
    # from the program): the timeline launches that branch's one kernel, the tanh, once and
    # the second branch's exp and log never, however the schedule lists the branches.
    assert ("branch_computations" in text) == (text == _SWITCH)
    speed = speed_of(rk.target("h100"))
    t = program_timeline(text, sequence, speed)
    assert [launch.kernel.name for launch in t.launches] == ["t"]
    assert t.seconds == pytest.approx(step_time(kernels_of(text), speed).seconds, rel=1e-12)


@pytest.mark.parametrize("ends", [("view.1",), ("view.1", "view.2")])
def test_names_the_hlo_lacks_around_a_loop_run_once_and_the_loop_its_trips(ends):
    # A schedule that opens with a view of a tuple (a name the HLO lacks) right before the
    # loop, and may end with another: each view is one position, once; the loop's body
    # (not listed) launches once per trip.
    sequence = [ends[0], "loop", "out", *ends[1:]]
    speed = speed_of(rk.target("h100"))
    t = program_timeline(_LOOP, sequence, speed)
    assert [pos for pos, _ in t.steps] == list(range(len(sequence)))
    got: dict[str, int] = {}
    for launch in t.launches:
        got[launch.kernel.name] = got.get(launch.kernel.name, 0) + 1
    assert got == {"t": 5, "j": 5, "lt": 5}


# Async collectives as XLA schedules them (tests/test_timing.py's _WINDOWS_HLO): a start,
# a fusion before its done and one after; one wrapped in async-start/async-done; two in
# flight at once.
_ASYNC = """HloModule w

%fused_neg (param_0: f32[4096]) -> f32[4096] {
  %param_0 = f32[4096]{0} parameter(0)
  ROOT %n = f32[4096]{0} negate(%param_0)
}

%wrapped (p: f32[512]) -> f32[4096] {
  %p = f32[512]{0} parameter(0)
  ROOT %ag = f32[4096]{0} all-gather(%p), replica_groups=[1,8]<=[8], dimensions={0}
}

ENTRY %main (x: f32[4096], y: f32[512]) -> f32[4096] {
  %x = f32[4096]{0} parameter(0)
  %y = f32[512]{0} parameter(1)
  %ags = (f32[512]{0}, f32[4096]{0}) all-gather-start(%y), replica_groups=[1,8]<=[8], dimensions={0}
  %f1 = f32[4096]{0} fusion(%x), kind=kLoop, calls=%fused_neg
  %agd = f32[4096]{0} all-gather-done(%ags)
  %f2 = f32[4096]{0} fusion(%f1), kind=kLoop, calls=%fused_neg
  %as = ((f32[512]{0}), f32[4096]{0}, s32[]) async-start(%y), calls=%wrapped
  %f3 = f32[4096]{0} fusion(%f2), kind=kLoop, calls=%fused_neg
  %ad = f32[4096]{0} async-done(%as)
  %s1 = (f32[512]{0}, f32[4096]{0}) all-gather-start(%y), replica_groups=[1,8]<=[8], dimensions={0}
  %s2 = (f32[512]{0}, f32[4096]{0}) all-gather-start(%y), replica_groups=[1,8]<=[8], dimensions={0}
  %f5 = f32[4096]{0} fusion(%f3), kind=kLoop, calls=%fused_neg
  %d1 = f32[4096]{0} all-gather-done(%s1)
  %d2 = f32[4096]{0} all-gather-done(%s2)
  ROOT %f7 = f32[4096]{0} fusion(%f5), kind=kLoop, calls=%fused_neg
}
"""
_ASYNC_ENTRY = ["x", "y", "ags", "f1", "agd", "f2", "as", "f3", "ad", "s1", "s2", "f5", "d1",
                "d2", "f7"]  # fmt: skip


def test_async_collectives_run_beside_the_stream_and_the_launches_end_at_the_step_time():
    # The module docstring and Launch's: each launch is one kernel (count 1), every launch
    # of kernels_of's kernels once; an async collective started by all-gather-start runs
    # beside the stream, which moves on by its launch cost alone, every other launch by its
    # own time; the step waits at its end for what is exposed, ending at step_time's
    # seconds (the compute's loss to contention included: there is some here).
    speed = speed_of(rk.target("h100"))
    t = program_timeline(_ASYNC, _ASYNC_ENTRY, speed)
    kernels = kernels_of(_ASYNC)
    whole = step_time(kernels, speed)
    assert whole.collective_hidden_seconds > 0 and whole.contention_seconds > 0
    assert t.seconds == pytest.approx(whole.seconds, rel=1e-12)
    assert all(launch.kernel.count == 1 for launch in t.launches)
    assert len(t.launches) == sum(k.count for k in kernels) == 9
    beside = {launch.kernel.name for launch in t.launches if launch.beside}
    assert {"ags", "s1", "s2"} <= beside
    for launch, after in zip(t.launches, t.launches[1:], strict=False):
        moved = speed.kernel_seconds if launch.beside else launch.seconds
        assert after.start == pytest.approx(launch.start + moved, rel=1e-12)
    last = t.launches[-1]
    assert t.seconds == pytest.approx(last.start + last.seconds + t.exposed_seconds, rel=1e-12)


def test_a_collective_in_an_async_start_wrapper_runs_beside_the_stream_too():
    # kernels_of reads the all-gather in %wrapped as asynchronous (tests/test_timing.py:
    # test_each_kernel_carries_the_collective_in_flight_where_xla_scheduled_it); the
    # timeline must too: beside the stream, the wait at the end step_time's exposed time
    # and contention, never negative. Without s1 and s2 all three are hidden.
    text = "\n".join(line for line in _ASYNC.splitlines() if not {"%s2", "%d2"} & set(line.split()))
    sequence = [n for n in _ASYNC_ENTRY if n not in ("s2", "d2")]
    speed = speed_of(rk.target("h100"))
    t = program_timeline(text, sequence, speed)
    whole = step_time(kernels_of(text), speed)
    assert [launch.beside for launch in t.launches if launch.kernel.name == "ag"] == [True]
    assert t.exposed_seconds >= 0
    assert t.exposed_seconds == pytest.approx(
        whole.collective_seconds + whole.contention_seconds, rel=1e-12
    )


def test_a_loop_whose_body_gathers_launches_the_gather_beside_and_the_rest_each_trip():
    # A loop body (not listed in the schedule) that starts an all-gather before its tanh: each
    # of the 5 trips launches the gather beside the stream and then the body's other kernels,
    # not the first gather alone; the launches end at step_time's seconds.
    gather = (
        "  %ags = (f32[256,256]{1,0}, f32[2048,256]{1,0}) all-gather-start(%x), "
        "replica_groups=[1,8]<=[8], dimensions={0}\n"
        "  %agd = f32[2048,256]{1,0} all-gather-done(%ags)\n"
    )
    text = _LOOP.replace("  %t = f32[256,256]{1,0} tanh", gather + "  %t = f32[256,256]{1,0} tanh")
    assert text.count("all-gather-start") == 1
    speed = speed_of(rk.target("h100"))
    t = program_timeline(text, _ENTRY, speed)
    got: dict[tuple[str, bool], int] = {}
    for launch in t.launches:
        key = (launch.kernel.name, launch.beside)
        got[key] = got.get(key, 0) + 1
    assert got == {("ags", True): 5, ("t", False): 5, ("j", False): 5, ("lt", False): 5}
    assert t.seconds == pytest.approx(step_time(kernels_of(text), speed).seconds, rel=1e-12)


def test_trace_events_follow_the_format():
    doc = trace_events([_synthetic(), _synthetic()], ["full", "none"])
    events = doc["traceEvents"]
    assert {e["ph"] for e in events} == {"M", "X", "C"}
    for e in events:
        assert isinstance(e["name"], str) and isinstance(e["pid"], int)
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0 and isinstance(e["tid"], int)
        if e["ph"] == "C":
            assert all(isinstance(v, int) for v in e["args"].values())
    names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "process_name"}
    assert names == {(1, "full"), (2, "none")}
    x = [e for e in events if e["ph"] == "X" and e["pid"] == 1]
    assert [e["ts"] for e in x] == pytest.approx([0.0, 2.0, 2.5, 3.0])  # microseconds
    assert max(e["ts"] + e["dur"] for e in x) == pytest.approx(4.0)
    redo = next(e for e in x if e["name"].startswith("fusion.2"))
    assert "recompute" in redo["cat"] and redo["args"]["recompute"] is True
    beside = next(e for e in x if e["name"] == "ag.3")
    assert beside["tid"] != redo["tid"]
    assert beside["dur"] == pytest.approx(2.0) and beside["args"]["priced_us"] == pytest.approx(3.0)
    total = [e for e in events if e["name"] == TOTAL_TRACE_COUNTER and e["pid"] == 1]
    # One sample where the bytes change, and the last again at the step's end.
    assert [(e["ts"], e["args"]["bytes"]) for e in total] == [(0.0, 10), (2.0, 30), (4.0, 30)]


def test_write_trace_writes_compact_json(tmp_path):
    doc = trace_events([_synthetic()], ["full"])
    path = write_trace(tmp_path / "t.json", doc, flag="--trace")
    assert json.loads(path.read_text()) == json.loads(json.dumps(doc))
    assert "\n" not in path.read_text()


@pytest.fixture(scope="module")
def tiny_diff(tmp_path_factory):
    d = tmp_path_factory.mktemp("trace")
    code = main(
        [*TINY, "--diff", "full", "none", "--trace", str(d / "t.json"), "--json", str(d / "r.json")]
    )
    assert code == 0
    return json.loads((d / "t.json").read_text()), json.loads((d / "r.json").read_text())


@pytest.mark.slow
def test_cli_trace_peak_and_length_are_the_report_s(tiny_diff):
    doc, report = tiny_diff
    events = doc["traceEvents"]
    for pid, (r, step) in enumerate(
        zip(report["reports"], doc["otherData"]["steps"], strict=True), 1
    ):
        total = [
            e["args"]["bytes"]
            for e in events
            if e["pid"] == pid and e["name"] == TOTAL_TRACE_COUNTER
        ]
        assert max(total) == r["live_peak_bytes"] == r["peak_bytes"] - r["fragmentation_bytes"]
        assert step["peak_bytes"] == r["peak_bytes"]
        mine = [e for e in events if e["pid"] == pid and e["ph"] in "XC"]
        extent = max(e["ts"] + e.get("dur", 0) for e in mine) - min(e["ts"] for e in mine)
        assert extent == pytest.approx(step["predicted_step_seconds"] * 1e6, rel=1e-9)
        stream = [e for e in mine if e["ph"] == "X" and e["tid"] == 1]
        assert sum(e["dur"] for e in stream) == pytest.approx(extent, rel=1e-9)
    # full recomputes and none does not: the trace marks it.
    recomputed = [{e["pid"] for e in events if e["ph"] == "X" and "recompute" in e["cat"]}]
    assert recomputed == [{1}]


@pytest.mark.parametrize(
    "path, message",
    [
        ("{d}", "--trace '{d}' must end in .json"),
        ("{d}/t.trace", "--trace '{d}/t.trace' must end in .json"),
        ("{d}/dir.json", "--trace '{d}/dir.json' is a directory, not a regular file"),
        (
            "{d}/missing/t.json",
            "--trace '{d}/missing/t.json': directory '{d}/missing' does not exist",
        ),
        ("{d}/file/t.json", "--trace '{d}/file/t.json': Not a directory"),
        ("/proc/t.json", "--trace '/proc/t.json': cannot create a file in '/proc'"),
    ],
)
def test_bad_trace_paths_are_one_line_before_any_compile(
    path, message, tmp_path, capsys, no_compile
):
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "file").write_text("")
    code = main([*TINY, "--trace", path.format(d=tmp_path)])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith(f"remat-kit: {message.format(d=tmp_path)}") and err.count("\n") == 1, err
    assert "Traceback" not in out + err


def test_trace_for_a_target_without_a_step_time_model_is_refused(tmp_path, capsys, no_compile):
    code = main([*TINY, "--target", "cpu", "--trace", str(tmp_path / "t.json")])
    assert code == 2
    assert "remat-kit: --trace needs a step-time model" in capsys.readouterr().err


@pytest.mark.slow
def test_offloaded_residuals_are_a_host_counter_and_their_copies_slices(tmp_path):
    trace, report = tmp_path / "t.json", tmp_path / "r.json"
    args = ["--policy", "minimal_offloaded", "--trace", str(trace), "--json", str(report)]
    assert main([*TINY, *args]) == 0
    events, r = json.loads(trace.read_text())["traceEvents"], json.loads(report.read_text())
    host = [e["args"]["bytes"] for e in events if e["name"] == "live host bytes"]
    assert r["host_temp_bytes"] > 0 and max(host) == r["host_temp_bytes"]
    assert any(e["ph"] == "X" and e["cat"] == "host_transfer" for e in events)
    device = [e["args"]["bytes"] for e in events if e["name"] == TOTAL_TRACE_COUNTER]
    assert max(device) == r["live_peak_bytes"]  # host bytes are not device memory
