"""Dropout in the measured step: applied where the config has it, keyed, policy-independent."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import pytest

import remat_kit as rk
import remat_kit_models as models
from remat_kit.errors import BadValue
from remat_kit_models.configure import model_config
from remat_kit_models.source import train_step
from remat_kit_models.spec import PresetSpec

# Each case traces and compiles a gradient on two shared CPU cores: a few telling policies
# (everything recomputed, projections kept, Megatron's selective) and one unrolled stack.
CASES = [("full", True), ("minimal", True), ("megatron", True), ("full", False)]


def _step(policy="none", *, rate=0.2, accum=1, optimizer="adamw", lr=1e-4, scan=True):
    cfg = models.get_config(
        "tiny-gpt2", layers=2, dropout_rate=rate, policy=policy, scan_layers=scan
    )
    config = rk.TrainConfig(batch=4, seq=16, accum=accum, optimizer=optimizer, learning_rate=lr)
    streams = ("dropout",) if rate else ()
    return rk.build_train_step(
        models.build(cfg, deterministic=not rate), config, rng_streams=streams
    )


@functools.cache
def _values(scan: bool = True):
    # Concrete weights (the module's own init) and a batch for the tiny GPT-2.
    cfg = models.get_config("tiny-gpt2", layers=2, scan_layers=scan)
    toks = jax.random.randint(jax.random.key(1), (4, 16), 0, cfg.vocab_size)
    variables = rk.strip_boxes(models.build(cfg).init(jax.random.key(0), toks))
    return variables, {"tokens": toks, "targets": jnp.roll(toks, -1, axis=1)}


def _key(seed: int) -> jax.Array:
    return jax.random.key_data(jax.random.key(seed))


@functools.cache
def _grads_fn(scan: bool):
    # One jitted program per layout holding the gradient under none and under each of its
    # cases' policies (one compile costs less than one a policy: helpers.losses_and_grads);
    # another key is another call, not a compile.
    policies = ("none", *(p for p, layout in CASES if layout == scan))
    grads = [jax.value_and_grad(_step(p, scan=scan).loss_fn) for p in policies]
    return policies, jax.jit(lambda *args: tuple(g(*args) for g in grads))


@functools.cache
def _grads_at_key(seed: int, scan: bool) -> dict:
    policies, fn = _grads_fn(scan)
    params, batch = _values(scan)
    return dict(zip(policies, fn(params, {}, batch, _key(seed)), strict=True))


def _grads_at(policy: str, seed: int, scan: bool = True):
    # Loss and gradients under ``policy`` at key ``seed``, computed once for the module: the
    # reference under none serves every case of its layout.
    return _grads_at_key(seed, scan)[policy]


@pytest.mark.slow
@pytest.mark.parametrize("policy, scan", CASES)
def test_same_key_same_gradients_under_every_policy(policy, scan):
    ref = _grads_at("none", 3, scan)
    got = _grads_at(policy, 3, scan)
    chex.assert_trees_all_close(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_dropout_is_applied_and_keyed():
    loss_a, grads_a = _grads_at("full", 3)
    loss_b, _ = _grads_at("full", 4)
    assert abs(float(loss_a) - float(loss_b)) > 1e-6  # another key, other masks
    # Without dropout (rate 0, no key) the same weights give a third loss.
    params, batch = _values()
    plain = _step("full", rate=0.0)
    loss_plain = jax.jit(plain.loss_fn)(params, {}, batch)
    assert abs(float(loss_plain) - float(loss_a)) > 1e-6
    assert jnp.isfinite(jax.tree.leaves(grads_a)[0]).all()


def test_a_dropout_steps_loss_draws_its_masks_from_the_key_it_is_given():
    """Traced, not compiled: given a key, the loss hands the module its dropout stream (issue
    58 mutant train.py:317 of seed 79, the key dropped, killed before only by the slow tier's
    gradients); flax refuses a dropout with no stream."""
    cfg = models.get_config("tiny-gpt2", layers=2)
    toks = jax.ShapeDtypeStruct((4, 16), jnp.int32)
    init = models.build(cfg).init
    params = jax.eval_shape(lambda t: rk.strip_boxes(init(jax.random.key(0), t)), toks)
    batch = {"tokens": toks, "targets": toks}
    loss = jax.eval_shape(_step(rate=0.2).loss_fn, params, {}, batch, _key(3))
    assert (loss.shape, loss.dtype) == ((), jnp.float32)


def test_step_takes_a_key_only_with_dropout():
    with_dropout, without = _step(rate=0.1), _step(rate=0.0)
    assert len(with_dropout.args) == 5 and with_dropout.rng_streams == ("dropout",)
    assert with_dropout.args[4].shape == (2,) and with_dropout.args[4].dtype == jnp.uint32
    assert len(without.args) == 4 and without.rng_streams == ()
    assert with_dropout.breakdown["batch"] == without.breakdown["batch"] + 8


@pytest.mark.slow
def test_accumulation_gives_each_micro_batch_its_own_key():
    # SGD at learning rate 1: new weights = weights - mean of the micro-batches' gradients,
    # micro-batch i drawing its masks from fold_in(rng, i).
    step = _step("full", accum=2, optimizer="sgd", lr=1.0)
    params, batch = _values()
    rng = _key(5)
    opt_state = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), step.args[2])
    new_params, _, _ = jax.jit(step.fn)(params, {}, opt_state, batch, rng)
    grad = jax.jit(jax.grad(step.loss_fn))
    halves = [jax.tree.map(lambda x, i=i: x[2 * i : 2 * i + 2], batch) for i in range(2)]
    g = [grad(params, {}, halves[i], jax.random.fold_in(rng, i)) for i in range(2)]
    expected = jax.tree.map(lambda p, a, b: p - (a + b) / 2, params, g[0], g[1])
    chex.assert_trees_all_close(new_params, expected, rtol=1e-5, atol=1e-6)
    # One key for both would give another update.
    same = grad(params, {}, halves[1], jax.random.fold_in(rng, 0))
    diffs = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), same, g[1])
    assert max(jax.tree.leaves(diffs)) > 1e-4


@pytest.mark.parametrize("streams", ["dropout", ("params",), ("dropout", "dropout"), ("",)])
def test_bad_streams(streams):
    cfg = models.get_config("tiny-gpt2", layers=2, dropout_rate=0.1)
    with pytest.raises(BadValue, match="rng_streams"):
        rk.build_train_step(
            models.build(cfg, deterministic=False),
            rk.TrainConfig(batch=2, seq=16),
            rng_streams=streams,
        )


@pytest.mark.parametrize(
    "preset, rate",
    [("gpt2-small", 0.1), ("gpt2-medium", 0.1), ("bert-base", 0.1), ("llama3-8b", 0.0)],
)
def test_presets_carry_the_published_dropout(preset, rate):
    assert models.get_config(preset).dropout_rate == rate


def test_auto_attention_falls_back_to_xla_for_dropout():
    t, config = rk.target("h100"), rk.TrainConfig(2, 64, precision="mixed")
    with_dropout = model_config(PresetSpec("tiny-gpt2", dropout=0.1), config, "full", t)
    without = model_config(PresetSpec("tiny-gpt2", dropout=0.0), config, "full", t)
    assert with_dropout.attention == "xla"
    assert without.attention == ("cudnn" if rk.cudnn_attention_available(t) else "xla")
    step = train_step(PresetSpec("tiny-gpt2", dropout=0.1), with_dropout, config, t)
    assert step.rng_streams == ("dropout",)


@pytest.mark.slow
def test_dropout_raises_the_compiled_peak():
    # The masks (and the random bits behind them) are real buffers: with dropout the step
    # needs more memory than without, same model, batch and attention.
    config = rk.TrainConfig(8, 128, precision="bf16")

    def measure(dropout):
        src = rk.sources.resolve(PresetSpec("tiny-gpt2", dropout=dropout, attention="xla"))
        return rk.sources.measure(src, "none", "h100", config, warn=False)

    with_dropout, without = measure(0.1), measure(0.0)
    assert with_dropout.meta["dropout"] == 0.1 and without.meta["dropout"] == 0.0
    assert with_dropout.peak_bytes > without.peak_bytes
    assert with_dropout.temp_bytes > without.temp_bytes
