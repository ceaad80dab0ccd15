"""Does a GPU keep its speed when a train step runs for minutes? (issue 47's open question).

The step-time model's rates come from one H100 running each step 14 times (seconds). The
published multi-node MaxText runs are 15-30% slower than those rates predict
(results/step_time.json, ``published``), with the collectives' share right; a GPU held at its
700 W limit for minutes may run its clock, and so its kernels, slower than in a short burst.
This runs one train step back to back for ``--seconds`` (default 300) on the local GPU and
samples ``nvidia-smi`` once a second (SM clock, power, temperature, active throttle reasons):
the step time and the clock at the start against the last minute.

Writes results/sustained_clock.json and a PNG (step time and SM clock against elapsed time).
On a machine with no NVIDIA GPU it says so and exits 1, writing nothing.

Usage: ``python experiments/sustained_clock.py [--seconds 300] [--model llama3-8b]``
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

HAS_GPU = bool(glob.glob("/dev/nvidia[0-9]*"))
if HAS_GPU:
    os.environ.setdefault("JAX_PLATFORMS", "cuda,cpu")

from common import RESULTS, save_png, write_json  # noqa: E402

_QUERY = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=300.0)
    p.add_argument("--model", default="llama3-8b")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--policy", default="minimal")
    args = p.parse_args(argv)
    if not HAS_GPU:
        print(
            "sustained_clock: no NVIDIA GPU on this machine (no /dev/nvidia*); it measures a "
            "real GPU for minutes, so nothing was run and nothing written",
            file=sys.stderr,
        )
        return 1
    samples: list[dict[str, Any]] = []
    stop = threading.Event()
    start = time.perf_counter()
    poller = threading.Thread(target=_poll, args=(samples, stop, start), daemon=True)
    poller.start()
    steps, predicted = _run(args, start)
    stop.set()
    poller.join(timeout=5)
    out = _summary(args, steps, samples, predicted)
    write_json(RESULTS / "sustained_clock.json", out)
    _plot(out, RESULTS / "sustained_clock.png")
    s = out["summary"]
    print(
        f"{out['model']}: first 10 steps {s['first_median_s']:.4f} s, last minute "
        f"{s['last_median_s']:.4f} s ({s['slowdown']:+.1%}); SM clock {s['first_clock_mhz']} -> "
        f"{s['last_clock_mhz']} MHz; predicted {predicted:.4f} s"
    )
    return 0


def _run(args: argparse.Namespace, start: float) -> tuple[list[tuple[float, float]], float]:
    """The step back to back until ``args.seconds`` have passed: (elapsed, seconds) each."""
    import jax
    from jax.sharding import SingleDeviceSharding

    import remat_kit as rk
    from remat_kit.policies import parse_policy
    from remat_kit.schedules import parse_schedule
    from remat_kit.validate import _next_args, _random_like, match_target
    from remat_kit_models.spec import PresetSpec

    device = jax.devices()[0]
    t = match_target(device.device_kind)
    config = rk.TrainConfig(
        args.batch, args.seq, optimizer="sgd", precision=rk.train.regime("bf16")
    )
    built = rk.sources.resolve(PresetSpec(args.model)).build_step(
        parse_policy(args.policy), parse_schedule("none"), config, t, sharded=False
    )
    step = built.step
    predicted = rk.memory_report(
        step.fn, *step.args, target=t, donate_argnums=step.donate_argnums, warn=False
    ).step_time.seconds
    sharding = SingleDeviceSharding(device)
    placed = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), step.args
    )
    compiled = jax.jit(step.fn, donate_argnums=step.donate_argnums).lower(*placed).compile()
    make = jax.jit(
        lambda: _random_like(step.args), out_shardings=jax.tree.map(lambda _: sharding, step.args)
    )
    state = jax.block_until_ready(make())
    times = []
    while time.perf_counter() - start < args.seconds or len(times) < 12:
        t0 = time.perf_counter()
        tr, opt, loss = compiled(*state)
        jax.block_until_ready((tr, opt, loss))
        times.append((t0 - start, time.perf_counter() - t0))
        state = _next_args(state, tr, opt)
    return times, predicted


def _poll(samples: list[dict[str, Any]], stop: threading.Event, start: float) -> None:
    while not stop.is_set():
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={_QUERY}", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            check=False,
        )
        fields = [f.strip() for f in done.stdout.strip().split(",")]
        if len(fields) == 4:
            clock, power, temp, reasons = fields
            samples.append(
                {
                    "t": time.perf_counter() - start,
                    "clock_mhz": float(clock),
                    "power_w": float(power),
                    "temp_c": float(temp),
                    "throttle": reasons,
                }
            )
        stop.wait(1.0)


def _summary(
    args: argparse.Namespace,
    steps: list[tuple[float, float]],
    samples: list[dict[str, Any]],
    predicted: float,
) -> dict[str, Any]:
    end = steps[-1][0]
    first = [s for _, s in steps[1:11]]  # the first is a warm-up
    last = [s for t, s in steps if t >= end - 60] or [s for _, s in steps[-10:]]
    clocks_first = [x["clock_mhz"] for x in samples if x["t"] <= steps[10][0]]
    clocks_last = [x["clock_mhz"] for x in samples if x["t"] >= end - 60]
    return {
        "model": f"{args.model} b{args.batch} s{args.seq} bf16/sgd {args.policy}",
        "predicted_s": predicted,
        "steps": [{"t": t, "seconds": s} for t, s in steps],
        "samples": samples,
        "summary": {
            "first_median_s": statistics.median(first),
            "last_median_s": statistics.median(last),
            "slowdown": statistics.median(last) / statistics.median(first) - 1,
            "first_clock_mhz": statistics.median(clocks_first) if clocks_first else None,
            "last_clock_mhz": statistics.median(clocks_last) if clocks_last else None,
            "throttle_reasons_last_minute": sorted(
                {x["throttle"] for x in samples if x["t"] >= end - 60}
            ),
        },
    }


def _plot(out: dict[str, Any], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.plot([s["t"] for s in out["steps"]], [s["seconds"] for s in out["steps"]], ".", ms=3)
    ax.axhline(out["predicted_s"], color="r", ls="--", lw=0.8, label="predicted")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("step seconds")
    ax.legend(loc="upper left")
    clock = ax.twinx()
    clock.plot([x["t"] for x in out["samples"]], [x["clock_mhz"] for x in out["samples"]], "g-")
    clock.set_ylabel("SM clock MHz", color="g")
    ax.set_title(out["model"])
    save_png(fig, path)


if __name__ == "__main__":
    sys.exit(main())
