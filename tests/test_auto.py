"""Remat decided in the run: ``rk.remat(Block, "auto")`` and ``rk.auto(step, budget=...)``.

The mark is checked against the same block wrapped with each policy by hand, through jax's
own ``saved_residuals`` (what the backward pass keeps) and the gradients; the decision
against bare compiles of the step with the decided policy applied, made here with jax alone
for the deviceless H100 (``jax.jit(step, donate_argnums=...).lower(...).compile()``).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import importlib.util
import logging
import subprocess
import sys
import warnings
from pathlib import Path

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

import remat_kit as rk
from remat_kit import marks
from remat_kit.analysis import nbytes
from remat_kit.autoplan import AutoPlan, Budget, decide
from remat_kit.errors import AutoOutsideStep, BadValue, BudgetOverDevice, DoesNotFit, NoAutoBlock
from remat_kit.targets import analysis_options

_SPEC = importlib.util.spec_from_file_location(
    "own_steps_for_auto", Path(__file__).parent / "data" / "own_steps.py"
)
own = sys.modules.setdefault(_SPEC.name, importlib.util.module_from_spec(_SPEC))
_SPEC.loader.exec_module(own)

H100 = rk.target("h100")
CATALOGUE = ("full", "dots_no_batch")  # the tests' competitors: two compiles, not three
POLICIES = ["none", "full", "names:save=mlpwi"]


# --- the mark -----------------------------------------------------------------------------------


class _Dense(nn.Module):
    @nn.compact
    def __call__(self, x, _=None):
        h = checkpoint_name(nn.Dense(32)(x), "mlpwi")
        y = x + nn.Dense(x.shape[-1])(jax.nn.gelu(h))
        return (y, None) if _ is not None or self.is_scan else y

    is_scan: bool = False


class _NNXBlock(nnx.Module):
    def __init__(self, rngs):
        self.up, self.down = nnx.Linear(8, 32, rngs=rngs), nnx.Linear(32, 8, rngs=rngs)

    def __call__(self, x):
        return x + self.down(jax.nn.gelu(checkpoint_name(self.up(x), "mlpwi")))


def _fn_block(w, x):
    return x + jnp.sin(checkpoint_name(x @ w, "mlpwi")) @ w.T


def _loss_of(form: str, policy: str | None):
    """(loss, params, x) of a two-block stack in ``form``, its blocks marked ``"auto"``
    (``policy`` None) or wrapped with ``policy`` by hand."""
    x = jnp.linspace(-1.0, 1.0, 2 * 8).reshape(2, 8)

    def wrap(block, **kw):
        return rk.remat(block, "auto" if policy is None else policy, **kw)

    if form == "linen":
        block = wrap(_Dense)

        class Stack(nn.Module):
            @nn.compact
            def __call__(self, x):
                return block(name="b1")(block(name="b0")(x))

        net = Stack()
        params = net.init(jax.random.key(0), x)
        return (lambda p, x: net.apply(p, x).sum()), params, x
    if form == "scan":
        block = wrap(_Dense, prevent_cse=False)

        class Scanned(nn.Module):
            @nn.compact
            def __call__(self, x):
                cls = nn.scan(
                    block,
                    variable_axes={"params": 0},
                    split_rngs={"params": True},
                    length=3,
                )
                return cls(is_scan=True, name="stack")(x, None)[0]

        net = Scanned()
        params = net.init(jax.random.key(0), x)
        return (lambda p, x: net.apply(p, x).sum()), params, x
    if form == "nnx":
        model = wrap(_NNXBlock)(nnx.Rngs(0))
        graph, state = nnx.split(model)
        return (lambda s, x: nnx.merge(graph, s)(x).sum()), state, x
    block = wrap(_fn_block)
    w = jnp.linspace(0.0, 1.0, 8 * 8).reshape(8, 8)
    return (lambda w, x: block(w, block(w, x)).sum()), w, x


def _kept(loss, params, x):
    """What jax's own saved_residuals says the backward pass keeps: shapes, sorted (jax 0.12
    keeps it in jax._src, behind print_saved_residuals)."""
    from jax._src.ad_checkpoint import saved_residuals

    return sorted(str(aval) for aval, _ in saved_residuals(loss, params, x))


@pytest.mark.parametrize(
    ("form", "policy"),
    [(f, p) for f in ("linen", "nnx", "function") for p in POLICIES]
    + [("scan", "names:save=mlpwi")],  # a scanned stack traces slowly: one policy
)
def test_an_auto_block_keeps_what_the_scope_policy_keeps(form, policy):
    """Under ``auto_as(policy)`` a marked block keeps what the block wrapped with ``policy``
    by hand keeps, and its gradients are those of no remat."""
    loss, params, x = _loss_of(form, None)
    by_hand, _, _ = _loss_of(form, policy)
    with marks.auto_as(policy) as scope:
        kept = _kept(loss, params, x)
        grads = jax.grad(loss)(params, x)
    assert scope.marked  # the block read the scope
    assert kept == _kept(by_hand, params, x)
    with marks.auto_as("none"):
        chex.assert_trees_all_close(grads, jax.grad(loss)(params, x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("form", ["linen", "nnx", "function"])
def test_the_scope_policy_changes_what_is_kept(form):
    """The block did something: ``full`` keeps less than ``none`` (a mark applying no policy
    would keep the same)."""
    loss, params, x = _loss_of(form, None)
    with marks.auto_as("none"):
        none = _kept(loss, params, x)
    with marks.auto_as("full"):
        full = _kept(loss, params, x)
    assert len(full) < len(none)


@pytest.mark.parametrize("form", ["linen", "scan", "nnx", "function"])
def test_an_auto_block_traced_outside_a_step_wrapper_is_refused(form):
    loss, params, x = _loss_of(form, None)  # a linen init needs no policy: it runs
    with pytest.raises(AutoOutsideStep) as err:
        jax.grad(loss)(params, x)
    assert err.value.block in {"_Dense", "_NNXBlock", "_fn_block"}
    assert "\n" not in str(err.value)


def test_the_decorator_form_marks_too():
    @rk.remat("auto")
    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(4)(x)

    assert Block.__name__ == "AutoBlock"
    params = Block().init(jax.random.key(0), jnp.ones((1, 4)))
    with pytest.raises(AutoOutsideStep):
        Block().apply(params, jnp.ones((1, 4)))


# --- budgets ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "form", "expected"),
    [
        ("fits", "fits", 63763906560),  # 0.75 of the H100's 85018542080 bytes
        ("50GiB", "bytes", 50 * 2**30),
        (2**30, "bytes", 2**30),
        (0.8, "fraction", int(0.8 * 63763906560)),
        ("50%", "fraction", int(0.5 * 63763906560)),
    ],
)
def test_a_budget_form_is_the_bytes_it_stands_for(given, form, expected):
    b = Budget.of(given)
    assert b.form == form
    assert b.bytes_on(H100) == expected


def test_an_activation_budget_is_the_fixed_parts_and_a_share_of_the_rest():
    b = Budget.of(activations=0.25)
    assert b.bytes_on(H100, none_peak=10_000, fixed=2_000) == 2_000 + 2_000
    assert Budget.of(activations=0).bytes_on(H100, none_peak=10_000, fixed=2_000) == 2_000


@pytest.mark.parametrize(
    ("given", "over_device"), [("80GiB", True), ("60GiB", False), ("63763906561B", False)]
)
def test_a_budget_over_what_the_device_gives_is_one_line_with_data(given, over_device):
    """80 GiB is over the H100's memory; 60 GiB under it but over the 59.38 GiB a process
    may allocate: both refused, each saying which."""
    with pytest.raises(BudgetOverDevice) as err:
        Budget.of(given).bytes_on(H100)
    e = err.value
    assert (e.usable_bytes, e.device_bytes) == (63763906560, 85018542080)
    assert e.budget_bytes == Budget.of(given).value
    assert ("than the device" in str(e)) is over_device
    assert "\n" not in str(e)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"budget": "fits", "activations": 0.5},
        {"activations": 1.5},
        {"budget": 1.5},
        {"budget": "lots"},
        {"budget": "fits", "loss_fn": lambda p: p},  # no loss_argnums
    ],
)
def test_a_budget_that_cannot_be_read_is_refused_when_wrapping(kwargs):
    with pytest.raises(BadValue):
        rk.auto(lambda p: p, **kwargs)


# --- the wrapper, without compiling -------------------------------------------------------------


def _sgd_step(loss_fn):
    tx = optax.sgd(1e-3)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step, tx


def test_a_step_with_no_auto_block_is_refused_before_any_compile(no_compile):
    loss, params, x = _loss_of("linen", "full")  # wrapped by hand: nothing marked
    step, tx = _sgd_step(loss)
    wrapped = rk.auto(step, "fits", target="h100")
    with pytest.raises(NoAutoBlock) as err:
        wrapped(params, tx.init(params), x)
    assert err.value.step == "train_step" and "\n" not in str(err.value)


def test_no_target_and_no_gpu_is_refused(no_compile):
    loss, params, x = _loss_of("linen", None)
    step, tx = _sgd_step(loss)
    with pytest.raises(BadValue) as err:
        rk.auto(step, "fits")(params, tx.init(params), x)
    assert err.value.param == "target"


def _fake_plan(policy: str) -> AutoPlan:
    return AutoPlan(policy, "catalogue", "h100-80gb", "fits", 1, 1, 0, None, None, 1, None,
                    None, None, 1, 0.0, "0" * 64)  # fmt: skip


def test_a_new_shape_decides_anew_and_the_oldest_is_dropped_with_one_warning(monkeypatch):
    """Each shape is decided once (a shape seen again is not decided again); past
    max_shapes the least recently used is dropped and a RematWarning says so once."""
    asked = []

    def decide(fn, args, **kw):
        asked.append(args[1].shape[0])
        return _fake_plan("full" if args[1].shape[0] % 2 else "none")

    monkeypatch.setattr("remat_kit.autoplan._step.decide", decide)
    loss, params, _ = _loss_of("function", None)
    step = rk.auto(lambda w, x: jax.grad(loss)(w, x), "fits", target="h100", max_shapes=2)
    for n in (1, 2, 1):
        step(params, jnp.ones((n, 8)))
    assert asked == [1, 2] and step.plan.policy == "full"
    with pytest.warns(rk.RematWarning, match="new argument shape"):
        step(params, jnp.ones((3, 8)))  # drops 2, the least recently used
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(params, jnp.ones((2, 8)))  # decided again (dropped), no second warning
    assert asked == [1, 2, 3, 2]
    assert [p.policy for p in step.plans] == ["full", "none"]


# --- shardings as the user's own jax.jit gives them ------------------------------------------


def _host_jitted(**shardings):
    """A marked step jitted by the user with ``shardings`` (pinned host memory: on the CPU's
    one device the only sharding whose effect shows), and its abstract arguments."""
    block = rk.remat(lambda w, x: jnp.tanh(w * x), "auto")
    fn = jax.jit(lambda w, x: (block(w, x), x.sum()), **shardings)
    return fn, jax.ShapeDtypeStruct((4,), jnp.float32)


def test_the_users_jit_shardings_are_the_decided_steps(monkeypatch):
    """in_shardings and out_shardings read off the user's jax.jit, as jax compiles that jit."""
    monkeypatch.setattr("remat_kit.autoplan._step.decide", lambda *a, **kw: _fake_plan("full"))
    d = jax.devices()[0]
    host = jax.sharding.SingleDeviceSharding(d, memory_kind="pinned_host")
    fn, x = _host_jitted(in_shardings=(host, None), out_shardings=(host, None))
    with marks.auto_as("full"):
        want = fn.lower(x, x).compile()  # the user's jit, compiled by jax alone
    got = rk.auto(fn, "fits", target="h100").lower(x, x).compile()
    assert got.input_shardings == want.input_shardings
    assert got.output_shardings == want.output_shardings
    assert got.output_shardings[0].memory_kind == "pinned_host"
    fn, _ = _host_jitted(out_shardings=(host, None))
    out = rk.auto(fn, "fits", target="h100")(jnp.ones(4), jnp.ones(4))
    assert [o.sharding.memory_kind for o in out] == ["pinned_host", "device"]


