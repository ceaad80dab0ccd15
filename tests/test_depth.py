"""Unrolled models answered from shallow copies (remat_kit.sources._depth).

The fit is checked on sections made by hand, where the peak moves from one section to
another between the shallow copies and full depth; the pipeline is checked against bare
compiles of the full-depth step, for a factory that takes ``layers=`` and for a preset.
"""

from __future__ import annotations

import functools
import types

import jax
import pytest

import remat_kit as rk
from helpers import memory_report, step_time
from remat_kit import cache, sources
from remat_kit.errors import BadValue
from remat_kit.peak import Section
from remat_kit.peak._profile import sections_of
from remat_kit.render import depth_words
from remat_kit.residuals import tags_in
from remat_kit.sources import _depth as depth
from remat_kit_models.spec import PresetSpec

FACTORY = "tests/data/factories.py:deep"
CONFIG = rk.TrainConfig(batch=2, seq=32, optimizer="sgd")


def _sections(d, *, start=100, grads=7, saved=3, layer_cost=1):
    # The start of the backward pass holds every saved activation (grows with depth); the
    # backward of layer k holds the gradients of the layers above it.
    out = {Section("backward", "before"): start + saved * d}
    for k in range(d):
        out[Section("backward", "layer", k)] = 90 + layer_cost * d + grads * (d - 1 - k)
    return out


DEPTHS = (2, 3, 4)


@pytest.mark.parametrize("layers", [8, 32])
def test_the_peak_is_the_largest_section_line_at_full_depth(layers):
    fit = depth.fit_sections({d: _sections(d) for d in DEPTHS}, layers)
    before = 100 + 3 * layers
    layer0 = 90 + layers + 7 * (layers - 1)
    assert fit.peak_live_bytes == max(before, layer0)
    where = "backward, layer 0" if layer0 > before else "backward, before the layers"
    assert fit.section == where
    assert fit.residual_bytes == 0


def test_the_shallow_copies_peak_elsewhere_than_the_full_model():
    # At 2 to 4 layers the start of the backward pass is the peak; at 32 the gradients
    # of the layer stack are: a straight line through the copies' peaks misses it.
    shallow = {d: _sections(d, grads=4) for d in DEPTHS}
    assert all(max(s, key=s.get).role == "before" for s in shallow.values())
    fit = depth.fit_sections(shallow, 32)
    assert fit.section == "backward, layer 0"
    p2, p4 = max(shallow[2].values()), max(shallow[4].values())
    straight = p4 + 28 * (p4 - p2) / 2
    assert fit.peak_live_bytes == 90 + 32 + 4 * 31 > straight


def test_the_first_layer_is_fitted_as_itself_not_as_a_line_in_the_layer_index():
    # The first layer's backward holds more than a line through the others says (measured
    # on tests/data/factories.py:deep under full): its own line through the depths holds.
    secs = {d: _sections(d) for d in DEPTHS}
    for d in DEPTHS:
        secs[d][Section("backward", "layer", 0)] += 50
    fit = depth.fit_sections(secs, 32)
    assert fit.peak_live_bytes == 90 + 32 + 7 * 31 + 50


def test_a_residual_is_reported_and_counted_only_where_it_could_hold_the_peak():
    bent = {d: _sections(d) for d in DEPTHS}
    bent[3][Section("backward", "layer", 0)] += 6  # the peak's own line is bent
    assert depth.fit_sections(bent, 32).residual_bytes == 4  # lstsq: 6 * 2/3
    low = {d: _sections(d) for d in DEPTHS}
    low[3][Section("forward", "before")] = 8  # far below the peak, and bent
    for d in (2, 4):
        low[d][Section("forward", "before")] = 5
    assert depth.fit_sections(low, 32).residual_bytes == 0


@pytest.mark.parametrize(
    ("near", "residual"),
    [
        (1078, 4),  # 1078 + 4 reaches the peak's 1080: its residual is the one that counts
        (1075, 0),  # 1075 + 4 stays below 1080: only the peak's own (straight) line counts
    ],
)
def test_a_bent_line_just_under_a_straight_peak_lends_the_fit_its_residual(near, residual):
    # The peak, "backward, before", is straight: 1000 + 10 * d, 1080 at 8 layers. "forward,
    # before" is a line 2 bytes under it... bent by 6 bytes at depth 3: least squares through
    # three evenly spaced depths lifts the line by 6 / 3 = 2 bytes and leaves the middle copy
    # 6 * 2/3 = 4 bytes off it. Its true value at full depth could be the peak, so the fit
    # owns up to its residual, not to the straight peak's 0.
    secs = {
        d: {
            Section("backward", "before"): 1000 + 10 * d,
            Section("forward", "before"): near - 2 - 80 + 10 * d + (6 if d == 3 else 0),
        }
        for d in DEPTHS
    }
    fit = depth.fit_sections(secs, layers=8)
    assert (fit.peak_live_bytes, fit.section) == (1080, "backward, before the layers")
    assert fit.residual_bytes == residual


