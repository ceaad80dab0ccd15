"""The mixture-of-experts decoder (models.moe): routing, both expert paths, tags, aux loss,
published sizes and Hugging Face configs."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_kit as rk
import remat_kit_models as models
import remat_kit_models.hf
from helpers import loss_and_grads, losses_and_grads, tokens
from remat_kit.errors import BadValue
from remat_kit_models.spec import PresetSpec

F32 = dict(rtol=1e-4, atol=1e-5)


def _count(cfg: models.ModelConfig) -> int:
    toks = jax.ShapeDtypeStruct((1, 8), jnp.int32)
    shapes = jax.eval_shape(models.build(cfg).init, jax.random.key(0), toks)
    return sum(math.prod(x.shape) for x in jax.tree.leaves(rk.strip_boxes(shapes)))


# --- published sizes ---------------------------------------------------------------------------

#: Totals from the model cards (Mixtral-8x7B: 46.7B; Qwen3-30B-A3B: 30.5B), to the parameter:
#: Mixtral 32 x (attention 41,943,040 + router 32,768 + experts 8 x 3 x 4096 x 14336 + norms
#: 8,192) + 2 x 32000 x 4096 + 4096; Qwen3 48 x (18,874,368 + q/k norms 256 + router 262,144
#: + 128 x 3 x 2048 x 768 + 4,096) + 2 x 151936 x 2048 + 2048.
PUBLISHED = {"mixtral-8x7b": 46_702_792_704, "qwen3-30b-a3b": 30_532_122_624}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_presets_have_the_published_parameter_count(name):
    cfg = models.get_config(name)
    assert cfg.param_count() == PUBLISHED[name]
    assert _count(cfg) == PUBLISHED[name]


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"n_shared_experts": 2},
        {"qk_norm": True},
        {"router_scoring": "sigmoid", "moe_impl": "capacity"},
        {"moe_d_ff": None, "scan_layers": False},
        {"experts_per_token": 1, "n_experts": 3},
    ],
    ids=lambda c: ",".join(c) or "tiny-moe",
)
def test_param_count_is_the_initialised_leaves(changes):
    cfg = models.get_config("tiny-moe", **changes)
    assert _count(cfg) == cfg.param_count()


# --- Hugging Face configs -----------------------------------------------------------------------

_MIXTRAL = {
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "router_jitter_noise": 0.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}
_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 12288,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
_QWEN3_MOE = {
    **_QWEN3,
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "decoder_sparse_step": 1,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "router_aux_loss_coef": 0.001,
}
HF = {"mixtral-8x7b": _MIXTRAL, "qwen3-8b": _QWEN3, "qwen3-30b-a3b": _QWEN3_MOE}
#: Totals from the model cards and safetensors indexes (Qwen3-8B: 8.2B; 36 x (41,943,040 +
#: 256 + 3 x 4096 x 12288 + 8,192) + 2 x 151936 x 4096 + 4096).
HF_PUBLISHED = {**PUBLISHED, "qwen3-8b": 8_190_735_360}


@pytest.mark.parametrize("name", sorted(HF))
def test_hf_config_builds_the_published_parameter_count(name):
    cfg = models.hf.from_hf_config(HF[name], name=name)
    assert cfg.param_count() == HF_PUBLISHED[name]
    assert _count(cfg) == HF_PUBLISHED[name]


def test_hf_config_maps_the_expert_fields():
    mixtral = models.hf.from_hf_config(_MIXTRAL)
    assert (mixtral.n_experts, mixtral.experts_per_token, mixtral.expert_d_ff) == (8, 2, 14336)
    assert (mixtral.norm_topk_prob, mixtral.router_aux_loss_coef, mixtral.qk_norm) == (
        True,
        0.02,
        False,
    )
    qwen = models.hf.from_hf_config(_QWEN3_MOE)
    assert (qwen.n_experts, qwen.experts_per_token, qwen.expert_d_ff) == (128, 8, 768)
    assert (qwen.qk_norm, qwen.head_dim, qwen.norm_topk_prob) == (True, 128, True)
    assert not models.hf.from_hf_config({**_QWEN3_MOE, "norm_topk_prob": False}).norm_topk_prob
    dense = models.hf.from_hf_config(_QWEN3)
    assert (dense.n_experts, dense.qk_norm) == (0, True)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({**_QWEN3_MOE, "decoder_sparse_step": 2}, r"decoder_sparse_step=2 is not modelled"),
        ({**_QWEN3_MOE, "mlp_only_layers": [0, 47]}, r"mlp_only_layers=\[0, 47\] is not"),
        ({**_MIXTRAL, "router_jitter_noise": 0.01}, r"router_jitter_noise=0.01 is not"),
        ({**_MIXTRAL, "num_experts_per_tok": 9}, r"experts_per_token=9 must be in 1..n_experts=8"),
        # Another architecture's expert fields are not read as ours.
        ({**_MIXTRAL, "num_experts": 8}, r"field 'num_experts' = 8 is not modelled"),
        ({**_QWEN3, "num_experts": 8}, r"field 'num_experts' = 8 is not modelled"),
    ],
)
def test_hf_config_refuses_what_it_cannot_model(fields, match):
    with pytest.raises(BadValue, match=match):
        models.hf.from_hf_config(fields)


# --- bad values ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "param", "match"),
    [
        (
            {"experts_per_token": 5},
            "experts_per_token",
            r"experts_per_token=5 must be in 1\.\.n_experts=4",
        ),
        (
            {"experts_per_token": 0},
            "experts_per_token",
            r"experts_per_token=0 must be in 1\.\.n_experts=4",
        ),
        ({"n_experts": -1}, "n_experts", r"n_experts=-1 must be a non-negative int"),
        ({"n_experts": 0}, "experts_per_token", r"experts_per_token=2 needs routed experts"),
        ({"moe_d_ff": 0}, "moe_d_ff", r"moe_d_ff=0 must be a positive int"),
        ({"n_shared_experts": 1.5}, "n_shared_experts", r"n_shared_experts=1.5 must be"),
        ({"router_scoring": "topk"}, "router_scoring", r"'topk'; valid: softmax, sigmoid"),
        ({"moe_impl": "dense"}, "moe_impl", r"'dense'; valid: ragged, capacity"),
        ({"capacity_factor": 0.0}, "capacity_factor", r"capacity_factor=0.0 must be a positive"),
        ({"router_aux_loss_coef": -0.1}, "router_aux_loss_coef", r"=-0.1 must be >= 0"),
        ({"norm_topk_prob": "yes"}, "norm_topk_prob", r"norm_topk_prob='yes' must be true"),
        ({"qk_norm": 1}, "qk_norm", r"qk_norm=1 must be true or false"),
    ],
)
def test_bad_values_raise_naming_the_value(changes, param, match):
    with pytest.raises(BadValue, match=match) as err:
        models.get_config("tiny-moe", **changes)
    assert err.value.param == param


def test_gpt2_refuses_experts_and_qk_norm():
    with pytest.raises(BadValue, match=r"n_experts=4.*llama family only, not 'gpt2'"):
        models.get_config("tiny-gpt2", n_experts=4, experts_per_token=1)
    with pytest.raises(BadValue, match=r"qk_norm=True.*not 'gpt2'"):
        models.get_config("tiny-gpt2", qk_norm=True)


# --- the layer against a per-token reference ---------------------------------------------------


def _moe(cfg: models.ModelConfig, seed: int = 0):
    x = jax.random.normal(jax.random.key(seed + 1), (2, 8, cfg.d_model), jnp.float32)
    module = models.MoE(cfg)
    params = rk.strip_boxes(module.init(jax.random.key(seed), x))["params"]
    return module, params, x


def _reference(cfg: models.ModelConfig, p, x: jax.Array, slots: int | None = None) -> np.ndarray:
    """Token by token: its top-k experts' SwiGLU outputs weighted by the router. With
    ``slots``, each sequence's expert takes only its first ``slots`` routed copies, in token
    order (the capacity path's drops)."""
    x, router = np.asarray(x, np.float64), np.asarray(p["router"]["kernel"], np.float64)
    wi_0, wi_1, wo = (np.asarray(p[n], np.float64) for n in ("wi_0", "wi_1", "wo"))
    out = np.zeros_like(x)
    for g in range(x.shape[0]):
        taken = [0] * cfg.n_experts
        for t in range(x.shape[1]):
            logits = x[g, t] @ router
            if cfg.router_scoring == "softmax":
                scores = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
            else:
                scores = 1 / (1 + np.exp(-logits))
            top = np.argsort(-scores, kind="stable")[: cfg.experts_per_token]
            w = scores[top] / (scores[top].sum() if cfg.norm_topk_prob else 1.0)
            for e, we in zip(top, w, strict=True):
                taken[e] += 1
                if slots is not None and taken[e] > slots:
                    continue  # dropped: the residual carries it
                gate, up = x[g, t] @ wi_0[e], x[g, t] @ wi_1[e]
                out[g, t] += we * ((gate / (1 + np.exp(-gate)) * up) @ wo[e])
    return out


ROUTINGS = [
    {},
    {"norm_topk_prob": False},
    {"router_scoring": "sigmoid"},
    {"experts_per_token": 1},
    {"experts_per_token": 3, "n_experts": 5},
]


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["ragged", "capacity"])
@pytest.mark.parametrize(
    "routing", ROUTINGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "top2"
)
def test_experts_match_a_per_token_reference(impl, routing):
    cfg = models.get_config("tiny-moe", moe_impl=impl, **routing)
    # Capacity with room for every token (n_experts / k): nothing is dropped.
    cfg = cfg.replace(capacity_factor=cfg.n_experts / cfg.experts_per_token)
    module, params, x = _moe(cfg)
    got = module.apply({"params": params}, x)
    chex.assert_trees_all_close(got, _reference(cfg, params, x).astype(np.float32), **F32)


