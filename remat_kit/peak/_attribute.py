"""Attribution: which buffers are live at the peak, what each one is, and the timeline.

How the figures relate. ``peak_bytes`` is memory_report's figure, argument + output +
temp - alias, read from the same compile. XLA places temporaries in one preallocated
block; buffers live at different times cannot always be packed without gaps, so the most
bytes live at any one instant (``live_peak_bytes``, from the live ranges) is at most
``peak_bytes``. The difference is reported as the category ``fragmentation``, so the
categories add up to ``peak_bytes``. Buffers XLA places in another memory space (an offload
policy's residuals, in pinned host memory: an allocation of another color) are not device
memory and are left out; their temp block is ``host_temp_bytes``.

Each buffer live at the peak is described (what it is, its layer, its tag) by
:mod:`remat_kit.peak._classify`; :func:`analyse` shows the pieces together.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from remat_kit.errors import InspectError
from remat_kit.peak._classify import (
    ArgLeaf,
    _carried,
    _Context,
    _describe,
    _layers_by_shape,
    _parameter_buffer,
)
from remat_kit.peak._dump import DumpFiles
from remat_kit.peak._libtpu import TpuTemp, tpu_temp
from remat_kit.peak._parsers import (
    Allocation,
    LiveRanges,
    Value,
    parse_buffer_assignment,
    parse_hlo,
    parse_live_range,
)
from remat_kit.peak._phases import phase_at, phases_of
from remat_kit.peak._series import LiveSeries, live_series
from remat_kit.peak._tags import (
    Tag,
)
from remat_kit.peak._types import (
    CATEGORIES,
    FRAGMENTATION,
    PeakBuffer,
    PeakReport,
)
from remat_kit.xla import xla_peak as xla_peak_of

__all__ = [
    "analyse",
]

#: XLA's memory space of device memory (an allocation's "color"); others are offloaded.
DEVICE = 0
#: libtpu's pinned host memory (an offload's residuals); VMEM is 1, SMEM 2.
TPU_HOST = 5


@dataclasses.dataclass(frozen=True)
class _Live:
    """Values that occupy device memory, as arrays: address interval and live span."""

    values: tuple[Value, ...]
    lo: np.ndarray  # global address of the first byte
    hi: np.ndarray  # one past the last byte
    start: np.ndarray
    end: np.ndarray
    temp: np.ndarray  # in the preallocated temp block
    fixed_bytes: int  # parameter allocations, held for the whole program


def _live_values(
    values: Sequence[Value], allocs: Mapping[int, Allocation], live: LiveRanges, n: int
) -> _Live:
    base, at = {}, 0
    for a in sorted(allocs.values(), key=lambda a: a.index):
        base[a.index] = at
        at += a.size
    kept = []
    for v in values:
        a = allocs[v.allocation]
        if a.parameter is not None or a.kinds & {"thread-local", "constant"} or v.size == 0:
            continue
        if a.color != DEVICE:  # offloaded: in host memory, not the device's
            continue
        if v.name not in live.ranges:
            continue
        s, e = live.ranges[v.name]
        if max(s, 0) <= min(e, n - 1):
            kept.append((v, max(s, 0), min(e, n - 1)))
    fixed = sum(a.size for a in allocs.values() if a.parameter is not None and a.color == DEVICE)
    lo = np.array([base[v.allocation] + v.offset for v, _, _ in kept], dtype=np.int64)
    return _Live(
        tuple(v for v, _, _ in kept),
        lo,
        lo + np.array([v.size for v, _, _ in kept], dtype=np.int64),
        np.array([s for _, s, _ in kept], dtype=np.int64),
        np.array([e for _, _, e in kept], dtype=np.int64),
        np.array(["preallocated-temp" in allocs[v.allocation].kinds for v, _, _ in kept]),
        fixed,
    )


def _union_bytes(lo: np.ndarray, hi: np.ndarray) -> int:
    """Bytes covered by the union of address intervals [lo, hi)."""
    if lo.size == 0:
        return 0
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    reach = np.maximum.accumulate(hi)
    prev = np.concatenate(([lo[0]], reach[:-1]))
    return int(np.maximum(hi - np.maximum(lo, prev), 0).sum())


def _timeline(lv: _Live, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Bytes occupied at each position (all memory, and the temp block alone).

    Buffers may share addresses while both are live (an op writing its output over an
    operand that dies there), so occupancy is the union of address ranges, not a sum.
    """
    total = np.zeros(n, dtype=np.int64)
    temp = np.zeros(n, dtype=np.int64)
    for t in range(n):
        mask = (lv.start <= t) & (lv.end >= t)
        total[t] = _union_bytes(lv.lo[mask], lv.hi[mask])
        tm = mask & lv.temp
        temp[t] = _union_bytes(lv.lo[tm], lv.hi[tm])
    return total + lv.fixed_bytes, temp


