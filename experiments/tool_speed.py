"""How fast does remat-kit answer? Whole commands, cold and warm cache, 1 or 2 processes (issue 16).

Goals (2 cores; median of 3): ``compare`` of the 11 main policies for llama3-8b b4 s2048 on h100
<= 30 s cold and <= 5 s warm; ``fit`` one policy <= 3 compiles and <= 15 s, four policies
<= 45 s; ``plan`` llama3-8b b4 s2048 at 52 GiB <= 60 s and <= 4 compiles, recompute only
<= +7% with einsum attention (proven optimal on the cost model), with offload <= +3.4%;
``advise`` over the catalogue's GPUs (11) <= 60 s, ``advise --scale-out`` <= 120 s.

Every figure is the wall time of the whole ``remat-kit`` command in a fresh process (imports
included), as a user sees it. "cold": an empty cache directory (``REMAT_KIT_CACHE_DIR``) per
run; "warm": the same command again on the cache the cold run left. ``--jobs 1`` and
``--jobs 2`` are timed side by side where the command takes ``--jobs``. The machine's core
count and load average are recorded with the figures: this machine is shared, so they are
noisy. Writes results/tool_speed.json (after every command, so a long run keeps what it has)
and prints a table. ``--quick``: tiny-llama, one run each (a smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import RESULTS, ROOT, table, write_json

LLAMA = ["--model", "llama3-8b", "--target", "h100", "--batch", "4", "--seq", "2048"]
#: The plan/fit setting of the issue: SGD, bf16 weights (AdamW's state does not fit 80 GB).
SGD = ["--optimizer", "sgd", "--param-dtype", "bf16"]
TINY = ["--model", "tiny-llama", "--target", "h100", "--batch", "2", "--seq", "64"]


def _cases(quick: bool) -> list[dict[str, Any]]:
    """The goal commands: (name, argv, goal seconds, goal compiles, takes --jobs)."""
    m = TINY if quick else LLAMA
    searched = [a for i, a in enumerate(m) if "--batch" not in m[i - 1 : i + 1]]  # fit: no --batch
    sgd = [] if quick else SGD
    big = ["--model", "tiny-llama", "--batch", "2", "--seq", "64"] if quick else [
        "--model", "llama3-8b", "--batch", "8", "--seq", "2048",
    ]  # fmt: skip
    return [
        dict(name="compare 11 policies", argv=["compare", *m], goal_s=(30, 5), jobs=True),
        dict(
            name="fit 1 policy",
            argv=["fit", *searched, *sgd, "--policy", "full"],
            goal_s=(15, None),
            goal_compiles=3,
        ),
        dict(
            name="fit 4 policies",
            argv=["fit", *searched, *sgd, "--policies", "none,full,minimal,plan"],
            goal_s=(45, None),
        ),
        dict(
            name="plan 52GiB recompute-only xla",
            argv=[
                "plan",
                *m,
                *sgd,
                "--attention",
                "xla",
                "--no-offload",
                *(["--budget", "52GiB"] if not quick else []),
            ],
            goal_s=(60, None),
            goal_compiles=4,
            goal_overhead=0.07,
        ),
        dict(
            name="plan 52GiB offload xla",
            argv=[
                "plan",
                *m,
                *sgd,
                "--attention",
                "xla",
                *(["--budget", "52GiB"] if not quick else []),
            ],
            goal_s=(60, None),
            goal_compiles=4,
            goal_overhead=0.034,
        ),
        dict(name="advise every GPU", argv=["advise", *big], goal_s=(60, None), jobs=True),
        # AdamW's f32 state fits no single GPU above: the same with SGD and bf16 weights,
        # where the large cards fit and every target is planned and searched by compiling.
        dict(
            name="advise every GPU sgd bf16",
            argv=["advise", *big, *sgd],
            goal_s=(60, None),
            jobs=True,
        ),
        dict(
            name="advise --scale-out",
            argv=["advise", *big, "--scale-out"],
            goal_s=(120, None),
            jobs=True,
        ),
    ]


def _run(argv: Sequence[str], cache_dir: Path, json_path: Path) -> dict[str, Any]:
    """One whole command in a fresh process: wall seconds, exit code, its --json output."""
    env = {**os.environ, "REMAT_KIT_CACHE_DIR": str(cache_dir), "JAX_PLATFORMS": "cpu"}
    env.pop("REMAT_KIT_NO_CACHE", None)
    cmd = [sys.executable, "-m", "remat_kit.cli", *argv, "--json", str(json_path)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    out: dict[str, Any] = {"seconds": seconds, "exit": proc.returncode}
    if proc.returncode not in (0, 1):
        out["stderr"] = proc.stderr[-2000:]
    try:
        out["json"] = json.loads(json_path.read_text())
    except (OSError, ValueError):
        out["json"] = None
    return out


def _facts(case: dict[str, Any], got: dict[str, Any]) -> dict[str, Any]:
    """Compiles, overhead and solver status from a command's --json, where it has them."""
    data = got.get("json")
    facts: dict[str, Any] = {}
    if isinstance(data, dict) and "plan" in data:
        p = data["plan"]
        cands = p.get("candidates") or []
        facts.update(
            compiles=p.get("compiles"),
            # The planner's own compiles; "catalogue" ones are the policies shown beside the
            # plan, which the front would compile anyway.
            solver_compiles=sum(c.get("label") != "catalogue" for c in cands),
            catalogue_compiles=sum(c.get("label") == "catalogue" for c in cands),
            plan_seconds=data.get("plan_seconds"),
            overhead=p.get("overhead"),
            policy=p.get("policy"),
            schedule=p.get("schedule"),
            fits=p.get("fits"),
            solver=(p.get("solver") or {}).get("status"),
            solver_gap=(p.get("solver") or {}).get("gap"),
        )
    elif isinstance(data, dict) and "rows" in data:
        facts.update(
            compiles=data.get("compiles"),
            max_batch={r["label"]: r["batch"] for r in data["rows"]},
            methods={r["label"]: r.get("method") for r in data["rows"]},
        )
    elif isinstance(data, list) and data and "fixed_bytes" in data[0]:
        facts.update(
            fits={a["target"]: a["fits"] for a in data},
            scale_out={
                a["target"]: (a.get("scale_out") or {}).get("devices")
                for a in data
                if a.get("scale_out")
            },
        )
    return facts


