"""A GPT-2-style decoder: LayerNorm, GELU MLP, learned positions, dropout, tied head.

With ``causal=False`` the same stack is a BERT-base-sized encoder (pre-norm, unlike
BERT's post-norm; the activation shapes that drive memory are the same).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from remat_kit import names
from remat_kit.errors import BadValue
from remat_kit_models.attention import SelfAttention
from remat_kit_models.axes import (
    LOGITS_AXES,
    MLP_AXES,
    RESIDUAL_AXES,
    constrain,
    embedded,
    partitioned,
)
from remat_kit_models.config import ModelConfig
from remat_kit_models.lora import project
from remat_kit_models.stack import BlockStack


class GeluMLP(nn.Module):
    """out = gelu(x Wi + bi) Wo + bo."""

    cfg: ModelConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg
        dense = lambda feats, axes, name: nn.Dense(
            feats,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            kernel_init=partitioned(nn.initializers.normal(0.02), axes),
            bias_init=partitioned(nn.initializers.zeros, axes[-1:]),
            name=name,
        )
        hidden = project(cfg, dense(cfg.d_ff, ("embed", "mlp"), "wi"), x, (cfg.d_ff,), "wi")
        hidden = checkpoint_name(constrain(hidden, MLP_AXES), names.MLPWI)
        wo = dense(cfg.d_model, ("mlp", "embed"), "wo")
        out = project(cfg, wo, nn.gelu(hidden), (cfg.d_model,), "wo")
        out = checkpoint_name(out, names.MLPWO)
        return nn.Dropout(cfg.dropout_rate, deterministic=self.deterministic)(out)


class GPT2Block(nn.Module):
    """Pre-LayerNorm decoder layer with residual dropout."""

    cfg: ModelConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x: jax.Array, _: None = None) -> tuple[jax.Array, None]:
        cfg = self.cfg
        x = checkpoint_name(constrain(x, RESIDUAL_AXES), names.DECODER_LAYER_INPUT)
        norm = lambda name: _layer_norm(cfg, name)
        attn = SelfAttention(
            cfg, use_rope=False, use_bias=True, deterministic=self.deterministic, name="attention"
        )
        a = nn.Dropout(cfg.dropout_rate, deterministic=self.deterministic)(attn(norm("ln_1")(x)))
        x = checkpoint_name(x + a, names.ATTN_OUT)
        x = x + GeluMLP(cfg, self.deterministic, name="mlp")(norm("ln_2")(x))
        return checkpoint_name(constrain(x, RESIDUAL_AXES), names.BLOCK_OUT), None


class GPT2(nn.Module):
    """Token ids (batch, seq) -> logits (batch, seq, vocab), head tied to the embedding.

    Example:
      >>> import jax, jax.numpy as jnp, models
      >>> cfg = models.get_config("tiny-gpt2")
      >>> tokens = jnp.zeros((1, 8), jnp.int32)
      >>> params = jax.eval_shape(models.GPT2(cfg).init, jax.random.key(0), tokens)  # shapes
      >>> sum(x.size for x in jax.tree.leaves(params)) == cfg.param_count()
      True
      >>> jax.eval_shape(models.GPT2(cfg).apply, params, tokens).shape
      (1, 8, 256)
    """

    cfg: ModelConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        cfg = self.cfg
        s = tokens.shape[1]
        if s > cfg.max_seq_len:
            raise BadValue(
                f"sequence length {s} exceeds {cfg.name}'s learned positions ({cfg.max_seq_len})"
            )
        wte = nn.Embed(
            cfg.vocab_size,
            cfg.d_model,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            embedding_init=partitioned(nn.initializers.normal(0.02), ("vocab", "embed")),
            name="wte",
        )
        wpe = nn.Embed(
            cfg.max_seq_len,
            cfg.d_model,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            embedding_init=partitioned(nn.initializers.normal(0.01), ("pos", "embed")),
            name="wpe",
        )
        x = embedded(wte(tokens) + wpe(jnp.arange(s))[None])
        x = nn.Dropout(cfg.dropout_rate, deterministic=self.deterministic)(x)
        x = BlockStack(cfg, GPT2Block, self.deterministic, name="decoder")(x)
        x = _layer_norm(cfg, "ln_f")(x)
        if cfg.tie_embeddings:
            return constrain(wte.attend(x), LOGITS_AXES)
        logits = nn.Dense(
            cfg.vocab_size,
            use_bias=False,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            kernel_init=partitioned(nn.initializers.lecun_normal(), ("embed", "vocab")),
            name="lm_head",
        )(x)
        return constrain(logits, LOGITS_AXES)


def _layer_norm(cfg: ModelConfig, name: str) -> nn.LayerNorm:
    return nn.LayerNorm(
        epsilon=cfg.norm_eps,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        scale_init=partitioned(nn.initializers.ones, ("norm",)),
        bias_init=partitioned(nn.initializers.zeros, ("norm",)),
        name=name,
    )


__all__ = ["GPT2", "GPT2Block", "GeluMLP"]
