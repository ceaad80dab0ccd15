"""A Llama-style model (an EasyDeL Llama stand-in, linen and NNX) as a factory and as a user's step.

``--model experiments/llama_own_step.py:model`` measures remat_kit's train step around the model;
``--step experiments/llama_own_step.py:step`` measures the plain step a user writes for it:
value_and_grad of cross-entropy (logits upcast to f32) and optax SGD, the parameters donated.
Both run the same module: unrolled layers, bf16 weights and compute, grouped-query einsum
attention with a causal mask and rotary positions, SwiGLU MLP, untied embedding and head.
``nnx_model`` / ``nnx_step`` are the same model in NNX (EasyDeL's framework), the step in
EasyDeL's style: ``nnx.split`` into graph, parameters and the rest, ``nnx.merge`` in the loss.

The shape is Llama 3 8B's (width 4096, 32 layers, MLP 14336, vocab 128256, 32 heads, 8 KV
heads); ``RK_LLAMA_LAYERS`` sets the depth (``model`` also takes ``layers=``).
"""

from __future__ import annotations

import dataclasses
import os
import types
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

import remat_kit as rk

WIDTH, FF, VOCAB, HEADS, KV_HEADS = 4096, 14336, 128256, 32, 8
LAYERS = int(os.environ.get("RK_LLAMA_LAYERS", "32"))
DTYPE = jnp.bfloat16


