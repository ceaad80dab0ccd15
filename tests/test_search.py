"""The planner: budgets, largest batch, cheapest plan, Pareto front, infeasible inputs.

Two kinds of tests. A fake workload (peak and FLOPs from a formula, no compiles) pins the search
logic exactly; a small bf16 Llama compiled for an H100 checks the claims on real compiled figures
(each compile costs seconds, so they are shared through module fixtures).
"""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SMALL

import models
import remat_kit as rk
from helpers import loss_and_grads, tokens
from remat_kit.cli import main
from remat_kit.errors import DoesNotFit

GIB = 2**30


# --- a fake workload: peak = fixed + what the policy keeps -------------------------------------

#: tag -> (bytes over all layers, FLOPs to recompute over all layers)
TAGS = {"mlpwi_0": (800, 100.0), "attn_out": (300, 1.0), "query_proj": (200, 400.0)}
FIXED, UNTAGGED, BASE, LAYERS = 1000, 5000, 10_000.0, 4


def _per_layer_policies(policy, schedule):
    return [run.policy for run in schedule.runs(LAYERS, policy) for _ in range(run.layers)]


def _kept(policy, schedule):
    saved = {t: 0.0 for t in TAGS}
    for p in _per_layer_policies(policy, schedule):
        for t, (b, _) in TAGS.items():
            if not p.is_remat or rk.decide(p, t) == "save":
                saved[t] += b / LAYERS
    return saved


def _fake_flops(policy, schedule, batch):
    extra = 0.0
    for p in _per_layer_policies(policy, schedule):
        for t, (_, c) in TAGS.items():
            if p.is_remat and rk.decide(p, t) != "save":
                extra += c / LAYERS
    return batch * (BASE + extra)


def _fake_report(peak, flops=float("nan"), policy=None, schedule="none"):
    return rk.MemoryReport(
        target="h100-80gb",
        target_memory_bytes=rk.target("h100").memory_bytes,
        usable_bytes=rk.target("h100").usable_bytes,
        mem_fraction=rk.target("h100").mem_fraction,
        fits_with_fraction=None,
        devices=1,
        peak_bytes=int(peak),
        argument_bytes=FIXED,
        output_bytes=0,
        temp_bytes=int(peak) - FIXED,
        alias_bytes=0,
        host_bytes=0,
        host_temp_bytes=0,
        generated_code_bytes=0,
        xla_peak_bytes=None,
        flops=flops,
        flops_detail={},
        tags=tuple(TAGS),
        xla_remat=False,
        xla_remat_saved_bytes=0,
        xla_remat_limit_bytes=None,
        policy=policy,
        schedule=schedule,
        attention=None,
        compile_seconds=0.0,
    )


def _fake_measure(policy, schedule, batch):
    untagged = UNTAGGED if not policy.is_remat else 0
    peak = FIXED + batch * (untagged + sum(_kept(policy, schedule).values()))
    return _fake_report(peak, _fake_flops(policy, schedule, batch), policy.spec, schedule.spec)


