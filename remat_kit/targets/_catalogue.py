"""The built-in GPUs: public specifications (shared/gpu_targets.md) and the config template."""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ALIASES",
    "CONFIG_TEMPLATE",
    "FACT_KEYS",
    "GPU_FACTS",
    "OPTIONAL_FACTS",
    "SPECIAL",
]


FACT_KEYS = (
    "sms",
    "fp32_per_sm",
    "smem_per_sm",
    "smem_optin",
    "threads_per_sm",
    "hbm_bandwidth",
    "l2_bytes",
    "clock_ghz",
    "memory_bytes",
)
OPTIONAL_FACTS: Mapping[str, Any] = types.MappingProxyType(
    {
        "compute_capability": (9, 0),
        "host_link_bandwidth": None,
        "peak_bf16_flops": None,
        "description": None,
    }
)


def _facts(
    description: str,
    cc: tuple[int, int],
    sms: int,
    fp32_per_sm: int,
    smem_per_sm: int,
    smem_optin: int,
    threads_per_sm: int,
    hbm_bandwidth: int,
    l2_bytes: int,
    clock_ghz: float,
    memory_bytes: int,
    host_link_bandwidth: float,
    peak_bf16_flops: float,
) -> Mapping[str, Any]:
    return types.MappingProxyType(
        {
            "description": description,
            "compute_capability": cc,
            "sms": sms,
            "fp32_per_sm": fp32_per_sm,
            "smem_per_sm": smem_per_sm,
            "smem_optin": smem_optin,
            "threads_per_sm": threads_per_sm,
            "hbm_bandwidth": hbm_bandwidth,
            "l2_bytes": l2_bytes,
            "clock_ghz": clock_ghz,
            "memory_bytes": memory_bytes,
            "host_link_bandwidth": host_link_bandwidth,
            "peak_bf16_flops": peak_bf16_flops,
        }
    )


