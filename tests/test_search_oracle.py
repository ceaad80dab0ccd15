"""The batch search against a brute-force scan over random steps.

``rk.max_batch`` follows lines through a few compiled peaks, then gallops and bisects; its
answer must be what a scan of every batch finds, whatever the curve and whatever its
estimates get wrong. Here a step is a random monotone curve of the batch (affine, a steeper
forward-pass line past a point, plateaus where XLA's own rematerialization holds the peak,
jumps), in units of a random batch multiple, under a random limit and cap, sometimes with
the shapes (``breakdown_fn``) and the trace (``residuals_fn``) that place the first probes,
those off by a random factor, and sometimes with peaks read off "shallow copies" off by up
to 3% that the search must verify whole (``verify_fn``). The scan is written here from the
contract: the largest multiple at most ``cap`` whose peak is at most the limit.
"""

from __future__ import annotations

import random

import pytest
from jax.errors import JaxRuntimeError

import remat_kit as rk
from helpers import memory_report

FIXED = 50_000


def _curve(rng: random.Random):
    """A random non-decreasing peak(batch) in bytes, the inputs (weights, optimizer) it
    holds whatever the batch, and the curve's kind."""
    per = rng.randrange(1_000, 400_000)
    inputs = FIXED - rng.randrange(0, FIXED // 2)  # gradients are the rest of the fixed part
    kind = rng.choice(["affine", "forward", "plateaus", "jump", "bend"])
    if kind == "affine":
        return (lambda b: FIXED + per * b), inputs, kind
    if kind == "forward":  # past a point the end of the forward pass peaks, on a steeper line
        steeper = per + rng.randrange(1, per)
        return (lambda b: max(FIXED + per * b, inputs + steeper * b)), inputs, kind
    if kind == "plateaus":  # XLA's remat holds the peak flat over runs of batches
        run = rng.randrange(2, 9)
        return (lambda b: FIXED + per * run * -(-b // run)), inputs, kind
    if kind == "jump":
        at, by = rng.randrange(2, 300), rng.randrange(1, 50 * per)
        return (lambda b: FIXED + per * b + (by if b >= at else 0)), inputs, kind
    root = rng.randrange(1, 30) * per  # grows slower than a line at first
    return (lambda b: FIXED + per * b + int(root * b**0.5)), inputs, kind


def _scan(peak, limit, multiple, cap):
    """The largest multiple of ``multiple`` at most ``cap`` whose peak fits: 0 when none."""
    best, b = 0, multiple
    while b <= cap and peak(b) <= limit:
        best, b = b, b + multiple
    return best


def _limit(rng: random.Random, peak, multiple: int) -> int:
    """A limit under the smallest batch, past any cap, or anywhere between a boundary
    batch's peak and the next one's."""
    roll = rng.random()
    if roll < 0.1:
        return peak(multiple) - rng.randrange(1, FIXED)
    if roll < 0.2:
        return peak(multiple * (1 << 15))
    b = multiple * rng.randrange(1, 3000)
    return peak(b) + rng.randrange(0, peak(b + multiple) - peak(b) + 1)


def _workload(rng: random.Random, peak, inputs, multiple):
    shapes = rng.random() < 0.6
    copies = rng.random() < 0.4
    misread = rng.uniform(0.3, 3.0)  # how far the trace's residual bytes are off
    off = {}

    def report(b, bytes_, extrapolated=False):
        meta = {"depth": {"mode": "extrapolated", "residual_bytes": 0}} if extrapolated else {}
        return memory_report(peak_bytes=int(bytes_), flops=float(b), meta=meta)

    def measure(policy, schedule, b):
        if not copies:
            return report(b, peak(b))
        off.setdefault(b, rng.uniform(-0.03, 0.03))
        return report(b, peak(b) * (1 + off[b]), extrapolated=True)

    def verify(policy, schedule, b, got, limit):
        near = got is None or limit is None or abs(got.peak_bytes - limit) < 0.05 * limit
        return report(b, peak(b)) if near else got

    def breakdown(b):
        return {
            "weights": inputs // 2,
            "optimizer": inputs - inputs // 2,
            "gradients": FIXED - inputs,
            "batch": 0,
            "grad_accumulator": 0,
        }

    def residuals(policy, schedule, b):
        saved = int(misread * (peak(b) - FIXED))
        return rk.residuals.ResidualReport(
            residuals=(rk.residuals.Residual("x", (), "int8", max(saved, 0), "saved", 1, ""),),
            tags={},
            tag_bytes={},
            tag_count={},
        )

    measured = rk.sources.Measured(
        measure,
        lambda p, s, b: float(b),
        residuals_fn=residuals if shapes else None,
        breakdown_fn=breakdown if shapes else None,
        verify_fn=verify if copies else None,
    )
    return rk.sources.workload(
        measured, rk.target("h100"), rk.TrainConfig(multiple, 64, accum=multiple)
    )


@pytest.mark.parametrize("seed", range(10))
def test_the_largest_batch_is_the_one_a_scan_finds(seed):
    rng = random.Random(seed)
    for _ in range(25):
        peak, inputs, kind = _curve(rng)
        multiple = rng.choice([1, 1, 2, 4, 8])
        cap = rng.choice([1 << 14] * 6 + [rng.randrange(multiple, 2000)] * 2 + [multiple])
        limit = _limit(rng, peak, multiple)
        w = _workload(rng, peak, inputs, multiple)
        start = rng.choice([None, None, rng.randrange(1, 3000)])
        fit = rk.max_batch(w, "full", limit_bytes=limit, cap=cap, start=start)
        want = _scan(peak, limit, multiple, cap)
        case = (seed, peak(multiple), limit, multiple, cap, start)
        assert fit.batch == want, case
        # Lines, a gallop and a bisection: a number of compiles that grows with the
        # logarithm of the batch, never a scan.
        assert fit.compiles <= 2 * (cap // multiple).bit_length() + 10, case
        shapes = w.shapes_known
        exact = not w.estimates and want
        if exact and (kind == "affine" or (kind == "forward" and shapes)):
            # A straight line through two exact peaks is the boundary (on a forward-pass
            # line past a point, the shapes' line from the inputs finds it): the batch it
            # predicts and the next, four compiles in all (rk.max_batch's contract).
            assert fit.method in ("line", "cap") and fit.compiles <= 4, (case, fit.method)
        if exact and kind == "affine" and shapes:
            # The shapes place the second probe on the boundary itself (its activations per
            # sample are exact on a straight step): three compiles, not four.
            assert fit.compiles <= 3, case
        if want == 0:
            assert not fit.fits and fit.peak_bytes > limit, case
            continue
        assert fit.peak_bytes == peak(want) <= limit, case
        nxt = want + multiple
        if fit.next_peak_bytes is None:  # stopped at the cap: nothing above it was asked
            assert nxt > cap, case
        else:
            assert fit.next_peak_bytes == peak(nxt) > limit, case


def _seq_curve(rng: random.Random):
    """A random non-decreasing peak(seq) in bytes at batch 1: a line (flash attention), a
    parabola (einsum attention's scores), either with steps (XLA's fusion choices), or a
    plateau (XLA's own remat holding the peak flat over runs of sequences)."""
    per = rng.randrange(10, 5_000)
    square = rng.choice([0, rng.randrange(1, 50)])  # scores: seq^2 / 1000 per unit
    kind = rng.choice(["curve", "curve", "steps", "plateaus"])
    if kind == "curve":
        return lambda s: FIXED + per * s + square * s * s // 1000
    if kind == "steps":
        every, by = rng.randrange(100, 5_000), rng.randrange(1, 100 * per)
        return lambda s: FIXED + per * s + square * s * s // 1000 + by * (s // every)
    run = rng.randrange(100, 3_000)
    return lambda s: FIXED + per * run * -(-s // run)


def _builder(peak, refused_above):
    """``seq -> Workload`` of the curve; past ``refused_above`` the model refuses the
    sequence (its learned positions), or XLA refuses to build it (a kernel grid)."""
    who = random.Random(refused_above).choice(["model", "xla"])

    def build(seq):
        if who == "model" and refused_above is not None and seq > refused_above:
            raise rk.errors.BadValue(f"seq={seq} is past the learned positions", param="seq")

        def measure(policy, schedule, batch):
            if who == "xla" and refused_above is not None and seq > refused_above:
                raise JaxRuntimeError("INTERNAL: launch needs more blocks")
            return memory_report(peak_bytes=int(peak(seq)), flops=float(seq))

        return rk.sources.workload(
            rk.sources.Measured(measure, lambda p, s, b: float(seq)),
            rk.target("h100"),
            rk.TrainConfig(1, seq),
        )

    return build


@pytest.mark.parametrize("seed", range(4))
def test_the_longest_sequence_is_the_one_a_scan_finds(seed):
    """``rk.search.max_seq`` (the same boundary search along the sequence, with a parabola
    among its curves) against a scan of every multiple of the granularity: the longest at most
    ``cap`` that builds and fits, whatever the curve, the start, the cap and the lengths the
    model or XLA refuse; the answer rests on that sequence's peak and the next one's (None
    where the next is refused or past the cap); compiles grow with the logarithm."""
    rng = random.Random(seed)
    for _ in range(20):
        peak = _seq_curve(rng)
        g = rng.choice([16, 64, 100, 1024])
        cap = rng.choice([1 << 20, 1 << 20, rng.randrange(g, 200 * g)])
        refused = rng.choice([None, None, rng.randrange(g, 3000 * g)])
        b = g * rng.randrange(1, 2000)
        limit = peak(b) + rng.randrange(0, peak(b + g) - peak(b) + 1)
        if rng.random() < 0.15:
            limit = peak(g) - 1  # not even the shortest fits
        start = rng.choice([None, None, rng.randrange(1, 4000 * g)])

        def fits(s, peak=peak, limit=limit, refused=refused):
            return (refused is None or s <= refused) and peak(s) <= limit

        want = 0
        while want + g <= cap and fits(want + g):
            want += g
        fit = rk.search.max_seq(
            _builder(peak, refused), "full", granularity=g, limit_bytes=limit, start=start, cap=cap
        )
        case = (seed, g, cap, refused, limit, start, peak(g))
        assert fit.seq == want, case
        assert fit.compiles <= 4 * (cap // g).bit_length() + 12, case
        if want == 0:
            assert not fit.fits and fit.peak_bytes == peak(g) > limit, case
            continue
        assert fit.peak_bytes == peak(want) <= limit, case
        nxt = want + g
        if nxt > cap or (refused is not None and nxt > refused):
            assert fit.next_peak_bytes is None, case
        else:
            assert fit.next_peak_bytes == peak(nxt) > limit, case


@pytest.mark.parametrize(
    ("xla", "want"),
    [
        # Both ends of the bracket off XLA's plateau: the line through them holds (None),
        # even with a point where the pass fell short.
        ({40: (50, True)}, None),
        # A point the pass did not touch (cut 0) is not on the plateau, short or not
        # (screen 96: ``cut and not short`` -> ``or`` lived).
        ({20: (0, False), 40: (50, True)}, None),
        # The bracket's low end held on the plateau by the pass (cut 30, not short): from the
        # short point at 40 the peaks before the pass, {10: 130, 20: 200, 40: 450}, rise
        # (450 - 130) / 30 a unit, less the 50 / 40 the pass takes off a unit: 9.41667, and
        # reach 500 at 40 + (500 - 400) / 9.41667 = 50.6 units.
        ({10: (30, False), 40: (50, True)}, 50),
        # Two points where the pass fell short: the line starts from the one nearer the
        # bracket (40, not 80: the nearest, not the farthest, is taken). Before the pass
        # {10: 130, 20: 200, 40: 450, 80: 1000} rise 870 / 70 a unit, less 50 / 40:
        # 11.17857, reaching 500 at 40 + 100 / 11.17857 = 48.9 (from 80: 49.8).
        ({10: (30, False), 40: (50, True), 80: (200, True)}, 48),
    ],
)
def test_the_line_past_xla_s_plateau_is_followed_only_from_an_end_on_it(xla, want):
    from remat_kit.search._boundary import _xla_line

    finite = {10: 100, 20: 200, 40: 400, **({80: 800} if 80 in xla else {})}
    assert _xla_line(finite, xla, 500, 10, 20) == want