def test_an_inner_layer_that_peaks_is_refused():
    secs = {d: _sections(d) for d in DEPTHS}
    secs[4][Section("backward", "layer", 2)] = 10**6
    assert depth.fit_sections(secs, 32) is None


@pytest.mark.parametrize(
    "broken",
    [
        {d: {Section("backward" if d < 4 else "forward", "before"): 1} for d in DEPTHS},
        {
            2: {Section("backward", "before"): 1},
            3: {Section("backward", "before"): 1, Section("backward", "after"): 2},
        },
        {2: {Section("backward", "before"): 1}},
    ],
)
def test_copies_that_do_not_line_up_are_refused(broken):
    assert depth.fit_sections(broken, 32) is None


def test_sections_follow_the_schedule():
    got = sections_of(
        [1, 5, 2, 8, 3, 9, 4],
        [("forward", 0, 3), ("backward", 4, 6)],
        ["non-layer", "layers_0", "non-layer", "layers_1", "layers_1", "layers_0", "non-layer"],
    )
    assert got == {
        Section("forward", "before"): 1,
        Section("forward", "layer", 0): 5,  # the glue after layer 0 belongs to it
        Section("forward", "layer", 1): 8,
        Section("backward", "layer", 1): 3,
        Section("backward", "layer", 0): 9,
        Section("backward", "after"): 4,
    }


@pytest.mark.parametrize("reason", sorted(depth.FULL_DEPTH_REASONS))
def test_every_full_depth_reason_reads_as_a_line_with_its_figures(reason):
    figures = dict(zip(depth.FULL_DEPTH_REASONS[reason], (3, 8, 9), strict=False))
    line = depth_words({"mode": "full", "reason": reason, **figures})
    assert line.startswith("compiled at full depth: ")
    assert all(str(v) in line for v in figures.values())


@pytest.mark.parametrize(
    ("shallow", "depths", "layers", "want"),
    [
        # Byte counts (ints at both depths) are rounded: 14 + 4 / 3 bytes is 15.
        ((10, 14), (2, 5), 6, 15),
        # A float at either depth is a measure, not a count, and stays as the line gives it:
        # 0.25 + 0.25 * 5 = 1.5, and 1 + 0.75 = 1.75 (rounded, both would read 2).
        ((0, 0.25), (2, 3), 8, 1.5),
        ((0.25, 1), (2, 3), 4, 1.75),
        # Key by key: a FlopCount total counted 10 at 2 layers, 12.25 at 3 is 14.5 at 4.
        (
            ({"total": 10, "loops": 0}, {"total": 12.25, "loops": 0}),
            (2, 3),
            4,
            {
                "total": 14.5,
                "loops": 0,
            },
        ),
    ],
    ids=["ints", "int then float", "float then int", "mapping"],
)
def test_the_line_through_two_copies_rounds_only_what_both_count_in_ints(
    shallow, depths, layers, want
):
    got = depth.line_at(shallow, depths, layers)
    # repr, not ==: the value and its type (15 == 15.0, but a byte count prints as an int).
    assert repr(got) == repr(want)


@pytest.mark.parametrize(
    ("shallow", "deeper"),
    [
        (None, {"total": 12.0, "loops": 0}),  # a count the shallow copy lacks
        ({"total": 10.0, "loops": 0}, None),  # one the deeper copy lacks
        (7, {"dp": 2}),
        ({"dp": 2}, "dp=2"),  # a label
    ],
    ids=["none then mapping", "mapping then none", "number then mapping", "mapping then label"],
)
def test_a_mapping_at_one_copy_only_is_no_line_the_deeper_copy_s_value_stands(shallow, deeper):
    # Only two mappings are lined up key by key; a mapping beside anything else has no
    # line through it, and the deeper copy's figure is the one kept, as for a label.
    assert depth.line_at([shallow, deeper], (2, 3), 8) == deeper
    # The same inside a report's meta, where the full-depth report lines up both copies'.
    fit = depth.DepthFit(8, (2, 3), 5000, "backward, layer 0", residual_bytes=0, sections=3)
    at = lambda d, v: memory_report(argument_bytes=100 * d, meta={"entry": v, "layers": d})
    got = depth.extrapolate_report([at(2, shallow), at(3, deeper)], (2, 3), fit, 0, (10**6, None))
    assert got.meta["entry"] == deeper and got.meta["layers"] == 8  # 2 + 1 per layer
    assert got.argument_bytes == 800


