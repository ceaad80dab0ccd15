"""What a step-time model must know about the local GPU, and the steps it must predict.

Runs on a machine with an NVIDIA GPU (``--cpu-smoke`` runs it at toy sizes on the CPU, to check
the script). Four parts, each timed with the device synchronised, warm-ups first, random data
(never zeros) and the median of repeats:

1. **Matrix products**: bf16 GEMMs over a grid of (M, N, K) and batched products shaped like
   attention (batch x heads, seq, seq, head_dim); eight independent products in one program so
   the launch cost is amortised: the achieved TFLOP/s per shape.
2. **Memory bandwidth**: an elementwise pass and a copy over a 2 GiB array (bytes read + written
   per second).
3. **Per-kernel cost**: a chain of small dependent products; the time per link is launch plus
   the smallest kernel.
4. **Train steps**: for each case (model, batch, seq, precision, optimizer, policy), the real
   step on this GPU: the median step time over ``--steps`` steps, a profile of three steps (every
   GPU kernel's time, summed by the HLO instruction it runs: jax.profiler), and the optimized HLO
   of the real compile, so a time model can be checked per instruction and per step.

Writes ``gpu_calibration.json`` (and ``gpu_calibration_hlo.tar.gz``) under ``--out``, rewritten
after every case so a run stopped at a time limit keeps what it measured.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HAS_GPU = bool(glob.glob("/dev/nvidia[0-9]*"))
if HAS_GPU:
    os.environ.setdefault("JAX_PLATFORMS", "cuda,cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from common import RESULTS  # noqa: E402

#: (label, model, batch, seq, precision, optimizer, policies); ``--cases`` picks labels.
CASES = (
    (
        "gpt2-medium",
        "gpt2-medium",
        8,
        1024,
        "mixed",
        "adamw",
        ("none", "full", "minimal", "dots_no_batch", "offload_dots_no_batch"),
    ),
    (
        "llama3.2-1b",
        "llama3.2-1b",
        4,
        2048,
        "mixed",
        "adamw",
        ("none", "full", "minimal", "dots_no_batch", "minimal_offloaded"),
    ),
    (
        "llama3-8b",
        "llama3-8b",
        4,
        2048,
        "bf16",
        "sgd",
        ("full", "minimal", "dots_no_batch", "offload_dots_no_batch", "none"),
    ),
)
SMOKE_CASES = (("tiny", "gpt2-small", 2, 128, "mixed", "adamw", ("none", "full")),)

GEMM_M = (512, 2048, 8192, 16384)
GEMM_NK = (1024, 2048, 4096, 8192, 14336)
#: (batch x heads, seq, head_dim): the two products of attention, QK^T and PV.
BMM = ((64, 1024, 64), (128, 2048, 64), (128, 2048, 128), (256, 4096, 128))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--cases", default="", help="comma-separated case labels (default: all)")
    p.add_argument("--parts", default="gemm,bandwidth,chain,steps")
    p.add_argument("--steps", type=int, default=10, help="timed steps per case (first: warm-up)")
    p.add_argument("--cpu-smoke", action="store_true", help="toy sizes on the CPU")
    args = p.parse_args(argv)
    if not HAS_GPU and not args.cpu_smoke:
        print(
            "gpu_calibrate: no NVIDIA GPU here; --cpu-smoke runs it at toy sizes", file=sys.stderr
        )
        return 1
    smoke = args.cpu_smoke
    parts = set(args.parts.split(","))
    out: dict[str, Any] = {"device": _device_info(), "parts": {}}
    path = Path(args.out) / "gpu_calibration.json"
    hlos: dict[str, str] = {}

    def save() -> None:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1))
        _write_hlos(Path(args.out) / "gpu_calibration_hlo.tar.gz", hlos)

    if "gemm" in parts:
        out["parts"]["gemm"] = _gemms(smoke)
        save()
        print(f"gemm: {len(out['parts']['gemm'])} shapes", flush=True)
    if "bandwidth" in parts:
        out["parts"]["bandwidth"] = _bandwidth(smoke)
        save()
        print("bandwidth:", out["parts"]["bandwidth"], flush=True)
    if "chain" in parts:
        out["parts"]["chain"] = _chain(smoke)
        save()
        print("chain:", out["parts"]["chain"], flush=True)
    if "steps" in parts:
        wanted = set(filter(None, args.cases.split(",")))
        rows = out["parts"].setdefault("steps", [])
        for label, model, batch, seq, precision, optimizer, policies in (
            SMOKE_CASES if smoke else CASES
        ):
            if wanted and label not in wanted:
                continue
            for policy in policies:
                row, hlo = _step_case(model, batch, seq, precision, optimizer, policy, args.steps)
                rows.append(row)
                if hlo:
                    hlos[f"{label}_{policy}.hlo"] = hlo
                save()
                print(json.dumps({k: v for k, v in row.items() if k != "ops"}), flush=True)
    save()
    return 0


def _device_info() -> dict[str, Any]:
    d = jax.devices()[0]
    return {
        "platform": d.platform,
        "device_kind": d.device_kind,
        "jax": jax.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }


def _time(fn: Any, *args: Any, repeats: int = 20, warmup: int = 3) -> float:
    """Median seconds of ``fn(*args)`` with the device synchronised around each call."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _gemms(smoke: bool) -> list[dict[str, Any]]:
    rows = []
    ms, nks = ((64, 128), (64, 128)) if smoke else (GEMM_M, GEMM_NK)
    copies = 8
    key = jax.random.key(1)
    for m in ms:
        for n in nks:
            for k in nks:
                ka, kb = jax.random.split(jax.random.fold_in(key, m * 7 + n * 13 + k))
                a = jax.random.normal(ka, (copies, m, k), jnp.bfloat16)
                b = jax.random.normal(kb, (copies, k, n), jnp.bfloat16)
                # eight independent products, one kernel each (unrolled, not a batched dot)
                f = jax.jit(lambda a, b: [a[i] @ b[i] for i in range(copies)])
                s = _time(f, a, b) / copies
                rows.append(
                    {"m": m, "n": n, "k": k, "seconds": s, "tflops": 2 * m * n * k / s / 1e12}
                )
    bmm = ((2, 64, 32),) if smoke else BMM
    for bh, seq, d in bmm:
        ka, kb = jax.random.split(jax.random.fold_in(key, bh * seq + d))
        q = jax.random.normal(ka, (bh, seq, d), jnp.bfloat16)
        kk = jax.random.normal(kb, (bh, seq, d), jnp.bfloat16)
        f = jax.jit(lambda q, k: jnp.einsum("bqd,bkd->bqk", q, k))
        s = _time(f, q, kk)
        rows.append(
            {
                "batch": bh,
                "m": seq,
                "n": seq,
                "k": d,
                "seconds": s,
                "tflops": 2 * bh * seq * seq * d / s / 1e12,
            }
        )
    return rows


