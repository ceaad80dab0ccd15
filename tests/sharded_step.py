"""Runs one train step sharded over 8 fake CPU devices and compares it with one device.

Run by tests/test_sharding.py in a subprocess, because the device count is fixed when jax
starts: ``XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu python
tests/sharded_step.py``. For every case it checks, with chex, that the loss, the gradients and
the updated parameters and optimizer state equal the single-device step's, and that the
parameters really are split as the plan says. It prints one JSON line per case and exits
non-zero on the first mismatch.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import chex
import jax
import jax.numpy as jnp
from flax import traverse_util

import remat_kit as rk
import remat_kit_models as models

#: (model, plan, policy, accum): every strategy, both families, remat and accumulation.
CASES = (
    ("tiny-llama", "fsdp:8", "minimal", 1),
    ("tiny-llama", "fsdp:4,tp:2", "full", 2),
    ("tiny-llama", "dp:4,tp:2", "none", 1),
    ("tiny-gpt2", "fsdp:4,tp:2", "full", 1),
)
BATCH, SEQ = 16, 32


def _params(module, seed: int = 0):
    boxed = module.init(jax.random.key(seed), jnp.zeros((2, SEQ), jnp.int32))
    return rk.sharding.strip_boxes(boxed)


def _split(step, params):
    flat = traverse_util.flatten_dict(params)
    tr_keys = set(traverse_util.flatten_dict(step.args[0]))
    tr = traverse_util.unflatten_dict({k: v for k, v in flat.items() if k in tr_keys})
    fr = traverse_util.unflatten_dict({k: v for k, v in flat.items() if k not in tr_keys})
    return tr, fr


def _run(model: str, plan: str, policy: str, accum: int) -> dict:
    cfg = models.get_config(model, layers=2, policy=policy)
    module = models.build(cfg)
    config = rk.TrainConfig(batch=BATCH, seq=SEQ, optimizer="adamw", accum=accum, donate=False)
    params = _params(module)
    toks = jax.random.randint(jax.random.key(1), (BATCH, SEQ), 0, cfg.vocab_size)
    batch = {"tokens": toks, "targets": jnp.roll(toks, -1, axis=1)}

    ref_step = rk.build_train_step(module, config)
    tr, fr = _split(ref_step, params)
    opt = rk.train.make_optimizer("adamw").init(tr)
    ref_out = jax.jit(ref_step.fn)(tr, fr, opt, batch)
    micro = {k: v[: config.micro_batch] for k, v in batch.items()}
    ref_loss, ref_grads = jax.jit(jax.value_and_grad(ref_step.loss_fn))(tr, fr, micro)

    step = rk.build_train_step(module, config, sharding=plan)
    assert step.mesh is not None and step.mesh.size == 8, step.mesh
    placed = jax.device_put((tr, fr, opt, batch), step.in_shardings)
    out = jax.jit(step.fn, in_shardings=step.in_shardings, out_shardings=step.out_shardings)(
        *placed
    )
    grad_fn = jax.jit(
        jax.value_and_grad(step.loss_fn),
        in_shardings=(*step.in_shardings[:2], step.in_shardings[3]),
    )
    micro_placed = jax.device_put(micro, step.in_shardings[3])
    loss, grads = grad_fn(placed[0], placed[1], micro_placed)

    tol = dict(rtol=2e-5, atol=2e-6)
    chex.assert_trees_all_close(loss, ref_loss, **tol)
    chex.assert_trees_all_close(grads, ref_grads, **tol)
    # AdamW's first step moves each weight by lr * g / (|g| + eps): where a gradient is a few
    # eps (1e-8) a reduction-order difference of 1e-9 in it moves the weight by a few percent
    # of lr. So the updated weights get a floor of 5% of one step (5e-6 at lr 1e-4); a step
    # applied twice or not at all moves them by lr. The moments keep the tight tolerance.
    chex.assert_trees_all_close(out[0], ref_out[0], rtol=2e-5, atol=0.05 * config.learning_rate)
    chex.assert_trees_all_close(out[1:], ref_out[1:], **tol)

    # The parameters are split as the plan says: one device holds 1/ways of each kernel.
    kernel = out[0]["params"]["decoder"]["layers"]["mlp"]
    kernel = kernel["wi_0"]["kernel"] if "wi_0" in kernel else kernel["wi"]["kernel"]
    parsed = rk.parse_shard(plan)
    ways = parsed.size("fsdp") * parsed.size("tp")
    shard = kernel.addressable_shards[0].data.shape
    assert shard[1] * shard[2] * ways == kernel.shape[1] * kernel.shape[2], (plan, shard)
    flat_grads = jax.tree.leaves(grads)
    return {
        "model": model,
        "plan": plan,
        "policy": policy,
        "accum": accum,
        "loss": float(loss),
        "ref_loss": float(ref_loss),
        "max_grad_diff": max(
            float(jnp.max(jnp.abs(a - b)))
            for a, b in zip(flat_grads, jax.tree.leaves(ref_grads), strict=True)
        ),
        "kernel_shard": list(shard),
        "kernel_shape": list(kernel.shape),
    }


def main() -> None:
    if jax.device_count() != 8:
        sys.exit(f"needs 8 devices, found {jax.device_count()}: set XLA_FLAGS")
    for case in CASES:
        print(json.dumps(_run(*case)), flush=True)


if __name__ == "__main__":
    main()