def test_a_sharding_given_in_the_jit_and_as_an_option_is_refused():
    host = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
    fn, _ = _host_jitted(out_shardings=(host, None))
    with pytest.raises(BadValue, match=r"out_shardings from the step's jax\.jit and as an"):
        rk.auto(fn, "fits", target="h100", out_shardings=None)
    rk.auto(fn, "fits", target="h100", in_shardings=None)  # each given once: taken


# A step sharded over several devices is planned for that many devices of the target:
# tests/test_auto_sharded.py.


def test_a_challenger_replaces_the_plan_only_where_it_fits_and_is_faster():
    """After the planner, each challenger recomputing less is compiled, and the fastest of
    those under the limit replaces the plan; one recomputing as much is not compiled."""
    from types import SimpleNamespace

    from remat_kit.autoplan._decide import _challenged

    # policy -> (traced recompute, compiled peak, predicted overhead)
    table = {"dots": (0.1, 900, 0.02), "megatron": (0.2, 1100, 0.01), "qkv_proj": (0.5, 10, 0.0)}
    compiled = []

    class W:
        def recompute_of(self, pol, sch, batch):
            return table[pol.spec][0]

        def compiled(self, pol, sch, batch):
            compiled.append(pol.spec)
            return SimpleNamespace(
                peak_bytes=table[pol.spec][1], host_temp_bytes=0, host_bytes=0, policy=pol
            )

        def overhead_of(self, r, batch):
            return table[r.policy.spec][2]

    plan = SimpleNamespace(policy=rk.policy("minimal"), recompute_overhead=0.3, overhead=0.05,
                           candidates=())  # fmt: skip
    got, cands = _challenged(W(), plan, 1000, ["full"], ["qkv_proj", "megatron", "dots"])
    assert compiled == ["megatron", "dots"]  # qkv_proj recomputes more than the plan: skipped
    assert got.policy.spec == "dots" and got.source == "catalogue"  # megatron is over 1000
    assert [c.fits for c in cands] == [False, True]
    same, _ = _challenged(W(), plan, 1000, ["full"], [])
    assert same is plan


