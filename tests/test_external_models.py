"""Proof on models nobody here wrote: Hugging Face transformers' Flax Llama and GPT-2.

Tiny configs of the published classes, through ``rk.remat`` (keyword ``deterministic``, static
arguments counted after ``self``), ``rk.sources`` (``--block`` patching, tagging by rule set,
Hugging Face's keyword inputs and ``.logits`` output) and the CLI. Needs the ``[test]`` extra
(``transformers>=4.40,<5``).
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import remat_kit as rk
from remat_kit import sources
from remat_kit.analysis import RematWarning
from remat_kit.cli import main

transformers = pytest.importorskip("transformers")
hf_llama = pytest.importorskip("transformers.models.llama.modeling_flax_llama")
hf_gpt2 = pytest.importorskip("transformers.models.gpt2.modeling_flax_gpt2")

ROOT = Path(__file__).parent.parent
FACTORIES = str(Path(__file__).parent / "data" / "factories.py")
LLAMA_BLOCK = "transformers.models.llama.modeling_flax_llama:FlaxLlamaDecoderLayer"
GPT2_BLOCK = "transformers.models.gpt2.modeling_flax_gpt2:FlaxGPT2Block"
SMALL = rk.TrainConfig(batch=2, seq=16)

CONFIG = transformers.LlamaConfig(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    attention_dropout=0.5,  # makes `deterministic` matter
)
H = jnp.linspace(-1.0, 1.0, 2 * 8 * 32).reshape(2, 8, 32)
KW = dict(attention_mask=jnp.ones((2, 8), jnp.int32), position_ids=jnp.tile(jnp.arange(8), (2, 1)))


def _layer_loss(cls):
    layer = cls(CONFIG, dtype=jnp.float32)
    params = hf_llama.FlaxLlamaDecoderLayer(CONFIG).init(jax.random.key(0), H, **KW)

    def loss(p):
        return jnp.sum(layer.apply(p, H, **KW, deterministic=True)[0] ** 2)

    return loss, params


@functools.cache
def _layer_reference():
    # The plain layer's gradients and saved bytes, once for every policy's case.
    ref_loss, params = _layer_loss(hf_llama.FlaxLlamaDecoderLayer)
    return params, jax.grad(ref_loss)(params), rk.saved_residuals(ref_loss, params).bytes_by()


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["full", "minimal", "dots_no_batch", "offload_dots_no_batch"])
def test_rk_remat_of_the_hf_decoder_layer_with_keyword_deterministic(policy):
    params, ref_grads, ref_kept = _layer_reference()
    loss, _ = _layer_loss(rk.remat(hf_llama.FlaxLlamaDecoderLayer, policy))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RematWarning)  # minimal: the layer has no tags
        # Recomputation reorders f32 sums: an absolute floor far below the gradients' size
        # (about 1e-3) keeps jax 0.12's last-bit differences on 1e-5 entries from failing it.
        chex.assert_trees_all_close(jax.grad(loss)(params), ref_grads, rtol=1e-5, atol=1e-8)
        kept = rk.saved_residuals(loss, params).bytes_by()
    assert kept < ref_kept  # it did rematerialize


@pytest.mark.slow
def test_keyword_flag_reaches_the_layer_in_train_mode():
    # deterministic=False must switch dropout on inside the checkpoint (not be traced away).
    layer = rk.remat(hf_llama.FlaxLlamaDecoderLayer, "full")(CONFIG, dtype=jnp.float32)
    params = layer.init(jax.random.key(0), H, **KW)
    rngs = {"dropout": jax.random.key(1)}
    train = layer.apply(params, H, **KW, deterministic=False, rngs=rngs)[0]
    evaluate = layer.apply(params, H, **KW, deterministic=True)[0]
    assert not np.allclose(train, evaluate)


class Repeat(nn.Module):
    """Its second argument after ``self`` is a numpy int steering a Python loop."""

    @nn.compact
    def __call__(self, x, times):
        dense = nn.Dense(x.shape[-1])
        for _ in range(int(times)):
            x = jnp.tanh(dense(x))
        return x


def test_static_argnums_count_after_self_for_linen_classes():
    x = jnp.ones((2, 4))
    times = np.int32(3)  # an array to jax: traced unless it is static
    ref = Repeat()
    params = ref.init(jax.random.key(0), x, 3)
    got = rk.remat(Repeat, "full", static_argnums=(1,))()
    chex.assert_trees_all_close(got.apply(params, x, times), ref.apply(params, x, 3))
    with pytest.raises(jax.errors.ConcretizationTypeError):
        rk.remat(Repeat, "full", static_argnums=(0,))().apply(params, x, times)


class NNXRepeat(nnx.Module):
    def __init__(self, rngs):
        self.dense = nnx.Linear(4, 4, rngs=rngs)

    def __call__(self, x, times):
        for _ in range(int(times)):
            x = jnp.tanh(self.dense(x))
        return x


def test_static_argnums_count_after_self_for_nnx_classes():
    x = jnp.ones((2, 4))
    ref = NNXRepeat(nnx.Rngs(0))
    got = rk.remat(NNXRepeat, "full", static_argnums=(1,))(nnx.Rngs(0))
    chex.assert_trees_all_close(got(x, np.int32(3)), ref(x, 3))
    with pytest.raises(jax.errors.ConcretizationTypeError):
        rk.remat(NNXRepeat, "full", static_argnums=(0,))(nnx.Rngs(0))(x, np.int32(3))


# --- through rk.sources, as `--model file.py:NAME --block module:Class` ------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "block", "tags"),
    [
        (
            "hf_llama",
            LLAMA_BLOCK,
            {"query_proj", "key_proj", "value_proj", "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo"},
        ),
        ("hf_gpt2", GPT2_BLOCK, {"query_proj", "out_proj", "mlpwi", "mlpwo"}),
    ],
)
def test_hf_models_get_our_tags_and_minimal_saves_the_projections(name, block, tags):
    src = sources.from_factory(f"{FACTORIES}:{name}", block=block)
    assert src.n_layers() == 4
    minimal = sources.residuals(src, "minimal", "cpu", SMALL)
    full = sources.residuals(src, "full", "cpu", SMALL)
    assert tags <= set(minimal.tags)
    assert all(full.tags[t] == "recomputed" for t in tags)
    saved = {t for t in tags if minimal.tags[t] == "saved"}
    # What the backward pass reads of each projection: the rest is "not needed" (e.g. the
    # out projection only feeds a residual add).
    assert saved and saved | {t for t in tags if minimal.tags[t] == "not needed"} == tags
    assert all(minimal.tag_count[t] == 4 for t in tags)  # four layers, each tagged


@pytest.mark.slow
def test_per_layer_plan_by_patching_an_unrolled_stack():
    src = sources.from_factory(f"{FACTORIES}:hf_llama", block=LLAMA_BLOCK)
    res = sources.residuals(src, "minimal", "cpu", SMALL, "layers:0-2=full")
    per = res.per_name()
    assert per["query_proj"]["count"] == 1  # saved in layer 3 only
    whole = sources.residuals(src, "minimal", "cpu", SMALL).per_name()
    assert per["query_proj"]["bytes"] * 4 == whole["query_proj"]["bytes"]


@pytest.mark.slow
def test_source_gradients_match_the_model_without_remat():
    src = sources.from_factory(f"{FACTORIES}:hf_llama", block=LLAMA_BLOCK)
    tokens = jnp.arange(32, dtype=jnp.int32).reshape(2, 16) % 128

    def grads(policy):
        built = src.build(policy)
        params = built.module.init(jax.random.key(0), tokens, **built.inputs(tokens))

        def loss(p):
            out = built.module.apply(p, tokens, **built.inputs(tokens))
            return rk.train.logits_of(out).astype(jnp.float32).std()

        return jax.grad(loss)(params)

    chex.assert_trees_all_close(grads("minimal"), grads("none"), rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_cli_compare_on_an_hf_model(capsys, tmp_path):
    out = tmp_path / "rows.json"
    argv = ["compare", "--model", f"{FACTORIES}:hf_gpt2", "--block", GPT2_BLOCK]
    argv += ["--target", "h100", "--batch", "2", "--seq", "32", "--policies", "none,minimal"]
    assert main([*argv, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "hf_gpt2" in text and "minimal" in text
    rows = __import__("json").loads(out.read_text())
    assert [r["policy"] for r in rows] == ["none", "minimal"]
    assert rows[1]["peak_bytes"] < rows[0]["peak_bytes"]


def test_docs_factory_is_the_tested_file_and_short():
    page = (ROOT / "docs" / "your-model.md").read_text()
    assert "```{literalinclude} ../tests/data/hf_llama.py" in page  # the page shows the file
    text = (Path(__file__).parent / "data" / "hf_llama.py").read_text()
    assert len(text.strip().splitlines()) <= 15
