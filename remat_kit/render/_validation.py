"""The ``validate`` table: a prediction beside what the allocator and the clock measured on a
real GPU (:class:`remat_kit.validate.Validation`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

from remat_kit._units import gib, pct
from remat_kit.render._titles import training_line

__all__ = [
    "validation_table",
]


def validation_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    """Predicted against measured peaks on a real GPU, one row per check.

    Args:
      rows: ``Validation.to_dict()`` of each check (``remat_kit.validate``).

    Returns:
      The table.

    Example:
      >>> row = {"target": "h100-80gb", "device_kind": "NVIDIA H100 80GB HBM3",
      ...        "predicted_peak_bytes": 30 * 2**30, "measured_peak_bytes": 31 * 2**30,
      ...        "error": 30 / 31 - 1, "meta": {"model": "llama3.2-1b", "policy": "full"}}
      >>> t = validation_table([row])  # rows: Validation.to_dict() of real checks
      >>> t.title, [list(c.cells)[0] for c in t.columns][4:7]
      ('predicted vs measured peak on NVIDIA H100 80GB HBM3', ['30.00', '31.00', '-3.2%'])
    """
    first = rows[0] if rows else {}
    table = Table(
        title=f"predicted vs measured peak on {first.get('device_kind', '-')}"
        + training_line((first.get("meta") or {}).get("precision"), None),
        caption="measured = allocator peak_bytes_in_use after the steps - bytes_in_use before "
        "the arguments; error = predicted / measured - 1; step s: median of the steps after "
        "the first, predicted by remat_kit.timing",
    )
    columns = ("model", "policy", "b x s", "compiled for", "predicted GiB", "measured GiB")
    for col in (*columns, "error", "limit GiB", "step s pred / meas", "ran"):
        table.add_column(col, justify="left" if col in ("model", "policy") else "right")
    for row in rows:
        m = row.get("meta") or {}
        ran = "OOM" if row.get("oom") else ("ok" if row.get("measured_peak_bytes") else "?")
        table.add_row(
            str(m.get("model", "-")),
            str(m.get("policy", "-")),
            f"{m.get('batch', '-')} x {m.get('seq', '-')}",
            str(row.get("target")),
            gib(row.get("predicted_peak_bytes")),
            gib(row.get("measured_peak_bytes")),
            pct(row.get("error")),
            gib(row.get("bytes_limit")),
            _pair(row.get("predicted_step_seconds"), row.get("step_seconds")),
            ran,
        )
    return table


def _pair(predicted: float | None, measured: float | None) -> str:
    cell = lambda v: "-" if v is None else f"{v:.3f}"
    return f"{cell(predicted)} / {cell(measured)}"
