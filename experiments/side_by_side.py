"""``fit`` on an unrolled model with the two sides of its boundary compiled side by side.

Issue 29 found the floor of ``fit`` on an unrolled model: its answer rests on two full-depth
compiles (the largest batch that fits and the next, which does not), and one by one they
cost more than the whole scanned fit. With ``--jobs 2`` (or ``--cluster``) the second goes
to a worker process while the first compiles here (``rk.sources.Spread``,
``Workload.compile_all``), wherever a compile of the search took longer than a worker takes
to start (``remat_kit.sources._spread.SLOW_SECONDS``).

Times, as fresh processes with empty compile caches (a new user's first run), paired (every
case in turn, :data:`RUNS` rounds, medians): ``remat-kit fit --policy full`` on the 32-layer
Llama of ``experiments/unrolled_speed.py`` scanned, unrolled from shallow copies (``--depth
auto``) and unrolled at full depth, each with ``--jobs 1`` and ``--jobs 2``, and at full
depth with ``--cluster`` on a one-worker Dask cluster on 127.0.0.1 (``--only CASE,...`` runs
some cases and keeps the others' times from the JSON). Also the time a spawned worker takes
to start: import jax and remat-kit, build the unrolled step and trace
it (what it does before its compile), from submitting the task to its answer.

Writes results/side_by_side.json and results/side_by_side.png.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence

from common import parse, save_png, table, write_json
from unrolled_speed import _request, _run

#: Paired rounds of the fit cases.
RUNS = 2

#: The cases: (name, extra flags).
CASES = {
    "scanned --jobs 1": ["--jobs", "1"],
    "unrolled auto --jobs 1": ["--no-scan", "--jobs", "1"],
    "unrolled auto --jobs 2": ["--no-scan", "--jobs", "2"],
    "unrolled full --jobs 1": ["--no-scan", "--depth", "full", "--jobs", "1"],
    "unrolled full --jobs 2": ["--no-scan", "--depth", "full", "--jobs", "2"],
    # A Dask cluster of one worker process on 127.0.0.1, started for the run (not timed):
    # the far side goes to it instead of a spawned worker.
    "unrolled full --cluster (1 worker)": ["--no-scan", "--depth", "full", "--jobs", "1"],
}

FIT = ["fit", "--policy", "full"]


def _started(target: str) -> float:
    """In a spawned worker: import, build the unrolled step, trace it (seconds of the trace
    and build only; the caller times the whole)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import remat_kit as rk

    rk.cache.set_enabled(False)  # a trace remembered on disk would not be a first start
    t0 = time.perf_counter()
    spec, config = _request()
    w = rk.sources.workload(rk.sources.resolve(spec), target, config)
    w.flops("full", batch=18)
    return time.perf_counter() - t0


def worker_start(target: str, rounds: int) -> list[float]:
    """Seconds from submitting to a fresh spawned worker to its traced step, ``rounds`` times."""
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        with concurrent.futures.ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn")
        ) as pool:
            pool.submit(_started, target).result()
        out.append(time.perf_counter() - t0)
        print(f"worker start: {out[-1]:.1f} s", flush=True)
    return out


@contextlib.contextmanager
def _cluster(case: str) -> Iterator[list[str]]:
    """For a ``--cluster`` case: a fresh ``LocalCluster`` (its workers' own empty cache) and
    the flag naming it; else nothing."""
    if "--cluster" not in case:
        yield []
        return
    from distributed import LocalCluster

    with (
        tempfile.TemporaryDirectory(prefix="rk_workers_") as cache,
        LocalCluster(
            n_workers=int(case.split("(")[1].split()[0]),
            processes=True,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address=None,
            worker_dashboard_address=None,
            env={"JAX_PLATFORMS": "cpu", "REMAT_KIT_CACHE_DIR": cache},
        ) as lc,
    ):
        yield ["--cluster", lc.scheduler_address]


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv)
    rounds = 1 if args.quick else RUNS
    starts = worker_start(args.target, rounds + 1)
    cases = {k: v for k, v in CASES.items() if not args.only or k in args.only.split(",")}
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for name, extra in cases.items():
            with _cluster(name) as more:
                times[name].append(_run(FIT, [*extra, *more], args.target))
            print(f"fit {name}: {times[name][-1]:.1f} s", flush=True)
    out = args.out / "side_by_side.json"
    kept = json.loads(out.read_text())["fit"] if args.only and out.is_file() else []
    for row in kept:  # the cases not run this time, as the last full run measured them
        if row["case"] not in times:
            times[row["case"]] = row["runs_s"]
    scanned = statistics.median(times["scanned --jobs 1"])
    rows = []
    for name, ts in times.items():
        one = times.get(name.split(" --")[0] + " --jobs 1", ts)
        rows.append(
            {
                "case": name,
                "median_s": statistics.median(ts),
                "runs_s": ts,
                "vs_scanned": statistics.median(ts) / scanned,
                "vs_jobs_1": statistics.median(ts) / statistics.median(one),
            }
        )
    print(table(rows, ["case", "median_s", "vs_scanned", "vs_jobs_1"], "fit --policy full, s"))
    print(f"worker start (spawn, import, build, trace): median {statistics.median(starts):.1f} s")
    write_json(
        args.out / "side_by_side.json",
        {
            "fit": rows,
            "worker_start_s": starts,
            "cpus": os.cpu_count(),
            "load_at_end": os.getloadavg(),
            "python": sys.version.split()[0],
        },
    )

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.barh([r["case"] for r in rows], [r["median_s"] for r in rows], color="tab:blue")
    for i, r in enumerate(rows):
        ax.text(r["median_s"], i, f" {r['median_s']:.0f} s ({r['vs_scanned']:.1f}x)", va="center")
    ax.invert_yaxis()
    ax.set_xlabel("wall time of fit --policy full, s (median, empty caches)")
    ax.set_title(f"unrolled 32-layer Llama, {args.target}: the boundary side by side", fontsize=9)
    fig.tight_layout()
    save_png(fig, args.out / "side_by_side.png")


if __name__ == "__main__":
    main()
