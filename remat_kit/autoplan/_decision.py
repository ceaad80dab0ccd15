"""What ``rk.auto`` decided for one shape of the step: :class:`AutoPlan`, data first, with
the one sentence the log line says (the plan owns its words, as a note does).

Example:
  >>> p = AutoPlan(policy="minimal", source="catalogue", target="h100-80gb", budget="fits",
  ...              budget_bytes=2**30, peak_bytes=2**29, host_bytes=0, step_seconds=0.9,
  ...              none_seconds=1.0, none_peak_bytes=2**31, catalogue_policy="minimal",
  ...              catalogue_seconds=0.9, catalogue_peak_bytes=2**29, compiles=4,
  ...              seconds=3.0, program="ab" * 32)
  >>> round(p.vs_none, 3), p.vs_catalogue
  (-0.1, 0.0)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from remat_kit.targets.runtime import SLOP_OPTION

__all__ = [
    "AutoPlan",
]


@dataclasses.dataclass(frozen=True)
class AutoPlan:
    """The decision for one shape of a step: the policy its ``"auto"`` blocks take.

    Memory is measured (the compiled program for ``target``); times are predicted from the
    compiled kernels at the target's published rates (:mod:`remat_kit.timing`), None where
    the target has none.

    Attributes:
      policy: the policy's spec (a catalogue name, or the planner's ``names:save=...``).
      source: where it comes from (``rk.search.Plan.source``): ``none`` (no remat needed),
        ``beside_none``, ``solver`` (a per-tensor plan), ``catalogue``, ``schedule``; or
        ``xla``: ``none`` under XLA's own rematerialization pass, asked (``slop_factor``) to
        work to the budget.
      target: the target's name the step was planned for.
      budget: the budget as given (``"fits"``, ``"60GiB"``, ``"0.8"``, ``"activations=0.5"``).
      budget_bytes: the limit the plan's compiled peak is under.
      peak_bytes: the plan's compiled peak (argument + output + temp - alias).
      host_bytes: bytes it offloads to host memory.
      step_seconds: the plan's predicted step time.
      none_seconds: ``none``'s predicted step time (XLA's own remat pass included where
        ``none`` was over XLA's limit).
      none_peak_bytes: ``none``'s compiled peak.
      catalogue_policy: the fastest catalogue policy under the budget (None: none fits).
      catalogue_seconds: its predicted step time.
      catalogue_peak_bytes: its compiled peak.
      compiles: programs compiled to decide (0 when read back from the cache).
      seconds: wall time spent deciding (reading back, when cached).
      program: fingerprint of the step's program (``none``, lowered for the target).
      decisions: tag -> ``save`` / ``recompute`` / ``offload`` under the policy.
      cached: read back from the disk cache (:mod:`remat_kit.cache`), not decided here.
      device: the device's description (``NVIDIA H100 80GB HBM3``).
      slop_factor: XLA's ``xla_gpu_memory_limit_slop_factor`` the step is compiled with
        (source ``xla``), None for XLA's default.
      mesh: a sharded step's mesh axes and sizes (``{"data": 4}``), planned for that many
        devices of ``target``: every byte figure (and the budget) is one device's. Empty for
        one device.
    """

    policy: str
    source: str
    target: str
    budget: str
    budget_bytes: int
    peak_bytes: int
    host_bytes: int
    step_seconds: float | None
    none_seconds: float | None
    none_peak_bytes: int
    catalogue_policy: str | None
    catalogue_seconds: float | None
    catalogue_peak_bytes: int | None
    compiles: int
    seconds: float
    program: str
    decisions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    cached: bool = False
    device: str = ""
    slop_factor: int | None = None
    mesh: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @property
    def devices(self) -> int:
        """The devices the step was planned for (the mesh's; 1 without one)."""
        n = 1
        for size in self.mesh.values():
            n *= int(size)
        return n

    @property
    def compiler_options(self) -> dict[str, int]:
        """The options the decided step is compiled with (``jax.jit``'s ``compiler_options``):
        the slop factor of a ``xla`` plan, else none."""
        return {} if self.slop_factor is None else {SLOP_OPTION: self.slop_factor}

    @property
    def vs_none(self) -> float | None:
        """Predicted step time against ``none``'s, less one (negative: faster)."""
        return _ratio(self.step_seconds, self.none_seconds)

    @property
    def vs_catalogue(self) -> float | None:
        """Predicted step time against the best catalogue policy's, less one."""
        return _ratio(self.step_seconds, self.catalogue_seconds)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (the cache's record)."""
        out = dataclasses.asdict(self)
        out["decisions"] = dict(self.decisions)
        out["mesh"] = dict(self.mesh)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AutoPlan:
        """The plan from :meth:`to_dict`'s fields.

        Raises:
          TypeError: a missing or unknown field (a record of another version).
        """
        return cls(**dict(data))

    def words(self) -> str:
        """The log line: what was chosen, under what, at what predicted cost.

        Example:
          >>> AutoPlan("full", "catalogue", "h100-80gb", "fits", 2**30, 2**29, 0, None, None,
          ...          2**31, "full", None, 2**29, 3, 1.5, "0" * 64).words()[:60]
          'remat auto: full (catalogue) on h100-80gb, peak 512.00 MiB u'
        """
        chosen = f"{self.policy} ({self.source})"
        if self.slop_factor is not None:
            chosen = f"none under XLA's remat pass at slop {self.slop_factor}% (xla)"
        where = self.target
        if self.mesh:
            axes = ", ".join(f"{k}={v}" for k, v in self.mesh.items())
            where = f"{self.devices}x {self.target} (mesh {axes}; bytes per device)"
        parts = [
            f"remat auto: {chosen} on {where}, peak "
            f"{_size(self.peak_bytes)} under {_size(self.budget_bytes)} "
            f"(budget {self.budget}; none {_size(self.none_peak_bytes)})"
        ]
        if self.step_seconds is not None:
            t = f"step {self.step_seconds * 1e3:.2f} ms (predicted)"
            if self.vs_none is not None:
                t += f", {self.vs_none:+.1%} vs none"
            if self.catalogue_policy is not None and self.vs_catalogue is not None:
                t += f", {self.vs_catalogue:+.1%} vs {self.catalogue_policy}"
            parts.append(t)
        if self.cached:
            parts.append("decision read from the cache")
        else:
            parts.append(f"decided in {self.compiles} compiles, {self.seconds:.1f} s")
        return "; ".join(parts)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or not b:
        return None
    return a / b - 1.0
