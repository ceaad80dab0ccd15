"""Does sqrt(N) checkpointing give O(sqrt N) activation memory? (seed: 100 layers -> ~20 units).

Compiles the train step of a Llama-style stack (width 1024, scanned layers) for layer counts
4..128 on an H100 target and reads XLA's memory analysis for each schedule. "Activations" is the
compiled peak minus weights, gradients, optimizer state and batch. A "unit" is one layer's
activations without checkpointing (none(L) / L). Writes results/depth_scaling.json and a PNG.
"""

from __future__ import annotations

from collections.abc import Sequence

from common import GIB, fit_exponent, parse, progress, save_png, table, write_json

LAYERS = (4, 8, 16, 32, 64, 100, 128)
CASES = (  # (label, per-layer policy, schedule)
    ("none", "none", "none"),
    ("full per layer", "full", "none"),
    ("every:2", "none", "every:2"),
    ("every:4", "none", "every:4"),
    ("sqrt", "none", "sqrt"),
    ("nested:2", "none", "nested:2"),
    ("nested:3", "none", "nested:3"),
)


def _request(layers: int):
    """The model source and train config of the stack at ``layers`` layers."""
    import remat_kit as rk
    from remat_kit_models.spec import PresetSpec

    spec = PresetSpec(
        "llama3-8b",
        attention="cudnn",
        overrides=(
            ("layers", layers),
            ("width", 1024),
            ("heads", 8),
            ("kv_heads", 8),
            ("ff", 2816),
            ("vocab", 4096),
        ),
    )
    return rk.sources.resolve(spec), rk.TrainConfig(batch=4, seq=2048, optimizer="sgd")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import remat_kit as rk

    target = rk.target(args.target)
    layers = (4, 16, 64) if args.quick else LAYERS
    rows = []
    for L in progress(layers, "depths"):
        source, config = _request(L)
        base = rk.sources.step_flops(source, "none", target, config)
        for label, policy, sched in CASES:
            r = rk.sources.measure(
                source, policy, target, config, schedule=sched, baseline=base, warn=False
            )
            rows.append(
                {
                    "layers": L,
                    "case": label,
                    "policy": policy,
                    "schedule": sched,
                    "activation_bytes": r.breakdown["activations"],
                    "peak_bytes": r.peak_bytes,
                    "flops": r.flops,
                    "recompute_overhead": r.meta["recompute_overhead"],
                    "xla_remat": r.xla_remat,
                    "compile_seconds": r.compile_seconds,
                }
            )
    unit = {
        L: next(r["activation_bytes"] for r in rows if r["layers"] == L and r["case"] == "none") / L
        for L in layers
    }
    for r in rows:
        r["units"] = r["activation_bytes"] / unit[r["layers"]]
        r["activation_gib"] = r["activation_bytes"] / GIB
    exponents = {}
    for label, _, _ in CASES:
        pts = [(r["layers"], r["activation_bytes"]) for r in rows if r["case"] == label]
        exponents[label] = fit_exponent(*zip(*pts, strict=True))
    at100 = {r["case"]: r["units"] for r in rows if r["layers"] == 100}
    summary = {
        "target": target.name,
        "model": "llama-style, width 1024, 8 heads, ff 2816, vocab 4096, b4 s2048, cudnn",
        "exponents": exponents,
        "claim": "sqrt(N) segments: 100 layers use ~20 units of activation memory instead of 100",
        "units_at_100_layers": at100,
        "rows": rows,
    }
    write_json(args.out / "depth_scaling.json", summary)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, _, _ in CASES:
        pts = [(r["layers"], r["activation_gib"]) for r in rows if r["case"] == label]
        ax.plot(*zip(*pts, strict=True), marker="o", label=f"{label} (~L^{exponents[label]:.2f})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("layers (scanned)")
    ax.set_ylabel("activation memory, GiB (compiled, h100)")
    ax.set_title("Activation memory vs depth per checkpoint schedule")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, args.out / "depth_scaling.png")
    print(
        table(
            rows, ["layers", "case", "activation_gib", "units", "recompute_overhead", "xla_remat"]
        )
    )
    print("fitted exponents:", {k: round(v, 2) for k, v in exponents.items()})
    if at100:
        print("units at 100 layers:", {k: round(v, 1) for k, v in at100.items()})


if __name__ == "__main__":
    main()
