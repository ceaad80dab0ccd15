"""Runs one train step sharded over 8 fake CPU devices and compares it with one device.

Run by tests/test_sharding.py and tests/test_context_parallel.py in a subprocess, because the
device count is fixed when jax starts: ``XLA_FLAGS=--xla_force_host_platform_device_count=8
JAX_PLATFORMS=cpu python tests/sharded_step.py [sharding] [cp]``. For every case of a group it
checks, with chex, that the loss, the updated parameters and the optimizer state equal the
single-device step's, and that the parameters really are split as the plan says. The
gradients are checked through AdamW's first moment, which after one step is exactly
``(1 - b1) * grad`` (with accumulation, of the mean gradient): one compile of the step checks
them, none of a separate gradient function. The one-device reference is compiled once per
model (policy ``none``, no accumulation): policies and accumulation do not change the
mathematics, only the program; the groups named run in one process and share it. It prints
one JSON line per case (tagged with its group), ends a group on its first mismatch, closes
each group with a line saying whether it passed, and exits non-zero if any failed.

The ``cp`` group also runs :func:`remat_kit_models.attention.flash_attention`'s per-device
path (the one cuDNN attention takes under context parallelism) with XLA's implementation,
which runs on a CPU, against ``jax.nn.dot_product_attention`` on one device: outputs and
gradients.
"""

from __future__ import annotations

import functools
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import chex
import jax
import jax.numpy as jnp
from flax import traverse_util
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import remat_kit as rk
import remat_kit_models as models

#: (model, plan, policy, accum) per group: every strategy, both families, remat and
#: accumulation.
CASES = {
    "sharding": (
        ("tiny-llama", "fsdp:8", "minimal", 1),
        ("tiny-llama", "fsdp:4,tp:2", "full", 2),
        ("tiny-llama", "dp:4,tp:2", "none", 1),
        ("tiny-gpt2", "fsdp:4,tp:2", "full", 1),
    ),
    "cp": (
        ("tiny-llama", "cp:8", "full", 1),
        ("tiny-llama", "fsdp:2,cp:4", "minimal", 2),
        ("tiny-llama", "cp:4,tp:2", "none", 1),
        ("tiny-gpt2", "dp:2,cp:4", "full", 1),
    ),
}
#: Plans the per-device flash-attention path is checked under (causal and not).
FLASH_PLANS = ("cp:8", "fsdp:2,cp:4", "cp:4,tp:2")
#: Tolerances per group. Context parallelism splits the attention's reductions (softmax,
#: the keys' and values' gradients) across devices: f32 holds 1e-4 relative there.
TOLERANCES = {
    "sharding": dict(rtol=2e-5, atol=2e-6),
    "cp": dict(rtol=1e-4, atol=1e-5),
}
BATCH, SEQ = 16, 32
B1 = 0.9  # optax.adamw's default first-moment decay


def _config(accum: int) -> rk.TrainConfig:
    return rk.TrainConfig(batch=BATCH, seq=SEQ, optimizer="adamw", accum=accum, donate=False)


def _split(step, params):
    flat = traverse_util.flatten_dict(params)
    tr_keys = set(traverse_util.flatten_dict(step.args[0]))
    tr = traverse_util.unflatten_dict({k: v for k, v in flat.items() if k in tr_keys})
    fr = traverse_util.unflatten_dict({k: v for k, v in flat.items() if k not in tr_keys})
    return tr, fr


@functools.cache
def _reference(model: str):
    """The one-device step of ``model`` (policy none, no accumulation) and its inputs."""
    cfg = models.get_config(model, layers=2, policy="none")
    module = models.build(cfg)
    boxed = jax.jit(module.init)(jax.random.key(0), jnp.zeros((2, SEQ), jnp.int32))
    params = rk.sharding.strip_boxes(boxed)
    toks = jax.random.randint(jax.random.key(1), (BATCH, SEQ), 0, cfg.vocab_size)
    batch = {"tokens": toks, "targets": jnp.roll(toks, -1, axis=1)}
    ref_step = rk.build_train_step(module, _config(1))
    tr, fr = _split(ref_step, params)
    opt = rk.train.make_optimizer("adamw").init(tr)
    return (tr, fr, opt, batch), jax.jit(ref_step.fn)(tr, fr, opt, batch)


def _mu(opt_state):
    return opt_state[0].mu  # optax.adamw: (ScaleByAdamState, ...)


