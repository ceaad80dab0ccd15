"""What a buffer live at the peak is: a parameter, a gradient, optimizer state, a saved
activation, a recomputation or a temporary, of which layer, and under which tag.

:func:`remat_kit.peak._attribute.analyse` finds the buffers live at the peak; each is described
here from the HLO op that made it (its ``op_name``: forward, backward or recomputed) and, for
saved activations and recomputations, named by the ``checkpoint_name`` tag it carries (see
:mod:`remat_kit.peak._tags`). Its layer comes from the same op_name; a buffer made outside any
layer's ops but shaped like one layer stack's weights (the backward scan's gradient carry,
zero-filled before the loop; the stack's updates in the optimizer) is that stack's. The program's
arguments are described by the leaves that reach it (:func:`argument_leaves`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from remat_kit._shapes import path_keys
from remat_kit.peak._parsers import (
    Allocation,
    Hlo,
    Instr,
    LiveRanges,
    Value,
    xla_dtype,
)
from remat_kit.peak._phases import phase_at
from remat_kit.peak._tags import (
    INPUT_KEY,
    NON_LAYER,
    STACK,
    Tag,
    layer_of,
    match_tag,
    module_path,
    sliced_sibling,
)
from remat_kit.peak._types import (
    GRADIENT,
    OPTIMIZER_STATE,
    PARAMETER,
    RECOMPUTE,
    SAVED_ACTIVATION,
    TEMPORARY,
    PeakBuffer,
    Phase,
)
from remat_kit.xla import shape_of

__all__ = [
    "ArgLeaf",
    "argument_leaves",
    "key_paths",
]


@dataclasses.dataclass(frozen=True)
class ArgLeaf:
    """One array leaf of the arguments that reaches the program, and its category.

    ``shape`` and ``elements`` are one device's: a leaf sharded over several devices is
    its shard there, and ``whole`` its global shape (a gradient may be either: the whole
    one before a reduce-scatter, the shard after it).
    """

    argnum: int
    category: str
    shape: tuple[int, ...]
    dtype: str
    elements: int
    #: The leaf's key path in its argument's pytree, as strings (``("params", "mlp",
    #: "wi", "kernel")``); empty when unknown.
    path: tuple[str, ...] = ()
    #: The global shape of a leaf sharded over several devices; empty otherwise.
    whole: tuple[int, ...] = ()

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shapes a buffer of this leaf (its gradient, its update) may have."""
        return (self.shape, self.whole) if self.whole else (self.shape,)


def argument_leaves(
    leaves_per_arg: Sequence[Sequence[Any]],
    kept: Sequence[int],
    cats: Mapping[int, str],
    paths_per_arg: Sequence[Sequence[tuple[str, ...]]] | None = None,
) -> list[ArgLeaf]:
    """The leaves that reach the program (``kept`` indexes the flattened leaves), in order.

    Args:
      leaves_per_arg: each argument's leaves (arrays or ShapeDtypeStructs).
      kept: indices into the flattened leaves that jit kept (it drops unused ones).
      cats: argument index -> category.
      paths_per_arg: each leaf's key path as strings, in the same order (``key_paths``);
        None when unknown.

    Returns:
      One ArgLeaf per entry parameter of the compiled program.

    Example:
      >>> x = jax.ShapeDtypeStruct((2, 3), np.float32)
      >>> argument_leaves([[x]], [0], {0: "input"})[0].dtype
      'f32'
    """
    flat = []
    for argnum, leaves in enumerate(leaves_per_arg):
        paths = paths_per_arg[argnum] if paths_per_arg is not None else [()] * len(leaves)
        for leaf, path in zip(leaves, paths, strict=True):
            physical = _physical(leaf)
            whole = tuple(int(d) for d in physical.shape)
            shape = _shard_shape(leaf, whole)
            flat.append(
                ArgLeaf(
                    argnum,
                    cats[argnum],
                    shape,
                    xla_dtype(np.dtype(physical.dtype)),
                    int(np.prod(shape, dtype=np.int64)),
                    tuple(path),
                    whole if shape != whole else (),
                )
            )
    return [flat[i] for i in kept]