def test_an_unknown_depth_mode_is_refused_before_any_compile():
    src = sources.from_factory(FACTORY)
    with pytest.raises(BadValue, match="depth='deep': give one of auto, full, check"):
        sources.measure(src, "full", "h100", CONFIG, depth="deep")


@functools.cache  # three tests read the full model's bare compile under `full`
def _bare(src, policy, target="h100"):
    none = rk.schedules.parse_schedule("none")
    step = src.build_step(rk.policy(policy), none, CONFIG, rk.target("h100")).step
    return rk.memory_report(
        step.fn, *step.args, target=target, donate_argnums=step.donate_argnums, warn=False
    )


@pytest.fixture(scope="module")
def factory():
    return sources.from_factory(FACTORY)


@pytest.fixture(scope="module")
def on_h100(factory):
    """``on_h100(policy)``: the factory measured for an H100 with the default depth (auto),
    once per module: three tests read it (the copies' compiles, sections and all, are kept on
    disk; the tracing and the fit are not)."""
    return functools.cache(
        lambda policy: sources.measure(factory, policy, "h100", CONFIG, warn=False)
    )


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["none", "full"])
def test_a_factory_taking_layers_is_answered_from_copies_within_a_percent(on_h100, factory, policy):
    got = on_h100(policy)
    bare = _bare(factory, policy)
    assert got.meta["depth"]["mode"] == "extrapolated"
    assert tuple(got.meta["depth"]["depths"]) == depth.DEPTHS
    assert got.peak_bytes == pytest.approx(bare.peak_bytes, rel=0.01)
    assert got.argument_bytes == bare.argument_bytes  # affine exactly: parameters
    assert got.flops == pytest.approx(bare.flops, rel=1e-9)
    assert got.step_time.seconds == pytest.approx(bare.step_time.seconds, rel=0.01)
    assert got.meta["layers"] == 8 and got.xla_peak_bytes is None


@pytest.mark.slow
def test_check_compiles_the_full_model_and_states_the_error(factory, on_h100):
    auto = on_h100("full")  # the copies compiled, and their sections kept with them on disk
    bare = _bare(factory, "full")
    before = cache.compiles()
    got = sources.measure(factory, "full", "h100", CONFIG, warn=False, depth="check")
    # Every program was compiled before, the copies too: read back from disk (remat_kit.cache
    # keeps what the copies' dumps said), the same figures, not compiled again.
    assert cache.compiles() == before
    d = got.meta["depth"]
    assert d["extrapolated_peak_bytes"] == auto.peak_bytes
    assert d["mode"] == "verified" and got.peak_bytes == bare.peak_bytes
    assert d["peak_error"] == pytest.approx(d["extrapolated_peak_bytes"] / bare.peak_bytes - 1)
    assert abs(d["peak_error"]) < 0.01


@pytest.mark.slow
def test_a_verdict_near_or_over_the_limit_is_compiled_at_full_depth(factory, on_h100):
    h100 = rk.target("h100")
    # A fraction that puts the usable memory 1% above this peak: within the margin.
    peak = _bare(factory, "full").peak_bytes
    near = rk.target("h100", mem_fraction=peak * 1.01 / h100.memory_bytes)
    got = sources.measure(factory, "full", near, CONFIG, warn=False)
    assert got.meta["depth"]["mode"] == "verified"
    assert got.peak_bytes == _bare(factory, "full", target=near).peak_bytes
    far = on_h100("full")  # sources.measure(factory, "full", h100, CONFIG, warn=False)
    assert far.meta["depth"]["mode"] == "extrapolated"
    # depth="estimate" keeps the copies' answer even there (their compiles are on disk now).
    # A "no" from copies is compiled whole too: depth.verify's rule, the same one settled()
    # applies above, pinned on hand-made reports in
    # test_verify_keeps_what_was_not_extrapolated_and_records_the_error (a target over the
    # limit here compiled the copies and the model again for no other check).
    before = cache.compiles()
    estimate = sources.measure(factory, "full", near, CONFIG, warn=False, depth="estimate")
    assert estimate.meta["depth"]["mode"] == "extrapolated" and cache.compiles() == before