def _fake_residuals(policy, schedule, batch):
    kept = _kept(policy, schedule)
    res = tuple(
        rk.residuals.Residual(t, (), "int8", int(batch * b), "saved", 1, "")
        for t, b in kept.items()
        if b
    )
    return rk.residuals.ResidualReport(
        residuals=res,
        tags={t: "saved" if kept[t] else "recomputed" for t in TAGS},
        tag_bytes={t: b // LAYERS for t, (b, _) in TAGS.items()},
        tag_count=dict.fromkeys(TAGS, LAYERS),
    )


def fake_workload():
    return rk.Workload(
        _fake_measure,
        _fake_flops,
        target=rk.target("h100"),
        seq=10,
        n_layers=LAYERS,
        residuals_fn=_fake_residuals,
        breakdown_fn=lambda b: {"weights": 400, "gradients": 400, "optimizer": 0},
        label="fake",
    )


@pytest.mark.parametrize("limit", [1000 + 6300 * 3, 1000 + 6300 * 7 + 5, 1000 + 6300 * 50 - 1])
def test_max_batch_is_exact_and_cached(limit):
    w = fake_workload()
    fit = rk.max_batch(w, "none", limit_bytes=limit)  # "none" keeps everything: 6300 B/sample
    per = UNTAGGED + sum(b for b, _ in TAGS.values())
    expect = (limit - FIXED) // per
    assert fit.max_batch == expect
    assert fit.peak_bytes <= limit < fit.next_peak_bytes
    assert fit.tokens_per_step == expect * 10
    assert fit.compiles <= 2 * int(np.log2(expect + 1)) + 3
    again = rk.max_batch(w, "none", limit_bytes=limit)
    assert again.compiles == 0 and again.max_batch == expect


def test_max_batch_when_nothing_fits():
    fit = rk.max_batch(fake_workload(), "full", limit_bytes=FIXED - 1)
    assert fit.max_batch == 0 and not fit.fits
    assert "even batch 1 does not fit" in fit.message


def test_fake_plan_is_none_when_none_fits():
    p = rk.plan(fake_workload(), 1, 10**9)
    assert p.policy.name == "none" and p.schedule.name == "none"
    assert p.recompute_overhead == 0 and p.fits
    assert set(p.decisions.values()) == {"save"}


@pytest.mark.parametrize("need", [100, 300, 500, 900, 1100])
def test_fake_plan_fits_and_is_cheapest(need):
    """The plan sheds at least ``need`` bytes at the lowest cost any per-layer mix allows."""
    w = fake_workload()
    everything = FIXED + sum(b for b, _ in TAGS.values())
    budget = everything - need
    p = rk.plan(w, 1, budget, offload=False)
    assert p.fits and p.peak_bytes <= budget
    assert _fake_measure(p.policy, p.schedule, 1).peak_bytes == p.peak_bytes
    # Brute force over per-layer choices (2^3 options per layer, layers interchangeable).
    options = []
    for mask in range(8):
        shed = sum(b for i, (b, _) in enumerate(TAGS.values()) if mask >> i & 1) / LAYERS
        cost = sum(c for i, (_, c) in enumerate(TAGS.values()) if mask >> i & 1) / LAYERS
        options.append((shed, cost))
    best = min(
        sum(options[m][1] for m in combo)
        for combo in _multisets(8, LAYERS)
        if sum(options[m][0] for m in combo) >= need
    )
    assert p.recompute_overhead * BASE == pytest.approx(best, abs=1e-6)


def _multisets(n, k, start=0):
    if k == 0:
        yield ()
        return
    for i in range(start, n):
        for rest in _multisets(n, k - 1, i):
            yield (i, *rest)


def test_fake_plan_nothing_fits_says_smallest():
    w = fake_workload()
    p = rk.plan(w, 1, FIXED - 100, offload=False)  # above weights + gradients, below the rest
    assert not p.fits
    assert "nothing fits" in p.message and "smallest peak reached" in p.message
    assert p.peak_bytes == min(c.peak_bytes for c in p.candidates)


def test_budget_below_weights_names_the_bytes_and_what_fits():
    with pytest.raises(ValueError) as err:
        rk.plan(fake_workload(), 1, 799)
    text = str(err.value)
    assert "whatever the policy" in text and "weights" in text and "gradients" in text
    assert "LoRA" in text and "sharding" in text


def test_check_budget_raises_does_not_fit_with_the_parts():
    parts = {"weights": 10, "gradients": 10, "optimizer": 20, "grad_accumulator": 5}
    w = dataclasses.replace(
        fake_workload(),
        # "activations" and unknown keys are not fixed: they must not count.
        breakdown_fn=lambda b: {**parts, "batch": 3 * b, "activations": 999, "other": 7},
    )
    rk.search.check_budget(w, 2, 51)  # 10 + 10 + 20 + 5 + 3 * 2 = 51: exactly fits
    with pytest.raises(DoesNotFit) as err:
        rk.search.check_budget(w, 2, 50)
    e = err.value
    assert isinstance(e, ValueError)
    assert e.parts == {**parts, "batch": 6}
    assert e.fixed_bytes == 51 and e.limit_bytes == 50 and e.target == "h100-80gb"
    assert e.hints and all(h in str(e) for h in e.hints)
    assert "whatever the policy" in str(e)


def test_advise_reports_does_not_fit_as_a_row():
    weights = 60 * GIB  # weights + gradients: 120 GiB, over an H100 whatever the policy
    made = []

    def workload_for(t):
        w = dataclasses.replace(
            fake_workload(),
            target=t,
            breakdown_fn=lambda b: {"weights": weights, "gradients": weights},
        )
        made.append(w)
        return w

    (row,) = rk.advise(workload_for, 1, targets=["h100"])
    assert row.target == "h100-80gb" and not row.fits
    assert row.plan is None and row.peak_bytes is None and row.max_batch == 0
    assert row.fixed_bytes == 2 * weights
    assert "whatever the policy" in row.message
    assert made[0].compiles == 0  # rejected from shapes, before any compile


def test_advise_branches_on_the_type_not_the_text():
    def measure(policy, schedule, batch):
        raise ValueError("looks like whatever the policy, but is not a DoesNotFit")

    def workload_for(t):
        return dataclasses.replace(fake_workload(), measure_fn=measure, target=t)

    with pytest.raises(ValueError, match="is not a DoesNotFit"):
        rk.advise(workload_for, 1, targets=["h100"])


# --- budgets -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("52GiB", 52 * GIB),
        ("52 GiB", 52 * GIB),
        ("40GB", 40 * 10**9),
        ("0.5", 40 * 10**9),
        ("25%", 20 * 10**9),
        ("512MiB", 512 * 2**20),
        ("1.5G", int(1.5 * GIB)),
    ],
)
def test_parse_budget(text, expected):
    assert rk.search.parse_budget(text, 80 * 10**9) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lots", "cannot read budget"),
        ("52GiBs", "cannot read budget"),
        ("52", "bare number above 1"),
        ("0", "must be positive"),
        ("120GB", "larger than the device"),
        ("150%", "more than the whole device"),
    ],
)
def test_parse_budget_rejects(text, message):
    with pytest.raises(ValueError, match=message):
        rk.search.parse_budget(text, 80 * 10**9)