# --- the decision, compiled (one session of compiles: the tiny own-step Llama) ------------------


# The model with its blocks marked "auto" (policy None) or wrapped by hand, its loss and an SGD
# step: own_steps' auto_train, which experiments/auto_budget.py times too.
_train = own.auto_train


@functools.cache
def _args():
    net, _, _, tx = _train(None)
    tokens = jax.random.randint(jax.random.key(1), (2, 32), 0, own.VOCAB)
    params = net.init(jax.random.key(0), tokens)["params"]
    return params, tx.init(params), {"tokens": tokens, "targets": jnp.roll(tokens, -1, 1)}


@functools.cache
def _bare_peak(policy: str) -> int:
    """The peak of the step built with ``policy`` by hand, compiled by jax alone for the
    deviceless H100 with the params and optimizer state donated."""
    _, _, step, _ = _train(policy)
    sharding = H100.sharding()
    placed = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), _args()
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lowered = jax.jit(step, donate_argnums=(0, 1)).lower(*placed)
        m = lowered.compile(compiler_options=analysis_options(H100)).memory_analysis()
    return (
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        + m.temp_size_in_bytes
        - m.alias_size_in_bytes
    )


BUDGETS = {"fits": {"budget": "fits"}, "900KiB": {"budget": "900KiB"}}
BUDGETS["activations"] = {"activations": 0.5}
BUDGETS["64KiB"] = {"budget": "64KiB"}  # under the weights, gradients and batch: refused


