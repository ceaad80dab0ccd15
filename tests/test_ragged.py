"""Grouped GEMMs (``jax.lax.ragged_dot``, mixture-of-experts experts) are matmuls everywhere.

FLOPs (forward, both gradients, recompute), the timing walker's kernels, the residual tables
through ``shard_map``, the note for dot policies that recompute them, the policies that keep
them, and the planner's per-tag prices. The model is a user's MoE written in
``tests/data/moe_factory.py`` (router, top-k, sort, ragged_dot SwiGLU), not a preset. Expected
figures come from shapes by hand or from XLA's own cost analysis of the dense equivalent.
"""

from __future__ import annotations

import functools
import json
import sys
import warnings
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import pytest

import remat_kit as rk
from helpers import size_words
from remat_kit import checks
from remat_kit.flops import count_flops, ragged_dot_flops
from remat_kit.notes import words
from remat_kit.search._costs import cost_model, tag_policy
from remat_kit.xla import kernels_of

sys.path.insert(0, str(Path(__file__).parent / "data"))
import moe_factory

F32 = jnp.float32
T, D, F = 24, 8, 12  # tokens (rows), width, expert width
EXPERT_TAGS = ("expert_gate", "expert_up", "expert_out")
DATA = Path(__file__).parent / "data"
_NOTE = "ragged_dots_recomputed"


def _spec(*shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


def _xla_flops(fn, *args):
    """XLA's own FLOP count of a (dense) function on the CPU: independent of remat_kit."""
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["flops"])


def _ragged_loss(x, w, g):
    return jnp.sum(jax.lax.ragged_dot(x, w, g) ** 2)


# --------------------------------------------------------------------------------------------
# FLOPs


@pytest.mark.parametrize("experts", [1, 4])
def test_every_ragged_dot_mode_costs_one_dense_product_of_all_rows(experts):
    """jax.grad of a ragged_dot holds the three modes (forward; weight gradient, ragged dim
    contracted, output (E, D, F); input gradient): each costs the dense product of all T rows
    with one group's weights, as XLA counts it, whatever the number of groups."""
    args = _spec(T, D), _spec(experts, D, F), _spec(experts, dtype=jnp.int32)
    closed = jax.make_jaxpr(jax.value_and_grad(_ragged_loss, argnums=(0, 1)))(*args)
    ragged = [e for e in closed.jaxpr.eqns if e.primitive.name == "ragged_dot_general"]
    modes = [(e.invars[0].aval.shape, e.outvars[0].aval.shape) for e in ragged]
    assert modes == [((T, D), (T, F)), ((T, D), (experts, D, F)), ((T, F), (T, D))]
    dense = [
        _xla_flops(jnp.matmul, _spec(T, D), _spec(D, F)),  # x @ w_e
        _xla_flops(lambda a, b: a.T @ b, _spec(T, D), _spec(T, F)),  # x^T @ ct
        _xla_flops(lambda a, b: a @ b.T, _spec(T, F), _spec(D, F)),  # ct @ w_e^T
    ]
    assert dense == [2.0 * T * D * F] * 3  # XLA agrees with the textbook figure
    assert [ragged_dot_flops(e) for e in ragged] == dense
    assert count_flops(jax.value_and_grad(_ragged_loss, argnums=(0, 1)), *args).matmul == sum(dense)


def test_recomputed_ragged_dots_are_counted_again():
    """Under `full` the backward pass recomputes the forward ragged dot: one more product."""
    args = _spec(T, D), _spec(4, D, F), _spec(4, dtype=jnp.int32)
    step = lambda f: jax.value_and_grad(f, argnums=(0, 1))
    plain = count_flops(step(_ragged_loss), *args).matmul
    remat = count_flops(step(jax.checkpoint(_ragged_loss)), *args).matmul
    assert remat - plain == 2.0 * T * D * F


# --------------------------------------------------------------------------------------------
# The timing walker


def _h100_lowered(experts=8, rows=512, d=256, f=384):
    t = rk.target("h100")
    args = (
        jax.ShapeDtypeStruct((rows, d), jnp.bfloat16, sharding=t.sharding()),
        jax.ShapeDtypeStruct((experts, d, f), jnp.bfloat16, sharding=t.sharding()),
        jax.ShapeDtypeStruct((experts,), jnp.int32, sharding=t.sharding()),
    )
    loss = lambda x, w, g: jnp.sum(jax.lax.ragged_dot(x, w, g).astype(F32) ** 2)
    return t, jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args), 2.0 * rows * d * f


