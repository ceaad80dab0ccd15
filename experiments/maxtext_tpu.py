"""MaxText on TPU slices, to the byte: ``--maxtext`` against MaxText's own TPU path.

For three model families (Llama 2, Gemma 2, Qwen 3, made small: the paths are under test,
not the sizes), three TPU generations (the 4-device slices v5e-4, v5p-8 and v6e-4, libtpu's
own topologies, deviceless) and MaxText's remat policies (its own ``remat_policy`` values,
its host offload ``minimal_offloaded``, and a ``custom`` offload line): remat-kit's report
(``rk.sources.measure`` of ``--maxtext`` on ``--target v5e-4``) and MaxText's own
``train_compile.main`` with ``compile_topology=v5e-4`` in a fresh process
(``experiments/maxtext_own.py``), each with MaxText's TPU defaults (its autoselected
attention kernel among them). Argument, output, alias, temp and generated-code bytes, and
whether all five are equal. Writes results/maxtext_tpu.json (``--only a,b`` runs the named
rows, replacing those rows of the file).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Sequence

from common import ROOT, parse, table, write_json

sys.path.insert(0, str(ROOT / "experiments"))

#: Small widths of each family; no attention key: MaxText's TPU default (autoselected).
SMALL = "base_emb_dim=256 base_mlp_dim=512 base_num_query_heads=4 head_dim=64 vocab_size=1024"
FAMILIES = {
    "llama2": f"model_name=llama2-7b {SMALL} base_num_kv_heads=4 base_num_decoder_layers=2",
    "gemma2": f"model_name=gemma2-2b {SMALL} base_num_kv_heads=2 base_num_decoder_layers=2",
    "qwen3": f"model_name=qwen3-0.6b {SMALL} base_num_kv_heads=2 base_num_decoder_layers=2",
}
GENERATIONS = ("v5e-4", "v5p-8", "v6e-4")
#: Ours (a policy spec) -> MaxText's keys for it.
POLICIES = {
    "full": "remat_policy=full",
    "maxtext:remat_policy=minimal": "remat_policy=minimal",
    "maxtext:remat_policy=save_qkv_proj": "remat_policy=save_qkv_proj",
    "offload:offload=decoder_layer_input,save=out_proj": (
        "remat_policy=custom decoder_layer_input=offload out_proj=device"
    ),
}
#: More of MaxText's policies, on the Llama of each generation.
MORE = {
    "maxtext:remat_policy=save_dot_except_mlp": "remat_policy=save_dot_except_mlp",
    "maxtext:remat_policy=save_out_proj": "remat_policy=save_out_proj",
    "maxtext:remat_policy=minimal_offloaded": "remat_policy=minimal_offloaded",
}
BATCH, SEQ = 8, 256
FIELDS = ("argument", "output", "alias", "temp", "generated_code")


@dataclasses.dataclass(frozen=True)
class Row:
    """One config on one slice: the words, our policy and MaxText's keys for it."""

    name: str
    family: str
    target: str
    policy: str
    remat: str
    batch: int = BATCH
    seq: int = SEQ

    @property
    def words(self) -> str:
        return FAMILIES[self.family]


def _short(policy: str) -> str:
    return policy.split("=")[-1] if policy.startswith("maxtext:") else policy.split(":")[0]


ROWS = tuple(
    Row(f"{family}-{gen}-{_short(pol)}", family, gen, pol, keys)
    for family in FAMILIES
    for gen in GENERATIONS
    for pol, keys in (POLICIES | (MORE if family == "llama2" else {})).items()
)


def _devices(target: str) -> int:
    import remat_kit as rk

    return rk.target(target).devices


def ours(row: Row) -> dict:
    """remat-kit's five counts for ``row`` (or its one-line refusal)."""
    import remat_kit as rk
    from remat_kit.errors import RematKitError
    from remat_kit_models.maxtext import MaxTextSpec

    try:
        source = rk.sources.resolve(MaxTextSpec(row.words))
        r = rk.sources.measure(
            source,
            row.policy,
            rk.target(row.target),
            rk.TrainConfig(row.batch, row.seq),
            warn=False,
        )
    except RematKitError as err:
        return {"error": str(err)}
    return {
        **{f: getattr(r, f"{f}_bytes") for f in FIELDS},
        "attention": r.meta.get("attention"),
    }


def theirs_words(row: Row) -> list[str]:
    """MaxText's command line for ``row`` (compile_topology is added by the own path)."""
    return [
        *row.words.split(),
        *row.remat.split(),
        "override_model_config=True",
        f"per_device_batch_size={row.batch // _devices(row.target)}",
        f"max_target_length={row.seq}",
        "jax_cache_dir=",
    ]


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv, target="v5e-4")
    from maxtext_own import own_path

    wanted = set(filter(None, args.only.split(",")))
    rows = [r for r in ROWS if not wanted or r.name in wanted]
    path = args.out / "maxtext_tpu.json"
    held = {r["name"]: r for r in json.loads(path.read_text())["rows"]} if path.is_file() else {}
    start = time.perf_counter()
    out = []
    # A generation at a time, the file written after each: a stopped run keeps what it did.
    for gen in GENERATIONS:
        group = [r for r in rows if r.target == gen]
        if not group:
            continue
        theirs = own_path([{"words": theirs_words(r), "target": r.target} for r in group])
        for row, own in zip(group, theirs, strict=True):
            got = ours(row)
            equal = (
                "error" not in got and "error" not in own and all(got[f] == own[f] for f in FIELDS)
            )
            out.append(
                {
                    **dataclasses.asdict(row),
                    **{f"ours_{f}": got.get(f) for f in FIELDS},
                    **{f"maxtext_{f}": own.get(f) for f in FIELDS},
                    "ours_error": got.get("error"),
                    "maxtext_error": own.get("error"),
                    "maxtext_attention": own.get("attention"),
                    "maxtext_mesh": own.get("mesh"),
                    "maxtext_argv": own.get("argv"),
                    "equal": equal,
                }
            )
            print(row.name, equal, flush=True)
        # Rows of an earlier run stay, those run now replace theirs, in the order of ROWS.
        held.update((r["name"], r) for r in out)
        write_json(
            path,
            {
                "seconds": round(time.perf_counter() - start, 1),
                "rows": [held[r.name] for r in ROWS if r.name in held],
            },
        )
    print(
        table(
            out,
            ("name", *(f"ours_{f}" for f in FIELDS), "equal"),
            title=f"--maxtext on TPU vs MaxText's own train_compile.main: "
            f"{sum(r['equal'] for r in out)} of {len(out)} equal in all five counts",
        )
    )


if __name__ == "__main__":
    main()
