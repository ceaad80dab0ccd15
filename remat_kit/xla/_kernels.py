"""The kernels of a compiled program, read from its optimized HLO: what a step-time model costs.

XLA's GPU compiler turns a step into a sequence of kernels: matrix products (cuBLAS custom calls
or Triton GEMM fusions), cuDNN attention calls, fusions that read and write device memory,
collectives and copies to and from pinned host memory. :func:`kernels_of` walks the entry
computation of the optimized HLO text (read by :func:`remat_kit.xla.read_hlo`), entering while
loops (their body times the trip count XLA recorded, ``known_trip_count``), calls and async
wrappers, and returns one :class:`~remat_kit.xla.Kernel` per distinct launch with how many times
a step runs it.

Which ops launch nothing is :mod:`remat_kit.xla._opcodes`'s to say; each launch is costed by
:mod:`remat_kit.xla._cost` (its FLOPs, its recomputation) and :mod:`remat_kit.xla._traffic`
(the bytes it moves, counted at its boundary).

Example:
  >>> import jax, jax.numpy as jnp
  >>> x = jax.ShapeDtypeStruct((256, 512), jnp.float32)
  >>> text = jax.jit(lambda a, b: a @ b.T).lower(x, x).compile().as_text()
  >>> [(k.kind, k.flops) for k in kernels_of(text) if k.kind == "gemm"]
  [('gemm', 67108864.0)]
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from remat_kit.xla._cost import _cost
from remat_kit.xla._hlo import HloInstruction, HloModule, _attr, _backend_config, read_hlo
from remat_kit.xla._kernel import Kernel
from remat_kit.xla._opcodes import _FREE

__all__ = [
    "kernels_of",
]


def kernels_of(hlo_text: str) -> tuple[Kernel, ...]:
    """The kernels one run of a compiled program launches, from its optimized HLO text.

    Args:
      hlo_text: ``compiled.as_text()`` of a jax program (any backend; GPU programs give the
        most detail).

    Returns:
      One Kernel per distinct launch (same kind, shapes, bytes and recompute merged), counts
      summed; in the order first met.

    Raises:
      ValueError: the text has no ENTRY computation.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> x = jax.ShapeDtypeStruct((1024,), jnp.float32)
      >>> text = jax.jit(lambda a: jnp.sin(a) * 2).lower(x).compile().as_text()
      >>> sum(k.bytes * k.count for k in kernels_of(text))  # read 4 KiB, write 4 KiB
      8192
    """
    module = read_hlo(hlo_text.splitlines())
    if module.entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    out: dict[tuple[Any, ...], Kernel] = {}
    _walk(module, module.entry, 1, out, set())
    return tuple(out.values())


def _walk(
    module: HloModule,
    comp: str,
    times: int,
    out: dict[tuple[Any, ...], Kernel],
    stack: set[str],
) -> None:
    if comp in stack or comp not in module.computations:
        return
    stack = stack | {comp}
    for instr in module.computations[comp]:
        op = instr.opcode
        if op in _FREE:
            continue
        if op == "while":
            n = _trip_count(instr)
            for key in ("body", "condition"):
                called = _attr(instr.attrs, key)
                if called:
                    _walk(module, called, times * n, out, stack)
            continue
        if op in ("call", "async-start") or (op == "fusion" and _is_wrapper(module, instr)):
            called = _attr(instr.attrs, "to_apply") or _attr(instr.attrs, "calls")
            if called:
                _walk(module, called, times, out, stack)
            continue
        if op == "conditional":
            # One branch runs; which is not known statically: cost the first (they are
            # usually the same program under a different mask or index).
            m = re.search(r"branch_computations=\{%?([^\s,}]+)", instr.attrs)
            called = m.group(1) if m else _attr(instr.attrs, "true_computation")
            if called:
                _walk(module, called, times, out, stack)
            continue
        kernel = _cost(module, instr, times)
        if kernel is None:
            continue
        key = dataclasses.astuple(dataclasses.replace(kernel, count=0, name=""))
        if key in out:
            out[key] = dataclasses.replace(out[key], count=out[key].count + kernel.count)
        else:
            out[key] = kernel


def _is_wrapper(module: HloModule, instr: HloInstruction) -> bool:
    # XLA's command buffers and a few custom fusions hold whole kernels: walk into those
    # whose body holds fusions or custom calls (a real fusion's body holds plain ops).
    called = _attr(instr.attrs, "calls")
    body = module.computations.get(called or "", ())
    return any(i.opcode in ("fusion", "custom-call", "while") for i in body)


def _trip_count(instr: HloInstruction) -> int:
    n = _backend_config(instr.attrs).get("known_trip_count", {}).get("n")
    return int(n) if n is not None else 1
