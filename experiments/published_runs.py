"""Published multi-GPU MaxText runs, each compiled deviceless as it ran and priced by the model.

The runs (configs read from their sources; ``/work/scratch``-free: every fact below is cited):

- **JAX-Toolbox** (NVIDIA/JAX-Toolbox docs/frameworks/maxtext/README.md and
  example_slurm.sub): Llama2-7B on one DGX H100 (8x H100 80G), FSDP 8, 2 sequences per GPU of
  4096, ``minimal_flash``, cuDNN flash attention (``cudnn_flash_te``), layers unrolled
  (``scan_layers=false``), XLA's remat pass off: 0.721 s/step.
- **MaxText on A3** (AI-Hypercomputer/maxtext MaxText/configs/a3/llama_2_7b/README.md and its
  ``{1,2,4,8,16}vm.sh``, commit efb6d9e4, 2024-04-09): Llama2-7B, ``ici_fsdp_parallelism=8``
  inside a node, ``dcn_data_parallelism`` = nodes, 4 sequences per GPU of 4096,
  ``minimal_flash``, ``cudnn_flash_te``, unrolled, XLA's remat pass off: 492 / 422 / 407 /
  409 / 375 TFLOP/s per chip on 1 / 2 / 4 / 8 / 16 A3 VMs. MaxText's formula of that date
  (max_utils.py ``calculate_tflops_training_per_device``: 6 x parameters x tokens plus causal
  attention, halved) gives the step time each figure stands for. The README says "A3
  (h100-80gb-8)" and predates A3 Mega: an A3 High (``a3-high``), GPUDirect-TCPX.
- **dgxc-benchmarking** (NVIDIA/dgxc-benchmarking maxtext/README_70b.md and configure.sh,
  v24.11 / v25.01): Llama2-70B BF16 on the DGX H100 reference architecture (8x 400 Gb/s
  InfiniBand per node), 2 sequences per GPU of 4096, scanned layers, cuDNN flash attention,
  ``remat_policy=custom`` keeping q/k/v/qkv/out projections and ``mlpwo`` on the device (the
  set of MaxText's ``save_dot_except_mlpwi``), FSDP over all GPUs up to 256 and FSDP 128 x
  data parallel beyond, XLA's remat pass off: 6.999 / 7.072 / 7.153 / 7.091 / 7.084 / 7.066
  s/step on 64 / 128 / 256 / 512 / 1024 / 2048 GPUs.

Each run is compiled in a process of its own with the XLA flags its script set (those this
XLA still knows; :data:`DROPPED` says which were left out and why), for the run's node
(:func:`remat_kit.targets.node`) and mesh. The full meshes are compiled, 2,048 devices
included: the per-device program of an SPMD compile does not grow with the mesh.

Usage: ``python experiments/published_runs.py`` prints the table (``experiments/step_time.py
--only published`` runs it and saves the JSON and the figure); ``--run N`` compiles one run
and prints its JSON (what the table's subprocesses do).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from common import ROOT, preset_report

_JT_FLAGS = (
    "--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_command_buffer= "
    "--xla_gpu_all_reduce_combine_threshold_bytes=1073741824 "
    "--xla_gpu_all_gather_combine_threshold_bytes=1073741824 "
    "--xla_gpu_reduce_scatter_combine_threshold_bytes=134217728 "
    "--xla_gpu_enable_pipelined_all_gather=true --xla_gpu_enable_pipelined_reduce_scatter=true "
    "--xla_gpu_enable_pipelined_all_reduce=true --xla_gpu_enable_while_loop_double_buffering=true "
    "--xla_gpu_enable_all_gather_combine_by_dim=false "
    "--xla_gpu_enable_reduce_scatter_combine_by_dim=false "
    "--xla_disable_hlo_passes=rematerialization"
)


def _a3_flags(all_reduce: int, all_gather: int, reduce_scatter: int) -> str:
    return (
        "--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_triton_gemm=false "
        "--xla_gpu_enable_command_buffer= --xla_gpu_enable_highest_priority_async_stream=true "
        f"--xla_gpu_all_reduce_combine_threshold_bytes={all_reduce} "
        f"--xla_gpu_all_gather_combine_threshold_bytes={all_gather} "
        f"--xla_gpu_reduce_scatter_combine_threshold_bytes={reduce_scatter} "
        "--xla_gpu_enable_pipelined_all_gather=true --xla_gpu_enable_pipelined_reduce_scatter=true "
        "--xla_gpu_enable_pipelined_all_reduce=true "
        "--xla_gpu_enable_while_loop_double_buffering=true "
        "--xla_gpu_enable_all_gather_combine_by_dim=false "
        "--xla_gpu_enable_reduce_scatter_combine_by_dim=false "
        "--xla_disable_hlo_passes=rematerialization"
    )


def _dgxc_flags(nodes: int) -> str:
    # configure.sh: BASE_THRESHOLD = 8 GiB; all-reduce and all-gather at a quarter of it,
    # reduce-scatter at 1/256 (1/512 from 64 nodes).
    base = 8 * 2**30
    scatter = base // (512 if nodes >= 64 else 256)
    return (
        "--xla_gpu_enable_triton_gemm=false --xla_gpu_enable_command_buffer= "
        "--xla_gpu_enable_highest_priority_async_stream=true "
        f"--xla_gpu_all_reduce_combine_threshold_bytes={base // 4} "
        f"--xla_gpu_all_gather_combine_threshold_bytes={base // 4} "
        f"--xla_gpu_reduce_scatter_combine_threshold_bytes={scatter} "
        "--xla_gpu_enable_pipelined_all_gather=true --xla_gpu_enable_pipelined_reduce_scatter=true "
        "--xla_gpu_enable_pipelined_all_reduce=true "
        "--xla_gpu_enable_while_loop_double_buffering=true "
        "--xla_gpu_enable_all_gather_combine_by_dim=false "
        "--xla_gpu_enable_reduce_scatter_combine_by_dim=false "
        "--xla_disable_hlo_passes=rematerialization "
        "--xla_gpu_enable_latency_hiding_scheduler=true"
    )


#: Flags of the scripts this XLA (jax 0.12) no longer has: each is fatal in XLA_FLAGS.
DROPPED = {
    "--xla_gpu_graph_level=0": "command buffers off: --xla_gpu_enable_command_buffer= says it",
    "--xla_gpu_enable_async_all_gather=true (and _reduce_scatter, _all_reduce)": (
        "asynchronous collectives are XLA's default now"
    ),
    "--xla_gpu_simplify_all_fp_conversions": "removed from XLA",
    "--xla_gpu_enable_triton_softmax_fusion=false": "removed from XLA",
    "--xla_gpu_pgle_profile_file_or_directory_path": (
        "dgxc's profile of a real run (PGLE) is not published; the latency-hiding scheduler "
        "prices by its own model here"
    ),
}

_LLAMA2_7B = (
    ("layers", 32),
    ("width", 4096),
    ("heads", 32),
    ("kv_heads", 32),
    ("ff", 11008),
    ("vocab", 32000),
)
_LLAMA2_70B = (("vocab", 32000),)  # llama3-70b's shape (GQA 64/8, ff 28672) with Llama 2's vocab
_A3_THRESHOLDS = {  # {1,2,4,8,16}vm.sh: all-reduce / all-gather / reduce-scatter bytes
    1: (134217728, 134217728, 67108864),
    2: (67108864, 134217728, 67108864),
    4: (536870912, 134217728, 67108864),
    8: (1073741824, 134217728, 67108864),
    16: (1073741824, 134217728, 134217728),
}


@dataclasses.dataclass(frozen=True)
class Run:
    """One published run: what ran, on what, and what it measured.

    ``published_tflops`` (per chip, MaxText's formula of the run's date) stands for
    ``maxtext_tflop / published_tflops`` seconds per step."""

    label: str
    family: str
    preset: str
    overrides: tuple[tuple[str, int], ...]
    scan: bool
    node: str
    gpus: int
    shard: str
    per_gpu_batch: int
    seq: int
    policy: str
    xla_flags: str
    published_seconds: float | None = None
    published_tflops: float | None = None

    @property
    def published_step(self) -> float:
        if self.published_seconds is not None:
            return self.published_seconds
        return maxtext_2024_tflop(self) / self.published_tflops


def maxtext_2024_tflop(run: Run) -> float:
    """TFLOP per device per step by MaxText's formula of April 2024 (max_utils.py at efb6d9e4):
    ``6 x parameters x tokens`` (embeddings counted) plus attention's
    ``12 x heads x layers x head_dim x seq^2 x batch``, halved for causality."""
    o = dict(run.overrides)
    layers, width, heads, kv, ff, vocab = (o[k] for k in ("layers", "width", "heads",
                                                           "kv_heads", "ff", "vocab"))  # fmt: skip
    head_dim = width // heads
    per_layer = width * head_dim * (2 * heads + 2 * kv) + 3 * width * ff + 2 * width
    params = layers * per_layer + 2 * vocab * width + width
    b, s = run.per_gpu_batch, run.seq
    weights = 6 * params * s * b
    attention = 12 * heads * layers * head_dim * s**2 * b / 2
    return (weights + attention) / 1e12


RUNS: tuple[Run, ...] = (
    Run(
        "JAX-Toolbox Llama2-7B, 1x DGX H100",
        "7b-dgx",
        "llama2-13b",
        _LLAMA2_7B,
        False,
        "dgx-h100",
        8,
        "fsdp:8",
        2,
        4096,
        "maxtext:remat_policy=minimal_flash",
        _JT_FLAGS,
        published_seconds=0.721,
    ),
    *(
        Run(
            f"MaxText Llama2-7B, {n}x A3",
            "7b-a3",
            "llama2-13b",
            _LLAMA2_7B,
            False,
            "a3-high",
            8 * n,
            "fsdp:8" if n == 1 else f"dp:{n},fsdp:8",
            4,
            4096,
            "maxtext:remat_policy=minimal_flash",
            _a3_flags(*_A3_THRESHOLDS[n]),
            published_tflops=tflops,
        )
        for n, tflops in ((1, 492.0), (2, 422.0), (4, 407.0), (8, 409.0), (16, 375.0))
    ),
    *(
        Run(
            f"dgxc Llama2-70B, {gpus} H100",
            "70b-dgx",
            "llama3-70b",
            _LLAMA2_70B,
            True,
            "dgx-h100",
            gpus,
            f"fsdp:{gpus}" if gpus <= 256 else f"dp:{gpus // 128},fsdp:128",
            2,
            4096,
            "maxtext:remat_policy=save_dot_except_mlpwi",
            _dgxc_flags(gpus // 8),
            published_seconds=seconds,
        )
        for gpus, seconds in (
            (64, 6.999),
            (128, 7.072),
            (256, 7.153),
            (512, 7.091),
            (1024, 7.084),
            (2048, 7.066),
        )
    ),
)


def predict(run: Run) -> dict[str, Any]:
    """Compiles ``run`` here (XLA_FLAGS already set) and prices it: the row's figures."""
    import resource

    import remat_kit as rk
    from remat_kit_models.spec import PresetSpec

    spec = PresetSpec(run.preset, overrides=run.overrides, scan_layers=run.scan, shard=run.shard)
    t = rk.target(rk.targets.node(run.node).gpu, devices=run.gpus, node=run.node)
    config = rk.TrainConfig(run.per_gpu_batch * run.gpus, run.seq)
    start = time.perf_counter()
    report = preset_report(spec, config, run.policy, t)
    st = report.step_time
    published = run.published_step
    out = {
        "run": run.label,
        "family": run.family,
        "node": run.node,
        "gpus": run.gpus,
        "shard": run.shard,
        "policy": run.policy,
        "published s": published,
        "predicted s": st.seconds,
        "error": st.seconds / published - 1,
        "split": {k: round(v, 4) for k, v in st.split().items()},
        "collective_hidden_seconds": st.collective_hidden_seconds,
        "exposed share": st.collective_seconds / st.seconds,
        "mfu": st.mfu,
        "peak_gib": report.peak_bytes / 2**30,
        "compile_seconds": time.perf_counter() - start,
        "max_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    if run.published_tflops is not None:
        out["published TFLOP/s"] = run.published_tflops
        out["predicted TFLOP/s"] = maxtext_2024_tflop(run) / st.seconds
    return out


def run_all(indices: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """Every run (or ``indices``), each in a fresh process with its XLA flags."""
    rows = []
    for i in indices if indices is not None else range(len(RUNS)):
        env = {**os.environ, "XLA_FLAGS": RUNS[i].xla_flags, "JAX_PLATFORMS": "cpu"}
        done = subprocess.run(
            [sys.executable, __file__, "--run", str(i)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            cwd=ROOT,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{RUNS[i].label}: exit {done.returncode}\n{done.stderr[-3000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(
            f"{rows[-1]['run']}: predicted {rows[-1]['predicted s']:.3f} s vs "
            f"{rows[-1]['published s']:.3f} s ({rows[-1]['error']:+.1%})",
            file=sys.stderr,
        )
    return rows


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--run":
        print(json.dumps(predict(RUNS[int(sys.argv[2])])))
    else:
        for row in run_all([int(a) for a in sys.argv[1:]] or None):
            print(json.dumps(row))
