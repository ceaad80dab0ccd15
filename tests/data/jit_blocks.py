"""A linen model whose ``__call__`` is wrapped in ``nn.jit`` (as gemma's ``Transformer`` is):
``nn.jit`` replays the trace it cached for the module, so ``--block jit_blocks:Block``
must give each policy a trace of its own."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax.numpy as jnp

VOCAB, WIDTH, LAYERS = 256, 64, 4


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(4 * WIDTH, name="up_proj")(nn.RMSNorm()(x))
        return x + nn.Dense(WIDTH, name="down_proj")(jnp.tanh(h))


def _body(module, tokens):
    x = nn.Embed(VOCAB, WIDTH)(tokens)
    for i in range(LAYERS):
        x = (module.block or Block)(name=f"layers_{i}")(x)
    return nn.Dense(VOCAB, name="lm_head")(x)


class Model(nn.Module):
    block: type | None = None  # the model's own remat'd block, else Block (patched by name)

    @functools.partial(nn.jit, static_argnames=("self",))
    @nn.compact
    def __call__(self, tokens):
        return _body(self, tokens)


class Unjitted(nn.Module):
    """The same model without nn.jit (its own remat'd block is then traced afresh)."""

    block: type | None = None

    @nn.compact
    def __call__(self, tokens):
        return _body(self, tokens)


class SetupModel(nn.Module):
    """gemma's exact shape: blocks built in ``setup`` (named ``layer_i``) and an ``nn.jit``'ed
    ``__call__``; flax runs ``setup`` again for each clone of the model."""

    def setup(self):
        self.embed = nn.Embed(VOCAB, WIDTH)
        self.blocks = [Block(name=f"layer_{i}") for i in range(LAYERS)]
        self.head = nn.Dense(VOCAB)

    @functools.partial(nn.jit, static_argnames=("self",))
    def __call__(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)
