"""The train step: it trains, its breakdown adds up, LoRA and accumulation behave."""

import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

import remat_kit as rk
import remat_kit_models as models
from conftest import SMALL
from helpers import tokens
from remat_kit.flops import scan_operand_split


def _concrete(tree, seed=0):
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noise = [
        0.02 * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)
    ]
    return jax.tree.unflatten(treedef, noise)


def _split(step, params):
    from flax import traverse_util

    flat = traverse_util.flatten_dict(params)
    tr_keys = set(traverse_util.flatten_dict(step.args[0]))
    tr = traverse_util.unflatten_dict({k: v for k, v in flat.items() if k in tr_keys})
    fr = traverse_util.unflatten_dict({k: v for k, v in flat.items() if k not in tr_keys})
    return tr, fr


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "sgd", "lion", "adafactor"])
def test_step_trains_on_cpu(optimizer):
    cfg = models.get_config("tiny-llama", layers=2, policy="full")
    module = models.build(cfg)
    step = rk.build_train_step(
        module, rk.TrainConfig(batch=4, seq=16, optimizer=optimizer, learning_rate=3e-3)
    )
    params = module.init(jax.random.key(0), jnp.zeros((4, 16), jnp.int32))
    tr, fr = _split(step, params)
    opt_state = rk.train.make_optimizer(optimizer, 3e-3).init(tr)
    toks = tokens(batch=4, seq=16)
    batch = {"tokens": toks, "targets": jnp.roll(toks, -1, axis=1)}
    fn = jax.jit(step.fn)
    losses = []
    for _ in range(5):
        tr, opt_state, loss = fn(tr, fr, opt_state, batch)
        losses.append(float(loss))
    assert np.isfinite(losses).all()
    # Near-zero logits at initialisation: the uniform distribution's loss, ln(vocab).
    assert losses[0] == pytest.approx(np.log(cfg.vocab_size), abs=0.05)
    assert losses[-1] < losses[0] - 0.01


@pytest.mark.slow
def test_accumulation_equals_one_big_batch():
    cfg = models.get_config("tiny-llama", layers=2)
    module = models.build(cfg)
    params = module.init(jax.random.key(0), jnp.zeros((4, 16), jnp.int32))
    toks = tokens(batch=4, seq=16)
    batch = {"tokens": toks, "targets": jnp.roll(toks, -1, axis=1)}
    steps = [
        rk.build_train_step(
            module, rk.TrainConfig(batch=4, seq=16, optimizer="sgd", accum=accum, learning_rate=0.1)
        )
        for accum in (1, 2, 4)
    ]
    tr, fr = _split(steps[0], params)
    opt_state = rk.train.make_optimizer("sgd", 0.1).init(tr)
    # The three steps in one program: one compile (helpers.losses_and_grads says why).
    results = jax.jit(lambda *args: tuple(s.fn(*args) for s in steps))(tr, fr, opt_state, batch)
    for other in results[1:]:
        chex.assert_trees_all_close(other[0], results[0][0], rtol=1e-5, atol=1e-6)
        chex.assert_trees_all_close(other[2], results[0][2], rtol=1e-5)


class _Bigram(nn.Module):
    """The smallest language model: a token's embedding read out as the next's logits."""

    @nn.compact
    def __call__(self, tokens):
        return nn.Dense(16)(nn.Embed(16, 8)(tokens))