@pytest.mark.parametrize(
    ("policy", "schedule", "path", "record"),
    [
        ("offload_dots_no_batch", "none", FACTORY, {"mode": "full", "reason": "offload"}),
        ("full", "every:2", "tests/data/factories.py:preset", {}),  # a schedule: quietly full
    ],
)
def test_what_is_not_a_stack_of_identical_layers_is_compiled_whole(policy, schedule, path, record):
    # Decided before any copy is compiled; measure then compiles the whole step and keeps the
    # record (test_a_stack_of_layers_not_alike_is_compiled_whole_saying_why goes through it).
    src = sources.from_factory(path)
    if schedule != "none" and "every" not in src.schedule_kinds:
        pytest.skip("needs a factory taking schedule=")

    def compile_step(built, dump_to=None):
        pytest.fail("a shallow copy was compiled")

    sch, h100 = rk.parse_schedule(schedule), rk.target("h100")
    got = depth.by_depth(src, rk.policy(policy), sch, h100, CONFIG, compile_step)
    assert got == (None, record)


@pytest.mark.slow
def test_a_stack_of_layers_not_alike_is_compiled_whole_saying_why():
    src = sources.from_factory("tests/data/factories.py:alternating")
    assert src.layer_kinds(rk.target("h100")) == 2
    got = sources.measure(src, "full", "h100", CONFIG, warn=False)
    assert got.meta["depth"] == {"mode": "full", "reason": "layers_differ", "kinds": 2, "layers": 8}
    assert depth_words(got.meta["depth"]) == (
        "compiled at full depth: its layers are not alike (2 kinds among 8): the shallow "
        "copies hold only its first ones"
    )
    assert got.peak_bytes == _bare(src, "full").peak_bytes


@pytest.mark.slow
def test_depth_full_compiles_the_whole_model(factory):
    got = sources.measure(factory, "full", "h100", CONFIG, warn=False, depth="full")
    assert "depth" not in got.meta
    assert got.peak_bytes == _bare(factory, "full").peak_bytes


def test_a_factory_without_layers_and_a_scanned_preset_build_no_copies():
    assert sources.from_factory("tests/data/factories.py:untagged").at_depth(2) is None
    scanned = sources.resolve(PresetSpec("tiny-llama"))
    assert scanned.at_depth(2) is None
    unrolled = sources.resolve(PresetSpec("tiny-llama", scan_layers=False))
    assert unrolled.at_depth(3).n_layers() == 3


@pytest.mark.slow
def test_an_unrolled_preset_spec_matches_its_full_compile():
    spec = PresetSpec("tiny-llama", scan_layers=False, overrides=(("layers", 10),))
    src, config = sources.resolve(spec), rk.TrainConfig(2, 32, optimizer="sgd")
    auto = sources.measure(src, "minimal", "h100", config, warn=False)
    full = sources.measure(src, "minimal", "h100", config, warn=False, depth="full")
    assert auto.meta["depth"]["mode"] == "extrapolated" and "depth" not in full.meta
    assert auto.peak_bytes == pytest.approx(full.peak_bytes, rel=0.01)
    assert auto.meta["params"] == full.meta["params"]


@pytest.mark.parametrize("depths", [DEPTHS, (1, 2), (1, 2, 3)])
def test_a_stretch_that_runs_some_layers_only_is_fitted_as_one(depths):
    # An optimizer phase whose ops name layer 0 alone, at every depth: in a one-layer copy
    # that is every layer, in the deeper ones it is not, and the phase is one stretch.
    got = depth.fit_sections(
        {d: {Section("optimizer", "layer", 0): 10 * d} for d in depths}, layers=32
    )
    assert (got.peak_live_bytes, got.section) == (320, "optimizer, spans some layers")


@pytest.mark.parametrize("depths", [(2, 3), (2, 3, 4)])
def test_a_stretch_over_two_layers_is_fitted_by_its_largest_section(depths):
    # The optimizer phase names layers 0 and 1 at every depth (all of a two-layer copy's,
    # not a deeper one's): one stretch, fitted through its most bytes, 10 a layer, not its
    # layer 1's 5: 10 * 32 at 32 layers.
    secs = {
        d: {Section("optimizer", "layer", 0): 10 * d, Section("optimizer", "layer", 1): 5 * d}
        for d in depths
    }
    got = depth.fit_sections(secs, layers=32)
    assert (got.peak_live_bytes, got.section) == (320, "optimizer, spans some layers")


