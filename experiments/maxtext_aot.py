"""MaxText configs: remat_kit's figures against MaxText's own AOT compile, per policy, bytes.

For a Llama, a Mixtral and a DeepSeek-style (MLA, MoE) MaxText config on compile-only H100s,
and for each policy: remat_kit's report (``--maxtext``, ``rk.sources.measure``) and MaxText's
own AOT compile of the same config with its remat set by its own keys (``train_compile``'s
functions and ``jit_and_compile``; ``tests/helpers.py:maxtext_aot``), argument, output, temp and
alias bytes, and whether they are equal. ``--quick`` runs the small configs the tests use; the
default runs them at their published widths with 2 layers. Writes results/maxtext_aot.json
and a PNG.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

from common import ROOT, parse, plot_pairs, table, write_json

sys.path.insert(0, str(ROOT / "tests"))

#: (our policy, MaxText's remat keys): its own values by name, our catalogue's `minimal` (as
#: MaxText's custom lines), and a custom offload as MaxText's per-tensor lines.
POLICIES = (
    ("full", {"remat_policy": "full"}),
    ("maxtext:remat_policy=save_qkv_proj", {"remat_policy": "save_qkv_proj"}),
    ("maxtext:remat_policy=minimal_with_context", {"remat_policy": "minimal_with_context"}),
    ("minimal", {"remat_policy": "minimal"}),
    (
        "offload:offload=decoder_layer_input,save=out_proj",
        {"remat_policy": "custom", "decoder_layer_input": "offload", "out_proj": "device"},
    ),
)

SMALL = "base_num_decoder_layers=2 attention=dot_product"
MODELS = {
    "llama2-7b": f"model_name=llama2-7b {SMALL}",
    "mixtral-8x7b": f"model_name=mixtral-8x7b {SMALL}",
    "deepseek2-16b": f"model_name=deepseek2-16b {SMALL} first_num_dense_layers=1",
}
QUICK = {
    "llama": "model_name=llama2-7b base_num_decoder_layers=2 base_emb_dim=256 base_mlp_dim=512 "
    "base_num_query_heads=4 base_num_kv_heads=4 head_dim=64 vocab_size=1024 attention=dot_product",
    "mixtral": "model_name=mixtral-8x7b base_emb_dim=256 base_num_query_heads=4 "
    "base_num_kv_heads=4 base_mlp_dim=512 base_moe_mlp_dim=512 base_num_decoder_layers=1 "
    "head_dim=64 vocab_size=1024 attention=dot_product",
    "deepseek": "model_name=deepseek3-tiny base_num_decoder_layers=2 first_num_dense_layers=1 "
    "vocab_size=1024 attention=dot_product",
}
FIELDS = ("argument", "output", "temp", "alias")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv, target="h100")
    import remat_kit as rk
    from helpers import maxtext_aot
    from remat_kit_models.maxtext import MaxTextSpec

    gpus, batch, seq = (4, 8, 256) if args.quick else (8, 16, 2048)
    target = rk.target(args.target, devices=gpus)
    rows = []
    for model, words in (QUICK if args.quick else MODELS).items():
        source = rk.sources.resolve(MaxTextSpec(words))
        for policy, remat in POLICIES:
            start = time.perf_counter()
            r = rk.sources.measure(source, policy, target, rk.TrainConfig(batch, seq), warn=False)
            ours = {f: getattr(r, f"{f}_bytes") for f in FIELDS}
            theirs = maxtext_aot(words, remat, gpus, batch, seq)
            rows.append(
                {
                    "model": model,
                    "policy": policy,
                    "maxtext": " ".join(f"{k}={v}" for k, v in remat.items()),
                    **{f"ours_{f}": ours[f] for f in FIELDS},
                    **{f"maxtext_{f}": theirs[f] for f in FIELDS},
                    "peak_bytes": r.peak_bytes,
                    "equal": ours == theirs,
                    "applied": r.meta["maxtext"]["policy_applied"],
                    "seconds": round(time.perf_counter() - start, 1),
                }
            )
            print(rows[-1]["model"], policy, rows[-1]["equal"], r.peak_bytes, flush=True)
    print(
        table(
            rows,
            ("model", "policy", "applied", "peak_bytes", "ours_temp", "maxtext_temp", "equal"),
            title=f"remat_kit vs MaxText's AOT compile: {gpus}x {args.target}, b{batch} s{seq}",
        )
    )
    name = "maxtext_aot_quick" if args.quick else "maxtext_aot"
    write_json(
        args.out / f"{name}.json",
        {"gpus": gpus, "batch": batch, "seq": seq, "target": args.target, "rows": rows},
    )
    plot(rows, args.out / f"{name}.png", f"{gpus}x {args.target}, b{batch} s{seq}")


def plot(rows: Sequence[dict], path: Path, setting: str) -> None:
    """Our peak beside MaxText's own AOT compile's (argument + output + temp - alias)."""
    for r in rows:
        r.setdefault(
            "maxtext_peak", sum(r[f"maxtext_{f}"] for f in FIELDS[:3]) - r["maxtext_alias"]
        )
    plot_pairs(
        rows, "peak_bytes", "maxtext_peak", path, f"remat-kit vs MaxText's AOT compile: {setting}"
    )


if __name__ == "__main__":
    main()
