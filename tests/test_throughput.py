"""The throughput search (``rk.search.fastest``, ``fit --objective throughput``) on a fake step
whose peak and step time are written down, so the expected answers are computed by hand."""

import dataclasses
import json

import pytest

import remat_kit as rk
from helpers import changed, memory_report, step_time
from remat_kit.cli import main
from remat_kit.errors import BadValue
from remat_kit.render import fastest_words, throughput_table

SEQ = 10
FIXED = 1000
ACCUMULATOR = 200
#: per policy: (activation bytes per sample, seconds per sample); a step also costs 1 s once
#: per optimizer step (the update) and PASS per forward/backward pass (launches).
PASS = 0.02
POLICIES = {"none": (100, 0.10), "full": (40, 0.13), "minimal": (60, 0.105)}
#: none fits 8 samples, full 21, minimal 14.
LIMIT = FIXED + 8 * 100 + 50


def _report(policy, peak, seconds):
    return memory_report(
        peak_bytes=int(peak),
        argument_bytes=FIXED,
        temp_bytes=int(peak) - FIXED,
        flops=float("nan"),
        policy=policy,
        step_time=None if seconds is None else step_time(seconds),
    )


def fake(accum=1, penalty=None, timeless=()):
    """The step accumulating over ``accum`` micro-batches; ``penalty(policy, micro)`` adds
    seconds to a micro-batch (a product that tiles badly); a ``(policy, micro)`` in
    ``timeless`` has no step time (one the timing model cannot price)."""

    def measure(pol, sch, batch):
        per_sample, per_second = POLICIES[pol.spec]
        micro = batch // accum
        extra = 0.0 if penalty is None else penalty(pol.spec, micro)
        seconds = 1.0 + accum * (PASS + per_second * micro + extra)
        peak = FIXED + (ACCUMULATOR if accum > 1 else 0) + per_sample * micro
        return _report(pol.spec, peak, None if (pol.spec, micro) in timeless else seconds)

    return rk.sources.workload(
        rk.sources.Measured(measure, lambda p, s, b: float(b) * (1.2 if p.spec == "full" else 1.0)),
        rk.target("h100"),
        rk.TrainConfig(accum, SEQ, accum=accum),
    )


def _seconds(policy, micro, accum=1):
    return 1.0 + accum * (PASS + POLICIES[policy][1] * micro)


def _tps(policy, micro, accum=1):
    return micro * accum * SEQ / _seconds(policy, micro, accum)


def test_each_policy_trains_at_its_largest_batch_and_the_winner_beats_none():
    f = rk.search.fastest(fake(), ["none", "full", "minimal"], limit_bytes=LIMIT)
    got = {r.policy: (r.micro_batch, r.max_batch) for r in f.rows}
    # Tokens/s grows with the batch here, so each policy is fastest at its largest batch.
    assert got == {"none": (8, 8), "full": (21, 21), "minimal": (14, 14)}
    rows = {r.policy: r for r in f.rows}
    for name, (micro, _) in got.items():
        assert rows[name].tokens_per_second == pytest.approx(_tps(name, micro))
        assert rows[name].step_seconds == pytest.approx(_seconds(name, micro))
        assert rows[name].peak_bytes == FIXED + POLICIES[name][0] * micro <= LIMIT
    # minimal: 140 / 2.49 = 56.22 tok/s; full: 210 / 3.75 = 56.00; none: 80 / 1.82 = 43.96.
    assert f.winner.policy == "minimal"
    assert f.baseline.policy == "none"
    assert f.margin == pytest.approx((140 / 2.49) / (80 / 1.82) - 1.0)
    assert rows["full"].recompute_overhead == pytest.approx(0.2)
    words = fastest_words(f)
    assert words.startswith("fastest: minimal at micro-batch 14, 56 tok/s, +27.9% over none")


def test_a_badly_tiled_largest_batch_loses_to_the_power_of_two_under_it():
    # full's 21 samples pay 2 s more than 16: 16 is faster (160 / 3.10 = 51.6 vs 210 / 5.75).
    slow = fake(penalty=lambda p, micro: 2.0 if micro & (micro - 1) else 0.0)
    f = rk.search.fastest(slow, ["full"], limit_bytes=LIMIT)
    (row,) = f.rows
    assert (row.micro_batch, row.max_batch) == (16, 21)
    assert [t[0] for t in row.tried] == [21, 16]
    assert row.tokens_per_second == pytest.approx(160 / 3.10)


@pytest.mark.parametrize(("timeless", "micro"), [((("full", 16),), 21), ((("full", 21),), 16)])
def test_a_candidate_without_a_step_time_never_wins_over_one_with_a_time(timeless, micro):
    """full's candidates are 21 and 16; the one the timing model could not price is never
    the answer, whether it is compiled first or second."""
    f = rk.search.fastest(fake(timeless=timeless), ["full"], limit_bytes=LIMIT)
    (row,) = f.rows
    assert [t[0] for t in row.tried] == [21, 16]
    assert row.micro_batch == micro
    assert row.tokens_per_second == pytest.approx(_tps("full", micro))


