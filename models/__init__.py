"""Flax transformer models with the published shapes of well-known presets.

The registry maps a preset name to a :class:`ModelConfig`; :func:`build` turns a config
into a linen module. remat_kit never imports this package: only the CLI and the
experiments look presets up by name.

The names are imported on first use (PEP 562): the kinds of source this package registers
(:mod:`remat_kit_models.source`, :mod:`remat_kit_models.maxtext`) are read by ``remat-kit
--help`` for their flags, which starts no jax.

Example:
  >>> import remat_kit_models as models
  >>> cfg = models.get_config("llama3-8b", layers=64, policy="minimal")
  >>> (cfg.n_layers, cfg.d_model, cfg.policy.name)
  (64, 4096, 'minimal')
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from remat_kit._lazy import loader

if TYPE_CHECKING:  # what the names below are, for readers and type checkers
    from remat_kit_models.attention import SelfAttention
    from remat_kit_models.config import ATTENTION_KINDS, FAMILIES, ModelConfig, as_dtype
    from remat_kit_models.gpt2 import GPT2, GPT2Block
    from remat_kit_models.llama import Llama, LlamaBlock
    from remat_kit_models.moe import MoE
    from remat_kit_models.presets import OVERRIDES, build, get_config, preset_names

__all__ = [
    "ATTENTION_KINDS",
    "FAMILIES",
    "GPT2",
    "OVERRIDES",
    "GPT2Block",
    "Llama",
    "LlamaBlock",
    "MoE",
    "ModelConfig",
    "SelfAttention",
    "as_dtype",
    "build",
    "get_config",
    "preset_names",
]

#: Where each name lives: the module it is imported from on first use.
_HOME: dict[str, str] = {
    "SelfAttention": "attention",
    "ATTENTION_KINDS": "config",
    "FAMILIES": "config",
    "ModelConfig": "config",
    "as_dtype": "config",
    "GPT2": "gpt2",
    "GPT2Block": "gpt2",
    "Llama": "llama",
    "LlamaBlock": "llama",
    "MoE": "moe",
    "OVERRIDES": "presets",
    "build": "presets",
    "get_config": "presets",
    "preset_names": "presets",
}


__getattr__ = loader(__name__, _HOME, globals(), submodules=False)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
