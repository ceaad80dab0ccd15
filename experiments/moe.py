"""Mixture-of-experts training on 8 H100s: which policies keep the expert GEMMs, and ep scaling.

Claims: jax's dot policies miss grouped expert GEMMs ("dots_with_no_batch_dims_saveable does not
save expert outputs", maxtext#2207); recomputing the MoE activation saves under 2% of memory for
about +2% time, and recomputing a whole MoE layer replays its dispatch/combine all-to-all
(Megatron-Bridge, H100).

Part ``params``: each MoE preset's parameter count against the published total.

Part ``catalogue``: qwen3-30b-a3b and mixtral-8x7b, bf16 weights and AdamW state, batch 8 of 4096
tokens on 8 H100s, two ways: ``fsdp:8`` with dropless grouped GEMMs (``ragged_dot``) and
``ep:8`` with the capacity einsum dispatch (all-to-all over the 8 GPUs). Per policy: the
per-GPU peak, the recompute FLOPs, the predicted step time, what happens to the expert GEMM
outputs (by their tags), the bytes a dot policy recomputes of them (the ragged note), and the
all-to-all bytes replayed in the backward pass.

Part ``ep``: per-GPU peak and step time under ``minimal`` as ep grows from 1 to 8 (fsdp
fills the rest of the 8 GPUs), every row with the capacity dispatch, with each compile's wall
time.

Writes results/moe.json and results/moe.png.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from common import run_parts, save_png, table

MODELS = ("qwen3-30b-a3b", "mixtral-8x7b")
#: Published totals: the Hugging Face model cards (Qwen3-30B-A3B: 30.5B; Mixtral-8x7B: 46.7B),
#: to the parameter as their safetensors indexes count them.
PUBLISHED = {"qwen3-30b-a3b": 30_532_122_624, "mixtral-8x7b": 46_702_792_704}
MESHES = ("fsdp:8", "ep:8")
POLICIES = (
    "none",
    "full",
    "minimal",
    "dots",
    "dots_no_batch",
    "dots_no_batch_and_ragged",
    "offload_dots_no_batch",
)
EP_MESHES = ("fsdp:8", "fsdp:4,ep:2", "fsdp:2,ep:4", "ep:8")
EXPERT_TAGS = ("moe_mlpwi_0", "moe_mlpwi_1", "moe_mlpwo")
BATCH, SEQ, GPUS = 8, 4096, 8
GiB = 2**30


def _workload(model: str, shard: str, target, **overrides):
    """The search's workload of ``model`` over ``shard`` (bf16 AdamW, BATCH x SEQ)."""
    import remat_kit as rk
    from remat_kit_models.spec import PresetSpec

    spec = PresetSpec(model, shard=shard, overrides=tuple(overrides.items()))
    config = rk.TrainConfig(BATCH, SEQ, optimizer="adamw", precision=rk.train.regime("bf16"))
    return rk.sources.workload(rk.sources.resolve(spec), target, config)


def params(args) -> list[dict]:
    from remat_kit_models import get_config

    out = []
    for model in MODELS:
        cfg = get_config(model)
        out.append(
            {
                "model": model,
                "params": cfg.param_count(),
                "published": PUBLISHED[model],
                "experts": cfg.n_experts,
                "per_token": cfg.experts_per_token,
            }
        )
    print(table(out, list(out[0]), "parameter counts against the published totals"))
    return out


def _expert_fate(w, policy: str) -> str:
    """What the policy does with the expert GEMM outputs (by their tags), traced."""
    tags = w.residuals(policy, batch=BATCH).tags
    fates = sorted({tags.get(t, "absent") for t in EXPERT_TAGS})
    return "/".join(fates)


def _row(model: str, mesh: str, policy: str, w) -> dict:
    t0 = time.perf_counter()
    r = w.report(policy, batch=BATCH)
    seconds = time.perf_counter() - t0
    a2a = r.meta.get("collectives", {}).get("all-to-all", {})
    ragged = next((n for n in r.notes if n.kind == "ragged_dots_recomputed"), None)
    st = r.step_time
    return {
        "model": model,
        "mesh": mesh,
        "impl": r.meta.get("experts", {}).get("impl"),
        "policy": policy,
        "peak_bytes": r.peak_bytes,
        "host_bytes": r.host_temp_bytes,
        "fits": r.peak_bytes <= r.usable_bytes,
        "recompute_overhead": w.recompute_overhead(policy, batch=BATCH),
        "step_seconds": None if st is None else st.seconds,
        "tokens_per_second": None if st is None else BATCH * SEQ / st.seconds,
        "expert_gemms": _expert_fate(w, policy),
        "ragged_recomputed_per_layer_bytes": ragged.data["per_layer_bytes"] if ragged else 0,
        "all_to_all_bytes": a2a.get("bytes", 0),
        "all_to_all_recomputed_bytes": a2a.get("recomputed_bytes", 0),
        "compile_seconds": seconds,
    }