def _bandwidth(smoke: bool) -> dict[str, float]:
    n = (1 << 20) if smoke else (1 << 30)  # bf16 elements: 2 GiB on the GPU
    x = jax.random.normal(jax.random.key(2), (n,), jnp.bfloat16)
    scale = jax.jit(lambda x: x * 1.5 + 1.0)
    copy = jax.jit(lambda x: jnp.flip(x))
    nbytes = 2 * n * 2  # read + write
    return {
        "elementwise_bytes_per_s": nbytes / _time(scale, x),
        "reverse_copy_bytes_per_s": nbytes / _time(copy, x),
        "array_bytes": n * 2,
    }


def _chain(smoke: bool) -> dict[str, float]:
    links = 64
    w = jax.random.normal(jax.random.key(3), (links, 256, 256), jnp.bfloat16) * 0.05
    x = jax.random.normal(jax.random.key(4), (256, 256), jnp.bfloat16)

    @jax.jit
    def chain(x, w):
        for i in range(links):  # unrolled: one product and one fused tanh per link
            x = jnp.tanh(x @ w[i])
        return x

    s = _time(chain, x, w)
    return {"links": links, "seconds_per_link": s / links, "kernels_per_link": 2}


def _step_case(
    model: str, batch: int, seq: int, precision: str, optimizer: str, policy: str, steps: int
) -> tuple[dict[str, Any], str]:
    import remat_kit as rk
    from remat_kit.policies import parse_policy
    from remat_kit.schedules import parse_schedule
    from remat_kit.targets import target
    from remat_kit.validate import _next_args, _random_like
    from remat_kit_models.spec import PresetSpec

    row: dict[str, Any] = {
        "model": model,
        "batch": batch,
        "seq": seq,
        "precision": precision,
        "optimizer": optimizer,
        "policy": policy,
    }
    compare = target("h100") if HAS_GPU else target("cpu")
    try:
        config = rk.TrainConfig(
            batch, seq, optimizer=optimizer, precision=rk.train.regime(precision)
        )
        built = rk.sources.resolve(PresetSpec(model)).build_step(
            parse_policy(policy),
            parse_schedule("none"),
            config,
            compare,
            sharded=False,
        )
        step = built.step
        row["attention"] = built.attention
        device = jax.devices()[0]
        sharding = jax.sharding.SingleDeviceSharding(device)
        placed = jax.tree.map(
            lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), step.args
        )
        t0 = time.perf_counter()
        compiled = jax.jit(step.fn, donate_argnums=step.donate_argnums).lower(*placed).compile()
        row["compile_seconds"] = time.perf_counter() - t0
        hlo = compiled.as_text() or ""
        args = jax.block_until_ready(
            jax.jit(
                lambda: _random_like(step.args),
                out_shardings=jax.tree.map(lambda _: sharding, step.args),
            )()
        )
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            tr, opt, loss = jax.block_until_ready(compiled(*args))
            times.append(time.perf_counter() - start)
            args = _next_args(args, tr, opt)
        row["step_seconds"] = statistics.median(times[1:])
        row["step_seconds_all"] = times
        row["tokens_per_s"] = batch * seq / row["step_seconds"]
        row.update(_profile(compiled, args, 3))
        del args, tr, opt, loss, compiled
    except Exception as err:  # an OOM or a compile failure is a result, not the end of the run
        row["failed"] = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:300]}"
        hlo = ""
    return row, hlo


