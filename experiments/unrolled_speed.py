"""Unrolled models answered from shallow copies: figures vs the full-depth compile, and speed.

A Llama-style model of 32 unrolled layers (width 2048, GQA 16/8, MLP 8192, batch 1, seq 2048,
on h100-80gb): for each policy, the report extrapolated from compiles of 2, 3 and 4 layers
(``rk.sources.measure(depth="check")``) against the full-depth compile of the same step; then
the wall time of ``remat-kit compare`` on the same shapes scanned, unrolled at full depth, and
unrolled from shallow copies (fresh processes, ``--no-cache``, medians of ``--runs``).

Writes results/unrolled_speed.json and results/unrolled_speed.png.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

from common import GIB, ROOT, parse, save_png, table, write_json

SHAPE = ("--layers", "32", "--width", "2048", "--heads", "16", "--kv-heads", "8", "--ff", "8192")
POLICIES = ("none", "full", "minimal", "dots_no_batch", "block")


def _options(depth: str):
    from remat_kit_models.options import Options

    shape = (("layers", 32), ("width", 2048), ("heads", 16), ("kv_heads", 8), ("ff", 8192))
    return Options("llama3-8b", 1, 2048, scan_layers=False, overrides=shape, depth=depth)


def figures(target: str, policies: Sequence[str]) -> list[dict]:
    import remat_kit as rk
    from remat_kit_models.measure import measure

    rk.cache.set_enabled(False)
    rows = []
    for pol in policies:
        start = time.perf_counter()
        r = measure(_options("check"), pol, target)
        d = r.meta["depth"]
        if d["mode"] != "verified":
            rows.append({"policy": pol, "mode": d["mode"], "reason": d.get("reason")})
            continue
        rows.append(
            {
                "policy": pol,
                "mode": "extrapolated",
                "full_peak_gib": r.peak_bytes / GIB,
                "extrapolated_peak_gib": d["extrapolated_peak_bytes"] / GIB,
                "peak_error": d["peak_error"],
                "section": d["section"],
                "residual_bytes": d["residual_bytes"],
                "copies_compile_s": d["extrapolated_compile_seconds"],
                "full_compile_s": r.compile_seconds,
                "wall_s": time.perf_counter() - start,
            }
        )
    return rows


def _compare(extra: Sequence[str], target: str, policies: Sequence[str]) -> float:
    cmd = [sys.executable, "-m", "remat_kit.cli", "compare", "--model", "llama3-8b", *SHAPE]
    cmd += ["--batch", "1", "--seq", "2048", "--target", target, "--no-cache", "--jobs", "1"]
    cmd += ["--policies", ",".join(policies), *extra]
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - start


def speed(target: str, policies: Sequence[str], runs: int) -> list[dict]:
    cases = {
        "scanned": [],
        "unrolled, --depth full": ["--no-scan", "--depth", "full"],
        "unrolled, --depth auto": ["--no-scan"],
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(runs):  # paired: each run measures every case once, in turn
        for name, extra in cases.items():
            times[name].append(_compare(extra, target, policies))
    scanned = statistics.median(times["scanned"])
    return [
        {
            "case": name,
            "median_s": statistics.median(ts),
            "runs": ts,
            "vs_scanned": statistics.median(ts) / scanned,
        }
        for name, ts in times.items()
    ]


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv)
    policies = POLICIES[:2] if args.quick else POLICIES
    rows = figures(args.target, policies)
    print(
        table(
            rows,
            ["policy", "full_peak_gib", "extrapolated_peak_gib", "peak_error", "section"],
            "extrapolated from 2, 3, 4 layers vs the full compile (32 layers)",
        )
    )
    timing = speed(args.target, policies[:3], 1 if args.quick else 3)
    print(table(timing, ["case", "median_s", "vs_scanned"], f"compare of {policies[:3]}"))
    write_json(args.out / "unrolled_speed.json", {"figures": rows, "compare": timing})

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    done = [r for r in rows if r["mode"] == "extrapolated"]
    ax[0].bar([r["policy"] for r in done], [100 * r["peak_error"] for r in done])
    ax[0].set_ylabel("extrapolated vs full peak, %")
    ax[0].tick_params(axis="x", rotation=30)
    ax[1].bar([t["case"] for t in timing], [t["median_s"] for t in timing])
    ax[1].set_ylabel("compare wall time, s (median)")
    ax[1].tick_params(axis="x", rotation=15)
    fig.tight_layout()
    save_png(fig, args.out / "unrolled_speed.png")


if __name__ == "__main__":
    main()
