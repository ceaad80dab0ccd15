"""Precision regimes: the dtypes and bytes of weights, gradients and optimizer state.

Expected byte counts come from the parameter count (``ModelConfig.param_count``, the model's
published-shape formula) and the regime's itemsizes, never from the step's own breakdown.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import traverse_util

import remat_kit as rk
import remat_kit_models as models
from remat_kit.errors import BadValue, UnknownName
from remat_kit.render import precision_words
from remat_kit.train import PRECISIONS, precision, regime, with_state_dtype
from remat_kit_models.spec import PresetSpec

BF16, F32 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)

#: regime -> (weights, gradients, optimizer state) dtypes, as the field defines them.
REGIMES = {
    "bf16": (BF16, BF16, BF16),
    "mixed": (F32, F32, F32),
    "bf16-f32-moments": (BF16, BF16, F32),
    "f32": (F32, F32, F32),
}

# tiny-llama: 4 layers x (attention 64*16*(4+4+2+2) + SwiGLU 3*64*128 + 2 norms) + embed + head
# + final norm; written out here so a wrong param_count would show too.
TINY_PARAMS = 4 * (64 * 16 * 12 + 3 * 64 * 128 + 2 * 64) + 2 * 256 * 64 + 64
# LoRA rank r on q (64->64), k, v (64->32), out (64->64), wi_0, wi_1 (64->128), wo (128->64).
LORA_PER_RANK = 4 * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 3 * (64 + 128))


def _floats(tree):
    return [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]


def _step(regime, lora_rank=0):
    cfg = models.get_config("tiny-llama", policy="full", lora_rank=lora_rank)
    config = rk.TrainConfig(batch=2, seq=16, lora=lora_rank > 0, precision=regime)
    return cfg, rk.build_train_step(models.build(cfg), config)


def test_param_count_formula():
    assert models.get_config("tiny-llama").param_count() == TINY_PARAMS


@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_dtypes_and_bytes_per_regime(regime):
    w, g, o = REGIMES[regime]
    _, step = _step(regime)
    tr, fr, opt, _ = step.args
    assert {x.dtype for x in _floats(tr)} == {w}
    assert fr == {}
    assert {x.dtype for x in _floats(opt)} == {o}
    grads = jax.eval_shape(jax.grad(step.loss_fn), *step.loss_args)
    assert {x.dtype for x in _floats(grads)} == {g}
    # AdamW: two moments per weight and one int32 step count.
    assert step.breakdown["weights"] == TINY_PARAMS * w.itemsize
    assert step.breakdown["gradients"] == TINY_PARAMS * g.itemsize
    assert step.breakdown["optimizer"] == 2 * TINY_PARAMS * o.itemsize + 4
    assert step.precision == {
        "name": regime,
        "params": w.name,
        "frozen": "-",
        "grads": g.name,
        "optimizer_state": o.name,
        "compute": precision(regime).compute.name,
    }


@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_state_keeps_its_dtypes_through_a_step(regime):
    # Donation reuses the buffers: what the step returns must have the dtypes it was given.
    _, step = _step(regime)
    new_tr, new_opt, loss = jax.eval_shape(step.fn, *step.args)
    same = lambda a, b: jax.tree.map(lambda x, y: (x.shape, x.dtype) == (y.shape, y.dtype), a, b)
    assert all(jax.tree.leaves(same(new_tr, step.args[0])))
    assert all(jax.tree.leaves(same(new_opt, step.args[2])))
    assert loss.dtype == F32


@pytest.mark.parametrize(
    "regime, adapters, base", [("mixed", F32, BF16), ("bf16", BF16, BF16), ("f32", F32, F32)]
)
def test_lora_keeps_bf16_base_weights(regime, adapters, base):
    rank = 4
    _, step = _step(regime, lora_rank=rank)
    tr, fr, opt, _ = step.args
    n_lora = LORA_PER_RANK * rank
    assert all("lora" in "/".join(k) for k in traverse_util.flatten_dict(tr))
    assert {x.dtype for x in _floats(tr)} == {adapters}
    assert {x.dtype for x in _floats(fr)} == {base}
    assert {x.dtype for x in _floats(opt)} == {adapters}
    assert step.breakdown["trainable"] == n_lora * adapters.itemsize
    assert step.breakdown["weights"] == n_lora * adapters.itemsize + TINY_PARAMS * base.itemsize
    assert step.breakdown["optimizer"] == 2 * n_lora * adapters.itemsize + 4


def test_without_a_regime_the_module_decides():
    # precision=None keeps the module's dtypes (tiny-llama: f32) and optax's state dtypes.
    _, step = _step(None)
    assert {x.dtype for x in _floats(step.args[0])} == {F32}
    assert step.precision["name"] == "as built"
    assert step.precision["compute"] == "module's own"


def test_f32_moments_update_equals_adamw_in_f32():
    # bf16 weights with f32 moments: the update is exactly AdamW's on f32 copies.
    key1, key2 = jax.random.split(jax.random.key(0))
    params = {"w": jax.random.normal(key1, (8, 4)).astype(jnp.bfloat16)}
    grads = {"w": jax.random.normal(key2, (8, 4)).astype(jnp.bfloat16)}
    opt = with_state_dtype(optax.adamw(1e-2, weight_decay=0.01), jnp.float32)
    state = opt.init(params)
    assert {x.dtype for x in _floats(state)} == {F32}
    ref = optax.adamw(1e-2, weight_decay=0.01)
    as_f32 = lambda t: jax.tree.map(lambda x: x.astype(jnp.float32), t)
    ref_state = ref.init(as_f32(params))
    for _ in range(3):
        updates, state = opt.update(grads, state, params)
        ref_updates, ref_state = ref.update(as_f32(grads), ref_state, as_f32(params))
        chex.assert_trees_all_close(updates, ref_updates, rtol=0, atol=0)
        chex.assert_trees_all_equal_dtypes(state, ref_state)
    new = optax.apply_updates(params, updates)
    assert new["w"].dtype == BF16


def test_optax_mu_dtype_alone_leaves_nu_in_the_weights_dtype():
    # Why with_state_dtype exists: optax sets only the first moment's dtype.
    state = optax.adamw(1e-3, mu_dtype=jnp.float32).init({"w": jnp.zeros(3, jnp.bfloat16)})
    assert state[0].mu["w"].dtype == F32
    assert state[0].nu["w"].dtype == BF16


def test_named_regimes():
    assert set(PRECISIONS) == set(REGIMES)
    assert rk.train.DEFAULT_PRECISION == "mixed"
    p = precision("mixed")
    assert (p.params, p.compute, p.grads, p.optimizer_state, p.frozen) == (
        F32,
        BF16,
        F32,
        F32,
        BF16,
    )


def test_unknown_regime_names_close_ones():
    with pytest.raises(UnknownName, match="Did you mean mixed"):
        precision("mixd")


@pytest.mark.parametrize("dtype", ["int8", "bogus", jnp.int32])
def test_precision_rejects_non_float(dtype):
    with pytest.raises(BadValue, match="not a floating dtype"):
        precision("mixed").replace(params=dtype)


def test_replace_makes_a_custom_regime():
    p = precision("mixed").replace(compute="f32")
    assert p.name == "custom" and p.compute == F32 and p.params == F32


@pytest.mark.parametrize(
    "kw, name, compute",
    [
        ({}, "mixed", BF16),
        ({"params": "f32"}, "mixed", BF16),
        ({"params": "bf16"}, "bf16", BF16),
        ({"name": "bf16-f32-moments"}, "bf16-f32-moments", BF16),
        ({"name": "bf16", "params": "bf16"}, "bf16", BF16),
        ({"name": "mixed", "compute": "f32"}, "custom", F32),
        ({"params": "bf16", "compute": "bf16"}, "bf16", BF16),
    ],
)
def test_regime_of_a_request(kw, name, compute):
    p = regime(**kw)
    assert (p.name, p.compute) == (name, compute)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"name": "bf16", "params": "f32"}, "contradicts precision=bf16"),
        ({"params": "f16"}, "use bf16 or f32"),
    ],
)
def test_regime_conflicts(kw, match):
    with pytest.raises(BadValue, match=match):
        regime(**kw)


def test_model_config_follows_the_regime():
    from remat_kit_models.configure import model_config

    config = rk.TrainConfig(2, 16, precision="mixed")
    cfg = model_config(PresetSpec("tiny-llama"), config, "full", rk.target("cpu"))
    assert (jnp.dtype(cfg.param_dtype), jnp.dtype(cfg.dtype)) == (F32, BF16)


def test_cli_flag():
    from remat_kit.cli._args import Parser, add_model_args

    p = Parser()
    add_model_args(p)
    assert p.parse_args(["--model", "x", "--precision", "bf16-f32-moments"]).precision == (
        "bf16-f32-moments"
    )
    with pytest.raises(SystemExit):
        p.parse_args(["--model", "x", "--precision", "mixd"])


@pytest.mark.slow
def test_report_names_its_precision():
    src = rk.sources.resolve(PresetSpec("tiny-llama"))
    config = rk.TrainConfig(2, 32, precision="bf16-f32-moments")
    r = rk.sources.measure(src, "full", "h100", config, warn=False)
    assert r.meta["precision"]["optimizer_state"] == "float32"
    assert r.meta["precision"]["params"] == "bfloat16"
    words = precision_words(r.meta["precision"])
    assert words == (
        "precision bf16-f32-moments: weights bf16, grads bf16, optimizer state f32, compute bf16"
    )


def test_precision_words_lora_and_sgd():
    rec = {
        "name": "mixed",
        "params": "float32",
        "frozen": "bfloat16",
        "grads": "float32",
        "optimizer_state": "-",
        "compute": "bfloat16",
    }
    assert precision_words(rec) == (
        "precision mixed: trained f32, frozen bf16, grads f32, no optimizer state, compute bf16"
    )
    assert precision_words(None) == ""


@pytest.mark.parametrize(
    ("optimizer", "state"),
    [("sgd", "-"), ("sgd_momentum", "float32"), ("adamw", "float32"), ("lion", "float32")],
)
def test_the_title_from_the_request_names_the_state_the_compiled_step_has(optimizer, state):
    """plan and fit title a run from its request, compare from the compiled step: both must
    say "no optimizer state" for sgd (mixed precision keeps f32 state for the others)."""
    config = rk.TrainConfig(2, 32, optimizer=optimizer, precision=regime())
    src = rk.sources.resolve(PresetSpec("tiny-llama"))
    record = rk.train.planned_precision(config, own_compute=src.own_model)
    assert record["optimizer_state"] == state
    step = rk.build_train_step(models.build(models.get_config("tiny-llama")), config)
    assert step.precision["optimizer_state"] == state
    assert ("no optimizer state" in precision_words(record)) == (state == "-")


def test_a_request_s_record_is_the_built_step_s_unless_the_model_is_the_users_code():
    """planned_precision's default is a model of ours, which computes in the regime's dtype
    (issue 58 mutant train.py:170 ``own_compute`` False -> True of seed 106)."""
    config = rk.TrainConfig(2, 32, optimizer="adamw", precision=regime())
    step = rk.build_train_step(models.build(models.get_config("tiny-llama")), config)
    assert rk.train.planned_precision(config) == dict(step.precision)
    own = rk.train.planned_precision(config, own_compute=True)
    assert own == {**step.precision, "compute": "module's own"}
