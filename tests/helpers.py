"""Small shared helpers for the tests (not fixtures)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import remat_kit_models as models


def tokens(batch: int = 2, seq: int = 16, vocab: int = 256, seed: int = 1) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (batch, seq), 0, vocab)


def loss_and_grads(cfg: models.ModelConfig, params, toks, *, dropout_key=None):
    """Next-token cross-entropy and its gradients for ``cfg`` (policy from the config)."""
    module = models.build(cfg, deterministic=dropout_key is None)
    rngs = {} if dropout_key is None else {"dropout": dropout_key}

    def loss(p):
        logits = module.apply(p, toks[:, :-1], rngs=rngs).astype(jnp.float32)
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, toks[:, 1:, None], axis=-1).mean()

    return jax.jit(jax.value_and_grad(loss))(params)