@pytest.mark.slow
@pytest.mark.parametrize("factor", [0.5, 1.0])
def test_capacity_drops_the_tokens_past_each_experts_slots(factor):
    cfg = models.get_config("tiny-moe", moe_impl="capacity", capacity_factor=factor)
    module, params, x = _moe(cfg, seed=3)
    slots = math.ceil(cfg.experts_per_token * x.shape[1] * factor / cfg.n_experts)
    want = _reference(cfg, params, x, slots=slots)
    assert not np.allclose(want, _reference(cfg, params, x), atol=1e-3)  # something dropped
    chex.assert_trees_all_close(module.apply({"params": params}, x), want.astype(np.float32), **F32)


# --- the decoder: paths, policies, layouts ----------------------------------------------------


@functools.cache
def _setup(impl: str, scan: bool = True, **changes):
    cfg = models.get_config(
        "tiny-moe", moe_impl=impl, capacity_factor=2.0, scan_layers=scan, **changes
    )
    toks = tokens(seq=17)
    params = models.build(cfg).init(jax.random.key(0), toks[:, :-1])
    return cfg, toks, params, loss_and_grads(cfg, params, toks)


@pytest.mark.slow
def test_ragged_and_capacity_agree_without_drops():
    _, _, _, (loss_r, grads_r) = _setup("ragged")
    _, _, _, (loss_c, grads_c) = _setup("capacity")
    chex.assert_trees_all_close(loss_c, loss_r, rtol=1e-6)
    chex.assert_trees_all_close(grads_c, grads_r, **F32)


