"""What does one GPU hold when a model is sharded over 8 or 16, under dp, fsdp and tp?

Issue 8. Every figure is the compiled peak of the sharded train step for ONE device of a
deviceless cluster (XLA's memory analysis of the SPMD-partitioned program), not a formula:

- llama3-70b full fine-tuning (bf16 weights, AdamW, seq 2048) with fsdp on 8 x h100 and on
  16 x h100 (2 hosts x 8): per-GPU peak at one sequence per GPU for none/full/minimal, and the
  largest batch per GPU (``rk.max_batch``: doubling, then bisection over compiled reports);
- llama3-8b on 8 x a100-40gb: dp vs fsdp vs fsdp+tp per-device peak at the same global batch;
- compile time of an 8-device report against a 1-device one on this machine.

Writes results/multi_gpu.json and results/multi_gpu.png.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from common import GIB, parse, progress, save_png, table, write_json

POLICIES = ("none", "full", "minimal")
#: (devices, hosts) of the llama3-70b fsdp clusters.
CLUSTERS = ((8, 1), (16, 2))
MESHES_8B = ("dp:8", "fsdp:8", "fsdp:4,tp:2")


def _request(model: str, batch: int, shard: str | None, seq: int = 2048, **kw: Any):
    """The model request (a preset over ``shard``) and its train config (AdamW)."""
    import remat_kit as rk
    from remat_kit_models.spec import PresetSpec

    return PresetSpec(model, shard=shard, **kw), rk.TrainConfig(batch, seq, optimizer="adamw")


def _row(r, **labels: Any) -> dict[str, Any]:
    return {
        **labels,
        "batch": r.meta["batch"],
        "batch_per_device": r.meta.get("batch_per_device", r.meta["batch"]),
        "peak_gib": r.peak_bytes / GIB,
        "argument_gib": r.argument_bytes / GIB,
        "temp_gib": r.temp_bytes / GIB,
        "weights_gib": r.breakdown["weights"] / GIB,
        "optimizer_gib": r.breakdown["optimizer"] / GIB,
        "activations_gib": r.breakdown["activations"] / GIB,
        "device_gib": (r.target_memory_bytes or 0) / GIB,
        "fits": r.fits,
        "xla_remat": r.xla_remat,
        "attention": r.attention,
        "compile_seconds": r.compile_seconds,
    }


def llama70b(quick: bool) -> list[dict[str, Any]]:
    import remat_kit as rk

    rows = []
    clusters = CLUSTERS[:1] if quick else CLUSTERS
    for devices, hosts in clusters:
        t = rk.target("h100", devices=devices, hosts=hosts)
        shard = f"fsdp:{devices}"
        spec, config = _request("llama3-70b", devices, shard)  # one sequence per GPU
        source = rk.sources.resolve(spec)
        w = rk.sources.workload(source, t, config)
        for policy in progress(POLICIES, f"70b {devices}x h100"):
            r = rk.sources.measure(source, policy, t, config, warn=False)
            fit = rk.max_batch(w, policy, cap=devices * (4 if quick else 64))
            rows.append(
                {
                    **_row(r, model="llama3-70b", mesh=shard, devices=devices, hosts=hosts),
                    "policy": policy,
                    "max_batch_global": fit.batch,
                    "max_batch_per_gpu": fit.batch // devices,
                    "max_batch_peak_gib": fit.peak_bytes / GIB,
                    "search_compiles": fit.compiles,
                    "search_seconds": fit.seconds,
                }
            )
    return rows


def llama8b(quick: bool) -> list[dict[str, Any]]:
    import remat_kit as rk

    t = rk.target("a100-40gb", devices=8)
    rows = []
    policies = ("full",) if quick else ("full", "minimal")
    for shard in progress(MESHES_8B, "8b 8x a100-40gb"):
        for policy in policies:
            spec, config = _request("llama3-8b", 8, shard)
            r = rk.sources.measure(rk.sources.resolve(spec), policy, t, config, warn=False)
            rows.append(
                {**_row(r, model="llama3-8b", mesh=shard, devices=8, hosts=1), "policy": policy}
            )
    return rows


def compile_times() -> list[dict[str, Any]]:
    import remat_kit as rk

    rows = []
    for devices, shard, batch in ((1, None, 1), (8, "fsdp:8", 8)):
        t = rk.target("h100", devices=devices)
        spec, config = _request("llama3-8b", batch, shard)
        start = time.perf_counter()
        r = rk.sources.measure(rk.sources.resolve(spec), "full", t, config, warn=False)
        rows.append(
            {
                "model": "llama3-8b",
                "devices": devices,
                "mesh": shard or "-",
                "batch_per_device": 1,
                "report_seconds": time.perf_counter() - start,
                "compile_seconds": r.compile_seconds,
                "peak_gib": r.peak_bytes / GIB,
            }
        )
    return rows


def plot(rows70: list[dict], rows8: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    clusters = sorted({(r["devices"], r["hosts"]) for r in rows70})
    width = 0.8 / max(1, len(clusters))
    for i, (devices, hosts) in enumerate(clusters):
        pts = [r for r in rows70 if r["devices"] == devices]
        xs = [j + i * width for j in range(len(pts))]
        bars = a.bar(xs, [r["peak_gib"] for r in pts], width, label=f"{devices} GPUs ({hosts}h)")
        for bar, r in zip(bars, pts, strict=True):
            a.annotate(
                f"max {r['max_batch_per_gpu']}/GPU",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    if rows70:
        a.axhline(rows70[0]["device_gib"], color="k", ls="--", lw=1, label="H100 80GB")
        a.set_xticks([j + width * (len(clusters) - 1) / 2 for j in range(len(POLICIES))])
        a.set_xticklabels(POLICIES)
    a.set_ylabel("per-GPU peak (GiB), 1 sequence per GPU")
    a.set_title("llama3-70b full FT, AdamW, s2048, fsdp")
    a.legend(fontsize=7)
    policies = sorted({r["policy"] for r in rows8})
    meshes = [m for m in MESHES_8B if any(r["mesh"] == m for r in rows8)]
    width = 0.8 / max(1, len(policies))
    for i, policy in enumerate(policies):
        pts = [next(r for r in rows8 if r["mesh"] == m and r["policy"] == policy) for m in meshes]
        a8 = [j + i * width for j in range(len(meshes))]
        b.bar(a8, [r["peak_gib"] for r in pts], width, label=policy)
    if rows8:
        b.axhline(rows8[0]["device_gib"], color="k", ls="--", lw=1, label="A100 40GB")
        b.set_xticks([j + width * (len(policies) - 1) / 2 for j in range(len(meshes))])
        b.set_xticklabels(meshes)
    b.set_ylabel("per-GPU peak (GiB)")
    b.set_title("llama3-8b, 8 x a100-40gb, global batch 8, s2048")
    b.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv)
    import remat_kit as rk

    # Warm-up: the first compile in a process pays for loading the CUDA compiler plugin.
    spec, config = _request("llama3-8b", 8, "fsdp:8", seq=256, overrides=(("layers", 2),))
    rk.sources.measure(
        rk.sources.resolve(spec), "full", rk.target("h100", devices=8), config, warn=False
    )
    start = time.perf_counter()
    times = compile_times()
    rows8 = llama8b(args.quick)
    rows70 = llama70b(args.quick)
    summary = {
        "rows_70b": rows70,
        "rows_8b": rows8,
        "compile_times": times,
        "compile_ratio_8_over_1": times[1]["report_seconds"] / times[0]["report_seconds"],
        "seconds": time.perf_counter() - start,
        "quick": args.quick,
    }
    write_json(args.out / "multi_gpu.json", summary)
    plot(rows70, rows8, args.out / "multi_gpu.png")
    print(
        table(
            rows70,
            [
                "devices",
                "hosts",
                "mesh",
                "policy",
                "peak_gib",
                "weights_gib",
                "optimizer_gib",
                "activations_gib",
                "xla_remat",
                "max_batch_per_gpu",
                "max_batch_peak_gib",
                "search_compiles",
                "search_seconds",
            ],
            "llama3-70b full FT (bf16, AdamW, s2048), fsdp on h100: per-GPU figures",
        )
    )
    print(
        table(
            rows8,
            [
                "mesh",
                "policy",
                "batch",
                "batch_per_device",
                "peak_gib",
                "argument_gib",
                "weights_gib",
                "optimizer_gib",
                "activations_gib",
                "fits",
                "compile_seconds",
            ],
            "llama3-8b on 8 x a100-40gb (AdamW, s2048, global batch 8): per-GPU figures",
        )
    )
    print(
        table(
            times,
            ["model", "devices", "mesh", "report_seconds", "compile_seconds", "peak_gib"],
            "report time, 1 vs 8 devices (h100, full, s2048, 1 sequence per device)",
        )
    )
    print(f"8-device / 1-device report time: {summary['compile_ratio_8_over_1']:.2f}x")
    print(f"total: {summary['seconds']:.0f} s")


if __name__ == "__main__":
    main()
