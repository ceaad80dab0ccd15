"""The seed table: no checkpointing / every 2nd layer / every 4th layer / block-level, measured.

Claimed (blog posts on gradient checkpointing): activation memory -40% checkpointing every 2nd
layer, -65% every 4th layer, -70% block-level. Measured here on a 12-layer BERT-base-sized
encoder, batch 32, seq 512, AdamW, compiled for a 24 GB GPU (rtx4090 by default), with both
attention implementations. Writes results/strategy_table.json and a PNG.
"""

from __future__ import annotations

from collections.abc import Sequence

from common import GIB, parse, save_png, table, write_json

# "Checkpoint every k-th layer" is read two ways: segments of k layers of which only the
# input is kept (Chen et al.; rk.schedule("every")), or checkpointing one layer in k and
# keeping the others whole (a per-layer plan). Both are measured.
_HALF = "layers:" + ",".join(f"{i}=full" for i in range(0, 12, 2))
_QUARTER = "layers:" + ",".join(f"{i}=full" for i in range(0, 12, 4))
ROWS = (  # (label, per-layer policy, schedule, claimed activation reduction)
    ("no checkpointing", "none", "none", 0.0),
    ("every 2nd layer: segments of 2", "none", "every:2", 0.40),
    ("every 4th layer: segments of 4", "none", "every:4", 0.65),
    ("every 2nd layer: 1 in 2 checkpointed", "none", _HALF, 0.40),
    ("every 4th layer: 1 in 4 checkpointed", "none", _QUARTER, 0.65),
    ("block-level (each layer, full)", "full", "none", 0.70),
    ("block policy (keep attn_out)", "block", "none", None),
)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv, target="rtx4090")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import remat_kit as rk
    from remat_kit_models.spec import PresetSpec

    target = rk.target(args.target)
    config = rk.TrainConfig(batch=32, seq=512, optimizer="adamw")
    rows = []
    for attention in ("xla", "cudnn"):
        # cuDNN flash attention has no attention dropout: both rows run without it, alike.
        source = rk.sources.resolve(PresetSpec("bert-base", attention=attention, dropout=0.0))
        base = rk.sources.step_flops(source, "none", target, config)
        ref = None
        for label, policy, sched, claim in ROWS:
            r = rk.sources.measure(
                source, policy, target, config, schedule=sched, baseline=base, warn=False
            )
            act = r.breakdown["activations"]
            ref = act if ref is None else ref
            rows.append(
                {
                    "attention": attention,
                    "strategy": label,
                    "policy": policy,
                    "schedule": sched,
                    "activation_gib": act / GIB,
                    "peak_gib": r.peak_bytes / GIB,
                    "reduction": 1 - act / ref,
                    "claimed_reduction": claim,
                    "recompute_overhead": r.meta["recompute_overhead"],
                    "fits": r.fits,
                }
            )
    write_json(args.out / "strategy_table.json", {"target": target.name, "rows": rows})
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [label for label, *_ in ROWS]
    x = range(len(labels))
    for i, attention in enumerate(("xla", "cudnn")):
        vals = [r["reduction"] * 100 for r in rows if r["attention"] == attention]
        ax.bar([j + 0.27 * (i - 1) for j in x], vals, width=0.27, label=f"measured, {attention}")
    claims = [(c or 0) * 100 for *_, c in ROWS]
    ax.bar([j + 0.27 for j in x], claims, width=0.27, label="claimed", color="grey")
    ax.set_xticks(list(x), labels, rotation=15, fontsize=7)
    ax.set_ylabel("activation memory reduction vs none (%)")
    ax.set_title(f"bert-base b32 s512 AdamW on {target.name}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, args.out / "strategy_table.png")
    print(
        table(
            rows,
            [
                "attention",
                "strategy",
                "activation_gib",
                "reduction",
                "claimed_reduction",
                "recompute_overhead",
                "peak_gib",
                "fits",
            ],
        )
    )


if __name__ == "__main__":
    main()
