"""Optimized HLO text, read once for everything that reads it: each computation's instructions
(name, shape text, opcode, operands, attributes), every instruction's shape, and what a shape
holds (its arrays, their bytes in device memory and in pinned host memory), and of a loop, the
threads XLA:CPU runs it on and whether an instruction of it transposes.

:func:`read_hlo` is the one reader of the text (one instruction splitter, one bracket matcher,
one shape reader); :mod:`remat_kit.xla._kernels` walks what it returns (and
:mod:`remat_kit.xla._cost` costs each launch), and the peak inspector (:mod:`remat_kit.peak`)
reads XLA's dump through it, strictly.

Example:
  >>> module = read_hlo(["ENTRY %main (p: f32[4]) -> f32[4] {",
  ...     "  ROOT %p.1 = f32[4]{0} parameter(0)", "}"])
  >>> module.entry, module.computations["main"][0].index
  ('main', 0)
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
from collections.abc import Callable, Iterable, Mapping
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
class HloInstruction:
    """One instruction of an HLO computation, as its line writes it.

    Attributes:
      name: the instruction's name (module-unique), without its ``%``.
      shape: its shape's text (``f32[4,8]{1,0}``, or a parenthesised tuple).
      opcode: ``fusion``, ``dot``, ``parameter``...
      operands: the instructions it reads, by name (the ``%``-named ones; in text printed
        without ``%``, the bare names).
      attrs: the text after the operand list (``, kind=kLoop, calls=%c, metadata={...}``).
      is_root: the computation's ``ROOT``.
      index: a parameter's number (None for other instructions).
      computation: the computation it is in.
      operand_text: the text between the opcode's parentheses.
    """

    name: str
    shape: str
    opcode: str
    operands: tuple[str, ...]
    attrs: str
    is_root: bool
    index: int | None = None
    computation: str = ""
    operand_text: str = ""


@dataclasses.dataclass(frozen=True)
class HloModule:
    """An HLO module's computations, in the order of the text.

    Attributes:
      entry: the ``ENTRY`` computation's name (None when there is none).
      computations: each computation's instructions, in order.
      shapes: every instruction's shape text by its name (names are module-unique).
    """

    entry: str | None
    computations: Mapping[str, tuple[HloInstruction, ...]]
    shapes: Mapping[str, str]


_COMP = re.compile(r"^(ENTRY\s+)?%?([^\s(]+)\s.*\{\s*$")
# XLA's names never hold a %: one inside a name is a line this cannot read.
_INSTR = re.compile(r"^\s+(ROOT\s+)?%?([^\s=%]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"\s*([A-Za-z][\w\-]*)\(")


def read_hlo(
    lines: Iterable[str], *, fail: Callable[[int, str, str], Exception] | None = None
) -> HloModule:
    """Reads the computations and instructions of HLO text (``compiled.as_text()``, XLA's
    ``*after_optimizations.txt`` dump).

    Top-level lines other than a computation's header and its closing brace (``HloModule``,
    the dump's ``FileNames`` and ``StackFrames`` tables...) are passed over, and so are the
    indented lines outside a computation.

    Args:
      lines: the text's lines.
      fail: makes the error to raise for a line inside a computation that is not an
        instruction, from (line number from 1, the line, what it should have been); None:
        such a line is passed over.

    Returns:
      The HloModule.

    Raises:
      Exception: what ``fail`` makes, for the first line that cannot be read.

    Example:
      >>> m = read_hlo(["ENTRY %main (p: f32[4]) -> f32[4] {",
      ...     '  ROOT %n = f32[4]{0} negate(%p), metadata={op_name="f"}', "}"])
      >>> i = m.computations["main"][0]
      >>> i.opcode, i.operands, i.is_root, i.attrs
      ('negate', ('p',), True, ', metadata={op_name="f"}')
    """
    comps: dict[str, list[HloInstruction]] = {}
    shapes: dict[str, str] = {}
    entry = None
    comp: str | None = None
    numbered = enumerate(lines, 1)
    for lineno, line in numbered:
        if not line.strip() or line.startswith(("HloModule", "//")):
            continue
        if not line.startswith(" "):
            m = _COMP.match(line)
            if m:
                comp = m.group(2)
                comps.setdefault(comp, [])
                if m.group(1):
                    entry = comp
            elif line.strip() == "}":
                comp = None
            continue
        if comp is None:
            continue  # an indented line of a trailing table
        m = _INSTR.match(line)
        if not m:
            if fail is not None:
                raise fail(lineno, line, "an HLO instruction")
            continue
        rest = m.group(3)
        # An attribute may hold line breaks (a Pallas kernel's frontend_attributes carry its
        # xprof metadata as JSON text): the instruction goes on until its braces close.
        while _open_braces(rest) > 0:
            more = next(numbered, None)
            if more is None:
                break
            rest += "\n" + more[1]
        parts = _split_instruction(rest)
        if parts is None:
            if fail is not None:
                raise fail(lineno, line, "an HLO instruction's shape and opcode")
            continue
        instr = _instruction(m.group(2), bool(m.group(1)), comp, parts)
        comps[comp].append(instr)
        shapes[instr.name] = instr.shape
    return HloModule(entry, {k: tuple(v) for k, v in comps.items()}, shapes)


def _instruction(
    name: str, is_root: bool, comp: str, parts: tuple[str, str, str, str]
) -> HloInstruction:
    """The instruction ``name`` of computation ``comp`` from its line's split ``parts``."""
    shape, opcode, operand_text, attrs = parts
    inside = operand_text.strip()
    return HloInstruction(
        name=name,
        shape=shape,
        opcode=opcode,
        operands=_operands(operand_text),
        attrs=attrs,
        is_root=is_root,
        index=int(inside) if opcode == "parameter" and inside.isdigit() else None,
        computation=comp,
        operand_text=operand_text,
    )


