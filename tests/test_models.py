"""Models x policies: gradients never change with the policy (scan on/off, dropout on)."""

import functools

import chex
import jax
import jax.numpy as jnp
import pytest

import remat_kit as rk
import remat_kit_models as models
from helpers import loss_and_grads, losses_and_grads, on_both_layouts, tokens

# The *ragged* policies act only on grouped expert GEMMs, which dense models have none of:
# their gradients and what they keep are tested on MoE models (test_ragged.py).
SIMPLE = [
    n
    for n in rk.policy_names()
    if n not in ("names", "except", "offload", "either", "maxtext") and "ragged" not in n
]
PARAMETERIZED = [
    "names:save=context+mlpwo",
    "except:names=attn_scores+attn_probs",
    "offload:offload=context+mlpwi_0,save=query_proj",
    "either:a=qkv_proj,b=context",
]
POLICIES = SIMPLE + PARAMETERIZED
MODELS = ["tiny-llama", "tiny-gpt2"]
# Each policy on both layouts, the models swapped between neighbours: every policy meets the
# scanned and the unrolled stack, and each model meets half the policies in each layout (the
# full product compiled 68 gradients, 139 s of the suite, for no mutant the half misses).
GRADIENT_CASES = on_both_layouts(POLICIES)


@functools.cache
def _setup(model: str, scan: bool):
    cfg = models.get_config(model, layers=2, scan_layers=scan)
    toks = tokens(seq=17)
    params = models.build(cfg).init(jax.random.key(0), toks[:, :-1])
    return cfg, toks, params, loss_and_grads(cfg, params, toks)


@functools.cache
def _gradients(model: str, scan: bool) -> dict:
    # The gradient cases of one model and layout, compiled as one program (helpers).
    cfg, toks, params, _ = _setup(model, scan)
    cases = [c.values[0] for c in GRADIENT_CASES if c.values[1:] == (model, scan)]
    got = losses_and_grads([cfg.replace(policy=p) for p in cases], params, toks)
    return dict(zip(cases, got, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize(("policy", "model", "scan"), GRADIENT_CASES)
def test_policy_keeps_gradients(policy, model, scan):
    _, _, _, (ref_loss, ref_grads) = _setup(model, scan)
    loss, grads = _gradients(model, scan)[policy]
    chex.assert_trees_all_close(loss, ref_loss, rtol=1e-6)
    chex.assert_trees_all_close(grads, ref_grads, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_scan_and_unrolled_agree(model):
    cfg_s, toks, params_s, (loss_s, _) = _setup(model, True)
    cfg_u, _, params_u, _ = _setup(model, False)
    # Unstack the scanned parameters into per-layer trees and compare the losses.
    stacked = params_s["params"]["decoder"]["layers"]
    unrolled = dict(params_u["params"])
    unrolled["decoder"] = {
        f"layers_{i}": jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(cfg_s.n_layers)
    }
    loss = loss_and_grads(cfg_u, {"params": unrolled}, toks)[0]
    chex.assert_trees_all_close(loss, loss_s, rtol=1e-6)


@pytest.mark.parametrize("name", models.preset_names())
def test_presets_param_count_matches_init(name):
    cfg = models.get_config(name)
    shapes = jax.eval_shape(
        models.build(cfg).init, jax.random.key(0), jax.ShapeDtypeStruct((1, 8), jnp.int32)
    )
    assert sum(x.size for x in jax.tree.leaves(shapes)) == cfg.param_count()


def test_published_sizes():
    billions = {
        n: models.get_config(n).param_count() / 1e9
        for n in ("llama3-8b", "llama3-70b", "llama2-13b", "llama3.2-1b", "llama3.2-3b")
    }
    assert billions["llama3-8b"] == pytest.approx(8.03, abs=0.01)
    assert billions["llama3-70b"] == pytest.approx(70.55, abs=0.05)
    assert billions["llama2-13b"] == pytest.approx(13.02, abs=0.02)
    assert billions["llama3.2-1b"] == pytest.approx(1.24, abs=0.01)
    assert billions["llama3.2-3b"] == pytest.approx(3.21, abs=0.01)
    assert models.get_config("gpt2-small").param_count() / 1e6 == pytest.approx(124.4, abs=0.1)


def test_overrides_and_errors():
    cfg = models.get_config("llama3-8b", layers=64, width=2048)
    assert (cfg.n_layers, cfg.d_model, cfg.dim_per_head) == (64, 2048, 64)
    with pytest.raises(ValueError, match=r"unknown model 'llama3-7b'.*llama3-8b"):
        models.get_config("llama3-7b")
    with pytest.raises(ValueError, match=r"unknown model override 'layer'.*layers"):
        models.get_config("tiny-llama", layer=3)
    with pytest.raises(ValueError, match="not divisible"):
        models.get_config("tiny-llama", width=66)
    with pytest.raises(ValueError, match="n_layers=0"):
        models.get_config("tiny-llama", layers=0)
    with pytest.raises(ValueError, match="unknown attention"):
        models.get_config("tiny-llama", attention="flash")


@pytest.mark.slow
def test_every_vocabulary_tag_exists_in_the_models():
    from remat_kit import names

    seen = set()
    for model in [*MODELS, "tiny-moe"]:
        cfg = models.get_config(model, layers=1, scan_layers=False)
        toks = tokens()
        module = models.build(cfg)
        params = module.init(jax.random.key(0), toks)
        jaxpr = jax.make_jaxpr(module.apply)(params, toks)
        seen |= {str(e.params["name"]) for e in _eqns(jaxpr.jaxpr) if e.primitive.name == "name"}
    assert seen == set(names.VOCABULARY)


#: What each family tags, written out from the architectures (not from remat_kit.names): a
#: union over both models would not notice one model losing a tag the other has.
FAMILY_TAGS = {
    "tiny-llama": {"decoder_layer_input", "query_proj", "key_proj", "value_proj", "attn_scores"}
    | {"attn_probs", "context", "out_proj", "attn_out", "mlpwi_0", "mlpwi_1", "mlpwo"}
    | {"block_out"},
    "tiny-gpt2": {"decoder_layer_input", "query_proj", "key_proj", "value_proj", "attn_scores"}
    | {"attn_probs", "context", "out_proj", "attn_out", "mlpwi", "mlpwo", "block_out"},
}


@pytest.mark.slow
@pytest.mark.parametrize("scan", [True, False], ids=["scan", "unrolled"])
@pytest.mark.parametrize("model", MODELS)
def test_each_model_tags_exactly_its_tensors(model, scan):
    cfg = models.get_config(model, layers=2, scan_layers=scan)
    toks = tokens()
    module = models.build(cfg)
    params = module.init(jax.random.key(0), toks)
    jaxpr = jax.make_jaxpr(module.apply)(params, toks)
    counts = {}
    for e in _eqns(jaxpr.jaxpr):
        if e.primitive.name == "name":
            counts[str(e.params["name"])] = counts.get(str(e.params["name"]), 0) + 1
    assert set(counts) == FAMILY_TAGS[model]
    # Once per layer: twice unrolled (2 layers), once in the scanned body.
    assert set(counts.values()) == {1 if scan else 2}


def _eqns(jaxpr):
    for e in jaxpr.eqns:
        yield e
        for v in e.params.values():
            inner = getattr(v, "jaxpr", v)
            if hasattr(inner, "eqns"):
                yield from _eqns(inner)
