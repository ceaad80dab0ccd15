"""Step time on TPUs against MaxText's published runs (issue 62, "Step time on TPUs").

Every row of ``experiments/data/maxtext_tpu_published.json`` (17 published MaxText TPU runs,
each with its source) is rebuilt where its source gives a config, as MaxText builds it: the
``--maxtext`` source (MaxText's own model, train step, optimizer and mesh, compiled through
its ``compile_topology`` path for the row's slice) with the row's own config keys, at the
row's own ``per_device_batch_size`` and ``max_target_length``. MaxText attends with its
Pallas splash kernel on a TPU (``attention=flash``, or ``autoselected``, which picks it for a
training step over 128 tokens: maxtext/layers/attention_op.py), so the scores never exist and
the rows' batches fit; remat-kit prices the kernel from its shapes (remat_kit/xla/_cost.py,
``_pallas_tpu``). remat-kit compiles the step deviceless for that slice (libtpu) and prices
the program (remat_kit/timing); its ``step_time`` is compared with what the row publishes:

* **tokens/s per chip** (tiering.md, tpu-recipes logs): ``per-device batch x seq / step``.
  This is what the row measured, with no FLOP convention in it; where a row gives it, the
  error is on it.
* **TFLOP/s per chip of 2023** (MaxText/configs/v5p and v5e README.md, December 2023): the
  FLOPs are train.py's ``calculate_training_tflops`` of then (``6 x params x tokens`` plus
  causal attention ``12 heads layers head_dim S^2 B / 2``) of the row's model, so the row's step
  time is that count over its TFLOP/s, and the predicted TFLOP/s the count over our step.
* **MFU only** (run_llama2.md's table, 2024): MaxText's ``calculate_tflops_training_per_device``
  (the installed maxtext 0.2.5, maxtext/utils/maxtext_utils.py) of the row's config, but with
  attention counted **non-causal** (``4 B S^2 heads head_dim``, not halved), as MaxText counted
  before PR #1988 (tiering.md note [2]); the row's step time is then
  ``TFLOP / (MFU x chip peak)`` and the predicted MFU ``TFLOP / predicted step / peak``.

The peaks are the Cloud TPU pages' bf16 figures held in remat_kit/targets/_tpus.py (v5e 197,
v5p 459, v6e 918 TFLOP/s a chip).

What differs from the published run, each stated in the row's JSON:

* **Host offload.** The rows that offload (``qkv_proj_offloaded``, ``remat_policy=custom``
  with ``*: offload``) are compiled with those offloads (kept on the device, an 8B row at its
  batch is over a v6e's HBM). libtpu's asynchronous slices to and from pinned host memory
  run over the chip's own PCIe link (the scaling book's figure: 32 GB/s a way on v6e, 15 on
  v5), the offloads beside the forward's compute, the read-backs beside the backward's (a
  third and two thirds of the compute that is not recomputation); what does not fit is the
  ``transfer`` part of a row's split (remat_kit/timing/_model.py).
* **Splash attention on v6e.** Each of the kernel's products holds an operand with the head
  dim (128) as one side in v6e's 256 x 256 MXU: half of it (remat_kit/timing/_model.py).
* **XLA flags.** Of the rows' ``xla_flags`` (MaxText's benchmarks/xla_flags_library.py),
  ``DISABLE_COLLECTIVE_MATMUL`` is passed (``LIBTPU_INIT_ARGS``; row 8's benchmark names it:
  without it libtpu decomposes its products); the others are not: libtpu 0.0.50 refuses
  ``CF_FOR_ALL_GATHER`` on v5p and v6e deviceless
  (``FAILED_PRECONDITION: Continuation fusion for AllGather is enabled on platform viperfish
  ... not supported/recommended on platforms other than TPU v5e``; ghostlite for v6e) and
  compiles it by default on v5e; ``DATA_PARALLEL_OVERLAP`` and ``xla_enable_async_all_gather``
  leave an FSDP step's collectives as they were (docs/guides/tpu.md, Step time on a TPU).

Usage: ``python experiments/tpu_published.py [ROW ...]`` runs the rows (indices into the
JSON, in the order given) one at a time, each in a child process with a timeout
(``TIMEOUT_S``; ``--timeout S`` sets another), writes results/tpu_published.json and .png
and prints the table. Compiles are cached (a rerun is fast). ``--plot`` draws the figure
from the results written. Each row's kernels are kept (results/tpu_published.kernels.json.gz):
``--reprice [ROW ...]`` prices them again with the code as it is (a pricing change without
MaxText's compiles). A row whose program holds a Pallas kernel the model cannot price
(neither splash nor carrying a CostEstimate: MaxText's megablox ``gmm``) is written as not a
prediction.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import ROOT, table, write_json

DATA = ROOT / "experiments" / "data" / "maxtext_tpu_published.json"
OUT = ROOT / "results" / "tpu_published.json"
KERNELS = ROOT / "results" / "tpu_published.kernels.json.gz"  # each row's kernels, --reprice
#: A row that cannot compile in 12 minutes on two shared cores is skipped; ``--timeout S``
#: raises it for the rows named (the 70B and 8x22B rows on v6e-256 need more).
TIMEOUT_S = 720

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


#: MaxText's base.yml model of December 2023 (emb 2560, 8 heads of 256, mlp 8192 with one relu
#: activation, 16 layers, vocab 32768, logits via the embedding) scaled by global_parameter_scale
#: with MaxText's own get_individual_scales (unchanged since then).
def _scaled_2023(scale: int) -> dict[str, int]:
    from maxtext.configs.types import get_individual_scales

    emb, heads, mlp, layers = (2**e for e in get_individual_scales(scale))
    return dict(layers=16 * layers, emb=2560 * emb, heads=8 * heads, kv=8 * heads, head_dim=256,
                mlp=8192 * mlp, vocab=32768, acts=1)  # fmt: skip


ARCH.update({f"maxtext2023-{n}b": _scaled_2023(n) for n in (16, 32, 64)})

#: The rows' own policies: MaxText's ``remat_policy: custom`` with ``NAME: offload`` lines
#: (remat-kit's ``offload`` family writes exactly those lines), or its named policy.
_CUSTOM5 = "offload:offload=decoder_layer_input+out_proj+query_proj+key_proj+value_proj"
_CUSTOM4 = "offload:offload=decoder_layer_input+query_proj+key_proj+value_proj"
_QKV_OFFLOADED = "maxtext:remat_policy=qkv_proj_offloaded"
_SAVE_DOT = "maxtext:remat_policy=save_dot_except_mlpwi"
#: MaxText's DISABLE_COLLECTIVE_MATMUL (benchmarks/xla_flags_library.py): without it libtpu
#: splits an FSDP product over 32 v6e chips into 16 windowed steps (k = 256 each) that
#: re-read the accumulator.
_NO_COLLECTIVE_MATMUL = "--xla_jf_spmd_threshold_for_windowed_einsum_mib=1000000"

#: The LIBTPU_INIT_ARGS of MaxText's 2023 scripts (MaxText/configs/v5p/32b.sh and 64b.sh,
#: v5e/16b.sh and 32b.sh at 76bd53b, the tables' commit): async collective fusion, the
#: data-parallel all-reduce and compute/collective overlap. v5p's leave out fusing all-gathers
#: (``_fuse_all_gather``), which libtpu 0.0.50 refuses on a v5p deviceless.
_ASYNC_2023 = (
    "--xla_tpu_enable_data_parallel_all_reduce_opt=true "
    "--xla_tpu_data_parallel_opt_different_sized_ops=true "
    "--xla_tpu_enable_async_collective_fusion=true "
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true "
    "--xla_tpu_overlap_compute_collective_tc=true --xla_enable_async_all_gather=true"
)
_V5P_2023 = (
    "--xla_tpu_megacore_fusion_allow_ags=false --xla_enable_async_collective_permute=true "
    "--xla_tpu_enable_ag_backward_pipelining=true " + _ASYNC_2023
)
_V5E_2023 = _ASYNC_2023 + " --xla_tpu_enable_async_collective_fusion_fuse_all_gather=true"
_FLAGS_2023_NOTE = "the script's LIBTPU_INIT_ARGS passed (libtpu takes them deviceless)"

#: Config keys that are not MaxText's model or mesh words: the command line owns the batch,
#: the sequence and the policy (the offload names with it); the flags are discussed above.
_NOT_WORDS = {"per_device_batch_size", "max_target_length", "remat_policy", "xla_flags",
              "maxtext_benchmark"}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Rebuild:
    """How one published row is rebuilt: its index in the JSON, its slice and policy."""

    row: int
    label: str
    target: str
    policy: str
    note: str = ""
    libtpu_flags: str = ""  # the row's xla_flags that libtpu takes deviceless (LIBTPU_INIT_ARGS)


REBUILDS: tuple[Rebuild, ...] = (
    Rebuild(1, "Llama2-70B v5p-128", "v5p-128", _SAVE_DOT),
    Rebuild(
        8,
        "Llama3.1-8B v6e-32",
        "v6e-32",
        _CUSTOM5,
        "DISABLE_COLLECTIVE_MATMUL passed (the row's benchmark is _no_collective_matmul)",
        _NO_COLLECTIVE_MATMUL,
    ),
    Rebuild(9, "Llama3.1-70B v6e-256", "v6e-256", _CUSTOM4),
    Rebuild(7, "Llama3.1-8B v6e-256", "v6e-256", _CUSTOM5),
    Rebuild(6, "Llama2-70B v6e-256", "v6e-256", _QKV_OFFLOADED),
    Rebuild(0, "Llama2-70B v5e-256", "v5e-256", _QKV_OFFLOADED),
    Rebuild(
        3,
        "Llama2-70B v5p 512 chips",
        "v5p-1024",
        _SAVE_DOT,
        "the row says 512 chips (v5p-1024); its recipe link names v5p-128",
    ),
    Rebuild(11, "Mixtral-8x7B v6e-256", "v6e-256", _CUSTOM5),
    Rebuild(
        5,
        "Mixtral-8x7B v5p 256 chips",
        "v5p-512",
        "maxtext:remat_policy=full",
        "the tpu-recipes script's per-device batch (36) and keys; MaxText's defaults for remat "
        "(full) and MoE (megablox, dropless)",
    ),
    Rebuild(12, "Mixtral-8x22B v6e-256", "v6e-256", _CUSTOM5, "the row's mesh: fsdp 64 x ep 4"),
    # MaxText's December 2023 tables, each with its script of then (the row's notes say what
    # differs today: splash for the Pallas flash kernel, 'minimal' saving by name) and the
    # script's LIBTPU_INIT_ARGS, which libtpu 0.0.50 takes deviceless
    Rebuild(
        13,
        "MaxText 32B (2023) v5p-128",
        "v5p-128",
        "maxtext:remat_policy=minimal",
        _FLAGS_2023_NOTE,
        _V5P_2023,
    ),
    Rebuild(
        14,
        "MaxText 64B (2023) v5p-128",
        "v5p-128",
        "maxtext:remat_policy=minimal",
        _FLAGS_2023_NOTE,
        _V5P_2023,
    ),
    Rebuild(
        15,
        "MaxText 16B (2023) v5e-256",
        "v5e-256",
        "maxtext:remat_policy=full",
        _FLAGS_2023_NOTE,
        _V5E_2023,
    ),
    Rebuild(
        16,
        "MaxText 32B (2023) v5e-256",
        "v5e-256",
        "maxtext:remat_policy=full",
        _FLAGS_2023_NOTE,
        _V5E_2023,
    ),
)

#: Published rows not rebuilt, and why.
NOT_REBUILT = {
    2: "v4-128: the source gives no batch, sequence or remat with it",
    4: "Mixtral v5p-128: no batch, sequence, remat or MoE settings in the source",
    10: "Llama3.1-405B: two v6e-256 slices with a 64x4 hybrid mesh; not compiled here (a "
    "405B step over 512 chips is past a row's time budget on this machine's shared cores)",
}


def words_of(row: dict[str, Any]) -> str:
    """The row's MaxText config words: its config keys less those the command line owns
    (and the offload names, which are the policy's), ``attention=flash`` where the row names
    none (MaxText's ``autoselected`` is splash on a TPU training step over 128 tokens)."""
    keys = dict(row["config_keys"])
    keys.setdefault("attention", "flash")
    offloads = set(row.get("remat_offloads") or ())
    words = [
        f"{k}={str(v).lower() if isinstance(v, bool) else v}"
        for k, v in keys.items()
        if k not in _NOT_WORDS and k not in offloads
    ]
    return " ".join(words)


def maxtext_tflop(arch: dict[str, int], batch: int, seq: int, causal: bool) -> float:
    """TFLOP per device per step by MaxText's calculate_tflops_training_per_device (maxtext
    0.2.5, dense and dropless-MoE branches): 3 x (FFN + QKV + out projection per layer, plus
    the unembedding) + 3 x attention, attention ``4 B S^2 heads head_dim`` halved if causal."""
    b, s, e = batch, seq, arch["emb"]
    acts = arch.get("acts", 2)  # swiglu: 2 wi + wo; the 2023 models' relu: 1 wi + wo
    ffn = 2 * b * s * arch["mlp"] * e * acts + 2 * b * s * arch["mlp"] * e
    if arch.get("experts", 1) > 1:
        ffn = 2 * b * s * e * arch["experts"] + ffn * arch["top_k"]
    qkv = 2 * b * s * e * (arch["heads"] + 2 * arch["kv"]) * arch["head_dim"]
    proj = 2 * b * s * e * arch["heads"] * arch["head_dim"]
    attention = 4 * b * s**2 * arch["heads"] * arch["head_dim"] / (2 if causal else 1)
    embedding = 2 * b * s * e * arch["vocab"]
    weights = ((ffn + qkv + proj) * arch["layers"] + embedding) * 3
    return (weights + attention * arch["layers"] * 3) / 1e12


def maxtext_2023_tflop(arch: dict[str, int], batch: int, seq: int) -> float:
    """TFLOP per device per step as MaxText's train.py counted in December 2023
    (``calculate_training_tflops``): ``6 x params x tokens`` (params from the pytree: the
    embedding once, being the logits' too; each layer's norm, q/k/v/out and mlp wi/wo; the final
    norm) plus causal attention ``12 heads layers head_dim S^2 B / 2``."""
    e, layers = arch["emb"], arch["layers"]
    width = arch["heads"] * arch["head_dim"]
    layer = e + 4 * e * width + (arch["acts"] + 1) * e * arch["mlp"]
    params = arch["vocab"] * e + layers * layer + e
    attention = 12 * arch["heads"] * layers * arch["head_dim"] * seq**2 * batch / 2
    return (6 * params * seq * batch + attention) / 1e12


_TFLOPS_2023 = "TFLOP/s/chip (2023 count)"


def published_step(row: dict[str, Any]) -> tuple[float, str, float]:
    """(seconds a step the row stands for, the quantity it publishes, its value)."""
    tokens = row["per_device_batch_size"] * row["seq_len"]
    if row.get("flop_convention") == "maxtext-2023":
        arch = ARCH[row["hf_or_maxtext_model"]]
        tflop = maxtext_2023_tflop(arch, row["per_device_batch_size"], row["seq_len"])
        return tflop / row["tflops_per_chip"], _TFLOPS_2023, row["tflops_per_chip"]
    if row["tokens_per_s_per_chip"]:
        return tokens / row["tokens_per_s_per_chip"], "tok/s/chip", row["tokens_per_s_per_chip"]
    tflop = maxtext_tflop(
        ARCH[row["hf_or_maxtext_model"]], row["per_device_batch_size"], row["seq_len"], False
    )
    mfu = row["mfu"]
    return tflop * 1e12 / (mfu * PEAK[row["generation"]]), "MFU (full attn)", mfu


_SPLIT = ("matmul", "attention", "memory", "collective", "contention", "transfer", "launch")


def compile_once(r: Rebuild, row: dict[str, Any], timeout_s: int) -> dict[str, Any]:
    """The row's step at its own batch, compiled and priced in a child process (``--one``)."""
    chips, b, seq = row["chips"], row["per_device_batch_size"], row["seq_len"]
    out_json = Path("/tmp") / f"tpu_published_{r.row}.json"
    out_json.unlink(missing_ok=True)
    words = words_of(row)
    args = [words, r.policy, r.target, str(b * chips), str(seq), str(out_json)]
    out: dict[str, Any] = {
        "per_device_batch": b,
        "maxtext": words,
        "command": f"remat-kit report --maxtext '{words}' --batch {b * chips} --seq {seq} "
        f"--target {r.target} --policy {r.policy}",
    }
    env = dict(os.environ)
    if r.libtpu_flags:
        # libtpu reads its flags as it starts; remat-kit's cache keys do not name them, so a
        # flagged compile is kept in a cache of its own.
        env["LIBTPU_INIT_ARGS"] = r.libtpu_flags
        tag = hashlib.sha256(r.libtpu_flags.encode()).hexdigest()[:12]
        env["REMAT_KIT_CACHE_DIR"] = str(Path(tempfile.gettempdir()) / f"tpu_published_{tag}")
        out["libtpu_flags"] = r.libtpu_flags
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, __file__, "--one", *args], capture_output=True,
                              text=True, timeout=timeout_s, cwd=ROOT, env=env)  # fmt: skip
    except subprocess.TimeoutExpired:
        out["status"] = f"no compile within {timeout_s} s"
        return out
    out["wall_s"] = round(time.perf_counter() - start, 1)
    out["load_avg"] = [round(x, 2) for x in os.getloadavg()]  # the machine's load as it ended
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
    out.update(_priced(st))
    kernels = out_json.with_suffix(".kernels.json")
    if kernels.exists():
        held = json.loads(kernels.read_text())
        _keep_kernels(r.row, held)
        out.update(_unpriced(held))
    return out


