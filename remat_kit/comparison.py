"""A comparison of reports against ``none``: the flat rows ``remat-kit compare`` writes.

Each row is a report's figures, its step time and how it compares with the report of policy
``none`` (no schedule) among them: the peak saved, the step time added. JSON- and CSV-ready
data; :func:`remat_kit.render.compare_table` makes the table of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from remat_kit.analysis import MemoryReport

__all__ = [
    "compare_rows",
]


def compare_rows(reports: Sequence[MemoryReport]) -> list[dict[str, Any]]:
    """Flat rows of a comparison: the report fields plus savings against ``none``.

    Args:
      reports: one report per (policy, schedule), in the order to show.

    Returns:
      One JSON/CSV-ready dict per report. ``saved_vs_none`` is 1 - peak/peak(none) when
      ``none`` (without a schedule) is among the reports, else None.

    Example:
      >>> reports = [w.report("none", batch=2), w.report("full", batch=2)]
      >>> [(r["policy"], r["saved_vs_none"] >= 0) for r in compare_rows(reports)]
      [('none', True), ('full', True)]
    """
    base = next((r for r in reports if r.policy == "none" and r.schedule == "none"), None)
    base_time = base.step_time.seconds if base is not None and base.step_time else None
    rows = []
    for r in reports:
        est = r.meta.offload_estimate or {}
        t = r.step_time
        tokens = r.tokens_per_step
        row = {
            "policy": r.policy,
            "schedule": r.schedule,
            "attention": r.attention,
            "target": r.target,
            "peak_bytes": r.peak_bytes,
            "argument_bytes": r.argument_bytes,
            "output_bytes": r.output_bytes,
            "temp_bytes": r.temp_bytes,
            "alias_bytes": r.alias_bytes,
            "host_bytes": r.host_bytes,
            "xla_peak_bytes": r.xla_peak_bytes,
            "activation_bytes": r.breakdown.get("activations"),
            "flops": r.flops,
            "recompute_overhead": r.meta.recompute_overhead,
            "step_seconds": t.seconds if t else None,
            "time_vs_none": (t.seconds / base_time - 1) if t and base_time else None,
            "tokens_per_second": t.tokens_per_second(tokens) if t and tokens else None,
            "mfu": t.mfu if t else None,
            "recompute_seconds": t.recompute_seconds if t else None,
            "transfer_seconds": t.transfer_seconds if t else None,
            "saved_vs_none": (1 - r.peak_bytes / base.peak_bytes) if base else None,
            "fits": r.fits,
            "fits_with_fraction": r.fits_with_fraction,
            "usable_bytes": r.usable_bytes,
            "mem_fraction": r.mem_fraction,
            "xla_remat": r.xla_remat,
            "xla_remat_saved_bytes": r.xla_remat_saved_bytes,
            "compile_seconds": r.compile_seconds,
            "offload_transfer_seconds_est": est.get("transfer_seconds"),
            "offload_recompute_seconds_est": est.get("recompute_seconds"),
            "step_compute_seconds_est": est.get("step_compute_seconds"),
            **{
                f"meta_{k}": v
                for k, v in r.meta.items()
                if k not in ("recompute_overhead", "offload_estimate")
            },
            **{f"{k}_bytes": v for k, v in r.breakdown.items() if k != "activations"},
        }
        rows.append(row)
    return rows
