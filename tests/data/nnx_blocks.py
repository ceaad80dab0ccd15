"""An NNX model with no remat hook, its blocks built in its constructor (as EasyDeL's are):
``--block nnx_blocks:PlainBlock`` must patch the class while the factory builds the model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

VOCAB, WIDTH, LAYERS = 256, 64, 4


class PlainBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.q_proj = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
        self.up_proj = nnx.Linear(WIDTH, 4 * WIDTH, rngs=rngs)
        self.down_proj = nnx.Linear(4 * WIDTH, WIDTH, rngs=rngs)

    def __call__(self, x):
        x = x + jnp.tanh(self.q_proj(x))
        return x + self.down_proj(jax.nn.silu(self.up_proj(x)))


class Model(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, block: type | None = None):
        # block: a block class of the factory's (rk.remat'd, or another kind of block).
        self.embed = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
        # Looked up by name at construction, as a library's model does: the patch replaces it.
        make = block or PlainBlock
        self.blocks = nnx.List([make(rngs) for _ in range(LAYERS)])
        self.head = nnx.Linear(WIDTH, VOCAB, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(x)
