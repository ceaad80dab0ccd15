"""Are the deviceless predictions right on a real GPU? (goal: predicted within 3% of measured).

For gpt2-medium, llama3.2-1b and llama3.2-3b under none / full / minimal / minimal_offloaded,
runs the train step for real on the local GPU (``remat-kit validate``: a few steps, the
allocator's ``peak_bytes_in_use`` and ``bytes_limit``) and compiles the same step deviceless for
the catalogue target matching the GPU; each case runs in a fresh process, since jaxlib's
allocator peak cannot be reset. Writes results/gpu_validation.json and a PNG
(``--target NAME``: compiled for that catalogue GPU, into gpu_validation_NAME.json).

On a machine with no NVIDIA GPU it says so and exits 1, writing nothing.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

HAS_GPU = bool(glob.glob("/dev/nvidia[0-9]*"))
if HAS_GPU:
    # common.py starts jax on its CPU platform for deviceless compiles; here the GPU must show.
    os.environ.setdefault("JAX_PLATFORMS", "cuda,cpu")

from common import ROOT, parse, save_png, table, write_json  # noqa: E402

#: (model, batch, seq): sizes whose step fits an 80 GB H100 at least with ``full``.
CASES = (("gpt2-medium", 8, 1024), ("llama3.2-1b", 4, 2048), ("llama3.2-3b", 2, 2048))
POLICIES = ("none", "full", "minimal", "minimal_offloaded")
#: Steps per case: the first is a warm-up; the step time is the median of the rest.
STEPS = 8


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(__doc__, argv, target="")
    if not HAS_GPU:
        print(
            "gpu_validation: no NVIDIA GPU on this machine (no /dev/nvidia*); it measures on a "
            "real GPU, so nothing was run and nothing written",
            file=sys.stderr,
        )
        return 1
    cases = CASES[:1] if args.quick else CASES
    if args.only:
        cases = tuple(c for c in cases if c[0] in args.only.split(","))
    policies = POLICIES[:2] if args.quick else POLICIES
    rows = []
    for model, batch, seq in cases:
        for policy in policies:
            rows.append(_one(model, policy, batch, seq, args.target))
            print(json.dumps(_flat(rows[-1])), flush=True)
    measured = [r for r in rows if r.get("error") is not None]
    summary = {
        "cases": len(rows),
        "measured": len(measured),
        "max_abs_error": max((abs(r["error"]) for r in measured), default=None),
        "within_3pct": sum(abs(r["error"]) <= 0.03 for r in measured),
        "device": _device(),
    }
    name = f"gpu_validation_{args.target}" if args.target else "gpu_validation"
    write_json(args.out / f"{name}.json", {"rows": rows, "summary": summary})
    _plot(measured, args.out / f"{name}.png")
    print(table([_flat(r) for r in rows], _COLUMNS, "predicted vs measured peak (GiB)"))
    return 0


def _device() -> str:
    """The GPU and the jax that measured, as they name themselves (a child process asks jax)."""
    ask = "import jax, jaxlib; print(jax.devices()[0].device_kind, '| jax', jax.__version__)"
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    done = subprocess.run([sys.executable, "-c", ask], env=env, capture_output=True, text=True)
    return done.stdout.strip() or f"unknown ({done.stderr.strip()[-200:]})"


def _one(model: str, policy: str, batch: int, seq: int, target: str) -> dict:
    """One case in a fresh process: ``remat-kit validate ... --json``.

    ``target`` names the catalogue GPU to compile the prediction for; empty, validate
    matches it from the local device's kind.
    """
    with tempfile.TemporaryDirectory(prefix="gpu_validation_") as tmp:
        out = Path(tmp) / "one.json"
        cmd = [
            sys.executable,
            "-m",
            "remat_kit.cli",
            "validate",
            "--model",
            model,
            "--policy",
            policy,
            "--batch",
            str(batch),
            "--seq",
            str(seq),
            "--steps",
            str(STEPS),
            "--json",
            str(out),
            *(["--compare-with", target] if target else []),
        ]
        env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if out.exists():
            return json.loads(out.read_text())
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {
            "meta": {"model": model, "policy": policy, "batch": batch, "seq": seq},
            "failed": f"exit {done.returncode}: {last}",
            "error": None,
        }


_COLUMNS = (
    "model", "policy", "batch", "seq", "predicted", "measured", "error", "step_pred", "step_meas",
    "ran",
)  # fmt: skip


def _flat(row: dict) -> dict:
    m = row.get("meta") or {}
    gib = lambda n: None if n is None else round(n / 2**30, 2)
    ran = row.get("failed") or ("OOM" if row.get("oom") else row.get("note") or "ok")
    return {
        "model": m.get("model"),
        "policy": m.get("policy"),
        "batch": m.get("batch"),
        "seq": m.get("seq"),
        "predicted": gib(row.get("predicted_peak_bytes")),
        "measured": gib(row.get("measured_peak_bytes")),
        "error": None if row.get("error") is None else f"{100 * row['error']:+.1f}%",
        "step_pred": row.get("predicted_step_seconds"),
        "step_meas": row.get("step_seconds"),
        "ran": ran,
    }


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    xs = [r["measured_peak_bytes"] / 2**30 for r in rows]
    ys = [r["predicted_peak_bytes"] / 2**30 for r in rows]
    ax.scatter(xs, ys)
    top = max([*xs, *ys, 1.0]) * 1.05
    ax.plot([0, top], [0, top], color="grey", linewidth=0.8)
    ax.set_xlabel("measured peak on the GPU (GiB)")
    ax.set_ylabel("predicted peak, deviceless compile (GiB)")
    ax.set_title("predicted vs measured")
    save_png(fig, path)


if __name__ == "__main__":
    sys.exit(main())