def _unpriced(kernels: list[dict[str, Any]]) -> dict[str, Any]:
    """The Pallas kernels the model could not price (a ``tpu_custom_call`` that is neither
    splash attention nor carries a CostEstimate is priced as memory, its FLOPs 0): a row
    with any is not a prediction of its step."""
    found = {k["name"]: k["count"] for k in kernels
             if k["op"] == "tpu_custom_call" and k["kind"] == "memory"}  # fmt: skip
    return {"unpriced_pallas": found} if found else {}


def _priced(st: dict[str, Any]) -> dict[str, Any]:
    """A compile's fields from its StepTime (``to_dict``)."""
    return dict(
        status="priced",
        seconds=st["seconds"],
        split={k: st[f"{k}_seconds"] for k in _SPLIT},
        collective_hidden_seconds=st["collective_hidden_seconds"],
        recompute_seconds=st["recompute_seconds"],
        flops=st["flops"],
        model_flops=st["model_flops"],
        kernels=st["kernels"],
        our_mfu=st.get("mfu"),
    )


def _keep_kernels(row: int, kernels: list[dict[str, Any]]) -> None:
    """The row's kernels into KERNELS (gzipped JSON, row -> kernels), for ``--reprice``."""
    held = json.loads(gzip.decompress(KERNELS.read_bytes())) if KERNELS.exists() else {}
    held[str(row)] = kernels
    KERNELS.write_bytes(gzip.compress(json.dumps(held).encode(), mtime=0))


