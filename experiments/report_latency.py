"""How long does a report take on this machine, and does it grow with depth when layers are scanned?

Goal (issue 3): under 10 s per policy for llama3-8b b4 s2048 on h100, and the report time for 64
layers at most 1.3x that for 16 layers when scanned. Writes results/report_latency.json and a PNG.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from common import GIB, parse, save_png, table, write_json

POLICIES = ("none", "full", "minimal", "dots_no_batch", "megatron", "offload_dots_no_batch")


def _timed_report(layers: int, batch: int, seq: int, optimizer: str, policy: str, target):
    """A report of llama3-8b at ``layers`` layers and the wall time it took."""
    import remat_kit as rk
    from remat_kit_models.spec import PresetSpec

    spec = PresetSpec("llama3-8b", overrides=(("layers", layers),))
    config = rk.TrainConfig(batch, seq, optimizer=optimizer)
    start = time.perf_counter()
    r = rk.sources.measure(rk.sources.resolve(spec), policy, target, config, warn=False)
    return time.perf_counter() - start, r


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import remat_kit as rk

    target = rk.target(args.target)
    policies = POLICIES[:2] if args.quick else POLICIES
    rows = []
    # Warm-up: the first compile in a process pays for loading the CUDA compiler plugin.
    _timed_report(2, 1, 256, "sgd", "full", target)
    for layers in (16, 32, 64):
        for policy in policies:
            seconds, r = _timed_report(layers, 4, 2048, "adamw", policy, target)
            rows.append(
                {
                    "layers": layers,
                    "policy": policy,
                    "report_seconds": seconds,
                    "compile_seconds": r.compile_seconds,
                    "peak_gib": r.peak_bytes / GIB,
                }
            )
    by_depth = {
        L: statistics.median(r["report_seconds"] for r in rows if r["layers"] == L)
        for L in (16, 32, 64)
    }
    summary = {
        "target": target.name,
        "median_report_seconds_by_layers": by_depth,
        "ratio_64_over_16": by_depth[64] / by_depth[16],
        "max_report_seconds_32_layers": max(r["report_seconds"] for r in rows if r["layers"] == 32),
        "rows": rows,
    }
    write_json(args.out / "report_latency.json", summary)
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy in policies:
        pts = [(r["layers"], r["report_seconds"]) for r in rows if r["policy"] == policy]
        ax.plot(*zip(*pts, strict=True), marker="o", label=policy)
    ax.set_xlabel("layers (scanned)")
    ax.set_ylabel("report wall time (s)")
    ax.set_title(f"llama3-8b b4 s2048 report time on {target.name} (2-core CPU)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, args.out / "report_latency.png")
    print(table(rows, ["layers", "policy", "report_seconds", "compile_seconds", "peak_gib"]))
    print(f"ratio 64/16 layers: {summary['ratio_64_over_16']:.2f}")


if __name__ == "__main__":
    main()
