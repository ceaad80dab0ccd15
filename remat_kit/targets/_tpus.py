"""The built-in TPUs: public specifications of Cloud TPU generations, each figure cited.

Five generations, keyed as users name their slices: ``v4``, ``v5e`` (Cloud's "v5litepod"),
``v5p``, ``v6e`` (Trillium) and ``tpu7x`` (Ironwood, "v7x"; Cloud TPU and MaxText name its
slices ``tpu7x-N``). Figures are per chip unless a key says per device; a *device* is what JAX
lists (``jax.devices()``): one per chip on v5e, v6e and (as MaxText and libtpu's ``megacore``
config lay them out) v4 and v5p, two per chip on TPU7x.

Sources, read 2026-11-29 (each figure below names its own):

* Cloud TPU system-architecture pages: https://cloud.google.com/tpu/docs/v4,
  https://docs.cloud.google.com/tpu/docs/v5e, https://docs.cloud.google.com/tpu/docs/v5p,
  https://docs.cloud.google.com/tpu/docs/v6e, https://docs.cloud.google.com/tpu/docs/tpu7x
* "How to Scale Your Model" (jax-ml/scaling-book, tpus.md at 0819a7d8, 2025-02-18):
  https://github.com/jax-ml/scaling-book/blob/0819a7d8c55ddc113f5cba0285a5f97380cac1e3/tpus.md
  for what the Cloud pages leave out (v5p int8 rate, ICI link counts, per-link one-way rates).
* MaxText's ``accelerator_to_spec_map.py`` (AI-Hypercomputer/maxtext at e591f30c, 2026-08-22;
  identical in the ``maxtext`` 0.2.5 wheel this project installs):
  https://github.com/AI-Hypercomputer/maxtext/blob/e591f30cbbf217ed67ef71263ec0538239f9c3b8/src/maxtext/utils/accelerator_to_spec_map.py
* Measured here (2026-11-29): jax 0.12.0.1 with libtpu 0.0.51, ``JAX_PLATFORMS=cpu``,
  ``jax.experimental.topologies.get_topology_desc(topology_name=..., platform="tpu")``:
  the ``device_kind`` strings, the topology spellings libtpu accepts, and the HBM limit its
  deviceless compiler enforces (:data:`TPU_FACTS` ``bytes_limit_per_device``).

**The usable share of HBM.** A TPU has no allocator fraction like the GPU client's
``XLA_PYTHON_CLIENT_MEM_FRACTION`` (https://docs.jax.dev/en/latest/gpu_memory_allocation.html
describes it for GPUs only). The whole of a device's HBM, less a fixed reserve the TPU runtime
keeps, is ``memory_stats()["bytes_limit"]``; the Cloud v5p page says it in words ("Each TPU v5p
chip has 96 GiB of physical HBM. The preceding table lists 95 GiB to account for HBM that the
TPU system and the libtpu runtime reserve ... JAX ... report[s] user-allocatable HBM rather than
total physical capacity", https://docs.cloud.google.com/tpu/docs/v5p). libtpu's compiler checks
a program against the same limit at compile time, deviceless too: a program that does not fit
fails to compile with ``RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom`` (it is not rematerialized
to fit), and its report itemizes "reserved" (the runtime's share) and "program" (the executable's
own code, which counts against the limit as well). Measured with a one-buffer program (``a + 1``
on a donated ``uint8[n]``), bisected to 512 bytes, for each generation's one-chip topology:

======  ==================  ===========  ===========================  ============================
gen     HBM per device      reserved     limit = HBM - reserved (B)   real-TPU ``bytes_limit`` (B)
======  ==================  ===========  ===========================  ============================
v4      32 GiB (megacore)   ~1.25 GiB    33014414336                  33014415360 [1]
v5e     16 GiB              258 MiB      16909336576                  16909332480 [2]
v5p     96 GiB              279 MiB      102786662400                 (95 GiB per the Cloud page)
v6e     31.5 GiB            264 MiB      33546043392                  33550237696 [3]
v7x     95 GiB per core     268 MiB      101724454912                 (not found)
======  ==================  ===========  ===========================  ============================

[1] jax-ml/jax#1491 (2023, a v4 by its 30.75 GiB; the device is not named there). A 2024
pytorch/xla#7086 comment shows 34088157184 (32 GiB - 259 MiB) on an unnamed TPU: if that was
a v4, newer runtimes reserve ~1 GiB less there than libtpu 0.0.51's compiler assumes.
[2] A Kaggle TPU v5e-8 training log (8 devices of 16 GB) printing ``memory_stats()``.
[3] vllm-project/vllm#16211 (2025-04, "gpu_type": "v6e", ``gpu_memory_per_device``, the
``bytes_limit`` torch_xla reads); also Enzyme-JAX#2422 ("Limit: 31.246 GiB", "Used 215.17G of
31.25G hbm"). Runtimes differ from this libtpu by up to 4 MiB.

So a target's usable bytes per device is ``bytes_limit_per_device``; per chip, multiply by
``devices_per_chip``. The rule is the runtime's, not a fraction: 1.6 % of a v5e's HBM, 0.3 %
of a v5p's, 3.9 % of a v4's.

Example:
  >>> f = TPU_FACTS["v5e"]
  >>> f["device_kind"], f["topology_prefix"], f["torus_dims"]
  ('TPU v5 lite', 'v5e', 2)
  >>> f["peak_bf16_flops"] / 1e12, f["bytes_limit_per_device"]
  (197.0, 16909336576)
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

__all__ = [
    "TPU_FACTS",
    "TPU_FACT_KEYS",
]

GiB = 2**30
MiB = 2**20

#: The keys every :data:`TPU_FACTS` entry has (None where no source gives the figure).
TPU_FACT_KEYS = (
    "description",
    "device_kind",
    "topology_prefix",
    "topology_prefixes_accepted",
    "chip_config_name",
    "tensorcores_per_chip",
    "devices_per_chip",
    "torus_dims",
    "pod_chips",
    "hbm_bytes_per_chip",
    "hbm_bytes_per_device",
    "hbm_reserved_bytes_per_device",
    "bytes_limit_per_device",
    "hbm_bandwidth",
    "peak_bf16_flops",
    "peak_int8_ops",
    "peak_fp8_flops",
    "ici_links_per_chip",
    "ici_bandwidth_per_chip_bidir",
    "ici_link_bandwidth_one_way",
    "dcn_bandwidth_per_chip",
    "host_link_bandwidth_per_chip",
    "mxu_size",
    "chips_per_host",
    "chips_per_vm",
    "sources",
)

_V4 = "https://cloud.google.com/tpu/docs/v4"
_V5E = "https://docs.cloud.google.com/tpu/docs/v5e"
_V5P = "https://docs.cloud.google.com/tpu/docs/v5p"
_V6E = "https://docs.cloud.google.com/tpu/docs/v6e"
_V7X = "https://docs.cloud.google.com/tpu/docs/tpu7x"
_V7X_GKE = "https://docs.cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood"
_BOOK = (
    "https://github.com/jax-ml/scaling-book/blob/0819a7d8c55ddc113f5cba0285a5f97380cac1e3/tpus.md"
)
_MEASURED = "measured here: jax 0.12.0.1, libtpu 0.0.51, deviceless (module docstring)"


def _facts(**kw: Any) -> Mapping[str, Any]:
    assert tuple(kw) == TPU_FACT_KEYS, sorted(set(kw) ^ set(TPU_FACT_KEYS))
    return types.MappingProxyType(kw)


# Bandwidths are bytes/s. "bidir" is both directions together, as the Cloud pages state ICI;
# "one way" is per direction. Cloud's "GBps" is taken as 1e9 B/s, "Gbps" as 1e9 bit/s.
TPU_FACTS: Mapping[str, Mapping[str, Any]] = types.MappingProxyType(
    {
        "v4": _facts(
            description="Cloud TPU v4",
            device_kind="TPU v4",  # measured (get_topology_desc("v4:2x2x1", ...))
            # libtpu 0.0.51 accepts "v4:AxBxC"; MaxText passes chip_config_name="megacore"
            # (one device per chip). Without it libtpu lists one device per TensorCore (8 for
            # v4:2x2x1), each with half the chip's HBM (measured: 15.25 GiB usable per core).
            topology_prefix="v4",
            topology_prefixes_accepted=("v4",),
            chip_config_name="megacore",
            tensorcores_per_chip=2,  # _V4: "Each TPU v4 chip contains two TensorCores"
            devices_per_chip=1,  # under chip_config_name="megacore" (measured)
            torus_dims=3,  # _V4: 3D mesh, a 3D torus on slices of whole 4x4x4 cubes
            pod_chips=4096,  # _V4: "TPU Pod size 4096 chips"
            hbm_bytes_per_chip=32 * GiB,  # _V4: "HBM2 capacity and bandwidth 32 GiB, 1200 GBps"
            hbm_bytes_per_device=32 * GiB,  # megacore: the chip's HBM is one device's
            # libtpu's OOM report: "reserved 1.25G" (its exact value is 32 GiB - the limit)
            hbm_reserved_bytes_per_device=32 * GiB - 33014414336,
            bytes_limit_per_device=33014414336,  # measured; module docstring
            hbm_bandwidth=1200e9,  # _V4: 1200 GBps
            peak_bf16_flops=275e12,  # _V4: "275 teraflops (bf16 or int8)"
            peak_int8_ops=275e12,  # _V4: same figure for int8
            peak_fp8_flops=None,  # not published for v4
            ici_links_per_chip=6,  # _BOOK: "TPU v4 and TPU v5p are connected to the nearest 6"
            ici_bandwidth_per_chip_bidir=None,  # not in the Cloud v4 page
            ici_link_bandwidth_one_way=4.5e10,  # _BOOK interconnect table, TPU v4p
            dcn_bandwidth_per_chip=None,  # not published per chip for v4
            # _BOOK: "PCIe bandwidth for TPU v4 is 16GB / second each way"
            host_link_bandwidth_per_chip=16e9,
            mxu_size=128,  # _BOOK: "a 128x128 systolic array (256x256 on TPU v6e)"
            # Cloud's pricing page: "configurations ranging from four chips (one TPU VM)";
            # _BOOK: host size 2x2x1; MaxText's chips_per_host_bounds (2, 2, 1)
            chips_per_host=4,
            chips_per_vm=4,
            sources=(_V4, _BOOK, "https://cloud.google.com/tpu/pricing", _MEASURED),
        ),
        "v5e": _facts(
            description="Cloud TPU v5e (v5litepod)",
            device_kind="TPU v5 lite",  # measured
            topology_prefix="v5e",  # libtpu accepts "v5e:AxB" (measured; MaxText spells it so)
            topology_prefixes_accepted=("v5e",),
            chip_config_name="default",
            tensorcores_per_chip=1,  # _V5E: "Each v5e chip contains one TensorCore"
            devices_per_chip=1,
            torus_dims=2,  # _V5E: "Interconnect topology 2D torus"
            pod_chips=256,  # _V5E: "TPU Pod size 256 chips"
            # _V5E: "HBM capacity per chip 16 GB"; libtpu models 16 GiB (its limit + reserve)
            hbm_bytes_per_chip=16 * GiB,
            hbm_bytes_per_device=16 * GiB,
            hbm_reserved_bytes_per_device=258 * MiB,  # libtpu's OOM report: "reserved 258.00M"
            bytes_limit_per_device=16 * GiB - 258 * MiB,  # = 16909336576, measured
            # _V5E: "HBM2 capacity and bandwidth 16 GB, 819 GBps" (a later revision of the page
            # writes "800 GiBps", 859e9; the lower is kept); _BOOK 8.1e11-8.2e11
            hbm_bandwidth=819e9,
            peak_bf16_flops=197e12,  # _V5E: "Peak compute per chip (bf16) 197 TFLOPs"
            peak_int8_ops=393e12,  # _V5E: "Peak compute per chip (Int8) 393 TOPs"
            peak_fp8_flops=None,  # not published for v5e
            ici_links_per_chip=4,  # _V5E: "ICI ports per chip 4"
            # _V5E: "Bidirectional inter-chip interconnect (ICI) bandwidth (per chip) 400 GBps"
            # (= 100 GB/s per port both ways, 50 GB/s one way)
            ici_bandwidth_per_chip_bidir=400e9,
            ici_link_bandwidth_one_way=4.5e10,  # _BOOK (an earlier revision said 5e10)
            # _V5E: "Per-host NIC configuration 2 x 100 Gbps NIC" for 8 chips: 25e9 B/s per
            # host; _BOOK: 3.125e9 B/s per TPU for v5e
            dcn_bandwidth_per_chip=3.125e9,
            # _BOOK: "PCIe bandwidth is typically around 1.5e10 bytes / second per chip"
            # ("Trillium (TPU v6e) has 32GB/s, about 2x higher than v5")
            host_link_bandwidth_per_chip=1.5e10,
            mxu_size=128,  # _BOOK: "a 128x128 systolic array (256x256 on TPU v6e)"
            chips_per_host=8,  # _V5E: "Chips per host 8" (also 4x4 = 16 chips on 2 hosts)
            # _V5E: "Each TPU VM in a v5e TPU slice contains 1, 4 or 8 chips"; multi-host slices
            # as MaxText and libtpu lay them out use 4-chip VMs (chips_per_host_bounds (2,2,1);
            # measured: v5e:4x4 has 4 processes)
            chips_per_vm=4,
            sources=(_V5E, _BOOK, _MEASURED),
        ),
        "v5p": _facts(
            description="Cloud TPU v5p",
            device_kind="TPU v5",  # measured
            # libtpu accepts "v5p:AxBxC" and "v5:AxBxC" (measured); MaxText writes "v5:".
            # Its default chip config is megacore: one device per chip (measured num_cores=2)
            # MaxText writes "v5:" (its accelerator_to_spec_map): the slices here are named so,
            # for their topology to read as MaxText's
            topology_prefix="v5",
            topology_prefixes_accepted=("v5p", "v5"),
            chip_config_name="megacore",
            tensorcores_per_chip=2,  # _V5P: "Number of TensorCores per chip 2"
            devices_per_chip=1,
            torus_dims=3,  # _V5P: "Interconnect topology 3D torus" (full cubes, 4x4x4 and up)
            pod_chips=8960,  # _V5P: "Number of chips per pod 8960"
            # _V5P note: "Each TPU v5p chip has 96 GiB of physical high-bandwidth memory (HBM).
            # The preceding table lists 95 GiB to account for HBM that the TPU system and the
            # libtpu runtime reserve"
            hbm_bytes_per_chip=96 * GiB,
            hbm_bytes_per_device=96 * GiB,
            hbm_reserved_bytes_per_device=279 * MiB,  # libtpu's OOM report: "reserved 279.00M"
            bytes_limit_per_device=96 * GiB - 279 * MiB,  # = 102786662400 (95.73 GiB), measured
            hbm_bandwidth=2765e9,  # _V5P: "HBM bandwidth per chip (GBps) 2765"
            peak_bf16_flops=459e12,  # _V5P: "Peak compute per chip (BF16) (TFLOPs) 459"
            peak_int8_ops=918e12,  # _BOOK: FLOPs/s/chip (int8) 9.18e14 (not on the Cloud page)
            peak_fp8_flops=459e12,  # _V5P: "Peak compute per chip (FP8) (TFLOPs) 459"
            ici_links_per_chip=6,  # _BOOK (3D torus: nearest 6 neighbours)
            # _V5P: "Bidirectional ... ICI bandwidth per chip (GBps) 1200" (an older revision:
            # "Interchip Interconnect BW 4800 Gbps", the same 600 GB/s one way)
            ici_bandwidth_per_chip_bidir=1200e9,
            ici_link_bandwidth_one_way=9e10,  # _BOOK (an earlier revision said 1e11)
            dcn_bandwidth_per_chip=50e9 / 8,  # _V5P: "DCN bandwidth per chip (Gbps) 50"
            # _BOOK: "PCIe bandwidth is typically around 1.5e10 bytes / second per chip"
            # ("Trillium (TPU v6e) has 32GB/s, about 2x higher than v5")
            host_link_bandwidth_per_chip=1.5e10,
            mxu_size=128,  # _BOOK: "a 128x128 systolic array (256x256 on TPU v6e)"
            chips_per_host=4,  # _V5P: "(4-chip VM)"; topology table 2x2x1 = 4 chips, 1 host
            chips_per_vm=4,
            sources=(_V5P, _BOOK, _MEASURED),
        ),
        "v6e": _facts(
            description="Cloud TPU v6e (Trillium)",
            device_kind="TPU v6 lite",  # measured
            topology_prefix="v6e",  # "v6e:AxB" (measured; MaxText spells it so)
            topology_prefixes_accepted=("v6e",),
            chip_config_name="default",
            tensorcores_per_chip=1,  # _V6E: "Each v6e chip contains one TensorCore"
            devices_per_chip=1,
            torus_dims=2,  # _V6E: "Interconnect topology 2D torus"
            pod_chips=256,  # _V6E: "TPU Pod size 256 chips"
            # _V6E: "HBM capacity per chip 32 GB". libtpu models 31.5 GiB for the device
            # (measured limit + its reported reserve = 31.5 GiB to 1 KiB); real TPUs report a
            # bytes_limit 4 MiB above this libtpu's (module docstring)
            hbm_bytes_per_chip=32 * GiB,
            hbm_bytes_per_device=31 * GiB + 512 * MiB,
            hbm_reserved_bytes_per_device=264 * MiB,  # libtpu's OOM report: "reserved 264.00M"
            bytes_limit_per_device=31 * GiB + 512 * MiB - 264 * MiB,  # = 33546043392, measured
            hbm_bandwidth=1638e9,  # _V6E: "HBM bandwidth per chip 1638 GBps"
            peak_bf16_flops=918e12,  # _V6E: "Peak compute per chip (bf16) 918 TFLOPs"
            peak_int8_ops=1836e12,  # _V6E: "Peak compute per chip (Int8) 1836 TOPs"
            peak_fp8_flops=918e12,  # _V7X comparison table: v6e FP8 918 TFLOPs
            ici_links_per_chip=4,  # _V6E: "ICI ports per chip 4"
            # _V6E: "Bidirectional inter-chip interconnect (ICI) bandwidth (per chip) 800 GBps"
            ici_bandwidth_per_chip_bidir=800e9,
            ici_link_bandwidth_one_way=9e10,  # _BOOK (an earlier revision said 1e11)
            dcn_bandwidth_per_chip=100e9 / 8,  # _V7X comparison table: v6e DCN 100 Gb/s/chip
            # _BOOK: "Trillium (TPU v6e) has 32GB/s" of PCIe per chip (taken a way, as the
            # book's v4 "16GB / second each way"); _V6E: "connects to the host through a PCIe
            # Gen5 interface" (x8: 32 GB/s a way); each of a host's 8 chips has its own
            host_link_bandwidth_per_chip=32e9,
            # _V6E: "two 256x256 matrix-multiply units (MXU)"; _BOOK: "dimensions of your
            # tensors needs to be twice as large to utilize the MXU fully"
            mxu_size=256,
            chips_per_host=8,  # _V6E: "Chips per host 8"
            chips_per_vm=4,  # _V7X table: "(4-chip VM)" for v6e; MaxText bounds (2, 2, 1)
            sources=(_V6E, _V7X, _BOOK, _MEASURED),
        ),
        "tpu7x": _facts(
            description="Cloud TPU7x (Ironwood)",
            device_kind="TPU7x",  # measured
            # libtpu 0.0.51 refuses "v7x:" and "v7:" ("Invalid TPU external name: TPU v7x");
            # it accepts "tpu7x:AxBxC" (and "TPU7x:"), as MaxText writes it. No megacore
            # config: libtpu lists two devices per chip (measured: tpu7x:2x2x1 has 8).
            topology_prefix="tpu7x",
            topology_prefixes_accepted=("tpu7x", "TPU7x"),
            chip_config_name="default",
            tensorcores_per_chip=2,  # _V7X: "Each TPU7x chip contains two TensorCores"
            devices_per_chip=2,  # _V7X: "access two TPU devices" per chip; measured
            torus_dims=3,  # _V7X: 9,216-chip pods like v5p's; MaxText's tpu7x:AxBxC shapes
            pod_chips=9216,  # _V7X: "Number of chips per pod 9216"
            hbm_bytes_per_chip=192 * GiB,  # _V7X: "HBM capacity per chip (GiB) 192"
            # libtpu models 95 GiB per device (measured limit + reported reserve), 190 GiB
            # per chip: 2 GiB less than the page's 192
            hbm_bytes_per_device=95 * GiB,
            hbm_reserved_bytes_per_device=268 * MiB,  # libtpu's OOM report: "reserved 268.00M"
            bytes_limit_per_device=95 * GiB - 268 * MiB,  # = 101724454912, measured
            hbm_bandwidth=7380e9,  # _V7X: "HBM bandwidth per chip (GB/s) 7380"
            peak_bf16_flops=2307e12,  # _V7X: "Peak compute per chip (BF16) (TFLOPs) 2307"
            peak_int8_ops=None,  # not published (the page gives FP8)
            peak_fp8_flops=4614e12,  # _V7X: "Peak compute per chip (FP8) (TFLOPs) 4614"
            ici_links_per_chip=None,  # not stated on the Cloud page
            # _V7X: "Bi-directional ICI bandwidth per chip (GB/s) 1200"
            ici_bandwidth_per_chip_bidir=1200e9,
            ici_link_bandwidth_one_way=None,  # not in the scaling-book revision cited
            dcn_bandwidth_per_chip=100e9 / 8,  # _V7X: "DCN bandwidth per chip (Gb/s) 100"
            host_link_bandwidth_per_chip=None,  # not published
            mxu_size=None,  # not in the sources cited
            # _V7X: "(4-chip VM)"; _V7X_GKE: "Each Ironwood (TPU7x) VM contains 4 chips and
            # 2 NICs"
            chips_per_host=4,
            chips_per_vm=4,
            sources=(_V7X, _V7X_GKE, _MEASURED),
        ),
    }
)

#: Other spellings users write for a generation (lower case) -> its :data:`TPU_FACTS` key.
