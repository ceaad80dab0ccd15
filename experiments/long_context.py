"""How long a sequence does each policy train? Context parallelism and offloaded layer inputs.

Claims: at long context the checkpointed layer inputs, which every policy keeps, dominate ("a
Qwen3-8B at 128k keeps 36 GB of them"); offloading them "took a peak from 27.9 to 20.8 GB for
+0.6% step time" at 1M tokens over 8-way context parallelism (an accelerate change).

Part ``one``: Llama 3 8B in bf16 on one H100, batch 1, SGD and AdamW: the longest sequence
(1k granularity) each of none / full / minimal / offload_inputs trains (``rk.search.max_seq``),
with the compiles each search took.

Part ``cp``: the same model with AdamW on 8 H100s, the weights, gradients and optimizer state
sharded (fsdp and cp together), the sequence split over cp = 1, 2, 4, 8 and one sequence per
data-parallel group (batch 8, 4, 2, 1: every GPU holds 1/cp of one sequence): the longest
sequence under full and under full + layer-input offload (``offload_inputs``).

Part ``peaks``: per-device peak at 32k and 128k tokens for none / full / offload_inputs on the
same meshes.

Writes results/long_context.json and results/long_context.png.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from common import run_parts, save_png, table

MODEL = "llama3-8b"
ONE_POLICIES = ("none", "full", "minimal", "offload_inputs")
ONE_OPTIMIZERS = ("sgd", "adamw")
#: 8 GPUs: the sequence split over cp, the rest of the devices fsdp.
MESHES = ("fsdp:8", "fsdp:4,cp:2", "fsdp:2,cp:4", "cp:8")
CP_POLICIES = ("full", "offload_inputs")
PEAK_POLICIES = ("none", "full", "offload_inputs")
PEAK_SEQS = (32 * 1024, 128 * 1024)
GRANULARITY = 1024
GiB = 2**30


def _batch(shard: str | None) -> int:
    """One sequence per data-parallel group: each GPU holds 1/cp of one sequence."""
    import remat_kit as rk

    return 1 if shard is None else rk.parse_shard(shard, 8).data_size


def _workload(seq: int, optimizer: str, target, shard: str | None = None):
    """The search's workload of MODEL at ``seq`` tokens (bf16), one sequence per data group."""
    import remat_kit as rk
    from remat_kit_models.spec import PresetSpec

    source = rk.sources.resolve(PresetSpec(MODEL, shard=shard))
    config = rk.TrainConfig(
        _batch(shard), seq, optimizer=optimizer, precision=rk.train.regime("bf16")
    )
    return rk.sources.workload(source, target, config)


def _builder(optimizer: str, target, shard: str | None = None):
    """``seq -> Workload`` for the search, one workload per sequence (shared by policies)."""
    made = {}

    def at(seq: int):
        if seq not in made:
            made[seq] = _workload(seq, optimizer, target, shard)
        return made[seq]

    return at


def _row(fit, **extra) -> dict:
    return {
        **extra,
        "policy": fit.policy,
        "max_seq": fit.seq,
        "peak_bytes": fit.peak_bytes,
        "next_peak_bytes": fit.next_peak_bytes,
        "limit_bytes": fit.limit_bytes,
        "compiles": fit.compiles,
        "seconds": fit.seconds,
        "method": fit.method,
    }


def one(args) -> list[dict]:
    import remat_kit as rk

    target = rk.target("h100")
    out = []
    for optimizer in ONE_OPTIMIZERS[:1] if args.quick else ONE_OPTIMIZERS:
        build = _builder(optimizer, target)
        for policy in ONE_POLICIES:
            fit = rk.search.max_seq(build, policy, granularity=GRANULARITY)
            out.append(_row(fit, optimizer=optimizer, gpus=1, mesh="-"))
    _print(out, "longest sequence on one h100 (llama3-8b bf16, batch 1)")
    return out


def cp(args) -> list[dict]:
    import remat_kit as rk

    target = rk.target("h100", devices=8)
    out = []
    for mesh in MESHES[::3] if args.quick else MESHES:
        build = _builder("adamw", target, mesh)
        for policy in CP_POLICIES:
            fit = rk.search.max_seq(build, policy, batch=_batch(mesh), granularity=GRANULARITY)
            out.append(_row(fit, optimizer="adamw", gpus=8, mesh=mesh, batch=_batch(mesh)))
    _print(out, "longest sequence on 8 h100 (llama3-8b bf16 adamw, one sequence per data group)")
    return out


