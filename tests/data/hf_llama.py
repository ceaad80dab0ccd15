"""Hugging Face's Flax Llama 3 8B: remat-kit --model tests/data/hf_llama.py:llama (no weights)."""

import jax.numpy as jnp
from transformers import LlamaConfig
from transformers.models.llama.modeling_flax_llama import FlaxLlamaForCausalLMModule

SHAPE = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, vocab_size=128256)
HEADS = dict(num_attention_heads=32, num_key_value_heads=8)
CONFIG = LlamaConfig(**SHAPE, **HEADS, max_position_embeddings=8192, rope_theta=500000.0)


def llama(policy):  # --block patches the decoder layer class with the policy
    return FlaxLlamaForCausalLMModule(CONFIG, dtype=jnp.bfloat16)
