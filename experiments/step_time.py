"""Predicted step time (remat_kit.timing) against measured and published step times.

Three checks, each printed and saved to results/step_time.json (+ step_time.png):

1. **H100, measured here**: the steps results/gpu_calibration_h100.json timed on a lent H100 80GB
   (gpt2-medium b8 s1024, llama3.2-1b b4 s2048 mixed/AdamW; llama3-8b b4 s2048 bf16/SGD; five
   policies each), predicted from this machine's deviceless compile for ``h100``.
2. **Published MaxText runs** from 8 to 2,048 H100s (experiments/published_runs.py says which,
   with their sources): JAX-Toolbox's Llama2-7B on one DGX H100, MaxText's Llama2-7B on 1-16
   A3 VMs, dgxc-benchmarking's Llama2-70B on 64-2,048 GPUs of DGX H100s; each compiled
   deviceless in a process of its own with its script's XLA flags, for its node and mesh
   (results/step_time_published.png: the scaling curves).
3. **This CPU, measured now** (``--cpu``): small presets under none / full / minimal run for real
   on jax's CPU backend; the same walker prices the CPU compile with this CPU's measured rates
   (remat_kit.timing.measure_cpu_speed: products, loops by kind, fresh pages), and the step's
   fresh memory (remat_kit.timing.fresh_bytes_of). The policies' steps are timed in turn,
   round by round; each row gives, for every other policy, the rounds in which the one
   predicted faster ran faster.

``--quick`` runs the H100 llama3.2-1b rows and the CPU check only; ``--only h100,published``
picks parts. The JSON is rewritten after each part; parts not run keep their earlier rows.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import published_runs
from common import ROOT, parse, preset_report, save_png, table, write_json

import remat_kit as rk
from remat_kit.analysis import abstract
from remat_kit.policies import parse_policy
from remat_kit.schedules import parse_schedule
from remat_kit.timing import fresh_bytes_of, kernels_of, measure_cpu_speed, step_time
from remat_kit_models.spec import PresetSpec

MEASURED = ROOT / "results" / "gpu_calibration_h100.json"

#: (model, batch, seq, rounds of steps timed, overrides) run for real on this CPU. In the first
#: two the vocabulary's products, updates and first touches outweigh the layers, which are
#: all a policy changes (a per-kernel profile of gpt2-small: none's extra 0.24 s lay mostly
#: in the vocabulary-sized kernels every policy runs, where the page faults fell); in the
#: third the layers hold most of the step, so a policy's recomputation is what differs.
CPU_CASES = (
    ("gpt2-small", 2, 256, 6, (("layers", 4),)),
    ("llama3.2-1b", 1, 256, 5, (("layers", 2), ("vocab", 16384))),
    ("llama3.2-1b", 1, 512, 5, (("layers", 4), ("vocab", 2048))),
)
#: A pair of policies is measured apart when one ran faster in at least this share of the
#: rounds: a pair closer than that is within this machine's drift, and its order is noise.
CLEAR_SHARE = 0.8
CPU_POLICIES = ("none", "full", "minimal")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(__doc__, argv)
    parts = set(args.only.split(",")) if args.only else {"h100", "published", "cpu"}
    saved = args.out / "step_time.json"
    # parts not run now keep what an earlier run wrote
    out: dict[str, Any] = json.loads(saved.read_text()) if saved.exists() else {}
    if "h100" in parts:
        out["h100"] = _h100_rows(quick=args.quick)
        print(table(out["h100"], _H100_COLUMNS, "H100 80GB: predicted vs measured step time"))
        write_json(args.out / "step_time.json", out)
    if "published" in parts and not args.quick:
        out["published"] = published_runs.run_all()
        print(
            table(
                _published_table(out["published"]),
                _PUB_COLUMNS,
                "published MaxText runs, 8 to 2,048 GPUs",
            )
        )
        write_json(args.out / "step_time.json", out)
        _plot_published(out["published"], args.out / "step_time_published.png")
    if "cpu" in parts:
        out["cpu"] = _cpu_rows(quick=args.quick)
        print(table(out["cpu"], _CPU_COLUMNS, "this CPU: predicted vs measured step time"))
    write_json(args.out / "step_time.json", out)
    _plot(out, args.out / "step_time.png")
    return 0


_H100_COLUMNS = (
    "model",
    "policy",
    "measured s",
    "predicted s",
    "error",
    "FLOP overhead",
    "time overhead (pred)",
    "time overhead (meas)",
)


def _predict(
    spec: PresetSpec, config: rk.TrainConfig, policy: str, t: rk.Target
) -> tuple[Any, Any]:
    report = preset_report(spec, config, policy, t)
    return report, report.step_time


def _h100_rows(quick: bool) -> list[dict[str, Any]]:
    measured = json.loads(MEASURED.read_text())["parts"]["steps"]
    t = rk.target("h100")
    rows = []
    none_pred: dict[str, float] = {}
    none_meas: dict[str, float] = {}
    none_flops: dict[str, float] = {}
    for m in measured:
        if quick and m["model"] != "llama3.2-1b":
            continue
        config = rk.TrainConfig(
            m["batch"],
            m["seq"],
            optimizer=m["optimizer"],
            precision=rk.train.regime(m["precision"]),
        )
        report, st = _predict(PresetSpec(m["model"]), config, m["policy"], t)
        key = m["model"]
        if m["policy"] == "none":
            none_pred[key], none_flops[key] = st.seconds, report.flops
            if m.get("step_seconds"):
                none_meas[key] = m["step_seconds"]
        meas = m.get("step_seconds")
        rows.append(
            {
                "model": f"{m['model']} b{m['batch']} s{m['seq']} "
                f"{m['precision']}/{m['optimizer']}",
                "policy": m["policy"],
                "measured s": meas,
                "predicted s": st.seconds,
                "error": None if not meas else st.seconds / meas - 1,
                "flops": report.flops,
                "peak_gib": report.peak_bytes / 2**30,
                "fits": report.fits,
                "split": {k: round(v, 4) for k, v in st.split().items()},
                "recompute_seconds": st.recompute_seconds,
                "mfu": st.mfu,
                "ran": "OOM on the H100" if m.get("failed") else "ok",
                "_model": key,
            }
        )
    for r in rows:
        k = r.pop("_model")
        r["FLOP overhead"] = r["flops"] / none_flops[k] - 1 if k in none_flops else None
        r["time overhead (pred)"] = r["predicted s"] / none_pred[k] - 1 if k in none_pred else None
        r["time overhead (meas)"] = (
            r["measured s"] / none_meas[k] - 1 if k in none_meas and r["measured s"] else None
        )
    return rows


_PUB_COLUMNS = ("run", "gpus", "published s", "predicted s", "error", "exposed", "split")


def _published_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as the table prints them: the exposed share and the split in words."""
    return [
        {
            **r,
            "exposed": f"{r['exposed share']:.1%}",
            "split": " ".join(f"{k} {v:.3f}" for k, v in r["split"].items() if v),
        }
        for r in rows
    ]


