"""What one launch moves: the bytes it reads and writes in device memory and across the host
link, counted at its boundary.

Two corrections matter for scanned layers: an operand the fusion only slices (``dynamic-slice``
of a stacked weight) costs the slice, not the stack; a fusion whose root updates a buffer in
place (``dynamic-update-slice``) writes the update, not the buffer. Bytes in pinned host memory
(layout memory space ``S(5)``) cross the host link, not device memory.

Example:
  >>> from remat_kit.xla import read_hlo
  >>> m = read_hlo(["ENTRY %e (p: f32[8]) -> f32[8] {", "  %p = f32[8]{0} parameter(0)",
  ...     "  ROOT %n = f32[8]{0} negate(%p)", "}"])
  >>> _io_bytes(m, m.computations["e"][1], None)  # read 32 bytes, write 32: (device, host)
  (64, 0)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from remat_kit.xla._hlo import HloInstruction, HloModule, _nbytes, _output_shape
from remat_kit.xla._opcodes import _SLICING


def _io_bytes(
    module: HloModule, instr: HloInstruction, body: Iterable[HloInstruction] | None
) -> tuple[int, int]:
    """(device, host) bytes a launch reads and writes, counted at its boundary."""
    body = tuple(body or ())
    out_shape = _output_shape(instr)
    by_index = {i.index: i.name for i in body if i.opcode == "parameter" and i.index is not None}
    users = _users(body)
    updated = _updated_in_place(body)
    dev = host = 0
    for i, operand in enumerate(instr.operands):
        d, h = _nbytes(module.shapes.get(operand, ""))
        pname = by_index.get(i)
        if pname is not None and pname in updated:
            continue  # the buffer updated in place: only the update moves (counted below)
        sliced = _sliced_read(pname, users) if pname is not None else None
        if sliced is None:
            dev, host = dev + d, host + h
        elif h and not d:  # a slice of a buffer in host memory crosses the host link
            host += sliced
        else:
            dev += sliced
    if not updated:
        d, h = _nbytes(out_shape)
        return dev + d, host + h
    for update, on_host in updated.values():
        if on_host:
            host += update
        else:
            dev += update
    # other outputs (tuple leaves besides the updated buffers) are written in full
    out_d, out_h = _nbytes(out_shape)
    by_name = {i.name: i for i in body}
    full_d = sum(_nbytes(by_name[p].shape)[0] for p in updated if p in by_name)
    full_h = sum(_nbytes(by_name[p].shape)[1] for p in updated if p in by_name)
    return dev + max(0, out_d - full_d), host + max(0, out_h - full_h)


def _users(body: Sequence[HloInstruction]) -> dict[str, list[HloInstruction]]:
    out: dict[str, list[HloInstruction]] = {}
    for i in body:
        for o in i.operands:
            out.setdefault(o, []).append(i)
    return out


def _sliced_read(pname: str, users: Mapping[str, list[HloInstruction]]) -> int | None:
    """Bytes read of a parameter every user of which (through bitcasts) only slices it."""
    frontier = [pname]
    total = 0
    seen = False
    while frontier:
        name = frontier.pop()
        for u in users.get(name, ()):
            seen = True
            if u.opcode == "bitcast":
                frontier.append(u.name)
            elif u.opcode in _SLICING and u.operands and u.operands[0] == name:
                d, h = _nbytes(u.shape)
                total += d + h
            else:
                return None
    return total if seen else None


def _updated_in_place(body: Sequence[HloInstruction]) -> dict[str, tuple[int, bool]]:
    """Parameters the fusion's root updates in place -> (the update's bytes, buffer on host)."""
    if not body:
        return {}
    root = next((i for i in body if i.is_root), body[-1])
    by_name = {i.name: i for i in body}
    roots = (
        [by_name[o] for o in root.operands if o in by_name] if root.opcode == "tuple" else [root]
    )
    out = {}
    for r in roots:
        while r.opcode == "bitcast" and r.operands and r.operands[0] in by_name:
            r = by_name[r.operands[0]]
        if r.opcode != "dynamic-update-slice" or len(r.operands) < 2:
            continue
        buf = by_name.get(r.operands[0])
        while buf is not None and buf.opcode == "bitcast" and buf.operands:
            buf = by_name.get(buf.operands[0])
        if buf is not None and buf.opcode == "parameter":
            upd = by_name.get(r.operands[1])
            d, h = _nbytes(upd.shape) if upd is not None else (0, 0)
            out[buf.name] = (d + h, _nbytes(buf.shape)[1] > 0)
    return out
