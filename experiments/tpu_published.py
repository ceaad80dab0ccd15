"""Step time on TPUs against MaxText's published runs (issue 62, "Step time on TPUs").

Every row of ``experiments/data/maxtext_tpu_published.json`` (13 published MaxText TPU runs,
each with its source) is rebuilt where its source gives a config: a preset of the row's
architecture, the row's global batch (per-device batch x chips) and sequence, the policy
equal to its ``remat_policy``, FSDP over every chip (the rows' ``ici_fsdp_parallelism=-1``;
the row's own mesh where it states one) and ``--target`` its slice. remat-kit compiles the
step deviceless for that slice (libtpu) and prices the program (remat_kit/timing); its
``step_time`` is compared with what the row publishes, computed the same way:

* **tokens/s per chip** (tiering.md, tpu-recipes logs): ``per-device batch x seq / step``.
  This is what the row measured, with no FLOP convention in it; where a row gives it, the
  error is on it.
* **MFU only** (run_llama2.md's table, 2024): MaxText's ``calculate_tflops_training_per_device``
  (the installed maxtext 0.2.5, maxtext/utils/maxtext_utils.py) of the row's config, but with
  attention counted **non-causal** (``4 B S^2 heads head_dim``, not halved), as MaxText counted
  before PR #1988 (tiering.md note [2]); the row's step time is then
  ``TFLOP / (MFU x chip peak)`` and the predicted MFU ``TFLOP / predicted step / peak``.

The peaks are the Cloud TPU pages' bf16 figures held in remat_kit/targets/_tpus.py (v5e 197,
v5p 459, v6e 918 TFLOP/s a chip).

Presets for the rows' models (``remat-kit models``): Llama 2 70B is ``llama3-70b`` with
``--vocab 32000`` (same 80 x 8192, GQA 64/8, SwiGLU 28672; rope theta is no FLOP);
Llama 3.1 8B / 70B are ``llama3-8b`` / ``llama3-70b`` (3.1 changes rope scaling only);
Mixtral 8x7B is ``mixtral-8x7b`` with ``--moe-impl capacity --capacity-factor 1.25`` (the row's
dropping MoE); Mixtral 8x22B is the same family at its config.json sizes.

Policies: MaxText's ``save_dot_except_mlpwi`` through the ``maxtext:`` family (the same
names saved). The rows that offload (``qkv_proj_offloaded``, ``remat_policy=custom`` with
``*: offload``) keep the same names **on the device** instead (``names:save=...``): the same
FLOPs and the same recomputation, without libtpu's host-offload compile (over 330 s for the
70B v5e row here, on two shared cores) and without the host-transfer term remat-kit would
add (MaxText overlaps those copies with compute).

The attention is XLA's einsum attention (remat-kit has no TPU flash kernel), where MaxText
runs its Pallas splash kernel. The seq x seq scores (f32) and probabilities then live in HBM,
and at the rows' batches libtpu refuses most programs (CompileTimeHbmOom). Such a row is
compiled at 1 and 2 sequences a chip and its step time taken linearly in the per-device
batch through those two points (FSDP's weight gathers and the optimizer do not grow with the
batch; matmuls, attention and activations do), or proportionally from one point when only
b1 fits; the JSON says which (``how``) with every compile's figures (``compiles``).

Usage: ``python experiments/tpu_published.py [ROW ...]`` runs the rows (indices into the
JSON, in the order given) one at a time, each a ``remat-kit report --json`` subprocess with
a timeout, writes results/tpu_published.json and prints the table. Compiles are cached (a
rerun is fast).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import ROOT, table, write_json

DATA = ROOT / "experiments" / "data" / "maxtext_tpu_published.json"
OUT = ROOT / "results" / "tpu_published.json"
CLI = str(Path(sys.executable).parent / "remat-kit")
TIMEOUT_S = 330  # a row that cannot compile in ~5 minutes is skipped (the brief)

#: bf16 peak per chip (remat_kit/targets/_tpus.py, from the Cloud TPU pages).
PEAK = {"v4": 275e12, "v5e": 197e12, "v5p": 459e12, "v6e": 918e12}

#: MaxText config (model) sizes: maxtext/configs/models/<name>.yml as MaxText ships them.
ARCH = {
    "llama2-70b": dict(layers=80, emb=8192, heads=64, kv=8, head_dim=128, mlp=28672, vocab=32000),
    "llama3.1-8b": dict(layers=32, emb=4096, heads=32, kv=8, head_dim=128, mlp=14336, vocab=128256),
    "llama3.1-70b": dict(
        layers=80, emb=8192, heads=64, kv=8, head_dim=128, mlp=28672, vocab=128256
    ),
    "mixtral-8x7b": dict(
        layers=32,
        emb=4096,
        heads=32,
        kv=8,
        head_dim=128,
        mlp=14336,
        vocab=32000,
        experts=8,
        top_k=2,
    ),
    "mixtral-8x22b": dict(
        layers=56,
        emb=6144,
        heads=48,
        kv=8,
        head_dim=128,
        mlp=16384,
        vocab=32768,
        experts=8,
        top_k=2,
    ),
}

#: The rows' offloaded names kept on the device instead (same FLOPs; see the module text).
_CUSTOM5 = "names:save=decoder_layer_input+out_proj+query_proj+key_proj+value_proj"
_CUSTOM4 = "names:save=decoder_layer_input+query_proj+key_proj+value_proj"
_QKV_OFFLOADED = "names:save=query_proj+key_proj+value_proj"  # qkv_proj_offloaded, on device


@dataclasses.dataclass(frozen=True)
class Rebuild:
    """How one published row is rebuilt: its index in the JSON and our command's words."""

    row: int
    label: str
    target: str
    model: tuple[str, ...]
    policy: str
    shard: str
    note: str = ""


