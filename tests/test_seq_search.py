"""The longest sequence at a fixed batch (``rk.search.max_seq``).

Two kinds of tests, as for the batch search. Fake builders (peak from a formula, no compiles)
pin the search exactly: the boundary against a brute-force scan, the compiles on the curves
the search expects (a line, a quadratic) and on curves it does not (bisection still exact), the
sequences XLA or the model refuses, the cap, and the checks made before any compile. Tiny
presets compiled for an H100 check the answer on real programs, each against compiles made
apart from the search: one with einsum attention (its scores grow as seq^2) and one with
cuDNN flash attention (close to affine).
"""

from __future__ import annotations

import functools
import math
import time

import pytest
from jax.errors import JaxRuntimeError

import remat_kit as rk
from helpers import memory_report, size_words
from remat_kit.errors import BadType, BadValue
from remat_kit.search._boundary import CURVES, UNBUILDABLE, bracket, search

# --- fake builders: the peak as a formula of the sequence -----------------------------------

FIXED = 10_000


class Fake:
    """A builder ``seq -> Workload`` whose compiled peak is ``peak_of(seq, batch)``; it counts
    the programs "compiled" (measure calls) and the workloads built."""

    def __init__(self, peak_of, refuse_above=None, xla_refuses_above=None, multiple=1):
        self.peak_of = peak_of
        self.refuse_above = refuse_above
        self.xla_refuses_above = xla_refuses_above
        self.multiple = multiple
        self.measured: list[int] = []
        self.built: list[int] = []

    def __call__(self, seq):
        self.built.append(seq)
        if self.refuse_above is not None and seq > self.refuse_above:
            raise BadValue(f"seq={seq} exceeds the model's learned positions", param="seq")

        def measure(policy, schedule, batch):
            if self.xla_refuses_above is not None and seq > self.xla_refuses_above:
                raise JaxRuntimeError("INTERNAL: launch needs more blocks\nHLO follows")
            self.measured.append(seq)
            peak = self.peak_of(seq, batch)
            return memory_report(
                peak_bytes=int(peak), policy=policy.spec, flops=float(seq), attention="cudnn"
            )

        return rk.sources.workload(
            rk.sources.Measured(measure, lambda p, s, b: float(seq * b)),
            rk.target("h100"),
            rk.TrainConfig(self.multiple, seq, accum=self.multiple),
        )


def affine(seq, batch):
    return FIXED + 37 * seq * batch


def quadratic(seq, batch):
    return FIXED + 37 * seq * batch + seq * seq * batch // 50


