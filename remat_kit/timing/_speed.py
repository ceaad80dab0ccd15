"""How fast a GPU runs each kind of kernel: the figures the step-time model prices kernels with.

A target's datasheet gives peaks (dense bf16 FLOP/s, HBM bytes/s, host link bytes/s); kernels reach
a fraction of them. The fractions here, and where each comes from:

- **Matrix products, sm_90 (H100/H200): 0.81 of peak.** An 8192x8192x8192 bf16 product through
  cuBLAS ran at 798 TFLOP/s of 989 on this workplace's H100 80GB HBM3 (device/KINDS.md,
  2026-11-13). XLA's own products, timed eight to a program on the same kind of machine
  (results/gpu_calibration_h100.json), reached 620-720 TFLOP/s at large shapes; the real steps
  are autotuned and run faster than that.
- **Matrix products, sm_80 / sm_89: 0.80 of peak** (stated assumption: public cuBLAS figures for
  large bf16 GEMMs on the A100, 250-280 of 312 TFLOP/s; none measured here).
- **Memory-bound kernels: 0.90 of HBM bandwidth on sm_90** (a device-to-device copy moved 3.0 of
  3.35 TB/s on the H100, device/KINDS.md; one XLA elementwise bf16 fusion over 2 GiB reached
  only 2.26 TB/s in gpu_calibration, so fusions vary); **0.85 elsewhere** (stated assumption).
- **Arithmetic-heavy fusions** (dropout's random bits): their elementwise operations at half
  the FP32 lanes' rate (SMs x lanes x clock from the target), when that is slower than their
  bytes.
- **cuDNN flash attention: 0.50 (forward) and 0.40 (backward) of peak at head dim >= 128, 0.40 and
  0.32 at 64** (stated assumption, from the FlashAttention-3 paper's cuDNN curves on H100: about
  500 / 400 TFLOP/s forward / backward at head dim 128; lower at 64).
- **Host link: 0.86 of the PCIe figure, not overlapped with compute.** Measured on the H100: three
  offload policies added 0.115 s for 6.4 GB, 0.207 s for 11.3 GB and 0.717 s for 40.8 GB of
  host traffic to the step of the same program without offload, 55-57 GB/s each, fully added
  to the step (XLA 0.11 did not hide these copies behind compute).
- **Per-kernel cost: 3 us** (launch, ramp-up and tail; the H100's chain of small dependent
  products ran at 5.9 us per kernel including the smallest product's own time).
- **Links between GPUs** (collectives, ring model): NVLink per direction from the datasheets
  (B200 900 GB/s, NVLink 5 at 1.8 TB/s both ways; H100/H200 SXM and H20 450 GB/s; A100 SXM
  300 GB/s), PCIe for cards without NVLink (the L40S, L4, RTX 4090; the RTX A6000's bridge
  joins two cards only). NCCL's ring reaches 370 of the H100's 450 GB/s ("With the protocol
  overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s", NVIDIA/nccl-tests#212),
  a share given to every NVLink; an all-reduce inside an NVSwitch domain of Hopper or later
  reaches 480 GB/s of bus bandwidth (NVLink SHARP, the same thread). Across nodes: the target's node
  (:func:`remat_kit.targets.node`: its GPU NICs and their transport's share of the line rate),
  else one 400 Gb/s NIC per GPU (50 GB/s) at RDMA's 0.92 ("For NDR @ 400Gbps you should see
  46-48GB/s per NIC", NVIDIA/nccl-tests#290).
- **Contention: a collective's NCCL blocks hold 16 SMs** on NVLink machines, 2 over PCIe, whole
  SMs never shared with compute ("If you are on DGX with 8 NICs ... it would use 16 SMs";
  "NCCL CTAs won't share an SM with compute kernels", NVIDIA/nccl#689): the compute beside a
  collective runs ``SMs / (SMs - 16)`` as long (+13.8% on an H100's 132).

Example:
  >>> import remat_kit as rk
  >>> s = speed_of(rk.target("h100"))
  >>> round(s.matmul_flops_per_s("bf16") / 1e12)
  801
"""

from __future__ import annotations

import dataclasses
from typing import Any

from remat_kit.targets import node

__all__ = [
    "Speed",
    "speed_of",
]