_L2_70B = ("--model", "llama3-70b", "--vocab", "32000")
REBUILDS: tuple[Rebuild, ...] = (
    Rebuild(
        1,
        "Llama2-70B v5p-128",
        "v5p-128",
        _L2_70B,
        "maxtext:remat_policy=save_dot_except_mlpwi",
        "fsdp:64",
    ),
    Rebuild(
        3,
        "Llama2-70B v5p 512 chips",
        "v5p-1024",
        _L2_70B,
        "maxtext:remat_policy=save_dot_except_mlpwi",
        "fsdp:512",
        "the row says 512 chips (v5p-1024); its recipe link names v5p-128",
    ),
    Rebuild(
        6,
        "Llama2-70B v6e-256",
        "v6e-256",
        _L2_70B,
        _QKV_OFFLOADED,
        "fsdp:256",
        "MaxText's ici_fsdp_transpose_parallelism=-1 taken as fsdp:256",
    ),
    Rebuild(8, "Llama3.1-8B v6e-32", "v6e-32", ("--model", "llama3-8b"), _CUSTOM5, "fsdp:32"),
    Rebuild(7, "Llama3.1-8B v6e-256", "v6e-256", ("--model", "llama3-8b"), _CUSTOM5, "fsdp:256"),
    Rebuild(9, "Llama3.1-70B v6e-256", "v6e-256", ("--model", "llama3-70b"), _CUSTOM4, "fsdp:256"),
    Rebuild(
        0,
        "Llama2-70B v5e-256",
        "v5e-256",
        _L2_70B,
        _QKV_OFFLOADED,
        "fsdp:256",
    ),
    Rebuild(
        11,
        "Mixtral-8x7B v6e-256",
        "v6e-256",
        ("--model", "mixtral-8x7b", "--moe-impl", "capacity", "--capacity-factor", "1.25"),
        _CUSTOM5,
        "fsdp:256",
    ),
    Rebuild(
        12,
        "Mixtral-8x22B v6e-256",
        "v6e-256",
        (
            "--model",
            "mixtral-8x7b",
            "--layers",
            "56",
            "--width",
            "6144",
            "--heads",
            "48",
            "--kv-heads",
            "8",
            "--ff",
            "16384",
            "--vocab",
            "32768",
            "--moe-impl",
            "capacity",
            "--capacity-factor",
            "1.25",
        ),
        _CUSTOM5,
        "fsdp:64,ep:4",
        "the row's mesh: ici_fsdp 64 x ici_expert 4",
    ),
)

#: Published rows not rebuilt, and why.
NOT_REBUILT = {
    2: "v4-128: the source gives no batch, sequence or remat with it",
    4: "Mixtral v5p-128: no batch, sequence, remat or MoE settings in the source",
    5: "Mixtral v5p-512: its config is a tpu-recipes script not read (batch and remat unknown)",
    10: "Llama3.1-405B: no preset of its size and two v6e-256 slices with a 64x4 hybrid mesh; "
    "not compiled here (the brief's ~5 minute budget a row)",
}


