"""The built-in TPUs: public specifications of Cloud TPU generations, each figure cited.

Five generations, keyed as users name them: ``v4``, ``v5e`` (Cloud's "v5litepod"), ``v5p``,
``v6e`` (Trillium) and ``v7x`` (TPU7x, Ironwood). Figures are per chip unless a key says per
device; a *device* is what JAX lists (``jax.devices()``): one per chip on v5e, v6e and (as
MaxText and libtpu's ``megacore`` config lay them out) v4 and v5p, two per chip on v7x.

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
  >>> MAXTEXT_SLICES["v5p-256"][:4]  # 256 TensorCores: 128 chips on 32 hosts
  ('v5p', 'v5:4x4x8', 128, 32)
  >>> MAXTEXT_SLICES["v6e-256"].chips, MAXTEXT_SLICES["tpu7x-8"].chips
  (256, 4)
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = [
    "MAXTEXT_SLICES",
    "TPU_ALIASES",
    "TPU_FACTS",
    "TPU_FACT_KEYS",
    "MaxTextSlice",
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
            topology_prefix="v5p",
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
            chips_per_host=8,  # _V6E: "Chips per host 8"
            chips_per_vm=4,  # _V7X table: "(4-chip VM)" for v6e; MaxText bounds (2, 2, 1)
            sources=(_V6E, _V7X, _BOOK, _MEASURED),
        ),
        "v7x": _facts(
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
            # _V7X: "(4-chip VM)"; _V7X_GKE: "Each Ironwood (TPU7x) VM contains 4 chips and
            # 2 NICs"
            chips_per_host=4,
            chips_per_vm=4,
            sources=(_V7X, _V7X_GKE, _MEASURED),
        ),
    }
)

#: Other spellings users write for a generation (lower case) -> its :data:`TPU_FACTS` key.
TPU_ALIASES: Mapping[str, str] = types.MappingProxyType(
    {
        "v5litepod": "v5e",
        "v5lite": "v5e",
        "tpu-v5e": "v5e",
        "trillium": "v6e",
        "tpu-v6e": "v6e",
        "tpu7x": "v7x",
        "ironwood": "v7x",
        "tpu-v5p": "v5p",
        "tpu-v4": "v4",
    }
)


class MaxTextSlice(NamedTuple):
    """One of MaxText's ``compile_topology`` names, as libtpu is asked to build it.

    ``chips`` is chips, not TensorCores: MaxText's v4/v5p/tpu7x names count TensorCores
    (``v5p-256`` is 128 chips), its v5e/v6e names count chips (``v6e-256`` is 256). ``hosts`` is
    ``chips / prod(chips_per_host_bounds)``: the processes libtpu's deviceless topology has
    (measured equal for v4-8/128, v5e-1/8/16/256, v5p-8/128/256, v6e-4/8/256, tpu7x-2/8/128).
    The last three fields are the ``get_topology_desc`` arguments MaxText passes.
    """

    generation: str
    topology: str
    chips: int
    hosts: int
    chip_config_name: str
    chips_per_host_bounds: tuple[int, int, int]
    wrap: tuple[bool, bool, bool]


# Generated from MaxText's UserFacingNameToSystemCharacteristics (its TPU rows; source in the
# module docstring): topology_name, chip_config_name, chips_per_host_bounds and wrap copied;
# chips = devices_per_slice (/2 for tpu7x, whose devices are TensorCores); the product of the
# topology's dimensions equals chips for every row.
_S = MaxTextSlice
_MC, _DF = "megacore", "default"  # chip_config_name
_B1, _B4 = (1, 1, 1), (2, 2, 1)  # chips_per_host_bounds
# wrap: whether each axis has its wraparound link (a torus rather than a mesh along it)
_NO, _YYY, _NYN, _YYN = (False,) * 3, (True,) * 3, (False, True, False), (True, True, False)

# fmt: off
MAXTEXT_SLICES: Mapping[str, MaxTextSlice] = types.MappingProxyType({
    "tpu7x-2": _S("v7x", "tpu7x:1x1x1", 1, 1, _DF, _B1, _NO),
    "tpu7x-8": _S("v7x", "tpu7x:2x2x1", 4, 1, _DF, _B4, _NO),
    "tpu7x-16": _S("v7x", "tpu7x:2x2x2", 8, 2, _DF, _B4, _NO),
    "tpu7x-32": _S("v7x", "tpu7x:2x2x4", 16, 4, _DF, _B4, _NO),
    "tpu7x-64": _S("v7x", "tpu7x:2x4x4", 32, 8, _DF, _B4, _NO),
    "tpu7x-128": _S("v7x", "tpu7x:4x4x4", 64, 16, _DF, _B4, _YYY),
    "tpu7x-256": _S("v7x", "tpu7x:4x4x8", 128, 32, _DF, _B4, _YYY),
    "tpu7x-384": _S("v7x", "tpu7x:4x4x12", 192, 48, _DF, _B4, _YYY),
    "tpu7x-512": _S("v7x", "tpu7x:4x8x8", 256, 64, _DF, _B4, _YYY),
    "tpu7x-640": _S("v7x", "tpu7x:4x4x20", 320, 80, _DF, _B4, _YYY),
    "tpu7x-768": _S("v7x", "tpu7x:4x8x12", 384, 96, _DF, _B4, _YYY),
    "tpu7x-896": _S("v7x", "tpu7x:4x4x28", 448, 112, _DF, _B4, _YYY),
    "tpu7x-1024": _S("v7x", "tpu7x:8x8x8", 512, 128, _DF, _B4, _YYY),
    "tpu7x-1152": _S("v7x", "tpu7x:4x12x12", 576, 144, _DF, _B4, _YYY),
    "tpu7x-1280": _S("v7x", "tpu7x:4x8x20", 640, 160, _DF, _B4, _YYY),
    "tpu7x-1408": _S("v7x", "tpu7x:4x4x44", 704, 176, _DF, _B4, _YYY),
    "tpu7x-1536": _S("v7x", "tpu7x:8x8x12", 768, 192, _DF, _B4, _YYY),
    "tpu7x-1664": _S("v7x", "tpu7x:4x4x52", 832, 208, _DF, _B4, _YYY),
    "tpu7x-1792": _S("v7x", "tpu7x:4x8x28", 896, 224, _DF, _B4, _YYY),
    "tpu7x-1920": _S("v7x", "tpu7x:4x12x20", 960, 240, _DF, _B4, _YYY),
    "tpu7x-2048": _S("v7x", "tpu7x:8x8x16", 1024, 256, _DF, _B4, _YYY),
    "tpu7x-2176": _S("v7x", "tpu7x:4x4x68", 1088, 272, _DF, _B4, _YYY),
    "tpu7x-2304": _S("v7x", "tpu7x:8x12x12", 1152, 288, _DF, _B4, _YYY),
    "tpu7x-2432": _S("v7x", "tpu7x:4x4x76", 1216, 304, _DF, _B4, _YYY),
    "tpu7x-2560": _S("v7x", "tpu7x:8x8x20", 1280, 320, _DF, _B4, _YYY),
    "tpu7x-2688": _S("v7x", "tpu7x:4x12x28", 1344, 336, _DF, _B4, _YYY),
    "tpu7x-2816": _S("v7x", "tpu7x:4x8x44", 1408, 352, _DF, _B4, _YYY),
    "tpu7x-2944": _S("v7x", "tpu7x:4x4x92", 1472, 368, _DF, _B4, _YYY),
    "tpu7x-3072": _S("v7x", "tpu7x:8x12x16", 1536, 384, _DF, _B4, _YYY),
    "tpu7x-3200": _S("v7x", "tpu7x:4x20x20", 1600, 400, _DF, _B4, _YYY),
    "tpu7x-3328": _S("v7x", "tpu7x:4x8x52", 1664, 416, _DF, _B4, _YYY),
    "tpu7x-3456": _S("v7x", "tpu7x:12x12x12", 1728, 432, _DF, _B4, _YYY),
    "tpu7x-3584": _S("v7x", "tpu7x:8x8x28", 1792, 448, _DF, _B4, _YYY),
    "tpu7x-3712": _S("v7x", "tpu7x:4x4x116", 1856, 464, _DF, _B4, _YYY),
    "tpu7x-3840": _S("v7x", "tpu7x:8x12x20", 1920, 480, _DF, _B4, _YYY),
    "tpu7x-3968": _S("v7x", "tpu7x:4x4x124", 1984, 496, _DF, _B4, _YYY),
    "tpu7x-4096": _S("v7x", "tpu7x:8x16x16", 2048, 512, _DF, _B4, _YYY),
    "tpu7x-4224": _S("v7x", "tpu7x:4x12x44", 2112, 528, _DF, _B4, _YYY),
    "tpu7x-4352": _S("v7x", "tpu7x:4x8x68", 2176, 544, _DF, _B4, _YYY),
    "tpu7x-4480": _S("v7x", "tpu7x:4x20x28", 2240, 560, _DF, _B4, _YYY),
    "tpu7x-4608": _S("v7x", "tpu7x:12x12x16", 2304, 576, _DF, _B4, _YYY),
    "tpu7x-4736": _S("v7x", "tpu7x:4x4x148", 2368, 592, _DF, _B4, _YYY),
    "tpu7x-4864": _S("v7x", "tpu7x:4x8x76", 2432, 608, _DF, _B4, _YYY),
    "tpu7x-4992": _S("v7x", "tpu7x:4x12x52", 2496, 624, _DF, _B4, _YYY),
    "tpu7x-5120": _S("v7x", "tpu7x:8x16x20", 2560, 640, _DF, _B4, _YYY),
    "tpu7x-5248": _S("v7x", "tpu7x:4x4x164", 2624, 656, _DF, _B4, _YYY),
    "tpu7x-5376": _S("v7x", "tpu7x:8x12x28", 2688, 672, _DF, _B4, _YYY),
    "tpu7x-5504": _S("v7x", "tpu7x:4x4x172", 2752, 688, _DF, _B4, _YYY),
    "tpu7x-5632": _S("v7x", "tpu7x:8x8x44", 2816, 704, _DF, _B4, _YYY),
    "tpu7x-5760": _S("v7x", "tpu7x:12x12x20", 2880, 720, _DF, _B4, _YYY),
    "tpu7x-5888": _S("v7x", "tpu7x:4x8x92", 2944, 736, _DF, _B4, _YYY),
    "tpu7x-6016": _S("v7x", "tpu7x:4x4x188", 3008, 752, _DF, _B4, _YYY),
    "tpu7x-6144": _S("v7x", "tpu7x:12x16x16", 3072, 768, _DF, _B4, _YYY),
    "tpu7x-6272": _S("v7x", "tpu7x:4x28x28", 3136, 784, _DF, _B4, _YYY),
    "tpu7x-6400": _S("v7x", "tpu7x:8x20x20", 3200, 800, _DF, _B4, _YYY),
    "tpu7x-6528": _S("v7x", "tpu7x:4x12x68", 3264, 816, _DF, _B4, _YYY),
    "tpu7x-6656": _S("v7x", "tpu7x:8x8x52", 3328, 832, _DF, _B4, _YYY),
    "tpu7x-6784": _S("v7x", "tpu7x:4x4x212", 3392, 848, _DF, _B4, _YYY),
    "tpu7x-6912": _S("v7x", "tpu7x:12x12x24", 3456, 864, _DF, _B4, _YYY),
    "tpu7x-7040": _S("v7x", "tpu7x:4x20x44", 3520, 880, _DF, _B4, _YYY),
    "tpu7x-7168": _S("v7x", "tpu7x:8x16x28", 3584, 896, _DF, _B4, _YYY),
    "tpu7x-7296": _S("v7x", "tpu7x:4x12x76", 3648, 912, _DF, _B4, _YYY),
    "tpu7x-7424": _S("v7x", "tpu7x:4x8x116", 3712, 928, _DF, _B4, _YYY),
    "tpu7x-7552": _S("v7x", "tpu7x:4x4x236", 3776, 944, _DF, _B4, _YYY),
    "tpu7x-7680": _S("v7x", "tpu7x:12x16x20", 3840, 960, _DF, _B4, _YYY),
    "tpu7x-7808": _S("v7x", "tpu7x:4x4x244", 3904, 976, _DF, _B4, _YYY),
    "tpu7x-7936": _S("v7x", "tpu7x:4x8x124", 3968, 992, _DF, _B4, _YYY),
    "tpu7x-8064": _S("v7x", "tpu7x:12x12x28", 4032, 1008, _DF, _B4, _YYY),
    "tpu7x-8192": _S("v7x", "tpu7x:16x16x16", 4096, 1024, _DF, _B4, _YYY),
    "tpu7x-8320": _S("v7x", "tpu7x:4x20x52", 4160, 1040, _DF, _B4, _YYY),
    "tpu7x-8448": _S("v7x", "tpu7x:8x12x44", 4224, 1056, _DF, _B4, _YYY),
    "tpu7x-8704": _S("v7x", "tpu7x:8x8x68", 4352, 1088, _DF, _B4, _YYY),
    "tpu7x-8832": _S("v7x", "tpu7x:4x12x92", 4416, 1104, _DF, _B4, _YYY),
    "tpu7x-8960": _S("v7x", "tpu7x:8x20x28", 4480, 1120, _DF, _B4, _YYY),
    "tpu7x-9216": _S("v7x", "tpu7x:12x16x24", 4608, 1152, _DF, _B4, _YYY),
    "tpu7x-9472": _S("v7x", "tpu7x:4x8x148", 4736, 1184, _DF, _B4, _YYY),
    "tpu7x-9600": _S("v7x", "tpu7x:12x20x20", 4800, 1200, _DF, _B4, _YYY),
    "tpu7x-9728": _S("v7x", "tpu7x:8x8x76", 4864, 1216, _DF, _B4, _YYY),
    "tpu7x-9856": _S("v7x", "tpu7x:4x28x44", 4928, 1232, _DF, _B4, _YYY),
    "tpu7x-9984": _S("v7x", "tpu7x:8x12x52", 4992, 1248, _DF, _B4, _YYY),
    "tpu7x-10240": _S("v7x", "tpu7x:16x16x20", 5120, 1280, _DF, _B4, _YYY),
    "tpu7x-10368": _S("v7x", "tpu7x:12x12x36", 5184, 1296, _DF, _B4, _YYY),
    "tpu7x-10496": _S("v7x", "tpu7x:4x8x164", 5248, 1312, _DF, _B4, _YYY),
    "tpu7x-10752": _S("v7x", "tpu7x:12x16x28", 5376, 1344, _DF, _B4, _YYY),
    "tpu7x-10880": _S("v7x", "tpu7x:4x20x68", 5440, 1360, _DF, _B4, _YYY),
    "tpu7x-11008": _S("v7x", "tpu7x:4x8x172", 5504, 1376, _DF, _B4, _YYY),
    "tpu7x-11136": _S("v7x", "tpu7x:4x12x116", 5568, 1392, _DF, _B4, _YYY),
    "tpu7x-11264": _S("v7x", "tpu7x:8x16x44", 5632, 1408, _DF, _B4, _YYY),
    "tpu7x-11520": _S("v7x", "tpu7x:12x20x24", 5760, 1440, _DF, _B4, _YYY),
    "tpu7x-11648": _S("v7x", "tpu7x:4x28x52", 5824, 1456, _DF, _B4, _YYY),
    "tpu7x-11776": _S("v7x", "tpu7x:8x8x92", 5888, 1472, _DF, _B4, _YYY),
    "tpu7x-11904": _S("v7x", "tpu7x:4x12x124", 5952, 1488, _DF, _B4, _YYY),
    "tpu7x-12032": _S("v7x", "tpu7x:4x8x188", 6016, 1504, _DF, _B4, _YYY),
    "tpu7x-12160": _S("v7x", "tpu7x:4x20x76", 6080, 1520, _DF, _B4, _YYY),
    "tpu7x-12288": _S("v7x", "tpu7x:16x16x24", 6144, 1536, _DF, _B4, _YYY),
    "tpu7x-13824": _S("v7x", "tpu7x:12x24x24", 6912, 1728, _DF, _B4, _YYY),
    "tpu7x-16384": _S("v7x", "tpu7x:16x16x32", 8192, 2048, _DF, _B4, _YYY),
    "tpu7x-17920": _S("v7x", "tpu7x:16x20x28", 8960, 2240, _DF, _B4, _YYY),
    "tpu7x-18432": _S("v7x", "tpu7x:16x24x24", 9216, 2304, _DF, _B4, _YYY),
    "v6e-1": _S("v6e", "v6e:1x1", 1, 1, _DF, _B1, _NO),
    "v6e-4": _S("v6e", "v6e:2x2", 4, 1, _DF, _B4, _NO),
    "v6e-8": _S("v6e", "v6e:2x4", 8, 2, _DF, _B4, _NO),
    "v6e-16": _S("v6e", "v6e:4x4", 16, 4, _DF, _B4, _NO),
    "v6e-32": _S("v6e", "v6e:4x8", 32, 8, _DF, _B4, _NO),
    "v6e-64": _S("v6e", "v6e:8x8", 64, 16, _DF, _B4, _NO),
    "v6e-128": _S("v6e", "v6e:8x16", 128, 32, _DF, _B4, _NYN),
    "v6e-256": _S("v6e", "v6e:16x16", 256, 64, _DF, _B4, _YYN),
    "v5e-1": _S("v5e", "v5e:1x1", 1, 1, _DF, _B1, _NO),
    "v5e-4": _S("v5e", "v5e:2x2", 4, 1, _DF, _B4, _NO),
    "v5e-8": _S("v5e", "v5e:2x4", 8, 2, _DF, _B4, _NO),
    "v5e-16": _S("v5e", "v5e:4x4", 16, 4, _DF, _B4, _NO),
    "v5e-32": _S("v5e", "v5e:4x8", 32, 8, _DF, _B4, _NO),
    "v5e-64": _S("v5e", "v5e:8x8", 64, 16, _DF, _B4, _NO),
    "v5e-128": _S("v5e", "v5e:8x16", 128, 32, _DF, _B4, _NYN),
    "v5e-256": _S("v5e", "v5e:16x16", 256, 64, _DF, _B4, _YYN),
    "v4-8": _S("v4", "v4:2x2x1", 4, 1, _MC, _B4, _NO),
    "v4-16": _S("v4", "v4:2x2x2", 8, 2, _MC, _B4, _NO),
    "v4-32": _S("v4", "v4:2x2x4", 16, 4, _MC, _B4, _NO),
    "v4-64": _S("v4", "v4:2x4x4", 32, 8, _MC, _B4, _NO),
    "v4-128": _S("v4", "v4:4x4x4", 64, 16, _MC, _B4, _YYY),
    "v4-256": _S("v4", "v4:4x4x8", 128, 32, _MC, _B4, _YYY),
    "v4-384": _S("v4", "v4:4x4x12", 192, 48, _MC, _B4, _YYY),
    "v4-512": _S("v4", "v4:4x8x8", 256, 64, _MC, _B4, _YYY),
    "v4-1024": _S("v4", "v4:8x8x8", 512, 128, _MC, _B4, _YYY),
    "v4-1536": _S("v4", "v4:8x8x12", 768, 192, _MC, _B4, _YYY),
    "v4-2048": _S("v4", "v4:8x8x16", 1024, 256, _MC, _B4, _YYY),
    "v4-4096": _S("v4", "v4:8x16x16", 2048, 512, _MC, _B4, _YYY),
    "v5p-8": _S("v5p", "v5:2x2x1", 4, 1, _MC, _B4, _NO),
    "v5p-16": _S("v5p", "v5:2x2x2", 8, 2, _MC, _B4, _NO),
    "v5p-32": _S("v5p", "v5:2x2x4", 16, 4, _MC, _B4, _NO),
    "v5p-64": _S("v5p", "v5:2x4x4", 32, 8, _MC, _B4, _NO),
    "v5p-128": _S("v5p", "v5:4x4x4", 64, 16, _MC, _B4, _YYY),
    "v5p-256": _S("v5p", "v5:4x4x8", 128, 32, _MC, _B4, _YYY),
    "v5p-384": _S("v5p", "v5:4x4x12", 192, 48, _MC, _B4, _YYY),
    "v5p-512": _S("v5p", "v5:4x8x8", 256, 64, _MC, _B4, _YYY),
    "v5p-640": _S("v5p", "v5:4x4x20", 320, 80, _MC, _B4, _YYY),
    "v5p-768": _S("v5p", "v5:4x8x12", 384, 96, _MC, _B4, _YYY),
    "v5p-896": _S("v5p", "v5:4x4x28", 448, 112, _MC, _B4, _YYY),
    "v5p-1024": _S("v5p", "v5:8x8x8", 512, 128, _MC, _B4, _YYY),
    "v5p-1152": _S("v5p", "v5:4x12x12", 576, 144, _MC, _B4, _YYY),
    "v5p-1280": _S("v5p", "v5:4x8x20", 640, 160, _MC, _B4, _YYY),
    "v5p-1408": _S("v5p", "v5:4x4x44", 704, 176, _MC, _B4, _YYY),
    "v5p-1536": _S("v5p", "v5:8x8x12", 768, 192, _MC, _B4, _YYY),
    "v5p-1664": _S("v5p", "v5:4x4x52", 832, 208, _MC, _B4, _YYY),
    "v5p-1792": _S("v5p", "v5:4x8x28", 896, 224, _MC, _B4, _YYY),
    "v5p-1920": _S("v5p", "v5:4x12x20", 960, 240, _MC, _B4, _YYY),
    "v5p-2048": _S("v5p", "v5:8x8x16", 1024, 256, _MC, _B4, _YYY),
    "v5p-2176": _S("v5p", "v5:4x4x68", 1088, 272, _MC, _B4, _YYY),
    "v5p-2304": _S("v5p", "v5:8x12x12", 1152, 288, _MC, _B4, _YYY),
    "v5p-2432": _S("v5p", "v5:4x4x76", 1216, 304, _MC, _B4, _YYY),
    "v5p-2560": _S("v5p", "v5:8x8x20", 1280, 320, _MC, _B4, _YYY),
    "v5p-2688": _S("v5p", "v5:4x12x28", 1344, 336, _MC, _B4, _YYY),
    "v5p-2816": _S("v5p", "v5:4x8x44", 1408, 352, _MC, _B4, _YYY),
    "v5p-2944": _S("v5p", "v5:4x4x92", 1472, 368, _MC, _B4, _YYY),
    "v5p-3072": _S("v5p", "v5:8x12x16", 1536, 384, _MC, _B4, _YYY),
    "v5p-3200": _S("v5p", "v5:4x20x20", 1600, 400, _MC, _B4, _YYY),
    "v5p-3328": _S("v5p", "v5:4x8x52", 1664, 416, _MC, _B4, _YYY),
    "v5p-3456": _S("v5p", "v5:12x12x12", 1728, 432, _MC, _B4, _YYY),
    "v5p-3584": _S("v5p", "v5:8x8x28", 1792, 448, _MC, _B4, _YYY),
    "v5p-3712": _S("v5p", "v5:4x4x116", 1856, 464, _MC, _B4, _YYY),
    "v5p-3840": _S("v5p", "v5:8x12x20", 1920, 480, _MC, _B4, _YYY),
    "v5p-3968": _S("v5p", "v5:4x4x124", 1984, 496, _MC, _B4, _YYY),
    "v5p-4096": _S("v5p", "v5:8x16x16", 2048, 512, _MC, _B4, _YYY),
    "v5p-4224": _S("v5p", "v5:4x12x44", 2112, 528, _MC, _B4, _YYY),
    "v5p-4352": _S("v5p", "v5:4x8x68", 2176, 544, _MC, _B4, _YYY),
    "v5p-4480": _S("v5p", "v5:4x20x28", 2240, 560, _MC, _B4, _YYY),
    "v5p-4608": _S("v5p", "v5:12x12x16", 2304, 576, _MC, _B4, _YYY),
    "v5p-4736": _S("v5p", "v5:4x4x148", 2368, 592, _MC, _B4, _YYY),
    "v5p-4864": _S("v5p", "v5:4x8x76", 2432, 608, _MC, _B4, _YYY),
    "v5p-4992": _S("v5p", "v5:4x12x52", 2496, 624, _MC, _B4, _YYY),
    "v5p-5120": _S("v5p", "v5:8x16x20", 2560, 640, _MC, _B4, _YYY),
    "v5p-5248": _S("v5p", "v5:4x4x164", 2624, 656, _MC, _B4, _YYY),
    "v5p-5376": _S("v5p", "v5:8x12x28", 2688, 672, _MC, _B4, _YYY),
    "v5p-5504": _S("v5p", "v5:4x4x172", 2752, 688, _MC, _B4, _YYY),
    "v5p-5632": _S("v5p", "v5:8x8x44", 2816, 704, _MC, _B4, _YYY),
    "v5p-5760": _S("v5p", "v5:12x12x20", 2880, 720, _MC, _B4, _YYY),
    "v5p-5888": _S("v5p", "v5:4x8x92", 2944, 736, _MC, _B4, _YYY),
    "v5p-6016": _S("v5p", "v5:4x4x188", 3008, 752, _MC, _B4, _YYY),
    "v5p-6144": _S("v5p", "v5:12x16x16", 3072, 768, _MC, _B4, _YYY),
    "v5p-6272": _S("v5p", "v5:4x28x28", 3136, 784, _MC, _B4, _YYY),
    "v5p-6400": _S("v5p", "v5:8x20x20", 3200, 800, _MC, _B4, _YYY),
    "v5p-6528": _S("v5p", "v5:4x12x68", 3264, 816, _MC, _B4, _YYY),
    "v5p-6656": _S("v5p", "v5:8x8x52", 3328, 832, _MC, _B4, _YYY),
    "v5p-6784": _S("v5p", "v5:4x4x212", 3392, 848, _MC, _B4, _YYY),
    "v5p-6912": _S("v5p", "v5:12x12x24", 3456, 864, _MC, _B4, _YYY),
    "v5p-7040": _S("v5p", "v5:4x20x44", 3520, 880, _MC, _B4, _YYY),
    "v5p-7168": _S("v5p", "v5:8x16x28", 3584, 896, _MC, _B4, _YYY),
    "v5p-7296": _S("v5p", "v5:4x12x76", 3648, 912, _MC, _B4, _YYY),
    "v5p-7424": _S("v5p", "v5:4x8x116", 3712, 928, _MC, _B4, _YYY),
    "v5p-7552": _S("v5p", "v5:4x4x236", 3776, 944, _MC, _B4, _YYY),
    "v5p-7680": _S("v5p", "v5:12x16x20", 3840, 960, _MC, _B4, _YYY),
    "v5p-7808": _S("v5p", "v5:4x4x244", 3904, 976, _MC, _B4, _YYY),
    "v5p-7936": _S("v5p", "v5:4x8x124", 3968, 992, _MC, _B4, _YYY),
    "v5p-8064": _S("v5p", "v5:12x12x28", 4032, 1008, _MC, _B4, _YYY),
    "v5p-8192": _S("v5p", "v5:16x16x16", 4096, 1024, _MC, _B4, _YYY),
    "v5p-8320": _S("v5p", "v5:4x20x52", 4160, 1040, _MC, _B4, _YYY),
    "v5p-8448": _S("v5p", "v5:8x12x44", 4224, 1056, _MC, _B4, _YYY),
    "v5p-8704": _S("v5p", "v5:8x8x68", 4352, 1088, _MC, _B4, _YYY),
    "v5p-8832": _S("v5p", "v5:4x12x92", 4416, 1104, _MC, _B4, _YYY),
    "v5p-8960": _S("v5p", "v5:8x20x28", 4480, 1120, _MC, _B4, _YYY),
    "v5p-9216": _S("v5p", "v5:12x16x24", 4608, 1152, _MC, _B4, _YYY),
    "v5p-9472": _S("v5p", "v5:4x8x148", 4736, 1184, _MC, _B4, _YYY),
    "v5p-9600": _S("v5p", "v5:12x20x20", 4800, 1200, _MC, _B4, _YYY),
    "v5p-9728": _S("v5p", "v5:8x8x76", 4864, 1216, _MC, _B4, _YYY),
    "v5p-9856": _S("v5p", "v5:4x28x44", 4928, 1232, _MC, _B4, _YYY),
    "v5p-9984": _S("v5p", "v5:8x12x52", 4992, 1248, _MC, _B4, _YYY),
    "v5p-10240": _S("v5p", "v5:16x16x20", 5120, 1280, _MC, _B4, _YYY),
    "v5p-10368": _S("v5p", "v5:12x12x36", 5184, 1296, _MC, _B4, _YYY),
    "v5p-10496": _S("v5p", "v5:4x8x164", 5248, 1312, _MC, _B4, _YYY),
    "v5p-10752": _S("v5p", "v5:12x16x28", 5376, 1344, _MC, _B4, _YYY),
    "v5p-10880": _S("v5p", "v5:4x20x68", 5440, 1360, _MC, _B4, _YYY),
    "v5p-11008": _S("v5p", "v5:4x8x172", 5504, 1376, _MC, _B4, _YYY),
    "v5p-11136": _S("v5p", "v5:4x12x116", 5568, 1392, _MC, _B4, _YYY),
    "v5p-11264": _S("v5p", "v5:8x16x44", 5632, 1408, _MC, _B4, _YYY),
    "v5p-11520": _S("v5p", "v5:12x20x24", 5760, 1440, _MC, _B4, _YYY),
    "v5p-11648": _S("v5p", "v5:4x28x52", 5824, 1456, _MC, _B4, _YYY),
    "v5p-11776": _S("v5p", "v5:8x8x92", 5888, 1472, _MC, _B4, _YYY),
    "v5p-11904": _S("v5p", "v5:4x12x124", 5952, 1488, _MC, _B4, _YYY),
    "v5p-12032": _S("v5p", "v5:4x8x188", 6016, 1504, _MC, _B4, _YYY),
    "v5p-12160": _S("v5p", "v5:4x20x76", 6080, 1520, _MC, _B4, _YYY),
    "v5p-12288": _S("v5p", "v5:16x16x24", 6144, 1536, _MC, _B4, _YYY),
    "v5p-13824": _S("v5p", "v5:12x24x24", 6912, 1728, _MC, _B4, _YYY),
    "v5p-17920": _S("v5p", "v5:16x20x28", 8960, 2240, _MC, _B4, _YYY),
})
# fmt: on