def lumpy(seq, batch):
    """Monotone but no polynomial: a square root with steps (XLA's fusion choices)."""
    return FIXED + int(4000 * math.sqrt(seq)) + 3000 * (seq // 700) + 5 * seq


def longest(peak_of, limit, step, cap=1 << 20, batch=1):
    """The brute-force answer: the longest multiple of ``step`` from ``step`` up whose peak
    fits, scanning until the first that does not (the curves here are monotone)."""
    best, seq = 0, step
    while seq <= cap and peak_of(seq, batch) <= limit:
        best, seq = seq, seq + step
    return best


@pytest.mark.parametrize(
    ("curve", "most", "method"),
    [(affine, 4, "line"), (quadratic, 5, "quadratic")],
)
@pytest.mark.parametrize("limit", [FIXED + 2_000_000, FIXED + 7_777_777, 3 * 10**7 + 1])
@pytest.mark.parametrize("step", [64, 1024])
def test_on_the_curve_it_expects_the_search_is_exact_in_few_compiles(
    curve, most, method, limit, step
):
    fake = Fake(curve)
    fit = rk.search.max_seq(fake, "full", granularity=step, limit_bytes=limit)
    expect = longest(curve, limit, step)
    assert expect > 2 * step  # a real search, not the first probes
    assert fit.seq == expect and fit.seq % step == 0
    assert fit.peak_bytes == curve(expect, 1) <= limit < fit.next_peak_bytes
    assert fit.next_peak_bytes == curve(expect + step, 1)
    # The answer rests on two compiles: the longest that fits and the next step up.
    assert {expect, expect + step} <= set(fake.measured)
    assert fit.compiles == len(set(fake.measured)) <= most
    assert fit.method == method
    assert fit.tokens_per_step == expect and fit.batch == 1 and fit.unit == step
    # The curve's prediction (in tokens, not units) is the answer itself.
    assert fit.predicted == expect


@pytest.mark.parametrize("limit", [331, 2_000, 50_000])
def test_the_parabola_through_three_peaks_predicts_the_boundary_at_once(limit):
    """Three peaks on y = 2u^2 + 3u + 100: the quadratic through them is that curve, so its
    first prediction is the boundary (the brute-force scan's) and the next unit confirms it."""

    def y(u):
        return 2 * u * u + 3 * u + 100

    known, probed = {u: y(u) for u in (1, 2, 4)}, []

    def peak(u):
        probed.append(u)
        known[u] = y(u)
        return known[u]

    expect = max(u for u in range(1, 1000) if y(u) <= limit)  # 10, 30, 157
    lo, hi, method, predicted = search(peak, known, limit, 1000, CURVES["seq"])
    assert (lo, hi, method, predicted) == (expect, expect + 1, "quadratic", expect)
    assert probed == [expect, expect + 1]


def test_two_predictions_that_do_not_halve_the_bracket_hand_over_to_the_gallop():
    """Peaks 100 e^(u/5) from units 1 and 2, limit 1000: the line through the two predicts 33
    (slope 27: 2 + 851 / 27), far past the boundary; then parabolas through convex points
    creep up from below (4, then 6), so two predictions took the 31-unit bracket (2, 33) to a
    27-unit one (6, 33): not half. The search stops following them and gallops up from 6 in
    steps of 2 then 4 (8 fits, 12 does not), then bisects (10, 11): seven probes, where
    following the parabola to its sixth prediction (7, 8, 9) takes ten."""

    def y(u):
        return int(100 * math.exp(u / 5))

    known, probed = {u: y(u) for u in (1, 2)}, []

    def peak(u):
        probed.append(u)
        known[u] = y(u)
        return known[u]

    expect = max(u for u in range(1, 100) if y(u) <= 1000)  # 11: 902 bytes, 12: 1102
    lo, hi, method, predicted = search(peak, known, 1000, 1000, CURVES["seq"])
    assert (lo, hi, method) == (expect, expect + 1, "bisection")
    assert (probed, predicted) == ([33, 4, 6, 8, 12, 10, 11], 6)


@pytest.mark.parametrize("limit", [FIXED + 120_000, FIXED + 333_333, FIXED + 2_000_000])
@pytest.mark.parametrize("step", [16, 128])
def test_bisection_finds_the_exact_boundary_off_the_curve(limit, step):
    fake = Fake(lumpy)
    fit = rk.search.max_seq(fake, "full", granularity=step, limit_bytes=limit)
    expect = longest(lumpy, limit, step)
    assert fit.seq == expect > 0
    assert lumpy(expect, 1) <= limit < lumpy(expect + step, 1)
    assert fit.peak_bytes <= fit.limit_bytes == limit < fit.next_peak_bytes
    # Galloping from the curve's miss, then bisecting: logarithmic in the answer.
    assert fit.compiles == len(set(fake.measured)) <= 6 + 2 * math.ceil(math.log2(expect / step))


def test_when_the_first_two_compiles_are_the_boundary_they_are_the_answer():
    fake = Fake(affine)
    fit = rk.search.max_seq(fake, granularity=64, limit_bytes=affine(64, 1) + 1)
    assert fit.seq == 64 and fit.next_peak_bytes == affine(128, 1)
    assert fake.measured == [64, 128] and fit.method == "first probes"


@pytest.mark.parametrize("curve", [affine, quadratic, lumpy])
@pytest.mark.parametrize("steps", [3, 17])
def test_a_peak_equal_to_the_limit_fits(curve, steps):
    limit = curve(64 * steps, 1)
    fit = rk.search.max_seq(Fake(curve), granularity=64, limit_bytes=limit)
    assert fit.seq == 64 * steps and fit.peak_bytes == limit


def test_the_batch_multiplies_the_tokens_and_is_held_fixed():
    fake = Fake(quadratic, multiple=2)
    limit = FIXED + 30_000_000
    fit = rk.search.max_seq(fake, "none", batch=4, granularity=256, limit_bytes=limit)
    expect = longest(quadratic, limit, 256, batch=4)
    assert fit.seq == expect and fit.batch == 4 and fit.tokens_per_step == 4 * expect
    assert quadratic(expect, 4) <= limit < quadratic(expect + 256, 4)


@pytest.mark.parametrize("refused_above", [1000, 5000])
@pytest.mark.parametrize("who", ["model", "XLA"])
def test_a_sequence_that_cannot_be_built_is_an_upper_bound(refused_above, who):
    kwargs = {"refuse_above" if who == "model" else "xla_refuses_above": refused_above}
    fake = Fake(affine, **kwargs)
    fit = rk.search.max_seq(fake, "full", granularity=100, limit_bytes=10**12)
    expect = refused_above // 100 * 100
    assert fit.seq == expect and fit.next_peak_bytes is None
    assert fit.note.kind == "seq_fits" and fit.note.data["next_seq"] == expect + 100
    said = {"model": "the model: seq=", "XLA": "XLA: INTERNAL: launch needs more blocks)"}[who]
    assert f"seq {expect + 100} cannot be built ({said}" in fit.message
    assert "HLO" not in fit.message
    # Refused sequences cost no compile; the ones that built are a handful.
    assert fit.compiles == len(set(fake.measured)) <= 4 + 2 * math.ceil(math.log2(expect / 100))


@pytest.mark.parametrize("refused_above", [777, 5000, 23000])
def test_after_a_sequence_that_cannot_be_built_the_search_bisects_its_bracket(refused_above):
    """No curve predicts where XLA starts refusing: the probe after a refused one is the
    middle of the bracket (in units of the granularity), the largest known to fit and the
    smallest known not to (a refused one among them), as the probes so far say."""
    g, limit = 100, 10**12
    fake = Fake(affine, xla_refuses_above=refused_above)
    rk.search.max_seq(fake, "full", granularity=g, limit_bytes=limit)
    units = [s // g for s in fake.built]

    def over(u):
        return u * g > refused_above or affine(u * g, 1) > limit

    after = 0
    for i in range(1, len(units)):
        if not over(units[i - 1]):
            continue
        seen = units[:i]
        lo = max((u for u in seen if not over(u)), default=0)
        hi = min(u for u in seen if over(u) and u > lo)
        assert units[i] == (lo + hi) // 2, (i, units)
        after += 1
    assert after >= 3  # a halving walk down from the first wild probe, at least


def test_refusing_the_shortest_sequence_is_an_error():
    with pytest.raises(BadValue, match="learned positions"):
        rk.search.max_seq(Fake(affine, refuse_above=50), granularity=64, limit_bytes=10**9)
    with pytest.raises(JaxRuntimeError, match="launch needs more blocks"):
        rk.search.max_seq(Fake(affine, xla_refuses_above=50), granularity=64, limit_bytes=10**9)


@pytest.mark.parametrize("cap", [64 * 5, 64 * 5 + 63, 1 << 20])
def test_the_cap_stops_the_search(cap):
    fake = Fake(affine)
    fit = rk.search.max_seq(fake, "full", granularity=64, limit_bytes=10**15, cap=cap)
    assert fit.seq == cap // 64 * 64 and fit.method == "cap"
    assert fit.next_peak_bytes is None and max(fake.measured) == fit.seq
    assert fit.message.endswith(f"; stopped at the cap {cap}")


def test_nothing_fits_says_the_shortest_sequence_and_its_peak():
    fake = Fake(affine)
    fit = rk.search.max_seq(fake, "minimal", granularity=512, limit_bytes=FIXED)
    assert not fit.fits and fit.seq == 0 and fit.tokens_per_step == 0
    assert fit.peak_bytes == affine(512, 1) and fake.measured == [512]
    assert fit.attention == "cudnn"  # the kernel the shortest sequence was measured with
    assert fit.message == (
        f"minimal: even seq 512 at batch 1 does not fit: {size_words(affine(512, 1))} > "
        f"{size_words(FIXED)} on h100-80gb"
    )


def test_a_start_past_the_boundary_walks_down():
    fake = Fake(quadratic)
    limit = FIXED + 5_000_000
    fit = rk.search.max_seq(fake, granularity=64, limit_bytes=limit, start=64 * 200 + 50)
    assert fake.measured[0] == 64 * 200  # the start, rounded down to a multiple of the step
    assert fit.seq == longest(quadratic, limit, 64)


def test_a_memoized_builder_shares_the_compiles_of_an_earlier_search():
    fake = Fake(quadratic)
    build = functools.cache(fake)
    limit = FIXED + 9_000_000
    first = rk.search.max_seq(build, "full", granularity=64, limit_bytes=limit)
    again = rk.search.max_seq(build, "full", granularity=64, limit_bytes=limit)
    assert again.seq == first.seq and first.compiles > 0 and again.compiles == 0
    other = rk.search.max_seq(build, "none", granularity=64, limit_bytes=limit)
    assert other.compiles > 0  # another policy is another program


def test_to_dict_holds_every_field_and_the_words():
    fit = rk.search.max_seq(Fake(affine), "full", granularity=64, limit_bytes=FIXED + 10**6)
    d = fit.to_dict()
    assert {f for f in d} >= {
        "policy",
        "schedule",
        "axis",
        "seq",
        "batch",
        "unit",
        "value",
        "tokens_per_step",
        "peak_bytes",
        "next_peak_bytes",
        "limit_bytes",
        "compiles",
        "seconds",
        "method",
        "predicted",
        "note",
        "fits",
        "message",
    }
    assert d["note"]["kind"] == "seq_fits" and d["message"] == fit.message
    assert rk.notes.Note.from_dict(d["note"]) == fit.note


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"granularity": 0}, BadValue, "granularity=0 must be at least 1"),
        ({"granularity": 64.0}, BadType, "granularity must be an int"),
        ({"batch": 0}, BadValue, "batch=0 must be at least 1"),
        ({"cap": 32}, BadValue, "cap=32 is below granularity=64"),
        ({"batch": 3}, BadValue, "batch=3 does not split into the step's 2"),
        ({"headroom": 1.5, "limit_bytes": None}, BadValue, "headroom=1.5 must be in"),
    ],
)
def test_bad_arguments_are_refused_before_any_compile(kwargs, error, match):
    fake = Fake(affine, multiple=2)
    args = {"granularity": 64, "limit_bytes": 10**9, "batch": 2, **kwargs}
    with pytest.raises(error, match=match):
        rk.search.max_seq(fake, "full", **args)
    assert fake.measured == []


