"""Offload or recompute? The same tensors kept, offloaded to pinned host memory, or recomputed.

Seed claim: "offloading is slower than recomputing on modern GPUs because of PCIe". For
llama3-8b shapes (b2 s2048, SGD, bf16) on h100 and a100-40gb: peak HBM and host bytes from the
compiled program; transfer time over the host link (device->host in the forward pass, back in
the backward pass) and the time to recompute the same tensors at peak bf16 throughput are
estimates from the public figures. Writes results/offload_vs_recompute.json and a PNG.
"""

from __future__ import annotations

from collections.abc import Sequence

from common import GIB, parse, save_png, table, write_json

SETS = (  # (tensors, keep policy, offload policy)
    ("projections (minimal)", "minimal", "minimal_offloaded"),
    ("weight matmuls (dots_no_batch)", "dots_no_batch", "offload_dots_no_batch"),
    ("attention context", "context", "offload:offload=context"),
    ("MLP inputs", "names:save=mlpwi_0+mlpwi_1", "offload:offload=mlpwi_0+mlpwi_1"),
)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import remat_kit as rk
    from remat_kit_models.spec import PresetSpec

    source = rk.sources.resolve(PresetSpec("llama3-8b"))
    config = rk.TrainConfig(batch=2, seq=2048, optimizer="sgd")

    def measure(policy, target, base):
        return rk.sources.measure(source, policy, target, config, baseline=base, warn=False)

    rows = []
    targets = ("h100-80gb",) if args.quick else ("h100-80gb", "a100-40gb")
    for name in targets:
        target = rk.target(name)
        base = rk.sources.step_flops(source, "none", target, config)
        full = measure("full", target, base)
        for label, keep, off in SETS:
            kept = measure(keep, target, base)
            moved = measure(off, target, base)
            est = moved.meta.get("offload_estimate") or {}
            rows.append(
                {
                    "target": name,
                    "tensors": label,
                    "keep_peak_gib": kept.peak_bytes / GIB,
                    "offload_peak_gib": moved.peak_bytes / GIB,
                    "recompute_peak_gib": full.peak_bytes / GIB,
                    "hbm_saved_by_offload_gib": (kept.peak_bytes - moved.peak_bytes) / GIB,
                    "host_gib": moved.host_bytes / GIB,
                    "transfer_ms_est": 1e3 * est.get("transfer_seconds", float("nan")),
                    "recompute_ms_est": 1e3 * est.get("recompute_seconds", float("nan")),
                    "step_compute_ms_est": 1e3 * est.get("step_compute_seconds", float("nan")),
                    "link_bound": est.get("link_bound"),
                    "offload_fits": moved.fits,
                    "keep_fits": kept.fits,
                }
            )
    write_json(args.out / "offload_vs_recompute.json", {"rows": rows})
    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [f"{r['target']}\n{r['tensors']}" for r in rows]
    x = range(len(rows))
    ax.bar(
        [i - 0.2 for i in x],
        [r["transfer_ms_est"] for r in rows],
        0.4,
        label="offload: host-link transfer (est.)",
    )
    ax.bar(
        [i + 0.2 for i in x],
        [r["recompute_ms_est"] for r in rows],
        0.4,
        label="recompute the same tensors (est.)",
    )
    ax.set_xticks(list(x), labels, fontsize=6)
    ax.set_ylabel("ms per step")
    ax.set_title("llama3-8b b2 s2048: offload vs recompute")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, args.out / "offload_vs_recompute.png")
    print(
        table(
            rows,
            [
                "target",
                "tensors",
                "keep_peak_gib",
                "offload_peak_gib",
                "recompute_peak_gib",
                "host_gib",
                "transfer_ms_est",
                "recompute_ms_est",
                "step_compute_ms_est",
            ],
        )
    )


if __name__ == "__main__":
    main()