def test_accumulated_micro_batches_step_as_the_whole_batch_by_hand():
    # The gradient of the whole batch's mean loss worked out in numpy (a bigram model's
    # backward pass by hand), and one SGD step from it: four micro-batches of one sequence
    # each, summed and divided by their count, must land there.
    rng, lr = np.random.default_rng(0), 0.5
    emb = rng.normal(size=(16, 8)).astype(np.float32)
    kernel = rng.normal(size=(8, 16)).astype(np.float32)
    bias = rng.normal(size=16).astype(np.float32)
    toks = rng.integers(0, 16, size=(4, 8))
    targets = np.roll(toks, -1, axis=1)
    h = emb[toks]  # [4, 8, 8]
    logits = h @ kernel + bias
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    loss = -np.log(np.take_along_axis(p, targets[..., None], -1)).mean()
    dlogits = (p - np.eye(16)[targets]) / targets.size
    d_emb = np.zeros_like(emb)
    np.add.at(d_emb, toks, dlogits @ kernel.T)
    expected = {
        "Embed_0": {"embedding": emb - lr * d_emb},
        "Dense_0": {
            "kernel": kernel - lr * np.einsum("bsi,bso->io", h, dlogits),
            "bias": bias - lr * dlogits.sum((0, 1)),
        },
    }
    params = {"Embed_0": {"embedding": emb}, "Dense_0": {"kernel": kernel, "bias": bias}}
    config = rk.TrainConfig(batch=4, seq=8, optimizer="sgd", accum=4, learning_rate=lr)
    step = rk.build_train_step(_Bigram(), config)
    tr, fr = _split(step, {"params": params})
    opt_state = rk.train.make_optimizer("sgd", lr).init(tr)
    batch = {"tokens": jnp.asarray(toks, jnp.int32), "targets": jnp.asarray(targets, jnp.int32)}
    new, _, got_loss = jax.jit(step.fn)(tr, fr, opt_state, batch)
    chex.assert_trees_all_close(new["params"], expected, rtol=1e-5, atol=1e-6)
    assert float(got_loss) == pytest.approx(loss, rel=1e-5)


def test_a_step_with_rng_streams_takes_a_raw_threefry_key():
    # build_train_step's docstring: with rng_streams, fn takes a last argument rng, "a raw
    # threefry key, uint32[2] (jax.random.key_data(jax.random.key(0)))", after the batch.
    config = rk.TrainConfig(batch=2, seq=8, optimizer="sgd")
    keyed = rk.build_train_step(_Bigram(), config, rng_streams=("dropout",))
    raw = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))
    rng = keyed.args[-1]
    assert (rng.shape, rng.dtype) == (raw.shape, raw.dtype) == ((2,), "uint32")
    assert len(keyed.args) == 5 and keyed.rng_streams == ("dropout",)


def test_breakdown_from_shapes():
    cfg = models.get_config("tiny-llama", param_dtype="f32")
    n = cfg.param_count()
    adamw = rk.build_train_step(models.build(cfg), rk.TrainConfig(batch=2, seq=16))
    sgd = rk.build_train_step(models.build(cfg), rk.TrainConfig(batch=2, seq=16, optimizer="sgd"))
    assert adamw.breakdown["weights"] == 4 * n == adamw.breakdown["gradients"]
    # Two f32 moments per weight plus a step counter or two.
    assert 8 * n <= adamw.breakdown["optimizer"] <= 8 * n + 64
    assert sgd.breakdown["optimizer"] <= 64
    assert adamw.breakdown["batch"] == 2 * 2 * 16 * 4


@pytest.mark.parametrize("policy,schedule", [("minimal", "none"), ("full", "every:2")])
def test_abstract_params_given_are_the_ones_init_would_trace(policy, schedule):
    """A preset lays out its parameters the same under every policy and schedule, so the
    search builds each step from one traced ``init`` (remat_kit_models.source.train_step): the
    step is the same."""
    cfg = models.get_config("tiny-llama", policy=policy, schedule=schedule)
    plain = models.get_config("tiny-llama")
    tokens_shape = jax.ShapeDtypeStruct((2, 16), jnp.int32)
    boxed = jax.eval_shape(models.build(plain).init, jax.random.key(0), tokens_shape)
    config = rk.TrainConfig(batch=2, seq=16, optimizer="adamw")
    own = rk.build_train_step(models.build(cfg), config)
    given = rk.build_train_step(models.build(cfg), config, abstract_params=boxed)
    chex.assert_trees_all_equal_shapes_and_dtypes(own.args, given.args)
    assert own.breakdown == given.breakdown


def test_abstract_params_given_are_used():
    narrow = models.get_config("tiny-llama")
    wide = narrow.replace(d_model=128, n_heads=4, n_kv_heads=4)
    boxed = jax.eval_shape(
        models.build(wide).init, jax.random.key(0), jax.ShapeDtypeStruct((2, 16), jnp.int32)
    )
    config = rk.TrainConfig(batch=2, seq=16)
    step = rk.build_train_step(models.build(narrow), config, abstract_params=boxed)
    size = jnp.dtype(wide.param_dtype).itemsize
    assert step.breakdown["weights"] == wide.param_count() * size
    assert step.breakdown["weights"] != narrow.param_count() * size