def _run(model: str, plan: str, policy: str, accum: int, tol: dict) -> dict:
    inputs, ref_out = _reference(model)
    config = _config(accum)
    module = models.build(models.get_config(model, layers=2, policy=policy))
    step = rk.build_train_step(module, config, sharding=plan)
    assert step.mesh is not None and step.mesh.size == 8, step.mesh
    placed = jax.device_put(inputs, step.in_shardings)
    out = jax.jit(step.fn, in_shardings=step.in_shardings, out_shardings=step.out_shardings)(
        *placed
    )

    loss, ref_loss = out[2], ref_out[2]
    grads = jax.tree.map(lambda m: m / (1 - B1), _mu(out[1]))
    ref_grads = jax.tree.map(lambda m: m / (1 - B1), _mu(ref_out[1]))
    chex.assert_trees_all_close(loss, ref_loss, **tol)
    chex.assert_trees_all_close(grads, ref_grads, **tol)
    # AdamW's first step moves each weight by lr * g / (|g| + eps): where a gradient is a few
    # eps (1e-8) a reduction-order difference of 1e-9 in it moves the weight by a few percent
    # of lr. So the updated weights get a floor of 5% of one step (5e-6 at lr 1e-4); a step
    # applied twice or not at all moves them by lr. The moments keep the tight tolerance.
    chex.assert_trees_all_close(out[0], ref_out[0], rtol=tol["rtol"], atol=0.05 * 1e-4)
    chex.assert_trees_all_close(out[1], ref_out[1], **tol)

    # The parameters are split as the plan says: one device holds 1/ways of each kernel
    # (its width over fsdp and cp, its MLP width over tp).
    kernel = out[0]["params"]["decoder"]["layers"]["mlp"]
    kernel = kernel["wi_0"]["kernel"] if "wi_0" in kernel else kernel["wi"]["kernel"]
    parsed = rk.parse_shard(plan)
    ways = parsed.size("fsdp") * parsed.size("cp") * parsed.size("tp")
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


def _loss(w, attend, q, k, v):
    return jnp.sum(attend(q, k, v) * w)


@functools.cache
def _flash_reference(causal: bool):
    """The inputs of the flash-attention checks and ``jax.nn.dot_product_attention``'s
    output and gradients on one device, computed once per mask for every plan."""
    b, s, n, kv, h = 4, 64, 4, 2, 16
    keys = jax.random.split(jax.random.key(2), 3)
    q = jax.random.normal(keys[0], (b, s, n, h), jnp.float32)
    k = jax.random.normal(keys[1], (b, s, kv, h), jnp.float32)
    v = jax.random.normal(keys[2], (b, s, kv, h), jnp.float32)
    w = jnp.cos(jnp.arange(b * s * n * h, dtype=jnp.float32)).reshape(b, s, n, h)
    ref = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal)
    ref_out = jax.jit(ref)(q, k, v)
    ref_grads = jax.jit(jax.grad(functools.partial(_loss, w, ref), argnums=(0, 1, 2)))(q, k, v)
    return (q, k, v, w), ref_out, ref_grads


def _flash(plan: str, causal: bool, tol: dict) -> dict:
    """flash_attention's per-device path under ``plan`` against one device."""
    from remat_kit_models.attention import flash_attention

    parsed = rk.parse_shard(plan)
    mesh = parsed.mesh(rk.target("local", devices=8))
    (q, k, v, w), ref_out, ref_grads = _flash_reference(causal)
    loss = functools.partial(_loss, w)

    def ours(q, k, v):
        with parsed.activation_context(mesh):
            return flash_attention(q, k, v, causal=causal, implementation="xla")

    rules = dict(parsed.rules())
    data = rules["act_batch"]
    q_sh = NamedSharding(mesh, P(data, rules["act_len"], rules["act_heads"], None))
    kv_sh = NamedSharding(mesh, P(data, None, rules["act_kv_heads"], None))
    args = jax.device_put((q, k, v), (q_sh, kv_sh, kv_sh))
    out = jax.jit(ours)(*args)
    grads = jax.jit(jax.grad(functools.partial(loss, ours), argnums=(0, 1, 2)))(*args)
    chex.assert_trees_all_close(out, ref_out, **tol)
    chex.assert_trees_all_close(grads, ref_grads, **tol)
    assert out.sharding.spec[1] == "cp", out.sharding  # the queries' sequence stays split
    return {
        "flash": plan,
        "causal": causal,
        "max_diff": float(jnp.max(jnp.abs(out - ref_out))),
        "max_grad_diff": max(
            float(jnp.max(jnp.abs(a - r))) for a, r in zip(grads, ref_grads, strict=True)
        ),
    }


def _group(group: str) -> None:
    """Every case of ``group``: one JSON line each, tagged with the group."""
    tol = TOLERANCES[group]
    for case in CASES[group]:
        print(json.dumps({"group": group, **_run(*case, tol)}), flush=True)
    if group == "cp":
        for plan in FLASH_PLANS:
            for causal in (True, False):
                print(json.dumps({"group": group, **_flash(plan, causal, tol)}), flush=True)


def main(argv: list[str] | None = None) -> None:
    """Runs each group named in ``argv`` (``sharding`` if none) in this one process: jax starts
    once and each model's one-device reference is compiled once for all of them. A group that
    fails (its first mismatch ends it) does not stop the next; each ends with a line saying
    whether it passed, and the exit code is non-zero if any failed."""
    import traceback

    argv = sys.argv[1:] if argv is None else argv
    groups = argv or ["sharding"]
    unknown = [g for g in groups if g not in CASES]
    if unknown:
        sys.exit(f"unknown group(s) {unknown}: takes {sorted(CASES)}")
    if jax.device_count() != 8:
        sys.exit(f"needs 8 devices, found {jax.device_count()}: set XLA_FLAGS")
    failed = []
    for group in groups:
        try:
            _group(group)
        except BaseException:
            failed.append(group)
            print(f"== group {group} failed:", file=sys.stderr)
            traceback.print_exc()
            sys.stderr.flush()
        print(json.dumps({"group": group, "passed": group not in failed}), flush=True)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
