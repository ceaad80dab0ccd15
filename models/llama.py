"""A Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU, untied head."""

from __future__ import annotations

import flax.linen as nn
import jax
from jax.ad_checkpoint import checkpoint_name

from remat_kit import names
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
from remat_kit_models.moe import MoE
from remat_kit_models.stack import BlockStack


class SwiGLU(nn.Module):
    """gate = x Wi_0, up = x Wi_1, out = (silu(gate) * up) Wo.

    ``d_ff`` overrides the config's hidden width (a mixture of experts' shared experts).
    """

    cfg: ModelConfig
    d_ff: int | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg
        width = self.d_ff or cfg.d_ff
        dense = lambda feats, axes, name: nn.Dense(
            feats,
            use_bias=False,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            kernel_init=partitioned(nn.initializers.normal(0.02), axes),
            name=name,
        )
        hidden = MLP_AXES
        gate = project(cfg, dense(width, ("embed", "mlp"), "wi_0"), x, (width,), "wi_0")
        gate = checkpoint_name(constrain(gate, hidden), names.MLPWI_0)
        up = project(cfg, dense(width, ("embed", "mlp"), "wi_1"), x, (width,), "wi_1")
        up = checkpoint_name(constrain(up, hidden), names.MLPWI_1)
        wo = dense(cfg.d_model, ("mlp", "embed"), "wo")
        act = nn.silu if cfg.mlp_activation == "silu" else nn.gelu  # gelu: tanh approximation
        out = project(cfg, wo, act(gate) * up, (cfg.d_model,), "wo")
        return checkpoint_name(out, names.MLPWO)


class LlamaBlock(nn.Module):
    """Pre-norm decoder layer; ``(x, None) -> (x, None)`` so nn.scan can carry x."""

    cfg: ModelConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x: jax.Array, _: None = None) -> tuple[jax.Array, None]:
        cfg = self.cfg
        x = checkpoint_name(constrain(x, RESIDUAL_AXES), names.DECODER_LAYER_INPUT)
        norm = lambda name: nn.RMSNorm(
            epsilon=cfg.norm_eps,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            scale_init=partitioned(nn.initializers.ones, ("norm",)),
            name=name,
        )
        attn = SelfAttention(
            cfg, deterministic=self.deterministic, qkv_bias=cfg.qkv_bias, name="attention"
        )
        x = checkpoint_name(x + attn(norm("attention_norm")(x)), names.ATTN_OUT)
        h = norm("mlp_norm")(x)
        if cfg.n_experts:
            # A mixture of experts (models.moe) in place of the MLP; the shared experts beside
            # it are one SwiGLU of their summed width (the same function as n separate ones).
            out = MoE(cfg, name="moe")(h)
            if cfg.n_shared_experts:
                width = cfg.n_shared_experts * cfg.expert_d_ff
                out = out + SwiGLU(cfg, d_ff=width, name="shared_mlp")(h)
        else:
            out = SwiGLU(cfg, name="mlp")(h)
        x = x + out
        return checkpoint_name(constrain(x, RESIDUAL_AXES), names.BLOCK_OUT), None


class Llama(nn.Module):
    """Token ids (batch, seq) -> logits (batch, seq, vocab).

    Example:
      >>> import jax, jax.numpy as jnp, models
      >>> cfg = models.get_config("tiny-llama")
      >>> tokens = jnp.zeros((1, 8), jnp.int32)
      >>> params = jax.eval_shape(models.Llama(cfg).init, jax.random.key(0), tokens)  # shapes
      >>> sum(x.size for x in jax.tree.leaves(params)) == cfg.param_count()
      True
      >>> jax.eval_shape(models.Llama(cfg).apply, params, tokens).shape
      (1, 8, 256)
    """

    cfg: ModelConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        cfg = self.cfg
        embed = nn.Embed(
            cfg.vocab_size,
            cfg.d_model,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            embedding_init=partitioned(nn.initializers.normal(0.02), ("vocab", "embed")),
            name="embed",
        )
        x = embedded(embed(tokens))
        if cfg.embed_scale:
            # Gemma scales the embeddings by sqrt(d_model), in the compute dtype.
            x = x * jax.numpy.sqrt(cfg.d_model).astype(x.dtype)
        x = BlockStack(cfg, LlamaBlock, self.deterministic, name="decoder")(x)
        x = nn.RMSNorm(
            epsilon=cfg.norm_eps,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            scale_init=partitioned(nn.initializers.ones, ("norm",)),
            name="final_norm",
        )(x)
        if cfg.tie_embeddings:
            return constrain(embed.attend(x), LOGITS_AXES)
        logits = nn.Dense(
            cfg.vocab_size,
            use_bias=False,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            kernel_init=partitioned(nn.initializers.normal(0.02), ("embed", "vocab")),
            name="lm_head",
        )(x)
        return constrain(logits, LOGITS_AXES)


__all__ = ["Llama", "LlamaBlock", "SwiGLU"]