def test_fraction_needs_a_device():
    with pytest.raises(ValueError, match="no memory size"):
        rk.search.parse_budget("0.5", None)


# --- the Pareto front ----------------------------------------------------------------------------


def test_front_marks_dominated_points():
    pts = [
        rk.search.FrontPoint("none", "catalogue", 100, 0.0, 0.0),
        rk.search.FrontPoint("full", "catalogue", 30, 0.23, 0.23),
        rk.search.FrontPoint("qkv", "catalogue", 40, 0.20, 0.20),
        rk.search.FrontPoint("worse", "catalogue", 45, 0.21, 0.21),  # qkv is smaller and cheaper
        rk.search.FrontPoint("tie-peak", "catalogue", 30, 0.30, 0.30),  # full: same peak, cheaper
        rk.search.FrontPoint("plan", "plan", 52, 0.05, 0.05),
        rk.search.FrontPoint("twin", "catalogue", 52, 0.05 + 1e-12, 0.05),  # equal to the plan
    ]
    out = {p.label: p for p in rk.search.pareto_front(pts)}
    assert [p.label for p in rk.search.pareto_front(pts)] == [p.label for p in pts]
    assert {k for k, p in out.items() if p.dominated} == {"worse", "tie-peak"}
    assert out["worse"].dominated_by == "qkv" and out["tie-peak"].dominated_by == "full"


# --- compiled figures: a small bf16 Llama on an H100 --------------------------------------------


@pytest.fixture(scope="module")
def small_w():
    from models.measure import Options, workload

    return workload(Options(**SMALL), "h100")


@pytest.fixture(scope="module")
def mid_plan(small_w):
    """A plan for a budget halfway between ``full`` and ``minimal``."""
    full = small_w.report("full", "none", 4)
    minimal = small_w.report("minimal", "none", 4)
    assert full.peak_bytes < minimal.peak_bytes
    budget = (full.peak_bytes + minimal.peak_bytes) // 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return rk.plan(small_w, 4, budget)


def test_plan_respects_budget_on_compiled_figures(mid_plan, small_w):
    from models.measure import Options, measure

    p = mid_plan
    assert p.fits and p.peak_bytes <= p.budget_bytes
    # Compiled afresh, outside the workload's cache: the same program, the same peak.
    fresh = measure(Options(**SMALL), p.policy, "h100", schedule=p.schedule)
    assert fresh.peak_bytes == p.peak_bytes <= p.budget_bytes
    # It does something, and it is cheaper than the catalogue policy that fits (full).
    assert "recompute" in p.decisions.values()
    assert 0 < p.recompute_overhead < small_w.recompute_overhead("full", "none", 4)
    assert all(c.peak_bytes is not None for c in p.candidates)


def test_plan_is_on_the_front(mid_plan, small_w):
    pts = rk.front(
        small_w, 4, policies=("none", "full", "minimal", "megatron"), schedules=(), plans=[mid_plan]
    )
    plan_pt = next(p for p in pts if p.kind == "plan")
    assert not plan_pt.dominated
    full_pt = next(p for p in pts if p.label == "full")
    assert plan_pt.overhead < full_pt.overhead and plan_pt.peak_bytes > full_pt.peak_bytes


