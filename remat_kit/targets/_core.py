"""The Target value: where a program's memory is measured (constructors by name: _named)."""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from remat_kit.errors import BadType, BadValue
from remat_kit.targets._nodes import check_node, node
from remat_kit.targets._platform import gpu_topology, tpu_topology
from remat_kit.targets._slices import (
    Slice,
)
from remat_kit.targets.runtime import (
    ENV_VARS,
    SLOP_FACTOR,
    SLOP_OPTION,
    Runtime,
    compile_memory_size,
    fraction_to_fit,
    max_mem_fraction,
    outside_heap_bytes,
)

__all__ = [
    "Target",
    "check_deviceless",
]

_KINDS = ("gpu", "tpu", "cpu", "local")


@dataclasses.dataclass(frozen=True)
class Target:
    """Where memory is measured: a deviceless NVIDIA GPU or TPU slice, the CPU host, or the
    local devices.

    Attributes:
      name: Canonical name, e.g. ``"h100-80gb"``; a TPU's generation (``"v5p"``).
      kind: ``"gpu"`` (deviceless NVIDIA GPU), ``"tpu"`` (a deviceless TPU slice, built by
        libtpu), ``"cpu"`` (the XLA host backend) or ``"local"`` (whatever ``jax.devices()``
        holds).
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
      tpu_slice: a TPU target's slice (its grid and how many slices); None for the others.
      reserved_bytes: what a TPU's runtime keeps of each device's HBM (libtpu's reserve:
        ``usable_bytes`` is the rest, the ``bytes_limit`` jax reports on the chip and the
        limit libtpu's compiler refuses a program over); 0 for the others.
      slop_factor: the percent of (limit - inputs - outputs) XLA's GPU pass works to
        (``xla_gpu_memory_limit_slop_factor``, :mod:`remat_kit.targets.runtime`): None for
        XLA's 95; a named GPU or a GPU in the process only.

    Example:
      >>> t = rk.target("a100-40gb", devices=8, hosts=2)
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
    tpu_slice: Slice | None = None
    reserved_bytes: int = 0
    slop_factor: int | None = None

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
        if self.slop_factor is not None:
            _check_slop(self)
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
        if (self.kind == "tpu") != (self.tpu_slice is not None):
            raise BadValue(f"a TPU target, and only one, has a tpu_slice: {self.name!r}")
        if self.tpu_slice is not None and (self.devices, self.hosts) != (
            self.tpu_slice.devices,
            self.tpu_slice.hosts,
        ):
            raise BadValue(
                f"{self.tpu_slice.name} x{self.tpu_slice.slices} holds {self.tpu_slice.devices} "
                f"devices on {self.tpu_slice.hosts} hosts, not {self.devices} on {self.hosts}",
                param="devices",
            )
        if self.kind not in ("gpu", "tpu") and self.hosts != 1:
            raise BadValue(
                f"hosts={self.hosts} is only meaningful for GPU and TPU targets; {self.kind!r} "
                "uses hosts=1"
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
        """The XLA topology string: ``"slices x hosts x devices_per_host"`` for a GPU (``"1x2x8"``),
        libtpu's topology name for a TPU slice (``"v5:2x4x4"``)."""
        if self.tpu_slice is not None:
            return self.tpu_slice.topology
        return f"1x{self.hosts}x{self.devices_per_host}"

    @property
    def label(self) -> str:
        """The target as a title names it: the GPU's name, a TPU slice's (``v5p-64``, with
        ``x2`` for two slices)."""
        if self.tpu_slice is None:
            return self.name
        more = f" x{self.tpu_slice.slices}" if self.tpu_slice.slices > 1 else ""
        return self.tpu_slice.name + more

    @property
    def device_word(self) -> str:
        """What one of its devices is called in words: ``"GPU"``, ``"chip"`` or ``"device"``."""
        if self.kind == "gpu" or (self.kind == "local" and self.compute_capability):
            return "GPU"
        if self.kind == "tpu":
            # TPU7x presents each of its chip's two cores as a device
            return "chip" if self.tpu_slice.layout.devices_per_chip == 1 else "TensorCore"
        return "device"

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
          >>> dict(rk.target("h100", devices=8).mesh(("data", "model"), (4, 2)).shape)
          {'data': 4, 'model': 2}
        """
        names = tuple(axis_names)
        shape = _mesh_shape(self.devices, names, shape)
        if self.kind == "gpu":
            from jax.experimental import topologies

            topo = gpu_topology(self.compile_config, self.topology, self.name)
            return topologies.make_mesh(topo, shape, names)
        if self.kind == "tpu":
            return _tpu_mesh(self.tpu_slice, shape, names)
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
          >>> t = rk.target("h100")
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
        ``memory_bytes`` less the runtime's reserve for a TPU (no fraction: the TPU client
        takes all of it); for ``local`` GPUs the limit jax reports; None when unknown (CPU).

        Example:
          >>> rk.target("h100").usable_bytes          # 0.75 of 85018542080
          63763906560
        """
        if self.memory_bytes is None:
            return None
        if self.runtime is None:
            return self.memory_bytes - self.reserved_bytes
        return self.runtime.usable_bytes(self.memory_bytes)

    def fits(self, nbytes: int | float) -> bool | None:
        """Whether ``nbytes`` per device fits what a JAX process may allocate.

        Args:
          nbytes: Bytes needed per device.

        Returns:
          ``nbytes <= usable_bytes``, or None when the memory is unknown (CPU).

        Example:
          >>> rk.target("rtx4090").fits(20 * 2**30)   # 20 GiB of the 24 GiB card: over 0.75 of it
          False
        """
        usable = self.usable_bytes
        return None if usable is None else nbytes <= usable

    def fraction_to_fit(self, nbytes: int | float) -> float | None:
        """The smallest allocator fraction (2 decimals) under which ``nbytes`` fits.

        None when no fraction can (the card is too small) or the target has no fraction.

        Example:
          >>> rk.target("h100").fraction_to_fit(70 * 2**30)
          0.89
        """
        if self.memory_bytes is None or self.mem_fraction is None:
            return None
        return fraction_to_fit(int(nbytes), self.memory_bytes)

    def with_mem_fraction(self, fraction: float, source: str = "argument") -> Target:
        """This target with the allocator taking ``fraction`` of the card.

        Example:
          >>> t = rk.target("h100")
          >>> t.with_mem_fraction(0.95).usable_bytes > t.usable_bytes
          True
        """
        if self.kind != "gpu":
            raise BadValue(f"a memory fraction applies to GPU targets, not {self.name!r}")
        return dataclasses.replace(self, runtime=Runtime(fraction, source))

    def with_slop_factor(self, percent: int) -> Target:
        """This GPU target with XLA's pass working to ``percent`` of (limit - inputs -
        outputs) instead of XLA's 95: its compiles take :attr:`xla_options`, which a real
        process's ``jax.jit`` takes too.

        Example:
          >>> rk.target("h100").with_slop_factor(40).xla_options
          {'xla_gpu_memory_limit_slop_factor': 40}
        """
        return dataclasses.replace(self, slop_factor=percent)

    @property
    def xla_options(self) -> dict[str, int]:
        """Compile options the target's programs need beyond its config, the same on a real
        device as deviceless (the slop factor where one is set); ``{}`` for most."""
        return {} if self.slop_factor is None else {SLOP_OPTION: self.slop_factor}

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
          >>> rk.target("l4").to_dict()["memory_bytes"]
          24152899584
        """
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del out["target_config"], out["runtime"], out["tpu_slice"]
        if self.slop_factor is None:  # XLA's default: a record reads as before
            del out["slop_factor"]
        if self.tpu_slice is not None:
            out["slice"] = self.tpu_slice.name
            out["slices"] = self.tpu_slice.slices
            out["grid"] = list(self.tpu_slice.grid)
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


def _check_slop(t: Target) -> None:
    s = t.slop_factor
    if t.kind != "gpu" and not (t.kind == "local" and t.compute_capability):
        raise BadValue(f"a slop factor applies to GPU targets, not {t.name!r}", param="slop_factor")
    if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= SLOP_FACTOR:
        raise BadValue(
            f"XLA's slop factor {s!r} must be a whole percent in [1, {SLOP_FACTOR}] "
            f"({SLOP_OPTION}; XLA's default is {SLOP_FACTOR})",
            param="slop_factor",
        )


def _check_count(what: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise BadType(f"{what} must be an int, got {type(value).__name__}: {value!r}", param=what)
    if value < 1:
        raise BadValue(f"{what} must be a positive int, got {value}", param=what)


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


def check_deviceless(target: Target) -> None:
    """Checks that a GPU target can be compiled for here; a no-op for cpu/local targets.

    Args:
      target: The target to check.

    Raises:
      TargetError: With the command or setting that fixes it: the CUDA plugin is missing, or jax
        initialized its backends with the CUDA plugin probing for a driver (set
        ``JAX_PLATFORMS=cpu``).

    Example:
      >>> check_deviceless(rk.target("h100"))
    """
    if target.kind == "gpu":
        gpu_topology(target.compile_config, target.topology, target.name)
    elif target.kind == "tpu":
        tpu_topology(_topology_key(target.tpu_slice), target.tpu_slice.name)


def _topology_key(s: Slice) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(s.topology_args().items()))


def _tpu_mesh(s: Slice, shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    # jax's device-mesh builders order the slice's devices by their place on the torus (ICI
    # neighbours on an axis); over several slices, one axis is split across them (DCN), as
    # MaxText's hybrid mesh does.
    from jax.experimental import mesh_utils

    devices = tpu_topology(_topology_key(s), s.name).devices
    if s.slices == 1:
        return Mesh(mesh_utils.create_device_mesh(shape, devices), names)
    dcn = [1] * len(shape)
    axis = next((i for i, n in enumerate(shape) if n % s.slices == 0), None)
    if axis is None:
        raise BadValue(
            f"mesh {dict(zip(names, shape, strict=True))} has no axis that {s.slices} slices "
            "divide: one axis must span the slices",
            param="shard",
        )
    dcn[axis] = s.slices
    ici = [n // d for n, d in zip(shape, dcn, strict=True)]
    return Mesh(mesh_utils.create_hybrid_device_mesh(ici, dcn, devices), names)