# NVLink bytes/s per direction, by device kind; cards not named talk over PCIe.
_NVLINK = {
    "NVIDIA H100 80GB HBM3": 450e9,
    "NVIDIA H200": 450e9,
    "NVIDIA A100-SXM4-80GB": 300e9,
    "NVIDIA A100-SXM4-40GB": 300e9,
    "NVIDIA B200": 900e9,  # NVLink 5: 1.8 TB/s bidirectional (DGX B200 datasheet)
    "NVIDIA H20": 450e9,  # NVLink 900 GB/s bidirectional (H20 spec sheet)
}
_NETWORK = 50e9  # one 400 Gb/s NIC per GPU
# NCCL's share of an RDMA NIC's line rate across nodes (the catalogue's, remat_kit.targets).
_RDMA = 0.92
# NCCL's ring over NVLink: 370 of the H100's 450 GB/s line rate ("With the protocol overhead
# (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s", NVIDIA/nccl-tests#212).
_RING = 370 / 450
# An all-reduce inside an NVSwitch domain of Hopper or later reduces in the switch (NVLink
# SHARP): "allreduce uses NVLink SHARP by default ... On 8 GPUs, you should reach a peak busBw of
# ~480GB/s" (NVIDIA/nccl-tests#212).
_NVLS = 480 / 450
# SMs NCCL's blocks hold while a collective runs, one per channel and never shared with compute:
# "If you are on DGX with 8 NICs ... it would use 16 SMs"; "a PCI system with a single NIC ...
# should just launch 2 SMs" (NVIDIA/nccl#689).
_NCCL_SMS = 16
_NCCL_SMS_PCIE = 2


@dataclasses.dataclass(frozen=True)
class Speed:
    """The rates one device runs kernels at.

    Attributes:
      name: the device (a target's name, or ``"cpu (measured)"``).
      peak_flops: dense bf16 FLOP/s of the datasheet.
      matmul_efficiency: the fraction of ``peak_flops`` large matrix products reach.
      attention_efficiency: (forward, backward) fractions for cuDNN flash attention at head
        dim >= 128; at 64 both are 0.8 of these.
      memory_bandwidth: device memory bytes/s of the datasheet.
      memory_efficiency: the fraction memory-bound kernels reach.
      kernel_seconds: fixed cost of one kernel (launch, ramp-up, tail).
      units: parallel units (SMs; cores on a CPU) for wave quantization of small products.
      host_link: host link bytes/s per direction (None: unknown).
      host_link_efficiency: the fraction of ``host_link`` transfers reach.
      device_link: bytes/s per direction between devices of one NVLink domain (a host, or a
        rack of GB200 NVL72).
      network: bytes/s per device between NVLink domains (the node's GPU NICs over its GPUs).
      domain: devices one NVLink domain joins (0: a host's devices).
      link_efficiency: the share of ``device_link`` a collective's ring reaches.
      all_reduce_efficiency: the share an all-reduce inside one NVLink domain reaches (above
        1 where NVSwitch reduces in the switch: NVLink SHARP on Hopper and later).
      network_efficiency: the share of ``network`` it reaches across domains.
      contention: how much slower the compute is while a collective runs beside it (NCCL's
        kernels hold SMs and memory bandwidth): the overlapped time grows by this fraction.
      alu_ops: elementwise operations per second of the vector units (SMs x FP32 lanes x
        clock), for arithmetic-heavy fusions (random bits for dropout).
      f32_matmul_ratio: f32 products' rate against bf16 (0.5: TF32 tensor cores).
      fresh_bytes_per_s: how fast a step's freshly allocated memory is first written, page
        faults included (bytes/s); 0: the allocator hands the step memory it already touched
        (a GPU's BFC allocator), so fresh memory costs nothing extra.
      loop_rates: ``(threaded, strided, bytes/s)`` of memory-bound loops by kind, where the
        kind changes the rate: on a CPU, a loop XLA runs on one thread, or one that
        transposes (:class:`remat_kit.timing.Kernel`'s ``parts`` and ``strided``). Kinds
        not listed run at :meth:`bytes_per_s` (every kind on a GPU).
      torus: a TPU slice's grid of chips (``(4, 4, 8)``): a collective's ring runs along the
        torus axes its group spans, each at ``device_link`` (empty: a GPU's switch, one
        ``device_link`` whatever the group).
      mxu: the side of a TPU's systolic array (128; 256 on v6e), 0 where not known or not a
        TPU. A Pallas attention kernel's products hold an operand with the head dim as one
        side in the array: a head dim short of a multiple of ``mxu`` leaves part of it idle.
      sources: where the figures come from, in words.
    """

    name: str
    peak_flops: float
    matmul_efficiency: float
    attention_efficiency: tuple[float, float]
    memory_bandwidth: float
    memory_efficiency: float
    kernel_seconds: float
    units: int
    host_link: float | None
    host_link_efficiency: float
    device_link: float
    network: float
    domain: int = 0
    link_efficiency: float = 0.8
    all_reduce_efficiency: float = 0.8
    network_efficiency: float = 0.8
    contention: float = 0.0
    alu_ops: float = 0.0
    f32_matmul_ratio: float = 0.5
    fresh_bytes_per_s: float = 0.0
    loop_rates: tuple[tuple[bool, bool, float], ...] = ()
    torus: tuple[int, ...] = ()
    mxu: int = 0
    sources: tuple[str, ...] = ()

    def matmul_flops_per_s(self, dtype: str) -> float:
        """What a large product of ``dtype`` operands reaches (FLOP/s)."""
        rate = self.peak_flops * self.matmul_efficiency
        if dtype in ("f32", "s32"):
            return rate * self.f32_matmul_ratio
        if dtype == "f64":
            return rate / 30
        return rate

    def bytes_per_s(self) -> float:
        """What a memory-bound kernel reaches (bytes read + written per second)."""
        return self.memory_bandwidth * self.memory_efficiency

    def loop_bytes_per_s(self, threaded: bool, strided: bool) -> float:
        """What a memory-bound loop of this kind reaches (:attr:`loop_rates`, else
        :meth:`bytes_per_s`)."""
        for t, s, rate in self.loop_rates:
            if (t, s) == (threaded, strided) and rate > 0:
                return rate
        return self.bytes_per_s()


