"""Requests for our decoder: a preset by name, or a Hugging Face ``config.json`` mapped onto it.

Both take the same options that shape the model (overrides of its sizes, LoRA adapters, the
attention kernel, the layer loop, dropout, a mesh plan); the train config (batch, sequence,
optimizer, precision) is ``rk.TrainConfig``'s. ``rk.sources.resolve`` makes either a source
through the kinds this package registers (``remat_kit_models.source``).

Example:
  >>> PresetSpec("llama3-8b", overrides={"layers": 4}, lora=16).overrides
  (('layers', 4),)
  >>> HFSpec("tests/data/hf/mistral_config.json").name
  'mistral_config'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "HFSpec",
    "PresetSpec",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Decoder:
    """The options every request for our decoder takes.

    Attributes:
      overrides: the model's sizes to change, ``{"layers": 4, "width": 512}`` (the CLI's
        flag names, or the config's field names; ``remat_kit_models.OVERRIDES``), held as
        pairs in the order given.
      lora: LoRA rank (0: full fine-tuning); with adapters the train config trains them only
        (``rk.TrainConfig(lora=True)``).
      attention: ``"auto"`` (cuDNN's flash attention where it compiles for the target and
        serves the model, else XLA's), ``"cudnn"`` or ``"xla"``.
      scan_layers: scan the layers (one body compiled), else unroll them.
      dropout: the dropout rate over the preset's (None: the preset's); above 0 the step
        trains with dropout on.
      shard: a mesh plan over the target's devices (``"fsdp:8"``, ``"fsdp:4,tp:2"``;
        ``rk.parse_shard``), or None: one device.
    """

    overrides: tuple[tuple[str, Any], ...] = ()
    lora: int = 0
    attention: str = "auto"
    scan_layers: bool = True
    dropout: float | None = None
    shard: str | None = None

    def __post_init__(self) -> None:
        pairs = self.overrides.items() if isinstance(self.overrides, Mapping) else self.overrides
        # Checked where the config is made (``ModelConfig`` names a bad size or kernel).
        object.__setattr__(self, "overrides", tuple((str(k), v) for k, v in pairs))

    def with_layers(self, layers: int) -> Any:
        """This request with ``layers`` layers (over any depth override it had)."""
        kept = tuple((k, v) for k, v in self.overrides if k not in ("layers", "n_layers"))
        return dataclasses.replace(self, overrides=(*kept, ("layers", layers)))


@dataclasses.dataclass(frozen=True)
class PresetSpec(_Decoder):
    """A preset by name (``remat-kit models`` lists them).

    Attributes:
      model: the preset's name, e.g. ``"llama3-8b"``.
    """

    model: str

    @property
    def name(self) -> str:
        """The preset's name."""
        return self.model


@dataclasses.dataclass(frozen=True)
class HFSpec(_Decoder):
    """A Hugging Face ``config.json`` (Llama, Mistral, Qwen2, Gemma) mapped onto our decoder.

    Attributes:
      hf_config: the file's path.
      label: the model's name in titles (default: the file's stem).
    """

    hf_config: str
    label: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "hf_config", str(self.hf_config))
        super().__post_init__()

    @property
    def name(self) -> str:
        """The label, else the file's stem."""
        return self.label or Path(self.hf_config).stem
