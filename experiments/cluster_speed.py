"""Compiles fanned out to a Dask cluster on loopback: wall time with 1, 2 and 4 workers.

Two sweeps on tiny-llama: ``remat-kit advise --scale-out`` (a batch that one L4 or RTX 4090
cannot hold, so ``--scale-out`` compiles fsdp over more of them) and ``remat-kit fit
--objective throughput`` (its catalogue policies searched side by side, the planner after
them). Each is timed in a fresh process with empty caches (a new user's first run):
everything in this process (``--jobs 1``; fit has no other local mode), today's local pool
(``--jobs 2``, advise only), and ``--cluster`` on a ``distributed.LocalCluster`` of 1, 2
and 4 worker processes (one thread each) on 127.0.0.1; the answers of every mode must agree.
For each: the command's wall time (the cluster's start apart), the programs compiled here and
on the workers, and each worker item's peak resident memory (the worker process, jax
imported, sampled every 20 ms), so a user can size a cluster.

What bounds the speed-up here: the machine's cores (``os.cpu_count()`` and the load average
are recorded; other work shares them), the first compile, which runs in this process before
the rest go out (how a cold sweep is told from a warm one), and the longest target's chain of
dependent compiles (a target's plan, then its max batch; a count of ``--scale-out`` after the
one before).

Writes results/cluster_speed.json and results/cluster_speed.png.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from common import GIB, ROOT, parse, save_png, table, write_json

TARGETS = "h100,a100-40gb,l4,rtx4090"
COMMANDS = {
    "advise": (
        "advise",
        *("--model", "tiny-llama", "--batch", "4096", "--seq", "4096"),
        *("--targets", TARGETS, "--scale-out"),
    ),
    "fit": (
        "fit",
        *("--model", "tiny-llama", "--seq", "4096", "--target", "l4"),
        *("--objective", "throughput"),
    ),
}
MODES = {
    "advise": ("here", "pool2", "cluster1", "cluster2", "cluster4"),
    "fit": ("here", "cluster1", "cluster2", "cluster4"),
}


def _answers(command: str, rows) -> list:
    """What the command answered, to check every mode agrees."""
    if command == "advise":
        return [
            (r["target"], r["fits"], r["plan"], (r["scale_out"] or {}).get("devices")) for r in rows
        ]
    return [
        (r["name"], r["micro_batch"], r["accum"], r["peak_bytes"], r["tokens_per_second"])
        for r in rows["rows"]
    ]


def one(command: str, mode: str) -> dict:
    """Runs ``COMMANDS[command]`` once in ``mode`` (this process must be fresh); figures."""
    from remat_kit import _workers, cache
    from remat_kit.cli import main

    tmp = tempfile.mkdtemp(prefix="cluster_speed_")
    os.environ[cache.ENV_DIR] = os.path.join(tmp, "client")
    argv = list(COMMANDS[command])
    lc = None
    started = None
    if mode.startswith("cluster"):
        from distributed import LocalCluster

        t0 = time.perf_counter()
        lc = LocalCluster(
            n_workers=int(mode.removeprefix("cluster")),
            processes=True,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address=None,
            worker_dashboard_address=None,
            env={"JAX_PLATFORMS": "cpu", cache.ENV_DIR: os.path.join(tmp, "workers")},
        )
        started = time.perf_counter() - t0
        argv += ["--cluster", lc.scheduler_address]
    elif command == "advise":
        argv += ["--jobs", "1" if mode == "here" else "2"]
    load = os.getloadavg()[0]
    before = cache.compiles()
    t0 = time.perf_counter()
    code = main([*argv, "--json", os.path.join(tmp, "out.json")])
    seconds = time.perf_counter() - t0
    here = cache.compiles() - before
    remote = _workers.remote_stats()
    if lc is not None:
        lc.close()
    with open(os.path.join(tmp, "out.json"), encoding="utf-8") as f:
        rows = json.load(f)
    return {
        "command": command,
        "mode": mode,
        "exit_code": code,
        "seconds": seconds,
        "cluster_start_seconds": started,
        "compiles_here": here,
        "compiles_remote": sum(d.compiles for d in remote),
        "items_remote": len(remote),
        "remote_items": [
            {
                "seconds": d.seconds,
                "compiles": d.compiles,
                "peak_rss_bytes": d.peak_rss_bytes,
                "start_rss_bytes": d.start_rss_bytes,
                "worker": d.worker,
            }
            for d in remote
        ],
        "load_at_start": load,
        # fit counts its own compiles, wherever they ran (here and the workers' items).
        "compiles_reported": rows.get("compiles") if isinstance(rows, dict) else None,
        "answers": _answers(command, rows),
    }


def measure(command: str, mode: str) -> dict:
    """:func:`one` in a fresh Python (its own jax, caches and cluster)."""
    out = subprocess.run(
        [sys.executable, __file__, "--one", command, mode],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def plot(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, command in zip(axes, COMMANDS, strict=False):
        mine = [r for r in rows if r["command"] == command]
        ax.bar([r["mode"] for r in mine], [r["seconds"] for r in mine], color="tab:blue")
        for i, r in enumerate(mine):
            ax.text(
                i,
                r["seconds"],
                f"{r['compiles_here']}+{r['compiles_remote']}",
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_ylabel("wall time (s)")
        ax.set_title(
            f"{command} (compiles here+workers)\n{os.cpu_count()} cores, shared", fontsize=9
        )
    peaks = [i["peak_rss_bytes"] / GIB for r in rows for i in r["remote_items"]]
    if peaks:
        axes[2].hist(peaks, bins=12, color="tab:orange")
    axes[2].set_xlabel("worker peak resident memory per item (GiB)")
    axes[2].set_ylabel("items")
    fig.tight_layout()
    save_png(fig, path)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--one"]:
        print(json.dumps(one(argv[1], argv[2])))
        return
    args = parse(__doc__, argv)
    rows = []
    for command, modes in MODES.items():
        for mode in modes:
            if args.only and f"{command}:{mode}" not in args.only.split(","):
                continue
            rows.append(measure(command, mode))
            print(
                json.dumps({k: v for k, v in rows[-1].items() if k != "remote_items"}), flush=True
            )
    for command in COMMANDS:
        answers = {json.dumps(r["answers"]) for r in rows if r["command"] == command}
        assert len(answers) <= 1, f"{command}: the modes answered differently: {answers}"
    peaks = [i["peak_rss_bytes"] for r in rows for i in r["remote_items"] if i["peak_rss_bytes"]]
    data = {
        "commands": {c: "remat-kit " + " ".join(argv) for c, argv in COMMANDS.items()},
        "cpu_count": os.cpu_count(),
        "rows": rows,
        "peak_rss_bytes_max": max(peaks, default=None),
    }
    write_json(args.out / "cluster_speed.json", data)
    plot(rows, args.out / "cluster_speed.png")
    print(
        table(
            [
                {
                    "command": r["command"],
                    "mode": r["mode"],
                    "s": f"{r['seconds']:.1f}",
                    "compiles here": r["compiles_here"],
                    "compiles remote": r["compiles_remote"],
                    "load": f"{r['load_at_start']:.1f}",
                }
                for r in rows
            ],
            ["command", "mode", "s", "compiles here", "compiles remote", "load"],
            "cluster_speed",
        )
    )


if __name__ == "__main__":
    main()
