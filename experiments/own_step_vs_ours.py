"""Is remat-kit's train step heavier than a user's own? (issue: EasyDeL Llama-8B, fit said 21, the
user's step fits 22; 57.73 vs 56.85 GiB at batch 21, the same at 2 layers).

EasyDeL is not installable here: the stand-in is ``experiments/llama_own_step.py``, a Llama 3
8B-shaped model (width 4096, MLP 14336, vocab 128256, 32 heads / 8 KV heads, bf16, unrolled
layers) in linen and in NNX, as a factory (``--model``: remat-kit's step around it) and as the
plain step a user writes (``--step``: value_and_grad of cross-entropy on f32 logits, optax SGD,
parameters donated), with variants that change one thing each: the order of the parameter
arguments, the loss's dtype, the optimizer state's dtype. Every peak is a whole compile
(``depth="full"``) for the h100 at batch 21, seq 2048, policy ``full``, at 2 and 32 layers;
beside them the figure ``--depth auto`` (the default) reports for our step, and ``fit``'s
answer for both steps. Writes results/own_step_vs_ours.json and a PNG.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence

from common import GIB, ROOT, parse, save_png, table, write_json

FILE = str(ROOT / "experiments" / "llama_own_step.py")
BATCH, SEQ, POLICY = 21, 2048, "full"

#: name -> (kind, NAME in FILE, precision of our step, depth)
CASES = {
    "ours (--model)": ("model", "model", "bf16", "full"),
    "ours, --depth auto": ("model", "model", "bf16", "auto"),
    "ours, bf16-f32-moments": ("model", "model", "bf16-f32-moments", "full"),
    "own step (--step)": ("step", "step", None, "full"),
    "own step, layers_00..": ("step", "step_reordered", None, "full"),
    "own step, bf16 loss": ("step", "step_bf16_loss", None, "full"),
    "ours, NNX": ("model", "nnx_model", "bf16", "full"),
    "own NNX step": ("step", "nnx_step", None, "full"),
}


def _source(kind: str, name: str, layers: int):
    import remat_kit as rk

    os.environ["RK_LLAMA_LAYERS"] = str(layers)  # read as the file is loaded (afresh each time)
    spec = f"{FILE}:{name}"
    return rk.sources.from_factory(spec) if kind == "model" else rk.sources.from_step(spec)


def _config(precision: str | None, batch: int = BATCH):
    import remat_kit as rk

    if precision is None:  # a user's step: only batch and seq are read
        return rk.TrainConfig(batch=batch, seq=SEQ)
    return rk.TrainConfig(batch=batch, seq=SEQ, optimizer="sgd", precision=precision)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import remat_kit as rk

    target = rk.target(args.target)
    depths = (2,) if args.quick else (2, 32)
    only = [c for c in args.only.split(",") if c] or list(CASES)
    rows = []
    for layers in depths:
        for case in only:
            kind, name, precision, depth = CASES[case]
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                r = rk.sources.measure(
                    _source(kind, name, layers),
                    POLICY,
                    target,
                    _config(precision),
                    warn=False,
                    depth=depth if layers > 3 else "full",
                )
            rows.append(
                {
                    "case": case,
                    "layers": layers,
                    "peak_gib": r.peak_bytes / GIB,
                    "peak_bytes": r.peak_bytes,
                    "temp_gib": r.temp_bytes / GIB,
                    "depth": (r.meta.get("depth") or {}).get("mode", "whole"),
                    "seconds": time.perf_counter() - start,
                }
            )
            print(rows[-1], flush=True)
    fits = []
    if not args.quick:
        for case in ("ours (--model)", "own step (--step)"):
            kind, name, precision, _ = CASES[case]
            w = rk.sources.workload(_source(kind, name, 32), target, _config(precision))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fit = rk.max_batch(w, POLICY, headroom=0.0)
            fits.append(
                {
                    "case": case,
                    "max_batch": fit.batch,
                    "peak_gib": fit.peak_bytes / GIB,
                    "next_peak_gib": (fit.next_peak_bytes or 0) / GIB,
                    "limit_gib": fit.limit_bytes / GIB,
                    "compiles": fit.compiles,
                }
            )
            print(fits[-1], flush=True)
    data = {
        "target": target.name,
        "step": {"batch": BATCH, "seq": SEQ, "policy": POLICY, "model": FILE},
        "rows": rows,
        "fit": fits,
    }
    write_json(args.out / "own_step_vs_ours.json", data)
    fig, ax = plt.subplots(figsize=(9, 4))
    deep = [r for r in rows if r["layers"] == max(depths)]
    ax.barh([r["case"] for r in deep], [r["peak_gib"] for r in deep], color="tab:blue")
    low = min(r["peak_gib"] for r in deep)
    ax.set_xlim(low - 5, max(r["peak_gib"] for r in deep) + 1)
    ax.set_xlabel(f"compiled peak, GiB ({target.name}, b{BATCH} s{SEQ} {POLICY})")
    ax.set_title(f"{max(depths)} layers: remat-kit's step vs the user's own")
    fig.tight_layout()
    save_png(fig, args.out / "own_step_vs_ours.png")
    print(table(rows, ["case", "layers", "peak_gib", "temp_gib", "depth", "seconds"]))
    if fits:
        print(table(fits, ["case", "max_batch", "peak_gib", "next_peak_gib", "limit_gib"]))


if __name__ == "__main__":
    main()
