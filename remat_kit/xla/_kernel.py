"""What the step-time model prices: :class:`Kernel`, one distinct launch of a compiled step, and
:data:`KINDS`, what a kernel can be.

:func:`remat_kit.xla.kernels_of` makes the records from the optimized HLO;
:mod:`remat_kit.timing` prices them on a device's rates; the compile cache keeps them as lists
(:meth:`Kernel.to_list`, :meth:`Kernel.from_list`).

Example:
  >>> k = Kernel("memory", count=2, flops=0.0, bytes=4096)
  >>> Kernel.from_list(k.to_list()) == k
  True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

__all__ = [
    "KINDS",
    "Kernel",
]

#: What a kernel is, for the model: each kind is costed its own way.
KINDS = (
    "gemm",
    "attention",
    "memory",
    "collective",
    "host_transfer",
)


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One distinct kernel of a step, with how many times the step launches it.

    Attributes:
      kind: one of :data:`KINDS`.
      count: launches per step (loop trip counts multiplied in).
      flops: floating-point operations of one launch (gemm and attention; 0 otherwise).
      bytes: device-memory bytes one launch reads and writes.
      host_bytes: bytes one launch moves across the host link (to or from pinned host memory).
      m, n, k, batch: a gemm's output rows and columns, contraction length and batch (0 for
        other kinds); attention: query length, key length, head dim and batch x heads.
      dtype: the output's element type (``bf16``, ``f32``...).
      recompute: the launch recomputes forward work (a checkpoint's or XLA's remat).
      asynchronous: XLA issued it as an async pair (it may overlap other kernels).
      group: devices taking part (collectives; 1 otherwise).
      run: a collective's devices with consecutive ids, counted from the group's first device
        (``group`` when the whole group is one block of ids, as an FSDP axis inside a node;
        1 when its members stand a node apart, as a data axis across nodes). 0 where not read.
      stride: how far apart (in device ids) the starts of those runs are; 0 for one run.
        With ``run``, how many of one group share a node once the node's size is known.
      window: the asynchronous collective this kernel runs beside (an id within the program,
        0 for none): an async collective carries its own id, and each kernel XLA scheduled
        between that collective's start and its done carries the id of the earliest
        collective then in flight. What a window's kernels take is what can hide its
        collective.
      op: what it is (a collective's kind, an attention's direction, the HLO opcode).
      name: one HLO instruction that launches it (for reading the program).
      ops: elementwise operations of one launch of a fusion (each computing instruction's
        elements): what makes random-number and other arithmetic-heavy fusions slower than
        their bytes.
      parts: the threads XLA:CPU splits a loop fusion over (its ``outer_dimension_partitions``;
        1 where it names none: one thread on a CPU, and every GPU kernel).
      strided: a memory-bound fusion or copy that transposes (a ``transpose`` or ``copy`` that
        changes the layout): on a CPU it walks one side across cache lines.
    """

    kind: str
    count: int
    flops: float
    bytes: int
    host_bytes: int = 0
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 0
    dtype: str = ""
    recompute: bool = False
    asynchronous: bool = False
    group: int = 1
    run: int = 0
    stride: int = 0
    window: int = 0
    op: str = ""
    name: str = ""
    ops: float = 0.0
    parts: int = 1
    strided: bool = False

    def to_list(self) -> list[Any]:
        """The fields in order (a compact record for the compile cache)."""
        return [getattr(self, f.name) for f in dataclasses.fields(self)]

    @classmethod
    def from_list(cls, values: Sequence[Any]) -> Kernel:
        """The inverse of :meth:`to_list`.

        Raises:
          ValueError: the record has the wrong length or field types.
        """
        fields = dataclasses.fields(cls)
        if len(values) != len(fields):
            raise ValueError(f"a Kernel record has {len(fields)} fields, not {len(values)}")
        ok = {
            "int": lambda v: type(v) is int,
            "float": lambda v: type(v) in (int, float),
            "str": lambda v: type(v) is str,
            "bool": lambda v: type(v) is bool,
        }
        for f, v in zip(fields, values, strict=True):
            if not ok[str(f.type)](v):
                raise ValueError(f"Kernel field {f.name}={v!r} is not {f.type}")
        pairs = zip(fields, values, strict=True)
        values = [float(v) if str(f.type) == "float" else v for f, v in pairs]
        return cls(*values)
