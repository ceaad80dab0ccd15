"""Where the CPU check's time goes: each kernel of a step, measured and priced, per policy.

``step_time.py --only cpu`` compares whole steps. This script takes two of its cases apart,
for ``none`` against the recomputing policies:

- **per kernel**: three steps per policy are traced with ``jax.profiler``; each XLA:CPU kernel's
  time (the trace's events, by instruction name) stands beside the price the walker gives it
  (``remat_kit.timing.step_time`` of that kernel alone, at this CPU's measured rates). Grouped
  by kind (products; loops threaded or not, transposing or not), and the products by shape;
- **per step, by the kernel of the operating system**: ``getrusage`` around each step, in turn
  over rounds: wall, user and system seconds and the minor page faults (fresh pages).

Writes results/cpu_kernels.json and results/cpu_kernels.png.
"""

from __future__ import annotations

import collections
import glob
import resource
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from common import parse, save_png, table, write_json
from step_time import cpu_step

import remat_kit as rk
from remat_kit.timing import kernels_of, measure_cpu_speed, step_time
from remat_kit_models.spec import PresetSpec

#: (model, batch, seq, overrides, policies): step_time.py's CPU cases that it takes apart.
CASES = (
    ("gpt2-small", 2, 256, (("layers", 4),), ("none", "minimal")),
    ("llama3.2-1b", 1, 512, (("layers", 4), ("vocab", 2048)), ("none", "full", "minimal")),
)
PROFILED = 3
ROUNDS = 4


def _kernel_seconds(compiled: Any, real: Any) -> tuple[dict[str, float], Any]:
    """Mean seconds per XLA:CPU kernel (by instruction name) over PROFILED traced steps."""
    import jax

    from remat_kit.validate import _next_args

    for _ in range(2):  # warm-up
        tr, opt, _loss = jax.block_until_ready(compiled(*real))
        real = _next_args(real, tr, opt)
    spent: dict[str, float] = collections.defaultdict(float)
    for _ in range(PROFILED):
        with tempfile.TemporaryDirectory() as d:
            jax.profiler.start_trace(d)
            tr, opt, _loss = jax.block_until_ready(compiled(*real))
            jax.profiler.stop_trace()
            real = _next_args(real, tr, opt)
            (path,) = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
            for plane in jax.profiler.ProfileData.from_file(path).planes:
                for line in plane.lines:
                    if line.name.startswith("tf_XLA"):  # XLA:CPU's own threads
                        for ev in line.events:
                            spent[ev.name] += ev.duration_ns / 1e9 / PROFILED
    return spent, real


def _kinds(kernels: Sequence[Any], spent: dict[str, float], speed: Any) -> dict[str, Any]:
    """Measured and priced seconds per kind of kernel, and per product shape."""
    kinds: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    products: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for k in kernels:
        priced = step_time([k], speed).seconds
        kind = (
            k.kind
            if k.kind != "memory"
            else (
                f"loop, {'threaded' if k.parts > 1 else 'one thread'}"
                + (", transposing" if k.strided else "")
            )
        )
        for key, into in ((kind, kinds), (f"{k.m}x{k.n}x{k.k} b{k.batch} {k.dtype}", products)):
            if into is products and k.kind != "gemm":
                continue
            into[key][0] += spent.get(k.name, 0.0)
            into[key][1] += priced
            into[key][2] += k.count

    def fields(v: list[float]) -> dict[str, float]:
        return dict(zip(("measured_s", "priced_s", "count"), v, strict=True))

    top = sorted(products.items(), key=lambda kv: -kv[1][0])[:8]
    return {
        "kinds": {k: fields(v) for k, v in kinds.items()},
        "products": {k: fields(v) for k, v in top},
    }


def _rounds(runs: dict[str, list[Any]]) -> dict[str, dict[str, list[float]]]:
    """Per policy, per round (policies in turn): wall, user, system seconds, fault GiB."""
    import jax

    from remat_kit.validate import _next_args

    got = {p: collections.defaultdict(list) for p in runs}
    for _ in range(ROUNDS):
        for policy, run in runs.items():
            compiled, real = run
            before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            tr, opt, _loss = jax.block_until_ready(compiled(*real))
            wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
            run[1] = _next_args(real, tr, opt)
            got[policy]["wall_s"].append(wall)
            got[policy]["user_s"].append(after.ru_utime - before.ru_utime)
            got[policy]["system_s"].append(after.ru_stime - before.ru_stime)
            faults = (after.ru_minflt - before.ru_minflt) * resource.getpagesize()
            got[policy]["fault_gib"].append(faults / 2**30)
    return {p: dict(v) for p, v in got.items()}


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv)
    speed = measure_cpu_speed(2.0)
    print(speed.sources[0], flush=True)
    out: dict[str, Any] = {"rates": speed.sources[0], "cases": []}
    for model, batch, seq, overrides, policies in CASES:
        spec, config = PresetSpec(model, overrides=overrides), rk.TrainConfig(batch, seq)
        name = f"{model} {dict(overrides)} b{batch} s{seq}"
        runs, case = {}, {"model": name, "policies": {}}
        for policy in policies:
            compiled, real = cpu_step(spec, config, policy)
            spent, real = _kernel_seconds(compiled, real)
            runs[policy] = [compiled, real]
            case["policies"][policy] = _kinds(kernels_of(compiled.as_text()), spent, speed)
        for policy, figures in _rounds(runs).items():
            case["policies"][policy]["rounds"] = figures
        del runs
        out["cases"].append(case)
        rows = [
            {
                "model": name,
                "policy": policy,
                "kind": kind,
                "measured s": v["measured_s"],
                "priced s": v["priced_s"],
            }
            for policy, d in case["policies"].items()
            for kind, v in d["kinds"].items()
        ]
        print(table(rows, list(rows[0]), "kernels by kind, measured vs priced"), flush=True)
        steps = [
            {
                "policy": policy,
                **{
                    f"{key} (median)": statistics.median(d["rounds"][key])
                    for key in ("wall_s", "user_s", "system_s", "fault_gib")
                },
                "system s range": f"{min(d['rounds']['system_s']):.1f}-"
                f"{max(d['rounds']['system_s']):.1f}",
            }
            for policy, d in case["policies"].items()
        ]
        print(table(steps, list(steps[0]), f"{name}: a step, by getrusage"), flush=True)
    write_json(args.out / "cpu_kernels.json", out)
    _plot(out, args.out / "cpu_kernels.png")


def _plot(out: dict[str, Any], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = out["cases"]
    fig, axes = plt.subplots(1, len(cases), figsize=(6 * len(cases), 4))
    for ax, case in zip(axes, cases, strict=True):
        labels, measured, priced = [], [], []
        for policy, d in case["policies"].items():
            for kind, v in d["kinds"].items():
                labels.append(f"{policy}\n{kind}")
                measured.append(v["measured_s"])
                priced.append(v["priced_s"])
        xs = range(len(labels))
        ax.bar([x - 0.2 for x in xs], measured, width=0.4, label="measured (profile)")
        ax.bar([x + 0.2 for x in xs], priced, width=0.4, label="priced (walker)")
        ax.set_xticks(list(xs), labels, rotation=90, fontsize=6)
        ax.set_ylabel("seconds per step")
        ax.set_title(case["model"], fontsize=8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path)


if __name__ == "__main__":
    main()
