"""Unrolled models answered from shallow copies: figures vs the full-depth compile, and speed.

A Llama-style model of 32 unrolled layers (width 2048, GQA 16/8, MLP 8192, batch 1, seq 2048,
on h100-80gb): for each policy, the report extrapolated from compiles of 2 and 3 layers
(``rk.sources.measure(depth="check")``) against the full-depth compile of the same step; then
the wall time of ``remat-kit compare``, ``fit`` and ``plan`` (``--quick``: compare only) on
the same shapes scanned, unrolled at full depth, and unrolled from shallow copies (fresh
processes, each with an empty compile cache as a new user's first run, the default
``--jobs``; medians of :data:`RUNS` paired runs, one with ``--quick``).

Writes results/unrolled_speed.json and results/unrolled_speed.png.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from common import GIB, ROOT, parse, save_png, table, write_json

SHAPE = ("--layers", "32", "--width", "2048", "--heads", "16", "--kv-heads", "8", "--ff", "8192")
POLICIES = ("none", "full", "minimal", "dots_no_batch", "block")


def _request():
    """The unrolled model's request (SHAPE's sizes) and its train config (batch 1)."""
    import remat_kit as rk
    from remat_kit_models.spec import PresetSpec

    shape = (("layers", 32), ("width", 2048), ("heads", 16), ("kv_heads", 8), ("ff", 8192))
    return PresetSpec("llama3-8b", scan_layers=False, overrides=shape), rk.TrainConfig(1, 2048)


def figures(target: str, policies: Sequence[str]) -> list[dict]:
    import remat_kit as rk

    rk.cache.set_enabled(False)
    rows = []
    for pol in policies:
        start = time.perf_counter()
        spec, config = _request()
        r = rk.sources.measure(
            rk.sources.resolve(spec), pol, target, config, warn=False, depth="check"
        )
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


#: The commands timed, each on the same shapes scanned, unrolled at full depth and unrolled
#: from shallow copies. ``plan`` runs under SGD, whose budget can lie between ``full`` and
#: ``none`` at this shape (AdamW's state alone is 37.8 GiB, over ``full``'s 33.1 GiB peak).
COMMANDS = {
    "compare": ["compare", "--batch", "1", "--policies", "none,full,minimal"],
    "fit": ["fit", "--policy", "full"],
    "plan": ["plan", "--batch", "1", "--optimizer", "sgd", "--budget", "25GiB", "--policies", ""],
}
#: Paired runs of each command (fit and plan at full depth take minutes each).
RUNS = {"compare": 2, "fit": 1, "plan": 1}


def _run(command: Sequence[str], extra: Sequence[str], target: str) -> float:
    cmd = [sys.executable, "-m", "remat_kit.cli", *command[:1], "--model", "llama3-8b", *SHAPE]
    cmd += ["--seq", "2048", "--target", target, *command[1:], *extra]
    # A new user's first run: an empty compile cache (so every program is compiled), with
    # what a cache directory gives a deviceless compile (remat_kit.targets._codegen).
    with tempfile.TemporaryDirectory(prefix="rk_speed_") as cache:
        env = {**os.environ, "REMAT_KIT_CACHE_DIR": cache}
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
        if done.returncode:
            print(" ".join(cmd), "->", done.returncode, done.stderr[-2000:], file=sys.stderr)
            return float("nan")
        return time.perf_counter() - start


def speed(target: str, commands: Sequence[str], quick: bool) -> list[dict]:
    cases = {
        "scanned": [],
        "unrolled, --depth full": ["--no-scan", "--depth", "full"],
        "unrolled, --depth auto": ["--no-scan"],
    }
    rows = []
    for command in commands:
        times: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(1 if quick else RUNS[command]):  # paired: every case in turn
            for name, extra in cases.items():
                times[name].append(_run(COMMANDS[command], extra, target))
                print(f"{command} {name}: {times[name][-1]:.1f} s", flush=True)
        scanned = statistics.median(times["scanned"])
        rows += [
            {
                "command": command,
                "case": name,
                "median_s": statistics.median(ts),
                "runs": ts,
                "vs_scanned": statistics.median(ts) / scanned,
            }
            for name, ts in times.items()
        ]
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv)
    policies = POLICIES[:2] if args.quick else POLICIES
    rows = figures(args.target, policies)
    print(
        table(
            rows,
            ["policy", "full_peak_gib", "extrapolated_peak_gib", "peak_error", "section"],
            "extrapolated from 2 and 3 layers vs the full compile (32 layers)",
        )
    )
    commands = ("compare",) if args.quick else tuple(COMMANDS)
    timing = speed(args.target, commands, args.quick)
    print(table(timing, ["command", "case", "median_s", "vs_scanned"], "wall time, s"))
    write_json(args.out / "unrolled_speed.json", {"figures": rows, "timing": timing})

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    done = [r for r in rows if r["mode"] == "extrapolated"]
    ax[0].bar([r["policy"] for r in done], [100 * r["peak_error"] for r in done])
    ax[0].set_ylabel("extrapolated vs full peak, %")
    ax[0].tick_params(axis="x", rotation=30)
    cases = list(dict.fromkeys(t["case"] for t in timing))
    for i, case in enumerate(cases):
        got = [t for t in timing if t["case"] == case]
        xs = [j + (i - 1) * 0.27 for j in range(len(got))]
        ax[1].bar(xs, [t["median_s"] for t in got], width=0.27, label=case)
    ax[1].set_xticks(range(len(commands)), commands)
    ax[1].set_ylabel("wall time, s (median)")
    ax[1].legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, args.out / "unrolled_speed.png")


if __name__ == "__main__":
    main()
