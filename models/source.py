"""Our presets and Hugging Face configs as a plugin of model sources: their kinds, flags and notes.

:data:`PRESET` and :data:`HF_CONFIG` are the two kinds this package registers under the
``remat_kit.sources`` entry points (``pyproject.toml``); remat_kit finds them there. Each
brings its options (``--lora``, ``--attention``, ``--layers`` ...: the fields of
:class:`~remat_kit_models.spec.PresetSpec` they fill) and its note
(:data:`ATTENTION_CHOSE_XLA`). The source they resolve to,
:class:`~remat_kit_models.preset_source.PresetSource`, is imported when a spec is resolved:
this module starts no jax (``remat-kit --help`` reads it for its flags).

Example:
  >>> import remat_kit as rk
  >>> src = rk.sources.resolve(PresetSpec("tiny-llama"))
  >>> src.n_layers(), isinstance(src, rk.sources.StepSource)
  (4, True)
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import TYPE_CHECKING, Any

from remat_kit.notes import NoteKind
from remat_kit.sources import LAYERS, MODEL, SHARD, TRAIN_OPTIONS, Option, SourceKind
from remat_kit_models.spec import HFSpec, PresetSpec

if TYPE_CHECKING:  # what the names forwarded below are
    from remat_kit_models.preset_source import PresetSource, train_step

__all__ = [
    "ATTENTION_CHOSE_XLA",
    "HF_CONFIG",
    "OPTIONS",
    "PRESET",
    "HFSpec",
    "PresetSource",
    "PresetSpec",
    "train_step",
]

#: ``attention="auto"`` chose XLA's attention on a target that runs cuDNN's: ``problem`` is
#: the phrase that names cuDNN's rule and the value that breaks it.
ATTENTION_CHOSE_XLA = NoteKind(
    "attention_chose_xla",
    ("problem",),
    lambda d: f"attention=auto measured xla: cuDNN flash attention {d['problem']}",
)


def _size(flag: str, key: str, what: str, param: str) -> Option:
    # A size of the model's config the flag overrides (a pair of the spec's overrides).
    return Option(
        flag, "overrides", f"override: {what}", type="positive_int", key=key, params=(param,)
    )


#: What shapes our decoder and its training, in the order a refusal names them: the train
#: config's options around LoRA and dropout, then the model's switches and sizes.
OPTIONS: tuple[Option, ...] = (
    TRAIN_OPTIONS[0],  # --optimizer
    Option(
        "--lora",
        "lora",
        "LoRA rank (0: off)",
        type="non_negative_int",
        default=0,
        group="training",
        params=("lora", "lora_rank"),
    ),
    *TRAIN_OPTIONS[1:],  # --accum, --precision, --param-dtype, --dtype
    Option(
        "--dropout",
        "dropout",
        "dropout rate (default: the preset's, 0.1 for GPT-2/BERT); applied in the step",
        type="fraction",
        group="training",
        params=("dropout_rate",),
    ),
    Option(
        "--attention",
        "attention",
        "xla | cudnn | auto (cudnn on NVIDIA targets)",
        type="name",
        default="auto",
        params=("attention",),
    ),
    Option(
        "--no-scan",
        "scan_layers",
        "unroll the layers instead of scan",
        type="switch",
        default=False,
        const=False,
    ),
    SHARD,
    dataclasses.replace(LAYERS, field="overrides", key="layers"),
    _size("--width", "width", "model width d_model", "d_model"),
    _size("--heads", "heads", "attention heads", "n_heads"),
    _size("--kv-heads", "kv_heads", "key/value heads", "n_kv_heads"),
    _size("--ff", "ff", "MLP width", "d_ff"),
    _size("--vocab", "vocab", "vocabulary size", "vocab_size"),
    _size("--max-seq", "max_seq", "learned positions (GPT-2 family)", "max_seq_len"),
    _size("--experts", "experts", "routed experts per MoE layer", "n_experts"),
    _size("--top-k", "top_k", "experts each token is routed to", "experts_per_token"),
    _size("--moe-ff", "moe_ff", "each expert's MLP width", "moe_d_ff"),
    Option(
        "--moe-impl",
        "overrides",
        "how an MoE model runs its experts: ragged (grouped GEMMs, dropless; the default "
        "on one GPU) or capacity (einsum dispatch with a capacity factor; the default under "
        "--shard ep:N, whose all-to-all XLA partitions only this way)",
        type="name",
        choices=("ragged", "capacity"),
        key="moe_impl",
        params=("moe_impl",),
    ),
    Option(
        "--capacity-factor",
        "overrides",
        "expert slots per token share under --moe-impl capacity (default 1.25)",
        type="float",
        key="capacity_factor",
        params=("capacity_factor",),
    ),
)


def _resolve(request: PresetSpec | HFSpec) -> PresetSource:
    from remat_kit_models.preset_source import resolve

    return resolve(request)


def _catalogue() -> list[tuple[str, Any]]:
    from remat_kit_models.preset_source import catalogue

    return catalogue()


#: Presets by name (``--model llama3-8b``): any name without a colon (a factory's has one)
#: that no plugin's kind claims; an unknown one is named with its close matches.
PRESET = SourceKind(
    "preset",
    PresetSpec,
    _resolve,
    "model",
    claims=lambda name: ":" not in name,
    fallback=True,
    catalogue=_catalogue,
    options=(MODEL, *OPTIONS),
    notes=(ATTENTION_CHOSE_XLA,),
)

#: Hugging Face configs (``--hf-config config.json``) mapped onto our decoder.
HF_CONFIG = SourceKind(
    "hf",
    HFSpec,
    _resolve,
    "hf_config",
    options=(
        Option(
            "--hf-config",
            "hf_config",
            "a Hugging Face config.json (Llama, Mistral, Qwen2, Gemma) measured with our decoder",
            metavar="CONFIG_JSON",
            params=("hf_config",),
            what="a Hugging Face config.json",
        ),
        *OPTIONS,
    ),
    notes=(ATTENTION_CHOSE_XLA,),
)


def __getattr__(name: str) -> Any:
    # The source itself and its train step start jax: imported on first use.
    if name in ("PresetSource", "train_step"):
        return getattr(importlib.import_module("remat_kit_models.preset_source"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
