"""MaxText at scale, to the byte: ``--maxtext`` against MaxText's own AOT path, five byte counts.

For MaxText configs across three model families (Llama 2, Gemma 2, Qwen 3) and the keys large
runs use (tensor parallelism, unscanned layers, gradient accumulation, fp8, pipeline stages with
microbatches and circular repeats, custom per-tensor lines), each with a policy: remat-kit's
report (``rk.sources.measure`` of ``--maxtext``) and MaxText's own ``train_compile.main`` for
the same config, run as a user runs it in a fresh process (``experiments/maxtext_own.py``:
its ``unsafe_rbg`` keys, its GPU host ``a3``, its ``create_device_mesh``). Argument, output,
alias, temp and generated-code bytes, and whether all five are equal. Writes
results/maxtext_scale.json (``--only a,b`` runs the named rows; ``--full-codegen`` compiles
both sides with jax's full code generation instead of remat-kit's analysis-only one).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence

from common import ROOT, parse, table, write_json

sys.path.insert(0, str(ROOT / "experiments"))

#: Small widths of each family: the keys under test, not the models' sizes, decide the paths.
SMALL = "base_emb_dim=256 base_mlp_dim=512 base_num_query_heads=4 head_dim=64 vocab_size=1024 "
LLAMA = f"model_name=llama2-7b {SMALL}base_num_kv_heads=4 attention=dot_product"
GEMMA2 = f"model_name=gemma2-2b {SMALL}base_num_kv_heads=2 attention=dot_product"
QWEN3 = f"model_name=qwen3-0.6b {SMALL}base_num_kv_heads=2 attention=dot_product"
OFFLOAD = "offload:offload=decoder_layer_input,save=out_proj"
OFFLOAD_KEYS = "remat_policy=custom decoder_layer_input=offload out_proj=device"
PIPE = "ici_pipeline_parallelism=2 num_pipeline_microbatches=4"


@dataclasses.dataclass(frozen=True)
class Row:
    """One config: its words (ours), the policy (ours) and MaxText's keys for it (theirs)."""

    name: str
    words: str
    policy: str
    remat: str
    gpus: int = 4
    batch: int = 8
    seq: int = 256
    hosts: int = 1


ROWS = (
    Row("llama-fsdp", f"{LLAMA} base_num_decoder_layers=2", "full", "remat_policy=full"),
    Row("llama-custom", f"{LLAMA} base_num_decoder_layers=2", OFFLOAD, OFFLOAD_KEYS),
    Row(
        "llama-tp",
        f"{LLAMA} base_num_decoder_layers=2 ici_fsdp_parallelism=1 ici_tensor_parallelism=4",
        "maxtext:remat_policy=save_qkv_proj",
        "remat_policy=save_qkv_proj",
    ),
    Row(
        "llama-unscanned",
        f"{LLAMA} base_num_decoder_layers=2 scan_layers=False",
        "maxtext:remat_policy=minimal",
        "remat_policy=minimal",
    ),
    Row(
        "llama-sgd-f32",
        f"{LLAMA} base_num_decoder_layers=2 opt_type=sgd dtype=float32",
        "full",
        "remat_policy=full",
        gpus=1,
        batch=2,
    ),
    Row("gemma2", f"{GEMMA2} base_num_decoder_layers=1", "full", "remat_policy=full"),
    Row(
        "gemma2-custom",
        f"{GEMMA2} base_num_decoder_layers=1",
        "maxtext:remat_policy=minimal_with_context",
        "remat_policy=minimal_with_context",
    ),
    Row("qwen3", f"{QWEN3} base_num_decoder_layers=2", "full", "remat_policy=full"),
    Row("qwen3-custom", f"{QWEN3} base_num_decoder_layers=2", OFFLOAD, OFFLOAD_KEYS),
    Row(
        "llama-accum2",
        f"{LLAMA} base_num_decoder_layers=2 gradient_accumulation_steps=2",
        "full",
        "remat_policy=full",
        gpus=2,
        batch=4,
    ),
    Row(
        "llama-fp8",
        f"{LLAMA} base_num_decoder_layers=2 quantization=fp8",
        "maxtext:remat_policy=minimal",
        "remat_policy=minimal",
    ),
    # Pipelines: 4 layers on 2 stages, 4 micro-batches; one layer per stage is MaxText's
    # circular pipeline (2 repeats), two layers per stage its plain one.
    Row("pp-full", f"{LLAMA} base_num_decoder_layers=4 {PIPE}", "full", "remat_policy=full", 2, 4),
    Row(
        "pp-minimal",
        f"{LLAMA} base_num_decoder_layers=4 {PIPE}",
        "maxtext:remat_policy=minimal",
        "remat_policy=minimal",
        2,
        4,
    ),
    Row("pp-custom", f"{LLAMA} base_num_decoder_layers=4 {PIPE}", OFFLOAD, OFFLOAD_KEYS, 2, 4),
    Row(
        "pp-2-per-stage",
        f"{LLAMA} base_num_decoder_layers=4 {PIPE} num_layers_per_pipeline_stage=2",
        "full",
        "remat_policy=full",
        2,
        4,
    ),
    Row(
        "pp-fsdp-ag-once",
        f"{LLAMA} base_num_decoder_layers=4 {PIPE} ici_fsdp_parallelism=2 "
        "pipeline_fsdp_ag_once=True",
        "full",
        "remat_policy=full",
        4,
        8,
    ),
    # Two hosts of 8 GPUs: data parallel across them (MaxText's dcn_* keys), fsdp within;
    # num_slices as MaxText finds it on the cluster (a slice per host) or given.
    Row(
        "llama-2hosts-dp",
        f"{LLAMA} base_num_decoder_layers=2 dcn_data_parallelism=2 ici_fsdp_parallelism=8",
        "full",
        "remat_policy=full",
        16,
        16,
        hosts=2,
    ),
    Row(
        "llama-2hosts-slices",
        f"{LLAMA} base_num_decoder_layers=2 dcn_data_parallelism=2 num_slices=2",
        "maxtext:remat_policy=save_qkv_proj",
        "remat_policy=save_qkv_proj",
        16,
        16,
        hosts=2,
    ),
    Row(
        "pp-2hosts",
        f"{LLAMA} base_num_decoder_layers=4 dcn_pipeline_parallelism=2 dcn_data_parallelism=1 "
        "num_pipeline_microbatches=2 ici_fsdp_parallelism=8",
        "full",
        "remat_policy=full",
        16,
        16,
        hosts=2,
    ),
    Row(
        "pp-gemma2",
        f"{GEMMA2} base_num_decoder_layers=2 {PIPE}",
        "maxtext:remat_policy=minimal_with_context",
        "remat_policy=minimal_with_context",
        2,
        4,
    ),
)


