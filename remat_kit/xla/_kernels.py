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
from remat_kit.xla._opcodes import _COLLECTIVES, _FREE

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
    window: int = 0,
    ids: list[int] | None = None,
    wrapped: int = 0,
) -> None:
    """Adds the kernels of ``comp`` (run ``times`` times) to ``out``.

    The optimized text lists each computation in the order XLA scheduled it, so an async
    collective's start and done bound what runs beside it: ``window`` is the collective in
    flight where ``comp`` was called (0: none), ``ids`` the last window id given out in this
    program, ``wrapped`` the id of the async pair whose wrapped computation ``comp`` is (its
    collectives run asynchronously, under that id).
    """
    if comp in stack or comp not in module.computations:
        return
    stack = stack | {comp}
    ids = [0] if ids is None else ids
    in_flight: dict[str, int] = {}  # start's name -> window id, in the order started
    continuing: list[str] = []  # continuation-fusion starts in flight, oldest first
    for instr in module.computations[comp]:
        op = instr.opcode
        here = next(iter(in_flight.values()), window)
        if op.endswith("-done"):
            for name in instr.operands:
                in_flight.pop(name, None)
            continue
        if op in _FREE:
            continue
        if op == "while":
            n = _trip_count(instr, module)
            for key in ("body", "condition"):
                called = _attr(instr.attrs, key)
                if called:
                    _walk(module, called, times * n, out, stack, here, ids)
            continue
        if op == "fusion" and (cf := _continuation(module, instr)):
            # libtpu's continuation fusion (v5e's default): an all-gather started by one
            # custom fusion, finished by another, the compute between them run beside it
            # (fused with the transfer's steps). The start's all-gather is the transfer, in
            # its own window as an async pair's; the done's copy of it is the same transfer.
            if cf == "AsyncCollectiveStart":
                ids[0] += 1
                in_flight[instr.name] = ids[0]
                continuing.append(instr.name)
                _walk(module, _attr(instr.attrs, "calls") or "", times, out, stack, ids[0], ids,
                      wrapped=ids[0])  # fmt: skip
            elif continuing:
                in_flight.pop(continuing.pop(0), None)
            continue
        if op == "fusion" and (inner := _fused_collective(module, instr)) is not None:
            # libtpu writes a reduce-scatter as a custom fusion of an all-reduce over the
            # padded buffer (``all-reduce-scatter``): one reduce-scatter of that buffer, run
            # in the stream like any collective (its emitter scatters; it does not reduce
            # everything everywhere).
            kernel = _cost(module, inner, times)
            if kernel is not None:
                called = _attr(instr.attrs, "calls") or ""
                if called.startswith("all-reduce-scatter"):
                    kernel = dataclasses.replace(kernel, op="reduce-scatter")
                _add(out, dataclasses.replace(kernel, name=instr.name))
            continue
        if op in ("call", "async-start") or (op == "fusion" and _is_wrapper(module, instr)):
            called = _attr(instr.attrs, "to_apply") or _attr(instr.attrs, "calls")
            if not called:
                continue
            if op == "async-start" and _holds_collective(module, called):
                ids[0] += 1
                in_flight[instr.name] = ids[0]
                _walk(module, called, times, out, stack, ids[0], ids, wrapped=ids[0])
            else:
                _walk(module, called, times, out, stack, here, ids, wrapped)
            continue
        if op == "conditional":
            # One branch runs; which is not known statically: cost the first (they are
            # usually the same program under a different mask or index).
            m = re.search(r"branch_computations=\{%?([^\s,}]+)", instr.attrs)
            called = m.group(1) if m else _attr(instr.attrs, "true_computation")
            if called:
                _walk(module, called, times, out, stack, here, ids)
            continue
        kernel = _cost(module, instr, times)
        if kernel is None:
            continue
        if kernel.kind == "collective" and wrapped:
            kernel = dataclasses.replace(kernel, asynchronous=True, window=wrapped)
        elif kernel.kind == "collective" and kernel.asynchronous:
            ids[0] += 1
            in_flight[instr.name] = ids[0]
            kernel = dataclasses.replace(kernel, window=ids[0])
        elif kernel.kind in ("gemm", "attention", "memory"):
            kernel = dataclasses.replace(kernel, window=here)
        _add(out, kernel)


def _add(out: dict[tuple[Any, ...], Kernel], kernel: Kernel) -> None:
    """Counts ``kernel`` in ``out``: kernels alike but for their count and name are one."""
    key = dataclasses.astuple(dataclasses.replace(kernel, count=0, name=""))
    if key in out:
        out[key] = dataclasses.replace(out[key], count=out[key].count + kernel.count)
    else:
        out[key] = kernel


def _fused_collective(module: HloModule, instr: HloInstruction) -> HloInstruction | None:
    """The one collective a libtpu custom fusion holds (``kind=kCustom``: its
    ``all-reduce-scatter``), else None."""
    if "kind=kCustom" not in instr.attrs:
        return None
    body = module.computations.get(_attr(instr.attrs, "calls") or "", ())
    found = [i for i in body if i.opcode in _COLLECTIVES]
    customs = [i for i in body if i.opcode == "custom-call"]
    return found[0] if len(found) == 1 and not customs else None