def _measure(case: dict[str, Any], jobs: int | None, repeats: int, work: Path) -> dict[str, Any]:
    argv = list(case["argv"]) + ([] if jobs is None else ["--jobs", str(jobs)])
    cold, warm, facts = [], [], {}
    for i in range(repeats):
        cache = work / f"cache-{case['name'].replace(' ', '_')}-{jobs}-{i}"
        shutil.rmtree(cache, ignore_errors=True)
        got = _run(argv, cache, work / "out.json")
        cold.append(got["seconds"])
        facts = _facts(case, got) or facts
        if got["exit"] not in (0, 1):
            return {"argv": argv, "jobs": jobs, "error": got.get("stderr"), "cold_s": cold}
        again = _run(argv, cache, work / "out.json")
        warm.append(again["seconds"])
        shutil.rmtree(cache, ignore_errors=True)
    return {
        "argv": argv,
        "jobs": jobs,
        "cold_s": cold,
        "warm_s": warm,
        "cold_median_s": statistics.median(cold),
        "warm_median_s": statistics.median(warm),
        **facts,
    }


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--quick", action="store_true", help="tiny-llama, one run each")
    p.add_argument("--repeats", type=int, default=None, help="runs per figure (default 3)")
    p.add_argument("--only", default=None, help="comma-separated case names (substrings)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    cases = _cases(args.quick)
    if args.only:
        keys = [k.strip() for k in args.only.split(",")]
        cases = [c for c in cases if any(k in c["name"] for k in keys)]
    out_path = args.out / ("tool_speed_quick.json" if args.quick else "tool_speed.json")
    result: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "load_average_start": os.getloadavg(),
        "repeats": repeats,
        "quick": args.quick,
        "rows": [],
    }
    if args.only and out_path.exists():
        # A partial run replaces its own rows and keeps the others.
        names = {c["name"] for c in cases}
        kept = json.loads(out_path.read_text()).get("rows", [])
        result["rows"] = [r for r in kept if r.get("case") not in names]
    with tempfile.TemporaryDirectory(prefix="tool_speed_") as tmp:
        work = Path(tmp)
        for case in cases:
            for jobs in (1, 2) if case.get("jobs") else (None,):
                row = {"case": case["name"], **_measure(case, jobs, repeats, work)}
                row["goal_cold_s"], row["goal_warm_s"] = case["goal_s"]
                row["goal_compiles"] = case.get("goal_compiles")
                row["goal_overhead"] = case.get("goal_overhead")
                row["load_average"] = os.getloadavg()
                result["rows"].append(row)
                write_json(out_path, result)  # keep what we have
                print(f"{row['case']} jobs={jobs}: {row.get('cold_median_s')} s cold", flush=True)
    result["load_average_end"] = os.getloadavg()
    write_json(out_path, result)
    shown = [
        {
            "command": r["case"],
            "jobs": r["jobs"] or "-",
            "cold s": f"{r['cold_median_s']:.1f}" if "cold_median_s" in r else "error",
            "warm s": f"{r['warm_median_s']:.1f}" if "warm_median_s" in r else "-",
            "goal s": f"{r['goal_cold_s']}/{r['goal_warm_s'] or '-'}",
            "compiles": r.get("compiles", "-"),
            "overhead": f"{100 * r['overhead']:.1f}%" if r.get("overhead") is not None else "-",
            "solver": r.get("solver") or "-",
        }
        for r in result["rows"]
    ]
    print(
        table(
            shown,
            ["command", "jobs", "cold s", "warm s", "goal s", "compiles", "overhead", "solver"],
            f"remat-kit on {os.cpu_count()} cores (median of {repeats}; load "
            f"{result['load_average_start'][0]:.1f} at start)",
        )
    )


if __name__ == "__main__":
    main()