@pytest.mark.parametrize("limit", [10**9, 1000])
def test_a_cap_of_one_granule_is_a_search_of_one_sequence(limit):
    """``cap == granularity`` is not below it: one sequence to try, which fits or does not
    (seed 93's _seq.py:104, ``< -> <=``, refused it)."""
    fake = Fake(affine, multiple=2)
    fit = rk.search.max_seq(fake, "full", granularity=64, cap=64, limit_bytes=limit, batch=2)
    fits = affine(64, 2) <= limit  # by the fake's own rule
    assert fits is (limit == 10**9)
    assert fit.seq == (64 if fits else 0)
    assert fake.measured == [64]


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda seq: "not a workload", "returned str, not an rk.Workload"),
        (lambda seq: Fake(affine)(seq + 1), r"build\(64\) returned a workload of seq=65"),
    ],
)
def test_a_broken_builder_is_a_type_error(build, match):
    with pytest.raises(BadType, match=match):
        rk.search.max_seq(build, granularity=64, limit_bytes=10**9)


def test_seq_multiple_reads_the_axes_that_split_the_sequence():
    assert rk.search.seq_multiple(None) == 1
    assert rk.search.seq_multiple(rk.parse_shard("fsdp:8")) == 1
    assert rk.search.seq_multiple(rk.parse_shard("dp:2,tp:4")) == 4
    if "cp" in rk.sharding.STRATEGIES:  # context parallelism: the plan says how it splits
        plan = rk.parse_shard("cp:2,tp:4")
        assert rk.search.seq_multiple(plan) == plan.seq_ways >= 2


