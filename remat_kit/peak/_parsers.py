"""Readers of XLA's dump text: buffer assignment, live ranges and the optimized HLO.

- ``*after_optimizations-buffer-assignment.txt``: every allocation (parameter,
  output, preallocated temp) and the HLO values placed in it, with size and offset;
- ``*after_optimizations-live-range.txt``: the schedule (``InstructionSequence``) and
  each value's live range in it (``BufferLiveRange``);
- ``*after_optimizations.txt``: the optimized HLO, whose op metadata (``op_name``)
  holds the jax name stack: the Flax module path, ``jvp(...)`` for the forward pass,
  ``transpose(...)`` for the backward pass and ``rematted_computation`` for
  recomputed ops.

The dump files are XLA debug output and change between versions (this was written
against jax 0.10.2 and 0.12.0.1). Every line of the sections read is parsed strictly;
a line that cannot be read raises :class:`InspectError` naming the file and line.

Example:
  >>> ranges = parse_live_range("x-live-range.txt", [
  ...     "HloLiveRange (max 1):", "  InstructionSequence:", "    0:p.1",
  ...     "  BufferLiveRange:", "    p.1{}:0-1"])
  >>> ranges.sequence, ranges.ranges["p.1{}"]
  (('p.1',), (0, 1))
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Mapping, Sequence

import jax
import numpy as np

from remat_kit.errors import InspectError
from remat_kit.xla import HloInstruction, named_operands, read_hlo

__all__ = [
    "Allocation",
    "Hlo",
    "Instr",
    "LiveRanges",
    "Value",
    "parse_buffer_assignment",
    "parse_hlo",
    "parse_live_range",
    "xla_dtype",
]


def xla_dtype(dtype: np.dtype) -> str:
    """How XLA's text writes a numpy dtype, e.g. ``bf16``, ``f32``, ``s32``, ``pred``.

    Example:
      >>> xla_dtype(np.dtype("int8"))
      's8'
    """
    name = dtype.name
    table = {
        "bfloat16": "bf16",
        "float16": "f16",
        "float32": "f32",
        "float64": "f64",
        "bool": "pred",
        "complex64": "c64",
        "complex128": "c128",
    }
    if name in table:
        return table[name]
    m = re.match(r"(u?)int(\d+)$", name)
    if m:
        return f"{'u' if m.group(1) else 's'}{m.group(2)}"
    return name


def _fail(path: str, lineno: int, line: str, what: str) -> InspectError:
    shown = line if len(line) <= 160 else line[:157] + "..."
    return InspectError(
        f"{os.path.basename(path)}:{lineno}: cannot read {what} (jax {jax.__version__}); "
        f"the line is: {shown!r}"
    )


@dataclasses.dataclass(frozen=True)
class Allocation:
    """One allocation of the buffer assignment: a parameter, an output, a temp block..."""

    index: int
    size: int
    parameter: int | None
    kinds: frozenset[str]
    #: XLA's memory space ("color"): 0 is device memory; an offloaded buffer sits in
    #: another (pinned host memory is color 5 on GPU).
    color: int = 0


@dataclasses.dataclass(frozen=True)
class Value:
    """One HLO value placed in an allocation, at ``offset`` within it."""

    name: str  # instruction{index}
    instruction: str
    allocation: int
    size: int
    offset: int
    shape_text: str


_ALLOC = re.compile(r"^allocation (\d+): size (\d+)(?:, (.*))?:\s*$")
_VALUE = re.compile(
    r"^ value: <\d+ ([^\s{}<>]+)(\{[\d,]*\})?(?: \(phi\))? @\d+> "
    r"\(size=(\d+),offset=(\d+)\): (.*)$"
)
_ALLOC_KINDS = ("thread-local", "constant", "preallocated-temp", "maybe-live-out", "output")


def parse_buffer_assignment(
    path: str, lines: Sequence[str]
) -> tuple[dict[int, Allocation], list[Value]]:
    """Reads the allocations and values of a ``*-buffer-assignment.txt`` dump.

    Args:
      path: the file's path (named in errors).
      lines: its lines.

    Returns:
      Allocations by index, and every value in file order.

    Raises:
      InspectError: a line cannot be read (the message names file and line), or there
        are no allocations.

    Example:
      >>> allocs, values = parse_buffer_assignment("x-buffer-assignment.txt", [
      ...     "BufferAssignment:", "allocation 0: size 16, parameter 0:",
      ...     " value: <0 p.1 @0> (size=16,offset=0): f32[4]{0}"])
      >>> allocs[0].parameter, values[0].name
      (0, 'p.1{}')
    """
    allocs: dict[int, Allocation] = {}
    values: list[Value] = []
    current: int | None = None
    started = False
    for lineno, line in enumerate(lines, 1):
        if not started:
            if line.strip() == "BufferAssignment:":
                started = True
                continue
            if line.strip():
                raise _fail(path, lineno, line, "the 'BufferAssignment:' header")
            continue
        if not line.strip():
            continue
        if line.startswith("allocation "):
            m = _ALLOC.match(line)
            if not m:
                raise _fail(path, lineno, line, "an allocation header")
            attrs = m.group(3) or ""
            param = re.search(r"(?:^|, )parameter (\d+)", attrs)
            color = re.search(r"(?:^|, )color (\d+)", attrs)
            kinds = frozenset(k for k in _ALLOC_KINDS if k in attrs)
            current = int(m.group(1))
            allocs[current] = Allocation(
                current,
                int(m.group(2)),
                int(param.group(1)) if param else None,
                kinds,
                int(color.group(1)) if color else 0,
            )
            continue
        if line.startswith(" value:"):
            m = _VALUE.match(line)
            if not m or current is None:
                raise _fail(path, lineno, line, "a value line")
            instr, index = m.group(1), m.group(2) or "{}"
            values.append(
                Value(instr + index, instr, current, int(m.group(3)), int(m.group(4)), m.group(5))
            )
            continue
        # Anything after the allocations (newer XLAs may add sections) ends the list.
        if not line.startswith(" "):
            break
        raise _fail(path, lineno, line, "a buffer-assignment line")
    if not allocs:
        raise InspectError(f"{os.path.basename(path)}: no allocations found")
    return allocs, values


@dataclasses.dataclass(frozen=True)
class LiveRanges:
    """The schedule and each value's (first, last) position in it."""

    sequence: tuple[str, ...]
    ranges: Mapping[str, tuple[int, int]]
    xla_peak: tuple[int, int] | None  # (position, bytes)


