"""``rk.auto`` on a sharded step: planned for the mesh's devices of the target, per device.

A step jitted with ``NamedSharding``s over a mesh of four devices is decided on a mesh of the
same axes over four compile-only H100s. The decision is checked against a plain
``jax.jit(step, in_shardings=..., out_shardings=...)`` of the same step with the decided
policy applied by hand (``jax.checkpoint``), compiled by jax alone for that target and mesh;
the wrapped step's outputs (four CPU devices, in a subprocess: the device count is fixed when
jax starts) against the user's own sharded step's.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import remat_kit as rk
from remat_kit.autoplan import Budget, decide
from remat_kit.autoplan._shardings import layout_of
from remat_kit.errors import ShardedStep
from remat_kit.targets import analysis_options

T4 = rk.target("h100", devices=4)
D, F, B, L = 64, 1024, 2048, 3  # activations (B x F per layer) well over the weights

#: mesh shape, axis names, the specs of the two weights of a layer, the batch's
CASES = {
    "dp": ((4,), ("data",), (P(), P()), P("data")),
    "fsdp": ((4,), ("data",), (P("data"), P("data")), P("data")),
    "dp_tp": ((2, 2), ("data", "model"), (P(None, "model"), P("model", None)), P("data")),
}


def _block(w, x):
    h = checkpoint_name(jnp.tanh(x @ w[0]), "mlpwi")
    return x + jnp.tanh(h) @ w[1]


def _step(block):
    """An SGD step over ``L`` blocks (params donated by the caller) and its loss."""

    def loss_fn(params, batch):
        x = batch
        for w in params:
            x = block(w, x)
        return jnp.mean(x**2)

    def train_step(params, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        return jax.tree.map(lambda p, g: p - 1e-2 * g, params, grads), loss

    return train_step, loss_fn


def _two_tags(w, x):
    """Two tagged tensors of the same size, a product and a cheap one of it: a per-tensor
    plan (keep one) lies between ``none`` and ``full``."""
    a = checkpoint_name(x @ w[0], "mlpwi")
    b = checkpoint_name(jnp.sin(a) * jnp.cos(a), "mlpwi_1")
    return x + b @ w[1]


BLOCKS = {"mlp": _block, "two_tags": _two_tags}


def _by_hand(policy: str, block: str = "mlp"):
    pol = rk.as_policy(policy)  # a catalogue name or the planner's names:save=...
    fn = BLOCKS[block]
    block = jax.checkpoint(fn, policy=pol.jax_policy) if pol.is_remat else fn
    return _step(block)[0]


@functools.cache
def _placed(case: str, axis_types: tuple | None = None):
    """In- and out-shardings on a mesh of four compile-only H100s (its axes of
    ``axis_types``, jax's default where None), and the abstract args."""
    shape, names, (w0, w1), rows = CASES[case]
    mesh = Mesh(T4.mesh(names, shape).devices, names, axis_types=axis_types)
    params = [(NamedSharding(mesh, w0), NamedSharding(mesh, w1))] * L
    ins = (params, NamedSharding(mesh, rows))
    outs = (params, NamedSharding(mesh, P()))
    shapes = ([(jax.ShapeDtypeStruct((D, F), jnp.float32),
                jax.ShapeDtypeStruct((F, D), jnp.float32))] * L,
              jax.ShapeDtypeStruct((B, D), jnp.float32))  # fmt: skip
    args = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        shapes, ins)  # fmt: skip
    return ins, outs, args


def _peak(compiled) -> int:
    m = compiled.memory_analysis()
    return (
        m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
        - m.alias_size_in_bytes
    )  # fmt: skip


@functools.cache
def _bare_analysis(
    case: str, policy: str, axis_types: tuple | None = None, jit: bool = True, block: str = "mlp"
) -> dict[str, int]:
    """The per-device memory analysis of a plain sharded ``jax.jit`` of the step with
    ``policy``, compiled by jax for the four H100s: params donated and out_shardings given,
    as the user's jit below (``jit``), or neither, as for a plain function given placed
    arrays."""
    ins, outs, args = _placed(case, axis_types)
    if jit:
        step = _by_hand(policy, block)
        jitted = jax.jit(step, in_shardings=ins, out_shardings=outs, donate_argnums=0)
    else:
        jitted = jax.jit(_by_hand(policy, block), in_shardings=ins)
    m = jitted.lower(*args).compile(analysis_options(T4)).memory_analysis()
    return {
        k: int(getattr(m, f"{k}_size_in_bytes")) for k in ("argument", "output", "temp", "alias")
    }