def _shard_shape(leaf: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` as one device holds it: its shard where ``leaf`` is sharded over several
    devices (a typed key's trailing key-data axis is never split)."""
    s = getattr(leaf, "sharding", None)
    if not isinstance(s, jax.sharding.Sharding) or len(s.device_set) < 2:
        return shape
    n = len(leaf.shape)
    return tuple(int(d) for d in s.shard_shape(shape[:n])) + shape[n:]


def _physical(leaf: Any) -> Any:
    """``leaf`` as the program holds it: a typed PRNG key (MaxText's train state keeps one)
    is its raw key data there, ``u32[..., 2]`` for threefry."""
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(leaf.shape, leaf.dtype))
    return leaf


def key_paths(tree: Any) -> list[tuple[str, ...]]:
    """Each leaf's key path in ``tree``, as strings, in ``jax.tree.leaves`` order.

    Example:
      >>> key_paths({"params": {"mlp": {"kernel": 0}}, "step": 1})
      [('params', 'mlp', 'kernel'), ('step',)]
    """
    return [path_keys(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


@dataclasses.dataclass(frozen=True)
class _Context:
    allocs: Mapping[int, Allocation]
    arg_leaves: Sequence[ArgLeaf]
    hlo: Hlo
    tags: Mapping[tuple[str, ...], list[Tag]]
    phases: tuple[Phase, ...]
    first_backward: int | None
    live: LiveRanges
    #: Shape of weights and optimizer state -> the one layer (or stack) whose leaves have
    #: it (see :func:`_layers_by_shape`).
    layer_of_shape: Mapping[tuple[int, ...], str]
    #: Values a while loop carries (see :func:`_carried`).
    carried: frozenset[tuple[str, int | None]]


def _parameter_buffer(alloc: Allocation, ctx: _Context) -> PeakBuffer:
    n = len(ctx.live.sequence)
    entry = next(
        (
            i
            for i in ctx.hlo.instructions.values()
            if _is_entry_parameter(ctx.hlo, i) and i.index == alloc.parameter
        ),
        None,
    )
    return _argument_buffer(
        entry.name + "{}" if entry else f"parameter {alloc.parameter}",
        alloc.size,
        (0, n - 1),
        alloc.parameter or 0,
        entry,
        "parameter",
        ctx,
    )


def _argument_buffer(
    name: str,
    size: int,
    span: tuple[int, int],
    number: int,
    entry: Instr | None,
    op: str,
    ctx: _Context,
) -> PeakBuffer:
    leaf = ctx.arg_leaves[number]
    path = entry.op_name if entry else ""
    segs = _argument_segments(path)
    return PeakBuffer(
        name=name,
        size_bytes=size,
        shape=leaf.shape,
        dtype=leaf.dtype,
        category=leaf.category,
        op=op,
        op_name=path,
        module_path="/".join(segs) or path,
        checkpoint_name=None,
        layer=_argument_layer(segs),
        live=span,
        phase=phase_at(ctx.phases, span[0]),
    )


def _argument_segments(path: str) -> list[str]:
    """An argument's pytree path (``tr['params']['decoder']...``) -> its keys."""
    return [next(x for x in k if x) for k in re.findall(r"\['([^']*)'\]|\.(\w+)|\[(\d+)\]", path)]


def _argument_layer(segs: Sequence[str]) -> str:
    """The layer of an argument leaf: a key such as ``layers`` holds a scanned stack."""
    return layer_of(segs, any(STACK.match(s) for s in segs))


def _layers_by_shape(hlo: Hlo, arg_leaves: Sequence[ArgLeaf]) -> dict[tuple[int, ...], str]:
    """Shape -> layer, for shapes that weight and optimizer-state leaves of one layer (or
    one scanned stack) alone have.

    Shapes shared across layers (unrolled layers) or with a non-layer leaf say nothing.
    """
    seen: dict[tuple[int, ...], set[str]] = {}
    for i in hlo.instructions.values():
        if not _is_entry_parameter(hlo, i) or i.index is None or i.index >= len(arg_leaves):
            continue
        leaf = arg_leaves[i.index]
        if leaf.category in (PARAMETER, OPTIMIZER_STATE) and leaf.shape:
            layer = _argument_layer(_argument_segments(i.op_name))
            for shape in leaf.shapes:
                seen.setdefault(shape, set()).add(layer)
    return {
        shape: next(iter(layers))
        for shape, layers in seen.items()
        if len(layers) == 1 and NON_LAYER not in layers
    }


def _carried(hlo: Hlo) -> frozenset[tuple[str, int | None]]:
    """(instruction, output index) of the values while loops carry: each loop's result,
    its body's parameter, and the values its initial tuple is made of."""
    out: set[tuple[str, int | None]] = set()
    for body, name in hlo.loops.items():
        out.add((name, None))
        params = hlo.computations.get(body, ())
        out.update((i, None) for i in params if hlo.instructions[i].opcode == "parameter")
        loop = hlo.instructions[name]
        init = hlo.instructions.get(loop.operands[0]) if loop.operands else None
        for op in init.operands if init is not None and init.opcode == "tuple" else ():
            i = hlo.instructions.get(op)
            if i is not None and i.opcode == "get-tuple-element" and i.operands:
                out.add((i.operands[0], i.index))  # an output of a multi-output fusion
            elif i is None and "#" in op:  # newer HLO text: "%x#k" is element k of x
                base, _, k = op.rpartition("#")
                out.add((base, int(k) if k.isdigit() else None))
            else:
                out.add((op, None))
    return frozenset(out)


def _describe(v: Value, size: int, span: tuple[int, int], ctx: _Context) -> PeakBuffer:
    dtype, shape = shape_of(v.shape_text)
    def_pos = span[0]
    phase = phase_at(ctx.phases, def_pos)
    m = re.search(r"\{(\d+)", v.name)
    value_index = int(m.group(1)) if m else None
    origin = _origin(ctx.hlo, v.instruction, value_index)
    if origin is not None and _is_entry_parameter(ctx.hlo, origin):
        number = _parameter_number(origin)
        if number is not None and number < len(ctx.arg_leaves):
            return _argument_buffer(v.name, size, span, number, origin, "copy of parameter", ctx)

    instr = ctx.hlo.instructions.get(v.instruction)
    op_name = instr.op_name if instr else ""
    producer = origin or instr
    prod_op = producer.op_name if producer is not None else op_name
    elements = int(np.prod(shape, dtype=np.int64)) if shape else 0
    stacked = (
        producer is not None and instr is not None and producer.computation != instr.computation
    )
    per_layer = elements // shape[0] if stacked and shape and shape[0] else elements

    backward = "transpose(" in prod_op
    forward = not backward and (
        "jvp(" in prod_op or (ctx.first_backward is not None and def_pos < ctx.first_backward)
    )
    recompute = "rematted_computation" in prod_op or ".remat" in v.instruction
    # Gradient accumulators are zero-filled broadcasts made outside any derivative (XLA
    # hoists them to the start with no op_name, or keeps jax's ``broadcast_in_dim``); shaped
    # like a parameter, they are gradients, in the accumulator's dtype, which need not be
    # the parameter's (an f32 accumulator of bf16 weights). Inside the loop that accumulates
    # them the value is the loop's parameter, and the broadcast its producer.
    # Under accumulation the sums are made in the accumulation loop's body, outside any
    # derivative and before the optimizer: ``jit(step)/while/body/.../add``.
    outside = not backward and "jvp(" not in prod_op and phase != "optimizer"
    zeros = outside and (
        any("broadcast" in n for n in (v.instruction, producer.name if producer else ""))
        or prod_op.startswith("jit(step)/while/")
    )
    if recompute:
        category = RECOMPUTE
    elif (backward and _is_gradient(shape, dtype, _params_of(prod_op, ctx.arg_leaves))) or (
        zeros and _is_gradient(shape, None, _params_of(prod_op, ctx.arg_leaves))
    ):
        category = GRADIENT
    elif ctx.first_backward is not None and forward and span[1] >= ctx.first_backward:
        category = SAVED_ACTIVATION
    else:
        category = TEMPORARY
    checkpoint, named_op = None, prod_op
    if category in (SAVED_ACTIVATION, RECOMPUTE) and producer is not None:
        checkpoint, named_op = _checkpoint_of(
            ctx, producer, per_layer, dtype, None if stacked else value_index
        )
    path = module_path(named_op)
    scanned = "/while" in op_name or "/while" in named_op
    layer = layer_of(path, scanned)
    carried = (v.instruction, None) in ctx.carried or (v.instruction, value_index) in ctx.carried
    if layer == NON_LAYER and (carried or phase == "optimizer"):
        # Made outside the layers' ops but shaped like one layer stack's weights: the scan's
        # gradient carry (zero-filled before the loop: every layer's gradient at once), or
        # in the optimizer, the stack's updated weights or optimizer state.
        layer = ctx.layer_of_shape.get(shape, layer)
    return PeakBuffer(
        name=v.name,
        size_bytes=size,
        shape=shape,
        dtype=dtype,
        category=category,
        op=producer.opcode if producer is not None else "?",
        op_name=named_op,
        module_path="/".join(path),
        checkpoint_name=checkpoint,
        layer=layer,
        live=span,
        phase=phase,
    )


_LOOK_THROUGH = {
    "bitcast",
    "copy",
    "convert",
    "reshape",
    "transpose",
    "slice",
    "reduce-precision",
    "broadcast",
    "async-done",
    "copy-done",
}


def _checkpoint_of(
    ctx: _Context,
    producer: Instr,
    elements: int,
    dtype: str,
    index: int | None = None,
) -> tuple[str | None, str]:
    """The checkpoint name of a producer's output, and the op_name that carries it.

    Walks from the op that writes the value towards the op that computed it, through
    fusions (into their root), layout ops, tuples and the update operand of a
    dynamic-update-slice (a scan stacking a layer's value), and stops at the first op
    whose module path and size match a tagged value, or at the first op that computes
    something else (then the value has no checkpoint name of its own).
    """
    hlo = ctx.hlo
    i: Instr | None = producer
    for _ in range(32):
        if i is None:
            break
        if i.op_name:
            key = module_path(i.op_name)
            src = hlo.instructions.get(i.operands[0]) if i.operands else None
            if i.window is not None and src is not None and src.op_name == i.op_name:
                # A slice named after the op it slices: sibling ops XLA merged into one keep
                # the first one's name (newer XLA; older XLA names each slice its own).
                key = sliced_sibling(ctx.tags, key, i.window, elements) or key
            name = match_tag(ctx.tags, key, elements, dtype)
            if name:
                return name, i.op_name
        op, nxt, nxt_index = i.opcode, None, None
        if i.calls and i.calls in hlo.roots and (op in ("fusion", "call") or "start" in op):
            nxt, nxt_index = hlo.roots[i.calls], index
        elif op == "tuple" and index is not None and index < len(i.operands):
            nxt = i.operands[index]
        elif op == "get-tuple-element" and i.operands:
            nxt, nxt_index = i.operands[0], i.index
        elif op == "dynamic-update-slice" and len(i.operands) > 1:
            nxt = i.operands[1]
        elif op in _LOOK_THROUGH and i.operands:
            nxt = i.operands[0]
        elif op == "parameter" and i.computation in hlo.callers:
            caller = hlo.instructions[hlo.callers[i.computation]]
            if i.index is None or i.index >= len(caller.operands):
                break
            nxt = caller.operands[i.index]
        elif op == "parameter" and i.computation in hlo.loops:
            # The loop's own input (a scan carry such as the layer input).
            name = match_tag(ctx.tags, INPUT_KEY, elements, dtype)
            return name, producer.op_name
        else:
            break
        if nxt is not None and nxt not in hlo.instructions and "#" in nxt:
            nxt, _, k = nxt.rpartition("#")  # newer HLO text: "%x#k" is element k of x
            nxt_index = int(k) if k.isdigit() else None
        i, index = hlo.instructions.get(nxt) if nxt else None, nxt_index
    return None, producer.op_name


def _origin(hlo: Hlo, name: str, index: int | None, depth: int = 0) -> Instr | None:
    """The instruction whose output a value holds, looking through loops, tuples, copies."""
    i = hlo.instructions.get(name)
    if i is None and "#" in name:  # newer HLO text: "%x#k" is element k of tuple x
        base, _, k = name.rpartition("#")
        if k.isdigit() and depth <= 12:
            return _origin(hlo, base, int(k), depth + 1)
    if i is None or depth > 12:
        return i
    layout = i.opcode == "fusion" and not i.op_name and len(i.operands) == 1
    if (i.opcode in ("copy", "bitcast", "async-done", "copy-done") or layout) and i.operands:
        return _origin(hlo, i.operands[0], index, depth + 1)
    if i.opcode == "get-tuple-element" and i.operands:
        return _origin(hlo, i.operands[0], i.index, depth + 1)
    if index is None:
        return i
    if i.opcode == "tuple" and index < len(i.operands):
        return _origin(hlo, i.operands[index], None, depth + 1)
    if i.opcode == "parameter" and i.computation in hlo.loops:
        loop = hlo.instructions[hlo.loops[i.computation]]
        return _origin(hlo, loop.operands[0], index, depth + 1) if loop.operands else i
    if i.opcode == "while" and i.body in hlo.roots:
        root = hlo.instructions[hlo.roots[i.body]]
        if root.opcode == "tuple" and index < len(root.operands):
            inner = _origin(hlo, root.operands[index], None, depth + 1)
            if inner is not None and not (
                inner.opcode == "parameter" and inner.computation == i.body
            ):
                return inner
            # A loop-invariant element: the loop hands its input back out.
            return _origin(hlo, i.operands[0], index, depth + 1) if i.operands else i
    return i


def _is_entry_parameter(hlo: Hlo, i: Instr) -> bool:
    return i.opcode == "parameter" and i.computation == hlo.entry


def _parameter_number(i: Instr) -> int | None:
    return i.index if i.opcode == "parameter" else None


def _params_of(op_name: str, arg_leaves: Sequence[ArgLeaf]) -> Sequence[ArgLeaf]:
    """The leaves a value made by ``op_name`` can be the gradient of.

    A gradient of a module's weight is made under that module's name, so an activation's
    gradient that only happens to share a weight's shape (batch x seq x width against
    layers x d_ff x width) is not taken for one. When the module holds no known leaf (an
    op outside the model, a model whose op names are not its parameter paths), every leaf.
    """
    module = module_path(op_name)[1:-1]  # drop the model's own name and the op
    if not module:
        return arg_leaves
    n = len(module)
    under = [
        leaf
        for leaf in arg_leaves
        if any(leaf.path[i : i + n] == module for i in range(len(leaf.path) - n + 1))
    ]
    return under or arg_leaves


def _is_gradient(shape: tuple[int, ...], dtype: str | None, arg_leaves: Sequence[ArgLeaf]) -> bool:
    """Shaped like a parameter (and of its dtype, unless ``dtype`` is None)."""
    squeeze = lambda dims: tuple(d for d in dims if d != 1)
    dims = squeeze(shape)
    return bool(dims) and any(
        leaf.category == PARAMETER
        and dims in map(squeeze, leaf.shapes)
        and (dtype is None or leaf.dtype == dtype)
        for leaf in arg_leaves
    )
