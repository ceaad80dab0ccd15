"""Users' own train steps for ``--step tests/data/own_steps.py:NAME`` (``rk.sources.from_step``).

A tiny Llama-like linen model (RMSNorm, causal attention, SwiGLU MLP, bf16 weights) whose
projections carry ``checkpoint_name`` tags, trained by value_and_grad of cross-entropy and an
optax SGD update with the parameters donated, returned in each form a step function may use.
``model`` is the same model as a factory (``--model tests/data/own_steps.py:model``), so the
two paths can be compared.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.ad_checkpoint import checkpoint_name

import remat_kit as rk

VOCAB, WIDTH, HEADS, FF, LAYERS = 256, 64, 4, 128, 2
DTYPE = jnp.bfloat16


class Block(nn.Module):
    """Pre-norm attention and SwiGLU MLP, its projections tagged with remat_kit's names."""

    @nn.compact
    def __call__(self, x):
        dense = lambda n, name: nn.Dense(n, False, dtype=DTYPE, param_dtype=DTYPE, name=name)
        h = nn.RMSNorm(dtype=DTYPE, param_dtype=DTYPE)(x)
        b, s, _ = h.shape
        split = lambda t: t.reshape(b, s, HEADS, WIDTH // HEADS)
        q = split(checkpoint_name(dense(WIDTH, "q")(h), "query_proj"))
        k = split(checkpoint_name(dense(WIDTH, "k")(h), "key_proj"))
        v = split(checkpoint_name(dense(WIDTH, "v")(h), "value_proj"))
        scores = jnp.einsum("bshd,bthd->bhst", q, k) / (WIDTH // HEADS) ** 0.5
        mask = jnp.tril(jnp.ones((s, s), bool))
        probs = jax.nn.softmax(jnp.where(mask, scores, -1e9).astype(jnp.float32), -1)
        ctx = jnp.einsum("bhst,bthd->bshd", probs.astype(DTYPE), v).reshape(b, s, WIDTH)
        x = x + checkpoint_name(dense(WIDTH, "o")(checkpoint_name(ctx, "context")), "out_proj")
        h = nn.RMSNorm(dtype=DTYPE, param_dtype=DTYPE)(x)
        gate = checkpoint_name(dense(FF, "gate")(h), "mlpwi_0")
        up = checkpoint_name(dense(FF, "up")(h), "mlpwi_1")
        return x + checkpoint_name(dense(WIDTH, "down")(nn.silu(gate) * up), "mlpwo")


class Llama(nn.Module):
    policy: rk.Policy
    layers: int = LAYERS

    @nn.compact
    def __call__(self, tokens):
        block = rk.remat(Block, self.policy)  # Block itself for "none"
        x = nn.Embed(VOCAB, WIDTH, dtype=DTYPE, param_dtype=DTYPE)(tokens)
        for i in range(self.layers):
            x = block(name=f"layers_{i}")(x)
        x = nn.RMSNorm(dtype=DTYPE, param_dtype=DTYPE)(x)
        return nn.Dense(VOCAB, use_bias=False, dtype=DTYPE, param_dtype=DTYPE, name="head")(x)


def model(policy):
    """The same model as a factory: ``--model tests/data/own_steps.py:model``."""
    return Llama(policy)


def auto_train(policy=None):
    """The model with its blocks marked ``"auto"`` (``policy`` None: what ``rk.auto``
    decides for) or wrapped with ``policy`` by hand, its loss and an SGD train step over
    ``(params, opt_state, batch)`` (params and optimizer state meant to be donated): the step
    tests/test_auto.py checks the decision on and experiments/auto_budget.py times.

    Returns:
      ``(net, loss_fn, train_step, tx)``; ``loss_fn(params, batch)``.
    """
    net = Llama(rk.marks.AUTO if policy is None else policy)
    tx = optax.sgd(1e-3)

    def loss_fn(params, batch):
        logits = net.apply({"params": params}, batch["tokens"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return net, loss_fn, train_step, tx


def _parts(policy, config, optimizer=None):
    """The model, its loss, and the abstract parameters, optimizer state and batch."""
    net = Llama(policy)
    tokens = jax.ShapeDtypeStruct((config.batch, config.seq), jnp.int32)
    params = jax.eval_shape(net.init, jax.random.key(0), tokens)["params"]
    batch = {"tokens": tokens, "targets": tokens}

    def loss_fn(params, batch):
        logits = net.apply({"params": params}, batch["tokens"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()

    opt_state = jax.eval_shape(optimizer.init, params) if optimizer is not None else None
    return loss_fn, params, opt_state, batch


def linen_step(policy, config):
    """value_and_grad + optax SGD, params and optimizer state donated, every role named."""
    tx = optax.sgd(1e-3)
    loss_fn, params, opt_state, batch = _parts(policy, config, tx)

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return rk.sources.OwnStep(
        step,
        (params, opt_state, batch),
        donate_argnums=(0, 1),
        loss_fn=loss_fn,
        loss_args=(params, batch),
        roles={"params": 0, "optimizer": 1, "batch": 2},
    )


def _plain(policy, config):
    loss_fn, params, _, batch = _parts(policy, config)

    def step(params, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), loss

    return step, (params, batch)


def tuple_step(policy, config):
    """The plain form: ``(fn, args, donate_argnums)``, SGD by hand, no roles, no loss."""
    step, args = _plain(policy, config)
    return step, args, (0,)


def jitted_step(policy, config):
    """``(jax.jit(fn, donate_argnums=0), args)``: the donation is the jit's."""
    step, args = _plain(policy, config)
    return jax.jit(step, donate_argnums=0), args


def bad_return(policy, config):
    """Returns the model, not a step."""
    return Llama(policy)


def ignores_policy(policy, config):
    """Always builds the model with ``full``, whatever it is given."""
    return linen_step(rk.policy("full"), config)