def test_the_baseline_is_searched_when_none_is_not_asked_for():
    f = rk.search.fastest(fake(), ["full"], limit_bytes=LIMIT)
    assert [r.policy for r in f.rows] == ["full"]
    assert (f.baseline.policy, f.baseline.micro_batch) == ("none", 8)
    assert f.margin == pytest.approx((210 / 3.75) / (80 / 1.82) - 1.0)


def test_a_global_batch_takes_the_fewest_accumulation_steps_whose_micro_batch_fits():
    # 24 sequences per optimizer step. none fits 8 per pass, but the accumulator (200 bytes)
    # puts 3 x 8 over the limit (1000 + 200 + 800 > 1850): 4 x 6 is the answer.
    made = []

    def accumulate(a):
        made.append(a)
        return fake(accum=a)

    f = rk.search.fastest(
        fake(), ["none", "full"], global_batch=24, accumulate=accumulate, limit_bytes=LIMIT
    )
    rows = {r.policy: r for r in f.rows}
    none, full = rows["none"], rows["full"]
    assert (none.micro_batch, none.accum, none.batch) == (6, 4, 24)
    assert none.tried[0] == (8, 3, None)
    # full fits 21 per pass: 2 x 12 and 3 x 8 are tried; 2 x 12 is faster (one pass less:
    # 1 + 2 x (0.02 + 1.56) = 4.16 s against 1 + 3 x (0.02 + 1.04) = 4.18 s).
    assert (full.micro_batch, full.accum) == (12, 2)
    assert [t[:2] for t in full.tried] == [(12, 2), (8, 3)]
    assert full.step_seconds == pytest.approx(4.16)
    assert full.tokens_per_second == pytest.approx(24 * SEQ / 4.16)
    assert none.step_seconds == pytest.approx(1.0 + 4 * (0.02 + 0.6))
    # none: 240 / 3.48 = 69.0 tok/s beats full's 240 / 4.16 = 57.7 (its recompute costs more
    # per sample than the two passes fewer save).
    assert f.winner is none and f.margin == 0.0
    assert set(made) <= {2, 3, 4, 6}


def test_where_the_accumulator_puts_the_fewest_counts_over_the_next_counts_are_compiled():
    # 56 sequences per optimizer step. none fits 8 per pass alone, but with the accumulator
    # (200 bytes) 7 x 8 and 8 x 7 are over the limit (1000 + 200 + 800 and + 700 > 1850):
    # 14 x 4 fits (1600), then 28 x 2: the two that fit are the candidates, and none is the
    # fastest (560 tokens in 1 + 14 x 0.42 = 6.88 s), not "does not fit even one sequence".
    f = rk.search.fastest(
        fake(), ["none", "full"], global_batch=56, accumulate=lambda a: fake(accum=a),
        limit_bytes=LIMIT,
    )  # fmt: skip
    rows = {r.policy: r for r in f.rows}
    none, full = rows["none"], rows["full"]
    assert [t[:2] for t in none.tried] == [(8, 7), (7, 8), (4, 14), (2, 28)]
    assert [t[2] is None for t in none.tried] == [True, True, False, False]
    assert (none.micro_batch, none.accum, none.batch, none.max_batch) == (4, 14, 56, 8)
    assert none.tokens_per_second == pytest.approx(_tps("none", 4, 14))
    # full fits 21 per pass: 14 x 4 and 8 x 7 both fit, and 14 x 4 is the faster.
    assert [t[:2] for t in full.tried] == [(14, 4), (8, 7)]
    assert full.tokens_per_second == pytest.approx(_tps("full", 14, 4))
    assert f.winner is none and f.baseline is none
    assert fastest_words(f).endswith("no remat at its fastest accumulation is fastest")


def test_where_the_accumulator_puts_every_count_over_the_row_says_none_fits_and_its_largest():
    # A limit of 1150 bytes: none fits 1 sequence per pass alone (1100), full 3 (1120); with
    # the accumulator every count of a global batch of 4 is over (none 4 x 1: 1300; full
    # 2 x 2: 1280, 4 x 1: 1240). Each row says nothing fits, with the largest batch alone.
    f = rk.search.fastest(
        fake(), ["none", "full"], global_batch=4, accumulate=lambda a: fake(accum=a),
        limit_bytes=1150,
    )  # fmt: skip
    got = {r.policy: (r.fits, r.batch, r.max_batch, r.tokens_per_second) for r in f.rows}
    assert got == {"none": (False, 0, 1, None), "full": (False, 0, 3, None)}
    assert f.winner is None and fastest_words(f) == "fastest: nothing fits"


