"""Targets: where a program's memory is measured.

A :class:`Target` is either a named NVIDIA GPU that XLA compiles for without the card being present
("deviceless": the CUDA compiler plugin and a ``GpuTargetConfigProto`` describing the card), the CPU
host, or the local devices. It hands out the :class:`jax.sharding.Mesh` and
:class:`jax.sharding.NamedSharding` that abstract arguments (``jax.ShapeDtypeStruct``) carry, so
that ``jax.jit(f).lower(*args).compile().memory_analysis()`` reports the memory of that GPU.

Example:
  >>> import remat_kit.targets as rkt
  >>> t = rkt.target("h100")
  >>> t.name, t.memory_bytes
  ('h100-80gb', 84942979072)
  >>> x = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16, sharding=t.sharding())  # doctest: +SKIP
"""

from __future__ import annotations

__all__ = [
    "Target",
    "TargetError",
    "as_target",
    "check_deviceless",
    "configure_for_deviceless",
    "cudnn_attention_available",
    "custom_target",
    "target",
    "target_from_config",
    "target_names",
]

import dataclasses
import difflib
import functools
import glob
import importlib
import importlib.util
import math
import numbers
import os
import re
import sys
import types
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from remat_kit.errors import TargetError, unknown

_KINDS = ("gpu", "cpu", "local")

_PLUGIN_MESSAGE = "compiling for {name} needs the CUDA 12 compile plugin: pip install 'jax[cuda12]'"
_PLATFORMS_MESSAGE = (
    "compiling for {name} needs jax started without probing for a CUDA driver (it probed and found "
    "none): set JAX_PLATFORMS=cpu (or JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1) in the environment "
    "before importing jax, or call remat_kit.targets.configure_for_deviceless() first ({error})"
)


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

    def __post_init__(self) -> None:
        _check_count("devices", self.devices)
        _check_count("hosts", self.hosts)
        if self.devices % self.hosts:
            raise ValueError(
                f"devices={self.devices} is not divisible by hosts={self.hosts}: "
                "every host must hold the same number of devices"
            )
        if self.kind not in _KINDS:
            raise ValueError(f"unknown target kind {self.kind!r}; expected one of {_KINDS}")
        if self.kind == "gpu" and not self.target_config:
            raise ValueError(
                f"GPU target {self.name!r} needs a target_config (GpuTargetConfigProto)"
            )
        if self.kind != "gpu" and self.hosts != 1:
            raise ValueError(
                f"hosts={self.hosts} is only meaningful for GPU targets; {self.kind!r} uses hosts=1"
            )

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
          >>> target("h100", devices=8).mesh(("data", "model"), (4, 2)).shape
          OrderedDict([('data', 4), ('model', 2)])
        """
        names = tuple(axis_names)
        shape = _mesh_shape(self.devices, names, shape)
        if self.kind == "gpu":
            from jax.experimental import topologies

            topo = _gpu_topology(self)
            return topologies.make_mesh(topo, shape, names)
        devs = jax.devices("cpu") if self.kind == "cpu" else jax.devices()
        if len(devs) < self.devices:
            hint = (
                " (set XLA_FLAGS=--xla_force_host_platform_device_count=N or "
                "jax.config.update('jax_num_cpu_devices', N) before jax starts)"
                if devs[0].platform == "cpu"
                else ""
            )
            raise ValueError(
                f"target {self.name!r} asks for devices={self.devices} but only {len(devs)} "
                f"{devs[0].platform} device(s) exist{hint}"
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
          >>> x = jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=t.sharding())  # doctest: +SKIP
        """
        return NamedSharding(self.mesh(), PartitionSpec() if spec is None else spec)

    def fits(self, nbytes: int | float) -> bool | None:
        """Whether ``nbytes`` fits in one device's memory.

        Args:
          nbytes: Bytes needed per device.

        Returns:
          ``nbytes <= memory_bytes``, or None when the memory is unknown (CPU).

        Example:
          >>> target("rtx4090").fits(30 * 2**30)
          False
        """
        if self.memory_bytes is None:
            return None
        return nbytes <= self.memory_bytes

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict of the target (without the target_config text).

        Returns:
          A dict of plain str/int/float/None/list values.

        Example:
          >>> target("l4").to_dict()["memory_bytes"]
          24152899584
        """
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del out["target_config"]
        if self.compute_capability is not None:
            out["compute_capability"] = list(self.compute_capability)
        out["devices_per_host"] = self.devices_per_host
        out["topology"] = self.topology
        return out


# --- built-in GPU facts -------------------------------------------------------------------------

_FACT_KEYS = (
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
_OPTIONAL_FACTS: Mapping[str, Any] = types.MappingProxyType(
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
_GPU_FACTS: Mapping[str, Mapping[str, Any]] = types.MappingProxyType({
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

_ALIASES: Mapping[str, str] = types.MappingProxyType(
    {"h100": "h100-80gb", "h100-sxm": "h100-80gb", "a100": "a100-80gb"}
)
_SPECIAL = ("cpu", "local")

_CONFIG_TEMPLATE = """\
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