def _wrapped(which: str):
    _, loss_fn, step, _ = _train(None)
    return rk.auto(
        step,
        target="h100",
        donate_argnums=(0, 1),
        roles={"params": 0, "optimizer": 1, "batch": 2},
        loss_fn=loss_fn,
        loss_argnums=(0, 2),
        catalogue=CATALOGUE,
        challengers=(),
        **BUDGETS[which],
    )


@pytest.fixture(scope="session")
def decided():
    """Each budget's wrapped step, called once (decided, then run on the CPU), with its
    outputs and the log records of its first call."""
    out = {}
    logger = logging.getLogger("remat_kit.auto")
    # "fits" (every budget form's bytes) is checked without a compile above: two decisions
    # here keep the suite's time (each is several compiles).
    for which in ("900KiB", "activations"):
        records = []
        handler = logging.Handler()
        handler.emit = records.append
        logger.addHandler(handler)
        old = logger.level
        logger.setLevel(logging.INFO)
        try:
            step = _wrapped(which)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = step(*jax.tree.map(jnp.copy, _args()))
        finally:
            logger.removeHandler(handler)
            logger.setLevel(old)
        out[which] = (step, result, records)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("which", ["900KiB", "activations"])
def test_the_decided_plan_is_under_the_budget_to_the_byte_of_a_bare_compile(which, decided):
    step, _, _ = decided[which]
    plan = step.plan
    assert plan.peak_bytes == _bare_peak(plan.policy)
    assert plan.peak_bytes <= plan.budget_bytes
    assert plan.none_peak_bytes == _bare_peak("none")
    assert plan.target == "h100-80gb" and plan.compiles >= 1 and not plan.cached


@pytest.mark.slow
def test_an_activation_budget_is_sized_from_none_and_the_fixed_parts(decided):
    params, opt_state, batch = _args()
    fixed = 2 * nbytes(params) + nbytes(opt_state) + nbytes(batch)  # weights, grads, state
    none = _bare_peak("none")
    assert decided["activations"][0].plan.budget_bytes == int(fixed + 0.5 * (none - fixed))