def test_a_global_batch_that_fits_in_one_pass_needs_no_accumulation():
    f = rk.search.fastest(
        fake(), ["full"], global_batch=16, accumulate=lambda a: fake(accum=a), limit_bytes=LIMIT
    )
    (row,) = f.rows
    assert (row.micro_batch, row.accum, row.batch) == (16, 1, 16)


def test_nothing_fits_is_a_row_without_a_time():
    f = rk.search.fastest(fake(), ["none", "full"], limit_bytes=FIXED + 30)
    assert [r.fits for r in f.rows] == [False, False]
    assert f.winner is None and f.baseline is None and f.margin is None
    assert fastest_words(f) == "fastest: nothing fits"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(policies=[]), "at least one policy"),
        (dict(global_batch=24), "needs accumulate"),
        (dict(global_batch=0, accumulate=fake), "at least 1"),
    ],
)
def test_bad_arguments_are_refused_before_any_compile(kwargs, match):
    w = fake()
    policies = kwargs.pop("policies", ["none"])
    with pytest.raises(BadValue, match=match):
        rk.search.fastest(w, policies, limit_bytes=LIMIT, **kwargs)
    assert w.compiles == 0


def test_a_global_batch_must_split_over_the_data_parallel_gpus():
    w = changed(fake(), batch_ways=4)  # 4 data-parallel GPUs
    with pytest.raises(BadValue, match="does not split over 4 data-parallel GPUs"):
        rk.search.fastest(w, ["none"], global_batch=6, accumulate=fake, limit_bytes=LIMIT)

    def on_four(accum):
        return changed(fake(accum=accum), batch_ways=4)

    # a multiple of the four is taken: searched, its global batch kept
    f = rk.search.fastest(w, ["none"], global_batch=8, accumulate=on_four, limit_bytes=LIMIT)
    assert f.winner.micro_batch * f.winner.accum == 8


