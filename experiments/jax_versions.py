"""The platform under the figures: which jax computed them, how fast, and which remat (issue 42).

Two parts, each a set of whole ``remat-kit`` processes (cold: a fresh cache directory each):

- ``versions``: the main job (``compare --model llama3-8b --target h100 --batch 4 --seq 2048``)
  under two Python environments given by ``--a`` and ``--b`` (their ``remat-kit``
  executables; e.g. a Python 3.11 venv with jax 0.10.2 and this repository's 3.12 venv with
  jax 0.12), run in turn ``--rounds`` times. Prints each policy's peak side by side and the
  median wall time of each, with the ratio b/a.
- ``remat3``: every catalogue policy of ``compare`` with jax's ``jax_remat3`` flag off and on
  (``JAX_REMAT3=0/1``), on the main job and on a factory model (an NNX model of
  ``tests/data/factories.py``). Prints the peaks side by side and whether they are equal.

Writes results/jax_versions.json and a PNG of both parts. Usage::

    python experiments/jax_versions.py --only remat3
    python experiments/jax_versions.py --only versions --a /path/venv311/bin/remat-kit --rounds 3
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

from common import RESULTS, ROOT, save_png, table, write_json

GIB = 2**30
MAIN = ("compare", "--model", "llama3-8b", "--target", "h100", "--batch", "4", "--seq", "2048")
FACTORY = (
    "compare",
    "--model",
    str(ROOT / "tests" / "data" / "factories.py") + ":nnx_model",
    "--target",
    "h100",
    "--batch",
    "8",
    "--seq",
    "512",
)
HERE_EXE = str(Path(sys.executable).with_name("remat-kit"))


def _run(exe: str, args: Sequence[str], env: dict[str, str] | None = None) -> tuple[float, list]:
    """One cold ``remat-kit`` process: (wall seconds, its JSON rows)."""
    cache = tempfile.mkdtemp(prefix="rk-platform-")
    out = Path(cache) / "out.json"
    run_env = {**os.environ, **(env or {}), "REMAT_KIT_CACHE_DIR": cache}
    try:
        start = time.perf_counter()
        done = subprocess.run(
            [exe, *args, "--json", str(out)], env=run_env, capture_output=True, text=True
        )
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{exe} {' '.join(args)}: exit {done.returncode}\n{done.stderr}")
        return seconds, json.loads(out.read_text())
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _peaks(rows: list) -> dict[str, int]:
    return {r["policy"]: int(r["peak_bytes"]) for r in rows}


def versions(args: argparse.Namespace) -> dict:
    exes = {"a": args.a, "b": args.b}
    seconds: dict[str, list[float]] = {"a": [], "b": []}
    peaks: dict[str, dict[str, int]] = {}
    for _ in range(args.rounds):
        for side in ("a", "b"):  # in turn: drift on the machine hits both alike
            s, rows = _run(exes[side], MAIN)
            seconds[side].append(s)
            peaks[side] = _peaks(rows)
    rows = [
        {
            "policy": p,
            "a_gib": peaks["a"].get(p, 0) / GIB,
            "b_gib": peaks["b"].get(p, 0) / GIB,
            "change": peaks["b"].get(p, 0) / peaks["a"][p] - 1 if peaks["a"].get(p) else 0.0,
        }
        for p in peaks["a"]
    ]
    med = {side: statistics.median(v) for side, v in seconds.items()}
    print(table(rows, ["policy", "a_gib", "b_gib", "change"], f"main job: a={args.a} b={args.b}"))
    print(
        f"cold wall time, median of {args.rounds}: a {med['a']:.1f} s "
        f"{sorted(round(x, 1) for x in seconds['a'])}, b {med['b']:.1f} s "
        f"{sorted(round(x, 1) for x in seconds['b'])}, b/a {med['b'] / med['a']:.2f}"
    )
    return {
        "a": args.a,
        "b": args.b,
        "versions": {side: _version(exes[side]) for side in exes},
        "rows": rows,
        "seconds": seconds,
        "median_seconds": med,
        "ratio": med["b"] / med["a"],
    }


def _version(exe: str) -> str:
    py = str(Path(exe).with_name("python"))
    code = "import sys, jax; print(sys.version.split()[0], jax.__version__)"
    return subprocess.run([py, "-c", code], capture_output=True, text=True).stdout.strip()


def remat3(args: argparse.Namespace) -> list[dict]:
    out = []
    for label, command in (("llama3-8b b4 s2048", MAIN), ("nnx factory b8 s512", FACTORY)):
        off_s, off = _run(args.b, command, {"JAX_REMAT3": "0"})
        on_s, on = _run(args.b, command, {"JAX_REMAT3": "1"})
        off_p, on_p = _peaks(off), _peaks(on)
        impl = {r.get("meta_remat_impl") for r in on}
        rows = [
            {
                "model": label,
                "policy": p,
                "off_gib": off_p[p] / GIB,
                "on_gib": on_p.get(p, 0) / GIB,
                "equal": off_p[p] == on_p.get(p),
            }
            for p in off_p
        ]
        columns = ["model", "policy", "off_gib", "on_gib", "equal"]
        print(table(rows, columns, f"jax_remat3: {label}"))
        print(f"compile: off {off_s:.1f} s, on {on_s:.1f} s; meta_remat_impl with it on: {impl}")
        out += rows
    return out


def plot(data: dict, path: Path) -> None:
    """Peaks per policy: jax 0.10.2 beside 0.12, and 0.12 with jax_remat3 on."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    if "versions" in data:
        v = data["versions"]
        names = [r["policy"] for r in v["rows"]]
        xs = range(len(names))
        labels = v.get("versions", {})
        for i, side in enumerate(("a", "b")):
            axes[0].bar(
                [x + (i - 0.5) * 0.4 for x in xs],
                [r[f"{side}_gib"] for r in v["rows"]],
                0.4,
                label="Python {} jax {}".format(*(labels.get(side) or f"{side} ?").split()[:2]),
            )
        axes[0].set_xticks(list(xs), names, rotation=60, ha="right")
        axes[0].set_ylabel("peak GiB (llama3-8b b4 s2048, H100)")
        axes[0].set_title("main job: jax 0.10.2 vs 0.12")
        axes[0].legend()
    if "remat3" in data:
        rows = [r for r in data["remat3"] if r["model"].startswith("llama3")]
        xs = range(len(rows))
        axes[1].bar([x - 0.2 for x in xs], [r["off_gib"] for r in rows], 0.4, label="default")
        axes[1].bar([x + 0.2 for x in xs], [r["on_gib"] for r in rows], 0.4, label="jax_remat3")
        axes[1].set_xticks(list(xs), [r["policy"] for r in rows], rotation=60, ha="right")
        axes[1].set_title("jax 0.12: remat implementations (equal to the byte)")
        axes[1].legend()
    fig.tight_layout()
    save_png(fig, path)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="remat3,versions")
    parser.add_argument("--a", help="remat-kit of the environment to compare against")
    parser.add_argument("--b", default=HERE_EXE, help="remat-kit of this environment")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--key", default="versions", help="where versions' result goes")
    args = parser.parse_args(argv)
    path = RESULTS / "jax_versions.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    for part in args.only.split(","):
        if part == "versions":
            if not args.a:
                raise SystemExit("--only versions needs --a (another environment's remat-kit)")
            data[args.key] = versions(args)
        elif part == "remat3":
            data["remat3"] = remat3(args)
        elif part == "plot":
            pass  # the PNG below, from what results/jax_versions.json holds
        else:
            raise SystemExit(f"--only: unknown part {part!r}; versions, remat3, plot")
    write_json(path, data)
    plot(data, RESULTS / "jax_versions.png")


if __name__ == "__main__":
    main()
