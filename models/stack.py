"""The layer stack: scanned or unrolled, each block wrapped with the config's policy."""

from __future__ import annotations

import flax.linen as nn
import jax

import remat_kit as rk
from models.config import ModelConfig


class BlockStack(nn.Module):
    """Applies ``cfg.n_layers`` copies of ``block`` to the residual stream.

    ``block`` is a linen Module class taking ``(cfg, deterministic)`` and called as
    ``block(x, None) -> (x, None)`` so that the same class serves ``nn.scan``.
    With ``scan_layers`` the parameters gain a leading layer axis and compile time
    stays flat in depth.
    """

    cfg: ModelConfig
    block: type[nn.Module]
    deterministic: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg
        # Inside nn.scan the loop boundary already stops XLA from CSE-ing the
        # recomputation into the forward pass; outside it we need the barrier.
        block = rk.remat(self.block, cfg.policy, prevent_cse=not cfg.scan_layers)
        if cfg.scan_layers:
            scanned = nn.scan(
                block,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=nn.broadcast,
                length=cfg.n_layers,
            )
            x, _ = scanned(cfg, self.deterministic, name="layers")(x, None)
            return x
        for i in range(cfg.n_layers):
            x, _ = block(cfg, self.deterministic, name=f"layers_{i}")(x, None)
        return x
