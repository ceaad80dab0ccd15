"""libtpu's temp, read from the buffer assignment in the dumped ``HloProto`` (issue 62).

libtpu's memory analysis does not give the HBM temp block of its buffer assignment as temp: it
gives that block rounded up to the program's HBM alignment plus the block's fragmentation, the
rounded block less the most bytes live in it at once. The most bytes live are the peak of the
block's heap-simulator trace (the buffers XLA's heap simulator placed, replayed in order:
``ALLOC`` adds a buffer, ``FREE`` takes it away, a buffer that shares another's space counts
nothing) plus the buffers placed outside the simulation (the tuple tables of async ops, loops
and multi-output fusions, held for the whole program), once per offset. A block whose trace
holds nothing but a loop's scalar counters, or that has no trace (tuple tables alone), is 0
bytes of temp: libtpu keeps those out of HBM. Measured with libtpu 0.0.50.1 on v4, v5e, v5p and
v6e, at 1, 4 and 16 KiB alignments (``tests/test_tpu_inspect.py``, docs/guides/tpu.md).

Example:
  >>> align_bytes({"LIBTPU_INIT_ARGS": "--xla_jf_program_hbm_alignment_in_kib=4"})
  4096
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping

__all__ = [
    "TpuTemp",
    "align_bytes",
    "tpu_temp",
]

#: libtpu's default HBM alignment of a program's buffers (``xla_jf_program_hbm_alignment_in_kib``).
DEFAULT_ALIGN_KIB = 16
_ALIGN_FLAG = re.compile(r"--xla_jf_program_hbm_alignment_in_kib=(\d+)")
#: A loop counter's or condition's shape: what libtpu keeps out of HBM.
_COUNTER = re.compile(r"^(?:s32|u32|pred)\[\]")


@dataclasses.dataclass(frozen=True)
class TpuTemp:
    """libtpu's temp for one program, and the parts it is made of.

    Example:
      >>> t = TpuTemp(block=16896, align=16384, traced_peak=16384, untraced=512)
      >>> t.rounded_block, t.fragmentation, t.temp
      (32768, 15872, 48640)
    """

    block: int  #: the HBM (color 0) preallocated temp blocks of the dump, summed
    align: int  #: the program's HBM alignment in bytes
    traced_peak: int  #: most bytes live at once in the blocks' heap-simulator traces
    untraced: int  #: bytes of the buffers placed outside the traces, once per offset
    counted: bool = True  #: False where the blocks hold only tuple tables and loop counters

    @property
    def rounded_block(self) -> int:
        return -(-self.block // self.align) * self.align if self.counted else 0

    @property
    def fragmentation(self) -> int:
        if not self.counted:
            return 0
        return self.rounded_block - self.traced_peak - self.untraced

    @property
    def temp(self) -> int:
        return self.rounded_block + self.fragmentation


def align_bytes(environ: Mapping[str, str]) -> int:
    """The HBM alignment libtpu gives a program's buffers, in bytes: the
    ``xla_jf_program_hbm_alignment_in_kib`` of ``LIBTPU_INIT_ARGS`` (the last one), else 16 KiB.
    """
    found = _ALIGN_FLAG.findall(environ.get("LIBTPU_INIT_ARGS", ""))
    return int(found[-1] if found else DEFAULT_ALIGN_KIB) * 1024


def tpu_temp(proto: bytes, shapes: Mapping[str, str], align: int) -> TpuTemp:
    """libtpu's temp from a serialized ``xla.HloProto`` with its buffer assignment.

    Args:
      proto: the optimized module's ``HloProto`` as dumped (``xla_dump_hlo_as_proto``).
      shapes: each HBM temp value's shape text by instruction name (the text dump's).
      align: the program's HBM alignment in bytes (:func:`align_bytes`).

    Returns:
      The TpuTemp.
    """
    ba = _message(_first(proto, 3))
    sizes = {}
    for raw in ba.get(1, []):
        lb = _message(raw)
        sizes[_one(lb, 1)] = _one(lb, 2)
    blocks = {}
    for raw in ba.get(3, []):
        a = _message(raw)
        if _one(a, 8) != 0 or any(_one(a, f) for f in (3, 5, 7, 12)):
            continue  # another memory space, or thread-local, a parameter, an output, a constant
        assigned = [_message(x) for x in a.get(9, [])]
        blocks[_one(a, 1)] = [(_one(x, 1), _one(x, 2), _one(x, 3)) for x in assigned]
    owner = {lb: idx for idx, assigned in blocks.items() for lb, _, _ in assigned}
    block = 0
    for raw in ba.get(3, []):
        a = _message(raw)
        if _one(a, 1) in blocks:
            block += _one(a, 2)
    traced_peak = untraced = 0
    counters_only = True
    traced_blocks = set()
    for raw in ba.get(4, []):
        events = [_message(e) for e in _message(raw).get(1, [])]
        ids = {_one(e, 2) for e in events}
        if not events or not ids <= set(owner):
            continue
        traced_blocks |= {owner[i] for i in ids}
        shared = {_one(e, 2) for e in events if _one(e, 1) == 2}
        live = peak = 0
        for e in events:
            buffer, kind = _one(e, 2), _one(e, 1)
            if buffer in shared:
                continue
            if kind == 0:
                live += sizes[buffer]
                name = _text(e, 4)
                counters_only &= bool(_COUNTER.match(shapes.get(name, "")))
            elif kind == 1:
                live -= sizes[buffer]
            peak = max(peak, live)
        traced_peak += peak
        by_offset: dict[int, int] = {}
        for idx in {owner[i] for i in ids}:
            for lb, offset, size in blocks[idx]:
                if lb not in ids:
                    by_offset[offset] = max(by_offset.get(offset, 0), size)
        untraced += sum(by_offset.values())
    counted = bool(traced_blocks) and not counters_only
    return TpuTemp(block, align, traced_peak, untraced, counted)


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """A protobuf message's (field, value) pairs: varints as ints, the rest as bytes."""
    i, n = 0, len(data)
    while i < n:
        key, i = _varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
            yield field, value
        elif wire == 2:
            length, i = _varint(data, i)
            yield field, data[i : i + length]
            i += length
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            yield field, data[i : i + width]
            i += width
        else:
            raise ValueError(f"protobuf wire type {wire} at byte {i}")


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _message(data: bytes) -> dict[int, list]:
    out: dict[int, list] = {}
    for field, value in _fields(data):
        out.setdefault(field, []).append(value)
    return out


def _first(data: bytes, field: int) -> bytes:
    for f, value in _fields(data):
        if f == field:
            return value
    raise ValueError(f"no field {field} in the HloProto: no buffer assignment dumped")


def _one(message: Mapping[int, list], field: int) -> int:
    return message.get(field, [0])[0]


def _text(message: Mapping[int, list], field: int) -> str:
    value = message.get(field, [b""])[0]
    return value.decode() if isinstance(value, bytes) else ""