GRADIENT_CASES = [
    ("full", True),
    ("minimal", True),
    ("names:save=moe_mlpwo+router_logits", True),
    ("minimal", False),  # unrolled: one policy is enough to see the layout work
]


@functools.cache
def _gradients(impl: str, scan: bool) -> dict:
    # The gradient cases of one path and layout, compiled as one program (helpers).
    cfg, toks, params, _ = _setup(impl, scan, router_aux_loss_coef=0.05)
    cases = [policy for policy, layout in GRADIENT_CASES if layout == scan]
    got = losses_and_grads([cfg.replace(policy=p) for p in cases], params, toks)
    return dict(zip(cases, got, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("policy", "scan"), GRADIENT_CASES, ids=["full", "minimal", "names", "minimal-unrolled"]
)
@pytest.mark.parametrize("impl", ["ragged", "capacity"])
def test_policy_keeps_gradients(policy, impl, scan):
    _, _, _, (ref_loss, ref_grads) = _setup(impl, scan, router_aux_loss_coef=0.05)
    loss, grads = _gradients(impl, scan)[policy]
    chex.assert_trees_all_close(loss, ref_loss, rtol=1e-6)
    chex.assert_trees_all_close(grads, ref_grads, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["ragged", "capacity"])
def test_scan_and_unrolled_agree(impl):
    cfg, toks, params_s, (loss_s, _) = _setup(impl, True)
    stacked = params_s["params"]["decoder"]["layers"]
    unrolled = dict(params_s["params"])
    unrolled["decoder"] = {
        f"layers_{i}": jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(cfg.n_layers)
    }
    cfg_u = cfg.replace(scan_layers=False)
    # The unrolled layout is what the unrolled model initialises.
    shapes = jax.eval_shape(models.build(cfg_u).init, jax.random.key(0), toks[:, :-1])
    assert jax.tree.structure(rk.strip_boxes(shapes)) == jax.tree.structure(
        rk.strip_boxes({"params": unrolled})
    )
    loss = loss_and_grads(cfg_u, {"params": unrolled}, toks)[0]
    chex.assert_trees_all_close(loss, loss_s, rtol=1e-6)


def _saved(impl: str, policy: str):
    cfg, toks, params, _ = _setup(impl, True)
    cfg = cfg.replace(policy=policy)
    module = models.build(cfg)

    def loss(p):
        logits = module.apply(p, toks[:, :-1])
        return -jax.nn.log_softmax(logits)[..., 0].mean()

    return rk.saved_residuals(loss, params, policy=policy)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["ragged", "capacity"])
