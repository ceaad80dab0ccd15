"""The machines GPUs come in: how a node's GPUs talk to each other and to other nodes.

A collective's time depends on which devices take part: inside one NVLink domain it runs over
NVLink; a group that spans domains also crosses the node's GPU network (NICs). Each entry is a
published machine, with its source:

- **NVLink**: bytes/s per GPU per direction (half the datasheets' bidirectional figure), and how
  many GPUs one NVLink domain joins (8 in a DGX/HGX board; 72 in a GB200 NVL72 rack).
- **GPU network**: the NICs a node gives its GPUs for GPU-to-GPU traffic (host NICs excluded),
  their line rate and transport; ``network_per_gpu`` is their sum over the node's GPUs.
- **Efficiency**: the share of the line rate NCCL reaches across nodes on that transport.

Example:
  >>> n = node("dgx-h100")
  >>> n.gpus, n.nvlink_domain, n.network_per_gpu / 1e9
  (8, 8, 50.0)
  >>> node("A3-MEGA").transport
  'GPUDirect-TCPXO'
"""

from __future__ import annotations

import dataclasses
import difflib

from remat_kit.errors import BadType, BadValue, unknown

__all__ = [
    "NODES",
    "Node",
    "check_node",
    "node",
    "node_names",
]


@dataclasses.dataclass(frozen=True)
class Node:
    """A published machine: its GPUs, their NVLink and their network.

    Attributes:
      name: catalogue name, e.g. ``"dgx-h100"``.
      gpu: the target its GPUs compile as (:func:`remat_kit.targets.target` name).
      gpus: GPUs per node.
      nvlink_domain: GPUs one NVLink fabric joins (``gpus``, or more across a rack).
      nvlink: NVLink bytes/s per GPU per direction.
      nics: NICs for GPU-to-GPU traffic per node.
      nic_gbps: each such NIC's line rate in Gb/s.
      transport: how GPU data crosses the network (RDMA over InfiniBand, GPUDirect-TCPX...).
      network_efficiency: the share of the NICs' line rate NCCL reaches across nodes.
      source: where the figures come from.
    """

    name: str
    gpu: str
    gpus: int
    nvlink_domain: int
    nvlink: float
    nics: int
    nic_gbps: float
    transport: str
    network_efficiency: float
    source: str

    @property
    def network_per_gpu(self) -> float:
        """Bytes/s of GPU network per GPU: the GPU NICs' line rates over the node's GPUs."""
        return self.nics * self.nic_gbps * 1e9 / 8 / self.gpus


def _entry(*args: object) -> tuple[str, Node]:
    n = Node(*args)  # type: ignore[arg-type]
    return n.name, n


#: NCCL over RDMA (InfiniBand NDR, RoCE): the share of a NIC's line rate its bus bandwidth
#: reaches across nodes: "For NDR @ 400Gbps you should see 46-48GB/s per NIC"
#: (NVIDIA/nccl-tests#290), 46 of 50 GB/s.
_RDMA = 0.92
#: NCCL over GPUDirect-TCPX: Google's two-node all_reduce_perf sample for A3
#: (GoogleCloudPlatform/ai-infra-cluster-provisioning sample_workloads/nccltest/a3/README.md):
#: busbw 89.54 GB/s at 8 GiB through 4 x 200 Gbps (100 GB/s) per node. The same text stands in
#: the A3 Mega sample, so TCPXO is given the same share (no published figure of its own).
_TCPX = 0.9

