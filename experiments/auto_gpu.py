"""Does ``rk.auto`` keep a real GPU's step under its budget, and how fast is it? (issue 60).

Runs a Llama-like step (8 layers, width 2048, batch 8 x 2048 tokens, bf16, SGD) on the local
GPU a few hundred steps at a time: wrapped by ``rk.auto`` at three budgets (activations=0.3,
activations=0.6, "fits"), and for comparison with each catalogue policy (none, full,
dots_no_batch, minimal) and with ``none`` left to XLA's own rematerialization pass at the
allocator's limit. Each case runs in a fresh process (jaxlib's allocator peak cannot be
reset) and reports the allocator's ``peak_bytes_in_use``, its ``bytes_limit`` and the median
step time. Writes results/auto_gpu.json.

On a machine with no NVIDIA GPU it says so and exits 1, writing nothing.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence

HAS_GPU = bool(glob.glob("/dev/nvidia[0-9]*"))
if HAS_GPU:
    # common.py starts jax on its CPU platform for deviceless compiles; here the GPU must show.
    os.environ.setdefault("JAX_PLATFORMS", "cuda,cpu")

from common import parse, table, write_json  # noqa: E402

BUDGETS = ({"activations": 0.3}, {"activations": 0.6}, {"budget": "fits"})
POLICIES = ("none", "full", "dots_no_batch", "minimal")
#: Steps per case: the first is the compile; the step time is the median of the rest.
STEPS = 200
LAYERS, WIDTH, HEADS, FF, VOCAB, BATCH, SEQ = 8, 2048, 16, 5632, 32000, 8, 2048


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(_child(json.loads(sys.argv[2]))))
        return 0
    args = parse(__doc__, argv)
    if not HAS_GPU:
        print(
            "auto_gpu: no NVIDIA GPU on this machine (no /dev/nvidia*); it measures on a real "
            "GPU, so nothing was run and nothing written",
            file=sys.stderr,
        )
        return 1
    cases = [{"auto": b} for b in BUDGETS] + [{"policy": p} for p in POLICIES]
    steps = 20 if args.quick else STEPS
    rows = []
    for case in cases:
        case = {**case, "steps": steps}
        done = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(case)], capture_output=True, text=True
        )
        lines = done.stdout.strip().splitlines()
        row = json.loads(lines[-1]) if done.returncode == 0 and lines else {"error": done.stderr}
        rows.append({**case, **row})
        print(json.dumps(rows[-1]), flush=True)
    write_json(args.out / "auto_gpu.json", {"rows": rows})
    print(table(rows, ("auto", "policy", "peak_gib", "limit_gib", "step_ms"), "auto on a GPU"))
    return 0


def _child(case: dict) -> dict:
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax
    from jax.ad_checkpoint import checkpoint_name

    import remat_kit as rk

    dt = jnp.bfloat16

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            dense = lambda n, name: nn.Dense(n, False, dtype=dt, param_dtype=dt, name=name)
            h = nn.RMSNorm(dtype=dt, param_dtype=dt)(x)
            b, s, _ = h.shape
            split = lambda t: t.reshape(b, s, HEADS, WIDTH // HEADS)
            q = split(checkpoint_name(dense(WIDTH, "q")(h), "query_proj"))
            k = split(checkpoint_name(dense(WIDTH, "k")(h), "key_proj"))
            v = split(checkpoint_name(dense(WIDTH, "v")(h), "value_proj"))
            ctx = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, s, WIDTH)
            x = x + checkpoint_name(dense(WIDTH, "o")(checkpoint_name(ctx, "context")), "out_proj")
            h = nn.RMSNorm(dtype=dt, param_dtype=dt)(x)
            gate = checkpoint_name(dense(FF, "gate")(h), "mlpwi_0")
            up = checkpoint_name(dense(FF, "up")(h), "mlpwi_1")
            return x + checkpoint_name(dense(WIDTH, "down")(nn.silu(gate) * up), "mlpwo")

    block = rk.remat(Block, case.get("policy", "auto"))

    class Llama(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            x = nn.Embed(VOCAB, WIDTH, dtype=dt, param_dtype=dt)(tokens)
            for i in range(LAYERS):
                x = block(name=f"layers_{i}")(x)
            return nn.Dense(VOCAB, use_bias=False, dtype=dt, param_dtype=dt)(x)

    net, tx = Llama(), optax.sgd(1e-3)
    tokens = jax.random.randint(jax.random.key(0), (BATCH, SEQ), 0, VOCAB)
    params = net.init(jax.random.key(0), tokens)["params"]
    opt_state, batch = tx.init(params), {"tokens": tokens, "targets": tokens}

    def loss_fn(p, b):
        logits = net.apply({"params": p}, b["tokens"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, b["targets"]).mean()

    def train_step(p, o, b):
        loss, grads = jax.value_and_grad(loss_fn)(p, b)
        updates, o = tx.update(grads, o, p)
        return optax.apply_updates(p, updates), o, loss

    if "auto" in case:
        step = rk.auto(
            train_step,
            donate_argnums=(0, 1),
            roles={"params": 0, "optimizer": 1, "batch": 2},
            loss_fn=loss_fn,
            loss_argnums=(0, 2),
            **case["auto"],
        )
    else:
        step = jax.jit(train_step, donate_argnums=(0, 1))
    times = []
    for _ in range(case["steps"]):
        t = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, batch)
        loss.block_until_ready()
        times.append(time.perf_counter() - t)
    stats = jax.devices()[0].memory_stats() or {}
    rest = sorted(times[1:])
    out = {
        "peak_gib": stats.get("peak_bytes_in_use", 0) / 2**30,
        "limit_gib": stats.get("bytes_limit", 0) / 2**30,
        "step_ms": 1e3 * rest[len(rest) // 2],
        "first_call_s": times[0],
        "device": jax.devices()[0].device_kind,
    }
    if "auto" in case:
        out["plan"] = step.plan.to_dict()
    return out


if __name__ == "__main__":
    sys.exit(main())