def speed_of(target: Any) -> Speed | None:
    """The :class:`Speed` of a GPU target, from its datasheet figures and the fractions above.

    Args:
      target: an ``rk.Target``.

    Returns:
      The Speed, or None for targets without the figures (the CPU, a local device, a custom
      GPU file that names no peak or bandwidth): the CPU's is measured
      (:func:`remat_kit.timing.measure_cpu_speed`).

    Example:
      >>> import remat_kit as rk
      >>> speed_of(rk.target("a100-80gb")).matmul_efficiency
      0.8
      >>> speed_of(rk.target("cpu")) is None
      True
    """
    if getattr(target, "kind", None) == "tpu":
        return _tpu_speed(target)
    if getattr(target, "kind", None) != "gpu":
        return None
    if not target.peak_bf16_flops or not target.hbm_bandwidth:
        return None
    cc = target.compute_capability or (0, 0)
    hopper = cc[0] >= 9
    sms = _field(target.target_config or "", "core_count")
    lanes = _field(target.target_config or "", "fpus_per_core")
    ghz = _field(target.target_config or "", "clock_rate_ghz")
    nvlink = _NVLINK.get(target.description)
    host = target.host_link_bandwidth
    machine = node(target.node) if getattr(target, "node", None) else None
    units = int(sms) or 100  # a GPU whose file names no SM count: about an A100's (108)
    return Speed(
        name=target.name,
        peak_flops=float(target.peak_bf16_flops),
        matmul_efficiency=0.81 if hopper else 0.80,
        attention_efficiency=(0.50, 0.40),
        memory_bandwidth=float(target.hbm_bandwidth),
        memory_efficiency=0.90 if hopper else 0.85,
        kernel_seconds=3e-6,
        units=units,
        host_link=host,
        host_link_efficiency=0.86,
        device_link=machine.nvlink if machine else nvlink if nvlink else (host or 32e9),
        network=machine.network_per_gpu if machine else _NETWORK,
        domain=machine.nvlink_domain if machine else 0,
        network_efficiency=machine.network_efficiency if machine else _RDMA,
        link_efficiency=_RING,
        all_reduce_efficiency=_NVLS if hopper and nvlink else _RING,
        # A collective's NCCL blocks own whole SMs while it runs: the compute beside it has
        # the rest (units / (units - nccl) as long).
        contention=_contention(units, _NCCL_SMS if nvlink else _NCCL_SMS_PCIE),
        # half the lanes' rate: integer multiplies and shifts of random-bit generation run at
        # half or quarter rate
        alu_ops=0.5 * sms * lanes * ghz * 1e9,
        sources=(
            "matmul: 0.81 of peak (cuBLAS on an H100, measured)"
            if hopper
            else "matmul: 0.80 of peak (public cuBLAS figures for the A100; not measured here)",
            "memory: 0.90 of HBM bandwidth (a copy on an H100, measured)"
            if hopper
            else "memory: 0.85 of HBM bandwidth (assumed)",
            "attention: 0.50 / 0.40 of peak (FlashAttention-3 paper, cuDNN on H100)",
            "host link: 0.86 of PCIe, not overlapped (measured on an H100)",
        ),
    )