@pytest.mark.parametrize("stretch_first", [True, False])
def test_a_stretch_over_some_layers_leaves_the_other_phases_layers_fitted(stretch_first):
    # Beside that stretch the backward pass runs every layer: its layer 0 is still the peak,
    # whichever phase the sections name first.
    def both(d):
        stretch = {Section("optimizer", "layer", 0): 10 * d}
        return {**stretch, **_sections(d)} if stretch_first else {**_sections(d), **stretch}

    got = depth.fit_sections({d: both(d) for d in DEPTHS}, layers=32)
    layer0 = 90 + 32 + 7 * 31  # above the stretch's 320 and the start's 100 + 3 * 32
    assert (got.peak_live_bytes, got.section) == (layer0, "backward, layer 0")


# --- final answers rest on full-depth compiles ---------------------------------------------

PER_SAMPLE, BASE_BYTES = 10_000, 50_000


def _extrapolating_workload(error, *, calls=None, copies=None):
    """A workload whose reports are read off "shallow copies" ``error`` (a fraction) off the
    full step's peak, BASE_BYTES + PER_SAMPLE * batch; ``verify_fn`` compiles it whole."""
    calls = [] if calls is None else calls
    copies = [] if copies is None else copies

    def true(pol, batch):
        peak = BASE_BYTES + PER_SAMPLE * batch
        return memory_report(peak_bytes=peak, flops=float("nan"), policy=pol.spec)

    def measure_fn(pol, sch, batch):
        copies.append(batch)
        r = true(pol, batch)
        meta = {
            "depth": {
                "mode": "extrapolated",
                "residual_bytes": 0,
                "layers": 32,
                "depths": [2, 3],
                "section": "backward",
            }
        }
        return r.replace(peak_bytes=round(r.peak_bytes * (1 + error)), meta=meta)

    def verify_fn(pol, sch, batch, report, limit):
        def full():
            calls.append(batch)
            return true(pol, batch)

        return depth.verify_search(report, full, limit)

    return rk.sources.workload(
        rk.sources.Measured(measure_fn, lambda p, s, b: 1.0, verify_fn=verify_fn),
        rk.target("h100"),
        rk.TrainConfig(1, 1),
    )


@pytest.mark.parametrize("error", [-0.05, -0.01, 0.0, 0.01, 0.05])
@pytest.mark.parametrize("answer", [8, 37, 150])
def test_a_fit_boundary_from_copies_is_compiled_whole(error, answer):
    limit = BASE_BYTES + PER_SAMPLE * answer + 5
    calls, copies = [], []
    w = _extrapolating_workload(error, calls=calls, copies=copies)
    fit = rk.max_batch(w, "full", limit_bytes=limit)
    assert fit.batch == answer
    assert fit.peak_bytes == BASE_BYTES + PER_SAMPLE * answer  # the full compile's figure
    assert fit.next_peak_bytes == BASE_BYTES + PER_SAMPLE * (answer + 1)
    assert {answer, answer + 1} <= set(calls) and len(calls) == len(set(calls))
    if abs(error) <= 0.01:
        # The copies held at the first probe (checked whole): the search ran on them, and
        # besides that probe the answer's two sides were compiled whole (and, where the
        # copies' boundary was one or two off, the line through them to the true one).
        assert calls[0] == copies[0] and len(calls) <= (3 if error == 0.0 else 5)
    else:  # off by more than 2% at the first probe: every later probe compiled whole only
        assert copies == calls[:1]


@pytest.mark.parametrize("cap", [8, 20])
def test_a_boundary_from_copies_at_the_cap_compiles_nothing_above_it(cap):
    # The batch at the cap fits (by 5 bytes); the copies read 1% high, so the whole compiles
    # move the boundary and the line through them lands on the cap: nothing past it is built.
    calls = []
    w = _extrapolating_workload(0.01, calls=calls)
    fit = rk.max_batch(w, "full", limit_bytes=BASE_BYTES + PER_SAMPLE * cap + 5, cap=cap)
    assert fit.batch == cap and fit.peak_bytes == BASE_BYTES + PER_SAMPLE * cap
    assert max(calls) == cap