_CPU_COLUMNS = (
    "model",
    "policy",
    "measured s",
    "predicted s",
    "error",
    "fresh GiB",
    "kernels only error",
    "ranking holds",
    "clear pairs held",
)


def _cpu_rows(quick: bool) -> list[dict[str, Any]]:
    import jax

    from remat_kit.validate import _next_args

    rows = []
    for model, batch, seq, rounds, overrides in CPU_CASES[:1] if quick else CPU_CASES:
        spec, config = PresetSpec(model, overrides=overrides), rk.TrainConfig(batch, seq)
        runs = {policy: [*cpu_step(spec, config, policy), []] for policy in CPU_POLICIES}
        # This VM's rates drift (bf16 products measured 84 and 170 GFLOP/s minutes apart):
        # they are measured three times, their medians taken, and the policies' steps are
        # timed in turn, round by round, so that a drift moves every policy alike. The
        # rates are measured before the first step: right after the first round of the
        # llama3.2-1b steps the same fill of fresh pages took 2.3x as long (with the same
        # faults), and a round later it was back to its first time.
        speeds = [measure_cpu_speed(1.5) for _ in range(3)]
        for _ in range(rounds + 1):  # the first round is a warm-up
            for run in runs.values():
                compiled, real, times = run
                start = time.perf_counter()
                tr, opt, _loss = jax.block_until_ready(compiled(*real))
                times.append(time.perf_counter() - start)
                run[1] = _next_args(real, tr, opt)
        speed = _median_speed(speeds)
        print(speed.sources[0], flush=True)
        case = []
        for policy, (compiled, _real, times) in runs.items():
            fresh = fresh_bytes_of(compiled.memory_analysis())
            kernels = kernels_of(compiled.as_text())
            predicted = step_time(kernels, speed, fresh_bytes=fresh).seconds
            # the walker without the fresh pages (its loops priced by kind all the same)
            kernels_only = step_time(kernels, speed).seconds
            meas = statistics.median(times[1:])
            case.append(
                {
                    "model": f"{model} {dict(overrides)} b{batch} s{seq}",
                    "policy": policy,
                    "measured s": meas,
                    "measured runs": times[1:],
                    "predicted s": predicted,
                    "error": predicted / meas - 1,
                    "fresh GiB": fresh / 2**30,
                    "kernels only s": kernels_only,
                    "kernels only error": kernels_only / meas - 1,
                    "rates": speed.sources[0],
                }
            )
        by_measured = [r["policy"] for r in sorted(case, key=lambda r: r["measured s"])]
        by_predicted = [r["policy"] for r in sorted(case, key=lambda r: r["predicted s"])]
        for r in case:
            r["ranking holds"] = by_measured == by_predicted
            # Each pair of policies, round by round: in how many rounds the one predicted
            # faster ran faster (a drift between rounds moves both of a pair alike).
            r["pairs"] = {
                q["policy"]: _rounds_agreeing(r, q) for q in case if q["policy"] != r["policy"]
            }
            clear = [q for q in case if q is not r and _measured_apart(r, q)]
            held = sum(
                (r["predicted s"] < q["predicted s"]) == (r["measured s"] < q["measured s"])
                for q in clear
            )
            r["clear pairs held"] = f"{held} of {len(clear)}"
            print(json.dumps(r), flush=True)
        rows += case
        del runs
    return rows