def catalogue(args) -> list[dict]:
    import remat_kit as rk

    target = rk.target(args.target, devices=GPUS)
    out = []
    for model in MODELS[:1] if args.quick else MODELS:
        for mesh in MESHES:
            w = _workload(model, mesh, target)
            for policy in POLICIES[:3] if args.quick else POLICIES:
                out.append(_row(model, mesh, policy, w))
    rows = [
        {
            "model": r["model"],
            "mesh": f"{r['mesh']} ({r['impl']})",
            "policy": r["policy"],
            "peak GiB": r["peak_bytes"] / GiB,
            "fits": r["fits"],
            "recompute": f"{r['recompute_overhead']:+.1%}",
            "step s (est.)": r["step_seconds"],
            "expert GEMMs": r["expert_gemms"],
            "missed MiB/layer": r["ragged_recomputed_per_layer_bytes"] / 2**20,
            "a2a again GiB": r["all_to_all_recomputed_bytes"] / GiB,
        }
        for r in out
    ]
    print(table(rows, list(rows[0]), f"MoE policies on {GPUS} {args.target} (b{BATCH} s{SEQ})"))
    return out


def ep(args) -> list[dict]:
    import remat_kit as rk

    target = rk.target(args.target, devices=GPUS)
    out = []
    for model in MODELS[:1] if args.quick else MODELS:
        for mesh in EP_MESHES:
            # One dispatch for every row (ep=1 included), so only the mesh changes.
            w = _workload(model, mesh, target, moe_impl="capacity")
            out.append(_row(model, mesh, "minimal", w))
    rows = [
        {
            "model": r["model"],
            "mesh": r["mesh"],
            "impl": r["impl"],
            "peak GiB": r["peak_bytes"] / GiB,
            "fits": r["fits"],
            "step s (est.)": r["step_seconds"],
            "a2a GiB": r["all_to_all_bytes"] / GiB,
            "compile s": r["compile_seconds"],
        }
        for r in out
    ]
    print(table(rows, list(rows[0]), f"ep scaling under minimal on {GPUS} {args.target}"))
    return out


PARTS = {"params": params, "catalogue": catalogue, "ep": ep}


def main(argv: Sequence[str] | None = None) -> None:
    run_parts(__doc__, argv, PARTS, "moe", readme_rows, plot)


def readme_rows(data: dict) -> list[list[str]]:
    rows = []
    by = {(r["model"], r["mesh"], r["policy"]): r for r in data.get("catalogue", [])}
    for model in MODELS:
        plain = by.get((model, "fsdp:8", "dots_no_batch"))
        kept = by.get((model, "fsdp:8", "dots_no_batch_and_ragged"))
        if plain and kept:
            rows.append(
                [
                    "jax's dot policies do not save grouped expert GEMMs (maxtext#2207)",
                    "-",
                    f"{model} fsdp:8 ragged: dots_no_batch recomputes "
                    f"{plain['ragged_recomputed_per_layer_bytes'] / GiB:.2f} GiB of expert "
                    f"outputs per layer ({plain['recompute_overhead']:+.1%} FLOPs, peak "
                    f"{plain['peak_bytes'] / GiB:.1f} GiB); dots_no_batch_and_ragged keeps them "
                    f"({kept['recompute_overhead']:+.1%}, {kept['peak_bytes'] / GiB:.1f} GiB)",
                    "`python experiments/moe.py --only catalogue`",
                ]
            )
    for model in MODELS:
        minimal = by.get((model, "ep:8", "minimal"))
        if minimal and minimal["all_to_all_recomputed_bytes"]:
            rows.append(
                [
                    "recomputing an MoE layer replays its dispatch/combine all-to-all "
                    "(Megatron-Bridge)",
                    "-",
                    f"{model} ep:8 minimal: {minimal['all_to_all_recomputed_bytes'] / GiB:.1f} "
                    f"of {minimal['all_to_all_bytes'] / GiB:.1f} GiB of all-to-all per GPU per "
                    "step is replayed in the backward pass",
                    "`python experiments/moe.py --only catalogue`",
                ]
            )
    return rows


def plot(data: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = [(p, data.get(p) or []) for p in ("catalogue", "ep")]
    parts = [(p, rows) for p, rows in parts if rows]
    if not parts:
        return
    fig, axes = plt.subplots(1, len(parts), figsize=(7 * len(parts), 4), squeeze=False)
    for ax, (part, rows) in zip(axes[0], parts, strict=True):
        if part == "catalogue":
            groups = list(dict.fromkeys((r["model"], r["mesh"]) for r in rows))
            policies = list(dict.fromkeys(r["policy"] for r in rows))
            width = 0.8 / len(groups)
            for i, g in enumerate(groups):
                vals = [
                    next((r["peak_bytes"] / GiB for r in rows
                          if (r["model"], r["mesh"]) == g and r["policy"] == p), 0)
                    for p in policies
                ]  # fmt: skip
                ax.bar(
                    [j + i * width for j in range(len(policies))], vals, width, label=" ".join(g)
                )
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(policies))], policies,
                          fontsize=7, rotation=30)  # fmt: skip
            ax.set_ylabel("peak per GPU (GiB)")
            ax.set_title("policies (bf16, AdamW, b8 s4096, 8 h100)", fontsize=9)
        else:
            for model in dict.fromkeys(r["model"] for r in rows):
                mine = [r for r in rows if r["model"] == model]
                ax.plot([r["mesh"] for r in mine], [r["peak_bytes"] / GiB for r in mine], "o-",
                        label=model)  # fmt: skip
            ax.set_ylabel("peak per GPU (GiB)")
            ax.set_title("minimal, as ep grows (8 h100)", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(
        "mixture-of-experts: per-GPU peak by policy and by expert parallelism", fontsize=10
    )
    fig.tight_layout()
    save_png(fig, path)


if __name__ == "__main__":
    main()
