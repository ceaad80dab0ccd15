"""Optimized HLO text, parsed just as far as costing its kernels needs: each computation's
instructions (name, shape text, opcode, operands, attributes), every instruction's shape, and
what a shape holds (its arrays, their bytes in device memory and in pinned host memory), and of
a loop, the threads XLA:CPU runs it on and whether an instruction of it transposes.

:mod:`remat_kit.xla._kernels` walks the parsed module and costs each launch.

Example:
  >>> _nbytes("(f32[2,3]{1,0}, bf16[4]{0:S(5)})")  # (device bytes, pinned host bytes)
  (24, 8)
  >>> _tuple_elements("(f32[2]{0}, (s32[], u8[4]{0}))")
  ['f32[2]{0}', '(s32[], u8[4]{0})']
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from typing import Any

# Bytes per element of each HLO element type (where it is read, an unknown one counts 4).
_DTYPE_BYTES = {
    "pred": 1,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "f8e4m3": 1,
    "f8e4m3b11fnuz": 1,
    "f8e5m2fnuz": 1,
    "f8e4m3fnuz": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "token": 0,
}


@dataclasses.dataclass(frozen=True)
class _Instr:
    name: str
    shape: str
    opcode: str
    operands: tuple[str, ...]
    attrs: str
    is_root: bool
    index: int | None = None  # a parameter's number


@dataclasses.dataclass(frozen=True)
class _Module:
    entry: str | None
    computations: Mapping[str, tuple[_Instr, ...]]
    shapes: Mapping[str, str]  # instruction -> its shape text (names are module-unique)


_COMP = re.compile(r"^(ENTRY\s+)?%?([^\s(]+)\s.*\{\s*$")
_INSTR = re.compile(r"^\s+(ROOT\s+)?%?([^\s=]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"\s*([a-z][\w\-]*)\(")


def _parse(text: str) -> _Module:
    comps: dict[str, list[_Instr]] = {}
    shapes: dict[str, str] = {}
    entry = None
    current: list[_Instr] | None = None
    for line in text.splitlines():
        if not line.strip() or line.startswith(("HloModule", "//")):
            continue
        if not line.startswith(" "):
            m = _COMP.match(line)
            if m:
                current = comps.setdefault(m.group(2), [])
                if m.group(1):
                    entry = m.group(2)
            elif line.strip() == "}":
                current = None
            continue
        if current is None:
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        rest = m.group(3)
        cut = _closing(rest, 0) + 1 if rest.startswith("(") else rest.find(" ")
        op = _OPCODE.match(rest, cut) if cut > 0 else None
        if op is None:
            continue
        end = _closing(rest, op.end() - 1)
        inside = rest[op.end() : end].strip()
        instr = _Instr(
            name=m.group(2),
            shape=rest[:cut].strip(),
            opcode=op.group(1),
            operands=_operands(rest[op.end() : end]),
            attrs=rest[end + 1 :],
            is_root=bool(m.group(1)),
            index=int(inside) if op.group(1) == "parameter" and inside.isdigit() else None,
        )
        current.append(instr)
        shapes[instr.name] = instr.shape
    return _Module(entry, {k: tuple(v) for k, v in comps.items()}, shapes)


def _operands(text: str) -> tuple[str, ...]:
    # Optimized HLO names operands with a leading %; the HLO of a lowered module (before
    # XLA's passes) prints bare names.
    named = re.findall(r"%([^\s,()]+)", text)
    if named or "%" in text:
        return tuple(named)
    return tuple(p.strip() for p in text.split(",") if re.fullmatch(r"[\w.\-]+", p.strip()))


def _closing(text: str, start: int) -> int:
    depth = 0
    for j in range(start, len(text)):
        c = text[j]
        if c in "({":
            depth += 1
        elif c in ")}":
            depth -= 1
            if depth == 0:
                return j
    return len(text)


_ARRAY = re.compile(r"([a-z]\w*)\[([\d,]*)\](\{[^}]*\})?")


def _arrays(shape: str) -> list[tuple[str, tuple[int, ...], bool]]:
    """(dtype, dims, on host) of each array in a shape (a tuple's leaves in order)."""
    out = []
    for m in _ARRAY.finditer(shape):
        dims = tuple(int(d) for d in m.group(2).split(",") if d)
        out.append((m.group(1), dims, "S(5)" in (m.group(3) or "")))
    return out


def _nbytes(shape: str) -> tuple[int, int]:
    """(device bytes, host bytes) of a shape."""
    dev = host = 0
    for dtype, dims, on_host in _arrays(shape):
        size = int(math.prod(dims) * _DTYPE_BYTES.get(dtype, 4))
        if on_host:
            host += size
        else:
            dev += size
    return dev, host


def _attr(attrs: str, key: str) -> str | None:
    m = re.search(rf"\b{key}=%?([^\s,}}]+)", attrs)
    return m.group(1) if m else None


def _dims_attr(attrs: str, key: str) -> tuple[int, ...]:
    m = re.search(rf"\b{key}=\{{([\d,]*)\}}", attrs)
    return tuple(int(d) for d in m.group(1).split(",") if d) if m else ()


def _backend_config(attrs: str) -> dict[str, Any]:
    i = attrs.find("backend_config=")
    if i < 0:
        return {}
    start = attrs.find("{", i)
    if start < 0:
        return {}
    try:
        return json.loads(attrs[start : _closing(attrs, start) + 1])
    except ValueError:
        return {}


def _output_shape(instr: _Instr) -> str:
    # An async start's shape is ((operands...), output, context): only the output is written.
    if instr.opcode.endswith("-start") and instr.shape.startswith("("):
        parts = _tuple_elements(instr.shape)
        if len(parts) >= 2:
            return parts[1]
    return instr.shape


def _tuple_elements(shape: str) -> list[str]:
    """The top-level elements of a tuple shape's text."""
    inner = shape[1 : _closing(shape, 0)]
    out, depth, start = [], 0, 0
    for j, c in enumerate(inner):
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(inner[start:j].strip())
            start = j + 1
    out.append(inner[start:].strip())
    return [re.sub(r"^/\*index=\d+\*/", "", e) for e in out if e]


def _parts(attrs: str) -> int:
    # XLA:CPU's loop fusions name the threads they run on: ["2"] for two.
    parts = _backend_config(attrs).get("outer_dimension_partitions") or []
    return max(1, math.prod(int(p) for p in parts))


def _transposes(shapes: Mapping[str, str], instr: _Instr) -> bool:
    """Whether ``instr`` moves data across dimensions: a ``copy`` into another layout, or a
    ``transpose`` that is not a relabelling of its operand's layout (a bitcast)."""
    if instr.opcode not in ("copy", "transpose") or not instr.operands:
        return False
    out, src = _layout(instr.shape), _layout(shapes.get(instr.operands[0], ""))
    if out is None or src is None:
        return False
    if instr.opcode == "copy":
        return out != src
    perm = _dims_attr(instr.attrs, "dimensions")
    return len(perm) == len(out) and tuple(perm[d] for d in out) != src


def _layout(shape: str) -> tuple[int, ...] | None:
    m = _LAYOUT.search(shape)
    if m is None:
        return None
    return tuple(int(d) for d in m.group(1).split(",") if d)


_LAYOUT = re.compile(r"\[[\d,]*\]\{([\d,]*)[}:]")
