"""Targets by name: the catalogue's GPUs, TPU slices, the CPU host and the local devices.

:func:`target` turns a name (and a device count) into a :class:`~remat_kit.targets.Target`;
:func:`as_target` is what every ``target=`` argument goes through.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
from collections.abc import Mapping
from typing import Any

import jax

from remat_kit.errors import BadType, BadValue, unknown
from remat_kit.targets._catalogue import ALIASES, CONFIG_TEMPLATE, GPU_FACTS, SPECIAL
from remat_kit.targets._core import Target, _check_count
from remat_kit.targets._nodes import node
from remat_kit.targets._platform import configure_if_no_gpu
from remat_kit.targets._proto import escape
from remat_kit.targets._slices import (
    GENERATIONS,
    TPU_ALIASES,
    is_slice_name,
    parse_slice,
    slice_of,
)
from remat_kit.targets._tpus import TPU_FACTS
from remat_kit.targets.runtime import Runtime, runtime_from_env

__all__ = [
    "COMPUTE_CAPABILITIES",
    "as_target",
    "cudnn_attention_available",
    "target",
    "target_names",
]


# A bare generation's slice is sized by ``devices``; a counted or gridded name sizes itself.
_BARE = frozenset([*GENERATIONS, *TPU_ALIASES])


def target_names(kind: str | None = None) -> list[str]:
    """Returns the sorted canonical target names (aliases such as ``"h100"`` excluded).

    Args:
      kind: ``"gpu"`` or ``"tpu"`` for that kind's names only (a TPU's is its generation,
        sized when built: ``v5p-64``); None for all, ``cpu`` and ``local`` included.

    Returns:
      A sorted list of names accepted by :func:`target`.

    Example:
      >>> "h100-80gb" in target_names()
      True
      >>> target_names("tpu")
      ['tpu7x', 'v4', 'v5e', 'v5p', 'v6e']
    """
    if kind not in (None, "gpu", "tpu"):
        raise BadValue(f"kind must be 'gpu', 'tpu' or None, got {kind!r}", param="kind")
    if kind == "gpu":
        return sorted(GPU_FACTS)
    if kind == "tpu":
        return sorted(GENERATIONS)
    return sorted([*GPU_FACTS, *GENERATIONS, *SPECIAL])


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
    if t.kind in ("gpu", "tpu"):
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
    slices: int = 1,
) -> Target:
    """Returns a built-in target by name.

    Args:
      name: A name from :func:`target_names` or an alias (``"h100"``, ``"h100-sxm"``, ``"a100"``).
        ``"cpu"`` is the XLA host backend; ``"local"`` is whatever ``jax.devices()[0]`` is (this
        initializes jax's backends). A TPU slice as Cloud TPU and MaxText's
        ``compile_topology`` name it (``"v5p-64"``, ``"v5litepod-16"``), as libtpu names its
        topology (``"v6e:8x16"``), or a bare generation (``"v5e"``) with ``devices``.
      devices: Total number of devices (a named TPU slice says its own; give it or leave 1).
      hosts: Number of hosts the devices are spread over (GPU targets only; a TPU slice has
        Cloud TPU's 4 chips to a host).
      mem_fraction: the share of each GPU a JAX process's allocator takes; default: what the
        environment says (``XLA_PYTHON_CLIENT_MEM_FRACTION``...), else JAX's 0.75.
      node: the machine the GPUs come in (:func:`remat_kit.targets.node_names`); with
        ``hosts=1`` and more devices than one node holds, the devices fill whole nodes.
      slices: TPU slices joined over the data-centre network (MaxText's ``num_slices``).

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
      >>> t = target("v5p-64")
      >>> t.name, t.devices, t.hosts, t.topology
      ('v5p', 32, 8, 'v5:2x4x4')
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
    if is_slice_name(key):
        if node is not None or mem_fraction is not None:
            what = "node" if node is not None else "mem_fraction"
            raise BadValue(f"{what} is for GPU targets, not the TPU slice {name!r}", param=what)
        return _tpu_target(key, devices, hosts, slices)
    if slices != 1:
        raise BadValue(f"slices are for TPU targets, not {name!r}", param="slices")
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


def _tpu_target(key: str, devices: int, hosts: int, slices: int) -> Target:
    if key.strip().lower() not in _BARE:
        s = parse_slice(key, slices=slices)
    elif devices == 1:  # the default: one chip (TPU7x's chip is two devices)
        s = parse_slice(key, chips=1, slices=slices)
    else:
        s = slice_of(key, devices, slices)
    if devices not in (1, s.devices) and key.strip().lower() not in _BARE:
        raise BadValue(
            f"{s.name}{f' x{slices}' if slices > 1 else ''} holds {s.devices} devices, not "
            f"devices={devices}: leave devices out or name another slice",
            param="devices",
        )
    if hosts not in (1, s.hosts):
        raise BadValue(
            f"{s.name} spans {s.hosts} hosts of Cloud TPU's, not hosts={hosts}", param="hosts"
        )
    facts = TPU_FACTS[s.generation]
    per_chip = s.layout.devices_per_chip
    return Target(
        name=s.generation,
        kind="tpu",
        description=facts["device_kind"],
        memory_bytes=int(facts["hbm_bytes_per_device"]),
        hbm_bandwidth=facts["hbm_bandwidth"] / per_chip,
        host_link_bandwidth=None,
        peak_bf16_flops=facts["peak_bf16_flops"] / per_chip,
        reserved_bytes=int(facts["hbm_reserved_bytes_per_device"]),
        devices=s.devices,
        hosts=s.hosts,
        tpu_slice=s,
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
