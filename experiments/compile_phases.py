"""Where a deviceless GPU compile's time goes, by XLA's own trace of its phases.

remat_kit compiles for a GPU only to read the memory analysis (remat_kit.targets._codegen), and
the compile is most of every report's time and of the test suite's (results/suite_compiles.json).
This compiles a train step with remat_kit's analysis options under ``jax.profiler`` and sums
XLA's trace events: the whole compile (``backend_compile_and_load``), the HLO passes
(``OptimizeHloModule``), and inside them ``config-assigner``, the pass that gives each GEMM
fusion its Triton configuration. With no card to time kernels on, jax 0.12.0.1's XLA compiles
each unique fusion's first configuration to check that it compiles ("Using first compilable
config" in its log, whatever ``xla_gpu_autotune_level`` says), so that pass makes one module
compile (``CompileToBackendResult``) per unique GEMM fusion before the program's own.

Each program is compiled three times (two with ``--quick``) in one process, each time with a
fresh remat_kit cache (a new directory) so nothing is read back; the first compile of the
process, which loads the CUDA plugin, is left out. Only XLA's own events are timed: the
profiler's Python tracer slows the tracing and lowering around them several times over.
Writes results/compile_phases.json and a PNG.

Usage::

    python experiments/compile_phases.py            # tiny-llama b4 s1024 and llama3-8b b4 s2048
    python experiments/compile_phases.py --quick    # tiny-llama only, two repeats
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import statistics
import tempfile
from collections.abc import Sequence

from common import parse, save_png, table, write_json

#: The tests' SMALL workload (tests/conftest.py) and the README's main job, one GPU.
PROGRAMS = {
    "tiny-llama b4 s1024": (
        "tiny-llama",
        dict(layers=4, width=512, heads=8, kv_heads=4, ff=1024, vocab=1024, max_seq=1024),
        (4, 1024),
        dict(params="bf16", compute="bf16"),
    ),
    "llama3-8b b4 s2048": ("llama3-8b", {}, (4, 2048), {}),
}
POLICIES = ("full", "dots", "none")
#: XLA's trace events summed per compile, and what the table calls them.
EVENTS = {
    "backend_compile_and_load": "compile_s",
    "OptimizeHloModule": "hlo_passes_s",
    "config-assigner": "config_assigner_s",
}


def _phases(trace_dir: str) -> dict[str, float]:
    """Seconds per event of :data:`EVENTS` and the count of module compiles, from the
    Perfetto trace ``jax.profiler`` wrote under ``trace_dir``."""
    (path,) = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    with gzip.open(path) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    out = dict.fromkeys(EVENTS.values(), 0.0)
    out["module_compiles"] = 0
    for e in events:
        if e.get("ph") != "X":
            continue
        if e["name"] in EVENTS:
            out[EVENTS[e["name"]]] += e.get("dur", 0) / 1e6
        elif e["name"] == "CompileToBackendResult":
            out["module_compiles"] += 1
    return out


def _measure_once(src, policy, target, config) -> dict[str, float]:
    import jax

    import remat_kit as rk

    os.environ["REMAT_KIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="compile_phases_cache_")
    with tempfile.TemporaryDirectory(prefix="compile_phases_trace_") as where:
        jax.profiler.start_trace(where, create_perfetto_trace=True)
        try:
            report = rk.sources.measure(src, policy, target, config, warn=False)
        finally:
            jax.profiler.stop_trace()
        out = _phases(where)
    out["peak_bytes"] = report.peak_bytes
    return out


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv)
    import remat_kit as rk
    from remat_kit_models.spec import PresetSpec

    rk.targets.set_process_flags()
    target = rk.target(args.target)
    names = list(PROGRAMS)[:1] if args.quick else list(PROGRAMS)
    repeats = 2 if args.quick else 3
    rows = []
    warmed = False
    for name in names:
        model, overrides, (batch, seq), precision = PROGRAMS[name]
        src = rk.sources.resolve(PresetSpec(model, overrides=tuple(overrides.items())))
        config = rk.TrainConfig(batch, seq, optimizer="sgd", precision=rk.train.regime(**precision))
        for policy in POLICIES:
            if not warmed:  # loads the CUDA compiler plugin: not a compile's own time
                _measure_once(src, policy, target, config)
                warmed = True
            runs = [_measure_once(src, policy, target, config) for _ in range(repeats)]
            row = {"program": name, "policy": policy}
            for key in EVENTS.values():
                row[key] = statistics.median(r[key] for r in runs)
            row["config_assigner_share"] = row["config_assigner_s"] / row["compile_s"]
            row["module_compiles"] = runs[0]["module_compiles"]
            row["same_peak"] = len({r["peak_bytes"] for r in runs}) == 1
            rows.append(row)
            print(table(rows[-1:], list(row)), flush=True)
    summary = {
        "cores": os.cpu_count(),
        "repeats": repeats,
        "compile_s_total": sum(r["compile_s"] for r in rows),
        "config_assigner_s_total": sum(r["config_assigner_s"] for r in rows),
    }
    summary["config_assigner_share"] = (
        summary["config_assigner_s_total"] / summary["compile_s_total"]
    )
    print(table(rows, list(rows[0]), "a deviceless H100 compile by XLA phase, median seconds"))
    print(summary)
    write_json(args.out / "compile_phases.json", {"summary": summary, "rows": rows})
    plot(rows, args.out / "compile_phases.png")


def plot(rows: list[dict], path) -> None:
    """Per program and policy, XLA's compile split into config-assigner and the rest."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    x = np.arange(len(rows))
    assigner = np.array([r["config_assigner_s"] for r in rows])
    rest = np.array([r["compile_s"] for r in rows]) - assigner
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(x, assigner, 0.6, label="config-assigner (candidate compiles)")
    ax.bar(x, rest, 0.6, bottom=assigner, label="the rest of the compile")
    for i, r in enumerate(rows):
        ax.text(i, r["compile_s"], f"{r['config_assigner_share']:.0%}", ha="center", va="bottom")
    ax.set_xticks(x, [f"{r['program']}\n{r['policy']}" for r in rows], fontsize=7)
    ax.set_ylabel("seconds (median, XLA's trace)")
    ax.set_title("one deviceless H100 compile, by XLA phase")
    ax.legend()
    fig.tight_layout()
    save_png(fig, path)


if __name__ == "__main__":
    main()