@pytest.mark.parametrize("error", [-0.05, 0.05])
def test_nothing_fits_is_verified_near_the_limit(error):
    limit = BASE_BYTES + PER_SAMPLE  # batch 1 fits exactly
    fit = rk.max_batch(_extrapolating_workload(error), "full", limit_bytes=limit)
    assert fit.batch == 1


@pytest.mark.parametrize("error", [0.01, 0.015])
def test_a_batch_of_one_exactly_at_the_limit_fits_where_its_copies_read_over_it(error):
    # The first probe (batch 2) is checked whole and the copies hold (within 2%), so batch 1
    # is read off copies: 1-2% over the limit. The whole step at batch 1 is exactly the limit,
    # and a peak at the limit fits: the answer is batch 1, not "nothing fits".
    limit = BASE_BYTES + PER_SAMPLE
    calls, copies = [], []
    w = _extrapolating_workload(error, calls=calls, copies=copies)
    fit = rk.max_batch(w, "full", limit_bytes=limit, start=2)
    assert copies == [2, 1]  # batch 1 was read off copies first: round(60_000 * (1 + error))
    assert (fit.batch, fit.peak_bytes, fit.next_peak_bytes) == (1, limit, limit + PER_SAMPLE)
    assert sorted(calls) == [1, 2]


@pytest.mark.parametrize("error", [-0.05, 0.01, 0.05])
def test_a_plan_from_copies_states_the_full_steps_figures(error):
    calls = []
    w = _extrapolating_workload(error, calls=calls)
    budget = BASE_BYTES + PER_SAMPLE * 4 + 1  # "none" at batch 4 fits by one byte
    p = rk.plan(w, batch=4, budget=budget)
    assert p.fits and p.peak_bytes == BASE_BYTES + PER_SAMPLE * 4
    assert calls == [4]


def test_plan_table_marks_the_front_points_read_off_copies():
    from remat_kit.render import plan_table
    from remat_kit.search._front import front

    w = _extrapolating_workload(0.05)
    budget = BASE_BYTES + PER_SAMPLE * 4 + 1
    p = rk.plan(w, batch=4, budget=budget)  # compiled whole: near its budget
    pts = front(w, 4, policies=["full", "none"], schedules=(), plans=[p])
    config = rk.TrainConfig(4, 16, precision=rk.train.regime())
    # The run as the table's title reads it (remat_kit.render.RunOptions).
    run = types.SimpleNamespace(
        model="tiny-llama",
        batch=config.batch,
        seq=config.seq,
        optimizer=config.optimizer,
        lora=0,
        accum=config.accum,
        shard=None,
        precision_record=lambda: rk.train.planned_precision(config),
    )
    table = plan_table(p, pts, rk.target("h100"), run, plan_seconds=0, seconds=0, compiles=0)
    rows = dict(zip(table.columns[0].cells, table.columns[1].cells, strict=True))
    # The plan (none: it fits by a byte) was compiled whole, and its point with it; full,
    # a clear fit, stays the copies' figure.
    assert not rows[next(k for k in rows if k.startswith("PLAN"))].startswith("~")
    assert not rows["none"].startswith("~") and rows["full"].startswith("~")
    assert "\n~ extrapolated to" in table.caption


def test_the_full_depth_report_is_the_line_through_two_copies_and_the_fitted_peak():
    fit = depth.DepthFit(8, (2, 3), 5000, "backward, layer 0", residual_bytes=0, sections=3)
    at = lambda d, **kw: memory_report(
        argument_bytes=100 * d, output_bytes=10 * d, flops=7.0 * d, compile_seconds=d / 2, **kw
    )
    got = depth.extrapolate_report([at(2), at(3)], (2, 3), fit, 96, (10**6, None))
    # Per layer: 100 argument bytes, 10 output bytes, 7 FLOPs; 8 layers.
    assert (got.argument_bytes, got.output_bytes, got.flops) == (800, 80, 56.0)
    assert got.peak_bytes == 5000 + 96
    assert got.temp_bytes == 5096 - 800 - 80 + got.alias_bytes
    assert got.xla_peak_bytes is None
    # The time it took is both copies' compiles, 1 s and 1.5 s.
    assert got.compile_seconds == pytest.approx(2.5)
    assert got.meta["depth"]["layers"] == 8 and got.meta["depth"]["fragmentation_bytes"] == 96


