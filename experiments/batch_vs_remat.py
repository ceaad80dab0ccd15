"""Does checkpointing plus a larger batch train faster? And which GPU is cheapest per token?

Claims: checkpointing "enables 2-3x larger batch sizes ... directly improving training
throughput despite the per-step slowdown"; "balance batch size and gradient checkpointing".

Part ``throughput``: for gpt2-medium and bert-base on an RTX 4090 (seq 512, AdamW, mixed
precision) and Llama 3 8B on an H100 (seq 2048, bf16, SGD and AdamW), the predicted tokens/s
of each policy at its fastest fitting micro-batch (``rk.search.fastest``: the largest, or the
power of two under it), against ``none`` at its own largest batch. Step times are predicted
from each compiled program (remat_kit.timing), not measured.

Part ``cost``: ``rk.advise`` for Llama 3 8B, batch 8, seq 2048, with LoRA 16 and full
fine-tuning (AdamW, mixed), each GPU of the price table ranked by dollars per million tokens
(the fewest GPUs that fit, fsdp + full, where one does not).

Writes results/batch_vs_remat.json and results/batch_vs_remat.png.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from common import parse, save_png, table, write_json

#: (name, model, target, seq, optimizer, precision)
CASES = (
    ("gpt2-medium", "gpt2-medium", "rtx4090", 512, "adamw", None),
    ("bert-base", "bert-base", "rtx4090", 512, "adamw", None),
    ("llama3-8b sgd bf16", "llama3-8b", "h100", 2048, "sgd", "bf16"),
    ("llama3-8b adamw bf16", "llama3-8b", "h100", 2048, "adamw", "bf16"),
)
POLICIES = ("none", "full", "minimal", "block", "plan")
#: The GPUs the cost part ranks (those the price table prices).
COST_TARGETS = ("h100", "h200", "b200", "a100-80gb", "a100-40gb", "l40s", "rtx4090", "rtx-a6000")
COST_CASES = (("LoRA 16", 16), ("full fine-tuning", 0))


def throughput(args, only: set[str]) -> list[dict]:
    import remat_kit as rk
    from remat_kit_models.spec import PresetSpec

    out = []
    for name, model, target, seq, optimizer, precision in CASES:
        if only and name not in only:
            continue
        config = rk.TrainConfig(1, seq, optimizer=optimizer, precision=rk.train.regime(precision))
        w = rk.sources.workload(rk.sources.resolve(PresetSpec(model)), rk.target(target), config)
        policies = POLICIES[:3] if args.quick else POLICIES
        t0 = time.perf_counter()
        try:
            f = rk.search.fastest(w, policies)
        except rk.errors.DoesNotFit as err:
            out.append({"case": name, "target": target, "nothing_fits": str(err)})
            print(f"{name}: nothing fits ({err})")
            continue
        seconds = time.perf_counter() - t0
        win = f.winner
        out.append(
            {
                "case": name,
                "target": f.target,
                "seq": seq,
                "seconds": seconds,
                "compiles": f.compiles,
                "winner": None if win is None else win.name,
                "margin": f.margin,
                "baseline": None if f.baseline is None else f.baseline.to_dict(),
                "rows": [r.to_dict() for r in f.rows],
            }
        )
        rows = [
            {
                "policy": r.name,
                "batch": r.micro_batch,
                "step s": r.step_seconds,
                "tok/s": r.tokens_per_second,
                "MFU": r.mfu,
                "peak GiB": None if r.peak_bytes is None else r.peak_bytes / 2**30,
            }
            for r in f.rows
        ]
        print(table(rows, list(rows[0]), f"{name} on {f.target} ({seconds:.0f} s)"))
        if win is not None:
            print(f"winner {win.name}, {f.margin:+.1%} over none at its largest batch\n")
    return out


def cost(args) -> list[dict]:
    import dataclasses
    import functools

    import remat_kit as rk
    from remat_kit.search import gpus_needed
    from remat_kit_models.spec import PresetSpec

    def on(spec, config, t):
        return rk.sources.workload(rk.sources.resolve(spec), rk.target(t.name), config)

    def sharded(spec, config, name, n):
        if n > 1:
            spec = dataclasses.replace(spec, shard=f"fsdp:{n}")
        t = rk.target(name, devices=n, hosts=max(1, n // 8))
        return rk.sources.workload(rk.sources.resolve(spec), t, config)

    out = []
    for label, lora in COST_CASES[:1] if args.quick else COST_CASES:
        spec = PresetSpec("llama3-8b", lora=lora)
        config = rk.TrainConfig(8, 2048, lora=lora > 0)
        t0 = time.perf_counter()
        rows = rk.advise(functools.partial(on, spec, config), 8, targets=COST_TARGETS)
        scale = {
            a.target: gpus_needed(
                functools.partial(sharded, spec, config, a.target), 8, counts=(2, 4, 8, 16)
            )
            for a in rows
            if not a.fits
        }
        costs = rk.search.rank_costs([rk.search.cost_of(a, scale.get(a.target)) for a in rows])
        seconds = time.perf_counter() - t0
        printed = [
            {
                "target": c.target,
                "GPUs": c.gpus,
                "tok/s": c.tokens_per_second,
                "$/GPU-h": None if c.price is None else c.price.usd_per_gpu_hour,
                "$/Mtok": c.usd_per_million_tokens,
            }
            for c in costs
        ]
        print(table(printed, list(printed[0]), f"llama3-8b b8 s2048 {label} ({seconds:.0f} s)"))
        out.append(
            {
                "case": label,
                "seconds": seconds,
                "rows": [c.to_dict() for c in costs],
                "advice": [a.to_dict() for a in rows],
            }
        )
    return out


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv)
    only = {s for s in args.only.split(",") if s}
    parts = {"throughput", "cost"} & only or {"throughput", "cost"}
    cases = only - {"throughput", "cost"}
    # A part not run keeps what an earlier run wrote.
    path = args.out / "batch_vs_remat.json"
    data = {"throughput": [], "cost": []}
    if path.exists():
        data.update({k: v for k, v in json.loads(path.read_text()).items() if k in data})
    if "throughput" in parts:
        data["throughput"] = throughput(args, cases)
    if "cost" in parts:
        data["cost"] = cost(args)
    data["readme_rows"] = readme_rows(data)
    write_json(path, data)
    plot(data, args.out / "batch_vs_remat.png")


def readme_rows(data: dict) -> list[list[str]]:
    rows = []
    said = []
    for c in data["throughput"]:
        if c.get("winner") is None:
            if c.get("rows"):
                least = min(r["peak_bytes"] for r in c["rows"] if r["peak_bytes"])
                said.append(
                    f"{c['case']}: nothing fits {c['target']}, the least is "
                    f"{least / 2**30:.1f} GiB at batch 1"
                )
            continue
        base = c["baseline"]
        win = next(r for r in c["rows"] if r["name"] == c["winner"])
        name = "plan" if win["name"].startswith("plan") else win["name"]
        said.append(
            f"{c['case']}: none b{base['micro_batch']} {base['tokens_per_second']:,.0f} tok/s "
            f"-> {name} b{win['micro_batch']} {win['tokens_per_second']:,.0f} "
            f"({c['margin']:+.0%})"
        )
    if said:
        rows.append(
            [
                "checkpointing + a larger batch trains faster despite the recompute "
                "(predicted, each policy at its fastest batch that fits)",
                "faster",
                "; ".join(said),
                "`python experiments/batch_vs_remat.py --only throughput`",
            ]
        )
    for c in data["cost"]:
        priced = [r for r in c["rows"] if r["usd_per_million_tokens"] is not None]
        if priced:
            best = priced[0]
            gpus = f"{best['gpus']} x " if best["gpus"] > 1 else ""
            rows.append(
                [
                    f"cheapest GPU per token for Llama 3 8B {c['case']} (b8 s2048)",
                    "-",
                    f"{gpus}{best['target']}: ${best['usd_per_million_tokens']:.3f}/Mtok "
                    f"(price of {best['price']['date']}); next "
                    + ", ".join(
                        f"{_gpus(r)}{r['target']} ${r['usd_per_million_tokens']:.3f}"
                        for r in priced[1:3]
                    ),
                    "`python experiments/batch_vs_remat.py --only cost`",
                ]
            )
    return rows


def _gpus(row: dict) -> str:
    return f"{row['gpus']} x " if row["gpus"] > 1 else ""


def plot(data: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [c for c in data["throughput"] if c.get("rows")]
    if not cases:
        return
    fig, axes = plt.subplots(1, len(cases), figsize=(4.2 * len(cases), 4), squeeze=False)
    for ax, c in zip(axes[0], cases, strict=True):
        ax.set_title(f"{c['case']} on {c['target']}", fontsize=9)
        rows = [r for r in c["rows"] if r["tokens_per_second"]]
        if not rows:
            least = min(r["peak_bytes"] for r in c["rows"] if r["peak_bytes"])
            ax.text(0.5, 0.5, f"nothing fits:\nthe least is {least / 2**30:.1f} GiB at b1",
                    ha="center", va="center", transform=ax.transAxes)  # fmt: skip
            ax.set_axis_off()
            continue
        names = [r["name"].split(":")[0] for r in rows]
        vals = [r["tokens_per_second"] for r in rows]
        colors = ["tab:orange" if r["name"] == c["winner"] else "tab:blue" for r in rows]
        bars = ax.bar(range(len(rows)), vals, color=colors)
        for bar, r in zip(bars, rows, strict=True):
            top = (bar.get_x() + bar.get_width() / 2, bar.get_height())
            ax.annotate(f"b{r['micro_batch']}", top, ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(rows)), names, rotation=30, fontsize=7)
        ax.set_ylabel("predicted tokens/s")
    fig.suptitle(
        "tokens/s of each policy at its fastest batch that fits (predicted; the winner orange)",
        fontsize=10,
    )
    fig.tight_layout()
    save_png(fig, path)


if __name__ == "__main__":
    main()
