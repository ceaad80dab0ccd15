"""A source's steps measured and searched (remat_kit.sources._steps), with the compiles made by
hand: what ``measure``'s depth modes compile, and what a Workload keeps of its source."""

from __future__ import annotations

import dataclasses
import types

import pytest

import remat_kit as rk
from helpers import memory_report
from remat_kit.flops import FlopCount
from remat_kit.schedules import NO_SCHEDULE
from remat_kit.sources import _steps as steps
from remat_kit.sources._source import ModelSource

UNTAGGED = "tests/data/factories.py:untagged"  # a small linen model: built, never compiled here
CONFIG = rk.TrainConfig(batch=2, seq=16)


@pytest.mark.parametrize(
    ("depth", "whole"),
    [
        ("estimate", False),  # the copies' figures whatever the verdict (a search's probe)
        ("auto", True),  # a verdict over the limit is compiled whole
        ("check", True),  # always both
    ],
)
def test_a_verdict_from_copies_over_the_limit_is_compiled_whole_except_for_an_estimate(
    monkeypatch, depth, whole
):
    h100 = rk.target("h100")
    over = 2 * h100.usable_bytes  # the copies say it does not fit: not a settled verdict
    copies = memory_report(peak_bytes=over)
    compiled = []

    def by_depth(source, pol, sch, t, config, compile_step):
        return copies, {"mode": "extrapolated"}

    def full_compile(fn, *args, **kw):
        compiled.append(kw["policy"])
        return memory_report(peak_bytes=over + 1)

    monkeypatch.setattr(steps, "by_depth", by_depth)
    monkeypatch.setattr(steps, "memory_report", full_compile)
    src = rk.sources.from_factory(UNTAGGED)
    # meta: nothing remembered on disk answers in place of these compiles
    got = steps.measure(src, "full", h100, CONFIG, warn=False, depth=depth, meta={"t": depth})
    assert len(compiled) == (1 if whole else 0)
    assert got.peak_bytes == (over + 1 if whole else over)
    assert got.meta["depth"]["mode"] == ("verified" if whole else "extrapolated")


class _TrainerRemats(ModelSource):
    remat_always = True  # as MaxText's trainer: no setting without a checkpoint


@pytest.mark.parametrize("always", [False, True])
def test_a_workload_keeps_whether_its_sources_trainer_always_remats(always):
    # plan never compiles `none` for a model whose trainer always checkpoints.
    src = rk.sources.from_factory(UNTAGGED)
    if always:
        src = _TrainerRemats(**{f.name: getattr(src, f.name) for f in dataclasses.fields(src)})
    assert src.remat_always is always
    assert rk.sources.workload(src, "h100", CONFIG).remat_always is always


class _Plan:
    """A mesh plan that splits the batch ``data_size`` ways."""

    def __init__(self, ways):
        self.data_size = ways


class _Door(rk.sources.StepSource):
    """A source made by hand for the door: each answer it gives is named after its input."""

    spec = "door"
    remat_always = True

    def __init__(self, ways=1, kinds=frozenset({"none", "layers"})):
        self.ways, self.kinds, self.checked = ways, kinds, []

    @property
    def schedule_kinds(self):
        return self.kinds

    def n_layers(self):
        return 6

    def check(self, config, target):
        self.checked.append((config, target.name))

    def mesh_plan(self, target):
        return _Plan(self.ways) if self.ways > 1 else None

    def label(self, config, target):
        return f"door s{config.seq}"

    def sequences_per_step(self, config, target):
        return 3 * config.batch  # its own accumulation trains three times the batch