# --- public constructors ------------------------------------------------------------------------


def target_names() -> list[str]:
    """Returns the sorted canonical target names (aliases such as ``"h100"`` excluded).

    Returns:
      A sorted list of names accepted by :func:`target`.

    Example:
      >>> "h100-80gb" in target_names()
      True
    """
    return sorted([*_GPU_FACTS, *_SPECIAL])


def as_target(t: str | Target) -> Target:
    """A Target from a name or a Target (what every ``target=`` argument accepts).

    Raises:
      ValueError: an unknown name.
      TypeError: neither a name nor a Target.

    Example:
      >>> as_target("h100").name
      'h100-80gb'
    """
    if isinstance(t, str):
        return target(t)
    if not isinstance(t, Target):
        raise TypeError(f"target must be a name or rk.Target, got {type(t).__name__} {t!r}")
    return t


def target(name: str, devices: int = 1, hosts: int = 1) -> Target:
    """Returns a built-in target by name.

    Args:
      name: A name from :func:`target_names` or an alias (``"h100"``, ``"h100-sxm"``, ``"a100"``).
        ``"cpu"`` is the XLA host backend; ``"local"`` is whatever ``jax.devices()[0]`` is (this
        initializes jax's backends).
      devices: Total number of devices.
      hosts: Number of hosts the devices are spread over (GPU targets only).

    Returns:
      A :class:`Target`.

    Raises:
      ValueError: Unknown name (close matches and all names listed), non-positive ``devices`` or
        ``hosts``, ``devices`` not divisible by ``hosts``, or more local devices than exist.
      TypeError: If ``devices`` or ``hosts`` is not an int.

    Example:
      >>> target("h100", devices=16, hosts=2).topology
      '1x2x8'
    """
    _check_count("devices", devices)
    _check_count("hosts", hosts)
    if not isinstance(name, str):
        raise TypeError(f"target name must be a str, got {type(name).__name__}: {name!r}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key in _GPU_FACTS:
        return _gpu_target(key, _GPU_FACTS[key], devices, hosts)
    if key == "cpu":
        return Target(
            "cpu", "cpu", "CPU (XLA host backend)", None, None, None, None, devices, hosts
        )
    if key == "local":
        return _local_target(devices, hosts)
    matches = difflib.get_close_matches(key, [*target_names(), *_ALIASES], n=6, cutoff=0.5)
    close = list(dict.fromkeys(_ALIASES.get(m, m) for m in matches))[:3]
    raise unknown("target", name, target_names(), close=close)


def custom_target(name: str, facts: Mapping[str, Any], devices: int = 1, hosts: int = 1) -> Target:
    """Builds a deviceless GPU target from the facts of a card (the columns of the GPU table).

    Required keys: ``sms, fp32_per_sm, smem_per_sm, smem_optin, threads_per_sm, hbm_bandwidth``
    (bytes/s), ``l2_bytes, clock_ghz, memory_bytes``. Optional: ``compute_capability`` (default
    ``(9, 0)``), ``host_link_bandwidth`` (bytes/s per direction), ``peak_bf16_flops`` (FLOP/s) and
    ``description`` (default: ``name``).

    Args:
      name: The target's name.
      facts: Mapping of the keys above.
      devices: Total number of devices.
      hosts: Number of hosts.

    Returns:
      A :class:`Target` of kind ``"gpu"``.

    Raises:
      ValueError: Missing or unknown keys, or a value that is not a positive number.
      TypeError: If ``devices`` or ``hosts`` is not an int.

    Example:
      >>> t = custom_target("h100-96gb", {"sms": 132, "fp32_per_sm": 128, "smem_per_sm": 233472,
      ...     "smem_optin": 232448, "threads_per_sm": 2048, "hbm_bandwidth": 3.9e12,
      ...     "l2_bytes": 52428800, "clock_ghz": 1.98, "memory_bytes": 96 * 2**30})
      >>> t.memory_bytes
      103079215104
    """
    all_keys = (*_FACT_KEYS, *_OPTIONAL_FACTS)
    missing = [k for k in _FACT_KEYS if k not in facts]
    unknown = [k for k in facts if k not in all_keys]
    if missing or unknown:
        what = "; ".join(
            part
            for part in (
                f"missing {', '.join(missing)}" if missing else "",
                f"unknown {', '.join(map(str, unknown))}" if unknown else "",
            )
            if part
        )
        raise ValueError(f"facts for {name!r}: {what}. Keys: {', '.join(all_keys)}")
    full = {**_OPTIONAL_FACTS, **facts}
    if full["description"] is None:
        full["description"] = name
    for key in _FACT_KEYS:
        value = full[key]
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
            raise ValueError(f"facts for {name!r}: {key} must be a positive number, got {value!r}")
    full["compute_capability"] = _parse_cc(full["compute_capability"], name)
    return _gpu_target(name, full, devices, hosts)


def target_from_config(
    path_or_text: str | os.PathLike[str],
    name: str | None = None,
    *,
    host_link_bandwidth: float | None = None,
    peak_bf16_flops: float | None = None,
    devices: int = 1,
    hosts: int = 1,
) -> Target:
    """Builds a deviceless GPU target from a ``GpuTargetConfigProto`` in protobuf text format.

    Args:
      path_or_text: A path to the text file, or the text itself (recognised by ``{`` or a newline).
      name: The target's name; defaults to the file's stem, or a slug of ``device_description_str``.
      host_link_bandwidth: Host link bandwidth in bytes/s per direction, if known.
      peak_bf16_flops: Peak dense bf16 FLOP/s, if known.
      devices: Total number of devices.
      hosts: Number of hosts.

    Returns:
      A :class:`Target` of kind ``"gpu"`` whose ``target_config`` is the text as given.

    Raises:
      ValueError: If the file does not exist or ``device_memory_size`` is missing.

    Example:
      >>> t = target_from_config(target("l4").target_config)
      >>> t.description, t.compute_capability
      ('NVIDIA L4', (8, 9))
    """
    text, source, stem = _read_config(path_or_text)
    memory = _proto_number(text, "device_memory_size")
    if memory is None:
        raise ValueError(f"{source} has no device_memory_size: not a GpuTargetConfigProto?")
    bandwidth = _proto_number(text, "memory_bandwidth")
    cc = _proto_cc(text)
    desc_match = re.search(r'\bdevice_description_str\s*:\s*"((?:[^"\\]|\\.)*)"', text)
    description = _unescape(desc_match.group(1)) if desc_match else None
    if name is None:
        name = stem or _slug(description or "") or "custom-gpu"
    return Target(
        name=name,
        kind="gpu",
        description=description or name,
        memory_bytes=int(memory),
        hbm_bandwidth=bandwidth,
        host_link_bandwidth=host_link_bandwidth,
        peak_bf16_flops=peak_bf16_flops,
        devices=devices,
        hosts=hosts,
        compute_capability=cc,
        target_config=text,
    )


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
        _gpu_topology(target)


def configure_for_deviceless() -> None:
    """Sets ``JAX_PLATFORMS=cpu`` if nothing chose the platforms yet; the CLI calls it at start-up.

    Deviceless GPU compiles fail once jax has initialized its backends with the CUDA plugin probing
    for a driver that is absent. This does nothing if jax's backends are already initialized or if
    ``JAX_PLATFORMS``/``JAX_SKIP_CUDA_CONSTRAINTS_CHECK`` (or ``jax.config.jax_platforms``) is
    already set. Note it also makes the ``"local"`` target the CPU: skip it when measuring on a
    real GPU.

    Example:
      >>> configure_for_deviceless()
    """
    if _backends_initialized():
        return
    if os.environ.get("JAX_PLATFORMS") or os.environ.get("JAX_SKIP_CUDA_CONSTRAINTS_CHECK"):
        return
    if "jax" in sys.modules:
        if jax.config.jax_platforms:
            return
        jax.config.update("jax_platforms", "cpu")
    os.environ["JAX_PLATFORMS"] = "cpu"


# --- private helpers ----------------------------------------------------------------------------


def _configure_if_no_gpu() -> None:
    # On a machine with no NVIDIA device the CUDA plugin's driver probe can only fail (a cuInit
    # traceback, then no topology); choose jax's CPU platform for the user, as the CLI does. With
    # a GPU present the plugin starts normally and compiles deviceless as well, so leave it be.
    if not glob.glob("/dev/nvidia[0-9]*"):
        configure_for_deviceless()


def _check_count(what: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}: {value!r}")
    if value < 1:
        raise ValueError(f"{what} must be a positive int, got {value}")


def _gpu_target(name: str, facts: Mapping[str, Any], devices: int, hosts: int) -> Target:
    _configure_if_no_gpu()  # before anything starts jax's backends with a doomed CUDA probe
    major, minor = facts["compute_capability"]
    config = _CONFIG_TEMPLATE.format(
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
        description=_escape(facts["description"]),
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
    )


def _local_target(devices: int, hosts: int) -> Target:
    devs = jax.devices()
    if devices > len(devs):
        raise ValueError(
            f"devices={devices} but only {len(devs)} local {devs[0].platform} device(s) exist"
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
    known = next((f for f in _GPU_FACTS.values() if f["description"] == kind), {})
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
        raise ValueError("axis_names must name at least one mesh axis")
    if shape is None:
        return (devices,) + (1,) * (len(names) - 1)
    shape = tuple(int(s) for s in shape)
    if len(shape) != len(names):
        raise ValueError(
            f"mesh shape {shape} has {len(shape)} axes but axis_names {names} has {len(names)}"
        )
    if math.prod(shape) != devices:
        raise ValueError(
            f"mesh shape {shape} holds {math.prod(shape)} devices, target has {devices}"
        )
    return shape


def _gpu_topology(target: Target) -> Any:
    _configure_if_no_gpu()
    try:
        return _cached_topology(target.target_config, target.topology)
    except (NotImplementedError, RuntimeError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        if not _cuda_plugin_installed():
            raise TargetError(_PLUGIN_MESSAGE.format(name=target.name)) from err
        if isinstance(err, NotImplementedError) or "not implemented" in first.lower():
            raise TargetError(_PLATFORMS_MESSAGE.format(name=target.name, error=first)) from err
        raise TargetError(f"XLA rejected the target config of {target.name!r}: {first}") from err


@functools.lru_cache(maxsize=64)
def _cached_topology(config: str, topology: str) -> Any:
    from jax.experimental import topologies

    return topologies.get_topology_desc(platform="cuda", target_config=config, topology=topology)


def _cuda_plugin_installed() -> bool:
    try:
        importlib.import_module("jax_plugins.xla_cuda12")
    except ImportError:
        return False
    return True


def _backends_initialized() -> bool:
    try:
        from jax._src import xla_bridge

        check = getattr(xla_bridge, "backends_are_initialized", None)
        if check is not None:
            return bool(check())
        return bool(getattr(xla_bridge, "_backends", {}))
    except Exception:  # private API; assume initialized, stay hands-off
        return True


def _read_config(path_or_text: str | os.PathLike[str]) -> tuple[str, str, str | None]:
    if isinstance(path_or_text, str) and ("{" in path_or_text or "\n" in path_or_text):
        return path_or_text, "target config text", None
    path = os.fspath(path_or_text)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise ValueError(f"target config file {path!r} does not exist") from None
    stem = os.path.splitext(os.path.basename(path))[0]
    return text, f"target config file {path!r}", stem


def _proto_number(text: str, key: str) -> float | None:
    match = re.search(rf"\b{key}\s*:\s*([-+0-9.eE]+)", text)
    if match is None:
        return None
    value = float(match.group(1))
    return int(value) if value.is_integer() else value


def _proto_cc(text: str) -> tuple[int, int] | None:
    block = re.search(r"\bcuda_compute_capability\s*\{([^}]*)\}", text)
    if block is None:
        return None
    major = re.search(r"\bmajor\s*:\s*(\d+)", block.group(1))
    minor = re.search(r"\bminor\s*:\s*(\d+)", block.group(1))
    return (int(major.group(1)) if major else 0, int(minor.group(1)) if minor else 0)


def _parse_cc(value: Any, name: str) -> tuple[int, int]:
    if isinstance(value, str):
        value = value.split(".")
    try:
        major, minor = (int(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(
            f"compute_capability of {name!r} must be (major, minor), got {value!r}"
        ) from None
    return major, minor


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