_SEQ = re.compile(r"^\s+(\d+):(\S+)\s*$")
_RANGE = re.compile(r"^\s+(\S+?\{[\d,]*\}):(\d+)-(\d+)\s*$")
_PEAK_HEAD = re.compile(r"^\s+Live ranges at (\d+) \(peak\):\s*$")
_PEAK_LINE = re.compile(r"^\s+\S+: (\d+) bytes \(cumulative: (\d+) bytes\)\s*$")


def parse_live_range(path: str, lines: Sequence[str]) -> LiveRanges:
    """Reads the schedule, the live ranges and XLA's peak of a ``*-live-range.txt`` dump.

    Args:
      path: the file's path (named in errors).
      lines: its lines.

    Returns:
      The LiveRanges.

    Raises:
      InspectError: a line cannot be read (the message names file and line), or the
        schedule or the ranges are missing.

    Example:
      >>> lines = ["HloLiveRange (max 1):", "  InstructionSequence:", "    0:p.1",
      ...          "  BufferLiveRange:", "    p.1{}:0-1"]
      >>> parse_live_range("x-live-range.txt", lines).sequence
      ('p.1',)
    """
    sequence: list[str] = []
    ranges: dict[str, tuple[int, int]] = {}
    section = None
    peak_at, peak_bytes = None, None
    header = False
    for lineno, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped:
            continue
        if not header:
            if not stripped.startswith("HloLiveRange"):
                raise _fail(path, lineno, line, "the 'HloLiveRange' header")
            header = True
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent <= 2:
            m = _PEAK_HEAD.match(line)
            if stripped == "InstructionSequence:":
                section = "sequence"
            elif stripped == "BufferLiveRange:":
                section = "ranges"
            elif m:
                section, peak_at = "peak", int(m.group(1))
            else:
                section = "other"  # e.g. "Stack trace breakdown ...": not needed
            continue
        if section == "sequence":
            m = _SEQ.match(line)
            if not m or int(m.group(1)) != len(sequence):
                raise _fail(path, lineno, line, "an InstructionSequence entry")
            sequence.append(m.group(2))
        elif section == "ranges":
            m = _RANGE.match(line)
            if not m:
                raise _fail(path, lineno, line, "a BufferLiveRange entry")
            ranges[m.group(1)] = (int(m.group(2)), int(m.group(3)))
        elif section == "peak":
            m = _PEAK_LINE.match(line)
            if not m:
                raise _fail(path, lineno, line, "a peak live-range entry")
            peak_bytes = int(m.group(2))
    if not sequence or not ranges:
        raise InspectError(
            f"{os.path.basename(path)}: no InstructionSequence or BufferLiveRange section"
        )
    peak = (peak_at, peak_bytes) if peak_at is not None and peak_bytes is not None else None
    return LiveRanges(tuple(sequence), ranges, peak)