@pytest.mark.parametrize(
    ("depth", "probes", "ways", "accum", "strict", "label"),
    [
        ("auto", "estimate", 1, 1, False, None),
        ("full", "full", 2, 1, True, "mine"),
        ("check", "check", 1, 4, False, None),
        ("estimate", "estimate", 4, 2, True, None),
    ],
)
def test_the_door_hands_each_callback_the_source_target_and_config_at_its_batch(
    monkeypatch, depth, probes, ways, accum, strict, label
):
    calls = []

    def record(name):
        def fn(*args, **kw):
            calls.append((name, args, kw))
            if name == "measure":
                return memory_report(policy=args[1].spec)
            if name == "breakdown":
                return {"weights": 1}
            return FlopCount(1.0, 1.0, 0.0, 0.0) if name == "step_flop_count" else (name, args)

        return fn

    for name in ("measure", "step_flop_count", "residuals", "breakdown"):
        monkeypatch.setattr(steps, name, record(name))
    judged = []

    def verify_search(report, compile_full, limit):
        judged.append((report, limit))
        return compile_full()

    monkeypatch.setattr(steps, "verify_search", verify_search)
    src, t = _Door(ways), rk.target("h100")
    config = rk.TrainConfig(batch=4, seq=16, accum=accum)
    w = rk.sources.workload(src, t, config, strict=strict, label=label, depth=depth)
    at = lambda b, seq=16: dataclasses.replace(config, batch=b, seq=seq)
    assert src.checked == [(config, t.name)]
    assert (w.seq, w.batch, w.n_layers, w.batch_multiple) == (16, 4, 6, accum * ways)
    assert (w.label, w.remat_always, w.schedule_kinds) == (label or "door s16", True, src.kinds)
    assert w.tokens(8) == 3 * 8 * 16

    full, none = rk.policies.as_policy("full"), rk.policies.as_policy("none")
    probe = w.report(full, batch=8)
    assert calls[-1] == (
        "measure",
        (src, full, t, at(8)),
        {"schedule": NO_SCHEDULE, "strict": strict, "warn": False, "depth": probes},
    )
    w.traced_count(none, NO_SCHEDULE, 8)
    assert calls[-1] == ("step_flop_count", (src, none, t, at(8), NO_SCHEDULE), {})
    # One device's share of the batch, never below the smallest batch the source takes.
    for batch in (8, 1):
        w.residuals(full, batch=batch)
        share = max(accum, batch // ways)
        assert calls[-1] == ("residuals", (src, full, t, at(share), NO_SCHEDULE), {})
    assert w.breakdown(8) == {"weights": 1}
    assert calls[-1] == ("breakdown", (src, at(8), t), {})
    # A final answer is the step compiled whole, asked of the same source.
    got = w.verified(full, NO_SCHEDULE, 8, limit=123)
    assert judged == [(probe, 123)]
    assert calls[-1] == (
        "measure",
        (src, full, t, at(8)),
        {"schedule": NO_SCHEDULE, "strict": strict, "warn": False, "depth": "full"},
    )
    assert got.policy == "full"
    # Another sequence: the same source, target and options.
    longer = w.at(seq=32)
    assert (longer.seq, longer.label, longer.batch) == (32, label or "door s32", 4)
    longer.report(full, batch=4)
    assert calls[-1] == (
        "measure",
        (src, full, t, at(4, 32)),
        {"schedule": NO_SCHEDULE, "strict": strict, "warn": False, "depth": probes},
    )


def test_a_source_without_per_layer_plans_is_searched_as_one_layer():
    w = rk.sources.workload(_Door(kinds=frozenset({"none"})), "h100", CONFIG)
    assert w.n_layers == 1 and w.schedule_kinds == frozenset({"none"})


@pytest.mark.parametrize(("label", "want"), [(None, "by hand"), ("mine", "mine")])
def test_a_measured_step_takes_the_config_s_batch_sequence_and_accumulation(label, want):
    m = rk.sources.Measured(
        lambda *a: None,
        lambda *a: 1.0,
        residuals_fn=lambda *a: "r",
        breakdown_fn=lambda b: {},
        verify_fn=lambda *a: None,
        n_layers=5,
        schedule_kinds=frozenset({"none"}),
        label="by hand",
    )
    w = rk.sources.workload(m, "a100", rk.TrainConfig(batch=6, seq=24, accum=3), label=label)
    assert (w.target.name, w.seq, w.batch, w.batch_multiple, w.n_layers) == (
        rk.target("a100").name,
        24,
        6,
        3,
        5,
    )
    assert (w.label, w.schedule_kinds, w.remat_always, w.source) == (
        want,
        frozenset({"none"}),
        False,
        m,
    )
    # Its callbacks are what the workload asks: the batch as given, no other sequence.
    assert (w.residuals("full", batch=3), w.breakdown(3), w.plannable, w.estimates) == (
        "r",
        {},
        True,
        True,
    )
    with pytest.raises(rk.errors.BadValue, match="for seq=24 only"):
        w.at(seq=48)


class _PlanOf:
    """A mesh plan over ``data`` devices (what the labels of a sharded step read)."""

    def __init__(self, data):
        self.data_size, self.spec = data, f"fsdp:{data}"


class _Built(rk.sources.StepSource):
    """A source whose steps are made by hand: nothing is traced or compiled."""

    spec = "built.py:m"

    def __init__(self, plan=None, loss_given=True, times=1):
        self.plan, self.loss_given, self.times = plan, loss_given, times
        self.calls = []

    @property
    def schedule_kinds(self):
        return frozenset({"none", "every"})

    def check(self, config, target):
        self.calls.append("check")

    def build_step(self, policy, schedule, config, target, *, sharded=True):
        self.calls.append(("build", policy.spec, schedule.spec, config.batch, sharded))
        step = types.SimpleNamespace(
            fn=len,
            args=("a", "b"),
            donate_argnums=(1,),
            in_shardings=("in",) if self.plan else None,
            out_shardings=("out",) if self.plan else None,
            precision={"params": "float32"},
            plan=self.plan,
            loss_given=self.loss_given,
        )
        return steps.SourceStep(step, policy, schedule, "xla", {"layers": 8, "params": 12})

    def check_step(self, built, what):
        self.calls.append(("check_step", what))

    def mesh_plan(self, target):
        return self.plan

    def sequences_per_step(self, config, target):
        return self.times * config.batch


@pytest.mark.parametrize("seed", range(4))
def test_measure_runs_the_steps_the_contract_names_for_random_requests(monkeypatch, seed):
    import random

    rng = random.Random(seed)
    done = []

    def note(name, result=None):
        def fn(*args, **kw):
            done.append((name, args, kw))
            return result(*args, **kw) if result else args[0]

        return fn

    def compiled(fn, *args, **kw):
        done.append(("compile", args, kw))
        return memory_report(host_bytes=host, policy=kw["policy"].spec, meta=kw["meta"])

    monkeypatch.setattr(steps, "memory_report", compiled)
    monkeypatch.setattr(steps, "add_breakdown", note("breakdown"))
    monkeypatch.setattr(steps, "add_measured_breakdown", note("measured_breakdown"))
    monkeypatch.setattr(steps, "_with_offload_estimate", note("offload_estimate"))
    monkeypatch.setattr(steps, "check_policies", note("check_policies"))
    monkeypatch.setattr(steps, "_expert_notes", note("expert_notes", lambda *a: ()))
    monkeypatch.setattr(
        steps, "residuals", note("residuals", lambda *a: types.SimpleNamespace(marked_bytes=5))
    )
    # XLA carried out part of the marked copies: its note joins the report's.
    short = rk.notes.Note("offload_shortfall", {"moved_bytes": 1, "marked_bytes": 5})
    monkeypatch.setattr(steps.checks, "offload_shortfall", note("shortfall", lambda *a: short))
    monkeypatch.setattr(steps, "_remembered", note("remembered", lambda *a, **k: a[4]()))
    for _ in range(25):
        depth = rng.choice(["auto", "full", "check", "estimate"])
        measured = rng.random() < 0.3
        plan = _PlanOf(2) if rng.random() < 0.3 else None
        if measured:
            plan = None  # a measured breakdown of a sharded step is refused (below)
        devices = 2 if plan else rng.choice([1, 2])
        policy = rng.choice(["full", "none", "dots_no_batch", "offload_dots_no_batch"])
        baseline = rng.choice([None, 0.0, 2.0])
        host = rng.choice([0, 64])
        meta = rng.choice([None, {"run": 1}])
        loss_given = rng.random() < 0.8
        src = _Built(plan, loss_given, times=rng.choice([1, 3]))
        t = rk.target("h100", devices=devices)
        config = rk.TrainConfig(batch=4, seq=16, accum=rng.choice([1, 2]))
        # The copies answer (a report), or say compile whole (None) with a reason.
        copies = memory_report(policy=policy, meta={}) if rng.random() < 0.5 else None
        record = {"mode": "extrapolated"} if copies is not None else rng.choice([{}, {"x": 1}])
        monkeypatch.setattr(
            steps, "by_depth", note("by_depth", lambda *a, c=copies, r=record: (c, dict(r)))
        )
        monkeypatch.setattr(steps, "verify", note("verify"))
        done.clear()
        strict = rng.random() < 0.3
        got = steps.measure(
            src,
            policy,
            t,
            config,
            baseline=baseline,
            measured_breakdown=measured,
            meta=meta,
            depth=depth,
            strict=strict,
            warn=False,
        )
        names = [d[0] for d in done]
        pol = rk.policies.as_policy(policy)
        # Remembered on disk unless labelled by the caller.
        assert ("remembered" in names) is (not meta)
        if not meta:
            # Remembered under everything that changes the report (seed-88 mutant
            # _steps.py:142: a report with a baseline answered one asked without).
            (_, args, kw) = done[names.index("remembered")]
            assert args[0] == "report" and args[1] is src and args[2] == t
            assert kw == {
                "policy": pol.spec,
                "schedule": "none",
                "baseline": baseline,
                "measured_breakdown": measured,
                "depth": depth,
            }
        assert ("check_policies" in names) is strict and src.calls[0] == "check"
        read = depth != "full" and not measured
        assert ("by_depth" in names) is read
        from_copies = read and copies is not None
        assert ("verify" in names) is (from_copies and depth != "estimate")
        if from_copies and depth != "estimate":
            (_, _, kw) = done[names.index("verify")]
            assert kw == {"always": depth == "check"}
        compiles = [d for d in done if d[0] == "compile"]
        assert len(compiles) == (0 if from_copies else 1)
        if compiles:
            (_, args, kw) = compiles[0]
            labels = kw["meta"]
            want = {
                "model": "built.py:m",
                "batch": src.times * 4,
                "seq": 16,
                "optimizer": config.optimizer,
                "accum": config.accum,
                "precision": {"params": "float32"},
                "tokens_per_step": src.times * 4 * 16,
                "layers": 8,
                "params": 12,
            }
            if plan:
                want.update(mesh="fsdp:2", devices=2, hosts=t.hosts, batch_per_device=2)
            assert {k: labels[k] for k in want} == want
            assert set(labels) - set(want) <= {"remat_impl", "run"}
            assert labels.get("run") == (meta or {}).get("run")
            assert args == ("a", "b") and kw["donate_argnums"] == (1,) and kw["schedule"] == "none"
            assert kw["in_shardings"] == (("in",) if plan else None)
            assert kw["out_shardings"] == (("out",) if plan else None)
            assert kw["attention"] == "xla" and kw["target"] is t and kw["warn"] is False
            assert kw["dump_to"] is None
        # What the copies decided is said, whether or not they answered.
        decided = record if read else {}
        assert got.meta["depth"] == decided if decided else "depth" not in got.meta
        assert ("measured_breakdown" in names) is measured
        assert ("breakdown" in names) is (not measured)
        assert (got.meta.get("recompute_overhead") is not None) is bool(baseline)
        if baseline:
            assert got.meta["recompute_overhead"] == got.flops / baseline - 1
        offloads = pol.offloads
        assert ("offload_estimate" in names) is bool(offloads and got.host_bytes)
        one_device = plan is None and devices == 1 and loss_given
        assert ("residuals" in names) is bool(offloads and one_device)
        assert (short in got.notes) is bool(offloads and one_device)
        # A policy that keeps (or offloads) products: the experts' notes are asked for.
        assert ("expert_notes" in names) is ("dots" in policy)
    with pytest.raises(rk.errors.BadValue, match="a measured breakdown reads one unsharded"):
        steps.measure(
            _Built(_PlanOf(2)),
            "full",
            rk.target("h100", devices=2),
            CONFIG,
            measured_breakdown=True,
        )


def _counting(monkeypatch):
    """``count_flops`` made by hand: a step's FLOPs are its first argument's (no trace)."""
    counted = []

    def count(fn, *args):
        counted.append(args[0])
        return FlopCount(float(args[0]), 2.0 * args[0], 1.0, 0.5)

    monkeypatch.setattr(steps, "count_flops", count)
    return counted


class _Deep(_Built):
    """A stack whose steps count ``100 + 10 * layers`` FLOPs, with copies at any depth."""

    def __init__(self, layers=32, copies=True):
        super().__init__()
        self.layers, self.copies = layers, copies

    def n_layers(self):
        return self.layers

    def build_step(self, policy, schedule, config, target, *, sharded=True):
        built = super().build_step(policy, schedule, config, target, sharded=sharded)
        step = dataclasses.replace(built, step=types.SimpleNamespace(**vars(built.step)))
        step.step.fn, step.step.args = len, (100 + 10 * self.layers,)
        return step


@pytest.mark.parametrize("copies", [True, False])
@pytest.mark.parametrize("policy", ["full", "custom"])
def test_a_stack_s_flops_are_the_line_through_its_copies_and_remembered_unless_custom(
    monkeypatch, copies, policy
):
    counted = _counting(monkeypatch)
    remembered = []

    def remember(kind, source, t, config, compute, **request):
        remembered.append((kind, request))
        return compute()

    monkeypatch.setattr(steps, "_remembered", remember)
    src = _Deep(32)
    copied = [_Deep(2), _Deep(3)] if copies else None
    monkeypatch.setattr(steps, "shallow_copies", lambda s, sch, t: copied)
    pol = rk.policies.as_policy(lambda *a, **k: True) if policy == "custom" else policy
    got = steps.step_flop_count(src, pol, "h100", CONFIG, "none")
    # 100 + 10 d FLOPs at 2 and 3 layers: the line gives 420 at 32, as the whole model has.
    assert got == FlopCount(420.0, 840.0, 1.0, 0.5)
    assert counted == ([120, 130] if copies else [420])
    built = [c for s in (copied or [src]) for c in s.calls if c[0] == "build"]
    assert all(c[-1] is False for c in built)  # traced unsharded
    if policy == "custom":
        assert remembered == []  # a callable has no spec to remember it by
    else:
        assert remembered == [("flop_count", {"policy": "full", "schedule": "none"})]
    assert steps.step_flops(src, pol, "h100", CONFIG) == 420.0


@pytest.mark.parametrize(
    ("counted", "link_bound", "estimate"),
    [(150.0, True, True), (80.0, False, True), (150.0, True, False)],
)
def test_an_offload_is_priced_against_recomputing_what_it_moves(
    monkeypatch, counted, link_bound, estimate
):
    from remat_kit.analysis import TransferEstimate

    _counting(monkeypatch)
    asked = []

    def transfer_estimate(report, t, extra):
        asked.append((report, t.name, extra))
        return TransferEstimate(64, 2.0, 1.0, 1.5, link_bound) if estimate else None

    monkeypatch.setattr(steps, "transfer_estimate", transfer_estimate)

    class Offloaded(_Built):
        def build_step(self, policy, schedule, config, target, *, sharded=True):
            built = super().build_step(policy, schedule, config, target, sharded=sharded)
            built.step.args = (counted,)
            return built

    src, t = Offloaded(), rk.target("h100")
    report = memory_report(flops=100.0, host_bytes=64, policy="offload_dots_no_batch")
    pol = rk.policies.as_policy("offload_dots_no_batch")
    got = steps._with_offload_estimate(report, src, pol, NO_SCHEDULE, CONFIG, t)
    # The same step with the offloaded tensors recomputed: traced unsharded, under ours.
    ((_, spec, sch, _, sharded),) = [c for c in src.calls if c[0] == "build"]
    assert spec == rk.policies.recompute_instead(pol).spec and spec != pol.spec
    assert (sch, sharded) == ("none", False)
    assert asked == [(report, t.name, max(counted - 100.0, 0.0))]
    if not estimate:
        assert got is report
        return
    assert got.meta["offload_estimate"] == TransferEstimate(64, 2.0, 1.0, 1.5, link_bound)._asdict()
    kinds = [n.kind for n in got.notes]
    assert kinds == (["offload_link_bound"] if link_bound else [])
    if link_bound:
        assert dict(got.notes[0].data) == {
            "target": t.name,
            "host_bytes": 64,
            "transfer_seconds": 2.0,
            "step_compute_seconds": 1.5,
        }


@pytest.mark.parametrize("loss_given", [True, False])
def test_residuals_are_read_off_the_loss_of_one_unsharded_step(monkeypatch, loss_given):
    asked = []
    read = types.SimpleNamespace(tags=("mlp",))

    def saved(fn, *args, policy):
        asked.append((fn, args, policy.spec))
        return read

    monkeypatch.setattr(steps, "saved_residuals", saved)
    monkeypatch.setattr(
        steps.checks,
        "check_policy_matches",
        lambda pol, tags, where: asked.append(("matches", pol.spec, tags, where)),
    )

    class Loss(_Built):
        def build_step(self, policy, schedule, config, target, *, sharded=True):
            built = super().build_step(policy, schedule, config, target, sharded=sharded)
            built.step.loss_fn, built.step.loss_args = abs, (-3,)
            return built

    src = Loss(loss_given=loss_given)
    if not loss_given:
        with pytest.raises(rk.errors.BadValue, match=r"built\.py:m gave its step without its loss"):
            steps.residuals(src, "full", "h100", CONFIG)
        return
    assert steps.residuals(src, "full", "h100", CONFIG) is read
    # The policy it was built with is checked against the tags the loss holds, named so.
    assert asked == [(abs, (-3,), "full"), ("matches", "full", ("mlp",), "built.py:m")]
    assert [c for c in src.calls if c[0] == "build"] == [("build", "full", "none", 2, False)]


@pytest.mark.parametrize(
    ("batch", "accum", "ways", "smallest", "traced"),
    [(8, 2, 2, 1, 2), (8, 1, 8, 1, 1), (4, 1, 1, 3, 4), (4, 2, 4, 3, 3), (16, 4, 1, 1, 4)],
)
def test_the_experts_notes_trace_one_device_s_micro_batch_never_below_the_smallest(
    monkeypatch, batch, accum, ways, smallest, traced
):
    found = []
    # Notes made by hand: none for the ragged products, one for the experts'.
    monkeypatch.setattr(steps.checks, "ragged_dots_recomputed", lambda j: found.append(j))
    monkeypatch.setattr(steps.checks, "expert_dots_recomputed", lambda j: "expert note")

    class Experts(_Built):
        def smallest_batch(self, config, t):
            assert config.accum == 1
            return smallest

        def build_step(self, policy, schedule, config, target, *, sharded=True):
            built = super().build_step(policy, schedule, config, target, sharded=sharded)
            built.step.loss_fn, built.step.loss_args = (lambda x: x * 2.0), (1.0,)
            return built

    src = Experts()
    config = rk.TrainConfig(batch=batch, seq=16, accum=accum)
    pol = rk.policies.as_policy("dots_no_batch")
    got = steps._expert_notes(src, pol, NO_SCHEDULE, config, rk.target("h100"), ways, False)
    # One micro-batch of one device's share, unsharded, its forward pass traced once.
    assert [c for c in src.calls if c[0] == "build"] == [
        ("build", "dots_no_batch", "none", traced, False)
    ]
    assert len(found) == 1 and got == ("expert note",)
