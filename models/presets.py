"""The presets: a name -> :class:`ModelConfig` registry, and :func:`build`, a config -> module.

Read through the package (``remat_kit_models.get_config``, ``remat_kit_models.build``), which
imports this module on first use.

Example:
  >>> import remat_kit_models as models
  >>> cfg = models.get_config("llama3-8b", layers=64, policy="minimal")
  >>> (cfg.n_layers, cfg.d_model, cfg.policy.name)
  (64, 4096, 'minimal')
"""

from __future__ import annotations

import types
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from remat_kit.errors import unknown
from remat_kit_models.attention import SelfAttention
from remat_kit_models.config import (
    ATTENTION_KINDS,
    FAMILIES,
    ModelConfig,
    as_dtype,
    blame_overrides,
)
from remat_kit_models.gpt2 import GPT2, GPT2Block
from remat_kit_models.llama import Llama, LlamaBlock
from remat_kit_models.moe import MoE

__all__ = [
    "ATTENTION_KINDS",
    "FAMILIES",
    "GPT2",
    "OVERRIDES",
    "GPT2Block",
    "Llama",
    "LlamaBlock",
    "MoE",
    "ModelConfig",
    "SelfAttention",
    "as_dtype",
    "build",
    "get_config",
    "preset_names",
]

_LLAMA3 = dict(
    family="llama", vocab_size=128_256, rope_theta=500_000.0, norm_eps=1e-5, max_seq_len=8192
)
_GPT2 = dict(
    family="gpt2",
    vocab_size=50_257,
    n_kv_heads=None,
    max_seq_len=1024,
    tie_embeddings=True,
    norm_eps=1e-5,
    # GPT-2's embd/attn/resid_pdrop and BERT's hidden/attention_probs_dropout_prob: 0.1 each,
    # applied to the embeddings, the attention probabilities and both residual branches.
    dropout_rate=0.1,
)

# Published shapes (Meta model cards / config.json; OpenAI GPT-2; BERT-base; Mistral's
# Mixtral and Qwen's Qwen3 config.json).
_PRESETS: types.MappingProxyType[str, dict[str, Any]] = types.MappingProxyType(
    {
        "llama3-8b": dict(
            _LLAMA3, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14_336
        ),
        "llama3-70b": dict(
            _LLAMA3, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, d_ff=28_672
        ),
        "llama3.2-1b": dict(
            _LLAMA3,
            d_model=2048,
            n_layers=16,
            n_heads=32,
            n_kv_heads=8,
            d_ff=8192,
            tie_embeddings=True,
            head_dim=64,
        ),
        "llama3.2-3b": dict(
            _LLAMA3,
            d_model=3072,
            n_layers=28,
            n_heads=24,
            n_kv_heads=8,
            d_ff=8192,
            tie_embeddings=True,
            head_dim=128,
        ),
        "llama2-13b": dict(
            family="llama",
            vocab_size=32_000,
            d_model=5120,
            n_layers=40,
            n_heads=40,
            n_kv_heads=40,
            d_ff=13_824,
            rope_theta=10_000.0,
            max_seq_len=4096,
        ),
        "gpt2-small": dict(_GPT2, d_model=768, n_layers=12, n_heads=12, d_ff=3072),
        "gpt2-medium": dict(_GPT2, d_model=1024, n_layers=24, n_heads=16, d_ff=4096),
        "gpt2-large": dict(_GPT2, d_model=1280, n_layers=36, n_heads=20, d_ff=5120),
        "bert-base": dict(
            _GPT2,
            vocab_size=30_522,
            d_model=768,
            n_layers=12,
            n_heads=12,
            d_ff=3072,
            max_seq_len=512,
            causal=False,
            norm_eps=1e-12,
        ),
        "bert-large": dict(
            _GPT2,
            vocab_size=30_522,
            d_model=1024,
            n_layers=24,
            n_heads=16,
            d_ff=4096,
            max_seq_len=512,
            causal=False,
            norm_eps=1e-12,
        ),
        # Tests: f32 so gradients compare tightly; small enough to run on a CPU in milliseconds.
        "tiny-llama": dict(
            family="llama",
            vocab_size=256,
            d_model=64,
            n_layers=4,
            n_heads=4,
            n_kv_heads=2,
            d_ff=128,
            max_seq_len=128,
            rope_theta=10_000.0,
            dtype=jnp.float32,
            param_dtype=jnp.float32,
        ),
        # Mixtral 8x7B (mistralai/Mixtral-8x7B-v0.1 config.json): 8 SwiGLU experts of width
        # 14336, top 2, softmax weights renormalised over the two; 46,702,792,704 parameters.
        "mixtral-8x7b": dict(
            family="llama",
            vocab_size=32_000,
            d_model=4096,
            n_layers=32,
            n_heads=32,
            n_kv_heads=8,
            d_ff=14_336,
            n_experts=8,
            experts_per_token=2,
            norm_topk_prob=True,
            router_aux_loss_coef=0.02,
            rope_theta=1_000_000.0,
            norm_eps=1e-5,
            max_seq_len=32_768,
        ),
        # Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B config.json): 128 experts of width 768, top 8,
        # q/k RMSNorm, head_dim 128 (not 2048 / 32); 30,532,122,624 parameters.
        "qwen3-30b-a3b": dict(
            family="llama",
            vocab_size=151_936,
            d_model=2048,
            n_layers=48,
            n_heads=32,
            n_kv_heads=4,
            head_dim=128,
            d_ff=6144,
            n_experts=128,
            experts_per_token=8,
            moe_d_ff=768,
            norm_topk_prob=True,
            router_aux_loss_coef=0.001,
            qk_norm=True,
            rope_theta=1_000_000.0,
            norm_eps=1e-6,
            max_seq_len=40_960,
        ),
        # Tests: a mixture of experts small enough for a CPU, f32 like tiny-llama.
        "tiny-moe": dict(
            family="llama",
            vocab_size=256,
            d_model=64,
            n_layers=2,
            n_heads=4,
            n_kv_heads=2,
            d_ff=128,
            n_experts=4,
            experts_per_token=2,
            moe_d_ff=64,
            norm_topk_prob=True,
            max_seq_len=128,
            rope_theta=10_000.0,
            dtype=jnp.float32,
            param_dtype=jnp.float32,
        ),
        "tiny-gpt2": dict(
            _GPT2,
            vocab_size=256,
            d_model=64,
            n_layers=4,
            n_heads=4,
            d_ff=256,
            max_seq_len=128,
            dtype=jnp.float32,
            param_dtype=jnp.float32,
            dropout_rate=0.0,  # tests turn it on where they test it
        ),
    }
)