@dataclasses.dataclass(frozen=True)
class Instr:
    """One HLO instruction, with what attribution needs of its attributes."""

    name: str
    computation: str
    opcode: str
    operands: tuple[str, ...]
    op_name: str
    body: str | None
    calls: str | None
    index: int | None
    #: A ``slice``'s window, ``((start, limit), ...)`` per dimension; None for other ops.
    window: tuple[tuple[int, int], ...] | None = None


@dataclasses.dataclass(frozen=True)
class Hlo:
    """The optimized HLO module: instructions by name and how computations nest."""

    instructions: Mapping[str, Instr]
    roots: Mapping[str, str]  # computation -> root instruction
    computations: Mapping[str, tuple[str, ...]]  # computation -> its instructions
    entry: str | None
    loops: Mapping[str, str]  # while body computation -> the while instruction
    callers: Mapping[str, str]  # fused/async computation -> the instruction calling it


_OPNAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_SLICE = re.compile(r"\bslice=\{((?:\[[\d:]+\],?\s*)*)\}")


def parse_hlo(path: str, lines: Sequence[str]) -> Hlo:
    """Reads the instructions of an optimized HLO text dump (through
    :func:`remat_kit.xla.read_hlo`, strictly).

    Args:
      path: the file's path (named in errors).
      lines: its lines.

    Returns:
      The Hlo.

    Raises:
      InspectError: an instruction line cannot be read (the message names file and
        line), or there is none.

    Example:
      >>> h = parse_hlo("x.txt", ["ENTRY %main (p: f32[4]) -> f32[4] {",
      ...     '  ROOT %p.1 = f32[4]{0} parameter(0), metadata={op_name="w"}', "}"])
      >>> h.entry, h.instructions["p.1"].op_name
      ('main', 'w')
    """
    module = read_hlo(lines, fail=functools.partial(_fail, path))
    instrs: dict[str, Instr] = {}
    roots: dict[str, str] = {}
    for comp, body in module.computations.items():
        for i in body:
            instrs[i.name] = _instr(i)
            if i.is_root:
                roots[comp] = i.name
    if not instrs:
        raise InspectError(f"{os.path.basename(path)}: no HLO instructions found")
    loops = {i.body: i.name for i in instrs.values() if i.opcode == "while" and i.body}
    callers = {i.calls: i.name for i in instrs.values() if i.calls}
    comps = {c: tuple(i.name for i in body) for c, body in module.computations.items()}
    return Hlo(instrs, roots, comps, module.entry, loops, callers)


def _instr(i: HloInstruction) -> Instr:
    """What attribution reads of an instruction, from its attributes."""
    op_name = _OPNAME.search(i.attrs)
    body = re.search(r"\bbody=%?([^\s,}]+)", i.attrs)
    calls = re.search(r"\bcalls=%?([^\s,}]+)", i.attrs)
    index = re.search(r"\bindex=(\d+)", i.attrs)
    window = _SLICE.search(i.attrs) if i.opcode == "slice" else None
    return Instr(
        i.name,
        i.computation,
        i.opcode,
        # Optimized HLO names every operand with a %: a bare word is a literal.
        named_operands(i.operand_text),
        op_name.group(1).replace("\\'", "'").replace('\\"', '"') if op_name else "",
        body.group(1) if body else None,
        calls.group(1) if calls else None,
        # A parameter's number, else (get-tuple-element) the element's.
        i.index if i.index is not None else int(index.group(1)) if index else None,
        tuple((int(a), int(b)) for a, b in re.findall(r"\[(\d+):(\d+)(?::\d+)?\]", window[1]))
        if window
        else None,
    )
