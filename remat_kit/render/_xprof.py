"""A compiled program as an XProf profile: what ``xprof --logdir DIR`` opens in its Memory Viewer.

XProf reads a profile run's ``*.xplane.pb`` (an ``XSpace``, tsl's profiler proto). Its Memory
Viewer needs no trace at all, only the program: the plane named ``/host:metadata`` holds one
event metadata per module (id: the program id, name: ``module(program id)``) whose stat
``Hlo Proto`` is the serialized ``xla.HloProto`` with its buffer assignment, as jax's profiler
writes it on a GPU. That is what XLA dumps for our deviceless compile
(``xla_dump_hlo_as_proto``), so the profile is written without a GPU.

The few messages are encoded here by hand (protobuf's wire format), so that writing a profile
needs neither tsl's nor xprof's Python protos. Field numbers are tsl's
``tsl/profiler/protobuf/xplane.proto``: XSpace {planes 1, hostnames 4}; XPlane {id 1, name 2,
event_metadata 4 (map<int64, XEventMetadata>), stat_metadata 5 (map<int64, XStatMetadata>)};
XEventMetadata {id 1, name 2, display_name 4, stats 5}; XStatMetadata {id 1, name 2};
XStat {metadata_id 1, uint64_value 3, bytes_value 6}.

Example:
  >>> space = xspace([("jit_step", b"\\x0a\\x00")], host="remat-kit")
  >>> space[:1], b"/host:metadata" in space, b"Hlo Proto" in space
  (b'\\n', True, True)
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "METADATA_PLANE",
    "module_names",
    "xspace",
]

#: The plane XProf reads programs from.
METADATA_PLANE = "/host:metadata"
_HLO_PROTO, _PROGRAM_ID = 1, 2  # stat metadata ids


def module_names(modules: Sequence[str]) -> list[str]:
    """The name each module gets in XProf (``module(program id)``, ids from 1).

    Example:
      >>> module_names(["jit_step", "jit_step"])
      ['jit_step(1)', 'jit_step(2)']
    """
    return [f"{m}({i})" for i, m in enumerate(modules, 1)]


def xspace(programs: Sequence[tuple[str, bytes]], *, host: str) -> bytes:
    """A serialized XSpace holding each ``(module name, serialized xla.HloProto)``.

    Args:
      programs: the modules, program ids given in order from 1.
      host: the host name the profile names (and XProf shows).

    Returns:
      The bytes of the ``.xplane.pb`` file.
    """
    events = b""
    names = module_names([m for m, _ in programs])
    for pid, ((_, proto), name) in enumerate(zip(programs, names, strict=True), 1):
        stats = _bytes(5, _int(1, _HLO_PROTO) + _bytes(6, proto))
        stats += _bytes(5, _int(1, _PROGRAM_ID) + _int(3, pid))
        meta = _int(1, pid) + _bytes(2, name) + _bytes(4, name) + stats
        events += _bytes(4, _int(1, pid) + _bytes(2, meta))
    stat_meta = b"".join(
        _bytes(5, _int(1, i) + _bytes(2, _int(1, i) + _bytes(2, text)))
        for i, text in ((_HLO_PROTO, "Hlo Proto"), (_PROGRAM_ID, "program_id"))
    )
    plane = _int(1, 0) + _bytes(2, METADATA_PLANE) + events + stat_meta
    return _bytes(1, plane) + _bytes(4, host)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _bytes(field: int, value: bytes | str) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return _varint(field << 3 | 2) + _varint(len(data)) + data
