"""A model nobody here wrote beside our preset: Hugging Face's Flax Llama 3 8B vs llama3-8b.

The external model is transformers' ``FlaxLlamaForCausalLMModule`` at Llama 3 8B's shapes
(``tests/data/hf_llama.py``, the factory docs/your-model.md shows), measured through
``--model file.py:NAME``
with its decoder layer patched by ``--block`` and its projections tagged by the Hugging Face
rule set; ours is the ``llama3-8b`` preset. Both run the same step (batch, sequence, optimizer,
precision) with the same attention and layer loop: einsum attention (``xla``: Hugging Face's
Flax Llama has no flash attention) and unrolled layers (it has no scan). For every catalogue
policy: compiled peak for the h100 and recompute overhead (traced FLOPs), and the difference.
Policies whose tags the Hugging Face model lacks (``context``, ``attn_out``) are not compared.
Writes results/external_models.json and a PNG.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence

from common import GIB, ROOT, parse, save_png, table, write_json

FACTORY = str(ROOT / "tests" / "data" / "hf_llama.py") + ":llama"
BLOCK = "transformers.models.llama.modeling_flax_llama:FlaxLlamaDecoderLayer"
STEP = dict(batch=1, seq=2048, optimizer="sgd", precision="bf16")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import remat_kit as rk
    from remat_kit.notes import words
    from remat_kit.search import FRONT_POLICIES
    from remat_kit_models.spec import PresetSpec

    target = rk.target(args.target)
    config = rk.TrainConfig(
        STEP["batch"],
        STEP["seq"],
        optimizer=STEP["optimizer"],
        precision=rk.train.regime(STEP["precision"]),
    )
    ours = rk.sources.resolve(PresetSpec("llama3-8b", attention="xla", scan_layers=False))
    theirs = rk.sources.resolve(rk.sources.FactorySpec(FACTORY, block=BLOCK))
    policies = ("none", "full") if args.quick else FRONT_POLICIES
    hf_ok, skipped = rk.sources.usable_policies(theirs, config, target, policies, given=False)
    hf_specs = {p.spec for p in hf_ok}
    started = time.perf_counter()
    bases = {
        "ours": rk.sources.step_flops(ours, "none", target, config),
        "hf": rk.sources.step_flops(theirs, "none", target, config),
    }
    rows = []
    for spec in policies:
        row: dict = {"policy": spec}
        for key, source in (("ours", ours), ("hf", theirs)):
            if key == "hf" and spec not in hf_specs:
                continue
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                r = rk.sources.measure(
                    source, spec, target, config, baseline=bases[key], warn=False
                )
            row[f"{key}_peak_gib"] = r.peak_bytes / GIB
            row[f"{key}_recompute_pct"] = 100 * r.meta["recompute_overhead"]
            row[f"{key}_host_gib"] = r.host_bytes / GIB
            row[f"{key}_seconds"] = time.perf_counter() - t0
            row[f"{key}_warnings"] = [words(n) for n in r.notes if n.kind != "does_not_fit"]
        if "hf_peak_gib" in row:
            row["peak_diff_pct"] = 100 * (row["hf_peak_gib"] / row["ours_peak_gib"] - 1)
            row["recompute_diff_pts"] = row["hf_recompute_pct"] - row["ours_recompute_pct"]
        else:
            row["note"] = "the Hugging Face model has none of its tags"
        rows.append(row)
        print(f"{spec}: {row}", flush=True)
    data = {
        "target": target.name,
        "step": STEP,
        "attention": "xla (einsum), both",
        "layers": "unrolled, both",
        "hf_model": "transformers.FlaxLlamaForCausalLMModule (Llama 3 8B shapes), --block",
        "ours": "models llama3-8b preset, --attention xla --no-scan",
        "skipped_for_hf": skipped,
        "seconds": time.perf_counter() - started,
        "rows": rows,
    }
    write_json(args.out / "external_models.json", data)
    _plot(plt, rows, args.out / "external_models.png", target.name)
    cols = [
        "policy",
        "ours_peak_gib",
        "hf_peak_gib",
        "peak_diff_pct",
        "ours_recompute_pct",
        "hf_recompute_pct",
    ]
    print(table(rows, cols, f"HF Flax Llama 3 8B vs llama3-8b on {target.name}, {STEP}"))


def _plot(plt, rows, path, target: str) -> None:
    both = [r for r in rows if "hf_peak_gib" in r]
    fig, ax = plt.subplots(figsize=(9, 4))
    xs = range(len(both))
    ax.bar([x - 0.2 for x in xs], [r["ours_peak_gib"] for r in both], 0.4, label="llama3-8b")
    ax.bar([x + 0.2 for x in xs], [r["hf_peak_gib"] for r in both], 0.4, label="HF Flax Llama")
    ax.set_xticks(list(xs), [r["policy"] for r in both], rotation=30, ha="right")
    ax.set_ylabel(f"compiled peak on {target} (GiB)")
    ax.set_title("Same step, two implementations of Llama 3 8B (xla attention, unrolled)")
    ax.legend()
    fig.tight_layout()
    save_png(fig, path)


if __name__ == "__main__":
    main()
