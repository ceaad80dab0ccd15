"""What does a default JAX process on the GPU really get? Verdicts at fraction 0.75 and 0.95.

JAX's GPU allocator takes 0.75 of the card unless XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise,
and XLA's own rematerialization pass works to a limit derived from that share. For Llama 3 8B,
batch 4, seq 2048 on an H100, every main policy is compiled at the default fraction and at 0.95
(the deviceless compile given each runtime's limit): peak, fits, what XLA's pass took off, and
the largest batch for ``full`` at each. Writes results/runtime_limit.json and a PNG.
"""

from __future__ import annotations

from collections.abc import Sequence

from common import GIB, parse, progress, save_png, table, write_json

FRACTIONS = (0.75, 0.95)
# mixed is today's default for full training; bf16 (all-bf16 AdamW) was the default before.
PRECISIONS = ("mixed", "bf16")
MODEL, BATCH, SEQ = "llama3-8b", 4, 2048


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv, target="h100-80gb")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import remat_kit as rk
    from remat_kit_models.spec import PresetSpec

    policies = ("none", "full", "minimal") if args.quick else rk.search.FRONT_POLICIES
    rows, batches = [], {}
    source = rk.sources.resolve(PresetSpec(MODEL))
    for precision, fraction in [(p, f) for p in PRECISIONS for f in FRACTIONS]:
        config = rk.TrainConfig(BATCH, SEQ, optimizer="adamw", precision=rk.train.regime(precision))
        target = rk.target(args.target, mem_fraction=fraction)
        for policy in progress(policies, f"{precision} at fraction {fraction}"):
            r = rk.sources.measure(source, policy, target, config, warn=False)
            rows.append(
                {
                    "mem_fraction": fraction,
                    "policy": r.policy,
                    "peak_gib": r.peak_bytes / GIB,
                    "usable_gib": r.usable_bytes / GIB,
                    "fits": r.fits,
                    "fits_with_fraction": r.fits_with_fraction,
                    "xla_remat_saved_gib": r.xla_remat_saved_bytes / GIB,
                    "xla_remat_limit_gib": (r.xla_remat_limit_bytes or 0) / GIB or None,
                    "precision": precision,
                }
            )
        fit = rk.max_batch(rk.sources.workload(source, target, config), "full")
        batches[f"{precision}@{fraction}"] = {
            "max_batch": fit.batch,
            "peak_gib": (fit.peak_bytes or 0) / GIB,
            "limit_gib": fit.limit_bytes / GIB,
        }
    print(table(rows, list(rows[0]), title=f"{MODEL} b{BATCH} s{SEQ} on {args.target}"))
    print({k: b["max_batch"] for k, b in batches.items()}, "largest batch with full")
    write_json(
        args.out / "runtime_limit.json",
        {
            "model": MODEL,
            "batch": BATCH,
            "seq": SEQ,
            "target": args.target,
            "rows": rows,
            "max_batch_full": batches,
        },
    )
    fig, ax = plt.subplots(figsize=(8, 4))
    names = list(dict.fromkeys(r["policy"] for r in rows))
    for i, precision in enumerate(PRECISIONS):
        peaks = [
            next(
                r["peak_gib"]
                for r in rows
                if r["policy"] == n and r["precision"] == precision and r["mem_fraction"] == 0.75
            )
            for n in names
        ]
        ax.bar([j + 0.4 * (i - 0.5) for j in range(len(names))], peaks, 0.4, label=precision)
    for i, fraction in enumerate(FRACTIONS):
        usable = rows[[r["mem_fraction"] for r in rows].index(fraction)]["usable_gib"]
        ax.axhline(
            usable, ls="--", color=f"C{i}", lw=1, label=f"usable at {fraction}: {usable:.1f} GiB"
        )
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_ylabel("compiled peak (GiB)")
    ax.set_title(f"{MODEL} b{BATCH} s{SEQ} on {args.target}: what a JAX process may allocate")
    ax.legend(fontsize=7)
    save_png(fig, args.out / "runtime_limit.png")


if __name__ == "__main__":
    main()