def test_seq_multiple_of_a_plan_that_only_has_rules():
    class Rules:  # a plan as remat_kit had it before seq_ways: only its logical-axis rules
        def rules(self):
            return (("act_batch", "dp"), ("act_seq", ("cp", "tp")), ("heads", "tp"))

        def size(self, kind):
            return {"dp": 2, "cp": 3, "tp": 4}[kind]

    assert rk.search.seq_multiple(Rules()) == 12


def test_unbuildable_is_over_any_limit():
    assert UNBUILDABLE > 2**60


# --- compiled: tiny presets for an H100 -------------------------------------------------------


def _builder(model, attention, **changes):
    from remat_kit_models.spec import PresetSpec

    def at(seq):
        src = rk.sources.resolve(PresetSpec(model, attention=attention, **changes))
        return rk.sources.workload(src, "h100", rk.TrainConfig(1, seq, optimizer="sgd"))

    return at


#: (preset, attention, extra options, the kernel the step runs). GPT-2's learned positions are
#: widened so that its sequence is bounded by memory, not by its position table.
PRESETS = [
    ("tiny-llama", "xla", {}, "xla"),
    ("tiny-gpt2", "auto", {"overrides": (("max_seq", 4096),)}, "cudnn"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("model", "attention", "changes", "kernel"), PRESETS)
def test_the_longest_sequence_is_verified_by_compiles_made_apart(model, attention, changes, kernel):
    step, policy = 64, "none"
    # The limit: halfway between the peaks at 3 and 4 steps, compiled apart from the search
    # (past the first two probes, so the curve's prediction is verified).
    fresh = _builder(model, attention, **changes)
    three, four = (fresh(n * step).report(policy, batch=1) for n in (3, 4))
    assert three.attention == kernel and three.peak_bytes < four.peak_bytes
    limit = (three.peak_bytes + four.peak_bytes) // 2
    fit = rk.search.max_seq(
        functools.cache(_builder(model, attention, **changes)),
        policy,
        granularity=step,
        limit_bytes=limit,
    )
    assert fit.fits and fit.seq % step == 0
    # Independent compiles (new workloads) at the answer and one step up.
    at = fresh(fit.seq).report(policy, batch=1).peak_bytes
    nxt = fresh(fit.seq + step).report(policy, batch=1).peak_bytes
    assert at <= limit < nxt
    assert (at, nxt) == (fit.peak_bytes, fit.next_peak_bytes)
    assert fit.seq == 3 * step  # the peaks grow with the sequence here
    assert fit.attention == kernel
    assert fit.compiles <= 5, fit.compiles  # four on a line, five on a quadratic


def test_a_search_says_the_seconds_it_took():
    """Its own wall time: positive, within the time measured around the call (issue 58
    mutant _seq.py:279 of seed 77, the start added instead of taken away)."""
    t0 = time.perf_counter()
    fit = rk.search.max_seq(Fake(affine), "full", granularity=64, limit_bytes=FIXED + 2_000_000)
    assert 0 < fit.seconds <= time.perf_counter() - t0


def test_a_search_counts_only_its_own_compiles_on_workloads_built_before():
    """max_seq_plan hands max_seq the probes the plan goes on using: a search counts what
    compiled since it began, not what was there (issue 58 mutant _seq.py:279 of seed 77,
    the compiles before added). Here the second search finds every probe compiled."""
    from remat_kit.search._seq import _Probes

    fake = Fake(affine)
    probes = _Probes(fake)
    first = rk.search.max_seq(probes, "full", granularity=64, limit_bytes=FIXED + 2_000_000)
    assert first.compiles == len(set(fake.measured)) > 0
    again = rk.search.max_seq(probes, "full", granularity=64, limit_bytes=FIXED + 2_000_000)
    assert (again.seq, again.compiles) == (first.seq, 0)


def test_the_plan_at_the_longest_sequence_is_searched_under_the_limit_given():
    """max_seq_plan's search for ``full``'s longest sequence keeps the caller's limit, not the
    device's (seed-88 mutant _seq.py:347, ``limit_bytes`` dropped: only the slow doctest
    caught it). By hand: 10,000 + 37 s <= 2,010,000 up to s = 54,054, in steps of 64."""
    limit = FIXED + 2_000_000
    fit, plan = rk.search.max_seq_plan(Fake(affine), granularity=64, limit_bytes=limit)
    assert fit.seq == 54_054 // 64 * 64 == 54_016
    assert fit.peak_bytes == affine(54_016, 1) <= limit < affine(54_016 + 64, 1)
    assert plan.fits and plan.peak_bytes <= limit


def test_no_plan_is_searched_where_full_remat_fits_no_sequence():
    """Under a limit that 64 tokens already pass under ``full``, the answer is that nothing
    fits and no plan (seed-100 mutant _seq.py:346, ``return full, None`` made ``return
    None``: no test had a limit that small). The peak at 64 is 10,000 + 37 x 64 = 12,368."""
    fake = Fake(affine)
    fit, plan = rk.search.max_seq_plan(fake, granularity=64, limit_bytes=FIXED + 37 * 64 - 1)
    assert plan is None and not fit.fits
    assert fake.measured == [64]  # the shortest sequence compiled, nothing planned after


@pytest.mark.parametrize("limit", [FIXED + 10**6, 2**63])
def test_a_point_that_cannot_be_built_never_fits_whatever_the_limit(limit):
    """A budget on a target of no known memory (the CPU) is bounded by no device: a refused
    point still bounds the bracket from above, and the search bisects down to the last unit
    that builds (37 here) instead of taking the refusal for a fit."""
    assert bracket({1: 5, 2: UNBUILDABLE}, limit) == (1, 2)
    known = {}

    def peak(u):
        known[u] = 100 + 7 * u if u <= 37 else UNBUILDABLE
        return known[u]

    peak(1), peak(2)
    assert search(peak, known, limit, cap=1000, curves=("line",))[:2] == (37, 38)


@pytest.mark.parametrize("start", [640, 1280])
def test_a_start_whose_peak_is_the_limit_exactly_fits_and_twice_it_is_probed_next(start):
    """A peak equal to the limit fits: the second probe is twice the start, and the line
    through the two puts the boundary at the start, verified by the next sequence (seed-90
    mutant _seq.py:217, ``<=`` -> ``<``: the start taken as over, five compiles or more)."""
    fake = Fake(affine)
    fit = rk.search.max_seq(fake, "full", granularity=64, limit_bytes=affine(start, 1), start=start)
    assert (fit.seq, fit.peak_bytes) == (start, affine(start, 1))
    assert fake.measured == [start, 2 * start, start + 64] and fit.compiles == 3
