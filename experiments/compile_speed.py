"""Does an analysis-only GPU compile (no ptxas, no LLVM optimisation) give XLA's analysis, faster?

remat_kit compiles for GPUs only to read the memory analysis, which XLA computes before making
machine code (remat_kit.targets._codegen). This compiles the same lowered train step both ways,
alternating, and checks that every figure of the analysis is identical: llama3-8b b4 s2048,
the 11 main policies on an H100, three of them on an A100 40GB (sm_80) and an RTX 4090 (sm_89).
Writes results/compile_speed.json (with the machine's core count) and a PNG.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence

from common import parse, save_png, table, write_json

TARGETS = (("h100-80gb", None), ("a100-40gb", 3), ("rtx4090", 3))


def _lowered(spec, config, policy, target):
    import jax

    from remat_kit.analysis import abstract
    from remat_kit_models.configure import model_config
    from remat_kit_models.source import train_step

    step = train_step(spec, model_config(spec, config, policy, target), config, target)
    args = abstract(step.args, target.sharding())
    return jax.jit(step.fn, donate_argnums=step.donate_argnums).lower(*args)


def _timed(spec, config, policy, target, options):
    from remat_kit import xla

    lowered = _lowered(spec, config, policy, target)  # afresh: jax remembers a compiled Lowered
    start = time.perf_counter()
    mem = xla.compile_memory(lowered, options=options, measure_xla_remat=False)
    seconds = time.perf_counter() - start
    figures = mem.to_dict()
    for k in ("compile_seconds", "xla_messages"):
        figures.pop(k)
    return seconds, figures


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv)
    import remat_kit as rk
    from remat_kit.cache import key_options
    from remat_kit.search import FRONT_POLICIES
    from remat_kit.targets import analysis_options
    from remat_kit_models.spec import PresetSpec

    spec = PresetSpec("llama3-8b")
    # The step is built here, not by the source: it trains in the regime the source would set.
    config = rk.TrainConfig(4, 2048, precision=rk.train.regime())
    repeats = 1 if args.quick else 3
    rows = []
    for name, count in TARGETS[:1] if args.quick else TARGETS:
        t = rk.target(name)
        options = analysis_options(t)
        _timed(spec, config, "full", t, options)  # warm-up: loading the CUDA compiler plugin
        for policy in FRONT_POLICIES[: 2 if args.quick else count]:
            full, fast, same = [], [], True
            for _ in range(repeats):
                s_full, f_full = _timed(spec, config, policy, t, {})
                s_fast, f_fast = _timed(spec, config, policy, t, options)
                full.append(s_full)
                fast.append(s_fast)
                same = same and f_full == f_fast
            rows.append(
                {
                    "target": t.name,
                    "policy": policy,
                    "full_s": statistics.median(full),
                    "analysis_s": statistics.median(fast),
                    "ratio": statistics.median(fast) / statistics.median(full),
                    "identical": same,
                    "peak_gib": f_full["argument_bytes"] / 2**30
                    + (f_full["output_bytes"] + f_full["temp_bytes"] - f_full["alias_bytes"])
                    / 2**30,
                }
            )
            print(table(rows[-1:], list(rows[-1])), flush=True)
    summary = {
        "cores": os.cpu_count(),
        "repeats": repeats,
        "options": key_options(analysis_options(rk.target("h100"))),
        "all_identical": all(r["identical"] for r in rows),
        "median_ratio": statistics.median(r["ratio"] for r in rows),
        "full_s_total": sum(r["full_s"] for r in rows),
        "analysis_s_total": sum(r["analysis_s"] for r in rows),
    }
    print(table(rows, list(rows[0]), "full code generation vs analysis-only, median seconds"))
    print(summary)
    write_json(args.out / "compile_speed.json", {"summary": summary, "rows": rows})
    plot(rows, args.out / "compile_speed.png")


def plot(rows, path) -> None:
    """Median seconds per program, full code generation beside analysis-only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(11, 4))
    ax.bar(x - 0.2, [r["full_s"] for r in rows], 0.4, label="full code generation")
    ax.bar(x + 0.2, [r["analysis_s"] for r in rows], 0.4, label="analysis only (same analysis)")
    ax.set_xticks(x, [f"{r['policy']}\n{r['target']}" for r in rows], rotation=60, fontsize=7)
    ax.set_ylabel("compile seconds (median)")
    ax.set_title("llama3-8b b4 s2048: one deviceless compile, two ways")
    ax.legend()
    fig.tight_layout()
    save_png(fig, path)


if __name__ == "__main__":
    main()