def test_walker_prices_a_ragged_dot_instruction_as_a_gemm_of_its_flops():
    """The HLO jax emits for a GPU holds ``ragged-dot`` instructions (three, one per mode): the
    walker must price each as a GEMM of one dense product of all rows, not as memory."""
    _, lowered, one = _h100_lowered()
    text = lowered.compiler_ir("hlo").as_hlo_text()
    gemms = [k for k in kernels_of(text) if k.op == "ragged-dot"]
    assert [k.kind for k in gemms] == ["gemm"] * 3
    assert [k.flops for k in gemms] == [one] * 3


def test_h100_compile_runs_ragged_dots_as_dense_dots_over_all_experts():
    """What XLA (jax 0.10's) runs on an H100: its ragged-dot rewriter turns each grouped GEMM
    into a dense dot over all E experts (masked rows), E times the useful FLOPs. The walker
    prices the compiled program, so it sees three GEMMs of E x the product. If XLA starts
    running grouped GEMMs, this fails and the ratio in the report must be revisited."""
    t, lowered, one = _h100_lowered(experts=8)
    from remat_kit.targets import analysis_options

    text = lowered.compile(compiler_options=analysis_options(t)).as_text()
    gemms = sorted(k.flops for k in kernels_of(text) if k.kind == "gemm")
    assert gemms == [8 * one] * 3


# --------------------------------------------------------------------------------------------
# The user's MoE model: residuals, the note, the policies


@functools.cache
def _model(policy, scan=True, shard_map=False, layers=2):
    m = moe_factory.Model(policy, layers=layers, scan=scan, shard_map=shard_map)
    tok = _spec(2, 8, dtype=jnp.int32)
    params = jax.eval_shape(m.init, jax.random.key(0), tok)
    loss = lambda p, t: m.apply(p, t).mean()
    return loss, params, tok


def _per_layer_bytes(m=moe_factory.Model):
    """Ragged-dot outputs of one layer, from the factory's shapes by hand: 2 x 8 tokens, top-2,
    so 32 rows; gate and up (rows, ff), out (rows, width); float32."""
    rows = 2 * 8 * 2
    return rows * (m.ff + m.ff + m.width) * 4


