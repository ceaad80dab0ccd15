"""One launch of a compiled step, costed: what kind of kernel it is, its FLOPs (matrix
products, attention), the bytes it moves, its elementwise work, the devices of a collective,
and whether it recomputes forward work.

Recomputation is what jax's ``checkpoint`` re-runs in the backward pass (its ops are named
``.../rematted_computation/...``) and what XLA's own rematerialization pass cloned
(``*.remat*`` instructions). XLA:CPU's loops say how many threads they run on
(``outer_dimension_partitions``) and whether they transpose, which a CPU's rates tell apart
(:attr:`remat_kit.timing.Speed.loop_rates`).

Example:
  >>> from remat_kit.xla import read_hlo
  >>> m = read_hlo(["ENTRY %e (a: f32[4,8], b: f32[8,2]) -> f32[4,2] {",
  ...     "  %a = f32[4,8]{1,0} parameter(0)", "  %b = f32[8,2]{1,0} parameter(1)",
  ...     "  ROOT %d = f32[4,2]{1,0} dot(%a, %b), lhs_contracting_dims={1}, "
  ...     "rhs_contracting_dims={0}", "}"])
  >>> k = _cost(m, m.computations["e"][2], 1)
  >>> k.kind, k.flops, (k.m, k.n, k.k)
  ('gemm', 128.0, (4, 2, 8))
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
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
)
from remat_kit.xla._kernel import Kernel
from remat_kit.xla._opcodes import (
    _ATTENTION_FWD,
    _COLLECTIVES,
    _DOTS,
    _GEMM_TARGETS,
    _NO_ARITHMETIC,
    _NO_KERNEL,
    _SLICING,
)
from remat_kit.xla._traffic import _io_bytes


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
        run, stride = _layout(instr.attrs)
        return Kernel(
            kind="collective",
            flops=0.0,
            # A ring moves the larger side: the gathered output, the scattered input.
            bytes=max(dev, operand_bytes),
            asynchronous=op.endswith("-start"),
            group=_group_size(instr.attrs, 1),
            run=run,
            stride=stride,
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
    if op in _SLICING and host:
        # A slice read from pinned host memory (libtpu reads an offloaded residual back this
        # way too): it moves the slice, not the buffer it is cut from.
        size = sum(_nbytes(_output_shape(instr)))
        return _memory_or_host(size, size, base, op, asynchronous=False)
    if op in ("dynamic-update-slice-start", "dynamic-slice-start"):
        # libtpu's asynchronous slice of a stacked buffer (a host-offloaded residual, one
        # layer's slice written to or read from pinned host memory): it moves the slice, not
        # the stack. The slice: the update (operand 1) written, or the output read.
        if op == "dynamic-update-slice-start" and len(instr.operands) > 1:
            piece = _nbytes(module.shapes.get(instr.operands[1], ""))
        else:
            piece = _nbytes(_output_shape(instr))
        size = piece[0] + piece[1]
        dev, host = (size, size) if host else (2 * size, 0)
        return _memory_or_host(dev, host, base, op, asynchronous=True)
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
    if target == "tpu_custom_call":
        kernel = _pallas_tpu(module, instr, base, dev=dev)
        if kernel is not None:
            return kernel
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


#: Splash attention's Pallas kernels (jax's ``splash_attention_kernel.py``, which MaxText's
#: copy follows) and the products each runs per visible block: the forward ``qk`` and ``pv``
#: (2); the dq kernel ``qk``, ``dp`` and ``dq`` (3); the dkv kernel ``qk``, ``dv``, ``dp`` and
#: ``dk`` (4), and ``dq`` as well when the backward is fused (it then returns three arrays).
_SPLASH = (("splash_mha_fwd", 2), ("splash_mha_dq", 3), ("splash_mha_dkv", 4))


def _pallas_tpu(
    module: HloModule, instr: HloInstruction, base: dict[str, Any], *, dev: int
) -> Kernel | None:
    """A Pallas kernel on a TPU (``tpu_custom_call``): its own ``CostEstimate`` where the
    kernel carries one (``custom_call_config.cost_estimate``: flops, bytes_accessed), else
    splash attention's FLOPs from its shapes; None for any other kernel (priced as memory).

    Splash: ``2 x products x b x heads x s_q x s_kv x head_dim`` (the forward's two products
    make the ``4 b s s h d`` of an attention forward) over the blocks the kernel runs. Its
    first operand is the block mask, ``s8[groups, q blocks, kv blocks]``; its values are
    constants the optimized text elides, so the mask is taken as MaxText's: causal
    (``CausalMask`` in maxtext/layers/attention_op.py for a decoder's training step), whose
    blocks splash skips where every element is masked, running the rest whole.
    """
    cfg = _backend_config(instr.attrs).get("custom_call_config", {})
    estimate = cfg.get("cost_estimate") if isinstance(cfg, dict) else None
    if isinstance(estimate, dict) and estimate.get("flops"):
        return Kernel("gemm", flops=float(estimate["flops"]),
                      bytes=int(estimate.get("bytes_accessed") or dev), op="pallas",
                      **base)  # fmt: skip
    role = next(((n, p) for n, p in _SPLASH if n in instr.name or n in instr.attrs), None)
    if role is None:
        return None
    shapes = [_arrays(module.shapes.get(o, "")) for o in instr.operands]
    grids = [a[0][1] for a in shapes if a and a[0][0] == "s8" and len(a[0][1]) == 3]
    tensors = [a[0][1] for a in shapes if a and a[0][0] in ("bf16", "f32") and len(a[0][1]) == 4]
    if len(tensors) < 2:
        return None
    (b, heads, sq, d), skv = tensors[0], tensors[1][2]
    products = role[1] + (role[0] == "splash_mha_dkv" and len(_arrays(instr.shape)) >= 3)
    share = _causal_blocks(sq, skv, *grids[0][1:]) if grids else 1.0
    flops = 2.0 * products * b * heads * sq * skv * d * share
    return Kernel("attention", flops=flops, bytes=dev, m=sq, n=skv, k=d, batch=b * heads,
                  op="attention_fwd" if role[1] == 2 else "attention_bwd", **base)  # fmt: skip


def _causal_blocks(sq: int, skv: int, nq: int, nkv: int) -> float:
    """The share of a ``nq x nkv`` block grid over ``sq x skv`` that a causal mask leaves
    any element of (query block ``i`` sees key block ``j`` when ``j``'s first key is at or
    before ``i``'s last query)."""
    bq, bkv = max(1, sq // max(1, nq)), max(1, skv // max(1, nkv))
    seen = sum(min(nkv, ((i + 1) * bq - 1) // bkv + 1) for i in range(nq))
    return seen / (nq * nkv)


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


def _elementwise_ops(body: Sequence[HloInstruction]) -> float:
    total = 0
    for i in body:
        if i.opcode in _NO_ARITHMETIC or i.opcode == "fusion":
            continue
        total += sum(math.prod(dims) for _, dims, _ in _arrays(i.shape))
    return float(total)


def _dot_flops(
    shapes: Mapping[str, str], instr: HloInstruction
) -> tuple[float, tuple[int, int, int, int]]:
    if instr.opcode == "ragged-dot":
        return _ragged_dot_flops(shapes, instr)
    if instr.opcode == "convolution":
        return _conv_flops(shapes, instr)
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


def _conv_flops(
    shapes: Mapping[str, str], instr: HloInstruction
) -> tuple[float, tuple[int, int, int, int]]:
    """``2 x`` the multiply-adds of a convolution that land on input, not on padding or the
    holes of a dilation.

    XLA:TPU writes every product as a convolution: a batched product's batch dimension
    becomes a spatial one whose window meets one input per output (``size=8 pad=7_7``), a
    gradient's a dilated window. Counting the window's every position would count those
    misses; each spatial dimension's valid (output, window) pairs are counted instead, and
    the dimensions multiply.
    """
    m = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", instr.attrs)
    out = _arrays(instr.shape)
    lhs = _arrays(shapes.get(instr.operands[0], "")) if instr.operands else []
    rhs = _arrays(shapes.get(instr.operands[1], "")) if len(instr.operands) > 1 else []
    if m is None or not out or not lhs or not rhs:
        return 0.0, (0, 0, 0, 0)
    lhs_labels, rhs_labels, out_labels = m.groups()
    lhs_dims, rhs_dims, out_dims = lhs[0][1], rhs[0][1], out[0][1]
    if len(lhs_labels) != len(lhs_dims) or len(rhs_labels) != len(rhs_dims):
        return 0.0, (0, 0, 0, 0)
    window = _window(instr.attrs)
    pairs = 1
    for d in (c for c in out_labels if c.isdigit()):
        i = int(d)
        size = lhs_dims[lhs_labels.index(d)]
        taps = rhs_dims[rhs_labels.index(d)]
        n_out = out_dims[out_labels.index(d)]
        pairs *= _valid_pairs(size, taps, n_out, *(w[i] if i < len(w) else w[-1]
                                                    for w in window))  # fmt: skip
    batch = out_dims[out_labels.index("b")]
    features = out_dims[out_labels.index("f")]
    per_group = rhs_dims[rhs_labels.index("i")]
    macs = pairs * batch * features * per_group
    rows = math.prod(out_dims) // max(1, features)
    return 2.0 * macs, (rows, features, macs // max(1, rows * features), 1)


def _window(attrs: str) -> tuple[tuple[Any, ...], ...]:
    """Per spatial dimension: (stride, pad_low, lhs_dilate, rhs_dilate) of ``window={...}``."""
    m = re.search(r"window=\{([^}]*)\}", attrs)
    fields = dict(re.findall(r"(\w+)=([\w\-]+)", m.group(1))) if m else {}
    n = len(fields.get("size", "1").split("x"))

    def ints(key: str, default: int) -> list[int]:
        if key not in fields:
            return [default] * n
        return [int(v.split("_")[0]) for v in fields[key].split("x")]

    return (ints("stride", 1), ints("pad", 0), ints("lhs_dilate", 1), ints("rhs_dilate", 1))


def _valid_pairs(
    size: int, taps: int, n_out: int, stride: int, pad: int, lhs_dilate: int, rhs_dilate: int
) -> int:
    import numpy as np

    o = np.arange(n_out)[:, None]
    k = np.arange(taps)[None, :]
    p = o * stride + k * rhs_dilate - pad  # where each pair reads, in the dilated input
    hit = (p >= 0) & (p <= (size - 1) * lhs_dilate) & (p % lhs_dilate == 0)
    return int(hit.sum())


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


def _recompute(instr: HloInstruction) -> bool:
    return "rematted_computation" in instr.attrs or ".remat" in instr.name


def _group_size(attrs: str, default: int) -> int:
    ids = _first_group(attrs)
    return len(ids) if ids else default


def _layout(attrs: str) -> tuple[int, int]:
    """``(run, stride)`` of the first replica group: how many of its devices have consecutive
    ids from its first, and how far apart the starts of such runs are (0: one run)."""
    ids = sorted(_first_group(attrs))
    n = 1 if ids else 0
    while n < len(ids) and ids[n] == ids[0] + n:
        n += 1
    return n, (ids[n] - ids[0] if n < len(ids) else 0)


def _first_group(attrs: str) -> tuple[int, ...]:
    """The device ids of a collective's first replica group, in any of XLA's three spellings:
    a list (``{{0,1},{2,3}}``), the iota form (``[2,2]<=[2,2]T(1,0)``: ids 0..N-1 laid out in
    ``dims``, transposed by the permutation, read as groups x size) and the mesh form
    (``mesh['fsdp'=8,'tp'=2] {'fsdp'}``: the group varies the named axes of a mesh of ids laid
    out in order, the other axes at their first index). () where the text names none."""
    m = re.search(r"replica_groups=\{\{([\d,]*)\}", attrs)
    if m:
        return tuple(int(d) for d in m.group(1).split(",") if d)
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", attrs)
    if m:
        ids = _iota(m.group(3), m.group(4))
        return tuple(int(d) for d in ids.reshape(int(m.group(1)), int(m.group(2)))[0])
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]", attrs)
    if m:  # iota form without a layout: ids in order
        return tuple(range(int(m.group(2))))
    m = re.search(
        r"replica_groups=mesh\[([^\]]*)\](?:<=\[([\d,]+)\](?:T\(([\d,]+)\))?)?\s*\{([^}]*)\}",
        attrs,
    )
    if m:
        sizes = [(a, int(n)) for a, n in re.findall(r"'([^']+)'=(\d+)", m.group(1))]
        grouped = set(re.findall(r"'([^']+)'", m.group(4)))
        if not sizes or not grouped:
            return ()
        total = math.prod(n for _, n in sizes)
        ids = _iota(m.group(2), m.group(3)) if m.group(2) else _iota(str(total), None)
        ids = ids.reshape([n for _, n in sizes])
        index = tuple(slice(None) if a in grouped else 0 for a, _ in sizes)
        return tuple(int(d) for d in ids[index].reshape(-1))
    return ()


def _iota(dims: str, perm: str | None) -> Any:
    import numpy as np

    shape = [int(d) for d in dims.split(",")]
    ids = np.arange(math.prod(shape)).reshape(shape)
    if perm:
        ids = ids.transpose([int(p) for p in perm.split(",")])
    return ids.reshape(-1)