def _bare(
    case: str, policy: str, axis_types: tuple | None = None, jit: bool = True, block: str = "mlp"
) -> int:
    """The per-device peak of :func:`_bare_analysis`'s compile: argument + output + temp -
    alias, as :func:`_peak` reads it."""
    m = _bare_analysis(case, policy, axis_types, jit, block)
    return m["argument"] + m["output"] + m["temp"] - m["alias"]


def _wrapped(case: str, budget, block: str = "mlp"):
    ins, outs, _ = _placed(case)
    step, loss_fn = _step(rk.remat(BLOCKS[block], "auto"))
    user = jax.jit(step, in_shardings=ins, out_shardings=outs, donate_argnums=0)
    return rk.auto(user, budget, target="h100", catalogue=("full",), challengers=(),
                   loss_fn=loss_fn, loss_argnums=(0, 1))  # fmt: skip


@pytest.fixture(scope="session")
def sharded():
    """Each case decided under a budget halfway from ``full``'s per-device peak to
    ``none``'s, and the decided step lowered (nothing runs: the mesh is compile-only)."""
    out = {}
    for case in CASES:
        budget = (_bare(case, "none") + _bare(case, "full")) // 2
        step = _wrapped(case, budget)
        lowered = step.lower(*_placed(case)[2])  # decides; ``plan`` stays the last call's
        (plan,) = step.plans
        out[case] = (step, lowered, budget, plan)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_sharded_decision_is_under_the_budget_to_the_byte_of_a_plain_sharded_jit(case, sharded):
    step, _, budget, plan = sharded[case]
    assert step.plan is None  # no call yet
    assert plan.mesh == dict(zip(CASES[case][1], CASES[case][0], strict=True))
    assert plan.devices == 4 and plan.budget_bytes == budget
    assert plan.peak_bytes == _bare(case, plan.policy) <= budget
    assert plan.none_peak_bytes == _bare(case, "none") > budget  # it had to remat
    assert plan.policy != "none"


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_the_step_that_runs_is_the_decided_sharded_program(case, sharded):
    """The wrapped step's own jit (the user's shardings, the decided policy) compiles to the
    plan's per-device peak, with the shardings the plain jit of the user compiles with."""
    _, lowered, _, plan = sharded[case]
    got = lowered.compile(analysis_options(T4))
    assert _peak(got) == plan.peak_bytes
    ins, outs, args = _placed(case)
    plain = jax.jit(_by_hand(plan.policy), in_shardings=ins, out_shardings=outs)
    want = plain.lower(*args).compile(analysis_options(T4))
    assert got.input_shardings == want.input_shardings
    assert got.output_shardings == want.output_shardings


@pytest.mark.slow
def test_a_per_tensor_plan_competes_on_the_sharded_program():
    """With two tags the planner's own plan (keep one, recompute the other) is under a
    budget a quarter of the way from ``full`` to ``none`` on the FSDP mesh, and its per-device
    peak is the plain sharded jit's with that plan applied by hand."""
    none, full = _bare("fsdp", "none", block="two_tags"), _bare("fsdp", "full", block="two_tags")
    budget = full + (none - full) // 4
    step = _wrapped("fsdp", budget, block="two_tags")
    step.lower(*_placed("fsdp")[2])
    (plan,) = step.plans
    assert plan.source == "solver" and plan.policy.startswith("names:save=")
    assert plan.peak_bytes == _bare("fsdp", plan.policy, block="two_tags") <= budget
    assert full < plan.peak_bytes  # it keeps something: not full under another name