@pytest.mark.slow
def test_a_tight_budget_chooses_remat_and_fits_chooses_no_slower_than_the_catalogue(decided):
    tight = decided["900KiB"][0].plan
    assert tight.policy != "none" and _bare_peak("none") > tight.budget_bytes
    for which in decided:
        plan = decided[which][0].plan
        if plan.catalogue_seconds is not None:
            assert plan.step_seconds <= plan.catalogue_seconds * (1 + 1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["900KiB", "activations"])
def test_the_wrapped_step_trains_as_the_step_without_remat(which, decided):
    _, result, _ = decided[which]
    _, _, step, _ = _train("none")
    expected = jax.jit(step)(*_args())
    chex.assert_trees_all_close(result, expected, rtol=2e-2, atol=2e-3)


@pytest.mark.slow
def test_the_first_call_logs_one_line_naming_the_choice(decided):
    step, _, records = decided["900KiB"]
    assert len(records) == 1
    line = records[0].getMessage()
    assert step.plan.policy in line and "900KiB" in line and "\n" not in line


@pytest.mark.slow
def test_a_restarted_job_reads_the_decision_back_without_compiling(decided, no_compile):
    """A new wrapper of the same step (a restarted job): the decision comes from the disk
    cache, with nothing compiled to make it."""
    _, loss_fn, step, _ = _train(None)
    plan = decide(
        step,
        _args(),
        target=H100,
        budget=Budget.of("900KiB"),
        donate_argnums=(0, 1),
        roles={"params": 0, "optimizer": 1, "batch": 2},
        loss_fn=loss_fn,
        loss_argnums=(0, 2),
        catalogue=CATALOGUE,
        challengers=(),
    )
    first = decided["900KiB"][0].plan
    assert plan.cached and plan.compiles == 0
    assert (plan.policy, plan.peak_bytes) == (first.policy, first.peak_bytes)


def test_the_decisions_key_tells_apart_steps_that_differ_only_in_a_tags_name(no_compile):
    """``checkpoint_name`` leaves no mark in the lowered program: a plan saving a tag by name
    read back for a step whose tensor is named otherwise would save nothing."""
    from remat_kit.autoplan._decide import program_of

    def step_with(tag):
        block = rk.remat(lambda w, x: checkpoint_name(jnp.sin(x @ w), tag) @ w.T, "auto")
        return lambda w, x: jax.grad(lambda w: block(w, x).sum())(w)

    w = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    got = {program_of(step_with(tag), (w, w), (), H100)[0] for tag in ("mlpwi", "mlpwo")}
    assert len(got) == 2
    assert program_of(step_with("mlpwi"), (w, w), (), H100)[0] in got  # and it is stable


@pytest.mark.slow
def test_a_budget_under_the_fixed_parts_names_the_floor_before_any_compile(no_compile):
    with pytest.raises(DoesNotFit) as err:
        _wrapped("64KiB")(*_args())
    e = err.value
    params, opt_state, batch = _args()
    assert e.fixed_bytes == 2 * nbytes(params) + nbytes(opt_state) + nbytes(batch)
    assert e.limit_bytes == 64 * 2**10 and e.hints


@pytest.mark.slow
def test_the_step_that_runs_is_the_program_of_the_decided_policy(decided):
    """The jitted step is the decided policy's program, as a step built with that policy by
    hand lowers it (a wrapper that ran another policy would lower another program)."""
    step, _, _ = decided["900KiB"]
    _, _, by_hand, _ = _train(step.plan.policy)
    got = step.lower(*_args()).as_text()
    assert got == jax.jit(by_hand, donate_argnums=(0, 1)).lower(*_args()).as_text()
    _, _, none, _ = _train("none")
    assert got != jax.jit(none, donate_argnums=(0, 1)).lower(*_args()).as_text()


@pytest.mark.slow  # a process started
@pytest.mark.skipif(bool(glob.glob("/dev/nvidia[0-9]*")), reason="this machine has a GPU")
def test_the_gpu_experiment_without_a_gpu_refuses_and_writes_nothing(tmp_path):
    script = Path(__file__).resolve().parent.parent / "experiments" / "auto_gpu.py"
    done = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 1
    assert "no NVIDIA GPU" in done.stderr and "nothing written" in done.stderr
    assert list(tmp_path.iterdir()) == []


# --- the decided program in inspect's terms -----------------------------------------------------


