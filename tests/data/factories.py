"""Factories ``NAME(policy)`` for the model-source tests (``--model tests/data/factories.py:NAME``).

Tiny shapes only: every test compiles or traces them on a CPU. The Hugging Face ones need
``transformers`` (the ``[test]`` extra); the others need nothing but flax.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

import remat_kit as rk
import remat_kit_models as models

VOCAB, WIDTH, LAYERS = 256, 64, 4

# Beside this file, on sys.path while a factory file runs: importable as --block names it.
# Imported by module name (tests.data.factories), the file's folder is not on sys.path.
try:
    import jit_blocks
    import nnx_blocks
except ModuleNotFoundError:
    from tests.data import jit_blocks, nnx_blocks

_CAPTURED = (nnx_blocks.Model, nnx_blocks.PlainBlock)


def hf_llama(policy):
    """Hugging Face's Flax Llama (no remat hook: measured with --block)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_flax_llama import FlaxLlamaForCausalLMModule

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return FlaxLlamaForCausalLMModule(config, dtype=jnp.float32)


def hf_gpt2(policy):
    """Hugging Face's Flax GPT-2 (Conv1D projections c_attn/c_proj/c_fc; --block)."""
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_flax_gpt2 import FlaxGPT2LMHeadModule

    config = GPT2Config(vocab_size=VOCAB, n_embd=WIDTH, n_layer=LAYERS, n_head=4, n_positions=128)
    return FlaxGPT2LMHeadModule(config, dtype=jnp.float32)


class _Block(nn.Module):
    """A pre-norm block with Hugging Face's projection names and no tags of its own."""

    @nn.compact
    def __call__(self, x, deterministic: bool = True):
        h = nn.RMSNorm()(x)
        q = nn.Dense(WIDTH, name="q_proj")(h)
        v = nn.Dense(WIDTH, name="v_proj")(h)
        scores = jnp.einsum("bsd,btd->bst", q, nn.Dense(WIDTH, name="k_proj")(h)) / 8.0
        mask = jnp.tril(jnp.ones(scores.shape[-2:], bool))
        probs = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
        x = x + nn.Dense(WIDTH, name="o_proj")(jnp.einsum("bst,btd->bsd", probs, v))
        h = nn.RMSNorm()(x)
        gate = nn.Dense(2 * WIDTH, name="gate_proj")(h)
        up = nn.Dense(2 * WIDTH, name="up_proj")(h)
        mid = nn.Dense(2 * WIDTH, name="mixer")(nn.silu(gate) * up)  # no rule: a path tag
        return x + nn.Dense(WIDTH, name="down_proj")(mid)


class _Untagged(nn.Module):
    policy: rk.Policy

    @nn.compact
    def __call__(self, tokens):
        block = rk.remat(_Block, self.policy)
        x = nn.Embed(VOCAB, WIDTH)(tokens)
        for i in range(LAYERS):
            x = block(name=f"layers_{i}")(x, deterministic=True)
        return nn.Dense(VOCAB, name="lm_head")(x)


def untagged(policy):
    """A linen model with Hugging Face's layer names and no checkpoint_name of its own."""
    return _Untagged(policy)


def preset(policy, schedule="none"):
    """Our tiny-llama preset through the factory door: takes schedules."""
    return models.build(models.get_config("tiny-llama", policy=policy, schedule=schedule))


def ignores_policy(policy):
    """A factory that never applies the policy it is given."""
    return models.build(models.get_config("tiny-llama"))


def always_full(policy):
    """A factory that checkpoints with 'full' whatever it is given."""
    return models.build(models.get_config("tiny-llama", policy="full"))


class _Pooled(nn.Module):
    """Mean-pools the sequence before the head: logits [batch, vocab], not per token."""

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(VOCAB, WIDTH)(tokens)
        return nn.Dense(VOCAB, name="lm_head")(x.mean(axis=1))


