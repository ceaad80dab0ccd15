"""The layer stack: scanned or unrolled, run under the config's policy and schedule."""

from __future__ import annotations

import flax.linen as nn
import jax

import remat_kit as rk
from remat_kit_models.config import ModelConfig


class BlockStack(nn.Module):
    """Applies ``cfg.n_layers`` copies of ``block`` to the residual stream.

    ``block`` is a linen Module class taking ``(cfg, deterministic)`` and called as
    ``block(x, None) -> (x, None)``. Parameters are laid out the same whatever the
    policy and schedule - stacked under ``layers`` with a leading layer axis when
    ``scan_layers`` (compile time flat in depth), else ``layers_0 ... layers_{L-1}`` -
    so a checkpoint trained under one schedule loads under any other.
    """

    cfg: ModelConfig
    block: type[nn.Module]
    deterministic: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg, n = self.cfg, self.cfg.n_layers
        if self.is_initializing():
            return self._init_layers(x)
        # Parameters may arrive boxed with their logical axes (nn.Partitioned): slice values.
        variables = rk.strip_boxes(self.variables["params"])
        if cfg.scan_layers:
            params = variables["layers"]
        else:
            params = [variables[f"layers_{i}"] for i in range(n)]
        keys = None
        if not self.deterministic and cfg.dropout_rate > 0.0:
            keys = jax.random.split(self.make_rng("dropout"), n)
        # Unbound (parent=None): applied functionally, not registered as a child.
        module = self.block(cfg, self.deterministic, parent=None)

        def layer(p: dict, h: jax.Array, key: jax.Array | None) -> jax.Array:
            rngs = {} if key is None else {"dropout": key}
            return module.apply({"params": p}, h, None, rngs=rngs)[0]

        return rk.apply_layers(
            layer,
            params,
            x,
            n_layers=n,
            schedule=cfg.schedule,
            policy=cfg.policy,
            scan=cfg.scan_layers,
            keys=keys,
        )

    def _init_layers(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg
        if cfg.scan_layers:
            scanned = nn.scan(
                self.block,
                variable_axes={"params": 0},
                split_rngs={"params": True},
                in_axes=nn.broadcast,
                length=cfg.n_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            x, _ = scanned(cfg, True, name="layers")(x, None)
            return x
        for i in range(cfg.n_layers):
            x, _ = self.block(cfg, True, name=f"layers_{i}")(x, None)
        return x