def _split_instruction(rest: str) -> tuple[str, str, str, str] | None:
    """``"<shape> <opcode>(<operands>), attr=..."`` -> (shape, opcode, operands, attributes);
    None when it is not that. A tuple shape is parenthesised and may hold ``/*index=N*/``."""
    cut = _closing(rest, 0) + 1 if rest.startswith("(") else rest.find(" ")
    op = _OPCODE.match(rest, cut) if cut > 0 else None
    if op is None:
        return None
    end = _closing(rest, op.end() - 1)
    return rest[:cut].strip(), op.group(1), rest[op.end() : end], rest[end + 1 :]


def named_operands(text: str) -> tuple[str, ...]:
    """The ``%``-named operands of an operand list's text (optimized HLO names them so).

    Example:
      >>> named_operands("f32[4]{0} %p.1, %fusion.2"), named_operands("0")
      (('p.1', 'fusion.2'), ())
    """
    return tuple(_NAMED.findall(text))


_NAMED = re.compile(r"%([^\s,()]+)")


def _operands(text: str) -> tuple[str, ...]:
    # Optimized HLO names operands with a leading %; the HLO of a lowered module (before
    # XLA's passes) prints bare names.
    named = named_operands(text)
    if named or "%" in text:
        return named
    return tuple(p.strip() for p in text.split(",") if re.fullmatch(r"[\w.\-]+", p.strip()))


def _open_braces(text: str) -> int:
    """Braces ``{`` opened and not closed in ``text``, outside its double-quoted strings.

    Example:
      >>> _open_braces('f(%a), frontend_attributes={m={'), _open_braces('x={"}{"}')
      (2, 0)
    """
    depth, quoted, escaped = 0, False, False
    for c in text:
        if quoted:
            escaped, quoted = (False, True) if escaped else (c == "\\", c != '"')
        elif c == '"':
            quoted = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
    return depth


def _closing(text: str, start: int) -> int:
    """Index of the bracket closing the one at ``start`` (or the text's end); ``(`` and ``{``
    count alike."""
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


def shape_of(text: str) -> tuple[str, tuple[int, ...]]:
    """``"bf16[4,512]{1,0}"`` -> ``("bf16", (4, 512))``; a tuple shape -> ``("tuple", ())``.

    Example:
      >>> shape_of("bf16[4,512]{1,0}"), shape_of("(f32[2]{0}, s32[])"), shape_of("x")
      (('bf16', (4, 512)), ('tuple', ()), ('?', ()))
    """
    if text.startswith("("):
        return "tuple", ()
    m = _ARRAY.match(text)
    if not m:
        return "?", ()
    return m.group(1), _dims(m.group(2))


def _arrays(shape: str) -> list[tuple[str, tuple[int, ...], bool]]:
    """(dtype, dims, on host) of each array in a shape (a tuple's leaves in order)."""
    out = []
    for m in _ARRAY.finditer(shape):
        out.append((m.group(1), _dims(m.group(2)), "S(5)" in (m.group(3) or "")))
    return out


def _dims(text: str) -> tuple[int, ...]:
    return tuple(int(d) for d in text.split(",") if d)


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
    return _dims(m.group(1)) if m else ()


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


def _output_shape(instr: HloInstruction) -> str:
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


def _transposes(shapes: Mapping[str, str], instr: HloInstruction) -> bool:
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
    return _dims(m.group(1))


_LAYOUT = re.compile(r"\[[\d,]*\]\{([\d,]*)[}:]")