def pooled(policy):
    """A classifier, not a language model: one row of logits per sequence, [batch, vocab]."""
    return _Pooled()


class _Scored(nn.Module):
    """One score per token, returned in an output's ``.logits``: [batch, seq]."""

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(VOCAB, WIDTH)(tokens)
        return _Output(nn.Dense(1, name="score")(x)[..., 0])


class _Output:
    def __init__(self, logits):
        self.logits = logits


def scored(policy):
    """A model whose ``.logits`` hold one number per token, [batch, seq]."""
    return _Scored()


_CACHE: dict[str, nn.Module] = {}


def cached(policy):
    """A factory that keeps the first model it built (a stale trace for every later policy)."""
    if "model" not in _CACHE:
        _CACHE["model"] = models.build(models.get_config("tiny-llama", policy=policy))
    return _CACHE["model"]


class _NNXBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.q_proj = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
        self.up_proj = nnx.Linear(WIDTH, 2 * WIDTH, rngs=rngs)
        self.down_proj = nnx.Linear(2 * WIDTH, WIDTH, rngs=rngs)

    def __call__(self, x):
        x = x + self.q_proj(x)
        return x + self.down_proj(nnx.silu(self.up_proj(x)))


def nnx_model(policy):
    """An NNX model, remat applied with rk.remat on its block class."""
    return nnx_blocks.Model(nnx.Rngs(0), block=rk.remat(_NNXBlock, policy))


not_callable = 3


class _Deep(nn.Module):
    policy: rk.Policy
    layers: int

    @nn.compact
    def __call__(self, tokens):
        block = rk.remat(_Block, self.policy)
        x = nn.Embed(VOCAB, WIDTH)(tokens)
        for i in range(self.layers):
            x = block(name=f"layers_{i}")(x, deterministic=True)
        return nn.Dense(VOCAB, name="lm_head")(nn.RMSNorm()(x))


def deep(policy, layers=8):
    """``untagged``'s layers, as many as asked: a factory that builds shallow copies."""
    return _Deep(policy, layers)


class _OtherBlock(nn.Module):
    """A layer of another kind (gemma 3's global layer among its sliding-window ones)."""

    @nn.compact
    def __call__(self, x, deterministic: bool = True):
        h = nn.Dense(4 * WIDTH, name="up_proj")(nn.RMSNorm()(x))
        return x + nn.Dense(WIDTH, name="down_proj")(nn.gelu(h))


class _Alternating(nn.Module):
    policy: rk.Policy
    layers: int

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(VOCAB, WIDTH)(tokens)
        for i in range(self.layers):
            kind = _OtherBlock if i % 4 == 3 else _Block
            x = rk.remat(kind, self.policy)(name=f"layers_{i}")(x, deterministic=True)
        return nn.Dense(VOCAB, name="lm_head")(nn.RMSNorm()(x))


def alternating(policy, layers=8):
    """``deep`` with every fourth layer of another kind: its copies hold only the first."""
    return _Alternating(policy, layers)