def _profile(compiled: Any, args: tuple[Any, ...], steps: int) -> dict[str, Any]:
    """Every device kernel's time over ``steps`` steps, summed by HLO instruction, per step."""
    from remat_kit.validate import _next_args

    with tempfile.TemporaryDirectory(prefix="rk_profile_") as tmp:
        with jax.profiler.trace(tmp):
            for _ in range(steps):
                tr, opt, _loss = jax.block_until_ready(compiled(*args))
                args = _next_args(args, tr, opt)
        files = glob.glob(f"{tmp}/**/*.xplane.pb", recursive=True)
        if not files:
            return {"profile": "no xplane file"}
        data = jax.profiler.ProfileData.from_file(files[0])
    ops: dict[str, list[float]] = {}
    busy_ns = 0.0
    planes = [p for p in data.planes if p.name.startswith("/device:GPU")] or [
        p for p in data.planes if p.name == "/host:CPU"
    ]
    for plane in planes:
        for line in plane.lines:
            for ev in line.events:
                stats = dict(ev.stats)
                op = stats.get("hlo_op")
                if op is None:
                    continue
                entry = ops.setdefault(str(op), [0, 0.0, ev.name])
                entry[0] += 1
                entry[1] += ev.duration_ns
                busy_ns += ev.duration_ns
    return {
        "profile_steps": steps,
        "kernel_seconds_per_step": busy_ns / 1e9 / steps,
        "ops": {k: [c / steps, ns / 1e9 / steps, name] for k, (c, ns, name) in ops.items()},
    }


def _write_hlos(path: Path, hlos: dict[str, str]) -> None:
    if not hlos:
        return
    with tarfile.open(path, "w:gz") as tar:
        for name, text in hlos.items():
            blob = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))


if __name__ == "__main__":
    sys.exit(main())