def reprice(selected: list[int] | None) -> list[dict[str, Any]]:
    """The rows written, their kernels (KERNELS) priced again by the code as it is now: a
    change of pricing without MaxText's compiles. Rows without kept kernels stay as they were."""
    import remat_kit as rk
    from remat_kit.timing import speed_of, step_time
    from remat_kit.xla import Kernel

    data = json.loads(DATA.read_text())
    held = json.loads(gzip.decompress(KERNELS.read_bytes())) if KERNELS.exists() else {}
    doc = json.loads(OUT.read_text())
    by_row = {r.row: r for r in REBUILDS}
    rows = []
    for x in doc["rows"]:
        if str(x["row"]) in held and (not selected or x["row"] in selected):
            r, t = by_row[x["row"]], rk.target(by_row[x["row"]].target)
            kernels = [Kernel(**k) for k in held[str(x["row"])]]
            st = step_time(kernels, speed_of(t), devices_per_host=t.devices_per_host)
            got = {**x["compiles"][0], **_priced(st.to_dict()), "repriced": True}
            got.update(_unpriced(held[str(x["row"])]))
            x = _against(r, data["rows"][r.row], {k: x[k] for k in _HEAD}, got)
        rows.append(x)
    _write(rows, doc.get("wall_s", 0.0))
    _show(rows)
    return rows