def _rotary(x: jax.Array) -> jax.Array:
    s, d = x.shape[1], x.shape[-1]
    freq = 500000.0 ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)
    angle = jnp.arange(s, dtype=jnp.float32)[:, None] * freq[None, :]
    shape = (1, s) + (1,) * (x.ndim - 3) + (d // 2,)
    cos, sin = jnp.cos(angle).reshape(shape), jnp.sin(angle).reshape(shape)
    a, b = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([a * cos - b * sin, a * sin + b * cos], -1).astype(x.dtype)


class Block(nn.Module):
    """Pre-norm grouped-query attention and SwiGLU MLP; projections tagged with our names."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        def dense(n: int, name: str) -> nn.Dense:
            return nn.Dense(n, False, dtype=DTYPE, param_dtype=DTYPE, name=name)

        hd = WIDTH // HEADS
        norm = lambda name: nn.RMSNorm(dtype=DTYPE, param_dtype=DTYPE, name=name)
        layers = types.SimpleNamespace(
            input_norm=norm("input_norm"),
            post_norm=norm("post_norm"),
            q_proj=dense(HEADS * hd, "q_proj"),
            k_proj=dense(KV_HEADS * hd, "k_proj"),
            v_proj=dense(KV_HEADS * hd, "v_proj"),
            o_proj=dense(WIDTH, "o_proj"),
            gate_proj=dense(FF, "gate_proj"),
            up_proj=dense(FF, "up_proj"),
            down_proj=dense(WIDTH, "down_proj"),
        )
        return _attention_mlp(layers, x)


class Llama(nn.Module):
    policy: rk.Policy
    layers: int = LAYERS

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        block = rk.remat(Block, self.policy)  # Block itself for "none"
        x = nn.Embed(VOCAB, WIDTH, dtype=DTYPE, param_dtype=DTYPE, name="embed")(tokens)
        for i in range(self.layers):
            x = block(name=f"layers_{i}")(x)
        x = nn.RMSNorm(dtype=DTYPE, param_dtype=DTYPE, name="norm")(x)
        return nn.Dense(VOCAB, False, dtype=DTYPE, param_dtype=DTYPE, name="lm_head")(x)


def model(policy: rk.Policy, layers: int = LAYERS) -> Llama:
    """The factory: ``--model experiments/llama_own_step.py:model`` (remat_kit's step)."""
    return Llama(policy, layers)


def step(policy: rk.Policy, config: rk.TrainConfig) -> rk.sources.OwnStep:
    """The user's step: value_and_grad of cross-entropy, optax SGD, parameters donated."""
    net = Llama(policy)
    tokens = jax.ShapeDtypeStruct((config.batch, config.seq), jnp.int32)
    params = jax.eval_shape(net.init, jax.random.key(0), tokens)["params"]
    tx = optax.sgd(1e-4)
    opt_state = jax.eval_shape(tx.init, params)
    batch = {"input_ids": tokens, "labels": tokens}

    def loss_fn(params, batch):
        logits = net.apply({"params": params}, batch["input_ids"])
        return optax.softmax_cross_entropy_with_integer_labels(
            logits.astype(jnp.float32), batch["labels"]
        ).mean()

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return rk.sources.OwnStep(
        jax.jit(train_step, donate_argnums=(0, 1)),
        (params, opt_state, batch),
        loss_fn=loss_fn,
        loss_args=(params, batch),
        roles={"params": 0, "optimizer": 1, "batch": 2},
    )


def _attention_mlp(p: Any, x: jax.Array) -> jax.Array:
    """A block's computation with its layers ``p`` (linen or NNX: same names, same math)."""
    b, s, _ = x.shape
    hd = WIDTH // HEADS
    h = p.input_norm(x)
    q = checkpoint_name(p.q_proj(h), "query_proj")
    k = checkpoint_name(p.k_proj(h), "key_proj")
    v = checkpoint_name(p.v_proj(h), "value_proj")
    q = _rotary(q.reshape(b, s, KV_HEADS, HEADS // KV_HEADS, hd))
    k = _rotary(k.reshape(b, s, KV_HEADS, hd))
    v = v.reshape(b, s, KV_HEADS, hd)
    scores = jnp.einsum("bskgd,btkd->bkgst", q, k) / hd**0.5
    mask = jnp.tril(jnp.ones((s, s), bool))
    probs = jax.nn.softmax(jnp.where(mask, scores.astype(jnp.float32), -1e9), -1)
    ctx = jnp.einsum("bkgst,btkd->bskgd", probs.astype(DTYPE), v).reshape(b, s, WIDTH)
    ctx = checkpoint_name(ctx, "context")
    x = x + checkpoint_name(p.o_proj(ctx), "out_proj")
    h = p.post_norm(x)
    gate = checkpoint_name(p.gate_proj(h), "mlpwi_0")
    up = checkpoint_name(p.up_proj(h), "mlpwi_1")
    return x + checkpoint_name(p.down_proj(nnx.silu(gate) * up), "mlpwo")


def _linear(n_in: int, n_out: int, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(n_in, n_out, use_bias=False, dtype=DTYPE, param_dtype=DTYPE, rngs=rngs)


class NNXBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        hd = WIDTH // HEADS
        norm = lambda: nnx.RMSNorm(WIDTH, dtype=DTYPE, param_dtype=DTYPE, rngs=rngs)
        self.input_norm, self.post_norm = norm(), norm()
        self.q_proj = _linear(WIDTH, HEADS * hd, rngs)
        self.k_proj = _linear(WIDTH, KV_HEADS * hd, rngs)
        self.v_proj = _linear(WIDTH, KV_HEADS * hd, rngs)
        self.o_proj = _linear(WIDTH, WIDTH, rngs)
        self.gate_proj = _linear(WIDTH, FF, rngs)
        self.up_proj = _linear(WIDTH, FF, rngs)
        self.down_proj = _linear(FF, WIDTH, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return _attention_mlp(self, x)


class NNXLlama(nnx.Module):
    def __init__(self, policy: rk.Policy, layers: int, rngs: nnx.Rngs):
        self.embed = nnx.Embed(VOCAB, WIDTH, dtype=DTYPE, param_dtype=DTYPE, rngs=rngs)
        block = rk.remat(NNXBlock, policy)  # NNXBlock itself for "none"
        self.layers = nnx.List([block(rngs) for _ in range(layers)])
        self.norm = nnx.RMSNorm(WIDTH, dtype=DTYPE, param_dtype=DTYPE, rngs=rngs)
        self.lm_head = _linear(WIDTH, VOCAB, rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def nnx_model(policy: rk.Policy, layers: int = LAYERS) -> NNXLlama:
    """The NNX factory: ``--model experiments/llama_own_step.py:nnx_model``."""
    return NNXLlama(policy, layers, nnx.Rngs(0))


def nnx_step(policy: rk.Policy, config: rk.TrainConfig) -> rk.sources.OwnStep:
    """The user's NNX step, as EasyDeL's trainer runs it: the model split into its graph,
    parameters and the rest; value_and_grad of cross-entropy over the parameters; optax SGD;
    parameters (and the empty SGD state) donated."""
    abstract = nnx.eval_shape(lambda: NNXLlama(policy, LAYERS, nnx.Rngs(0)))
    graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
    tx = optax.sgd(1e-4)
    opt_state = jax.eval_shape(tx.init, params)
    tokens = jax.ShapeDtypeStruct((config.batch, config.seq), jnp.int32)
    batch = {"input_ids": tokens, "labels": tokens}

    def loss_fn(params, rest, batch):
        logits = nnx.merge(graphdef, params, rest)(batch["input_ids"])
        return optax.softmax_cross_entropy_with_integer_labels(
            logits.astype(jnp.float32), batch["labels"]
        ).mean()

    def train_step(params, rest, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, rest, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return rk.sources.OwnStep(
        jax.jit(train_step, donate_argnums=(0, 2)),
        (params, rest, opt_state, batch),
        loss_fn=loss_fn,
        loss_args=(params, rest, batch),
        roles={"params": 0, "frozen": 1, "optimizer": 2, "batch": 3},
    )


def _renamed(tree: Any, width: int) -> Any:
    """``layers_7`` <-> ``layers_07``: the same parameters under keys that sort another way."""

    def key(k: str) -> str:
        if k.startswith("layers_"):
            return f"layers_{int(k.split('_')[1]):0{width}d}" if width else f"layers_{int(k[7:])}"
        return k

    return {key(k): v for k, v in tree.items()}


def step_reordered(policy: rk.Policy, config: rk.TrainConfig) -> rk.sources.OwnStep:
    """``step`` with the layers' parameters keyed ``layers_00 .. layers_31``: the same program
    but for the order of its arguments (jax flattens dicts in sorted key order: ``layers_10``
    comes before ``layers_2`` in ``step``, after ``layers_09`` here; with fewer than 11 layers
    the orders agree)."""
    own = step(policy, config)
    inner = own.fn.__wrapped__
    params, opt_state, batch = own.args
    padded = _renamed(params, 2)

    def train_step(params, opt_state, batch):
        new, opt_state, loss = inner(_renamed(params, 0), opt_state, batch)
        return _renamed(new, 2), opt_state, loss

    return rk.sources.OwnStep(
        jax.jit(train_step, donate_argnums=(0, 1)),
        (padded, opt_state, batch),
        roles={"params": 0, "optimizer": 1, "batch": 2},
    )


def step_bf16_loss(policy: rk.Policy, config: rk.TrainConfig) -> rk.sources.OwnStep:
    """``step`` with the cross-entropy computed on the bf16 logits (no f32 upcast)."""
    net = Llama(policy)
    own = step(policy, config)
    tx = optax.sgd(1e-4)

    def loss_fn(params, batch):
        logits = net.apply({"params": params}, batch["input_ids"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return dataclasses.replace(own, fn=jax.jit(train_step, donate_argnums=(0, 1)), loss_fn=loss_fn)