# Public specifications; see shared/gpu_targets.md. memory_bytes is the total CUDA reports
# on the card (cuMemGetInfo's total, which JAX's allocator takes its fraction of), not the
# datasheet's GB nor nvidia-smi's total (which counts memory CUDA does not hand out):
# - h100-80gb: 85018542080 B = 81080 MiB, measured on a lent H100 80GB HBM3 (jax memory
#   stats: the allocator's total; nvidia-smi said 81559 MiB there).
# - h200: measured on a lent H200 (2026-11-27, jax 0.11.2): jax names the device kind
#   "NVIDIA H200" and its allocator's bytes_limit at the default fraction 0.75 is
#   112583507968 B (107368 MiB); memory_bytes is the total that gives that limit (0.75 of it,
#   floored). torch's published total_memory=143156MB (floored to MiB) is 1.33 MiB less;
#   nvidia-smi says 143771 MiB.
# fmt: off
GPU_FACTS: Mapping[str, Mapping[str, Any]] = types.MappingProxyType({
    "h100-80gb": _facts("NVIDIA H100 80GB HBM3", (9, 0), 132, 128, 233472, 232448, 2048,
                        3352320000000, 52428800, 1.98, 81080 * 2**20, 64e9, 989e12),
    "h100-pcie": _facts("NVIDIA H100 PCIe", (9, 0), 114, 128, 233472, 232448, 2048,
                        2039040000000, 52428800, 1.755, 84942979072, 64e9, 756e12),
    "h200": _facts("NVIDIA H200", (9, 0), 132, 128, 233472, 232448, 2048,
                   4800000000000, 52428800, 1.98, 150111343958, 64e9, 989e12),
    "a100-80gb": _facts("NVIDIA A100-SXM4-80GB", (8, 0), 108, 64, 167936, 166912, 2048,
                        2039040000000, 41943040, 1.41, 85100068864, 32e9, 312e12),
    "a100-40gb": _facts("NVIDIA A100-SXM4-40GB", (8, 0), 108, 64, 167936, 166912, 2048,
                        1555200000000, 41943040, 1.41, 42331013120, 32e9, 312e12),
    "rtx4090": _facts("NVIDIA GeForce RTX 4090", (8, 9), 128, 128, 102400, 101376, 1536,
                      1008000000000, 75497472, 2.52, 25757220864, 32e9, 165e12),
    "l4": _facts("NVIDIA L4", (8, 9), 58, 128, 102400, 101376, 1536,
                 300000000000, 50331648, 2.04, 24152899584, 32e9, 121e12),
    # The cards added for issue 26, each figure with its source. "CUDA reports" is
    # cudaGetDeviceProperties on the card, as torch.cuda.get_device_properties prints it
    # (total_memory floored to MiB); memory_bytes is that total, as for the H100 above.
    # Shared memory and threads per SM: the CUDA C++ Programming Guide's table of compute
    # capabilities (8.6, 8.9: 100 KB per SM, 99 KB per block opt-in, 1536 threads per SM;
    # 9.0, 10.0: 228 KB per SM, 227 KB per block opt-in, 2048 threads per SM).
    "b200": _facts(
        "NVIDIA B200",                    # CUDA device name
        cc=(10, 0),                       # sm_100: XLA compiles for it (sm_100a PTX)
        sms=148,                          # CUDA reports 148 (pytorch/ao#4002)
        # HGX B200 datasheet: 600 TFLOP/s FP32 for 8 GPUs = 8 x 148 x 128 x 2 x ~1.98 GHz
        fp32_per_sm=128,
        smem_per_sm=233472,               # 228 KiB: CUDA reports it (pytorch/ao#4002)
        smem_optin=232448,                # 227 KiB per block (Blackwell tuning guide)
        threads_per_sm=2048,              # CUDA reports it (pytorch/ao#4002)
        # The 7680-bit bus x 3996 MHz x 2 that CUDA and nvidia-smi report (pytorch/ao#4002):
        # 7.67 TB/s, below the DGX B200 / HGX B200 datasheet's 8 TB/s; the lower is kept.
        hbm_bandwidth=7672320000000,
        l2_bytes=132644864,               # 126.5 MiB: CUDA reports it (pytorch/ao#4002)
        # Not in NVIDIA's datasheets: 1965 MHz is the highest SM clock rented B200s are
        # locked at in public benchmark notes (as 1980 MHz is the H100's).
        clock_ghz=1.965,
        # CUDA reports 182631 MiB (ECC on; another driver reported 182642, the smaller is
        # kept; nvidia-smi 183359 MiB): the "180 GB" of the DGX B200 / HGX B200 datasheets.
        # Not the 192 GB some list: that is the HBM3e stacks, more than CUDA hands out.
        memory_bytes=182631 * 2**20,
        host_link_bandwidth=64e9,         # PCIe Gen5 x16, per direction
        # HGX B200 datasheet: 36 PFLOP/s FP16/BF16 for 8 GPUs with sparsity: 2.25 dense each
        peak_bf16_flops=2.25e15,
    ),
    # NVIDIA publishes no datasheet for the H20; its spec sheet to partners is widely
    # reported: 96 GB HBM3, 4.0 TB/s, 60 MB L2, 148 TFLOP/s dense FP16/BF16, NVLink
    # 900 GB/s, PCIe Gen5 x16.
    "h20": _facts(
        "NVIDIA H20",                     # CUDA device name
        cc=(9, 0),
        sms=78,                           # CUDA reports 78
        fp32_per_sm=128,                  # Hopper SM
        smem_per_sm=233472,               # compute capability 9.0 (above)
        smem_optin=232448,
        threads_per_sm=2048,
        hbm_bandwidth=4000000000000,      # 4.0 TB/s (spec sheet)
        l2_bytes=62914560,                # 60 MB (spec sheet)
        clock_ghz=1.98,                   # not published: the H100 SXM's 1980 MHz assumed
        memory_bytes=97285 * 2**20,       # CUDA reports 97285 MiB (nvidia-smi 97871 MiB)
        host_link_bandwidth=64e9,         # PCIe Gen5 x16, per direction (spec sheet)
        peak_bf16_flops=148e12,           # dense FP16/BF16 (spec sheet)
    ),
    "l40s": _facts(
        "NVIDIA L40S",                    # CUDA device name
        cc=(8, 9),
        sms=142,                          # CUDA reports 142
        fp32_per_sm=128,                  # L40S datasheet: 18176 CUDA cores = 142 x 128
        smem_per_sm=102400,               # compute capability 8.9 (above)
        smem_optin=101376,
        threads_per_sm=1536,
        hbm_bandwidth=864000000000,       # 864 GB/s GDDR6 (L40S datasheet)
        # Not in the L40S datasheet: 48 MB per the TechPowerUp GPU database (the whole
        # AD102 has 96 MB, Ada whitepaper); the smaller is kept.
        l2_bytes=50331648,
        clock_ghz=2.52,                   # datasheet: 91.6 TFLOP/s FP32 = 142 x 256 x 2.52 GHz
        # CUDA reports 45589 MiB: 48 GB with ECC on, the L40S's default (nvidia-smi 46068
        # MiB); with ECC off the card has about 1/16 more.
        memory_bytes=45589 * 2**20,
        host_link_bandwidth=32e9,         # datasheet: PCIe Gen4 x16, 64 GB/s bidirectional
        peak_bf16_flops=362.05e12,        # datasheet: BF16 362.05 dense, 733 with sparsity
    ),
    "rtx-a6000": _facts(
        "NVIDIA RTX A6000",               # CUDA device name
        cc=(8, 6),
        sms=84,                           # CUDA reports 84
        fp32_per_sm=128,                  # RTX A6000 datasheet: 10752 CUDA cores = 84 x 128
        smem_per_sm=102400,               # compute capability 8.6 (above)
        smem_optin=101376,
        threads_per_sm=1536,
        hbm_bandwidth=768000000000,       # 768 GB/s GDDR6 (RTX A6000 datasheet)
        l2_bytes=6291456,                 # 6144 KB (Ampere GA102 whitepaper)
        clock_ghz=1.8,                    # datasheet: 38.7 TFLOP/s FP32 = 84 x 256 x 1.8 GHz
        # CUDA reports 48676 MiB: 48 GB with ECC off, the card's default (nvidia-smi 49140
        # MiB); with ECC on about 1/16 less.
        memory_bytes=48676 * 2**20,
        # PCIe Gen4 x16 (datasheet); its NVLink bridge joins two cards only, so not used
        host_link_bandwidth=32e9,
        # GA102 whitepaper: 154.8 TFLOP/s bf16 with FP32 accumulate, dense; the datasheet's
        # 309.7 "tensor performance" is with sparsity
        peak_bf16_flops=154.8e12,
    ),
})
# fmt: on

ALIASES: Mapping[str, str] = types.MappingProxyType(
    {
        "h100": "h100-80gb",
        "h100-sxm": "h100-80gb",
        "a100": "a100-80gb",
        "a6000": "rtx-a6000",
        "rtxa6000": "rtx-a6000",
        "h20-96gb": "h20",
        "b200-180gb": "b200",
    }
)
SPECIAL = ("cpu", "local")

CONFIG_TEMPLATE = """\
gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {smem_per_sm}
  threads_per_core_limit: {threads_per_sm}
  core_count: {sms}
  fpus_per_core: {fp32_per_sm}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {hbm_bandwidth}
  l2_cache_size: {l2_bytes}
  clock_rate_ghz: {clock_ghz}
  device_memory_size: {memory_bytes}
  shared_memory_per_block_optin: {smem_optin}
  cuda_compute_capability {{ major: {cc_major} minor: {cc_minor} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 1 }}
device_description_str: "{description}"
"""
