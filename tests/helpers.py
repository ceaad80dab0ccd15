"""Small shared helpers for the tests (not fixtures)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import remat_kit_models as models


def tokens(batch: int = 2, seq: int = 16, vocab: int = 256, seed: int = 1) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (batch, seq), 0, vocab)


def loss_and_grads(cfg: models.ModelConfig, params, toks, *, dropout_key=None):
    """Next-token cross-entropy and its gradients for ``cfg`` (policy from the config)."""
    module = models.build(cfg, deterministic=dropout_key is None)
    rngs = {} if dropout_key is None else {"dropout": dropout_key}

    def loss(p):
        logits = module.apply(p, toks[:, :-1], rngs=rngs).astype(jnp.float32)
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, toks[:, 1:, None], axis=-1).mean()

    return jax.jit(jax.value_and_grad(loss))(params)


def memory_report(target: str | None = "h100", **fields):
    """A ``MemoryReport`` made by hand, no compile: ``target``'s memory figures (None: none),
    a 1 GiB peak that is all arguments, nothing else; any field may be given."""
    import remat_kit as rk

    t = rk.target(target) if target is not None else None
    peak = fields.get("peak_bytes", 2**30)
    values = dict(
        target=t.name if t is not None else "h100-80gb",
        target_memory_bytes=t.memory_bytes if t is not None else None,
        usable_bytes=t.usable_bytes if t is not None else None,
        mem_fraction=t.mem_fraction if t is not None else None,
        fits_with_fraction=None,
        devices=1,
        peak_bytes=peak,
        argument_bytes=peak,
        output_bytes=0,
        temp_bytes=0,
        alias_bytes=0,
        host_bytes=0,
        host_temp_bytes=0,
        generated_code_bytes=0,
        xla_peak_bytes=None,
        flops=0.0,
        flops_detail={},
        tags=(),
        xla_remat=False,
        xla_remat_saved_bytes=0,
        xla_remat_limit_bytes=None,
        policy="full",
        schedule="none",
        attention=None,
        compile_seconds=0.0,
    )
    values.update(fields)
    return rk.MemoryReport(**values)