def test_lora_trains_only_adapters():
    cfg = models.get_config("tiny-llama", lora_rank=4)
    step = rk.build_train_step(models.build(cfg), rk.TrainConfig(batch=2, seq=16, lora=True))
    from flax import traverse_util

    trained = traverse_util.flatten_dict(step.args[0])
    assert trained and all(any("lora" in k for k in path) for path in trained)
    assert step.breakdown["trainable"] < step.breakdown["weights"] / 5
    assert step.breakdown["optimizer"] <= 2 * step.breakdown["trainable"] + 64
    base = models.get_config("tiny-llama")
    with pytest.raises(ValueError, match="no parameter with 'lora'"):
        rk.build_train_step(models.build(base), rk.TrainConfig(batch=2, seq=16, lora=True))


@pytest.mark.slow
def test_lora_gradients_unchanged_by_policy():
    cfg = models.get_config("tiny-gpt2", layers=2, lora_rank=4, scan_layers=False)
    module = models.build(cfg)
    params = module.init(jax.random.key(0), jnp.zeros((2, 16), jnp.int32))
    params = _concrete(params, seed=3)  # non-zero B so every adapter has a gradient
    toks = tokens(batch=2, seq=16)
    batch = {"tokens": toks, "targets": toks}
    steps = [
        rk.build_train_step(
            models.build(cfg.replace(policy=policy)), rk.TrainConfig(batch=2, seq=16, lora=True)
        )
        for policy in ("none", "full", "minimal")
    ]
    tr, fr = _split(steps[0], params)
    # The three gradients in one program: one compile (helpers.losses_and_grads says why).
    grads = jax.jit(lambda *args: tuple(jax.grad(s.loss_fn)(*args) for s in steps))(tr, fr, batch)
    for g in grads[1:]:
        chex.assert_trees_all_close(g, grads[0], rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_lora_and_accumulation_shrink_the_gpu_peak(small):
    full_ft = small("full")
    lora = small("full", optimizer="adamw", lora=8)
    adamw = small("full", optimizer="adamw")
    assert lora.peak_bytes < adamw.peak_bytes
    assert lora.breakdown["optimizer"] < adamw.breakdown["optimizer"] / 10
    accum = small("none", batch=16, accum=4)
    big = small("none", batch=16)
    assert accum.breakdown["activations"] < big.breakdown["activations"] / 2
    assert full_ft.breakdown["grad_accumulator"] == 0
    # The accumulator holds one gradient's worth: bf16, 2 bytes per trainable parameter.
    n = models.get_config("tiny-llama", **dict(SMALL["overrides"])).param_count()
    assert accum.breakdown["grad_accumulator"] == accum.breakdown["gradients"] == 2 * n


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(batch=0, seq=16), ValueError, "batch=0 must be positive"),
        (dict(batch=2, seq=-1), ValueError, "seq=-1"),
        (dict(batch=6, seq=16, accum=4), ValueError, "does not split"),
        (dict(batch=2, seq=16, optimizer="adamww"), ValueError, "Did you mean adamw"),
        (dict(batch=2.0, seq=16), TypeError, "batch must be an int"),
    ],
)
def test_bad_train_config(kwargs, error, match):
    with pytest.raises(error, match=match):
        rk.TrainConfig(**kwargs)


_LOGITS = jnp.zeros((1, 2, 3))


@pytest.mark.parametrize(
    ("out", "want"),
    [
        (types.SimpleNamespace(logits=_LOGITS, loss=None), _LOGITS),  # Hugging Face's output
        ((_LOGITS, None), _LOGITS),  # a tuple: the logits first
        ([_LOGITS], _LOGITS),
        (_LOGITS, _LOGITS),
        (jax.ShapeDtypeStruct((1, 2, 3), jnp.float32), None),  # as a trace sees it
    ],
    ids=["logits-attribute", "tuple", "list", "array", "shape-struct"],
)
def test_the_logits_are_read_from_what_a_model_returns(out, want):
    got = rk.train.logits_of(out)
    assert got is (out if want is None else want)


@pytest.mark.parametrize(
    "out",
    [
        types.SimpleNamespace(shape=(1, 2, 3)),  # a shape and no dtype: not an array
        types.SimpleNamespace(dtype=jnp.float32),  # a dtype and no shape
        {"logits": _LOGITS},  # a mapping is not read by key
        (),
        (None, _LOGITS),  # the logits must come first
    ],
    ids=["shape-only", "dtype-only", "dict", "empty-tuple", "logits-second"],
)
def test_an_output_that_is_not_logits_is_refused_naming_its_type(out):
    with pytest.raises(rk.errors.BadValue, match=rf"returned {type(out).__name__}, not logits"):
        rk.train.logits_of(out)


