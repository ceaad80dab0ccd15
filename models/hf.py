"""Hugging Face ``config.json`` -> a ModelConfig of our Llama decoder.

A user who trains a Llama-family model already has its ``config.json``: this reads it and maps
the fields onto :class:`models.ModelConfig`, so every command measures our decoder with the
published shapes (``remat-kit compare --hf-config config.json``). Every field of the file is
accounted for: mapped, checked against the one value we model, or known not to touch memory
(token ids, ``torch_dtype``, ``use_cache``). Anything else is an error that names the field,
so a config we cannot model is never measured as something else.

Architectures: ``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM`` (biases on
q/k/v), ``GemmaForCausalLM`` (GeGLU MLP, tied embeddings scaled by sqrt(d_model); its
RMSNorm's ``1 + w`` scale and the tanh GELU change values, not shapes), ``Qwen3ForCausalLM``
(RMSNorm on each query and key head) and two mixtures of experts (models.moe):
``MixtralForCausalLM`` (top-k softmax weights renormalised) and ``Qwen3MoeForCausalLM``
(q/k norms; every layer sparse: a config whose ``decoder_sparse_step`` or ``mlp_only_layers``
makes some layers dense is refused, naming the field). ``router_aux_loss_coef`` is the
load-balancing loss's weight in the gradients, whatever ``output_router_logits`` says (it
decides whether Hugging Face returns the logits, not what training on them costs).

Example:
  >>> import remat_kit_models.hf
  >>> cfg = remat_kit_models.hf.from_hf_config("tests/data/hf/llama3-8b.json")
  >>> cfg.n_layers, cfg.n_kv_heads, cfg.param_count()
  (32, 8, 8030261248)
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from remat_kit.errors import BadValue
from remat_kit_models.config import ModelConfig

__all__ = ["ARCHITECTURES", "from_hf_config", "read_hf_config"]

#: ``architectures[0]`` -> what differs from plain Llama in our decoder.
ARCHITECTURES: Mapping[str, Mapping[str, Any]] = {
    "LlamaForCausalLM": {},
    "MistralForCausalLM": {},
    "Qwen2ForCausalLM": {"qkv_bias": True},
    "GemmaForCausalLM": {"mlp_activation": "gelu", "embed_scale": True, "tie_embeddings": True},
    "Qwen3ForCausalLM": {"qk_norm": True},
    "MixtralForCausalLM": {"norm_topk_prob": True},
    "Qwen3MoeForCausalLM": {"qk_norm": True},
}

#: The mixture-of-experts fields each architecture has: HF field -> ModelConfig field (None:
#: checked below). Another architecture's config holding one of them is refused.
_MOE_FIELDS: Mapping[str, Mapping[str, str | None]] = {
    "MixtralForCausalLM": {
        "num_local_experts": "n_experts",
        "num_experts_per_tok": "experts_per_token",
        "router_aux_loss_coef": "router_aux_loss_coef",
        "router_jitter_noise": None,
        "output_router_logits": None,
    },
    "Qwen3MoeForCausalLM": {
        "num_experts": "n_experts",
        "num_experts_per_tok": "experts_per_token",
        "moe_intermediate_size": "moe_d_ff",
        "norm_topk_prob": "norm_topk_prob",
        "router_aux_loss_coef": "router_aux_loss_coef",
        "decoder_sparse_step": None,
        "mlp_only_layers": None,
        "output_router_logits": None,
    },
}

# HF field -> ModelConfig field, copied as is.
_MAPPED = {
    "vocab_size": "vocab_size",
    "hidden_size": "d_model",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "intermediate_size": "d_ff",
    "max_position_embeddings": "max_seq_len",
    "rope_theta": "rope_theta",
    "rms_norm_eps": "norm_eps",
}
# Fields that name tokens, the runtime or the file itself: no effect on a training step's memory.
_NO_EFFECT = frozenset(
    {
        "_name_or_path",
        "architectures",
        "model_type",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "torch_dtype",
        "dtype",
        "transformers_version",
        "use_cache",
        "initializer_range",
    }
)
# Fields read below, each checked against what our decoder can be.
_CHECKED = frozenset(
    {
        "tie_word_embeddings",
        "num_key_value_heads",
        "head_dim",
        "hidden_act",
        "hidden_activation",
        "attention_bias",
        "attention_dropout",
        "mlp_bias",
        "pretraining_tp",
        "rope_scaling",
        "sliding_window",
        "use_sliding_window",
        "max_window_layers",
        "layer_types",
    }
)
_REQUIRED = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff")
_ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu"}


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """The JSON object of a Hugging Face ``config.json``.

    Args:
      path: the file.

    Returns:
      Its fields.

    Raises:
      BadValue: the file is missing, not JSON, or not a JSON object.

    Example:
      >>> read_hf_config("tests/data/hf/mistral-7b.json")["model_type"]
      'mistral'
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise BadValue(f"hf config {str(p)!r}: no such file", param="hf_config") from None
    except (OSError, UnicodeDecodeError) as err:
        raise BadValue(f"hf config {str(p)!r}: cannot read it ({err})", param="hf_config") from None
    except json.JSONDecodeError as err:
        raise BadValue(f"hf config {str(p)!r} is not JSON: {err}", param="hf_config") from None
    if not isinstance(data, dict):
        raise BadValue(
            f"hf config {str(p)!r} holds a {type(data).__name__}, not a JSON object",
            param="hf_config",
        )
    return data