def test_minimal_saves_the_expert_gemms(impl):
    cfg = models.get_config("tiny-moe", moe_impl=impl, capacity_factor=2.0)
    rows, slots = 2 * 16 * cfg.experts_per_token, (cfg.n_experts, 2, 16)  # b=2, s=16, C=16
    hidden = (rows, cfg.expert_d_ff) if impl == "ragged" else (*slots, cfg.expert_d_ff)
    out = (rows, cfg.d_model) if impl == "ragged" else (*slots, cfg.d_model)
    saved = {(r.name, r.shape[1:]) for r in _saved(impl, "minimal").residuals}  # [0]: layers
    assert {("mlpwi_0", hidden), ("mlpwi_1", hidden), ("mlpwo", out)} <= saved
    # The MoE name saves the experts' gate alone (rk.saved_residuals reports the tensor by
    # its outer, dense name); "full" saves none of them.
    moe = _saved(impl, "names:save=moe_mlpwi_0+router_logits")
    tagged = [(r.name, r.shape[1:]) for r in moe.residuals if r.tagged]
    assert sorted(tagged) == [("mlpwi_0", hidden), ("router_logits", (2, 16, cfg.n_experts))]
    assert not {"mlpwi_0", "moe_mlpwi_0"} & {r.name for r in _saved(impl, "full").residuals}


@pytest.mark.slow
def test_shared_experts_add_a_dense_mlp_beside_the_routed_ones():
    cfg = models.get_config("tiny-moe", layers=1, scan_layers=False, n_shared_experts=2)
    toks = tokens()
    params = rk.strip_boxes(models.build(cfg).init(jax.random.key(0), toks))
    layer = params["params"]["decoder"]["layers_0"]
    assert layer["shared_mlp"]["wi_0"]["kernel"].shape == (cfg.d_model, 2 * cfg.expert_d_ff)
    routed_only = jax.tree.map(lambda a: a, params)
    del routed_only["params"]["decoder"]["layers_0"]["shared_mlp"]
    without = models.build(cfg.replace(n_shared_experts=0)).apply(routed_only, toks)
    assert not np.allclose(models.build(cfg).apply(params, toks), without, atol=1e-4)
    silent = jax.tree.map(lambda a: a, params)
    wo = silent["params"]["decoder"]["layers_0"]["shared_mlp"]["wo"]
    wo["kernel"] = jnp.zeros_like(wo["kernel"])
    chex.assert_trees_all_close(models.build(cfg).apply(silent, toks), without, **F32)


@pytest.mark.slow
def test_every_moe_tag_exists_in_the_model():
    cfg = models.get_config("tiny-moe", layers=1, scan_layers=False, n_shared_experts=1)
    toks = tokens()
    module = models.build(cfg)
    forward = jax.make_jaxpr(module.apply)(module.init(jax.random.key(0), toks), toks)
    present = rk.residuals.tags_in(forward)
    assert set(rk.names.MOE_NAMES) <= set(present)
    # mlpwi_0: the experts' (inside the MoE name) and the shared experts' own.
    assert present["mlpwi_0"][1] == 2 and present["moe_mlpwi_0"][1] == 1


# --- the load-balancing loss ------------------------------------------------------------------


