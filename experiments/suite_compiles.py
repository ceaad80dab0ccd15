"""Where the test suite's time goes: every XLA compile the tests make, by test and platform.

The suite's time is over the 15 minutes it is allowed (README), and a compile costs seconds
where the rest of a test costs milliseconds. This is a pytest plugin and a summary of what it
wrote. As a plugin it wraps jax's one compile entry (``jax._src.compiler
.compile_or_get_cached``: CPU runs, GPU and TPU deviceless compiles alike) and writes one JSON
line a compile: the test that made it, the platform and device kind, the seconds, and digests
of the program and its options, so the same program compiled twice for one device kind is
found (jax's in-memory cache misses it when a test builds a new function of the same
program). Compiles made in a subprocess (the CLI runs ``test_docs`` and ``test_stop`` start,
the sharded step, a cluster's workers) are not seen.

Usage::

    mkdir -p /tmp/compiles
    SUITE_COMPILES_DIR=/tmp/compiles PYTHONPATH=experiments python -m pytest -q -n 2 \\
        --dist loadfile -m slow -p suite_compiles
    python experiments/suite_compiles.py /tmp/compiles   # writes results/suite_compiles.json

The summary prints the compile seconds per test file and platform, the compiles a device
kind saw twice, and the share of the run's worker time spent compiling (given the run's
wall seconds and workers with ``--wall`` and ``--workers``).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    """Wraps jax's compile entry for this process (a pytest-xdist worker loads it too)."""
    import jax._src.compiler as compiler

    folder = Path(os.environ.get("SUITE_COMPILES_DIR", "/tmp/compiles"))
    folder.mkdir(parents=True, exist_ok=True)
    out = open(folder / f"{os.getpid()}.jsonl", "a")  # noqa: SIM115 - open for the session
    original = compiler.compile_or_get_cached

    def recorded(backend, computation, devices, compile_options, *args, **kwargs):
        program = hashlib.sha1(str(computation).encode()).hexdigest()
        try:
            options = hashlib.sha1(compile_options.SerializeAsString()).hexdigest()
        except Exception:  # an options type without it: the digest is left out
            options = ""
        try:
            kind = devices.flat[0].device_kind
        except Exception:
            kind = ""
        start = time.perf_counter()
        try:
            return original(backend, computation, devices, compile_options, *args, **kwargs)
        finally:
            row = {
                "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
                "platform": backend.platform,
                "kind": kind,
                "seconds": time.perf_counter() - start,
                "program": program,
                "options": options,
                "worker": os.getpid(),
            }
            out.write(json.dumps(row) + "\n")
            out.flush()

    compiler.compile_or_get_cached = recorded


def summary(rows: list[dict], wall: float | None, workers: int) -> dict:
    """Compile seconds per test file and platform; the seconds of repeated compiles."""
    per_file: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    counts: collections.Counter = collections.Counter()
    seen, repeats = set(), collections.Counter()
    for r in rows:
        f = r["test"].split("::")[0] or "(collection)"
        per_file[f][r["platform"]] += r["seconds"]
        counts[f] += 1
        key = (r["program"], r["options"], r["platform"], r["kind"], r["worker"])
        if key in seen:
            repeats[f] += r["seconds"]
        seen.add(key)
    total = sum(r["seconds"] for r in rows)
    files = sorted(per_file, key=lambda f: -sum(per_file[f].values()))
    return {
        "compiles": len(rows),
        "compile_seconds": round(total, 1),
        "by_platform": {
            p: round(sum(r["seconds"] for r in rows if r["platform"] == p), 1)
            for p in sorted({r["platform"] for r in rows})
        },
        "repeated_seconds": round(sum(repeats.values()), 1),
        "share_of_worker_time": round(total / (wall * workers), 3) if wall else None,
        "files": [
            {
                "file": f,
                "compiles": counts[f],
                "seconds": round(sum(per_file[f].values()), 1),
                "by_platform": {p: round(s, 1) for p, s in sorted(per_file[f].items())},
                "repeated_seconds": round(repeats[f], 1),
            }
            for f in files
        ],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path, help="the plugin's SUITE_COMPILES_DIR")
    ap.add_argument("--wall", type=float, help="the run's wall seconds (pytest's last line)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--name", default="suite_compiles")
    args = ap.parse_args(argv)
    rows = [json.loads(line) for p in sorted(args.folder.glob("*.jsonl")) for line in p.open()]
    if not rows:
        raise SystemExit(f"suite_compiles: no compiles recorded in {args.folder}")
    out = summary(rows, args.wall, args.workers)
    path = ROOT / "results" / f"{args.name}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(
        f"{out['compiles']} compiles, {out['compile_seconds']:.0f} s"
        f" ({', '.join(f'{p} {s:.0f} s' for p, s in out['by_platform'].items())});"
        f" repeated: {out['repeated_seconds']:.0f} s"
        + (f"; {out['share_of_worker_time']:.0%} of worker time" if args.wall else "")
    )
    for f in out["files"][:25]:
        plat = " ".join(f"{p}={s:.0f}" for p, s in f["by_platform"].items())
        print(f"{f['seconds']:7.1f} s {f['compiles']:4d} compiles  {plat:24} {f['file']}")
    print(path.relative_to(ROOT))


if __name__ == "__main__":
    main()