@pytest.mark.parametrize("depths", [(2, 3), (2, 4), (3, 7)])
def test_the_line_through_two_copies_holds_at_any_two_depths(depths):
    # Figures 50 + 100 per layer (ints), 1.5 + 7 per layer (a float in a mapping): at 32
    # layers, by hand, 3250 and 225.5, whichever two depths the copies were compiled at.
    da, db = depths
    assert depth.line_at([50 + 100 * da, 50 + 100 * db], depths, 32) == 3250
    flops = [{"total": 1.5 + 7.0 * d, "loops": 0} for d in depths]
    assert depth.line_at(flops, depths, 32) == {"total": 225.5, "loops": 0}
    fit = depth.DepthFit(8, depths, 5000, "backward, layer 0", residual_bytes=0, sections=3)
    at = lambda d: memory_report(argument_bytes=100 * d + 40, output_bytes=10 * d, flops=7.0 * d)
    got = depth.extrapolate_report([at(da), at(db)], depths, fit, 96, (10**6, None))
    assert (got.argument_bytes, got.output_bytes, got.flops) == (840, 80, 56.0)  # 8 layers


@pytest.mark.parametrize(
    ("peak", "residual", "settles"),
    [
        (97_000, 0, True),  # 97,000 + 2,000 margin = 99,000 < 100,000
        (97_000, 999, True),  # 99,999: a byte to spare
        (97_000, 1_000, False),  # 100,000: the copies' error could reach the limit
        (97_000, 3_000, False),
        (90_000, 3_000, True),  # 95,000: far enough under, residual and all
        # No residual recorded (a depth meta without one): none, to the byte (seed 94's
        # _depth.py:511 read it as 1 byte).
        (97_999, None, True),
        (98_000, None, False),
    ],
)
def test_a_verdict_from_copies_settles_only_clear_of_the_limit_by_margin_and_residual(
    peak, residual, settles
):
    # A limit of 100,000 bytes: VERIFY_MARGIN (2%) is 2,000 bytes, and the fit's residual
    # (how far the copies sat off their lines) widens that band, never narrows it.
    assert depth.VERIFY_MARGIN == 0.02
    limit = 100_000
    recorded = {} if residual is None else {"residual_bytes": residual}
    guess = memory_report(peak_bytes=peak).replace(
        meta={"depth": {"mode": "extrapolated", "layers": 8, **recorded}}
    )
    assert depth.settled(guess, limit) is settles
    calls = []
    got = depth.verify(guess, lambda: calls.append(1) or memory_report(peak_bytes=peak), limit)
    # An unsettled verdict is compiled whole (once); a settled one stays the copies'.
    assert (calls, got is guess) == (([], True) if settles else ([1], False))


def test_verify_keeps_what_was_not_extrapolated_and_records_the_error():
    r = memory_report(peak_bytes=1000)
    assert depth.verify(r, lambda: pytest.fail("compiled"), always=True) is r
    guess = r.replace(meta={"depth": {"mode": "extrapolated", "layers": 8}})
    far = depth.verify(guess, lambda: pytest.fail("compiled"), limit=10_000)
    assert far is guess
    over = depth.verify(guess, lambda: memory_report(peak_bytes=700), limit=900)
    assert over.peak_bytes == 700  # a "does not fit" from copies is compiled whole
    got = depth.verify(guess, lambda: memory_report(peak_bytes=800), limit=1010)
    assert got.peak_bytes == 800
    assert got.meta["depth"] == {
        "mode": "verified",
        "layers": 8,
        "extrapolated_peak_bytes": 1000,
        "peak_error": 0.25,
        "extrapolated_compile_seconds": guess.compile_seconds,
    }


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["none", "full"])
def test_flops_of_an_unrolled_stack_come_from_its_copies_exactly(factory, policy):
    none = rk.schedules.parse_schedule("none")
    step = factory.build_step(rk.policy(policy), none, CONFIG, rk.target("h100")).step
    whole = rk.count_flops(step.fn, *step.args)  # the full-depth trace
    got = sources.step_flop_count(factory, policy, "h100", CONFIG)
    assert got.total == pytest.approx(whole.total, rel=1e-9)
    assert got.matmul == pytest.approx(whole.matmul, rel=1e-9)
    assert got.other == pytest.approx(whole.other, rel=1e-9)
    # Tags name layers by index: they are traced at full depth.
    traced = tags_in(jax.make_jaxpr(step.loss_fn)(*step.loss_args))
    assert set(sources.tags(factory, CONFIG, "h100")) == set(traced)
    assert "layers_7/mixer" in traced