def _continuation(module: HloModule, instr: HloInstruction) -> str:
    """``AsyncCollectiveStart`` / ``AsyncCollectiveDone`` where ``instr`` is the start or
    done fusion of libtpu's continuation fusion (its body's custom call), else empty."""
    if "kind=kCustom" not in instr.attrs:
        return ""
    for i in module.computations.get(_attr(instr.attrs, "calls") or "", ()):
        target = (_attr(i.attrs, "custom_call_target") or "").strip('"')
        if i.opcode == "custom-call" and target in ("AsyncCollectiveStart", "AsyncCollectiveDone"):
            return target
    return ""


def _holds_collective(module: HloModule, comp: str) -> bool:
    return any(i.opcode in _COLLECTIVES for i in module.computations.get(comp, ()))


def _is_wrapper(module: HloModule, instr: HloInstruction) -> bool:
    # XLA's command buffers and a few custom fusions hold whole kernels: walk into those
    # whose body holds fusions or custom calls (a real fusion's body holds plain ops). XLA:TPU
    # nests the fusions that feed a product inside the product's own (kind=kOutput): that is
    # one kernel, its bytes at its boundary.
    if re.search(r"\bkind=k(Output|Loop|Input)\b", instr.attrs):
        return False
    called = _attr(instr.attrs, "calls")
    body = module.computations.get(called or "", ())
    return any(i.opcode in ("fusion", "custom-call", "while") for i in body)


def _trip_count(instr: HloInstruction, module: HloModule | None = None) -> int:
    n = _backend_config(instr.attrs).get("known_trip_count", {}).get("n")
    if n is not None:
        return int(n)
    if module is None:
        return 1
    # XLA:TPU records no trip count: read the loop's condition instead, ``i < N`` over one
    # element of the loop's tuple (``compare(gte(param, index=k), constant(N)),
    # direction=LT`` as the condition's root), with the counter's start (the loop operand's
    # element k) and step (the body root's element k, ``add(gte(param, index=k),
    # constant(s))``). jax's scans and fori_loops count from 0 by 1; libtpu's windowed einsum
    # loops (``windowed_dot_general_body_*``) run two windows a trip and add 2.
    cond = module.computations.get(_attr(instr.attrs, "condition") or "", ())
    root = next((i for i in cond if i.is_root), None)
    if root is None or root.opcode != "compare" or "direction=LT" not in root.attrs:
        return 1
    by_name = {i.name: i for i in cond}
    bound = by_name.get(root.operands[1]) if len(root.operands) > 1 else None
    limit = _constant(bound)
    if limit is None:
        return 1
    k = _element(by_name.get(root.operands[0]))
    if k is None:
        return limit
    start = _counter_start(module, instr, k)
    step = _counter_step(module, _attr(instr.attrs, "body") or "", k)
    return max(0, -(-(limit - start) // step))


def _constant(instr: HloInstruction | None) -> int | None:
    """An integer ``constant(N)``'s N, else None."""
    if instr is None or instr.opcode != "constant":
        return None
    m = re.fullmatch(r"\s*(-?\d+)\s*", instr.operand_text)
    return int(m.group(1)) if m else None


def _element(instr: HloInstruction | None) -> int | None:
    """k of ``get-tuple-element(parameter), index=k``, else None."""
    if instr is None or instr.opcode != "get-tuple-element":
        return None
    m = re.search(r"\bindex=(\d+)", instr.attrs)
    return int(m.group(1)) if m else None


def _counter_start(module: HloModule, loop: HloInstruction, k: int) -> int:
    """The counter's first value: element k of the loop's operand tuple where it is a constant
    (through copies); 0, jax's start, where the text does not say."""
    here = {i.name: i for i in module.computations.get(loop.computation, ())}
    init = here.get(loop.operands[0]) if loop.operands else None
    if init is None or init.opcode != "tuple" or k >= len(init.operands):
        return 0
    value = here.get(init.operands[k])
    while value is not None and value.opcode == "copy" and value.operands:
        value = here.get(value.operands[0])
    start = _constant(value)
    return 0 if start is None else start


def _counter_step(module: HloModule, body: str, k: int) -> int:
    """What the body adds to the counter a trip (``add(gte(param, index=k), constant(s))`` as
    its root tuple's element k); 1 where it is not written so."""
    instrs = module.computations.get(body, ())
    root = next((i for i in instrs if i.is_root), None)
    if root is None or root.opcode != "tuple" or k >= len(root.operands):
        return 1
    by_name = {i.name: i for i in instrs}
    update = by_name.get(root.operands[k])
    if update is None or update.opcode != "add" or len(update.operands) != 2:
        return 1
    a, b = (by_name.get(o) for o in update.operands)
    if _element(a) == k:
        step = _constant(b)
    elif _element(b) == k:
        step = _constant(a)
    else:
        return 1
    return step if step is not None and step > 0 else 1