def ours(row: Row, full_codegen: bool) -> dict:
    """remat-kit's five counts for ``row`` (or its one-line refusal)."""
    import remat_kit as rk
    from remat_kit.errors import RematKitError
    from remat_kit_models.maxtext import MaxTextSpec

    if full_codegen:
        os.environ["REMAT_KIT_FULL_CODEGEN"] = "1"
    target = rk.target("h100", devices=row.gpus, hosts=row.hosts)
    try:
        source = rk.sources.resolve(MaxTextSpec(row.words))
        r = rk.sources.measure(
            source, row.policy, target, rk.TrainConfig(row.batch, row.seq), warn=False
        )
    except RematKitError as err:
        return {"error": str(err)}
    return {
        **{f: getattr(r, f"{f}_bytes") for f in FIELDS},
        "peak": r.peak_bytes,
        "batch_label": r.meta.get("batch"),
    }


def theirs_words(row: Row) -> list[str]:
    """MaxText's command line for ``row``: its words, the remat keys, and its own keys for
    what remat-kit's flags own."""
    return [
        *row.words.split(),
        *row.remat.split(),
        "override_model_config=True",
        f"per_device_batch_size={row.batch // row.gpus}",
        f"max_target_length={row.seq}",
        "jax_cache_dir=",
    ]


FIELDS = ("argument", "output", "alias", "temp", "generated_code")


def main(argv: Sequence[str] | None = None) -> None:
    full = "--full-codegen" in (argv := list(sys.argv[1:] if argv is None else argv))
    args = parse(__doc__, [a for a in argv if a != "--full-codegen"], target="h100")
    from maxtext_own import own_path

    wanted = set(filter(None, args.only.split(",")))
    rows = [r for r in ROWS if not wanted or r.name in wanted]
    start = time.perf_counter()
    theirs = own_path(
        [
            {"words": theirs_words(r), "target": "h100", "gpus": r.gpus, "hosts": r.hosts}
            for r in rows
        ],
        codegen="full" if full else "analysis",
    )
    out = []
    for row, own in zip(rows, theirs, strict=True):
        got = ours(row, full)
        equal = "error" not in got and "error" not in own and all(got[f] == own[f] for f in FIELDS)
        out.append(
            {
                **dataclasses.asdict(row),
                **{f"ours_{f}": got.get(f) for f in FIELDS},
                **{f"maxtext_{f}": own.get(f) for f in FIELDS},
                "ours_error": got.get("error"),
                "maxtext_error": own.get("error"),
                "maxtext_prng_impl": own.get("prng_impl"),
                "maxtext_argv": own.get("argv"),
                "equal": equal,
            }
        )
        print(row.name, row.policy, equal, flush=True)
    seconds = round(time.perf_counter() - start, 1)
    print(
        table(
            out,
            ("name", "policy", "gpus", "batch", *(f"ours_{f}" for f in FIELDS[:4]), "equal"),
            title=f"--maxtext vs MaxText's own train_compile.main: "
            f"{sum(r['equal'] for r in out)} of {len(out)} equal in all five counts",
        )
    )
    name = "maxtext_scale_full_codegen" if full else "maxtext_scale"
    if wanted and (args.out / f"{name}.json").is_file():
        # A run of some rows replaces those rows of the table, in the order of ROWS.
        held = {r["name"]: r for r in json.loads((args.out / f"{name}.json").read_text())["rows"]}
        held.update((r["name"], r) for r in out)
        out = [held[r.name] for r in ROWS if r.name in held]
    write_json(
        args.out / f"{name}.json",
        {"codegen": "full" if full else "analysis", "seconds": seconds, "rows": out},
    )


if __name__ == "__main__":
    main()