def _switch_aux(logits: jax.Array, k: int) -> jax.Array:
    """E * sum_e f_e * P_e written out: f_e the share of tokens with e in their top k."""
    n = logits.shape[-1]
    flat = logits.reshape(-1, n)
    probs = jax.nn.softmax(flat, axis=-1)
    top = jnp.argsort(-flat, axis=-1)[:, :k]
    f = jnp.stack([jnp.mean(jnp.any(top == e, axis=-1)) for e in range(n)])
    return n * jnp.sum(f * probs.mean(axis=0))


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["ragged", "capacity"])
def test_aux_loss_gradients_are_those_of_loss_plus_coef_aux(impl):
    coef = 0.3
    cfg = models.get_config("tiny-moe", moe_impl=impl, capacity_factor=2.0)
    module, params, x = _moe(cfg)
    target = jax.random.normal(jax.random.key(7), x.shape)
    with_aux = models.MoE(cfg.replace(router_aux_loss_coef=coef))

    def task(m, p):
        return jnp.mean((m.apply({"params": p}, x) - target) ** 2)

    def explicit(p):
        logits = x @ p["router"]["kernel"]
        return task(module, p) + coef * _switch_aux(logits, cfg.experts_per_token)

    got = jax.grad(functools.partial(task, with_aux))(params)
    want = jax.grad(explicit)(params)
    chex.assert_trees_all_close(got, want, **F32)
    # The forward value is the task's alone, and the router's gradient did change.
    chex.assert_trees_all_close(task(with_aux, params), task(module, params), rtol=1e-6)
    plain = jax.grad(functools.partial(task, module))(params)
    assert not np.allclose(got["router"]["kernel"], plain["router"]["kernel"], atol=1e-5)


def test_balancing_loss_is_k_when_balanced():
    assert float(models.moe.balancing_loss(jnp.zeros((16, 4)), 2)) == pytest.approx(2.0)
    # All tokens to expert 0: f_0 = 1 and P_0 -> 1.
    skewed = jnp.zeros((16, 4)).at[:, 0].set(30.0)
    assert float(models.moe.balancing_loss(skewed, 1)) == pytest.approx(4.0, rel=1e-4)


# --- q/k norm ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_qk_norm_normalises_each_query_and_key_head():
    # eps ~ 0: the norm then undoes any scale of the projections exactly.
    cfg = models.get_config("tiny-moe", qk_norm=True, layers=1, scan_layers=False, norm_eps=1e-12)
    toks = tokens()
    module = models.build(cfg)
    params = rk.strip_boxes(module.init(jax.random.key(0), toks))
    attn = params["params"]["decoder"]["layers_0"]["attention"]
    h = cfg.dim_per_head
    assert attn["query_norm"]["scale"].shape == attn["key_norm"]["scale"].shape == (h,)
    base = module.apply(params, toks)
    for norm in ("query_norm", "key_norm"):
        scaled = jax.tree.map(lambda a: a, params)
        layer = scaled["params"]["decoder"]["layers_0"]["attention"]
        layer[norm] = {"scale": jnp.full((h,), 3.0)}
        assert not np.allclose(module.apply(scaled, toks), base, atol=1e-4), norm
    # A query projection scaled by any factor gives the same output: RMSNorm undoes it.
    bigger = jax.tree.map(lambda a: a, params)
    q = bigger["params"]["decoder"]["layers_0"]["attention"]["query"]
    q["kernel"] = q["kernel"] * 7.0
    chex.assert_trees_all_close(module.apply(bigger, toks), base, **F32)


# --- compiled for a GPU -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["ragged", "capacity"])
def test_train_step_compiles_for_h100(impl):
    src = rk.sources.resolve(PresetSpec("tiny-moe", overrides={"moe_impl": impl}))
    config = rk.TrainConfig(2, 64, optimizer="sgd")
    r = rk.sources.measure(src, "minimal", "h100", config, strict=True, warn=False)
    assert r.target == "h100-80gb" and r.peak_bytes > 0
    assert r.meta["params"] == models.get_config("tiny-moe").param_count()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("policy", "fate"),
    [
        ("minimal", "saved"),
        ("names:save=moe_mlpwi_0+moe_mlpwi_1+moe_mlpwo", "saved"),
        ("full", "recomputed"),
    ],
)
def test_a_value_tagged_under_two_names_has_one_fate(policy, fate):
    # One tensor, two names (moe_mlpwi_0 inside mlpwi_0): whichever name the policy keeps,
    # the table says both are kept, not "recomputed" for the name the residual lacks.
    tags = _saved("ragged", policy).tags
    for moe, dense in zip(rk.names.MOE_NAMES[1:], ("mlpwi_0", "mlpwi_1", "mlpwo"), strict=True):
        assert tags[moe] == tags[dense] == fate, tags
