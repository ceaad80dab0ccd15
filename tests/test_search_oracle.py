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
        shapes = w.breakdown_fn is not None
        exact = w.verify_fn is None and want
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