@pytest.mark.slow
def test_the_decided_program_inspected_is_the_plan_and_writes_inspects_files(decided, tmp_path):
    """``step.inspect`` reports the decided program (its peak that of a bare compile of the
    step with the decided policy), and ``rk.render.write_inspection`` writes the trace and
    the XProf profile ``remat-kit inspect --trace --xprof`` writes."""
    import json

    step, _, _ = decided["900KiB"]
    r = step.inspect(*_args(), series=True, hlo_proto=True)
    assert r.peak_bytes == _bare_peak(step.plan.policy) == step.plan.peak_bytes
    assert r.meta["policy"] == step.plan.policy and r.meta["budget"] == "900KiB"
    assert r.by_category["parameter"] > 0 and r.by_category.get("optimizer state", 0) == 0  # SGD
    got = rk.render.write_inspection(
        [r], H100, [step.plan.policy], trace=tmp_path / "t.json", xprof=tmp_path / "prof"
    )
    trace = json.loads(got["trace"].read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])  # the predicted kernels
    space = (got["xprof"] / rk.render.PROFILE_XPLANE).read_bytes()
    assert r.hlo_proto in space  # the program XProf's Memory Viewer reads


# --- NNX objects as the step's arguments, as nnx.jit takes them ---------------------------------


class _NNXNet(nnx.Module):
    def __init__(self, rngs):
        block = rk.remat(_NNXBlock, "auto")
        self.b0, self.b1 = block(rngs), block(rngs)

    def __call__(self, x):
        return self.b1(self.b0(x))


def _nnx_step(model, optimizer, x):
    def loss_fn(model):
        return (model(x) ** 2).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def _nnx_objects():
    model = _NNXNet(nnx.Rngs(0))
    return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)


def test_the_edge_splits_graph_objects_and_maps_donation():
    from remat_kit.autoplan._graph import Edge

    model, opt = _nnx_objects()
    x = jnp.ones((2, 8))
    edge, pure = Edge.of((model, opt, x))
    assert edge.nodes == (0, 1) and len(pure) == 2 and pure[1] is x
    assert edge.donate((0, 1)) == (0,) and edge.donate((2,)) == (1,) and edge.donate(()) == ()
    assert Edge.of((x,)) == (None, (x,))


@pytest.mark.slow
@pytest.mark.parametrize("form", ["function", "nnx.jit"])
def test_a_step_taking_nnx_objects_trains_as_under_nnx_jit(form):
    """The model and optimizer passed to the wrapped step change in place as under
    ``nnx.jit`` (its marked blocks traced under ``none``: gradients are the policy's)."""
    x = jnp.linspace(-1.0, 1.0, 16).reshape(2, 8)
    model, opt = _nnx_objects()
    given = nnx.jit(_nnx_step, donate_argnums=(0, 1)) if form == "nnx.jit" else _nnx_step
    step = rk.auto(given, "fits", target="h100", catalogue=("full",), challengers=())
    ref_model, ref_opt = _nnx_objects()
    ref = nnx.jit(_nnx_step)
    losses, ref_losses = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            losses.append(step(model, opt, x))
            with marks.auto_as("none"):
                ref_losses.append(ref(ref_model, ref_opt, x))
    assert step.plan is not None and step.plan.target == "h100-80gb"
    chex.assert_trees_all_close(losses, ref_losses, rtol=1e-6, atol=1e-6)
    chex.assert_trees_all_close(
        nnx.state(model, nnx.Param), nnx.state(ref_model, nnx.Param), rtol=1e-6, atol=1e-6
    )
    assert int(opt.step[...]) == int(ref_opt.step[...]) == 2
    assert losses[1] < losses[0]  # it trained: the objects were updated between calls


# --- XLA's own pass asked for the budget (source "xla") ------------------------------------------

SLOP = "xla_gpu_memory_limit_slop_factor"


def _local_gpu(**kw):
    """A GPU in this process as ``rk.target("local")`` describes one (its allocator's
    ``bytes_limit`` as its memory), built by hand: there is no GPU here."""
    return rk.Target("local", "local", "NVIDIA H100 80GB HBM3", 63763906560, 3.35e12, 64e9,
                     989e12, compute_capability=(9, 0), **kw)  # fmt: skip


def test_a_slop_factor_is_a_whole_percent_and_travels_with_the_target():
    t = H100.with_slop_factor(23)
    assert t.xla_options == {SLOP: 23} and H100.xla_options == {}
    assert analysis_options(t)[SLOP] == 23 and SLOP not in analysis_options(H100)
    assert t.usable_bytes == H100.usable_bytes and t.to_dict()["slop_factor"] == 23
    assert "slop_factor" not in H100.to_dict()  # XLA's default: records read as before
    # a GPU in the process compiles with it too (its own compile options, nothing else)
    assert analysis_options(_local_gpu().with_slop_factor(30)) == {SLOP: 30}