@pytest.mark.slow
def test_policies_that_match_a_copys_tags_skip_the_full_depth_tag_trace(factory, monkeypatch):
    # minimal saves the projections of every layer, which the 3-layer copy has
    def full_depth_trace(*args, **kwargs):
        raise AssertionError("the tags were traced at full depth")

    monkeypatch.setattr(sources._tag_checks, "tags", full_depth_trace)
    sources.check_policies(factory, CONFIG, "h100", ["minimal", "names:save=layers_1/mixer"])
    kept, skipped = sources.usable_policies(
        factory, CONFIG, "h100", ["minimal", "dots_no_batch"], given=False
    )
    assert [p.spec for p in kept] == ["minimal", "dots_no_batch"] and skipped == []


@pytest.mark.slow
def test_a_name_only_a_later_layer_has_is_checked_against_the_whole_model(factory):
    # layers_7 lies past the copies (2 and 3 layers): the whole model's tags decide
    sources.check_policies(factory, CONFIG, "h100", ["names:save=layers_7/mixer"])
    with pytest.raises(BadValue, match="layers_7/mixer"):  # a typo lists the model's tags
        sources.check_policies(factory, CONFIG, "h100", ["names:save=layers_9/mixer"])
    kept, skipped = sources.usable_policies(
        factory, CONFIG, "h100", ["names:save=layers_7/mixer", "context"], given=False
    )
    assert [p.spec for p in kept] == ["names:save=layers_7/mixer"] and skipped == ["context"]


@pytest.mark.parametrize(("depths", "peak"), [((2, 3), 180), ((3, 4), 180), ((2,), None)])
def test_two_copies_are_enough_for_a_line_and_one_is_not(depths, peak):
    """Each section grows by 10 bytes a layer: two depths fix the line (the peak at 8 layers
    is 100 + 10 * 8 for the first layer's backward section); one depth fixes nothing."""
    secs = {
        d: {depth.Section("backward", "layer", k): 100 + 10 * d - k for k in range(d)}
        for d in depths
    }
    fit = depth.fit_sections(secs, layers=8)
    assert (fit.peak_live_bytes if fit is not None else None) == peak


@pytest.mark.parametrize(
    ("residual", "affine"), [(0, True), (4_999, True), (5_000, True), (5_001, False)]
)
def test_copies_off_their_lines_by_more_than_half_a_percent_of_the_peak_are_not_extrapolated(
    residual, affine
):
    # 0.5% of a 1,000,000-byte peak is 5,000 bytes (depth.AFFINE_TOLERANCE).
    fit = depth.DepthFit(8, (2, 3), 1_000_000, "backward, layer 0", residual, 4)
    assert fit.affine is affine


def _step_time(d):
    """A copy's predicted step time at ``d`` layers: 1 s + 0.5 s a layer, 3 kernels a layer."""
    return step_time(
        1.0 + 0.5 * d,
        matmul_seconds=0.4 * d,
        attention_seconds=0.1 * d,
        memory_seconds=1.0,
        model_flops=6.0 * d,
        flops=6.0 * d,
        kernels=3 * d,
        device="h100",
        peak_flops=1e15,
    )


@pytest.mark.parametrize("timed", ["both", "shallow only", "deep only", "neither"])
def test_the_step_time_is_the_line_through_both_copies_and_absent_unless_both_have_one(timed):
    """At 8 layers, by hand: 5 s, 3.2 s of matmuls, 24 kernels; a copy without a prediction
    (no rates for its target) makes none: the deep copy's was the full step's before (screen
    97: _depth.py:272 ``and`` read as ``or``, ``is not`` as ``is``)."""
    fit = depth.DepthFit(8, (2, 3), 5000, "backward, layer 0", residual_bytes=0, sections=3)
    has = {"both": (2, 3), "shallow only": (2,), "deep only": (3,), "neither": ()}[timed]
    at = lambda d: memory_report(step_time=_step_time(d) if d in has else None)
    got = depth.extrapolate_report([at(2), at(3)], (2, 3), fit, 0, (10**6, None))
    if timed != "both":
        assert got.step_time is None
        return
    st = got.step_time
    assert (st.seconds, st.matmul_seconds, st.kernels) == pytest.approx((5.0, 3.2, 24))
    assert st.device == "h100" and st.memory_seconds == 1.0