@pytest.mark.slow
def test_the_budget_is_per_device(sharded):
    """The same step on one device keeps four times the batch's activations: its ``none``
    is over what the sharded step's is (a plan read as one device's would not fit)."""
    _, _, args = _placed("dp")
    one = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args)
    alone = rk.memory_report(_by_hand("none"), *one, target="h100", donate_argnums=0, warn=False)
    assert alone.peak_bytes > 2 * sharded["dp"][3].none_peak_bytes


@pytest.mark.slow
def test_the_decision_is_kept_under_the_mesh_and_shardings(sharded, monkeypatch):
    """Read back for the same layout without a compile; decided anew for another layout of
    the same shapes (the key holds the mesh and every leaf's sharding)."""
    step, loss_fn = _step(rk.remat(_block, "auto"))
    budget = Budget.of(sharded["dp"][2])

    def again(case):
        ins, outs, args = _placed(case)
        lay = layout_of("train_step", {"in_shardings": ins, "out_shardings": outs}, args)
        return decide(step, args, target=rk.target("h100"), budget=budget, donate_argnums=(0,),
                      catalogue=("full",), challengers=(), loss_fn=loss_fn, loss_argnums=(0, 1),
                      layout=lay)  # fmt: skip

    def refuse(*a, **k):
        raise AssertionError("compiled: the decision must be read back")

    with monkeypatch.context() as m:
        m.setattr(jax.stages.Lowered, "compile", refuse)
        kept = again("dp")
    assert kept.cached and kept.compiles == 0 and kept.policy == sharded["dp"][3].policy
    other = again("fsdp")  # fsdp's shapes are dp's: only the shardings differ
    assert not other.cached and other.program != kept.program


# --- what cannot be planned: refused before any compile -----------------------------------------


def _mesh(shape, names):
    return Mesh(T4.mesh(names, shape).devices, names)


def test_shardings_over_two_meshes_are_refused(no_compile):
    a, b = _mesh((4,), ("data",)), _mesh((2, 2), ("data", "model"))
    x = jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=NamedSharding(b, P("data")))
    step = rk.auto(lambda w, x: rk.remat(jnp.tanh, "auto")(w * x), "fits", target="h100",
                   in_shardings=(NamedSharding(a, P("data")), None))  # fmt: skip
    with pytest.raises(ShardedStep, match="on one mesh") as err:
        step.lower(x, x)
    assert err.value.where == "arguments" and err.value.devices == 4
    assert "\n" not in str(err.value)


def test_a_multi_device_sharding_other_than_named_is_refused_naming_the_fix(no_compile):
    from jax._src.sharding_impls import GSPMDSharding

    devices = tuple(_mesh((4,), ("data",)).devices.flat)
    x = jax.ShapeDtypeStruct((8,), jnp.float32, sharding=GSPMDSharding.get_replicated(devices))
    step = rk.auto(lambda x: rk.remat(jnp.tanh, "auto")(x), "fits", target="h100")
    with pytest.raises(ShardedStep, match=r"give NamedSharding\(mesh, PartitionSpec") as err:
        step.lower(x)
    assert (err.value.where, err.value.devices) == ("arguments", 4)


@pytest.mark.parametrize("devices", [2, 8])
def test_a_target_of_another_device_count_is_refused(devices, no_compile):
    rows = NamedSharding(_mesh((4,), ("data",)), P("data"))
    x = jax.ShapeDtypeStruct((8,), jnp.float32, sharding=rows)
    step = rk.auto(lambda x: rk.remat(jnp.tanh, "auto")(x), "fits",
                   target=rk.target("h100", devices=devices))  # fmt: skip
    with pytest.raises(ShardedStep, match=f"has {devices}: name a target of 4") as err:
        step.lower(x)
    assert err.value.where == "target"


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_inspect_of_a_sharded_step_is_one_devices_program_to_the_byte(case, sharded, tmp_path):
    """``step.inspect`` compiles the decided step on the mesh it was planned on: its peak is
    the per-device peak of the plain sharded jit of the decided policy (compiled here by jax
    alone, read off its memory analysis), and it writes ``inspect --trace / --xprof``'s files."""
    step, _, _, plan = sharded[case]
    r = step.inspect(*_placed(case)[2], series=True, hlo_proto=True)
    assert r.peak_bytes == _bare(case, plan.policy) == plan.peak_bytes
    assert r.argument_bytes == _bare_analysis(case, plan.policy)["argument"]
    assert r.meta["policy"] == plan.policy and sum(r.by_category.values()) == r.peak_bytes
    wrote = rk.render.write_inspection([r], T4, [plan.policy], trace=tmp_path / "t.json",
                                       xprof=tmp_path / "xprof")  # fmt: skip
    assert wrote["trace"].stat().st_size > 0 and any(wrote["xprof"].rglob("*"))


