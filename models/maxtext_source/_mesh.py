"""MaxText's device mesh over a target's compile-only devices: a TPU slice's in libtpu's order,
a GPU cluster's with each host a slice.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

import remat_kit as rk
from remat_kit.errors import BadValue
from remat_kit_models.maxtext_source._config import _maxtext, _quiet, _refusal

__all__ = ["OnHost", "cluster_mesh"]


@dataclasses.dataclass(frozen=True)
class OnHost:
    """A compile-only GPU as MaxText sees it on a cluster: its slice is its host.

    jax's compile-only GPUs all carry slice 0; on a GPU cluster each host's GPUs are one
    slice (MaxText's ``a3``: "the slice topology of A3 fixed to a single host"), which its
    ``create_device_mesh`` reads to lay the ``dcn_*`` axes across hosts. Everything else is
    the device's own.

    Attributes:
      device: the compile-only device.
    """

    device: Any

    @property
    def slice_index(self) -> int:
        """The device's host (its ``process_index``)."""
        return int(self.device.process_index)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.device, name)


def cluster_mesh(make: Callable[[list[Any]], Any], devices: list[Any]) -> np.ndarray:
    """``make(devices)`` (a device grid, MaxText's ``create_device_mesh``) given each device
    as a cluster shows it (:class:`OnHost`); the grid in the devices themselves.

    Example:
      >>> import numpy as np
      >>> cpu = jax.devices("cpu")[0]
      >>> seen = []
      >>> grid = cluster_mesh(lambda ds: seen.extend(d.slice_index for d in ds) or [ds], [cpu])
      >>> seen, grid[0, 0] is cpu
      ([0], True)
    """
    grid = make([OnHost(d) for d in devices])
    out = np.empty(np.shape(grid), dtype=object)
    for index, d in np.ndenumerate(grid):
        out[index] = d.device if isinstance(d, OnHost) else d
    return out


def _mesh(cfg: Any, target: rk.Target) -> jax.sharding.Mesh:
    """MaxText's mesh of ``cfg``'s parallelism keys over ``target``'s compile-only devices:
    a TPU slice's as libtpu lists them (MaxText's ``get_topology_mesh``), a GPU's with each
    host a slice as on a cluster (:class:`OnHost`)."""
    mt = _maxtext()
    devices = list(target.mesh().devices.reshape(-1))
    make = functools.partial(mt.maxtext_utils.create_device_mesh, cfg)
    try:
        with _quiet():
            if target.tpu_slice is not None:
                # libtpu's own devices in its own order (get_topology_desc lists them by id;
                # the target's mesh has them in torus order), which MaxText's TPU path hands
                # to create_device_mesh: its grid is then the one MaxText lays out.
                grid = make(sorted(devices, key=lambda d: d.id))
            else:
                grid = cluster_mesh(make, devices)
    except Exception as err:
        where = (
            target.label
            if target.tpu_slice is not None
            else f"{target.devices} GPU(s)"
            + (f" on {target.hosts} hosts" if target.hosts > 1 else "")
        )
        raise BadValue(
            f"MaxText's mesh for {where} (num_slices={cfg.num_slices}): {_refusal(err)}",
            param="maxtext",
        ) from None
    explicit = str(cfg.shard_mode).lower().endswith("explicit")
    kind = jax.sharding.AxisType.Explicit if explicit else jax.sharding.AxisType.Auto
    return jax.sharding.Mesh(grid, cfg.mesh_axes, axis_types=(kind,) * len(cfg.mesh_axes))
