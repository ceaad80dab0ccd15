"""Multi-head / grouped-query self-attention with the tagged names of remat_kit.

Two implementations behind one switch: ``"xla"`` writes attention as explicit einsums,
so every tag of the vocabulary exists (the seq x seq scores and probabilities
included); ``"cudnn"`` calls ``jax.nn.dot_product_attention(implementation="cudnn")``,
flash attention: the scores are never materialised and only ``context`` is tagged.

Under context parallelism (a mesh plan with ``cp``) queries keep their sequence split and
keys and values are gathered whole (``KV_GATHERED_AXES``) before attention reads them. The
einsum path is partitioned by XLA as it stands (the causal mask comes from positions over
the whole sequence). cuDNN's kernel refuses a split sequence (its partitioning rule allows
batch and heads only), so under ``cp`` it runs per device in a ``shard_map``: the local
queries against all keys, the causal mask offset by the device's place in the sequence and
given as a mask (cuDNN's own causal mask assumes queries start at position 0).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec

from remat_kit import names
from remat_kit.errors import BadValue
from remat_kit_models.axes import (
    KV_AXES,
    KV_GATHERED_AXES,
    QUERY_AXES,
    constrain,
    mesh_axes,
    partitioned,
)
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
        q = project(cfg, dense((n, h), "heads", "query"), x, (n, h), "query")
        q = checkpoint_name(constrain(q, QUERY_AXES), names.QUERY_PROJ)
        k = project(cfg, dense((kv, h), "kv_heads", "key"), x, (kv, h), "key")
        k = checkpoint_name(constrain(k, KV_AXES), names.KEY_PROJ)
        v = project(cfg, dense((kv, h), "kv_heads", "value"), x, (kv, h), "value")
        v = checkpoint_name(constrain(v, KV_AXES), names.VALUE_PROJ)
        if cfg.qk_norm:
            # Qwen3: RMSNorm over head_dim on each query and key head, before the rotation.
            norm = lambda name: nn.RMSNorm(
                epsilon=cfg.norm_eps,
                dtype=cfg.dtype,
                param_dtype=cfg.param_dtype,
                scale_init=partitioned(nn.initializers.ones, ("head_dim",)),
                name=name,
            )
            q, k = norm("query_norm")(q), norm("key_norm")(k)
        if self.use_rope:
            positions = jnp.arange(s)  # over the whole sequence, split or not
            q = rope(q, positions, cfg.rope_theta)
            k = rope(k, positions, cfg.rope_theta)
        # Every query attends to the whole sequence: under cp, the all-gather of K and V.
        k, v = constrain(k, KV_GATHERED_AXES), constrain(v, KV_GATHERED_AXES)

        if cfg.attention == "cudnn":
            context = flash_attention(q, k, v, causal=cfg.causal)
        else:
            context = self._einsum_attention(q, k, v)
        context = checkpoint_name(constrain(context, QUERY_AXES), names.CONTEXT)

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


def flash_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool, implementation: str = "cudnn"
) -> jax.Array:
    """``jax.nn.dot_product_attention``, per device under context parallelism.

    Outside a mesh plan, or when the plan leaves the query sequence whole, this is
    ``jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation=...)``. When the
    axis rules split the query sequence (``act_len`` over ``cp``), each device attends its
    queries to the whole keys and values in a ``shard_map`` (batch and heads stay split as
    the rules say), with the causal mask offset by its place in the sequence.

    Args:
      q: queries (batch, seq, heads, head_dim).
      k: keys (batch, seq, kv_heads, head_dim), the whole sequence.
      v: values, as ``k``.
      causal: mask each query's future.
      implementation: ``"cudnn"`` (flash attention) or ``"xla"`` (the same on any backend).

    Returns:
      The attention output, shaped and split like ``q``.

    Raises:
      BadValue: cuDNN under ``cp`` with an odd number of tokens per device (its training
        kernel takes the offset mask as a bias, and a bias only on even lengths).

    Example:
      >>> q = jnp.ones((1, 8, 4, 16))
      >>> flash_attention(q, q, q, causal=True, implementation="xla").shape
      (1, 8, 4, 16)
    """
    q_spec = mesh_axes(QUERY_AXES)
    if q_spec is None or q_spec[1] is None:
        return jax.nn.dot_product_attention(
            q, k, v, is_causal=causal, implementation=implementation
        )
    mesh = jax.sharding.get_abstract_mesh()
    seq_axes = q_spec[1] if isinstance(q_spec[1], tuple) else (q_spec[1],)
    kv_spec = mesh_axes(KV_GATHERED_AXES) or PartitionSpec()
    ways = math.prod(mesh.shape[a] for a in seq_axes)
    local = q.shape[1] // ways
    if implementation == "cudnn" and causal and local % 2:
        # The mask is a bias operand, and cuDNN trains with a bias on even lengths only.
        raise BadValue(
            f"attention='cudnn' under context parallelism needs an even number of tokens per "
            f"device (seq {q.shape[1]} / {ways} = {local}): use a seq that is a multiple of "
            f"{2 * ways}, or attention='xla'",
            param="attention",
        )

    def one_device(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        mask = None
        if causal:
            # This device's queries sit at [index * local, (index + 1) * local).
            index = jnp.zeros((), jnp.int32)
            for a in seq_axes:
                index = index * mesh.shape[a] + jax.lax.axis_index(a)
            rows = index * local + jnp.arange(local)
            mask = (rows[:, None] >= jnp.arange(k.shape[1])[None, :])[None, None]
        return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=implementation)

    return jax.shard_map(
        one_device,
        mesh=mesh,
        in_specs=(q_spec, kv_spec, kv_spec),
        out_specs=q_spec,
        check_vma=False,
    )(q, k, v)