#: Short override names accepted by get_config (the CLI flags) -> ModelConfig fields.
OVERRIDES: types.MappingProxyType[str, str] = types.MappingProxyType(
    {
        "layers": "n_layers",
        "width": "d_model",
        "heads": "n_heads",
        "kv_heads": "n_kv_heads",
        "ff": "d_ff",
        "vocab": "vocab_size",
        "max_seq": "max_seq_len",
        "experts": "n_experts",
        "top_k": "experts_per_token",
        "moe_ff": "moe_d_ff",
        "moe_impl": "moe_impl",
        "capacity_factor": "capacity_factor",
    }
)


def preset_names() -> list[str]:
    """Sorted preset names."""
    return sorted(_PRESETS)


def get_config(name: str, **overrides: Any) -> ModelConfig:
    """The config of preset ``name`` with ``overrides`` applied.

    Args:
      name: a preset (see :func:`preset_names`).
      **overrides: ModelConfig fields or their short names (``layers``, ``width``,
        ``heads``, ``kv_heads``, ``ff``, ``vocab``, ``max_seq``). ``None`` values are
        ignored so CLI flags can be passed straight through. Changing ``width`` keeps
        the preset's head count, so the head size follows the width.

    Returns:
      The ModelConfig.

    Raises:
      ValueError: unknown preset or field, or a shape that does not divide.
    """
    try:
        base = dict(_PRESETS[name])
    except KeyError:
        raise unknown("model", name, preset_names(), param="model") from None
    fields = set(ModelConfig.__dataclass_fields__)
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        field = OVERRIDES.get(key, key)
        if field not in fields:
            valid = sorted(set(OVERRIDES) | fields - {"name", "family"})
            raise unknown("model override", key, valid, n=2, heading="Valid")
        changes[field] = value
    if "d_model" in changes and "head_dim" not in changes:
        base.pop("head_dim", None)
    if base.get("n_kv_heads") is None:
        base["n_kv_heads"] = changes.get("n_heads", base["n_heads"])
    if "n_heads" in changes and "n_kv_heads" not in changes:
        # Keep the preset's grouping where it divides; otherwise fall back to MHA.
        kv = base["n_kv_heads"]
        base["n_kv_heads"] = kv if changes["n_heads"] % kv == 0 else changes["n_heads"]
    base.update(changes)
    with blame_overrides(changes):
        return ModelConfig(name=name, **base)


def build(cfg: ModelConfig, *, deterministic: bool = True) -> nn.Module:
    """The linen module for ``cfg`` (Llama or GPT2 by family).

    Args:
      cfg: the config; its ``policy`` wraps every block.
      deterministic: False turns dropout on (it then needs a ``dropout`` rng).

    Returns:
      An unbound linen Module: ``module.init(key, tokens)``, ``module.apply(...)``.
    """
    if cfg.attention == "auto":
        # The model cannot see where it is compiled; callers that know the target
        # resolve "auto" (remat_kit.train does). Alone, "auto" runs anywhere as xla.
        cfg = cfg.replace(attention="xla")
    cls = Llama if cfg.family == "llama" else GPT2
    return cls(cfg, deterministic=deterministic)