def _one(words: str, policy: str, target: str, batch: str, seq: str, out: str) -> None:
    """The child: MaxText's step through ``rk.sources.measure`` (the library call under
    ``remat-kit report --maxtext``; the command line's name check first traces the step at one
    sequence, which splash attention refuses over 64 devices), its report written to ``out``."""
    import remat_kit as rk
    import remat_kit.analysis as analysis
    from remat_kit_models.maxtext import MaxTextSpec

    priced = analysis._step_time

    def keep(kernels: Any, t: Any) -> Any:
        # The program's kernels beside the report: a change of pricing reprices them
        # (``--reprice``) without the compile (MaxText's TPU compiles are not cached).
        rows = [dataclasses.asdict(k) for k in kernels]
        Path(out).with_suffix(".kernels.json").write_text(json.dumps(rows))
        return priced(kernels, t)

    analysis._step_time = keep
    src = rk.sources.resolve(MaxTextSpec(words))
    config = rk.TrainConfig(int(batch), int(seq))
    rep = rk.sources.measure(src, policy, rk.target(target), config, warn=False)
    Path(out).write_text(json.dumps(rep.to_dict(), default=str))


def run_one(r: Rebuild, row: dict[str, Any], timeout_s: int = TIMEOUT_S) -> dict[str, Any]:
    """The row at its own per-device batch, priced; the row's figures beside ours."""
    chips = row["chips"]
    out: dict[str, Any] = {"row": r.row, "label": r.label, "slice": r.target, "chips": chips,
                           "policy": r.policy, "note": r.note}  # fmt: skip
    return _against(r, row, out, compile_once(r, row, timeout_s))