# --- gradient accumulation: its dtype and bytes; donation as the compiled program shows it -------


def _leaf_bytes(tree) -> int:
    return sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def _accum_step(accum_dtype, layers=2, seq=64):
    cfg = models.get_config("tiny-llama", layers=layers, policy="full", attention="xla")
    config = rk.TrainConfig(
        batch=4, seq=seq, optimizer="sgd", precision="bf16", accum=2, accum_dtype=accum_dtype
    )
    return cfg, rk.build_train_step(models.build(cfg), config)


@pytest.mark.parametrize(("accum_dtype", "itemsize"), [(None, 2), (jnp.float32, 4)])
def test_the_accumulator_has_its_dtype_in_the_program_and_the_shapes(accum_dtype, itemsize):
    cfg, step = _accum_step(accum_dtype)
    n = cfg.param_count()
    # The shapes' estimate: one accumulator per trained weight, in its dtype (default: the
    # gradients', bf16 here), beside the bf16 gradients themselves.
    assert step.breakdown["grad_accumulator"] == itemsize * n
    assert step.breakdown["gradients"] == 2 * n
    # The traced program: the micro-batch loop carries the accumulator in that dtype.
    jaxpr = jax.make_jaxpr(step.fn)(*step.args).jaxpr
    (scan,) = [e for e in jaxpr.eqns if e.primitive.name == "scan"]
    _, num_carry = scan_operand_split(scan)  # a param before jax 0.12, a flat tree after
    carried = [v.aval for v in scan.outvars[:num_carry]]
    weights = {(x.shape, x.dtype) for x in jax.tree.leaves(step.args[0])}
    acc = [a for a in carried if (a.shape, jnp.dtype(jnp.bfloat16)) in weights]
    assert sum(a.size for a in acc) == n
    assert {str(a.dtype) for a in acc} == {"bfloat16" if accum_dtype is None else "float32"}


@pytest.mark.slow
def test_the_measured_breakdown_counts_the_accumulator_as_gradients():
    from remat_kit.breakdown import measured_breakdown

    _, step = _accum_step(None, layers=1, seq=32)
    parts = measured_breakdown(step, "h100")
    # Mid-step the accumulator is live: at least its bytes are gradients.
    assert parts["gradients"] >= step.breakdown["grad_accumulator"] > 0


def _compiled_aliases(step):
    """(input leaf -> output leaf aliases, alias bytes) of the step compiled for an H100."""
    import re

    from remat_kit.analysis import abstract
    from remat_kit.targets import analysis_options

    t = rk.target("h100")
    args = tuple(abstract(a, t.sharding()) for a in step.args)
    jitted = jax.jit(step.fn, donate_argnums=step.donate_argnums)
    compiled = jitted.lower(*args).compile(compiler_options=analysis_options(t))
    header = compiled.as_text().split("\n", 1)[0]
    pairs = re.findall(r"\{(\d+)\}: \((\d+), \{\}, may-alias\)", header)
    return {int(i): int(o) for o, i in pairs}, compiled.memory_analysis().alias_size_in_bytes


def _lora_step(donate):
    cfg = models.get_config("tiny-llama", layers=1, lora_rank=4, attention="xla")
    config = rk.TrainConfig(batch=2, seq=16, optimizer="adamw", lora=True, donate=donate)
    return rk.build_train_step(models.build(cfg), config)


@pytest.mark.slow
def test_the_step_donates_trained_weights_and_optimizer_state_only():
    step = _lora_step(donate=True)
    aliases, alias_bytes = _compiled_aliases(step)
    tr, fr, opt, _ = (jax.tree.leaves(a) for a in step.args)
    # Inputs in argument order: trained weights, frozen weights, optimizer state, batch;
    # outputs: trained weights, optimizer state, loss. Each donated input becomes the output
    # in its place; frozen weights and the batch are not donated.
    n_tr, n_fr, n_opt = len(tr), len(fr), len(opt)
    want = {i: i for i in range(n_tr)}
    want |= {n_tr + n_fr + j: n_tr + j for j in range(n_opt)}
    assert aliases == want
    assert alias_bytes == _leaf_bytes(tr) + _leaf_bytes(opt)
    assert _leaf_bytes(fr) > 10 * _leaf_bytes(tr)  # LoRA: what is not donated is most of it


