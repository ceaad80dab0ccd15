"""LoRA adapters (Hu et al. 2021): a rank-r update added beside a frozen projection."""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import jax

from remat_kit_models.axes import partitioned
from remat_kit_models.config import ModelConfig


class LoRA(nn.Module):
    """delta(x) = (x A) B * alpha / r, with B initialised to zero (the update starts at 0).

    Parameters are named ``lora_a``/``lora_b``: remat_kit.train trains every parameter
    whose path contains ``lora`` and freezes the rest.
    """

    cfg: ModelConfig
    features: Sequence[int]
    in_axes: int = 1

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg, r = self.cfg, self.cfg.lora_rank
        d_in = math.prod(x.shape[-self.in_axes :])
        d_out = math.prod(self.features)
        a_init = partitioned(
            nn.initializers.normal(1.0 / math.sqrt(d_in)), ("lora_in", "lora_rank")
        )
        b_init = partitioned(nn.initializers.zeros, ("lora_rank", "lora_out"))
        a = self.param("lora_a", a_init, (d_in, r), cfg.param_dtype)
        b = self.param("lora_b", b_init, (r, d_out), cfg.param_dtype)
        flat = x.reshape(*x.shape[: x.ndim - self.in_axes], d_in).astype(cfg.dtype)
        out = (flat @ a.astype(cfg.dtype)) @ b.astype(cfg.dtype) * (cfg.lora_alpha / r)
        return out.reshape(*x.shape[: x.ndim - self.in_axes], *self.features)


def project(
    cfg: ModelConfig,
    layer: nn.Module,
    x: jax.Array,
    features: Sequence[int],
    name: str,
    in_axes: int = 1,
) -> jax.Array:
    """``layer(x)`` plus a LoRA update when ``cfg.lora_rank`` > 0."""
    y = layer(x)
    if cfg.lora_rank:
        y = y + LoRA(cfg, tuple(features), in_axes, name=f"{name}_lora")(x).astype(y.dtype)
    return y


__all__ = ["LoRA", "project"]
