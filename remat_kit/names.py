"""The tagged-tensor vocabulary: the names models give their activations.

The names follow MaxText's so that users coming from it recognise them. Models
tag a tensor with ``jax.ad_checkpoint.checkpoint_name(x, NAME)``; name-based
policies decide per name whether that tensor is saved, offloaded or recomputed.
"""

from __future__ import annotations

DECODER_LAYER_INPUT = "decoder_layer_input"
QUERY_PROJ = "query_proj"
KEY_PROJ = "key_proj"
VALUE_PROJ = "value_proj"
ATTN_SCORES = "attn_scores"
ATTN_PROBS = "attn_probs"
CONTEXT = "context"
OUT_PROJ = "out_proj"
ATTN_OUT = "attn_out"
MLPWI_0 = "mlpwi_0"
MLPWI_1 = "mlpwi_1"
MLPWI = "mlpwi"
MLPWO = "mlpwo"
# Mixture of experts (models.moe). The expert GEMMs are tagged twice, the MoE name inside the
# dense one (as MaxText does): a policy that saves ``mlpwi_0`` saves the experts' too, and one
# that names ``moe_mlpwi_0`` tells them apart from a dense or shared-expert MLP.
ROUTER_LOGITS = "router_logits"
MOE_MLPWI_0 = "moe_mlpwi_0"
MOE_MLPWI_1 = "moe_mlpwi_1"
MOE_MLPWO = "moe_mlpwo"
BLOCK_OUT = "block_out"
# MaxText tags these too, and its remat_policy values name them (maxtext 0.2.5,
# layers/nnx_decoders.py get_remat_policy); no model of this project does, so they stay out of
# VOCABULARY (which the models' tags must equal).
KV_PROJ = "kv_proj"  # a fused or shared key-value projection (attention_compressed.py)
QKV_PROJ = "qkv_proj"  # the fused query-key-value projection (fused_qkv, GPT-3)
QUANTIZATION = "quantization"  # TransformerEngine's quantizer state (quantizations.py)

#: Every name a model in this project may tag, in the order they occur in a block.
VOCABULARY: tuple[str, ...] = (
    DECODER_LAYER_INPUT,
    QUERY_PROJ,
    KEY_PROJ,
    VALUE_PROJ,
    ATTN_SCORES,
    ATTN_PROBS,
    CONTEXT,
    OUT_PROJ,
    ATTN_OUT,
    MLPWI_0,
    MLPWI_1,
    MLPWI,
    MLPWO,
    ROUTER_LOGITS,
    MOE_MLPWI_0,
    MOE_MLPWI_1,
    MOE_MLPWO,
    BLOCK_OUT,
)

#: Names MaxText tags that no model here does: real tensor names, never a typo of one. A policy
#: that names them (``maxtext:remat_policy=minimal``) is not refused for a model without them.
MAXTEXT_ONLY: tuple[str, ...] = (KV_PROJ, QKV_PROJ, QUANTIZATION)
#: Every name remat_kit knows: a policy that names one is never taken for a typo.
KNOWN: tuple[str, ...] = VOCABULARY + MAXTEXT_ONLY

#: What each name means, for `remat-kit policies` and the docs.
DESCRIPTIONS: dict[str, str] = {
    DECODER_LAYER_INPUT: "input of a decoder layer (the residual stream entering it)",
    QUERY_PROJ: "query projection x @ Wq, per head",
    KEY_PROJ: "key projection x @ Wk, per KV head",
    VALUE_PROJ: "value projection x @ Wv, per KV head",
    ATTN_SCORES: "attention logits q.k^T / sqrt(d), b x heads x s x s (absent under flash)",
    ATTN_PROBS: "softmax of the scores (after dropout), b x heads x s x s (absent under flash)",
    CONTEXT: "attention output before the out projection, probs @ v",
    OUT_PROJ: "output projection of attention, context @ Wo",
    ATTN_OUT: "residual stream after the attention sub-block (x + out_proj)",
    MLPWI_0: "first MLP input projection (the gate in SwiGLU)",
    MLPWI_1: "second MLP input projection (the up projection in SwiGLU)",
    MLPWI: "the MLP input projection of a non-gated MLP (GPT-2)",
    MLPWO: "MLP output projection",
    ROUTER_LOGITS: "MoE router logits x @ W_router (tokens x experts, f32)",
    MOE_MLPWI_0: "experts' first input projection (gate), per routed token; also tagged mlpwi_0",
    MOE_MLPWI_1: "experts' second input projection (up), per routed token; also tagged mlpwi_1",
    MOE_MLPWO: "experts' output projection, per routed token; also tagged mlpwo",
    BLOCK_OUT: "output of the block (the residual stream leaving it)",
}

#: The names only a mixture-of-experts layer tags.
MOE_NAMES: tuple[str, ...] = (ROUTER_LOGITS, MOE_MLPWI_0, MOE_MLPWI_1, MOE_MLPWO)
#: Tensors whose size grows with seq^2: they do not exist under flash attention.
SCORE_NAMES: tuple[str, ...] = (ATTN_SCORES, ATTN_PROBS)
#: The projection outputs (the matmuls with weights, no batch dimension in the contraction).
PROJECTION_NAMES: tuple[str, ...] = (
    QUERY_PROJ,
    KEY_PROJ,
    VALUE_PROJ,
    OUT_PROJ,
    MLPWI_0,
    MLPWI_1,
    MLPWI,
    MLPWO,
)