class _OwnNamesBlock(nnx.Module):
    """EasyDeL's way: NNX layers whose code tags its own tensors with its own names."""

    def __init__(self, rngs: nnx.Rngs):
        self.q_proj = nnx.Linear(WIDTH, WIDTH, use_bias=False, rngs=rngs)
        self.k_proj = nnx.Linear(WIDTH, WIDTH, use_bias=False, rngs=rngs)
        self.v_proj = nnx.Linear(WIDTH, WIDTH, use_bias=False, rngs=rngs)
        self.o_proj = nnx.Linear(WIDTH, WIDTH, use_bias=False, rngs=rngs)
        self.gate_proj = nnx.Linear(WIDTH, 2 * WIDTH, use_bias=False, rngs=rngs)
        self.up_proj = nnx.Linear(WIDTH, 2 * WIDTH, use_bias=False, rngs=rngs)
        self.down_proj = nnx.Linear(2 * WIDTH, WIDTH, use_bias=False, rngs=rngs)

    def __call__(self, x):
        from jax.ad_checkpoint import checkpoint_name as name

        h = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
        q = name(self.q_proj(h), "attn_query")
        k = name(self.k_proj(h), "attn_key")
        v = name(self.v_proj(h), "attn_value")
        scores = jnp.einsum("bsd,btd->bst", q, k) / 8.0
        mask = jnp.tril(jnp.ones(scores.shape[-2:], bool))
        probs = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
        out = name(self.o_proj(jnp.einsum("bst,btd->bsd", probs, v)), "attn_output")
        x = name(x + out, "residual")
        h = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
        gate = name(nnx.silu(self.gate_proj(h)), "mlp_gate")
        up = name(self.up_proj(h), "mlp_up")
        x = name(x + name(self.down_proj(gate * up), "mlp_down"), "residual")
        return name(x, "layer_output")


class _Meshed(nn.Module):
    """EasyDeL's habit: activations constrained to a mesh of the devices the step runs on."""

    mesh: jax.sharding.Mesh
    policy: rk.Policy

    @nn.compact
    def __call__(self, tokens):
        spec = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec("dp"))
        block = rk.remat(_Block, self.policy)
        x = nn.Embed(VOCAB, WIDTH)(tokens)
        for i in range(2):
            x = jax.lax.with_sharding_constraint(block(name=f"layers_{i}")(x), spec)
        return nn.Dense(VOCAB, name="lm_head")(x)


def meshed(policy, target):
    """A model built on the target's devices (``target=``: the one the step compiles for)."""
    return _Meshed(target.mesh(("dp",), (target.devices,)), policy)


class _FailsPastOneRow(nn.Module):
    """A model whose own code raises at a batch it cannot take (a mesh it does not divide)."""

    @nn.compact
    def __call__(self, tokens):
        if tokens.shape[0] > 1:
            raise ValueError("Resource axis: dp is not found in mesh: ('fsdp',).\nmore")
        return nn.Dense(VOCAB)(nn.Embed(VOCAB, WIDTH)(tokens))


def fails_past_one_row(policy):
    return _FailsPastOneRow()


def own_names(policy):
    """An NNX model tagged with EasyDeL's names (attn_query ... mlp_down, residual)."""
    return nnx_blocks.Model(nnx.Rngs(0), block=rk.remat(_OwnNamesBlock, policy))


def nnx_plain(policy):
    """An NNX model with no remat hook (tests/data/nnx_blocks.py): measured with --block."""
    return nnx_blocks.Model(nnx.Rngs(0))


def nnx_captured(policy):
    """nnx_plain, but its block class was taken at import: a patch of the module misses it."""
    return _CAPTURED[0](nnx.Rngs(0), block=_CAPTURED[1])


def nnx_native(policy):
    """The same model with its blocks rematerialized by the model itself."""
    return nnx_blocks.Model(nnx.Rngs(0), block=rk.remat(nnx_blocks.PlainBlock, policy))


def jitted_plain(policy):
    """A linen model whose __call__ is nn.jit'ed (gemma's habit), no remat hook: --block."""
    return jit_blocks.Model()


def jitted_setup(policy):
    """Blocks built in setup, __call__ nn.jit'ed (gemma's Transformer), no remat hook."""
    return jit_blocks.SetupModel()


def jitted_native(policy):
    """The same model, unjitted, with its blocks rematerialized by the model itself."""
    return jit_blocks.Unjitted(block=rk.remat(jit_blocks.Block, policy))


class _DropoutModel(nn.Module):
    """flax's examples/lm1b habit: dropout in the blocks, on while training."""

    policy: rk.Policy
    train: bool = True

    @nn.compact
    def __call__(self, tokens):
        block = rk.remat(_Block, self.policy)
        x = nn.Embed(VOCAB, WIDTH)(tokens)
        for i in range(LAYERS):
            x = block(name=f"layers_{i}")(x, deterministic=True)
            x = nn.Dropout(rate=0.1, deterministic=not self.train)(x)
        return nn.Dense(VOCAB, name="lm_head")(x)


