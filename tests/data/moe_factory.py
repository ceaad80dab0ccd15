"""A user's mixture-of-experts model, written the way one would without remat_kit's presets.

Router, top-k, tokens sorted by expert, and SwiGLU experts as grouped GEMMs
(``jax.lax.ragged_dot``): what Mixtral-style training code does. Nothing here comes from
``remat_kit_models``; the expert outputs carry the user's own tag names, so only the traced
primitives say they are matmuls. ``shard_map=True`` runs the experts inside a ``shard_map`` over
a one-device mesh (what an expert-parallel layout does on one device).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import Mesh, PartitionSpec

import remat_kit as rk

VOCAB = 64


def _shard_map(fn, mesh, in_specs, out_specs):
    # jax.shard_map is public from jax 0.6; older releases keep it under experimental.
    if hasattr(jax, "shard_map"):
        return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    from jax.experimental.shard_map import shard_map

    return shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs)


def experts(x, wi_0, wi_1, wo, group_sizes):
    """SwiGLU over tokens sorted by expert: three grouped GEMMs."""
    gate = checkpoint_name(jax.lax.ragged_dot(x, wi_0, group_sizes), "expert_gate")
    up = checkpoint_name(jax.lax.ragged_dot(x, wi_1, group_sizes), "expert_up")
    return checkpoint_name(jax.lax.ragged_dot(nn.silu(gate) * up, wo, group_sizes), "expert_out")


class MoE(nn.Module):
    experts: int
    ff: int
    top_k: int = 2
    shard_map: bool = False

    @nn.compact
    def __call__(self, x):
        b, s, d = x.shape
        e, f, k = self.experts, self.ff, self.top_k
        tokens = x.reshape(b * s, d)
        logits = nn.Dense(e, use_bias=False, name="router")(tokens)
        weights, chosen = jax.lax.top_k(jax.nn.softmax(logits), k)
        flat = chosen.reshape(-1)
        order = jnp.argsort(flat)
        rows = jnp.repeat(tokens, k, axis=0)[order]
        group_sizes = jnp.bincount(flat, length=e).astype(jnp.int32)
        init = nn.initializers.normal(0.02)
        wi_0 = self.param("wi_0", init, (e, d, f))
        wi_1 = self.param("wi_1", init, (e, d, f))
        wo = self.param("wo", init, (e, f, d))
        run = experts
        if self.shard_map:
            mesh = Mesh(np.array(jax.devices()[:1]), ("expert",))
            rep = PartitionSpec()
            run = _shard_map(experts, mesh, (rep, rep, rep, rep, rep), rep)
        out = run(rows, wi_0, wi_1, wo, group_sizes)
        unsorted = jnp.zeros_like(out).at[order].set(out).reshape(b * s, k, d)
        return (unsorted * weights[..., None]).sum(axis=1).reshape(b, s, d)


class Block(nn.Module):
    experts: int
    ff: int
    shard_map: bool = False

    @nn.compact
    def __call__(self, x, _=None):
        y = x + MoE(self.experts, self.ff, shard_map=self.shard_map)(nn.RMSNorm()(x))
        return y, None


class Model(nn.Module):
    policy: rk.Policy | str
    layers: int = 2
    width: int = 32
    experts: int = 4
    ff: int = 48
    scan: bool = True
    shard_map: bool = False

    @nn.compact
    def __call__(self, tokens):
        block = rk.remat(Block, self.policy)
        x = nn.Embed(VOCAB, self.width)(tokens)
        if self.scan:
            stack = nn.scan(
                block,
                variable_axes={"params": 0},
                split_rngs={"params": True},
                length=self.layers,
            )
            x, _ = stack(self.experts, self.ff, self.shard_map, name="layers")(x, None)
        else:
            for i in range(self.layers):
                x, _ = block(self.experts, self.ff, self.shard_map, name=f"layers_{i}")(x)
        return nn.Dense(VOCAB, name="lm_head")(x)


def moe(policy):
    """The factory ``--model tests/data/moe_factory.py:moe`` (scanned, two layers)."""
    return Model(policy)