@pytest.mark.slow
def test_rk_inspect_of_a_sharded_program_is_one_devices_with_its_gradients():
    """``rk.inspect`` given the shardings: the FSDP step's peak is the plain sharded jit's per
    device, and the gradients live at it are recognised (whole before the reduce-scatter,
    shards after it) against each device's shards of the parameters."""
    ins, outs, args = _placed("fsdp")
    r = rk.inspect(_by_hand("full"), *args, target=T4, donate_argnums=0, in_shardings=ins,
                   out_shardings=outs, categories={0: "parameter"})  # fmt: skip
    assert r.peak_bytes == _bare("fsdp", "full")
    assert r.by_category["parameter"] == 2 * L * D * F * 4 // 4  # each device's shards
    assert r.by_category["gradient"] > 0


def _f(w, x):
    return jnp.tanh(w * x)


_X = jax.ShapeDtypeStruct((8, 4), jnp.float32)


@pytest.mark.parametrize(
    "given, target, error, param",
    [
        # not a prefix of the two arguments
        (lambda rows: (rows, rows, rows), T4, rk.errors.BadValue, "in_shardings"),
        # not a Sharding
        (lambda rows: (rows, "data"), T4, rk.errors.BadType, "in_shardings"),
        # four devices for a target of one
        (lambda rows: (rows, None), rk.target("h100"), rk.errors.BadValue, "in_shardings"),
        # the process's CPU device for an H100
        (
            lambda rows: (jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0]), None),
            rk.target("h100"),
            rk.errors.BadValue,
            "in_shardings",
        ),
    ],
    ids=["prefix", "type", "count", "platform"],
)
def test_a_bad_sharding_given_to_inspect_is_refused_before_any_compile(
    given, target, error, param, no_compile
):
    rows = NamedSharding(_mesh((4,), ("data",)), P("data"))
    with pytest.raises(error) as err:
        rk.inspect(_f, _X, _X, target=target, in_shardings=given(rows))
    assert err.value.param == param and "\n" not in str(err.value)


def test_a_bad_out_sharding_given_to_inspect_is_refused_before_any_compile(no_compile):
    rows = NamedSharding(_mesh((4,), ("data",)), P("data"))
    with pytest.raises(rk.errors.BadValue, match="out_shardings holds a sharding over 4") as err:
        rk.inspect(_f, _X, _X, target="h100", out_shardings=rows)
    assert err.value.param == "out_shardings"


# --- run on four CPU devices ----------------------------------------------------------------------

