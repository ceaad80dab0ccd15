"""Multi-head / grouped-query self-attention with the tagged names of remat_kit.

Two implementations behind one switch: ``"xla"`` writes attention as explicit einsums,
so every tag of the vocabulary exists (the seq x seq scores and probabilities
included); ``"cudnn"`` calls ``jax.nn.dot_product_attention(implementation="cudnn")``,
flash attention: the scores are never materialised and only ``context`` is tagged.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from remat_kit import names
from remat_kit_models.axes import constrain, partitioned
from remat_kit_models.config import ModelConfig
from remat_kit_models.lora import project


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding on the last axis of ``x`` (..., seq, heads, head_dim)."""
    half = x.shape[-1] // 2
    freq = 1.0 / (theta ** (jnp.arange(half, dtype=jnp.float32) / half))
    angles = positions[:, None].astype(jnp.float32) * freq[None, :]  # seq, half
    sin = jnp.sin(angles)[:, None, :]
    cos = jnp.cos(angles)[:, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


class SelfAttention(nn.Module):
    """Self-attention over (batch, seq, d_model); GQA when n_kv_heads < n_heads."""

    cfg: ModelConfig
    use_rope: bool = True
    use_bias: bool = False
    deterministic: bool = True
    qkv_bias: bool | None = None  # bias on q/k/v only (Qwen2); None: as use_bias

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg
        s = x.shape[1]
        h, n, kv = cfg.dim_per_head, cfg.n_heads, cfg.n_kv_heads
        qkv_bias = self.use_bias if self.qkv_bias is None else self.qkv_bias
        dense = lambda feats, heads, name: nn.DenseGeneral(
            feats,
            use_bias=qkv_bias,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            kernel_init=partitioned(nn.initializers.normal(0.02), ("embed", heads, "head_dim")),
            bias_init=partitioned(nn.initializers.zeros, (heads, "head_dim")),
            name=name,
        )
        q_axes = ("act_batch", None, "act_heads", None)
        kv_axes = ("act_batch", None, "act_kv_heads", None)
        q = project(cfg, dense((n, h), "heads", "query"), x, (n, h), "query")
        q = checkpoint_name(constrain(q, q_axes), names.QUERY_PROJ)
        k = project(cfg, dense((kv, h), "kv_heads", "key"), x, (kv, h), "key")
        k = checkpoint_name(constrain(k, kv_axes), names.KEY_PROJ)
        v = project(cfg, dense((kv, h), "kv_heads", "value"), x, (kv, h), "value")
        v = checkpoint_name(constrain(v, kv_axes), names.VALUE_PROJ)
        if self.use_rope:
            positions = jnp.arange(s)
            q = rope(q, positions, cfg.rope_theta)
            k = rope(k, positions, cfg.rope_theta)

        if cfg.attention == "cudnn":
            context = jax.nn.dot_product_attention(
                q, k, v, is_causal=cfg.causal, implementation="cudnn"
            )
        else:
            context = self._einsum_attention(q, k, v)
        context = checkpoint_name(constrain(context, q_axes), names.CONTEXT)

        out_layer = nn.DenseGeneral(
            cfg.d_model,
            axis=(-2, -1),
            use_bias=self.use_bias,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            kernel_init=partitioned(nn.initializers.normal(0.02), ("heads", "head_dim", "embed")),
            bias_init=partitioned(nn.initializers.zeros, ("embed",)),
            name="out",
        )
        out = project(cfg, out_layer, context, (cfg.d_model,), "out", in_axes=2)
        return checkpoint_name(out, names.OUT_PROJ)

    def _einsum_attention(self, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        cfg = self.cfg
        b, s, n, h = q.shape
        kv = k.shape[2]
        # Group query heads by their shared KV head instead of repeating K/V in memory.
        qg = q.reshape(b, s, kv, n // kv, h)
        scores = jnp.einsum("bskgh,btkh->bkgst", qg, k) / jnp.sqrt(h).astype(q.dtype)
        if cfg.causal:
            mask = jnp.tril(jnp.ones((s, s), dtype=bool))
            scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
        scores = checkpoint_name(scores, names.ATTN_SCORES)
        # Softmax in f32: bf16 logits lose the small probabilities.
        probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(cfg.dtype)
        probs = nn.Dropout(cfg.dropout_rate, deterministic=self.deterministic)(probs)
        probs = checkpoint_name(probs, names.ATTN_PROBS)
        context = jnp.einsum("bkgst,btkh->bskgh", probs, v)
        return context.reshape(b, s, n, h)