def _residuals(policy, **kw):
    loss, params, tok = _model(policy, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return rk.saved_residuals(loss, params, tok, policy=policy)


@pytest.mark.parametrize("scan", [True, False], ids=["scan", "unrolled"])
@pytest.mark.parametrize("shard_map", [False, True], ids=["plain", "shard_map"])
def test_expert_outputs_saved_inside_shard_map_are_traced_to_their_tags(scan, shard_map):
    """A name policy saving the expert outputs, with or without shard_map around them: the
    residual table names them by tag, as saved, with the bytes of every layer."""
    spec = "names:save=" + "+".join(EXPERT_TAGS)
    # The model tags these tensors itself, with names outside remat_kit's vocabulary: the
    # policy says so as it is made, and still matches them.
    with pytest.warns(UserWarning, match="'expert_gate', 'expert_up', 'expert_out' not in"):
        rep = _residuals(spec, scan=scan, shard_map=shard_map)
    assert {t: rep.tags[t] for t in EXPERT_TAGS} == dict.fromkeys(EXPERT_TAGS, "saved")
    assert not [r for r in rep.residuals if r.name == "<shard_map>"]
    kept = sum(r.nbytes for r in rep.residuals if r.name in EXPERT_TAGS)
    assert kept == 2 * _per_layer_bytes()


def _forward(policy, **kw):
    loss, params, tok = _model(policy, **kw)
    return jax.make_jaxpr(loss)(params, tok)


@pytest.mark.parametrize("scan", [True, False], ids=["scan", "unrolled"])
@pytest.mark.parametrize(
    ("policy", "suggest"),
    [
        ("dots", "dots_and_ragged"),
        ("dots_no_batch", "dots_no_batch_and_ragged"),
        ("offload_dots_no_batch", "offload_dots_no_batch_and_ragged"),
        (jax.checkpoint_policies.dots_with_no_batch_dims_saveable, "dots_no_batch_and_ragged"),
    ],
    ids=["dots", "dots_no_batch", "offload_dots_no_batch", "jax_callable"],
)
def test_dot_policies_say_they_recompute_the_expert_gemms(policy, suggest, scan):
    note = checks.ragged_dots_recomputed(_forward(policy, scan=scan, shard_map=True))
    assert note is not None and note.kind == "ragged_dots_recomputed"
    assert note.data["per_layer_bytes"] == _per_layer_bytes()
    assert note.data["layers"] == 2
    assert note.data["suggest"] == suggest
    assert f"{size_words(_per_layer_bytes())} per layer, 2 layers" in words(note)


@pytest.mark.parametrize(
    "policy",
    [
        "full",
        "minimal",
        "names:save=expert_gate",
        "dots_and_ragged",
        "dots_no_batch_and_ragged",
        "offload_dots_no_batch_and_ragged",
    ],
)
def test_no_note_when_the_policy_is_not_a_dot_policy_or_keeps_them(policy):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert checks.ragged_dots_recomputed(_forward(policy)) is None


@pytest.mark.parametrize(
    ("policy", "kind"),
    [
        ("dots_no_batch", None),
        ("dots_and_ragged", "saved"),
        ("dots_no_batch_and_ragged", "saved"),
        ("offload_dots_no_batch_and_ragged", "offloaded"),
        ("ragged_dots", "saved"),
    ],
)
@pytest.mark.parametrize("shard_map", [False, True], ids=["plain", "shard_map"])
def test_the_suggested_policies_keep_the_expert_gemms(policy, kind, shard_map):
    """What the note's suggestions save: the expert outputs, every layer's, as residuals
    (shard_map or not); the dot policy they replace keeps none of them."""
    rep = _residuals(policy, shard_map=shard_map)
    kept = [r for r in rep.residuals if r.name in EXPERT_TAGS]
    if kind is None:
        assert kept == [] and set(rep.tags.values()) == {"recomputed"}
        return
    assert {r.kind for r in kept} == {kind}
    assert sum(r.nbytes for r in kept) == 2 * _per_layer_bytes()
    assert {t: rep.tags[t] for t in EXPERT_TAGS} == dict.fromkeys(EXPERT_TAGS, kind)


@pytest.mark.slow
@pytest.mark.parametrize(
    "policy",
    ["ragged_dots", "dots_and_ragged", "dots_no_batch_and_ragged", "offload_dots_no_batch"],
)
def test_ragged_policies_keep_gradients(policy):
    ref_m = moe_factory.Model("none", shard_map=True)
    got_m = moe_factory.Model(policy, shard_map=True)
    tok = jax.random.randint(jax.random.key(1), (2, 8), 0, moe_factory.VOCAB)
    params = ref_m.init(jax.random.key(0), tok)
    grad = lambda m: jax.grad(lambda p: m.apply(p, tok).mean())(params)
    chex.assert_trees_all_close(grad(got_m), grad(ref_m), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------
# The planner's per-tag prices


@pytest.mark.slow
def test_planner_prices_an_expert_tag_at_its_ragged_dot_flops():
    """The cost model's price of recomputing ``expert_out`` (the others kept) is at least its
    grouped GEMM, 2 x rows x ff x width per layer; its extra matmul FLOPs are exactly that."""

    def step(policy):
        m = moe_factory.Model(policy, layers=2)
        tok = _spec(2, 8, dtype=jnp.int32)
        params = jax.eval_shape(m.init, jax.random.key(0), tok)
        loss = lambda p, t: m.apply(p, t).mean()
        return loss, params, tok

    def flops_fn(pol, sch, batch):
        loss, params, tok = step(pol)
        return count_flops(jax.value_and_grad(loss), params, tok)

    def residuals_fn(pol, sch, batch):
        loss, params, tok = step(pol)
        return rk.saved_residuals(loss, params, tok, policy=pol)

    w = rk.sources.workload(
        rk.sources.Measured(lambda p, s, b: None, flops_fn, residuals_fn=residuals_fn),
        rk.target("h100"),
        rk.TrainConfig(1, 8),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = cost_model(w, 2, offload=False, hide=0.0, objective="flops")
        keep_all = w.traced_count(tag_policy(EXPERT_TAGS, ()), rk.schedule("none"), 2)
        keep_two = w.traced_count(tag_policy(EXPERT_TAGS[:2], ()), rk.schedule("none"), 2)
    expert_out = 2 * (2.0 * 32 * moe_factory.Model.ff * moe_factory.Model.width)
    assert keep_two.matmul - keep_all.matmul == expert_out
    assert model.cost["expert_out"] >= expert_out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("policy", "noted"), [("dots_no_batch", True), ("dots_no_batch_and_ragged", False)]
)
def test_a_report_on_a_users_moe_factory_carries_the_note(policy, noted, tmp_path):
    # Through the CLI, on the factory: the note is attached by the measuring pipeline, from
    # the traced program, for one GPU's micro-batch (2 x 8 tokens: the hand figure above).
    from remat_kit.cli import main

    out = tmp_path / "r.json"
    argv = ["report", "--model", f"{DATA}/moe_factory.py:moe", "--batch", "2", "--seq", "8"]
    assert main([*argv, "--policy", policy, "--target", "h100", "--json", str(out)]) == 0
    notes = [n for n in json.loads(out.read_text())["notes"] if n["kind"] == _NOTE]
    if not noted:
        assert notes == []
        return
    (note,) = notes
    assert note["per_layer_bytes"] == _per_layer_bytes()
    assert note["layers"] == 2 and note["suggest"] == "dots_no_batch_and_ragged"


# --------------------------------------------------------------------------------------------
# Expert GEMMs as batched einsums (the capacity dispatch): dots_no_batch misses them too


def _preset_forward(impl, policy, dtype="f32"):
    import remat_kit_models as models

    cfg = models.get_config("tiny-moe", moe_impl=impl, policy=policy, dtype=dtype)
    module = models.build(cfg)
    toks = _spec(2, 16, dtype=jnp.int32)
    params = jax.eval_shape(module.init, jax.random.key(0), toks)
    return jax.make_jaxpr(module.apply)(params, toks), cfg


def _capacity_bytes_by_hand(cfg):
    """One layer's expert GEMM outputs under the capacity dispatch: (E, groups, C, width) for
    gate and up (expert width) and out (model width), f32; 2 sequences of 16 tokens, top 2 of
    4 experts, factor 1.25: C = ceil(2 * 16 * 1.25 / 4) = 10."""
    slots = cfg.n_experts * 2 * 10
    return slots * (2 * cfg.expert_d_ff + cfg.d_model) * jnp.dtype(cfg.dtype).itemsize


@pytest.mark.parametrize(
    ("impl", "policy", "ragged", "batched"),
    [
        ("capacity", "dots_no_batch", False, True),
        # f32 weights cast to bf16 before the product: still the block's input.
        ("capacity/bf16", "dots_no_batch", False, True),
        ("capacity", "offload_dots_no_batch", False, True),
        ("capacity", "dots", False, False),  # keeps batched products too
        ("capacity", "minimal", False, False),  # not a dot policy: keeps them by name
        ("ragged", "dots_no_batch", True, False),
        ("ragged", "dots_no_batch_and_ragged", False, False),
    ],
)
def test_each_dot_policy_blind_spot_has_its_note_on_the_moe_preset(impl, policy, ragged, batched):
    impl, _, dtype = impl.partition("/")
    forward, cfg = _preset_forward(impl, policy, dtype or "f32")
    assert (checks.ragged_dots_recomputed(forward) is not None) == ragged
    note = checks.expert_dots_recomputed(forward)
    assert (note is not None) == batched
    if batched:
        assert note.data["per_layer_bytes"] == _capacity_bytes_by_hand(cfg)
        assert note.data["layers"] == cfg.n_layers
        assert "maxtext#2207" in words(note)


@pytest.mark.parametrize("attention", ["xla", "cudnn"])
def test_attention_products_are_not_taken_for_expert_gemms(attention):
    # Batched too (heads, batch), but over projections made inside the block.
    import remat_kit_models as models

    cfg = models.get_config("tiny-llama", policy="dots_no_batch", attention=attention, dtype="bf16")
    module = models.build(cfg)
    toks = _spec(2, 16, dtype=jnp.int32)
    params = jax.eval_shape(module.init, jax.random.key(0), toks)
    assert checks.expert_dots_recomputed(jax.make_jaxpr(module.apply)(params, toks)) is None
