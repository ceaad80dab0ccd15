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


# Public specifications; see shared/gpu_targets.md.
# fmt: off
GPU_FACTS: Mapping[str, Mapping[str, Any]] = types.MappingProxyType({
    "h100-80gb": _facts("NVIDIA H100 80GB HBM3", (9, 0), 132, 128, 233472, 232448, 2048,
                        3352320000000, 52428800, 1.98, 84942979072, 64e9, 989e12),
    "h100-pcie": _facts("NVIDIA H100 PCIe", (9, 0), 114, 128, 233472, 232448, 2048,
                        2039040000000, 52428800, 1.755, 84942979072, 64e9, 756e12),
    "h200": _facts("NVIDIA H200 141GB HBM3e", (9, 0), 132, 128, 233472, 232448, 2048,
                   4800000000000, 52428800, 1.98, 151397597184, 64e9, 989e12),
    "a100-80gb": _facts("NVIDIA A100-SXM4-80GB", (8, 0), 108, 64, 167936, 166912, 2048,
                        2039040000000, 41943040, 1.41, 85100068864, 32e9, 312e12),
    "a100-40gb": _facts("NVIDIA A100-SXM4-40GB", (8, 0), 108, 64, 167936, 166912, 2048,
                        1555200000000, 41943040, 1.41, 42331013120, 32e9, 312e12),
    "rtx4090": _facts("NVIDIA GeForce RTX 4090", (8, 9), 128, 128, 102400, 101376, 1536,
                      1008000000000, 75497472, 2.52, 25757220864, 32e9, 165e12),
    "l4": _facts("NVIDIA L4", (8, 9), 58, 128, 102400, 101376, 1536,
                 300000000000, 50331648, 2.04, 24152899584, 32e9, 121e12),
})
# fmt: on

ALIASES: Mapping[str, str] = types.MappingProxyType(
    {"h100": "h100-80gb", "h100-sxm": "h100-80gb", "a100": "a100-80gb"}
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
