"""Live bytes at every position of the schedule, by category: what a trace's counters draw.

:func:`remat_kit.peak._attribute.analyse` says what each buffer live *at the peak* is; this
puts every buffer of the program in its category (the same rules) and counts, at each
position, the bytes of each category. Bytes are counted as the report counts them at its
peak: buffers may share addresses while both are live (an op writing its output over an
operand that dies there), and the newer buffer owns what they share. So at every position
the categories add up to the report's ``timeline`` (arguments included), and at the peak
they are the report's ``by_category`` (less ``fragmentation``, which is free space).

Buffers XLA places in another memory space (an offload policy's residuals in pinned host
memory) are counted apart, as ``host``: they are not device memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from remat_kit.peak._parsers import Allocation, LiveRanges, Value

__all__ = [
    "HOST",
    "LiveSeries",
    "live_series",
]

#: The series of bytes in host memory (another memory space than the device's).
HOST = "host"


@dataclasses.dataclass(frozen=True)
class LiveSeries:
    """Live bytes at each schedule position, by category, and what the trace needs beside.

    Attributes:
      sequence: the instruction at each position (the live-range dump's schedule).
      by_category: category -> device bytes its buffers cover at each position (the
        arguments' categories included, held for the whole program).
      host: bytes of buffers in host memory at each position.
      hlo_text: the optimized HLO the positions belong to (for the kernels' times).
    """

    sequence: tuple[str, ...]
    by_category: Mapping[str, tuple[int, ...]]
    host: tuple[int, ...]
    hlo_text: str


def live_series(
    values: Sequence[Value],
    allocs: Mapping[int, Allocation],
    live: LiveRanges,
    category_of: Mapping[str, str],
    argument_bytes: Mapping[str, int],
    hlo_text: str,
) -> LiveSeries:
    """Counts each category's live bytes at every position.

    Args:
      values: the buffer assignment's values.
      allocs: its allocations, by index.
      live: the live ranges and the schedule.
      category_of: a value's name -> its category (values not named are left out: entry
        parameters, constants, thread-local scratch, empty values).
      argument_bytes: category -> device bytes of the arguments in it (live throughout).
      hlo_text: the optimized HLO text, kept for the timeline.

    Returns:
      The LiveSeries.

    Example:
      >>> from remat_kit.peak._parsers import Allocation, LiveRanges, Value
      >>> allocs = {0: Allocation(0, 8, None, frozenset())}
      >>> vals = [Value("a{}", "a", 0, 8, 0, "f32[2]"), Value("b{}", "b", 0, 4, 4, "f32[1]")]
      >>> live = LiveRanges(("a", "b", "c"), {"a{}": (0, 1), "b{}": (1, 2)}, None)
      >>> s = live_series(vals, allocs, live, {"a{}": "x", "b{}": "y"}, {"w": 2}, "")
      >>> s.by_category["x"], s.by_category["y"], s.by_category["w"]
      ((8, 4, 0), (0, 4, 4), (2, 2, 2))
    """
    n = len(live.sequence)
    base, at = {}, 0
    for a in sorted(allocs.values(), key=lambda a: a.index):
        base[a.index] = at
        at += a.size
    device: list[tuple[int, int, int, int, str]] = []
    host: list[tuple[int, int, int, int, str]] = []
    for v in values:
        cat = category_of.get(v.name)
        if cat is None or v.name not in live.ranges or v.size == 0:
            continue
        a = allocs[v.allocation]
        s, e = live.ranges[v.name]
        s, e = max(s, 0), min(e, n - 1)
        if s <= e:
            lo = base[v.allocation] + v.offset
            (device if a.color == 0 else host).append((lo, lo + v.size, s, e, cat))
    owned = _owned(device, n)
    by_category = {
        cat: tuple(int(x) + argument_bytes.get(cat, 0) for x in owned.get(cat, np.zeros(n)))
        for cat in dict.fromkeys([*argument_bytes, *owned])
    }
    host_bytes = sum(_owned(host, n).values(), np.zeros(n, dtype=np.int64))
    return LiveSeries(
        tuple(live.sequence), by_category, tuple(int(x) for x in host_bytes), hlo_text
    )


def _owned(rows: Sequence[tuple[int, int, int, int, str]], n: int) -> dict[str, np.ndarray]:
    """Bytes each category owns at each position: where live buffers share addresses, the
    one that became live last (then the larger) owns them, as at the report's peak."""
    cats = list(dict.fromkeys(r[4] for r in rows))
    out = {c: np.zeros(n, dtype=np.int64) for c in cats}
    if not rows:
        return out
    lo = np.array([r[0] for r in rows], dtype=np.int64)
    hi = np.array([r[1] for r in rows], dtype=np.int64)
    start = np.array([r[2] for r in rows], dtype=np.int64)
    end = np.array([r[3] for r in rows], dtype=np.int64)
    cat = np.array([cats.index(r[4]) for r in rows], dtype=np.int64)
    for t in range(n):
        idx = np.nonzero((start <= t) & (end >= t))[0]
        if idx.size == 0:
            continue
        edges = np.unique(np.concatenate((lo[idx], hi[idx])))
        owner = np.full(edges.size - 1, -1, dtype=np.int64)
        first = np.searchsorted(edges, lo[idx])
        last = np.searchsorted(edges, hi[idx])
        # Paint the weakest first: the strongest (latest start, then largest) paints last.
        order = sorted(range(idx.size), key=lambda i: (-start[idx[i]], -(hi[idx[i]] - lo[idx[i]])))
        for i in reversed(order):
            owner[first[i] : last[i]] = cat[idx[i]]
        widths = np.diff(edges)
        held = owner >= 0
        counts = np.bincount(owner[held], weights=widths[held], minlength=len(cats))
        for c, name in enumerate(cats):
            out[name][t] = int(counts[c])
    return out