def dropout_trained(policy):
    """A linen model that trains with dropout: its apply asks for a 'dropout' stream."""
    return _DropoutModel(policy)


def dropout_off(policy):
    """The same model with its dropout off (deterministic)."""
    return _DropoutModel(policy, train=False)


class MlpBlock(nn.Module):
    """flax's examples' MlpBlock (wmt, lm1b): two unnamed Dense, Dense_0 and Dense_1."""

    @nn.compact
    def __call__(self, x):
        return nn.Dense(WIDTH)(nn.relu(nn.Dense(2 * WIDTH)(x)))


class _FlaxBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=4, qkv_features=WIDTH)(h, h)
        return x + MlpBlock()(nn.LayerNorm()(x))


class _FlaxNamed(nn.Module):
    policy: rk.Policy

    @nn.compact
    def __call__(self, tokens):
        block = rk.remat(_FlaxBlock, self.policy)
        x = nn.Embed(VOCAB, WIDTH)(tokens)
        for i in range(LAYERS):
            x = block(name=f"layers_{i}")(x)
        return nn.Dense(VOCAB, name="lm_head")(x)


def flax_named(policy):
    """A linen model built from flax's own modules with their own names (its examples')."""
    return _FlaxNamed(policy)


def deep_fixed(policy):
    """``deep``'s 8 layers from a factory that takes no ``layers=``: no shallow copies."""
    return _Deep(policy, 8)


class _GemmaLikeBlock(nnx.Module):
    """gemma's NNX block signature: the hidden states, positions, a cache and a mask."""

    def __init__(self, rngs: nnx.Rngs):
        self.q_proj = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
        self.k_proj = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
        self.up_proj = nnx.Linear(WIDTH, 2 * WIDTH, rngs=rngs)
        self.down_proj = nnx.Linear(2 * WIDTH, WIDTH, rngs=rngs)

    def __call__(self, x, positions, cache, attention_mask):
        x = x + jnp.sin(positions[..., None].astype(x.dtype))
        scores = jnp.einsum("bsd,btd->bst", self.q_proj(x), self.k_proj(x))
        probs = jax.nn.softmax(jnp.where(attention_mask, scores, -1e9), axis=-1)
        x = x + jnp.einsum("bst,btd->bsd", probs, x)
        return cache, x + self.down_proj(nnx.silu(self.up_proj(x)))


class _GemmaLike(nnx.Module):
    """gemma's NNX Transformer call: ``(last_tokens, positions, cache, attention_mask [B, L,
    L'])`` -> ``(logits, cache)``, with no default for any of them (flax's examples/gemma)."""

    def __init__(self, policy, rngs: nnx.Rngs):
        self.embed = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
        block = rk.remat(_GemmaLikeBlock, policy)
        self.layers = nnx.List([block(rngs) for _ in range(2)])
        self.head = nnx.Linear(WIDTH, VOCAB, rngs=rngs)

    def __call__(self, last_tokens, positions, cache, attention_mask):
        x = self.embed(last_tokens)
        for layer in self.layers:
            cache, x = layer(x, positions, cache, attention_mask)
        return self.head(x), cache


def gemma_like(policy):
    """An NNX model called as gemma's is: remat-kit makes its positions, cache and mask."""
    return _GemmaLike(policy, nnx.Rngs(0))


class _NeedsMore(nn.Module):
    @nn.compact
    def __call__(self, tokens, temperature):
        return nn.Dense(VOCAB)(nn.Embed(VOCAB, WIDTH)(tokens)) / temperature


def needs_more(policy):
    """A model that requires an input remat-kit cannot make from the tokens."""
    return _NeedsMore()