def _attribute(lv: _Live, t: int) -> list[tuple[Value, int, tuple[int, int]]]:
    """Values live at ``t`` and the bytes each holds alone: a newer value owns the
    addresses it shares with an older one."""
    idx = np.nonzero((lv.start <= t) & (lv.end >= t))[0]
    order = sorted(idx, key=lambda i: (-int(lv.start[i]), -int(lv.hi[i] - lv.lo[i])))
    covered: list[tuple[int, int]] = []
    out = []
    for i in order:
        lo, hi = int(lv.lo[i]), int(lv.hi[i])
        own = hi - lo
        for c_lo, c_hi in covered:
            own -= max(0, min(hi, c_hi) - max(lo, c_lo))
        covered = _merge([*covered, (lo, hi)])
        if own > 0:
            out.append((lv.values[i], own, (int(lv.start[i]), int(lv.end[i]))))
    return out


def _merge(intervals: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _check_blocks(
    allocs: Mapping[int, Allocation],
    stats: Any,
    n_args: int,
    libtpu: TpuTemp | None,
    ba_file: str,
) -> tuple[int, int]:
    """The device and host temp blocks' bytes of a buffer assignment, each checked against the
    memory analysis ``stats`` (and the parameters against its ``n_args`` argument leaves).

    Raises:
      InspectError: a figure the dump and the memory analysis disagree on.
    """
    arg, temp = int(stats.argument_size_in_bytes), int(stats.temp_size_in_bytes)
    params = {a.parameter: a for a in allocs.values() if a.parameter is not None}
    param_total = sum(a.size for a in params.values() if a.color == DEVICE)
    if param_total != arg:
        raise InspectError(
            f"{ba_file}: parameter allocations hold {param_total} bytes but the memory "
            f"analysis says {arg} argument bytes"
        )
    if sorted(params) != list(range(n_args)):
        raise InspectError(
            f"{ba_file}: entry parameters {sorted(params)[:8]}... do not match the "
            f"{n_args} argument leaves that reach the program"
        )
    # An offload policy's residuals get a temp block of their own in host memory (another
    # color): the memory analysis counts it as host temp, not in ``temp``, and so does this.
    temp_blocks = sum(
        a.size for a in allocs.values() if "preallocated-temp" in a.kinds and a.color == DEVICE
    )
    host_blocks = sum(
        a.size for a in allocs.values() if "preallocated-temp" in a.kinds and a.color != DEVICE
    )
    if libtpu is not None:
        if libtpu.temp != temp:
            raise InspectError(
                f"{ba_file}: libtpu's rule gives {libtpu.temp} bytes of temp (the HBM temp "
                f"block's {libtpu.block} rounded up to {libtpu.align} plus "
                f"{libtpu.fragmentation} of fragmentation) but the memory analysis says {temp}"
            )
    elif temp_blocks and temp_blocks != temp:
        raise InspectError(
            f"{ba_file}: the preallocated temp block is {temp_blocks} bytes but the memory "
            f"analysis says {temp}"
        )
    host_temp = int(getattr(stats, "host_temp_size_in_bytes", host_blocks) or 0)
    if host_blocks != host_temp:
        raise InspectError(
            f"{ba_file}: the host-memory temp block is {host_blocks} bytes but the memory "
            f"analysis says {host_temp} host temp bytes"
        )

    return temp_blocks, host_blocks


def analyse(
    texts: Mapping[str, list[str]],
    dump: DumpFiles,
    stats: Any,
    arg_leaves: Sequence[ArgLeaf],
    tags: Mapping[tuple[str, ...], list[Tag]],
    target_name: str,
    *,
    series: bool = False,
    tpu: tuple[bytes, int] | None = None,
) -> PeakReport:
    """Reads a dump and attributes every byte of the peak.

    Args:
      texts: each dump file's lines, by path (``DumpFiles.read()``).
      dump: the dump's files.
      stats: the compiled program's ``memory_analysis()``.
      arg_leaves: the argument leaves that reach the program (``argument_leaves``).
      tags: the jaxpr's checkpoint tags (``tag_index``).
      target_name: the target's name, kept in the report.
      series: also count every category's live bytes at each position (the report's
        ``series``, what ``inspect --trace`` draws).
      tpu: for a libtpu program, its dumped ``HloProto`` and HBM alignment in bytes: the
        temp is checked against libtpu's rule (``peak._libtpu``), the HBM (color 0) and
        host (color 5) buffers are counted and VMEM's and SMEM's left out, and a temp block
        libtpu keeps out of HBM (tuple tables and loop counters alone) is left out too.

    Returns:
      The PeakReport (``compile_seconds``, ``parse_seconds`` and ``meta`` left empty
      for the caller to set).

    Raises:
      InspectError: a dump line cannot be read, or the dump disagrees with the memory
        analysis (parameter bytes, temp block, live bytes over the peak).

    Example:
      >>> from remat_kit.peak._classify import argument_leaves
      >>> from remat_kit.peak._dump import compile_with_dump
      >>> x = jax.ShapeDtypeStruct((8, 8), jnp.float32)
      >>> compiled, dump, texts = compile_with_dump(jax.jit(lambda a: a @ a).lower(x))
      >>> leaves = argument_leaves([[x]], [0], {0: "input"})
      >>> r = analyse(texts, dump, compiled.memory_analysis(), leaves, {}, "cpu")
      >>> r.peak_bytes, r.by_category["input"], r.by_category["other temporaries"]
      (512, 256, 256)
    """
    allocs, values = parse_buffer_assignment(dump.buffer_assignment, texts[dump.buffer_assignment])
    libtpu = None
    if tpu is not None:
        allocs, values, libtpu = _on_tpu(allocs, values, *tpu)
    live = parse_live_range(dump.live_range, texts[dump.live_range])
    hlo = parse_hlo(dump.hlo, texts[dump.hlo])
    ba_file = os.path.basename(dump.buffer_assignment)

    arg = int(stats.argument_size_in_bytes)
    out = int(stats.output_size_in_bytes)
    temp = int(stats.temp_size_in_bytes)
    alias = int(stats.alias_size_in_bytes)
    peak_bytes = arg + out + temp - alias
    xla_peak = xla_peak_of(stats)

    temp_blocks, host_blocks = _check_blocks(allocs, stats, len(arg_leaves), libtpu, ba_file)

    n = len(live.sequence)
    phases = phases_of(live.sequence, hlo)
    first_backward = next((p.start for p in phases if p.name == "backward"), None)
    lv = _live_values(values, allocs, live, n)
    lr_file = os.path.basename(dump.live_range)
    timeline, pos, live_peak = _live_peak(lv, n, temp if temp_blocks else None, peak_bytes, lr_file)

    ctx = _Context(
        allocs,
        arg_leaves,
        hlo,
        tags,
        tuple(phases),
        first_backward,
        live,
        _layers_by_shape(hlo, arg_leaves),
        _carried(hlo),
    )
    buffers = _buffers_at(lv, pos, live_peak, allocs, ctx, lr_file)
    by_category, by_layer = _sums(buffers, peak_bytes - live_peak)

    at = live.sequence[pos]
    instr = hlo.instructions.get(at)
    kept_series = _series(values, allocs, live, lv, ctx, texts[dump.hlo]) if series else None
    parts = os.path.basename(dump.hlo).split(".")
    return PeakReport(
        target=target_name,
        peak_bytes=peak_bytes,
        live_peak_bytes=live_peak,
        fragmentation_bytes=peak_bytes - live_peak,
        peak_position=pos,
        peak_instruction=at,
        peak_op_name=instr.op_name if instr else "",
        peak_phase=phase_at(phases, pos),
        schedule_length=n,
        argument_bytes=arg,
        output_bytes=out,
        temp_bytes=temp,
        alias_bytes=alias,
        xla_peak_bytes=xla_peak,
        xla_live_peak_bytes=live.xla_peak[1] if live.xla_peak else None,
        buffers=tuple(buffers),
        by_category=by_category,
        by_layer=by_layer,
        timeline=tuple(int(x) for x in timeline),
        phases=tuple(phases),
        module=parts[1] if len(parts) > 2 else "",
        jax_version=jax.__version__,
        compile_seconds=0.0,
        parse_seconds=0.0,
        host_temp_bytes=host_blocks,
        series=kept_series,
    )


def _live_peak(
    lv: _Live, n: int, temp: int | None, peak_bytes: int, lr_file: str
) -> tuple[np.ndarray, int, int]:
    """The bytes live at each of the ``n`` positions, the peak's position and its bytes,
    checked: no more temp live than the temp block's ``temp`` bytes (None: no block), no
    more live than the program's ``peak_bytes``.

    Raises:
      InspectError: the live ranges hold more than the memory analysis allows.
    """
    timeline, temp_live = _timeline(lv, n)
    if temp is not None and int(temp_live.max()) > temp:
        worst = int(temp_live.argmax())
        raise InspectError(
            f"{lr_file}: {int(temp_live.max())} temp bytes live at "
            f"position {worst}, more than the {temp}-byte temp block: the live ranges were "
            "not read as XLA meant them"
        )
    pos = int(timeline.argmax())
    live_peak = int(timeline[pos])
    if live_peak > peak_bytes:
        raise InspectError(
            f"{lr_file}: {live_peak} bytes live at position {pos}, "
            f"more than the program's {peak_bytes} (argument + output + temp - alias)"
        )

    return timeline, pos, live_peak


def _buffers_at(
    lv: _Live, pos: int, live_peak: int, allocs: Mapping[int, Allocation], ctx: _Context,
    lr_file: str,
) -> list[PeakBuffer]:  # fmt: skip
    """The buffers live at position ``pos`` (the parameters included), largest first,
    checked to hold the ``live_peak`` bytes counted there.

    Raises:
      InspectError: they do not.
    """
    buffers = [_describe(v, size, span, ctx) for v, size, span in _attribute(lv, pos)]
    buffers += [
        _parameter_buffer(a, ctx)
        for a in allocs.values()
        if a.parameter is not None and a.color == DEVICE
    ]
    buffers = [b for b in buffers if b.size_bytes > 0]
    buffers.sort(key=lambda b: (-b.size_bytes, b.name))
    if sum(b.size_bytes for b in buffers) != live_peak:
        raise InspectError(
            f"{lr_file}: the buffers live at position {pos} hold "
            f"{sum(b.size_bytes for b in buffers)} bytes, not the {live_peak} counted there"
        )

    return buffers


def _sums(
    buffers: Sequence[PeakBuffer], fragmentation: int
) -> tuple[dict[str, int], dict[str, int]]:
    """The live bytes by category (every category named) and by layer (largest first), each
    with the ``fragmentation`` the peak holds besides them."""
    by_category = dict.fromkeys(CATEGORIES, 0)
    by_layer: dict[str, int] = {}
    for b in buffers:
        by_category[b.category] += b.size_bytes
        by_layer[b.layer] = by_layer.get(b.layer, 0) + b.size_bytes
    by_category[FRAGMENTATION] = fragmentation
    by_layer = dict(sorted(by_layer.items(), key=lambda kv: -kv[1]))
    by_layer[FRAGMENTATION] = fragmentation
    return by_category, by_layer


def _on_tpu(
    allocs: Mapping[int, Allocation], values: Sequence[Value], proto: bytes, align: int
) -> tuple[dict[int, Allocation], list[Value], TpuTemp]:
    """A libtpu dump's HBM and host allocations and values, and libtpu's temp."""
    shapes: dict[str, str] = {}
    for v in values:
        if allocs[v.allocation].color == DEVICE:
            shapes.setdefault(v.instruction, v.shape_text)
    libtpu = tpu_temp(proto, shapes, align)
    kept = {i: a for i, a in allocs.items() if a.color in (DEVICE, TPU_HOST)}
    if not libtpu.counted:  # tuple tables and loop counters: libtpu keeps them out of HBM
        kept = {
            i: a
            for i, a in kept.items()
            if not ("preallocated-temp" in a.kinds and a.color == DEVICE)
        }
    return kept, [v for v in values if v.allocation in kept], libtpu


def _series(
    values: Sequence[Value],
    allocs: Mapping[int, Allocation],
    live: LiveRanges,
    lv: _Live,
    ctx: _Context,
    hlo_lines: Sequence[str],
) -> LiveSeries:
    # Every buffer in its category by the rules the peak's buffers follow; the host-memory
    # ones (left out of ``lv``) as well, counted apart.
    category_of = {
        v.name: _describe(v, v.size, (int(s), int(e)), ctx).category
        for v, s, e in zip(lv.values, lv.start, lv.end, strict=True)
    }
    n = len(live.sequence)
    for v in values:
        a = allocs[v.allocation]
        if a.color == DEVICE or a.parameter is not None or v.size == 0:
            continue
        if v.name in live.ranges and a.kinds.isdisjoint({"thread-local", "constant"}):
            s, e = live.ranges[v.name]
            category_of[v.name] = _describe(v, v.size, (max(s, 0), min(e, n - 1)), ctx).category
    arguments: dict[str, int] = {}
    for a in allocs.values():
        if a.parameter is not None and a.color == DEVICE:
            cat = _parameter_buffer(a, ctx).category
            arguments[cat] = arguments.get(cat, 0) + a.size
    return live_series(values, allocs, live, category_of, arguments, "\n".join(hlo_lines))