def from_hf_config(
    config: str | Path | Mapping[str, Any], *, name: str | None = None, **overrides: Any
) -> ModelConfig:
    """Maps a Hugging Face Llama-family config onto our Llama decoder.

    Args:
      config: a ``config.json`` path or its parsed fields.
      name: the config's name in reports (default: the file's stem or the model type).
      **overrides: ModelConfig fields set after the mapping (``policy``, ``schedule``,
        ``scan_layers``, ``attention``, ``dtype``, ``n_layers`` ...).

    Returns:
      The ModelConfig (family ``llama``), bf16 parameters and compute unless overridden.

    Raises:
      BadValue: an architecture we do not model, a field we cannot model (named, with its
        value), or a value of a known field that our decoder does not have.

    Example:
      >>> cfg = from_hf_config({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
      ...     "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
      ...     "num_key_value_heads": 2, "vocab_size": 256})
      >>> cfg.n_kv_heads, cfg.d_ff
      (2, 128)
    """
    if isinstance(config, Mapping):
        fields, label = dict(config), name or str(config.get("model_type", "hf"))
    else:
        fields, label = read_hf_config(config), name or Path(config).stem
    archs = fields.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch not in ARCHITECTURES:
        raise BadValue(
            f"hf config {label!r}: architecture {arch!r} is not modelled; supported: "
            f"{', '.join(ARCHITECTURES)} (for others write a factory: file.py:NAME)",
            param="hf_config",
        )
    moe = _MOE_FIELDS.get(arch, {})
    for key in fields:
        if key not in _MAPPED and key not in _NO_EFFECT and key not in _CHECKED and key not in moe:
            raise BadValue(
                f"hf config {label!r}: field {key!r} = {fields[key]!r} is not modelled by our "
                f"{arch} decoder; remove it if it does not change the model, or write a factory "
                "(file.py:NAME)",
                param="hf_config",
            )
    values: dict[str, Any] = {
        ours: fields[theirs] for theirs, ours in _MAPPED.items() if fields.get(theirs) is not None
    }
    values.update(ARCHITECTURES[arch])
    values.update(
        {
            ours: fields[theirs]
            for theirs, ours in moe.items()
            if ours and fields.get(theirs) is not None
        }
    )
    _experts(label, fields, values)
    heads = values.get("n_heads")
    values["n_kv_heads"] = fields.get("num_key_value_heads") or heads
    head_dim = fields.get("head_dim")
    if head_dim is not None and heads and head_dim != values.get("d_model", 0) // heads:
        values["head_dim"] = head_dim  # Gemma: 256, not width / heads
    if "tie_word_embeddings" in fields:
        values["tie_embeddings"] = bool(fields["tie_word_embeddings"])
    act = fields.get("hidden_act", fields.get("hidden_activation"))
    if act is not None:
        if act not in _ACTIVATIONS:
            _refuse(label, "hidden_act", act, f"one of {', '.join(_ACTIVATIONS)}")
        values["mlp_activation"] = _ACTIVATIONS[act]
    _expect(label, fields, "mlp_bias", (False, None))
    _expect(label, fields, "pretraining_tp", (1, None))
    bias = fields.get("attention_bias")
    if bias and not values.get("qkv_bias"):
        _refuse(label, "attention_bias", bias, "false (a bias on the output projection)")
    dropout = fields.get("attention_dropout") or 0.0
    if dropout:
        values["dropout_rate"] = float(dropout)
    _windows(label, fields, values)
    kinds = set(fields.get("layer_types") or ["full_attention"])
    if kinds != {"full_attention"}:
        _refuse(label, "layer_types", sorted(kinds), "full_attention only")
    if fields.get("rope_scaling"):
        warnings.warn(
            f"hf config {label!r}: rope_scaling {fields['rope_scaling']!r} changes rotary "
            "frequencies only; memory and FLOPs are measured without it",
            stacklevel=2,
        )
    required = [theirs for theirs, ours in _MAPPED.items() if ours in _REQUIRED]
    missing = [theirs for theirs in required if _MAPPED[theirs] not in values]
    if missing:
        raise BadValue(f"hf config {label!r} lacks {', '.join(missing)}")
    values.update(overrides)
    return ModelConfig(name=label, family="llama", **values)


def _experts(label: str, fields: Mapping[str, Any], values: dict[str, Any]) -> None:
    # Every layer is a mixture of experts, or the config is refused: our stack repeats one block.
    step = fields.get("decoder_sparse_step", 1)
    if step != 1:
        _refuse(label, "decoder_sparse_step", step, "1: every layer sparse")
    dense = fields.get("mlp_only_layers") or []
    if dense:
        _refuse(label, "mlp_only_layers", dense, "[]: every layer sparse")
    if fields.get("router_jitter_noise"):
        _refuse(label, "router_jitter_noise", fields["router_jitter_noise"], "0 or null")
    if "n_experts" in values and "experts_per_token" not in values:
        raise BadValue(f"hf config {label!r} lacks num_experts_per_tok")


def _windows(label: str, fields: Mapping[str, Any], values: dict[str, Any]) -> None:
    # A sliding window changes what attention reads, not the shapes: for sequences no longer
    # than the window the program is the same. Longer ones are refused where they are asked.
    window = fields.get("sliding_window")
    if window is None or fields.get("use_sliding_window") is False:
        return
    if not isinstance(window, int) or window <= 0:
        _refuse(label, "sliding_window", window, "a positive int or null")
    values["max_seq_len"] = min(int(values.get("max_seq_len", window)), window)


def _expect(label: str, fields: Mapping[str, Any], key: str, allowed: tuple[Any, ...]) -> None:
    if key in fields and fields[key] not in allowed:
        _refuse(label, key, fields[key], " or ".join(str(a).lower() for a in allowed if a))


def _refuse(label: str, key: str, value: Any, valid: str) -> None:
    raise BadValue(
        f"hf config {label!r}: {key}={value!r} is not modelled by our decoder (valid: {valid})"
    )