def _xla_world(monkeypatch, outcomes):
    """``rk.sources.workload`` answering each slop factor's ``none`` with ``outcomes[slop]``
    = (peak, seconds, fell short); the factors asked, in order."""
    from types import SimpleNamespace

    asked = []

    def workload(source, t, config):
        slop = t.xla_options[SLOP]
        asked.append(slop)
        peak, seconds, short = outcomes[slop]
        r = SimpleNamespace(
            peak_bytes=peak,
            step_time=SimpleNamespace(seconds=seconds),
            xla_remat_limit_bytes=peak - 1 if short else None,  # logged where it fell short
        )
        return SimpleNamespace(compiled=lambda *a: r)

    monkeypatch.setattr(rk.sources, "workload", workload)
    # what the fake answers with is what a compiled report has
    fields = {f.name for f in dataclasses.fields(rk.MemoryReport)}
    assert {"peak_bytes", "step_time", "xla_remat_limit_bytes"} <= fields
    return asked


def _none_at(io, peak):
    from types import SimpleNamespace

    return SimpleNamespace(
        peak_bytes=peak, argument_bytes=io + 100, output_bytes=50, alias_bytes=150
    )


@pytest.mark.parametrize(
    "case",
    [
        "faster",
        "as_fast",
        "slower",
        "over_then_under",
        "fell_short",
        "none_fits",
        "not_a_gpu",
        "local_gpu",
    ],
)
def test_xla_pass_is_asked_for_the_budget_and_taken_only_under_it_and_faster(monkeypatch, case):
    from remat_kit.autoplan._decide import _xla_pass

    gib = 2**30
    target = {"not_a_gpu": rk.target("cpu"), "local_gpu": _local_gpu()}.get(case, H100)
    base, io = (target.usable_bytes or H100.usable_bytes), 10 * gib
    limit = io + (base - io) * 23 // 100 + 7  # the budget asks for 23% of what is left
    # an overshoot of 1 GiB takes the factor down by that share of what is left, rounded up
    second = 23 - -(-100 * gib // (base - io))
    outcomes = {
        "faster": {23: (limit, 0.9, False)},  # at the budget is under it
        "as_fast": {23: (limit - 1, 1.0, False)},  # a tie keeps the plan in hand
        "slower": {23: (limit - 1, 1.1, False)},
        "over_then_under": {23: (limit + gib, 0.5, False), second: (limit - gib, 0.8, False)},
        "fell_short": {23: (limit + gib, 0.5, True)},
        "none_fits": {},
        "not_a_gpu": {},
        "local_gpu": {23: (limit, 0.9, False)},  # its bytes_limit is the base
    }[case]
    asked = _xla_world(monkeypatch, outcomes)
    none = _none_at(io, limit if case == "none_fits" else limit + 5 * gib)
    got = _xla_pass(object(), target, limit, none, 1.0)
    if case in ("none_fits", "not_a_gpu"):
        assert got is None and asked == []
        return
    slop, report, tried = got
    assert asked == list(outcomes) and tried == len(asked)
    taken = case in ("faster", "over_then_under", "local_gpu")
    assert (report is not None) == taken and slop == asked[-1]
    if taken:
        assert report.peak_bytes <= limit


def test_an_xla_plan_is_compiled_with_its_slop_in_the_step_and_its_words(monkeypatch):
    """A plan of source ``xla`` runs the step jitted with its slop factor (the option the
    decision was compiled with), and says so in its log line; others add no option."""
    import remat_kit.autoplan._step as step_module

    def plan(slop):
        return AutoPlan("none", "xla" if slop else "none", "h100-80gb", "fits", 2**30, 2**29,
                        0, 0.9, 1.0, 2**31, "full", 1.0, 2**29, 2, 1.0, "0" * 64,
                        slop_factor=slop)  # fmt: skip

    seen = []
    real_jit = jax.jit

    def jit(fn, **kw):
        if "compiler_options" in kw:  # the decided step's jit (the only one given options)
            seen.append(kw["compiler_options"])
        return real_jit(fn, **kw)

    for slop in (17, None):
        monkeypatch.setattr(step_module, "decide", lambda *a, slop=slop, **k: plan(slop))
        lhs = {"xla_gpu_enable_latency_hiding_scheduler": True}
        step = rk.auto(lambda x: rk.remat(jnp.sin, "auto")(x), "fits", target="h100",
                       compiler_options=lhs)  # fmt: skip
        monkeypatch.setattr(jax, "jit", jit)
        out = step(jnp.ones(3))
        monkeypatch.setattr(jax, "jit", real_jit)
        chex.assert_trees_all_close(out, jnp.sin(jnp.ones(3)))
    assert seen == [
        {"xla_gpu_enable_latency_hiding_scheduler": True, SLOP: 17},
        {"xla_gpu_enable_latency_hiding_scheduler": True},
    ]
    assert "none under XLA's remat pass at slop 17% (xla)" in plan(17).words()
    assert AutoPlan.from_dict(plan(17).to_dict()).compiler_options == {SLOP: 17}


def _wide_mlp():
    """Four 4096-wide tanh layers over 8192 rows in f32 (64 MiB weights each, 128 MiB
    activations each): big enough that one percent of an H100's pool is a choice XLA's pass
    can make."""

    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.sum(x)

    step = jax.grad(loss)
    sharding = H100.sharding()
    w = jax.ShapeDtypeStruct((4096, 4096), jnp.float32, sharding=sharding)
    x = jax.ShapeDtypeStruct((8192, 4096), jnp.float32, sharding=sharding)
    return step, ([w] * 4, x)


@pytest.mark.slow
def test_a_slop_factor_tightens_xla_pass_as_a_bare_compile_given_it_does():
    """``none`` compiled through remat_kit for the target with a slop factor has the peak a
    bare ``jax.jit`` compile given that option has, and XLA's pass cut it below the default's."""
    step, args = _wide_mlp()
    lowered = jax.jit(step).lower(*args)
    base = rk.memory_report(step, *args, target=H100)
    io = base.argument_bytes + base.output_bytes - base.alias_bytes
    slop = 1  # 1% of an H100's pool beyond the inputs and outputs: under what none keeps
    assert (H100.usable_bytes - io) // 100 < base.peak_bytes - io
    with pytest.warns(rk.errors.RematWarning, match="XLA's own rematerialization pass took"):
        ours = rk.memory_report(step, *args, target=H100.with_slop_factor(slop))
    bare = lowered.compile(compiler_options={**analysis_options(H100), SLOP: slop})
    m = bare.memory_analysis()
    assert ours.peak_bytes == (
        m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
        - m.alias_size_in_bytes
    )  # fmt: skip
    assert ours.peak_bytes < base.peak_bytes and ours.xla_remat


def _mlp_blocks(block):
    def loss(ws, x):
        for w in ws:
            x = x + block(w, x)
        return jnp.sum(x)

    return jax.grad(loss)


def _block(w, x):
    """An MLP block 8x wide: what it keeps for its backward pass (two 256 MiB hidden
    tensors) is 16 times its input."""
    return jax.nn.gelu(x @ w[0]) @ w[1]


@pytest.mark.slow
def test_a_decision_near_nones_peak_is_under_it_to_the_byte_of_a_bare_compile():
    """The whole decision on real compiles, ``none`` over the budget so XLA's own pass is
    asked too: the plan is under the budget and its peak is a bare compile's of the same
    step with the plan's policy (``jax.checkpoint``) and compile options (``jax.jit``)."""
    sharding = H100.sharding()
    w = (
        jax.ShapeDtypeStruct((1024, 8192), jnp.float32, sharding=sharding),
        jax.ShapeDtypeStruct((8192, 1024), jnp.float32, sharding=sharding),
    )
    args = ([w] * 4, jax.ShapeDtypeStruct((8192, 1024), jnp.float32, sharding=sharding))
    none = rk.memory_report(_mlp_blocks(_block), *args, target=H100)
    limit = none.peak_bytes - 200 * 2**20
    step = _mlp_blocks(rk.remat(_block, "auto"))
    plan = decide(step, args, target=H100, budget=Budget.of(limit), catalogue=CATALOGUE,
                  challengers=())  # fmt: skip
    pol = rk.policy(plan.policy)
    block = jax.checkpoint(_block, policy=pol.jax_policy) if pol.is_remat else _block
    jitted = jax.jit(_mlp_blocks(block), compiler_options=plan.compiler_options or None)
    m = jitted.lower(*args).compile(analysis_options(H100)).memory_analysis()
    assert plan.peak_bytes <= limit < none.peak_bytes
    assert plan.peak_bytes == (
        m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
        - m.alias_size_in_bytes
    )  # fmt: skip
