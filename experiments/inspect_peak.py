"""What is live at the peak of a llama3-8b train step on an H100, and what does inspecting cost?

Issue 7: for llama3-8b b4 s2048 (adamw, the attention an H100 user runs) under full, minimal and
none: the top 10 buffers live at the peak and the bytes by category; the memory timeline of
minimal as a PNG; and the wall time of rk.inspect over a plain report of the same step (goal:
under 30% more). Writes results/inspect_peak.json and results/inspect_timeline_minimal.png.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence

from common import GIB, parse, table, write_json

POLICIES = ("full", "minimal", "none")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv)
    import remat_kit as rk
    import remat_kit.render
    import remat_kit_models as models
    from remat_kit_models.configure import model_config
    from remat_kit_models.spec import PresetSpec

    target = rk.target(args.target)
    layers = (("layers", 4),) if args.quick else ()
    spec = PresetSpec("llama3-8b", overrides=layers)
    source = rk.sources.resolve(spec)
    # The default regime, named: the inspected step is built here (not by the source, which
    # trains in it too) and the timeline states its dtypes.
    config = rk.TrainConfig(4, 2048, precision=rk.train.regime())
    # Warm-up: the first compile in a process pays for loading the CUDA compiler plugin.
    warm = rk.sources.resolve(PresetSpec("llama3-8b", overrides=(("layers", 2),)))
    rk.sources.measure(warm, "full", target, rk.TrainConfig(1, 256, optimizer="sgd"), warn=False)

    summary, tops, cats = [], [], []
    reports = {}
    for policy in POLICIES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            start = time.perf_counter()
            plain = rk.sources.measure(source, policy, target, config, warn=False)
            plain_s = time.perf_counter() - start
            start = time.perf_counter()
            cfg = model_config(spec, config, rk.as_policy(policy), target)
            step = rk.build_train_step(models.build(cfg), config)
            r = rk.peak.inspect_step(
                step, target, meta={"policy": policy, "attention": cfg.attention}
            )
            inspect_s = time.perf_counter() - start
        reports[policy] = r
        summary.append(
            {
                "policy": policy,
                "attention": cfg.attention,
                "peak_gib": r.peak_bytes / GIB,
                "report_peak_gib": plain.peak_bytes / GIB,
                "live_peak_gib": r.live_peak_bytes / GIB,
                "peak_at": f"{r.peak_position}/{r.schedule_length} {r.peak_phase}",
                "report_s": plain_s,
                "inspect_s": inspect_s,
                "added": inspect_s / plain_s - 1.0,
            }
        )
        for b in r.top(10):
            tops.append(
                {
                    "policy": policy,
                    "MiB": b.size_bytes / 2**20,
                    "category": b.category,
                    "checkpoint": b.checkpoint_name,
                    "shape": f"{b.dtype}[{','.join(map(str, b.shape))}]",
                    "layer": b.layer,
                    "module/op": b.module_path[-60:],
                }
            )
        cats.append({"policy": policy, **{c: v / GIB for c, v in r.by_category.items()}})
        if policy == "minimal":
            rk.render.plot_timeline(
                r,
                args.out / "inspect_timeline_minimal.png",
                title=f"llama3-8b b4 s2048 minimal ({cfg.attention}) on {target.name}",
                memory_bytes=target.memory_bytes,
                usable_bytes=target.usable_bytes,
                precision=rk.train.planned_precision(config, own_compute=source.own_model),
            )
    d = rk.peak.diff(reports["full"], reports["none"])
    write_json(
        args.out / "inspect_peak.json",
        {
            "target": target.name,
            "model": "llama3-8b",
            "batch": 4,
            "seq": 2048,
            "summary": summary,
            "top10": tops,
            "by_category_gib": cats,
            "diff_full_to_none": d.to_dict(),
            "reports": {p: r.to_dict() for p, r in reports.items()},
        },
    )
    print(
        table(
            summary,
            [
                "policy",
                "attention",
                "peak_gib",
                "report_peak_gib",
                "live_peak_gib",
                "peak_at",
                "report_s",
                "inspect_s",
                "added",
            ],
            "llama3-8b b4 s2048: peak and inspect cost",
        )
    )
    print(table(cats, ["policy", *reports["full"].by_category], "GiB by category at the peak"))
    print(
        table(
            tops,
            ["policy", "MiB", "category", "checkpoint", "shape", "layer", "module/op"],
            "top 10 buffers at the peak",
        )
    )
    rows = [
        {"category": c, "label": lab[-60:], "full_MiB": x / 2**20, "none_MiB": y / 2**20}
        for c, lab, x, y in d.kept[:10]
    ]
    print(
        table(
            rows,
            ["category", "label", "full_MiB", "none_MiB"],
            "what none keeps that full does not",
        )
    )


if __name__ == "__main__":
    main()