def maxtext_tflop(arch: dict[str, int], batch: int, seq: int, causal: bool) -> float:
    """TFLOP per device per step by MaxText's calculate_tflops_training_per_device (maxtext
    0.2.5, dense and dropless-MoE branches): 3 x (FFN + QKV + out projection per layer, plus
    the unembedding) + 3 x attention, attention ``4 B S^2 heads head_dim`` halved if causal."""
    b, s, e = batch, seq, arch["emb"]
    ffn = 2 * b * s * arch["mlp"] * e * 2 + 2 * b * s * arch["mlp"] * e  # swiglu: 2 wi + wo
    if arch.get("experts", 1) > 1:
        ffn = 2 * b * s * e * arch["experts"] + ffn * arch["top_k"]
    qkv = 2 * b * s * e * (arch["heads"] + 2 * arch["kv"]) * arch["head_dim"]
    proj = 2 * b * s * e * arch["heads"] * arch["head_dim"]
    attention = 4 * b * s**2 * arch["heads"] * arch["head_dim"] / (2 if causal else 1)
    embedding = 2 * b * s * e * arch["vocab"]
    weights = ((ffn + qkv + proj) * arch["layers"] + embedding) * 3
    return (weights + attention * arch["layers"] * 3) / 1e12


def published_step(row: dict[str, Any]) -> tuple[float, str, float]:
    """(seconds a step the row stands for, the quantity it publishes, its value)."""
    tokens = row["per_device_batch_size"] * row["seq_len"]
    if row["tokens_per_s_per_chip"]:
        return tokens / row["tokens_per_s_per_chip"], "tok/s/chip", row["tokens_per_s_per_chip"]
    tflop = maxtext_tflop(
        ARCH[row["hf_or_maxtext_model"]], row["per_device_batch_size"], row["seq_len"], False
    )
    mfu = row["mfu"]
    return tflop * 1e12 / (mfu * PEAK[row["generation"]]), "MFU (full attn)", mfu


_SPLIT = ("matmul", "attention", "memory", "collective", "contention", "transfer", "launch")


def compile_once(r: Rebuild, chips: int, per_device: int, seq: int) -> dict[str, Any]:
    """One ``remat-kit report --json`` of the row's step at ``per_device`` sequences a chip."""
    out_json = Path("/tmp") / f"tpu_published_{r.row}_b{per_device}.json"
    out_json.unlink(missing_ok=True)
    cmd = [CLI, "report", *r.model, "--batch", str(per_device * chips), "--seq", str(seq),
           "--target", r.target, "--shard", r.shard, "--policy", r.policy,
           "--no-residuals", "--json", str(out_json)]  # fmt: skip
    out: dict[str, Any] = {"per_device_batch": per_device, "command": " ".join(cmd[1:])}
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    except subprocess.TimeoutExpired:
        out["status"] = f"no compile within {TIMEOUT_S} s"
        return out
    out["wall_s"] = round(time.perf_counter() - start, 1)
    if not out_json.exists():
        out["status"] = f"failed (exit {done.returncode}): {done.stderr.strip()[-400:]}"
        return out
    rep = json.loads(out_json.read_text())
    out["peak_gib"] = round(rep["peak_bytes"] / 2**30, 2)
    out["usable_gib"] = round(rep["usable_bytes"] / 2**30, 2)
    st = rep.get("step_time")
    if not st:
        out["status"] = "refused by libtpu (HBM): not priced"
        return out
    out.update(
        status="priced",
        seconds=st["seconds"],
        split={k: st[f"{k}_seconds"] for k in _SPLIT},
        collective_hidden_seconds=st["collective_hidden_seconds"],
        recompute_seconds=st["recompute_seconds"],
        flops=st["flops"],
        model_flops=st["model_flops"],
        kernels=st["kernels"],
        our_mfu=st.get("mfu"),
        xla_remat=rep.get("xla_remat"),
        flops_detail=rep.get("flops_detail"),
        recompute_overhead=rep.get("meta", {}).get("recompute_overhead"),
    )
    return out


