"""Flash (cuDNN) attention: compiles deviceless, cuts temporaries, falls back on CPU."""

import chex
import jax
import pytest

import remat_kit as rk
import remat_kit_models as models
from helpers import loss_and_grads, tokens
from remat_kit_models.configure import resolve_attention


def test_auto_resolves_by_target():
    assert resolve_attention("auto", rk.target("h100")) == "cudnn"
    assert resolve_attention("auto", rk.target("a100-40gb")) == "cudnn"
    assert resolve_attention("auto", rk.target("cpu")) == "xla"
    assert resolve_attention("xla", rk.target("h100")) == "xla"
    with pytest.raises(ValueError, match="use attention='xla'"):
        resolve_attention("cudnn", rk.target("cpu"))


@pytest.mark.slow
def test_auto_runs_as_xla_on_cpu_with_the_same_gradients():
    cfg = models.get_config("tiny-llama", layers=2)
    toks = tokens(seq=17)
    params = models.build(cfg).init(jax.random.key(0), toks[:, :-1])
    ref = loss_and_grads(cfg, params, toks)
    got = loss_and_grads(cfg.replace(attention="auto", policy="full"), params, toks)
    chex.assert_trees_all_close(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_cudnn_compiles_deviceless_and_cuts_temporaries(small):
    xla, flash = small("none"), small("none", attention="cudnn")
    assert flash.attention == "cudnn" and xla.attention == "xla"
    assert flash.temp_bytes < 0.7 * xla.temp_bytes
    # Flash attention has no score tensors to tag.
    assert "attn_scores" in xla.tags and "attn_scores" not in flash.tags
    assert "context" in flash.tags
    # The kernel's FLOPs are counted from its shapes, not lost as an opaque call.
    assert flash.flops_detail["attention_kernel"] > 0
    assert flash.flops == pytest.approx(xla.flops, rel=0.15)


@pytest.mark.slow
def test_megatron_under_flash_is_reported_as_its_counterpart(small):
    r = small("megatron", attention="cudnn")
    note = next(w for w in r.warnings if "flash attention" in w)
    assert "equivalent to names:save=" in note and "context" in note


def test_unsupported_cudnn_combinations_are_clear_errors():
    with pytest.raises(ValueError, match="no attention dropout"):
        models.get_config("tiny-gpt2", attention="cudnn", dropout_rate=0.1, dtype="bf16")
    with pytest.raises(ValueError, match="16-bit compute dtype"):
        models.get_config("tiny-llama", attention="cudnn")