def _donated_inputs(step) -> set[int]:
    """The input leaves the lowered program hands XLA as donated (aliased to an output, or
    a donor XLA may reuse): what the compiled program may overwrite in place."""
    import re

    text = jax.jit(step.fn, donate_argnums=step.donate_argnums).lower(*step.args).as_text()
    main = text[text.index("func.func public @main(") :].split("\n", 1)[0]
    args = re.split(r"%arg(\d+): ", main)[1:]
    marks = ("tf.aliasing_output", "jax.buffer_donor")
    pairs = zip(args[::2], args[1::2], strict=True)
    return {int(i) for i, attrs in pairs if any(m in attrs for m in marks)}


@pytest.mark.slow
def test_the_program_donates_what_the_step_may_overwrite_and_nothing_without_donation():
    donated = _lora_step(donate=True)
    n_tr, n_fr, n_opt = (len(jax.tree.leaves(a)) for a in donated.args[:3])
    want = set(range(n_tr)) | set(range(n_tr + n_fr, n_tr + n_fr + n_opt))
    # Frozen weights and the batch are the caller's to keep: never donated.
    assert _donated_inputs(donated) == want
    assert _donated_inputs(_lora_step(donate=False)) == set()


def test_a_step_donates_by_default():
    cfg = models.get_config("tiny-llama", layers=1, attention="xla")
    model = models.build(cfg)
    step = rk.build_train_step(model, rk.TrainConfig(batch=2, seq=16))
    kept = rk.build_train_step(model, rk.TrainConfig(batch=2, seq=16, donate=False))
    assert rk.TrainConfig(batch=2, seq=16).donate is True
    # Trained weights and optimizer state are donated; nothing is without donation.
    assert step.donate_argnums == (0, 2) and kept.donate_argnums == ()


def test_a_mesh_given_is_the_one_the_step_uses_and_none_builds_the_plans():
    from remat_kit import sharding
    from remat_kit.train import _plan_and_mesh

    plan = sharding.parse_shard("fsdp:1")
    mesh = plan.mesh(rk.target("local", devices=1))
    got_plan, got_mesh = _plan_and_mesh("fsdp:1", mesh)
    assert got_mesh is mesh and got_plan == plan
    built_plan, built = _plan_and_mesh("fsdp:1", None)
    assert built_plan == plan and dict(built.shape) == {"fsdp": 1}
    wrong = sharding.parse_shard("dp:1").mesh(rk.target("local", devices=1))
    with pytest.raises(rk.BadValue, match="do not match the plan"):
        _plan_and_mesh("fsdp:1", wrong)


def test_a_sharded_step_carries_its_mesh_and_an_unsharded_one_none():
    """``TrainStep.mesh`` is what its shardings live on (seed 92's train.py:350 dropped
    it: a sharded step said it had no mesh)."""
    from remat_kit import sharding

    model = models.build(models.get_config("tiny-llama", layers=1, attention="xla"))
    config = rk.TrainConfig(batch=2, seq=16)
    mesh = sharding.parse_shard("fsdp:1").mesh(rk.target("local", devices=1))
    given = rk.build_train_step(model, config, sharding="fsdp:1", mesh=mesh)
    assert given.mesh is mesh
    built = rk.build_train_step(model, config, sharding="fsdp:1")
    assert dict(built.mesh.shape) == {"fsdp": 1}
    assert {s.mesh for s in jax.tree.leaves(built.in_shardings)} == {built.mesh}  # its shardings
    assert rk.build_train_step(model, config).mesh is None


def test_a_built_step_carries_the_models_loss():
    """Our step says its loss is given (the residual table and the offload check trace
    ``loss_fn``; a user's own step may come without one): a scalar f32 of the model."""
    cfg = models.get_config("tiny-llama", layers=1)
    step = rk.build_train_step(models.build(cfg), rk.TrainConfig(batch=2, seq=8, optimizer="sgd"))
    assert step.loss_given is True
    out = jax.eval_shape(step.loss_fn, *step.loss_args)
    assert out.shape == () and out.dtype == jnp.float32


@pytest.mark.parametrize("given", ["AdamW", " adamw ", "ADAMW"])
def test_an_optimizer_is_named_in_any_case(given):
    # As target names are read ("H100" is h100): the name is coerced once, on construction.
    assert rk.TrainConfig(2, 16, optimizer=given).optimizer == "adamw"
