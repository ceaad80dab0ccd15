"""The Target value and its constructors: where a program's memory is measured."""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from remat_kit.errors import BadType, BadValue, unknown
from remat_kit.targets._catalogue import (
    ALIASES,
    CONFIG_TEMPLATE,
    GPU_FACTS,
    SPECIAL,
)
from remat_kit.targets._nodes import check_node, node
from remat_kit.targets._platform import configure_if_no_gpu, gpu_topology
from remat_kit.targets._proto import escape
from remat_kit.targets.runtime import (
    ENV_VARS,
    Runtime,
    compile_memory_size,
    fraction_to_fit,
    max_mem_fraction,
    outside_heap_bytes,
    runtime_from_env,
)

__all__ = [
    "Target",
    "as_target",
    "check_deviceless",
    "cudnn_attention_available",
    "target",
    "target_names",
]

_KINDS = ("gpu", "cpu", "local")


@dataclasses.dataclass(frozen=True)
class Target:
    """Where memory is measured: a deviceless NVIDIA GPU, the CPU host, or the local devices.

    Attributes:
      name: Canonical name, e.g. ``"h100-80gb"``.
      kind: ``"gpu"`` (deviceless NVIDIA GPU), ``"cpu"`` (the XLA host backend) or ``"local"``
        (whatever ``jax.devices()`` holds).
      description: The device kind, e.g. ``"NVIDIA H100 80GB HBM3"``.
      memory_bytes: Device memory per device (``device_memory_size``); None when unknown or CPU.
      hbm_bandwidth: Device memory bandwidth in bytes/s, or None.
      host_link_bandwidth: Host link (PCIe) bandwidth in bytes/s per direction, or None.
      peak_bf16_flops: Peak dense bf16 throughput in FLOP/s, or None.
      devices: Total number of devices the mesh spans.
      hosts: Number of hosts the devices are spread over (``devices`` must be divisible by it).
      compute_capability: CUDA compute capability ``(major, minor)`` for GPUs, else None.
      target_config: ``GpuTargetConfigProto`` text for kind ``"gpu"``, else None.
      runtime: how a JAX process on the card allocates (the allocator's share of it); GPU
        targets only. ``usable_bytes`` and every "fits" follow from it.
      node: the machine the GPUs come in (:func:`remat_kit.targets.node_names`): its NVLink
        domain and GPU network price the collectives; None: NVLink within a host and one
        400 Gb/s NIC per GPU between hosts.

    Example:
      >>> t = target("a100-40gb", devices=8, hosts=2)
      >>> t.topology, t.devices_per_host
      ('1x2x4', 4)
    """

    name: str
    kind: str
    description: str
    memory_bytes: int | None
    hbm_bandwidth: float | None
    host_link_bandwidth: float | None
    peak_bf16_flops: float | None
    devices: int = 1
    hosts: int = 1
    compute_capability: tuple[int, int] | None = None
    target_config: str | None = dataclasses.field(default=None, repr=False)
    runtime: Runtime | None = None
    node: str | None = None

    def __post_init__(self) -> None:
        _check_count("devices", self.devices)
        _check_count("hosts", self.hosts)
        if self.devices % self.hosts:
            raise BadValue(
                f"devices={self.devices} is not divisible by hosts={self.hosts}: "
                "every host must hold the same number of devices",
                param="hosts",
            )
        if self.kind not in _KINDS:
            raise BadValue(f"unknown target kind {self.kind!r}; expected one of {_KINDS}")
        if self.kind == "gpu" and not self.target_config:
            raise BadValue(f"GPU target {self.name!r} needs a target_config (GpuTargetConfigProto)")
        if self.kind == "gpu" and self.runtime is None:
            object.__setattr__(self, "runtime", Runtime())
        if self.kind != "gpu" and self.runtime is not None:
            raise BadValue(f"runtime is only meaningful for GPU targets, not {self.kind!r}")
        f = self.mem_fraction
        if f is not None and self.memory_bytes and f > max_mem_fraction(self.memory_bytes):
            # A bare variable name: the process environment, which a library imported
            # before may have set (EasyDeL 0.3 sets 1.0 at import).
            where = (
                f"{self.runtime.source} in this process's environment, from the shell or a "
                "library imported before"
                if self.runtime.source in ENV_VARS
                else self.runtime.source
            )
            raise BadValue(
                f"memory fraction {f:g} ({where}) leaves less than "
                f"{outside_heap_bytes(self.memory_bytes) / 2**30:.2f} GiB of {self.name} for the "
                "CUDA context and "
                f"library handles: use at most {max_mem_fraction(self.memory_bytes):g}",
                param="mem_fraction",
            )
        if self.kind != "gpu" and self.hosts != 1:
            raise BadValue(
                f"hosts={self.hosts} is only meaningful for GPU targets; {self.kind!r} uses hosts=1"
            )
        if self.node is not None:
            # the catalogue's spelling (names are case-insensitive), once checked
            object.__setattr__(
                self, "node", check_node(self.node, self.name, self.devices, self.hosts).name
            )

    @property
    def nvlink_domain(self) -> int:
        """Devices one NVLink domain joins: the node's (a GB200 NVL72 rack: 72), else a host's."""
        return node(self.node).nvlink_domain if self.node else self.devices_per_host

    @property
    def devices_per_host(self) -> int:
        """Number of devices on each host."""
        return self.devices // self.hosts

    @property
    def topology(self) -> str:
        """The XLA topology string ``"slices x hosts x devices_per_host"``, e.g. ``"1x2x8"``."""
        return f"1x{self.hosts}x{self.devices_per_host}"

    def mesh(self, axis_names: Sequence[str] = ("x",), shape: Sequence[int] | None = None) -> Mesh:
        """Returns a device mesh over this target's devices.

        For kind ``"gpu"`` the devices are compile-only devices of the deviceless topology: programs
        can be lowered and compiled for them but not run.

        Args:
          axis_names: Names of the mesh axes.
          shape: Mesh shape; its product must equal ``devices``. Defaults to all devices on the
            first axis and size 1 on the others.

        Returns:
          A :class:`jax.sharding.Mesh`.

        Raises:
          ValueError: If ``shape`` does not match ``axis_names`` or ``devices``, or there are fewer
            cpu/local devices than ``devices``.
          TargetError: If a GPU target cannot be compiled for in this environment.

        Example:
          >>> dict(target("h100", devices=8).mesh(("data", "model"), (4, 2)).shape)
          {'data': 4, 'model': 2}
        """
        names = tuple(axis_names)
        shape = _mesh_shape(self.devices, names, shape)
        if self.kind == "gpu":
            from jax.experimental import topologies

            topo = gpu_topology(self.compile_config, self.topology, self.name)
            return topologies.make_mesh(topo, shape, names)
        devs = jax.devices("cpu") if self.kind == "cpu" else jax.devices()
        if len(devs) < self.devices:
            hint = (
                " (set XLA_FLAGS=--xla_force_host_platform_device_count=N or "
                "jax.config.update('jax_num_cpu_devices', N) before jax starts)"
                if devs[0].platform == "cpu"
                else ""
            )
            raise BadValue(
                f"target {self.name!r} asks for devices={self.devices} but only {len(devs)} "
                f"{devs[0].platform} device(s) exist{hint}",
                param="devices",
            )
        return Mesh(np.array(devs[: self.devices]).reshape(shape), names)

    def sharding(self, spec: PartitionSpec | None = None) -> NamedSharding:
        """Returns a sharding on :meth:`mesh` (default axes), replicated unless ``spec`` says else.

        Args:
          spec: Partition spec over the mesh axis ``"x"``; None means ``PartitionSpec()``.

        Returns:
          A :class:`jax.sharding.NamedSharding`.

        Raises:
          TargetError: If a GPU target cannot be compiled for in this environment.

        Example:
          >>> t = target("h100")
          >>> x = jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=t.sharding())
          >>> x.sharding.spec
          P()
        """
        return NamedSharding(self.mesh(), PartitionSpec() if spec is None else spec)

    @property
    def mem_fraction(self) -> float | None:
        """The allocator's share of the card (None: no pool, or not a GPU target)."""
        return None if self.runtime is None else self.runtime.mem_fraction

    @property
    def usable_bytes(self) -> int | None:
        """What one JAX process may allocate per device: the allocator's ``bytes_limit``.

        ``memory_bytes`` times the allocator fraction for a GPU target (JAX's default 0.75);
        for ``local`` GPUs the limit jax reports; None when unknown (CPU).

        Example:
          >>> target("h100").usable_bytes          # 0.75 of 85018542080
          63763906560
        """
        if self.memory_bytes is None:
            return None
        if self.runtime is None:
            return self.memory_bytes
        return self.runtime.usable_bytes(self.memory_bytes)

    def fits(self, nbytes: int | float) -> bool | None:
        """Whether ``nbytes`` per device fits what a JAX process may allocate.

        Args:
          nbytes: Bytes needed per device.

        Returns:
          ``nbytes <= usable_bytes``, or None when the memory is unknown (CPU).

        Example:
          >>> target("rtx4090").fits(20 * 2**30)   # 20 GiB of the 24 GiB card: over 0.75 of it
          False
        """
        usable = self.usable_bytes
        return None if usable is None else nbytes <= usable

    def fraction_to_fit(self, nbytes: int | float) -> float | None:
        """The smallest allocator fraction (2 decimals) under which ``nbytes`` fits.

        None when no fraction can (the card is too small) or the target has no fraction.

        Example:
          >>> target("h100").fraction_to_fit(70 * 2**30)
          0.89
        """
        if self.memory_bytes is None or self.mem_fraction is None:
            return None
        return fraction_to_fit(int(nbytes), self.memory_bytes)

    def with_mem_fraction(self, fraction: float, source: str = "argument") -> Target:
        """This target with the allocator taking ``fraction`` of the card.

        Example:
          >>> target("h100").with_mem_fraction(0.95).usable_bytes > target("h100").usable_bytes
          True
        """
        if self.kind != "gpu":
            raise BadValue(f"a memory fraction applies to GPU targets, not {self.name!r}")
        return dataclasses.replace(self, runtime=Runtime(fraction, source))

    @property
    def compile_config(self) -> str | None:
        """``target_config`` as the deviceless compile must see it.

        Its ``device_memory_size`` is set so that XLA's rematerialization pass gets the limit
        a real process on the card would hand it (see :mod:`remat_kit.targets.runtime`).
        """
        if self.target_config is None or self.runtime is None or self.memory_bytes is None:
            return self.target_config
        size = compile_memory_size(self.memory_bytes, self.runtime)
        return re.sub(
            r"(\bdevice_memory_size\s*:\s*)[-+0-9.eE]+", rf"\g<1>{size}", self.target_config
        )

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict of the target (without the target_config text).

        Returns:
          A dict of plain str/int/float/None/list values.

        Example:
          >>> target("l4").to_dict()["memory_bytes"]
          24152899584
        """
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del out["target_config"], out["runtime"]
        out["usable_bytes"] = self.usable_bytes
        out.update(
            Runtime(None, "none").to_dict() if self.runtime is None else self.runtime.to_dict()
        )
        if self.runtime is None:
            out["mem_fraction_source"] = None
        if self.compute_capability is not None:
            out["compute_capability"] = list(self.compute_capability)
        out["devices_per_host"] = self.devices_per_host
        out["topology"] = self.topology
        return out


def target_names() -> list[str]:
    """Returns the sorted canonical target names (aliases such as ``"h100"`` excluded).

    Returns:
      A sorted list of names accepted by :func:`target`.

    Example:
      >>> "h100-80gb" in target_names()
      True
    """
    return sorted([*GPU_FACTS, *SPECIAL])


def as_target(t: str | Target) -> Target:
    """A Target from a name or a Target (what every ``target=`` argument accepts).

    The functions that take ``target=`` call it on entry, before they trace or compile for
    it; for a GPU target on a machine with no NVIDIA device it therefore chooses jax's CPU
    platform first (:func:`~remat_kit.targets.configure_for_deviceless`, a no-op once jax's
    backends have started). Building a target (:func:`target`) has no such effect.

    Raises:
      UnknownName: an unknown name.
      BadType: neither a name nor a Target.

    Example:
      >>> as_target("h100").name
      'h100-80gb'
    """
    if isinstance(t, str):
        t = target(t)
    elif not isinstance(t, Target):
        raise BadType(
            f"target must be a name or rk.Target, got {type(t).__name__} {t!r}", param="target"
        )
    if t.kind == "gpu":
        # A deviceless compile is about to happen: before anything starts jax's backends
        # with a CUDA probe that can only fail here.
        configure_if_no_gpu()
    return t


def target(
    name: str,
    devices: int = 1,
    hosts: int = 1,
    mem_fraction: float | None = None,
    node: str | None = None,
) -> Target:
    """Returns a built-in target by name.

    Args:
      name: A name from :func:`target_names` or an alias (``"h100"``, ``"h100-sxm"``, ``"a100"``).
        ``"cpu"`` is the XLA host backend; ``"local"`` is whatever ``jax.devices()[0]`` is (this
        initializes jax's backends).
      devices: Total number of devices.
      hosts: Number of hosts the devices are spread over (GPU targets only).
      mem_fraction: the share of each GPU a JAX process's allocator takes; default: what the
        environment says (``XLA_PYTHON_CLIENT_MEM_FRACTION``...), else JAX's 0.75.
      node: the machine the GPUs come in (:func:`remat_kit.targets.node_names`); with
        ``hosts=1`` and more devices than one node holds, the devices fill whole nodes.

    Returns:
      A :class:`Target`.

    Raises:
      ValueError: Unknown name (close matches and all names listed), non-positive ``devices`` or
        ``hosts``, ``devices`` not divisible by ``hosts``, or more local devices than exist.
      TypeError: If ``devices`` or ``hosts`` is not an int.

    Example:
      >>> target("h100", devices=16, hosts=2).topology
      '1x2x8'
      >>> target("h100", devices=64, node="a3-mega").hosts
      8
    """
    _check_count("devices", devices)
    _check_count("hosts", hosts)
    if node is not None and hosts == 1:
        per = _node_of(node).gpus
        hosts = -(-devices // per) if devices > per else 1
    if not isinstance(name, str):
        raise BadType(
            f"target name must be a str, got {type(name).__name__}: {name!r}", param="target"
        )
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key in GPU_FACTS:
        t = _gpu_target(key, GPU_FACTS[key], devices, hosts, _runtime(mem_fraction))
        return dataclasses.replace(t, node=node) if node is not None else t
    if node is not None and key in SPECIAL:
        raise BadValue(f"node={node!r} is for GPU targets, not {key!r}", param="node")
    if key == "cpu":
        return Target(
            "cpu", "cpu", "CPU (XLA host backend)", None, None, None, None, devices, hosts
        )
    if key == "local":
        return _local_target(devices, hosts)
    matches = difflib.get_close_matches(key, [*target_names(), *ALIASES], n=6, cutoff=0.5)
    close = list(dict.fromkeys(ALIASES.get(m, m) for m in matches))[:3]
    raise unknown("target", name, target_names(), close=close, param="target")


def cudnn_attention_available(target: Target) -> bool:
    """Whether cuDNN flash attention can be compiled for ``target`` here.

    It needs an NVIDIA target of compute capability 8.0 or newer (a deviceless GPU or a
    local GPU) and the cuDNN library wheel (``jax[cuda12]`` brings it).

    Example:
      >>> cudnn_attention_available(target("cpu"))
      False
    """
    if target.kind == "cpu" or target.compute_capability is None:
        return False
    if target.kind == "local" and target.description.lower().startswith("cpu"):
        return False
    if tuple(target.compute_capability) < (8, 0):
        return False
    return importlib.util.find_spec("nvidia") is not None and (
        importlib.util.find_spec("nvidia.cudnn") is not None
    )


def _node_of(name: str) -> Any:
    return node(name)


def _check_count(what: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise BadType(f"{what} must be an int, got {type(value).__name__}: {value!r}", param=what)
    if value < 1:
        raise BadValue(f"{what} must be a positive int, got {value}", param=what)


def _runtime(mem_fraction: float | None) -> Runtime:
    # The public edge: an explicit fraction wins, else the environment a JAX process would read.
    return runtime_from_env() if mem_fraction is None else Runtime(mem_fraction, "argument")


def _gpu_target(
    name: str, facts: Mapping[str, Any], devices: int, hosts: int, runtime: Runtime
) -> Target:
    # A value only: jax's platform is chosen where a deviceless compile is about to happen
    # (as_target on entry to a function that compiles, and gpu_topology), not here.
    major, minor = facts["compute_capability"]
    config = CONFIG_TEMPLATE.format(
        smem_per_sm=int(facts["smem_per_sm"]),
        threads_per_sm=int(facts["threads_per_sm"]),
        sms=int(facts["sms"]),
        fp32_per_sm=int(facts["fp32_per_sm"]),
        hbm_bandwidth=int(facts["hbm_bandwidth"]),
        l2_bytes=int(facts["l2_bytes"]),
        clock_ghz=f"{float(facts['clock_ghz']):g}",
        memory_bytes=int(facts["memory_bytes"]),
        smem_optin=int(facts["smem_optin"]),
        cc_major=major,
        cc_minor=minor,
        description=escape(facts["description"]),
    )
    return Target(
        name=name,
        kind="gpu",
        description=facts["description"],
        memory_bytes=int(facts["memory_bytes"]),
        hbm_bandwidth=float(facts["hbm_bandwidth"]),
        host_link_bandwidth=_opt_float(facts.get("host_link_bandwidth")),
        peak_bf16_flops=_opt_float(facts.get("peak_bf16_flops")),
        devices=devices,
        hosts=hosts,
        compute_capability=(major, minor),
        target_config=config,
        runtime=runtime,
    )


def _local_target(devices: int, hosts: int) -> Target:
    devs = jax.devices()
    if devices > len(devs):
        raise BadValue(
            f"devices={devices} but only {len(devs)} local {devs[0].platform} device(s) exist",
            param="devices",
        )
    dev = devs[0]
    kind = dev.device_kind
    memory = None
    cc = None
    if dev.platform == "gpu":
        try:
            stats = dev.memory_stats() or {}
        except Exception:  # memory_stats is optional per backend
            stats = {}
        memory = stats.get("bytes_limit")
        try:
            cc = _parse_cc(getattr(dev, "compute_capability", None), kind)
        except ValueError:
            cc = None
    known = next((f for f in GPU_FACTS.values() if f["description"] == kind), {})
    return Target(
        name="local",
        kind="local",
        description=kind,
        memory_bytes=None if memory is None else int(memory),
        hbm_bandwidth=_opt_float(known.get("hbm_bandwidth")),
        host_link_bandwidth=_opt_float(known.get("host_link_bandwidth")),
        peak_bf16_flops=_opt_float(known.get("peak_bf16_flops")),
        devices=devices,
        hosts=hosts,
        compute_capability=cc,
    )


def _mesh_shape(devices: int, names: tuple[str, ...], shape: Sequence[int] | None) -> tuple:
    if not names:
        raise BadValue("axis_names must name at least one mesh axis")
    if shape is None:
        return (devices,) + (1,) * (len(names) - 1)
    shape = tuple(int(s) for s in shape)
    if len(shape) != len(names):
        raise BadValue(
            f"mesh shape {shape} has {len(shape)} axes but axis_names {names} has {len(names)}"
        )
    if math.prod(shape) != devices:
        raise BadValue(f"mesh shape {shape} holds {math.prod(shape)} devices, target has {devices}")
    return shape


#: The compute capabilities NVIDIA's GPUs have (the CUDA C++ Programming Guide's table of
#: compute capabilities, and developer.nvidia.com/cuda-gpus): Maxwell 5.x, Pascal 6.x, Volta
#: 7.0/7.2, Turing 7.5, Ampere 8.0/8.6/8.7, Ada 8.9, Hopper 9.0, Blackwell 10.0 (B200), 10.1
#: (Thor before CUDA 13, which calls it 11.0), 10.3 (B300), 12.0 (RTX 50, RTX PRO 6000) and
#: 12.1 (GB10). A custom GPU names one of them: XLA picks its kernels by it.
COMPUTE_CAPABILITIES = frozenset(
    {(5, 0), (5, 2), (5, 3), (6, 0), (6, 1), (6, 2), (7, 0), (7, 2), (7, 5), (8, 0), (8, 6)}
    | {(8, 7), (8, 9), (9, 0), (10, 0), (10, 1), (10, 3), (11, 0), (12, 0), (12, 1)}
)


def _parse_cc(value: Any, name: str) -> tuple[int, int]:
    if isinstance(value, float):
        value = repr(value)  # 8.9 as JSON gives it: "8.9"
    if isinstance(value, str):
        value = value.strip().split(".")
    try:
        major, minor = (int(v) for v in value)
    except (TypeError, ValueError):
        raise BadValue(
            f"compute_capability of {name!r} must be (major, minor), got {value!r}"
        ) from None
    if (major, minor) not in COMPUTE_CAPABILITIES:
        known = ", ".join(f"{a}.{b}" for a, b in sorted(COMPUTE_CAPABILITIES))
        raise BadValue(
            f"compute_capability {major}.{minor} of {name!r} is no NVIDIA GPU's; those there "
            f"are: {known}",
            param="compute_capability",
        )
    return major, minor


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def check_deviceless(target: Target) -> None:
    """Checks that a GPU target can be compiled for here; a no-op for cpu/local targets.

    Args:
      target: The target to check.

    Raises:
      TargetError: With the command or setting that fixes it: the CUDA plugin is missing, or jax
        initialized its backends with the CUDA plugin probing for a driver (set
        ``JAX_PLATFORMS=cpu``).

    Example:
      >>> check_deviceless(target("h100"))
    """
    if target.kind == "gpu":
        gpu_topology(target.compile_config, target.topology, target.name)