_RUN = """
import json, sys
import chex, jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
sys.path.insert(0, {tests!r})
import remat_kit as rk
import test_auto_sharded as t
out = {{}}
for case in ("dp", "fsdp"):
    shape, names, (w0, w1), rows = t.CASES[case]
    mesh = jax.make_mesh(shape, names)  # the user's: four CPU devices, explicit axes
    params = [(NamedSharding(mesh, w0), NamedSharding(mesh, w1))] * t.L
    ins, outs = (params, NamedSharding(mesh, rows)), (params, NamedSharding(mesh, P()))
    keys = jax.random.split(jax.random.key(0), 2 * t.L + 1)
    ws = [(jax.random.normal(keys[2 * i], (t.D, t.F)) / 8,
           jax.random.normal(keys[2 * i + 1], (t.F, t.D)) / 8) for i in range(t.L)]
    x = jax.random.normal(keys[-1], (t.B, t.D))
    step, loss_fn = t._step(rk.remat(t._block, "auto"))
    user = jax.jit(step, in_shardings=ins, out_shardings=outs, donate_argnums=0)
    budget = {budgets!r}[case]
    wrapped = rk.auto(user, budget, target="h100", catalogue=("full",), challengers=(),
                      loss_fn=loss_fn, loss_argnums=(0, 1))
    fresh = lambda: jax.tree.map(jnp.copy, ws)  # the params are donated
    with rk.marks.auto_as("none"):
        want = user(fresh(), x)
    got = wrapped(fresh(), x)
    chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-6)
    same = [a.sharding == b.sharding for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want))]
    again = wrapped(fresh(), x)  # a later call: the decision kept, the same program
    chex.assert_trees_all_close(again, got)
    # the plain sharded jit of the decided policy, compiled for four H100s on a mesh of the
    # user's axes (jax.make_mesh's: explicit), by jax alone
    bare = t._bare(case, wrapped.plan.policy, tuple(mesh.axis_types))
    out[case] = dict(policy=wrapped.plan.policy, peak=wrapped.plan.peak_bytes, bare=bare,
                     mesh=dict(wrapped.plan.mesh), same=all(same), decided=len(wrapped.plans),
                     under=wrapped.plan.peak_bytes <= budget)
# a plain function given arguments placed on the mesh (no jit shardings): read off them
mesh = jax.make_mesh((4,), ("data",))
rows, rep = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
step, loss_fn = t._step(rk.remat(t._block, "auto"))
wrapped = rk.auto(step, {budgets!r}["dp"], target="h100", catalogue=("full",), challengers=(),
                  loss_fn=loss_fn, loss_argnums=(0, 1))
placed = jax.device_put((ws, x), (rep, rows))
with rk.marks.auto_as("none"):
    want = jax.jit(step)(*placed)
got = wrapped(*placed)
chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-6)
wrapped(*placed)  # the same placement: its decision, looked up
first = wrapped.plan
try:  # another placement of the same shapes: the batch replicated, every device all of it
    wrapped(*jax.device_put((ws, x), (rep, rep)))
    refused = None
except rk.DoesNotFit as e:
    refused = e.parts["smallest_plan"]
# decided for one device, then called with the same shapes placed on the mesh: decided for the
# mesh (jax traces again for meshed arguments; the one-device program is not run sharded)
once = rk.auto(step, "fits", target="h100", catalogue=("full",), challengers=())
once(ws, x)
alone = dict(once.plan.mesh)
once(*placed)
out["then_placed"] = dict(first=alone, then=dict(once.plan.mesh), decided=len(once.plans))
out["args"] = dict(policy=first.policy, peak=first.peak_bytes,
                   bare=t._bare("dp", first.policy, tuple(mesh.axis_types), jit=False),
                   decided=len(wrapped.plans), refused=refused)
print(json.dumps(out))
"""


@pytest.mark.slow  # a process with four CPU devices: the user's mesh is real there
def test_the_wrapped_step_runs_with_the_users_shardings_and_its_outputs(sharded):
    """On four CPU devices: the wrapped step's outputs are the user's own sharded step's,
    placed alike, and its plan's per-device peak that of the plain sharded jit of the
    decided policy for four H100s on a mesh of the user's axes (``jax.make_mesh``'s are
    explicit: another program than the auto axes' above, so compiled there)."""
    budgets = {case: sharded[case][2] for case in ("dp", "fsdp")}
    code = _RUN.format(tests=os.path.dirname(__file__), budgets=budgets)
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=False, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for case in budgets:
        row = got[case]
        assert row["peak"] == row["bare"] and row["under"]
        assert (row["mesh"], row["same"], row["decided"]) == ({"data": 4}, True, 1)
        assert row["policy"] != "none"
    # shardings read off the arguments (no donation, outputs left to XLA); another placement of the
    # same shapes (the batch replicated: four times the activations on each device) decided
    # anew, and refused: even `full` is over the budget there (nothing runs that would not fit)
    row = got["args"]
    assert row["peak"] == row["bare"] and row["decided"] == 1 and row["policy"] != "none"
    assert row["refused"] > budgets["dp"]
    # a one-device decision is not run on arguments later placed on a mesh: that call decides
    assert got["then_placed"] == {"first": {}, "then": {"data": 4}, "decided": 2}
