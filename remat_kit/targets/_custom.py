"""Targets for GPUs outside the catalogue: from a card's facts or a GpuTargetConfigProto."""

from __future__ import annotations

import numbers
import os
import re
from collections.abc import Mapping
from typing import Any

from remat_kit.errors import BadValue
from remat_kit.targets._catalogue import FACT_KEYS, OPTIONAL_FACTS
from remat_kit.targets._core import Target
from remat_kit.targets._named import _gpu_target, _parse_cc, _runtime
from remat_kit.targets._proto import proto_cc, proto_number, read_config, slug, unescape

__all__ = [
    "custom_target",
    "target_from_config",
]


def custom_target(
    name: str,
    facts: Mapping[str, Any],
    devices: int = 1,
    hosts: int = 1,
    mem_fraction: float | None = None,
) -> Target:
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
    all_keys = (*FACT_KEYS, *OPTIONAL_FACTS)
    missing = [k for k in FACT_KEYS if k not in facts]
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
        raise BadValue(f"facts for {name!r}: {what}. Keys: {', '.join(all_keys)}")
    full = {**OPTIONAL_FACTS, **facts}
    if full["description"] is None:
        full["description"] = name
    for key in FACT_KEYS:
        value = full[key]
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
            raise BadValue(f"facts for {name!r}: {key} must be a positive number, got {value!r}")
    full["compute_capability"] = _parse_cc(full["compute_capability"], name)
    return _gpu_target(name, full, devices, hosts, _runtime(mem_fraction))


def target_from_config(
    path_or_text: str | os.PathLike[str],
    name: str | None = None,
    *,
    host_link_bandwidth: float | None = None,
    peak_bf16_flops: float | None = None,
    devices: int = 1,
    hosts: int = 1,
    mem_fraction: float | None = None,
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
      ValueError: If the file does not exist, ``device_memory_size`` is missing, or its
        ``cuda_compute_capability`` is no NVIDIA GPU's (``COMPUTE_CAPABILITIES``).

    Example:
      >>> t = target_from_config(rk.target("l4").target_config)
      >>> t.description, t.compute_capability
      ('NVIDIA L4', (8, 9))
    """
    text, source, stem = read_config(path_or_text)
    memory = proto_number(text, "device_memory_size")
    if memory is None:
        raise BadValue(f"{source} has no device_memory_size: not a GpuTargetConfigProto?")
    bandwidth = proto_number(text, "memory_bandwidth")
    desc_match = re.search(r'\bdevice_description_str\s*:\s*"((?:[^"\\]|\\.)*)"', text)
    description = unescape(desc_match.group(1)) if desc_match else None
    if name is None:
        name = stem or slug(description or "") or "custom-gpu"
    cc = proto_cc(text)
    if cc is not None:  # XLA would compile for any pair it is given, a card that is not
        cc = _parse_cc(cc, name)
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
        runtime=_runtime(mem_fraction),
    )