def test_the_table_marks_the_winner_and_says_each_row_against_none():
    f = rk.search.fastest(fake(), ["none", "full", "minimal"], limit_bytes=LIMIT)
    table = throughput_table(f, None)
    cols = {c.header: list(c._cells) for c in table.columns}
    assert cols["policy"] == ["none", "full", "[bold]minimal *[/bold]"]
    assert cols["micro-batch"] == ["8", "21", "14"]
    assert cols["vs none"][0] == "+0.0%"
    assert cols["vs none"][2] == f"{(140 / 2.49) / (80 / 1.82) - 1:+.1%}"
    assert cols["MFU"][0] == f"{1e12 / 2e12:.0%}"
    assert json.loads(json.dumps(f.to_dict()))["winner"] == "minimal"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--global-batch", "16"], "--global-batch 16 needs --objective throughput"),
        (["--objective", "throughput", "--accum", "2"], "--accum 2: --objective throughput"),
        (["--objective", "throughput", "--global-batch", "0"], "--global-batch 0: must be"),
    ],
)
def test_fit_refuses_what_the_throughput_search_cannot_do(argv, match, capsys):
    assert main(["fit", "--model", "tiny-llama", "--target", "h100", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err


def test_the_search_says_each_policy_before_it_searches_it():
    said = []
    rk.search.fastest(fake(), ["full", "minimal"], limit_bytes=LIMIT, progress=said.append)
    assert said == ["full (1/2)", "minimal (2/2)", "none (the baseline)"]


@pytest.mark.parametrize("terminal", [True, False])
def test_progress_draws_only_on_a_terminal(terminal):
    import io

    from rich.console import Console

    from remat_kit.render import progress

    buf = io.StringIO()
    out = Console(file=buf, force_terminal=terminal, width=80)
    with progress("fit", console=out) as step:
        step("minimal (2/3)")
    assert ("fit: minimal (2/3)" in buf.getvalue()) is terminal


def test_fit_throughput_prints_the_table_writes_the_json_and_accumulates(
    monkeypatch, capsys, tmp_path
):
    seen = {}

    def searched(w, specs, schedule, *, global_batch, accumulate, **kwargs):
        seen.update(specs=specs, global_batch=global_batch, accum2=accumulate(2).batch_multiple)
        return rk.search.fastest(fake(), ["none", "full", "minimal"], limit_bytes=LIMIT)

    monkeypatch.setattr("remat_kit.cli._fit.fastest", searched)
    monkeypatch.setenv("COLUMNS", "200")
    out_json = tmp_path / "fit.json"
    argv = ["fit", "--model", "tiny-llama", "--target", "h100", "--objective", "throughput"]
    assert main([*argv, "--global-batch", "24", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert seen["global_batch"] == 24 and seen["accum2"] == 2
    assert [getattr(s, "spec", s) for s in seen["specs"]] == ["none", "full", "minimal", "plan"]
    assert "fastest way to train tiny-llama" in out and "minimal *" in out
    assert "fastest: minimal at micro-batch 14" in out
    assert json.loads(out_json.read_text())["winner"] == "minimal"


def test_a_plan_that_is_a_catalogue_program_is_named_by_it():
    f = rk.search.fastest(fake(), ["none", "minimal"], limit_bytes=LIMIT)
    mine = dataclasses.replace(f.rows[1], policy="names:save=a+b", name="plan: names:save=a+b")
    twin = dataclasses.replace(mine, same_as="minimal")
    for row, shown in ((mine, "plan: names:save=a+b"), (twin, "plan (= minimal)")):
        g = dataclasses.replace(f, rows=(*f.rows, row))
        (cells,) = [
            list(c._cells) for c in throughput_table(g, None).columns if c.header == "policy"
        ]
        assert cells[-1] == shown
        assert g.to_dict()["rows"][-1]["policy"] == "names:save=a+b"


def test_the_planner_row_skips_a_micro_batch_it_cannot_plan_and_takes_the_next(monkeypatch):
    """full fits 21: the planner is asked at 21 and 16; a plan that does not fit at 21 leaves
    the row to 16 (issue 58 mutants _throughput.py:432 and :434 of the seed-59 sample)."""
    import types

    from remat_kit.search import _throughput

    asked = []

    def plan(w, batch, limit, **kw):
        asked.append(batch)
        if batch > 16:
            return types.SimpleNamespace(fits=False, report=None)
        return types.SimpleNamespace(
            fits=True,
            report=_report("full", FIXED + 40 * batch, _seconds("full", batch)),
            policy=rk.policy("full"),
            schedule=rk.schedule("none"),
            label="fake",
            recompute_overhead=0.2,
        )

    monkeypatch.setattr(_throughput, "plan", plan)
    f = rk.search.fastest(fake(), ["plan"], limit_bytes=LIMIT)
    (row,) = f.rows
    assert asked == [21, 16]
    assert (row.micro_batch, row.max_batch) == (16, 21)
    # the plan's own overhead, not one worked out again for its policy (issue 58 mutant
    # _throughput.py:440 of seed 104, the plan's figure dropped)
    assert row.recompute_overhead == 0.2
    assert row.tried == ((21, 1, None), (16, 1, pytest.approx(_tps("full", 16))))


def test_a_planner_row_that_plans_no_micro_batch_says_none_fits_and_full_s_largest(monkeypatch):
    """full fits 21, but no plan fits at 21 or 16: the row is there, without a time, and says
    21 was full's largest (issue 58 mutant _throughput.py:450 of seed 103, the row dropped)."""
    import types

    from remat_kit.search import _throughput

    monkeypatch.setattr(
        _throughput, "plan", lambda *a, **k: types.SimpleNamespace(fits=False, report=None)
    )
    f = rk.search.fastest(fake(), ["plan"], limit_bytes=LIMIT)
    (row,) = f.rows
    assert (row.policy, row.batch, row.max_batch, row.step_seconds) == ("plan", 0, 21, None)
    assert row.peak_bytes == FIXED + 40 * 21
    assert f.winner is None


@pytest.mark.parametrize("given", [{}, {"offload": False, "hide": 0.25}])
def test_the_planner_row_plans_with_plans_defaults_or_what_it_was_given(given, monkeypatch):
    """Not given, the planner row plans with :func:`rk.plan`'s own defaults (it may offload,
    as plan() lets it; seed 95's _throughput.py:167 made fastest's default no offload);
    given, with what was given."""
    import inspect
    import types

    from remat_kit.search import _throughput

    asked = []

    def plan(w, batch, limit, **kw):
        asked.append({k: kw[k] for k in ("offload", "hide")})
        return types.SimpleNamespace(fits=False, report=None)

    monkeypatch.setattr(_throughput, "plan", plan)
    rk.search.fastest(fake(), ["plan"], limit_bytes=LIMIT, **given)
    defaults = inspect.signature(rk.plan).parameters
    expected = {k: given.get(k, defaults[k].default) for k in ("offload", "hide")}
    assert asked and all(a == expected for a in asked), asked
    assert expected["offload"] is given.get("offload", True)


@pytest.mark.parametrize("devices", [1, 4])
def test_the_answer_names_the_gpus_the_step_runs_on(devices):
    """The target's device count, as given (issue 58 mutant _throughput.py:307 of seed 77,
    every count read as one)."""
    w = dataclasses.replace(fake(), target=rk.target("h100", devices=devices))
    f = rk.search.fastest(w, ["none"], limit_bytes=LIMIT)
    assert (f.devices, f.to_dict()["devices"], f.target) == (devices, devices, "h100-80gb")