def test_plan_is_none_when_the_budget_fits_none(small_w):
    p = rk.plan(small_w, 4)  # the whole H100 minus headroom: a tiny model fits without remat
    assert p.policy.name == "none" and p.schedule.name == "none"
    assert p.recompute_overhead == 0.0 and p.fits
    assert p.compiles <= 1


def test_max_batch_fits_and_next_does_not(small_w):
    from models.measure import Options, measure

    limit = int(small_w.report("full", "none", 4).peak_bytes * 1.4)
    fit = rk.max_batch(small_w, "full", limit_bytes=limit, start=4)
    assert fit.max_batch >= 4
    at = measure(Options(**{**SMALL, "batch": fit.max_batch}), "full", "h100")
    nxt = measure(Options(**{**SMALL, "batch": fit.max_batch + 1}), "full", "h100")
    assert at.peak_bytes <= limit < nxt.peak_bytes


def test_infeasible_budget_on_a_real_model(small_w):
    fixed = small_w.fixed_bytes(4)
    with pytest.raises(ValueError, match="whatever the policy") as err:
        rk.plan(small_w, 4, fixed // 2)
    assert "weights" in str(err.value) and "GiB" in str(err.value)
    with pytest.raises(ValueError, match="larger than h100-80gb"):
        rk.plan(small_w, 4, rk.target("h100").memory_bytes + 1)


def test_plan_policy_keeps_gradients(mid_plan):
    """The plan's Policy and schedule, handed to the model, give the no-remat gradients."""
    cfg = models.get_config("tiny-llama")
    toks = tokens(2, 17, cfg.vocab_size)
    params = models.build(cfg).init(jax.random.key(0), toks[:, :-1])
    ref_loss, ref = loss_and_grads(cfg, params, toks)
    planned = dataclasses.replace(cfg, policy=mid_plan.policy, schedule=mid_plan.schedule)
    loss, got = loss_and_grads(planned, params, toks)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(
            np.asarray(a, jnp.float32), np.asarray(b, jnp.float32), rtol=1e-5, atol=1e-6
        ),
        got,
        ref,
    )


# --- the CLI -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--budget", "lots"], "cannot read budget"),
        (["--budget", "200GiB"], "larger than the device"),
        (["--budget", "1MiB"], "whatever the policy"),
        (["--policies", "minmal"], "Did you mean minimal"),
    ],
)
def test_plan_cli_bad_input_is_one_line(extra, message, capsys):
    argv = ["plan", "--model", "tiny-llama", "--target", "h100", "--batch", "2", "--seq", "64"]
    argv += ["--attention", "xla"]
    code = main([*argv, *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err
    assert err.startswith("remat-kit: ") and err.count("\n") == 1


def test_advise_and_fit_cli_bad_names_are_one_line(capsys):
    base = ["--model", "tiny-llama", "--batch", "2", "--seq", "64"]
    assert main(["advise", *base, "--targets", "h1000"]) == 2
    err = capsys.readouterr().err
    assert "unknown target 'h1000'" in err and err.count("\n") == 1
    assert main(["fit", *base, "--target", "h100", "--policies", "ful"]) == 2
    assert "Did you mean full" in capsys.readouterr().err


def _sharded_fake(devices):
    """Per-GPU peak of a fake step whose 80 GiB of fixed state shards over ``devices``."""
    t = rk.target("h100", devices=devices)

    def measure(policy, schedule, batch):
        per_gpu = 80 * 2**30 // devices + batch * 2**30 // devices
        return _fake_report(per_gpu, policy=policy.spec)

    return rk.Workload(
        measure,
        _fake_flops,
        target=t,
        seq=10,
        n_layers=LAYERS,
        batch_multiple=devices,
        residuals_fn=_fake_residuals,
        breakdown_fn=lambda b: {},
        label="fake",
    )


def test_gpus_needed_finds_the_fewest_that_fit():
    got = rk.search.gpus_needed(_sharded_fake, 3, counts=(1, 2, 4, 8))
    # 80 GiB + 4 GiB of batch (3 rounded up to 4 ways) halves at 2 GPUs: 42 GiB fits 76.7 GiB.
    assert got.devices == 2 and got.batch == 4
    assert [n for n, _ in got.tried] == [1, 2]
    assert got.peak_bytes == (80 + 4) * 2**30 // 2
    none = rk.search.gpus_needed(_sharded_fake, 3, counts=(1,))
    assert none.devices is None and "does not fit 1 x h100-80gb" in none.message
