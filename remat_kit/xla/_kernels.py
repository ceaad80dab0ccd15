"""The kernels of a compiled program, read from its optimized HLO: what a step-time model costs.

XLA's GPU compiler turns a step into a sequence of kernels: matrix products (cuBLAS custom calls
or Triton GEMM fusions), cuDNN attention calls, fusions that read and write device memory,
collectives and copies to and from pinned host memory. :func:`kernels_of` walks the entry
computation of the optimized HLO text (read by :func:`remat_kit.xla._hlo.read_hlo`), entering while
loops (their body times the trip count XLA recorded, ``known_trip_count``), calls and async
wrappers, and returns one :class:`Kernel` per distinct launch with how many times a step runs
it.

What each kernel moves is counted at the fusion's boundary, with two corrections that matter
for scanned layers: an operand the fusion only slices (``dynamic-slice`` of a stacked weight)
costs the slice, not the stack; a fusion whose root updates a buffer in place
(``dynamic-update-slice``) writes the update, not the buffer. Bytes in pinned host memory
(layout memory space ``S(5)``) cross the host link, not device memory. XLA:CPU's loops say how
many threads they run on (``outer_dimension_partitions``) and whether they transpose, which a
CPU's rates tell apart (:attr:`remat_kit.timing.Speed.loop_rates`).

Recomputation is what jax's ``checkpoint`` re-runs in the backward pass (its ops are named
``.../rematted_computation/...``) and what XLA's own rematerialization pass cloned
(``*.remat*`` instructions).

Example:
  >>> import jax, jax.numpy as jnp
  >>> x = jax.ShapeDtypeStruct((256, 512), jnp.float32)
  >>> text = jax.jit(lambda a, b: a @ b.T).lower(x, x).compile().as_text()
  >>> [(k.kind, k.flops) for k in kernels_of(text) if k.kind == "gemm"]
  [('gemm', 67108864.0)]
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from remat_kit.xla._hlo import (
    _DTYPE_BYTES,
    HloInstruction,
    HloModule,
    _arrays,
    _attr,
    _backend_config,
    _dims_attr,
    _nbytes,
    _output_shape,
    _parts,
    _transposes,
    read_hlo,
)

__all__ = [
    "KINDS",
    "Kernel",
    "kernels_of",
]

#: What a kernel is, for the model: each kind is costed its own way.
KINDS = (
    "gemm",
    "attention",
    "memory",
    "collective",
    "host_transfer",
)

# Ops that launch nothing: names, views, control flow (walked into), the second half of a pair.
_FREE = frozenset(
    {
        "parameter",
        "constant",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "after-all",
        "partition-id",
        "replica-id",
        "opt-barrier",
        "add-dependency",
        "copy-done",
        "fusion-done",
        "async-done",
        "async-update",
        "all-gather-done",
        "all-reduce-done",
        "reduce-scatter-done",
        "all-to-all-done",
        "collective-permute-done",
        "send-done",
        "recv-done",
        "domain",
        "get-dimension-size",
        "iota",
    }
)
_COLLECTIVES = {
    "all-gather": "all-gather",
    "all-gather-start": "all-gather",
    "all-reduce": "all-reduce",
    "all-reduce-start": "all-reduce",
    "reduce-scatter": "reduce-scatter",
    "reduce-scatter-start": "reduce-scatter",
    "all-to-all": "all-to-all",
    "all-to-all-start": "all-to-all",
    "collective-permute": "collective-permute",
    "collective-permute-start": "collective-permute",
    "ragged-all-to-all": "all-to-all",
}
_GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul", "__cublas$lt$matmul$f8")
_ATTENTION_FWD = "__cudnn$fmhaSoftmax"
# Custom calls that reserve memory or mark values, launching nothing.
_NO_KERNEL = frozenset(
    {"AllocateBuffer", "MoveToHost", "MoveToDevice", "annotate_device_placement"}
)
_SLICING = frozenset({"dynamic-slice", "slice", "gather"})


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


# ---------------------------------------------------------------------------------------------
# What costing reads from an instruction's attributes (the text is parsed in xla._hlo).


def _trip_count(instr: HloInstruction) -> int:
    n = _backend_config(instr.attrs).get("known_trip_count", {}).get("n")
    return int(n) if n is not None else 1


def _recompute(instr: HloInstruction) -> bool:
    return "rematted_computation" in instr.attrs or ".remat" in instr.name


def _group_size(attrs: str, default: int) -> int:
    m = re.search(r"replica_groups=\{\{([\d,]*)\}", attrs)
    if m:
        return max(1, len([d for d in m.group(1).split(",") if d]))
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]", attrs)  # iota form [groups,size]
    if m:
        return int(m.group(2))
    # mesh form: mesh['axis_0'=8,'axis_1'=1] {'axis_0'}: the named axes' sizes multiplied
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
    if m:
        sizes = dict(re.findall(r"'([^']+)'=(\d+)", m.group(1)))
        axes = re.findall(r"'([^']+)'", m.group(2))
        return math.prod(int(sizes.get(a, 1)) for a in axes) if axes else default
    return default


# ---------------------------------------------------------------------------------------------
# Walking and costing.


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


def _cost(module: HloModule, instr: HloInstruction, times: int) -> Kernel | None:
    op = instr.opcode
    base = {
        "count": times,
        "dtype": (_arrays(_output_shape(instr)) or [("", (), False)])[0][0],
        "recompute": _recompute(instr),
        "name": instr.name,
    }
    if op in _COLLECTIVES:
        # An async start's shape holds (inputs, outputs) except all-reduce-start's (the output).
        shape = instr.shape if op == "all-reduce-start" else _output_shape(instr)
        dev, host = _nbytes(shape)
        operand_bytes = sum(_nbytes(module.shapes.get(o, ""))[0] for o in instr.operands)
        return Kernel(
            kind="collective",
            flops=0.0,
            # A ring moves the larger side: the gathered output, the scattered input.
            bytes=max(dev, operand_bytes),
            asynchronous=op.endswith("-start"),
            group=_group_size(instr.attrs, 1),
            op=_COLLECTIVES[op],
            **base,
        )
    if op == "custom-call":
        return _custom_call(module, instr, base)
    if op in ("fusion", "fusion-start"):
        return _fusion(module, instr, base, asynchronous=op == "fusion-start")
    if op in _DOTS:
        flops, (m, n, k, b) = _dot_flops(module.shapes, instr)
        dev, host = _io_bytes(module, instr, None)
        return Kernel("gemm", flops=flops, bytes=dev, host_bytes=host, m=m, n=n, k=k, batch=b,
                      op=op, **base)  # fmt: skip
    if op == "copy-start":
        dev, host = _io_bytes(module, instr, None)
        return _memory_or_host(dev, host, base, op, asynchronous=True)
    dev, host = _io_bytes(module, instr, None)
    if op == "dynamic-update-slice" and len(instr.operands) > 1:
        # In place: reads and writes the update, not the buffer.
        upd = _nbytes(module.shapes.get(instr.operands[1], ""))
        dev, host = 2 * upd[0], 2 * upd[1]
    kernel = _memory_or_host(dev, host, base, op, asynchronous=False)
    return dataclasses.replace(kernel, strided=_transposes(module.shapes, instr))


def _memory_or_host(
    dev: int, host: int, base: dict[str, Any], op: str, *, asynchronous: bool
) -> Kernel:
    if host:
        return Kernel("host_transfer", flops=0.0, bytes=dev, host_bytes=host, op=op,
                      asynchronous=asynchronous, **base)  # fmt: skip
    return Kernel("memory", flops=0.0, bytes=dev, op=op, asynchronous=asynchronous, **base)


def _custom_call(module: HloModule, instr: HloInstruction, base: dict[str, Any]) -> Kernel | None:
    target = _attr(instr.attrs, "custom_call_target") or ""
    target = target.strip('"')
    if target in _NO_KERNEL:
        return None
    dev, host = _io_bytes(module, instr, None)
    if target in _GEMM_TARGETS:
        cfg = _backend_config(instr.attrs).get("gemm_backend_config", {})
        dims = cfg.get("dot_dimension_numbers", {})
        out = _arrays(instr.shape)
        lhs = _arrays(module.shapes.get(instr.operands[0], "")) if instr.operands else []
        if not out or not lhs:
            return None
        contracting = [int(d) for d in dims.get("lhs_contracting_dimensions", [])]
        batch_dims = [int(d) for d in dims.get("lhs_batch_dimensions", [])]
        k = math.prod(lhs[0][1][d] for d in contracting) if contracting else 1
        b = math.prod(lhs[0][1][d] for d in batch_dims) if batch_dims else 1
        out_dims = out[0][1]
        size = math.prod(out_dims)
        n = out_dims[-1] if out_dims else 1
        m = size // max(1, n * b)
        base = {**base, "dtype": out[0][0]}
        # The workspace output (s8[...]) is scratch, not traffic.
        dev = sum(_nbytes(module.shapes.get(o, ""))[0] for o in instr.operands) + int(
            size * _DTYPE_BYTES.get(out[0][0], 4)
        )
        return Kernel("gemm", flops=2.0 * size * k, bytes=dev, host_bytes=host, m=m, n=n, k=k,
                      batch=b, op="cublas", **base)  # fmt: skip
    if target.startswith(_ATTENTION_FWD):
        return _attention(module, instr, base, backward="Backward" in target, dev=dev)
    if host:
        return Kernel("host_transfer", flops=0.0, bytes=dev, host_bytes=host, op=target, **base)
    return Kernel("memory", flops=0.0, bytes=dev, op=target or "custom-call", **base)


def _attention(
    module: HloModule, instr: HloInstruction, base: dict[str, Any], *, backward: bool, dev: int
) -> Kernel:
    cfg = _backend_config(instr.attrs).get("cudnn_fmha_backend_config", {})
    inter = [int(d) for d in cfg.get("intermediate_tensor_shape", {}).get("dimensions", [])]
    q = _arrays(module.shapes.get(instr.operands[0], "")) if instr.operands else []
    head_dim = q[0][1][-1] if q and q[0][1] else 0
    if len(inter) == 4:
        b, h, sq, skv = inter
    else:  # no intermediate shape: read [b, s, h, d] from the query
        dims = q[0][1] if q else (0, 0, 0, 0)
        b, sq, h = (*dims, 0, 0, 0)[:3]
        skv = sq
    flops = 4.0 * b * h * sq * skv * head_dim
    if cfg.get("mask_type") in ("CAUSAL", "PADDING_CAUSAL"):
        flops /= 2
    if backward:
        flops *= 2.5  # five products against the forward's two
    return Kernel("attention", flops=flops, bytes=dev, m=sq, n=skv, k=head_dim, batch=b * h,
                  op="attention_bwd" if backward else "attention_fwd", **base)  # fmt: skip


def _fusion(
    module: HloModule, instr: HloInstruction, base: dict[str, Any], *, asynchronous: bool
) -> Kernel:
    called = _attr(instr.attrs, "calls")
    body = module.computations.get(called or "", ())
    dev, host = _io_bytes(module, instr, body)
    dots = [i for i in body if i.opcode in _DOTS]
    if not dots:
        for inner in body:  # Triton GEMM fusions nest the dot one level down
            if inner.opcode == "fusion":
                nested = module.computations.get(_attr(inner.attrs, "calls") or "", ())
                dots += [i for i in nested if i.opcode in _DOTS]
    if dots:
        flops = 0.0
        m = n = k = b = 0
        for d in dots:
            f, (m, n, k, b) = _dot_flops(module.shapes, d)
            flops += f
        return Kernel("gemm", flops=flops, bytes=dev, host_bytes=host, m=m, n=n, k=k, batch=b,
                      op="fusion", asynchronous=asynchronous, **base)  # fmt: skip
    kernel = _memory_or_host(dev, host, base, "fusion", asynchronous=asynchronous)
    return dataclasses.replace(
        kernel,
        ops=_elementwise_ops(body),
        parts=_parts(instr.attrs),
        strided=any(_transposes(module.shapes, i) for i in body),
    )


# Ops that move or name data without computing on it.
_NO_ARITHMETIC = frozenset(
    {
        "parameter",
        "constant",
        "bitcast",
        "broadcast",
        "reshape",
        "transpose",
        "copy",
        "tuple",
        "get-tuple-element",
        "slice",
        "dynamic-slice",
        "dynamic-update-slice",
        "concatenate",
        "pad",
        "iota",
        "gather",
        "convert",
    }
)


def _elementwise_ops(body: Sequence[HloInstruction]) -> float:
    total = 0
    for i in body:
        if i.opcode in _NO_ARITHMETIC or i.opcode == "fusion":
            continue
        total += sum(math.prod(dims) for _, dims, _ in _arrays(i.shape))
    return float(total)


# Matrix products. ``ragged-dot`` is a grouped GEMM (``jax.lax.ragged_dot``: MoE experts); XLA's
# GPU compiler of jax 0.10 rewrites it into a dense dot over all groups before it runs (E times
# the FLOPs, and those dense dots are what is priced then); where it survives as one kernel it
# costs its own FLOPs (:func:`_ragged_dot_flops`).
_DOTS = ("dot", "convolution", "ragged-dot")


def _dot_flops(
    shapes: Mapping[str, str], instr: HloInstruction
) -> tuple[float, tuple[int, int, int, int]]:
    if instr.opcode == "ragged-dot":
        return _ragged_dot_flops(shapes, instr)
    out = _arrays(instr.shape)
    lhs = _arrays(shapes.get(instr.operands[0], "")) if instr.operands else []
    if not out or not lhs:
        return 0.0, (0, 0, 0, 0)
    contracting = _dims_attr(instr.attrs, "lhs_contracting_dims")
    batch_dims = _dims_attr(instr.attrs, "lhs_batch_dims")
    lhs_dims = lhs[0][1]
    k = math.prod(lhs_dims[d] for d in contracting if d < len(lhs_dims)) if contracting else 1
    b = math.prod(lhs_dims[d] for d in batch_dims if d < len(lhs_dims)) if batch_dims else 1
    size = math.prod(out[0][1])
    n = out[0][1][-1] if out[0][1] else 1
    m = size // max(1, n * b)
    return 2.0 * size * k, (m, n, k, b)


def _ragged_dot_flops(
    shapes: Mapping[str, str], instr: HloInstruction
) -> tuple[float, tuple[int, int, int, int]]:
    """``2 * lhs_elems * rhs_free``: each row meets one group's weights (as remat_kit.flops)."""
    lhs = _arrays(shapes.get(instr.operands[0], "")) if instr.operands else []
    rhs = _arrays(shapes.get(instr.operands[1], "")) if len(instr.operands) > 1 else []
    if not lhs or not rhs:
        return 0.0, (0, 0, 0, 0)
    lhs_dims, rhs_dims = lhs[0][1], rhs[0][1]
    met = {
        *_dims_attr(instr.attrs, "rhs_contracting_dims"),
        *_dims_attr(instr.attrs, "rhs_batch_dims"),
        *_dims_attr(instr.attrs, "rhs_group_dims"),
    }
    n = math.prod(s for d, s in enumerate(rhs_dims) if d not in met)
    contracting = _dims_attr(instr.attrs, "lhs_contracting_dims")
    k = math.prod(lhs_dims[d] for d in contracting if d < len(lhs_dims))
    m = math.prod(lhs_dims) // max(1, k)
    return 2.0 * m * k * n, (m, n, k, 1)


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