# A TPU's rates. Nothing of the GPU calibration above carries over: there are no SMs to
# quantize a product's tiles over nor for a collective to take (ICI transfers run on the
# chip's own DMA engines beside the TensorCore), no cuBLAS or cuDNN, and products in f32 run
# as one bf16 pass under jax's default precision. What is left is stated, not measured: no TPU
# was lent here.
_TPU_MATMUL = 0.90  # assumed: large bf16 products on the MXUs
_TPU_MEMORY = 0.90  # assumed: memory-bound fusions against HBM bandwidth
_TPU_OP = 1e-6  # assumed: per fused op, the pipeline's fill and drain (no launch)
_TPU_ICI = 0.90  # assumed: a ring's share of its ICI links
_TPU_DCN = 0.80  # assumed: the share of the data-centre network across slices


def _tpu_speed(target: Any) -> Speed:
    from remat_kit.targets import TPU_FACTS

    facts = TPU_FACTS[target.name]
    s = target.tpu_slice
    dims = s.layout.dims
    # One link, one way: the Cloud TPU page's ICI bandwidth per chip (both ways, over the
    # chip's 2 x dims links; 400 GB/s over a v5e's 4 ports is 50 GB/s a link a way), else the
    # scaling book's per-link figure. A ring along one torus axis sends both ways at once.
    bidir = facts["ici_bandwidth_per_chip_bidir"]
    link = bidir / (4 * dims) if bidir else facts["ici_link_bandwidth_one_way"]
    per_chip = s.layout.devices_per_chip
    dcn = facts["dcn_bandwidth_per_chip"] or 0.0
    host = facts["host_link_bandwidth_per_chip"]
    return Speed(
        name=target.name,
        peak_flops=float(target.peak_bf16_flops),
        matmul_efficiency=_TPU_MATMUL,
        attention_efficiency=(_TPU_MATMUL, _TPU_MATMUL),
        memory_bandwidth=float(target.hbm_bandwidth),
        memory_efficiency=_TPU_MEMORY,
        kernel_seconds=_TPU_OP,
        units=0,  # no waves: one TensorCore runs a product's tiles in turn
        # the chip's own PCIe link (each chip of a host has one), per direction
        host_link=host / per_chip if host else None,
        host_link_efficiency=0.86,
        device_link=2 * link / per_chip,
        network=dcn / per_chip,
        domain=s.chips * per_chip,  # ICI joins one slice; DCN the slices
        link_efficiency=_TPU_ICI,
        all_reduce_efficiency=_TPU_ICI,
        network_efficiency=_TPU_DCN,
        f32_matmul_ratio=1.0,
        torus=s.grid,
        mxu=facts["mxu_size"] or 0,
        sources=(
            f"matmul: {_TPU_MATMUL} of the chip's bf16 peak (assumed; no TPU measured here)",
            f"memory: {_TPU_MEMORY} of HBM bandwidth (assumed)",
            f"ICI: {link / 1e9:g} GB/s a link a way, {_TPU_ICI} of it (Cloud TPU page; assumed "
            "share), rings over the torus axes a group spans",
            "no collective contention: ICI runs beside the TensorCore",
            (
                f"host link: {host / 1e9:g} GB/s a chip a way (scaling book), 0.86 of it; "
                "offloads beside the forward's compute, read-backs beside the backward's"
                if host
                else "host link: not published, 32 GB/s (PCIe 4.0 x16) at 0.86 assumed"
            ),
        )
        + (
            (
                f"Pallas attention: the MXU is {facts['mxu_size']} wide (scaling book); a head "
                "dim short of a multiple of it fills that share of the array",
            )
            if facts["mxu_size"]
            else ()
        ),
    )


def _contention(units: int, nccl: int) -> float:
    return units / (units - nccl) - 1 if units > nccl else 0.0


def _field(config: str, name: str) -> float:
    for line in config.splitlines():
        key, _, value = line.strip().partition(":")
        if key == name:
            return float(value)
    return 0.0