def cpu_step(spec: PresetSpec, config: rk.TrainConfig, policy: str) -> tuple[Any, Any]:
    """The train step of ``spec`` under ``config`` and ``policy`` compiled for this CPU, and
    random arguments of its shapes on it (``validate``'s own), ready to run."""
    import jax

    from remat_kit.validate import _random_like

    built = rk.sources.resolve(spec).build_step(
        parse_policy(policy),
        parse_schedule("none"),
        config,
        rk.target("cpu"),
        sharded=False,
    )
    step = built.step
    compiled = jax.jit(step.fn).lower(*(abstract(a) for a in step.args)).compile()
    return compiled, jax.jit(functools.partial(_random_like, step.args))()


def _rounds_agreeing(a: dict[str, Any], b: dict[str, Any]) -> str:
    """``"k of n"``: rounds in which the one of ``a``, ``b`` predicted faster ran faster."""
    faster_a = a["predicted s"] < b["predicted s"]
    rounds = list(zip(a["measured runs"], b["measured runs"], strict=True))
    agree = sum((ta < tb) == faster_a for ta, tb in rounds)
    return f"{agree} of {len(rounds)}"


def _measured_apart(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether one of ``a``, ``b`` ran faster in at least :data:`CLEAR_SHARE` of the rounds."""
    rounds = list(zip(a["measured runs"], b["measured runs"], strict=True))
    a_faster = sum(ta < tb for ta, tb in rounds)
    return max(a_faster, len(rounds) - a_faster) >= CLEAR_SHARE * len(rounds)


def _median_speed(speeds: Sequence[Any]) -> Any:
    """Each rate of ``speeds`` (Speed values measured in turn) at its median."""
    import dataclasses

    first = speeds[0]
    fields = {}
    for f in dataclasses.fields(first):
        values = [getattr(s, f.name) for s in speeds]
        if isinstance(values[0], float):
            fields[f.name] = statistics.median(values)
    loops = [
        (
            t,
            st,
            statistics.median(
                r for s in speeds for t2, st2, r in s.loop_rates if (t2, st2) == (t, st)
            ),
        )
        for t, st, _ in first.loop_rates
    ]
    flops = [s.peak_flops for s in speeds]
    summary = (
        f"median of {len(speeds)} measurements: bf16 products "
        f"{fields['peak_flops'] / 1e9:.0f} GFLOP/s (range {min(flops) / 1e9:.0f}-"
        f"{max(flops) / 1e9:.0f}), "
        f"in-place update {fields['memory_bandwidth'] / 1e9:.1f} GB/s, fresh pages "
        f"{fields['fresh_bytes_per_s'] / 1e9:.1f} GB/s"
    )
    return dataclasses.replace(first, **fields, loop_rates=tuple(loops), sources=(summary,))


def _plot_published(rows: list[dict[str, Any]], path: Any) -> None:
    """The scaling curves: step seconds, published and predicted, against the GPU count, one
    panel per family, with the predicted split as stacked bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = ("7b-a3", "70b-dgx", "7b-dgx")
    titles = {
        "7b-a3": "Llama2-7B on A3 (MaxText a3 README)",
        "70b-dgx": "Llama2-70B on DGX H100 (dgxc-benchmarking)",
        "7b-dgx": "Llama2-7B on one DGX H100 (JAX-Toolbox)",
    }
    parts = ("matmul", "attention", "memory", "collective", "contention", "launch")
    fig, axes = plt.subplots(1, 3, figsize=(16, 5), gridspec_kw={"width_ratios": [5, 6, 1.4]})
    for ax, family in zip(axes, families, strict=True):
        these = rows_of(rows, family)
        xs = list(range(len(these)))
        bottom = [0.0] * len(these)
        for part in parts:
            h = [r["split"].get(part, 0.0) for r in these]
            ax.bar(xs, h, bottom=bottom, width=0.6, label=part)
            bottom = [b + v for b, v in zip(bottom, h, strict=True)]
        ax.plot(xs, [r["published s"] for r in these], "k^-", label="published")
        ax.plot(xs, [r["predicted s"] for r in these], "rx--", label="predicted")
        for x, r in zip(xs, these, strict=True):
            ax.annotate(f"{r['error']:+.0%}", (x, r["published s"]), xytext=(0, 6),
                        textcoords="offset points", ha="center", fontsize=8)  # fmt: skip
        ax.set_xticks(xs, [str(r["gpus"]) for r in these])
        ax.set_xlabel("GPUs")
        ax.set_ylabel("seconds per step")
        ax.set_title(titles[family], fontsize=9)
    axes[0].legend(fontsize=7, loc="lower right")
    save_png(fig, path)


def rows_of(rows: list[dict[str, Any]], family: str) -> list[dict[str, Any]]:
    """The rows of one family, by GPU count."""
    return sorted((r for r in rows if r["family"] == family), key=lambda r: r["gpus"])


def _plot(out: dict[str, Any], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for ax, key, title in ((axes[0], "h100", "H100 80GB (lent)"), (axes[1], "cpu", "this CPU")):
        rows = [r for r in out.get(key, []) if r.get("measured s")]
        xs = [r["measured s"] for r in rows]
        ys = [r["predicted s"] for r in rows]
        ax.scatter(xs, ys)
        for r, x, y in zip(rows, xs, ys, strict=True):
            ax.annotate(r["policy"], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        lim = max(xs + ys) * 1.1 if xs else 1
        ax.plot([0, lim], [0, lim], "k--", lw=0.8)
        ax.set_xlabel("measured step s")
        ax.set_ylabel("predicted step s")
        ax.set_title(f"{title}: predicted vs measured")
    save_png(fig, path)


if __name__ == "__main__":
    sys.exit(main())