NODES: dict[str, Node] = dict(
    [
        _entry(
            "dgx-h100",
            "h100-80gb",
            8,
            8,
            450e9,
            8,
            400.0,
            "InfiniBand NDR (GPUDirect RDMA)",
            _RDMA,
            "NVIDIA DGX H100 datasheet: 8x H100 SXM, 18 NVLink 4 links per GPU (900 GB/s "
            "bidirectional), 8x single-port ConnectX-7 VPI, 400 Gb/s InfiniBand/Ethernet",
        ),
        _entry(
            "dgx-b200",
            "b200",
            8,
            8,
            900e9,
            8,
            400.0,
            "InfiniBand NDR (GPUDirect RDMA)",
            _RDMA,
            "NVIDIA DGX B200 datasheet: 8x B200, NVLink 5 (1.8 TB/s bidirectional per GPU), "
            "8x single-port ConnectX-7 VPI, 400 Gb/s InfiniBand/Ethernet",
        ),
        _entry(
            "gb200-nvl72",
            "b200",
            4,
            72,
            900e9,
            4,
            400.0,
            "InfiniBand NDR (GPUDirect RDMA)",
            _RDMA,
            "GB200 NVL72: 72 Blackwell GPUs in one NVLink 5 domain, 1.8 TB/s per GPU (130 TB/s "
            "in all); a 4-GPU tray's scale-out 4 x 400 Gbps ConnectX-7 (Google Cloud A4X); "
            "compiled as the b200 target (the GB200's GPU holds 186 GB)",
        ),
        _entry(
            "a3-high",
            "h100-80gb",
            8,
            8,
            450e9,
            4,
            200.0,
            "GPUDirect-TCPX",
            _TCPX,
            "Google Cloud GPU network bandwidth page: A3 High 1,000 Gbps, GPUDirect-TCPX; "
            "4 GPU NICs beside the host NIC (200 Gbps each: the total less the host's)",
        ),
        _entry(
            "a3-mega",
            "h100-80gb",
            8,
            8,
            450e9,
            8,
            200.0,
            "GPUDirect-TCPXO",
            _TCPX,
            "Google Cloud GPU network bandwidth page: A3 Mega 1,800 Gbps, GPUDirect-TCPXO; "
            "8 GPU NICs per a3-megagpu-8g (NVIDIA AICR GKE TCPXO guide), 200 Gbps each",
        ),
        _entry(
            "a3-ultra",
            "h200",
            8,
            8,
            450e9,
            8,
            400.0,
            "RoCE (GPUDirect RDMA)",
            _RDMA,
            "Google Cloud GPU network bandwidth page: A3 Ultra, eight ConnectX-7 NICs, "
            "3,200 Gbps in all, one per GPU, GPUDirect RDMA (RoCE), beside two gVNICs",
        ),
    ]
)


def node_names() -> list[str]:
    """The catalogue's node names, sorted.

    Example:
      >>> "a3-mega" in node_names()
      True
    """
    return sorted(NODES)


def node(name: str) -> Node:
    """The catalogue entry ``name`` (case-insensitive).

    Args:
      name: one of :func:`node_names`.

    Returns:
      The Node.

    Raises:
      UnknownName: no such node (the close names and all of them listed).
      BadType: ``name`` is not a str.

    Example:
      >>> node("a3-ultra").gpu
      'h200'
    """
    if not isinstance(name, str):
        raise BadType(f"node must be a str, got {type(name).__name__}: {name!r}", param="node")
    key = name.strip().lower()
    if key in NODES:
        return NODES[key]
    close = difflib.get_close_matches(key, node_names(), n=3, cutoff=0.5)
    raise unknown("node", name, node_names(), close=close, param="node")


def check_node(name: str, gpu: str, devices: int, hosts: int) -> Node:
    """The node ``name``, checked to hold ``devices`` GPUs of target ``gpu`` over ``hosts``.

    Raises:
      UnknownName: no such node.
      BadValue: the node holds another GPU, or fewer GPUs than a host would need.

    Example:
      >>> check_node("DGX-H100", "h100-80gb", 16, 2).name
      'dgx-h100'
    """
    n = node(name)
    if n.gpu != gpu:
        others = ", ".join(x for x in node_names() if NODES[x].gpu == gpu)
        raise BadValue(
            f"node {n.name} holds {n.gpu} GPUs, not {gpu}: target {n.gpu}, or a node of {gpu} "
            f"({others})",
            param="node",
        )
    per_host = devices // hosts
    if per_host > n.gpus:
        raise BadValue(
            f"{per_host} GPUs per host, but a {n.name} node holds {n.gpus}: "
            f"spread {devices} GPUs over {-(-devices // n.gpus)} hosts",
            param="hosts",
        )
    return n
