"""What does full recomputation cost? Claims: "~33% more compute"; "activation memory drops 60-80%
at 20-30% slower training".

Two measurements. (1) For each preset, the train step's FLOPs with per-layer ``full`` over the
FLOPs without remat (counted from the compiled program's jaxpr, recomputation included), and the
activation memory of both compiled for an H100. (2) Wall-clock: small presets really run on this
CPU, ``none`` and ``full`` interleaved in one process, several steps after warm-up, median step
time. Writes results/recompute_cost.json and a PNG.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from common import GIB, parse, progress, save_png, table, write_json

PRESETS = (  # (preset, batch, seq)
    ("gpt2-small", 8, 1024),
    ("bert-base", 32, 512),
    ("gpt2-medium", 8, 1024),
    ("llama3.2-1b", 4, 2048),
    ("llama3-8b", 4, 2048),
    ("llama2-13b", 2, 2048),
    ("llama3-70b", 1, 2048),
)
CPU_RUNS = (  # (preset, overrides, batch, seq) run for real on this CPU
    ("tiny-llama", (("layers", 4), ("width", 256), ("heads", 4), ("ff", 768)), 8, 256),
    (
        "tiny-gpt2",
        (("layers", 4), ("width", 256), ("heads", 4), ("ff", 1024), ("max_seq", 256)),
        8,
        256,
    ),
)


def _wall_clock(preset, overrides, batch, seq, steps: int) -> dict:
    import jax
    import jax.numpy as jnp

    import remat_kit as rk
    import remat_kit_models as models

    fns, states = {}, {}
    for policy in ("none", "full"):
        cfg = models.get_config(preset, policy=policy, **dict(overrides))
        module = models.build(cfg)
        step = rk.build_train_step(
            module, rk.TrainConfig(batch=batch, seq=seq, optimizer="sgd", donate=False)
        )
        params = module.init(jax.random.key(0), jnp.zeros((batch, seq), jnp.int32))
        tr = params  # all trainable: the step's first argument is the full tree
        opt = rk.train.make_optimizer("sgd").init(tr)
        toks = jax.random.randint(jax.random.key(1), (batch, seq), 0, cfg.vocab_size)
        batch_ = {"tokens": toks, "targets": toks}
        fns[policy] = jax.jit(step.fn)
        states[policy] = (tr, {}, opt, batch_)
    times: dict[str, list[float]] = {"none": [], "full": []}
    for i in range(steps + 3):
        for policy in ("none", "full"):  # interleaved: both see the same machine load
            start = time.perf_counter()
            out = fns[policy](*states[policy])
            jax.block_until_ready(out)
            if i >= 3:  # warm-up: compile and first runs
                times[policy].append(time.perf_counter() - start)
    none, full = statistics.median(times["none"]), statistics.median(times["full"])
    return {
        "preset": preset,
        "batch": batch,
        "seq": seq,
        "none_ms": none * 1e3,
        "full_ms": full * 1e3,
        "slowdown": full / none - 1,
        "steps": steps,
    }


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import remat_kit as rk
    from remat_kit_models.spec import PresetSpec

    target = rk.target(args.target)
    rows = []
    presets = PRESETS[:2] if args.quick else PRESETS
    for preset, batch, seq in progress(presets, "presets"):
        source = rk.sources.resolve(PresetSpec(preset))
        config = rk.TrainConfig(batch=batch, seq=seq, optimizer="sgd")
        base = rk.sources.step_flops(source, "none", target, config)
        none = rk.sources.measure(source, "none", target, config, baseline=base, warn=False)
        full = rk.sources.measure(source, "full", target, config, baseline=base, warn=False)
        rows.append(
            {
                "preset": preset,
                "batch": batch,
                "seq": seq,
                "attention": full.attention,
                "flops_overhead_full": full.meta["recompute_overhead"],
                "activation_none_gib": none.breakdown["activations"] / GIB,
                "activation_full_gib": full.breakdown["activations"] / GIB,
                # None where the shapes' estimate of the activations reached 0 (the peak is
                # below the fixed parts' shapes): no reduction can be read from it.
                "activation_reduction": 1
                - full.breakdown["activations"] / none.breakdown["activations"]
                if full.breakdown["activations"] > 0
                else None,
                "none_xla_remat": none.xla_remat,
            }
        )
    cpu = [_wall_clock(*run, steps=5 if args.quick else 10) for run in CPU_RUNS]
    summary = {
        "target": target.name,
        "flops_overhead_full": {r["preset"]: r["flops_overhead_full"] for r in rows},
        "activation_reduction_full": {r["preset"]: r["activation_reduction"] for r in rows},
        "rows": rows,
        "cpu_wall_clock": cpu,
    }
    write_json(args.out / "recompute_cost.json", summary)
    fig, ax = plt.subplots(figsize=(7, 4))
    x = range(len(rows))
    ax.bar(
        [i - 0.2 for i in x],
        [100 * r["flops_overhead_full"] for r in rows],
        0.4,
        label="extra FLOPs with full remat (%)",
    )
    ax.bar(
        [i + 0.2 for i in x],
        [100 * (r["activation_reduction"] or 0) for r in rows],
        0.4,
        label="activation memory saved (%)",
    )
    ax.axhline(33, ls="--", c="grey", lw=1, label="claimed ~33% extra compute")
    ax.set_xticks(list(x), [r["preset"] for r in rows], rotation=20, fontsize=7)
    ax.set_title(f"Full recomputation: cost vs saving ({target.name})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, args.out / "recompute_cost.png")
    print(
        table(
            rows,
            [
                "preset",
                "batch",
                "seq",
                "attention",
                "flops_overhead_full",
                "activation_none_gib",
                "activation_full_gib",
                "activation_reduction",
            ],
        )
    )
    print(
        table(
            cpu,
            ["preset", "batch", "seq", "none_ms", "full_ms", "slowdown"],
            title="wall clock on this CPU (median step)",
        )
    )


if __name__ == "__main__":
    main()