_HEAD = ("row", "label", "slice", "chips", "policy", "note")


def _against(r: Rebuild, row: dict[str, Any], out: dict[str, Any], got: dict[str, Any]) -> dict:
    """``out`` with the compile ``got`` and its prediction beside the row's published figure."""
    b, s = row["per_device_batch_size"], row["seq_len"]
    out["compiles"] = [got]
    if got["status"] != "priced":
        out["status"] = f"b{b}: {got['status']}"
        return out
    if got.get("unpriced_pallas"):
        # e.g. MaxText's megablox gmm (a MoE's expert products) carries no CostEstimate
        names = ", ".join(f"{n} x{c}" for n, c in got["unpriced_pallas"].items())
        out["status"] = (f"not a prediction: Pallas kernels priced as memory, their FLOPs "
                         f"not counted ({names}); {got['seconds']:.2f} s without them")  # fmt: skip
        return out
    seconds = got["seconds"]
    pub_s, quantity, pub_value = published_step(row)
    arch = ARCH[row["hf_or_maxtext_model"]]
    peak = PEAK[row["generation"]]
    tokens = b * s
    old = maxtext_tflop(arch, b, s, causal=False)
    new = maxtext_tflop(arch, b, s, causal=True)
    if quantity == "tok/s/chip":
        predicted_value = tokens / seconds
    elif quantity == _TFLOPS_2023:
        predicted_value = maxtext_2023_tflop(arch, b, s) / seconds
    else:
        predicted_value = old * 1e12 / seconds / peak
    out.update(
        status="priced",
        how="compiled at the row's batch (MaxText's own step, splash attention)",
        quantity=quantity,
        published=pub_value,
        predicted=predicted_value,
        error=predicted_value / pub_value - 1,
        published_step_s=pub_s,
        predicted_step_s=seconds,
        step_error=seconds / pub_s - 1,
        split_share={k: v / seconds for k, v in got["split"].items()},
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


def main(selected: list[int] | None, timeout_s: int = TIMEOUT_S) -> list[dict[str, Any]]:
    data = json.loads(DATA.read_text())
    rows: list[dict[str, Any]] = []
    if selected and OUT.exists():  # rows not named keep their last result
        rows = [x for x in json.loads(OUT.read_text())["rows"] if x["row"] not in selected]
    t0 = time.perf_counter()
    by_row = {r.row: r for r in REBUILDS}
    for r in [by_row[i] for i in selected] if selected else REBUILDS:
        res = run_one(r, data["rows"][r.row], timeout_s)
        rows.append(res)
        rows.sort(key=lambda x: [q.row for q in REBUILDS].index(x["row"]))
        _write(rows, time.perf_counter() - t0)
        walls = [t.get("wall_s", timeout_s) for t in res.get("compiles", [])]
        print(f"{r.label}: {res['status']} ({sum(walls):.0f} s)", file=sys.stderr, flush=True)
    _show(rows)
    plot(rows, OUT.with_suffix(".png"))
    return rows


def _show(rows: list[dict[str, Any]]) -> None:
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


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Predicted vs published step time of each priced row, its error over the bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from common import save_png

    priced = [x for x in rows if "error" in x]
    xs = range(len(priced))
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(priced)), 4.2))
    ax.bar([i - 0.2 for i in xs], [x["published_step_s"] for x in priced], 0.4, label="published")
    ax.bar([i + 0.2 for i in xs], [x["predicted_step_s"] for x in priced], 0.4, label="predicted")
    for i, x in zip(xs, priced, strict=True):
        ax.text(i + 0.2, x["predicted_step_s"], f"{x['step_error']:+.0%}", ha="center",
                va="bottom", fontsize=7)  # fmt: skip
    ax.set_xticks(list(xs), [x["label"] for x in priced], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("step time, s")
    ax.set_title("MaxText's published TPU runs: published vs predicted\n(the compiled kernels "
                 "at the chips' published rates; error in step time)", fontsize=10)  # fmt: skip
    ax.legend()
    fig.tight_layout()
    save_png(fig, path)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        _one(*sys.argv[2:8])
    elif sys.argv[1:2] == ["--plot"]:  # the figure from the results written, no compile
        plot(json.loads(OUT.read_text())["rows"], OUT.with_suffix(".png"))
    elif sys.argv[1:2] == ["--reprice"]:  # the kept kernels priced again, no compile
        plot(reprice([int(a) for a in sys.argv[2:]] or None), OUT.with_suffix(".png"))
    else:
        argv, limit = sys.argv[1:], TIMEOUT_S
        if "--timeout" in argv:  # --timeout S: the child's limit in seconds
            i = argv.index("--timeout")
            limit = int(argv[i + 1])
            del argv[i : i + 2]
        main([int(a) for a in argv] or None, limit)