def peaks(args) -> list[dict]:
    import remat_kit as rk

    target = rk.target("h100", devices=8)
    out = []
    for mesh in MESHES[::3] if args.quick else MESHES:
        for seq in PEAK_SEQS:
            w = _workload(seq, "adamw", target, mesh)
            for policy in PEAK_POLICIES:
                t0 = time.perf_counter()
                r = w.report(policy, batch=_batch(mesh))
                out.append(
                    {
                        "mesh": mesh,
                        "batch": _batch(mesh),
                        "seq": seq,
                        "policy": policy,
                        "peak_bytes": r.peak_bytes,
                        "host_bytes": r.host_temp_bytes,
                        "fits": r.peak_bytes <= r.usable_bytes,
                        "seconds": time.perf_counter() - t0,
                    }
                )
    rows = [
        {
            "mesh": r["mesh"],
            "seq": f"{r['seq'] // 1024}k",
            "policy": r["policy"],
            "peak GiB": r["peak_bytes"] / GiB,
            "host GiB": r["host_bytes"] / GiB,
            "fits": r["fits"],
        }
        for r in out
    ]
    print(table(rows, list(rows[0]), "per-device peak on 8 h100 (llama3-8b bf16 adamw)"))
    return out


def _print(rows: list[dict], title: str) -> None:
    shown = [
        {
            "optimizer": r["optimizer"],
            "mesh": r["mesh"],
            "policy": r["policy"],
            "longest seq": r["max_seq"],
            "peak GiB": r["peak_bytes"] / GiB,
            "next GiB": None if r["next_peak_bytes"] is None else r["next_peak_bytes"] / GiB,
            "compiles": r["compiles"],
            "method": r["method"],
            "s": r["seconds"],
        }
        for r in rows
    ]
    print(table(shown, list(shown[0]), title))


PARTS = {"one": one, "cp": cp, "peaks": peaks}


def main(argv: Sequence[str] | None = None) -> None:
    run_parts(__doc__, argv, PARTS, "long_context", readme_rows, plot)


def _k(seq: int) -> str:
    return f"{seq / 1024:,.0f}k"


def readme_rows(data: dict) -> list[list[str]]:
    rows = []
    one_rows = [r for r in data.get("one", []) if r["optimizer"] == "sgd"]
    if one_rows:
        said = "; ".join(
            f"{r['policy']} {_k(r['max_seq']) if r['max_seq'] else 'nothing'}" for r in one_rows
        )
        compiles = [r["compiles"] for r in one_rows]
        rows.append(
            [
                "(ours) the longest sequence each policy trains, found in a few compiles "
                "(llama3-8b bf16 SGD, 1 h100, b1)",
                "-",
                f"{said} ({min(compiles)}-{max(compiles)} compiles per policy)",
                "`python experiments/long_context.py --only one`",
            ]
        )
    by = {(r["mesh"], r["seq"], r["policy"]): r for r in data.get("peaks", [])}
    said = []
    for mesh in MESHES:
        full, moved = (
            by.get((mesh, 128 * 1024, "full")),
            by.get((mesh, 128 * 1024, "offload_inputs")),
        )
        if full and moved:
            said.append(
                f"{mesh}: {full['peak_bytes'] / GiB:.1f} -> {moved['peak_bytes'] / GiB:.1f} GiB"
            )
    if said:
        rows.append(
            [
                "offloading the layer inputs cuts the long-context peak "
                "(27.9 -> 20.8 GB at 1M tokens, cp 8)",
                "-25%",
                "llama3-8b 128k, full -> offload_inputs per device: " + "; ".join(said),
                "`python experiments/long_context.py --only peaks`",
            ]
        )
    return rows


def plot(data: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = [(p, data.get(p) or []) for p in ("one", "cp")]
    parts = [(p, rows) for p, rows in parts if rows]
    if not parts:
        return
    fig, axes = plt.subplots(1, len(parts), figsize=(6 * len(parts), 4), squeeze=False)
    for ax, (part, rows) in zip(axes[0], parts, strict=True):
        groups = list(dict.fromkeys((r["optimizer"], r["mesh"]) for r in rows))
        policies = list(dict.fromkeys(r["policy"] for r in rows))
        width = 0.8 / len(policies)
        for i, policy in enumerate(policies):
            vals = [
                next(
                    (r["max_seq"] / 1024 for r in rows if (r["optimizer"], r["mesh"]) == g
                     and r["policy"] == policy), 0,
                )
                for g in groups
            ]  # fmt: skip
            ax.bar([j + i * width for j in range(len(groups))], vals, width, label=policy)
        names = [m if part == "cp" else o for o, m in groups]
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], names, fontsize=8)
        ax.set_ylabel("longest sequence (k tokens)")
        ax.set_title("one h100" if part == "one" else "8 h100, adamw", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"{MODEL} bf16: the longest sequence each policy trains (one sequence per data group)",
        fontsize=10,
    )
    fig.tight_layout()
    save_png(fig, path)


if __name__ == "__main__":
    main()