def run_one(r: Rebuild, row: dict[str, Any]) -> dict[str, Any]:
    """The row at its own per-device batch if libtpu takes it, else at 1 and 2 sequences a
    chip, extrapolated linearly in the batch (FSDP's weight traffic and the optimizer do not
    grow with it; matmuls, attention and activations do); the row's figures beside ours."""
    chips, b, s = row["chips"], row["per_device_batch_size"], row["seq_len"]
    out: dict[str, Any] = {"row": r.row, "label": r.label, "slice": r.target, "chips": chips,
                           "policy": r.policy, "shard": r.shard, "note": r.note}  # fmt: skip
    tries = [compile_once(r, chips, b, s)]
    if tries[0]["status"] != "priced":
        for small in (1, 2):
            if small < b:
                tries.append(compile_once(r, chips, small, s))
    out["compiles"] = tries
    priced = [t for t in tries if t["status"] == "priced"]
    if not priced:
        out["status"] = "; ".join(f"b{t['per_device_batch']}: {t['status']}" for t in tries)
        return out
    if priced[0]["per_device_batch"] == b:
        seconds, how = priced[0]["seconds"], "compiled at the row's batch"
    elif len(priced) >= 2:
        (b1, t1), (b2, t2) = ((t["per_device_batch"], t["seconds"]) for t in priced[:2])
        slope = (t2 - t1) / (b2 - b1)
        seconds = t2 + slope * (b - b2)
        how = f"linear in the batch through b{b1} and b{b2} (row's b{b} refused)"
    else:
        b1, t1 = priced[0]["per_device_batch"], priced[0]["seconds"]
        seconds = t1 * b / b1
        how = f"proportional from b{b1} (b{b}{' and b2' if b > 2 else ''} refused)"
    pub_s, quantity, pub_value = published_step(row)
    arch = ARCH[row["hf_or_maxtext_model"]]
    peak = PEAK[row["generation"]]
    tokens = b * s
    old = maxtext_tflop(arch, b, s, causal=False)
    new = maxtext_tflop(arch, b, s, causal=True)
    predicted_value = tokens / seconds if quantity == "tok/s/chip" else old * 1e12 / seconds / peak
    out.update(
        status="priced",
        how=how,
        quantity=quantity,
        published=pub_value,
        predicted=predicted_value,
        error=predicted_value / pub_value - 1,
        published_step_s=pub_s,
        predicted_step_s=seconds,
        step_error=seconds / pub_s - 1,
        predicted_tok_s_chip=tokens / seconds,
        predicted_tflops_chip_causal=new / seconds,
        predicted_tflops_chip_full_attn=old / seconds,
        predicted_mfu_maxtext_causal=new * 1e12 / seconds / peak,
        published_mfu=row["mfu"],
        maxtext_tflop_per_device={"causal": new, "full_attention": old},
    )
    return out


def _write(rows: list[dict[str, Any]], wall: float) -> None:
    skipped = [{"row": i, "status": f"not rebuilt: {why}"} for i, why in NOT_REBUILT.items()]
    write_json(
        OUT,
        {
            "description": "remat-kit's predicted step time vs MaxText's published TPU runs "
            "(experiments/tpu_published.py; issue 62)",
            "data": str(DATA.relative_to(ROOT)),
            "peaks_bf16": PEAK,
            "rows": rows,
            "not_rebuilt": skipped,
            "wall_s": round(wall, 1),
        },
    )


def main(selected: list[int] | None) -> list[dict[str, Any]]:
    data = json.loads(DATA.read_text())
    rows: list[dict[str, Any]] = []
    if selected and OUT.exists():  # rows not named keep their last result
        rows = [x for x in json.loads(OUT.read_text())["rows"] if x["row"] not in selected]
    t0 = time.perf_counter()
    by_row = {r.row: r for r in REBUILDS}
    for r in [by_row[i] for i in selected] if selected else REBUILDS:
        res = run_one(r, data["rows"][r.row])
        rows.append(res)
        rows.sort(key=lambda x: [q.row for q in REBUILDS].index(x["row"]))
        _write(rows, time.perf_counter() - t0)
        walls = [t.get("wall_s", TIMEOUT_S) for t in res.get("compiles", [])]
        print(f"{r.label}: {res['status']} ({sum(walls):.0f} s)", file=sys.stderr, flush=True)
    shown = [
        {
            "row": f"{x['row']} {x['label']}",
            "slice": x["slice"],
            "quantity": x.get("quantity", "-"),
            "predicted": f"{x['predicted']:.3g}" if "predicted" in x else x["status"][:40],
            "published": f"{x['published']:.3g}" if "published" in x else "-",
            "error": f"{x['error']:+.1%}" if "error" in x else "-",
            "step s (pred/pub)": (
                f"{x['predicted_step_s']:.2f}/{x['published_step_s']:.2f}" if "error" in x else "-"
            ),
        }
        for x in rows
    ]
    print(table(shown, list(shown[0]), "predicted vs published (MaxText on TPUs)"))
    return rows


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or None)
