"""Two peaks compared: what the second report keeps at its peak that the first does not.

See :func:`diff` for an example.
"""

from __future__ import annotations

from remat_kit.peak._types import CATEGORIES, FRAGMENTATION, PeakDiff, PeakReport

__all__ = [
    "diff",
]


def diff(a: PeakReport, b: PeakReport) -> PeakDiff:
    """What ``b`` keeps at its peak that ``a`` does not ("why did my memory go up").

    Buffers are compared at each report's own peak, grouped by category and label (the
    checkpoint name, else the Flax module path and op).

    Args:
      a: the reference report (e.g. policy ``full``).
      b: the report to explain (e.g. policy ``none``).

    Returns:
      The PeakDiff.

    Example:
      >>> cfg = rk.TrainConfig(batch=2, seq=16)
      >>> a = rk.peak.inspect_step(rk.build_train_step(tiny_model("full"), cfg), "h100")
      >>> b = rk.peak.inspect_step(rk.build_train_step(tiny_model("none"), cfg), "h100")
      >>> d = diff(a, b)
      >>> d.peak_delta > 0, d.kept[0][:2]
      (True, ('saved activation', 'TinyModel/layers_0/up_proj/dot_general'))
    """
    la, lb = a.by_label(), b.by_label()
    rows = [(c, lab, la.get((c, lab), 0), lb.get((c, lab), 0)) for c, lab in {*la, *lb}]
    extra_a = a.by_category.get(FRAGMENTATION, 0)
    extra_b = b.by_category.get(FRAGMENTATION, 0)
    if extra_a or extra_b:
        rows.append((FRAGMENTATION, FRAGMENTATION, extra_a, extra_b))
    kept = sorted((r for r in rows if r[3] > r[2]), key=lambda r: (r[2] - r[3], r[1]))
    dropped = sorted((r for r in rows if r[2] > r[3]), key=lambda r: (r[3] - r[2], r[1]))
    cats = {c: b.by_category.get(c, 0) - a.by_category.get(c, 0) for c in CATEGORIES}
    return PeakDiff(
        peak_delta=b.peak_bytes - a.peak_bytes,
        by_category=cats,
        kept=tuple(kept),
        dropped=tuple(dropped),
        peak_phases=(a.peak_phase, b.peak_phase),
    )
