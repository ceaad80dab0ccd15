"""What is live at the peak of a compiled program, and when: XLA's buffer assignment, read.

``rk.memory_report`` says how many bytes a step needs; this module says which buffers
they are. The program is compiled for the target (deviceless for a GPU) with XLA's debug
dump switched on for that one compile (``compiler_options={"xla_dump_to": DIR}``, a
temporary directory removed afterwards). Three files of the dump are read:

- ``*after_optimizations-buffer-assignment.txt``: every allocation (parameter,
  output, preallocated temp) and the HLO values placed in it, with size and offset;
- ``*after_optimizations-live-range.txt``: the schedule (``InstructionSequence``) and
  each value's live range in it (``BufferLiveRange``);
- ``*after_optimizations.txt``: the optimized HLO, whose op metadata (``op_name``)
  holds the jax name stack: the Flax module path, ``jvp(...)`` for the forward pass,
  ``transpose(...)`` for the backward pass and ``rematted_computation`` for
  recomputed ops.

Checkpoint names (``checkpoint_name`` tags) do not reach HLO; they are recovered from
the jaxpr, whose tagged values are matched to HLO ops by module path and op.

How the figures relate. ``peak_bytes`` is memory_report's figure, argument + output +
temp - alias, read from the same compile. XLA places temporaries in one preallocated
block; buffers live at different times cannot always be packed without gaps, so the most
bytes live at any one instant (``live_peak_bytes``, from the live ranges) is at most
``peak_bytes``. The difference is reported as the category ``fragmentation``, so the
categories add up to ``peak_bytes``.

The dump files are XLA debug output and change between versions (this was written
against jax 0.10.2 and 0.12.0.1). Every line of the sections read is parsed strictly;
a line that cannot be read raises :class:`InspectError` naming the file and line.

Example:
  >>> import jax, jax.numpy as jnp, remat_kit as rk
  >>> x = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16)
  >>> r = rk.inspect(lambda a: (a @ a) @ a, x, target="h100")  # doctest: +SKIP
  >>> sum(r.by_category.values()) == r.peak_bytes  # doctest: +SKIP
  True
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import os
import re
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from remat_kit.errors import InspectError
from remat_kit.targets import Target, as_target

__all__ = [
    "CATEGORIES",
    "TRAIN_STEP_CATEGORIES",
    "InspectError",
    "PeakBuffer",
    "PeakDiff",
    "PeakReport",
    "Phase",
    "add_inspect_parser",
    "diff",
    "inspect",
    "inspect_step",
    "plot_timeline",
    "run_inspect",
]

PARAMETER = "parameter"
GRADIENT = "gradient"
OPTIMIZER_STATE = "optimizer state"
INPUT = "input"
SAVED_ACTIVATION = "saved activation"
RECOMPUTE = "recomputation workspace"
TEMPORARY = "other temporaries"
FRAGMENTATION = "fragmentation"

#: Every category a byte at the peak can fall in, in display order. ``fragmentation``
#: is reserved by XLA's packed temp block but holds no live buffer at the peak.
CATEGORIES: tuple[str, ...] = (
    PARAMETER,
    GRADIENT,
    OPTIMIZER_STATE,
    INPUT,
    SAVED_ACTIVATION,
    RECOMPUTE,
    TEMPORARY,
    FRAGMENTATION,
)

#: Argument index -> category for ``rk.build_train_step``'s ``(trainable, frozen,
#: opt_state, batch)``.
TRAIN_STEP_CATEGORIES: Mapping[int, str] = {
    0: PARAMETER,
    1: PARAMETER,
    2: OPTIMIZER_STATE,
    3: INPUT,
}

_ARGUMENT_CATEGORIES = (PARAMETER, OPTIMIZER_STATE, INPUT)


@dataclasses.dataclass(frozen=True)
class Phase:
    """A span of the schedule: ``forward``, ``backward``, ``optimizer`` or ``program``.

    Attributes:
      name: the phase.
      start: first schedule position (inclusive).
      end: last schedule position (inclusive).
    """

    name: str
    start: int
    end: int


@dataclasses.dataclass(frozen=True)
class PeakBuffer:
    """One buffer live at the peak.

    Attributes:
      name: XLA's value name (``<instruction>{<tuple index>}``).
      size_bytes: bytes it occupies.
      shape: its shape (empty for tuples and scalars).
      dtype: element type as XLA writes it (``bf16``, ``f32``, ``tuple``...).
      category: one of ``CATEGORIES`` (never ``fragmentation``).
      op: the producing HLO instruction's opcode or fusion kind, e.g. ``fusion``.
      op_name: the jax op_name of the producing op ('' when XLA kept none); for a
        scanned layer's stacked output, the op inside the loop body that made it.
      module_path: the Flax module path from op_name, transforms stripped, e.g.
        ``Llama/decoder/LlamaBlock/attention/query``; for arguments, the argument path.
      checkpoint_name: the ``checkpoint_name`` tag of a saved activation or of what a
        recomputation rebuilds, when it has one ("a|b" when two tags fit equally).
      layer: ``layers_3`` for an unrolled layer, ``scanned layers`` for buffers of a
        scanned stack, else ``non-layer``.
      live: (first, last) schedule positions where it is live.
      phase: the phase its producing op runs in.
    """

    name: str
    size_bytes: int
    shape: tuple[int, ...]
    dtype: str
    category: str
    op: str
    op_name: str
    module_path: str
    checkpoint_name: str | None
    layer: str
    live: tuple[int, int]
    phase: str

    @property
    def label(self) -> str:
        """What a reader calls this buffer: its checkpoint name, else its module path/op."""
        if self.checkpoint_name:
            return self.checkpoint_name
        return self.module_path or self.name


@dataclasses.dataclass(frozen=True)
class PeakReport:
    """What is live at the peak of one compiled program, and when (per device).

    Attributes:
      target: target name.
      peak_bytes: argument + output + temp - alias, as ``rk.memory_report`` reports it
        for the same program.
      live_peak_bytes: the most bytes live at one schedule position (buffers + arguments).
      fragmentation_bytes: ``peak_bytes - live_peak_bytes``: reserved by XLA's packed
        temp block but free at the peak.
      peak_position: schedule position of the live peak.
      peak_instruction: HLO instruction scheduled there; ``peak_op_name`` its op_name.
      peak_phase: the phase of the peak (``forward``, ``backward``, ``optimizer``).
      schedule_length: number of positions in the schedule.
      argument_bytes, output_bytes, temp_bytes, alias_bytes: XLA's memory analysis.
      xla_peak_bytes: XLA's own ``peak_memory_in_bytes`` when the jaxlib reports it.
      xla_live_peak_bytes: the "Live ranges at N (peak)" total of XLA's live-range
        dump, when present (a cross-check of ``live_peak_bytes``).
      buffers: every buffer live at the peak, largest first.
      by_category: bytes by category at the peak; sums to ``peak_bytes``.
      by_layer: bytes by layer at the peak (``fragmentation`` included); sums to
        ``peak_bytes``.
      timeline: live bytes at each schedule position.
      phases: the phases told apart (empty when the program has no backward pass).
      module: the HLO module name; ``jax_version`` the jax that compiled it.
      compile_seconds: lowering + compiling with the dump; ``parse_seconds`` reading it.
      meta: labels set by the caller (model, policy, batch, ...).
    """

    target: str
    peak_bytes: int
    live_peak_bytes: int
    fragmentation_bytes: int
    peak_position: int
    peak_instruction: str
    peak_op_name: str
    peak_phase: str
    schedule_length: int
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    xla_peak_bytes: int | None
    xla_live_peak_bytes: int | None
    buffers: tuple[PeakBuffer, ...]
    by_category: Mapping[str, int]
    by_layer: Mapping[str, int]
    timeline: tuple[int, ...]
    phases: tuple[Phase, ...]
    module: str
    jax_version: str
    compile_seconds: float
    parse_seconds: float
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def top(self, n: int = 10) -> tuple[PeakBuffer, ...]:
        """The ``n`` largest buffers live at the peak."""
        return self.buffers[:n]

    def by_label(self, categories: Sequence[str] | None = None) -> dict[tuple[str, str], int]:
        """Bytes at the peak by (category, label); ``categories`` filters."""
        out: dict[tuple[str, str], int] = {}
        for b in self.buffers:
            if categories is None or b.category in categories:
                key = (b.category, b.label)
                out[key] = out.get(key, 0) + b.size_bytes
        return out

    def replace(self, **changes: Any) -> PeakReport:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field."""
        out = dataclasses.asdict(self)
        out["buffers"] = [
            {**dataclasses.asdict(b), "shape": list(b.shape), "live": list(b.live)}
            for b in self.buffers
        ]
        out["by_category"] = dict(self.by_category)
        out["by_layer"] = dict(self.by_layer)
        out["timeline"] = list(self.timeline)
        out["phases"] = [dataclasses.asdict(p) for p in self.phases]
        out["meta"] = dict(self.meta)
        return out


@dataclasses.dataclass(frozen=True)
class PeakDiff:
    """What the second report keeps at its peak that the first does not.

    Attributes:
      peak_delta: ``b.peak_bytes - a.peak_bytes``.
      by_category: category -> bytes in ``b`` minus bytes in ``a`` (at each one's peak).
      kept: ``(category, label, bytes_a, bytes_b)`` rows where ``b`` holds more, largest
        difference first; the label is the checkpoint name or the module path/op.
      dropped: the same rows where ``a`` holds more.
      peak_phases: (phase of a's peak, phase of b's peak).
    """

    peak_delta: int
    by_category: Mapping[str, int]
    kept: tuple[tuple[str, str, int, int], ...]
    dropped: tuple[tuple[str, str, int, int], ...]
    peak_phases: tuple[str, str]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        rows = lambda rs: [
            {"category": c, "label": lab, "bytes_a": x, "bytes_b": y, "delta": y - x}
            for c, lab, x, y in rs
        ]
        return {
            "peak_delta": self.peak_delta,
            "by_category": dict(self.by_category),
            "kept": rows(self.kept),
            "dropped": rows(self.dropped),
            "peak_phases": list(self.peak_phases),
        }


# --------------------------------------------------------------------------- compile


def inspect(
    fn: Callable[..., Any],
    *args: Any,
    target: Target | str = "h100-80gb",
    donate_argnums: int | Sequence[int] = (),
    categories: Mapping[int, str] | None = None,
    meta: Mapping[str, Any] | None = None,
    keep_dump: str | os.PathLike[str] | None = None,
) -> PeakReport:
    """Compiles ``fn(*args)`` for ``target`` and reports what is live at its peak.

    Args:
      fn: a jittable callable (typically a train step).
      *args: arrays or ``jax.ShapeDtypeStruct`` pytrees; nothing is allocated.
      target: a Target or target name; GPU targets compile deviceless.
      donate_argnums: arguments whose buffers the outputs may reuse, as for
        ``rk.memory_report`` (the compile must be the same to report the same peak).
      categories: argument index -> ``"parameter"``, ``"optimizer state"`` or
        ``"input"``; arguments not named are ``"input"``. Gradients are recognised
        as backward-pass buffers shaped like a ``"parameter"`` leaf. Use
        ``TRAIN_STEP_CATEGORIES`` for ``rk.build_train_step``'s step.
      meta: labels kept in the report (model, policy, ...).
      keep_dump: a directory to dump into and keep (for debugging); default a
        temporary directory, removed before returning.

    Returns:
      The PeakReport.

    Raises:
      InspectError: XLA wrote no dump, a dump line could not be read (the message names
        file and line), or the dump disagrees with the memory analysis.
      ValueError: ``categories`` names an unknown category or argument.

    Example:
      >>> import models, remat_kit as rk
      >>> cfg = models.get_config("tiny-llama", policy="minimal")
      >>> step = rk.build_train_step(models.build(cfg), rk.TrainConfig(batch=2, seq=64))
      >>> r = rk.inspect(step.fn, *step.args, target="h100", donate_argnums=step.donate_argnums,
      ...                categories=rk.TRAIN_STEP_CATEGORIES)  # doctest: +SKIP
      >>> r.top(3)[0].category  # doctest: +SKIP
      'saved activation'
    """
    t = as_target(target)
    cats = _check_categories(categories, len(args))
    from remat_kit.analysis import abstract

    sharding = t.sharding()
    abstract_args = tuple(abstract(a, sharding) for a in args)
    leaves_per_arg = [jax.tree.leaves(a) for a in abstract_args]

    start = time.perf_counter()
    jitted = jax.jit(fn, donate_argnums=donate_argnums)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*donated buffers were not usable.*")
        lowered = jitted.lower(*abstract_args)
        kept = _kept_leaves(lowered, sum(len(x) for x in leaves_per_arg))
        if keep_dump is not None:
            Path(keep_dump).mkdir(parents=True, exist_ok=True)
            compiled = lowered.compile(compiler_options=_dump_options(str(keep_dump)))
            dump = _DumpFiles.find(str(keep_dump), _module_name(compiled))
            texts = dump.read()
        else:
            with tempfile.TemporaryDirectory(prefix="remat_kit_inspect_") as tmp:
                compiled = lowered.compile(compiler_options=_dump_options(tmp))
                dump = _DumpFiles.find(tmp, _module_name(compiled))
                texts = dump.read()
    compile_seconds = time.perf_counter() - start
    stats = compiled.memory_analysis()

    start = time.perf_counter()
    tags = _tag_index(jax.make_jaxpr(fn)(*abstract_args))
    arg_leaves = _argument_leaves(leaves_per_arg, kept, cats)
    report = _analyse(texts, dump, stats, arg_leaves, tags, t.name)
    return report.replace(
        compile_seconds=compile_seconds,
        parse_seconds=time.perf_counter() - start,
        meta=dict(meta or {}),
    )


def inspect_step(
    step: Any,
    target: Target | str = "h100-80gb",
    *,
    meta: Mapping[str, Any] | None = None,
) -> PeakReport:
    """``inspect`` for a ``rk.build_train_step`` step (its donation and categories).

    Args:
      step: a ``rk.TrainStep``.
      target: a Target or target name.
      meta: labels kept in the report.

    Returns:
      The PeakReport.

    Example:
      >>> r = rk.inspect_step(step, "h100")  # doctest: +SKIP
    """
    return inspect(
        step.fn,
        *step.args,
        target=target,
        donate_argnums=step.donate_argnums,
        categories=TRAIN_STEP_CATEGORIES,
        meta=meta,
    )


def _dump_options(directory: str) -> dict[str, Any]:
    # Only the dump location is needed: text HLO (with metadata), the buffer assignment
    # and the live ranges are dumped by default on both jax 0.10 and 0.12.
    return {"xla_dump_to": directory, "xla_dump_hlo_as_text": True}


def _module_name(compiled: Any) -> str | None:
    try:
        first = compiled.as_text().split("\n", 1)[0]
    except Exception:  # as_text is a debugging API; the file name is the fallback
        return None
    m = re.match(r"HloModule\s+([^\s,]+)", first)
    return m.group(1) if m else None


def _kept_leaves(lowered: Any, n: int) -> list[int]:
    # jit drops unused arguments; the HLO parameters are the kept leaves, in order.
    kept = None
    lowering = getattr(lowered, "_lowering", None)
    compile_args = getattr(lowering, "compile_args", None)
    if isinstance(compile_args, Mapping):
        kept = compile_args.get("kept_var_idx")
    if kept is None:
        return list(range(n))
    return sorted(int(i) for i in kept)


def _check_categories(categories: Mapping[int, str] | None, n_args: int) -> dict[int, str]:
    cats = dict(categories or {})
    for index, cat in cats.items():
        if cat not in _ARGUMENT_CATEGORIES:
            raise ValueError(
                f"argument {index} has category {cat!r}; arguments are one of "
                f"{', '.join(_ARGUMENT_CATEGORIES)}"
            )
        if not isinstance(index, int) or not 0 <= index < n_args:
            raise ValueError(f"categories names argument {index!r}; fn has {n_args} arguments")
    return {i: cats.get(i, INPUT) for i in range(n_args)}


@dataclasses.dataclass(frozen=True)
class _ArgLeaf:
    argnum: int
    category: str
    shape: tuple[int, ...]
    dtype: str
    elements: int


def _argument_leaves(
    leaves_per_arg: Sequence[Sequence[Any]], kept: Sequence[int], cats: Mapping[int, str]
) -> list[_ArgLeaf]:
    flat = []
    for argnum, leaves in enumerate(leaves_per_arg):
        for leaf in leaves:
            shape = tuple(int(d) for d in leaf.shape)
            flat.append(
                _ArgLeaf(
                    argnum,
                    cats[argnum],
                    shape,
                    _xla_dtype(np.dtype(leaf.dtype)),
                    int(np.prod(shape, dtype=np.int64)),
                )
            )
    return [flat[i] for i in kept]


def _xla_dtype(dtype: np.dtype) -> str:
    name = dtype.name
    table = {
        "bfloat16": "bf16",
        "float16": "f16",
        "float32": "f32",
        "float64": "f64",
        "bool": "pred",
        "complex64": "c64",
        "complex128": "c128",
    }
    if name in table:
        return table[name]
    m = re.match(r"(u?)int(\d+)$", name)
    if m:
        return f"{'u' if m.group(1) else 's'}{m.group(2)}"
    return name


# --------------------------------------------------------------------------- dump files


@dataclasses.dataclass(frozen=True)
class _DumpFiles:
    buffer_assignment: str
    live_range: str
    hlo: str

    @staticmethod
    def find(directory: str, module: str | None) -> _DumpFiles:
        found = sorted(
            glob.glob(os.path.join(directory, "*after_optimizations-buffer-assignment.txt"))
        )
        if module is not None and len(found) > 1:
            named = [f for f in found if f".{module}." in os.path.basename(f)]
            found = named or found
        if not found:
            listing = sorted(os.listdir(directory))[:12]
            raise InspectError(
                f"XLA wrote no '*after_optimizations-buffer-assignment.txt' to {directory} "
                f"(jax {jax.__version__}; files there: {', '.join(listing) or 'none'}): this "
                "jaxlib does not dump its buffer assignment for xla_dump_to"
            )
        if len(found) > 1:
            raise InspectError(
                f"XLA dumped {len(found)} modules to {directory} and none is named "
                f"{module!r}: {', '.join(os.path.basename(f) for f in found)}"
            )
        stem = found[0][: -len("-buffer-assignment.txt")]
        files = _DumpFiles(found[0], stem + "-live-range.txt", stem + ".txt")
        for path in (files.live_range, files.hlo):
            if not os.path.exists(path):
                raise InspectError(
                    f"XLA dumped {os.path.basename(found[0])} but not {os.path.basename(path)} "
                    f"(jax {jax.__version__})"
                )
        return files

    def read(self) -> dict[str, list[str]]:
        out = {}
        for path in (self.buffer_assignment, self.live_range, self.hlo):
            with open(path, encoding="utf-8", errors="replace") as f:
                out[path] = f.read().splitlines()
        return out


def _fail(path: str, lineno: int, line: str, what: str) -> InspectError:
    shown = line if len(line) <= 160 else line[:157] + "..."
    return InspectError(
        f"{os.path.basename(path)}:{lineno}: cannot read {what} (jax {jax.__version__}); "
        f"the line is: {shown!r}"
    )


@dataclasses.dataclass(frozen=True)
class _Allocation:
    index: int
    size: int
    parameter: int | None
    kinds: frozenset[str]


@dataclasses.dataclass(frozen=True)
class _Value:
    name: str  # instruction{index}
    instruction: str
    allocation: int
    size: int
    offset: int
    shape_text: str


_ALLOC = re.compile(r"^allocation (\d+): size (\d+)(?:, (.*))?:\s*$")
_VALUE = re.compile(
    r"^ value: <\d+ ([^\s{}<>]+)(\{[\d,]*\})?(?: \(phi\))? @\d+> "
    r"\(size=(\d+),offset=(\d+)\): (.*)$"
)
_ALLOC_KINDS = ("thread-local", "constant", "preallocated-temp", "maybe-live-out", "output")


def _parse_buffer_assignment(
    path: str, lines: Sequence[str]
) -> tuple[dict[int, _Allocation], list[_Value]]:
    allocs: dict[int, _Allocation] = {}
    values: list[_Value] = []
    current: int | None = None
    started = False
    for lineno, line in enumerate(lines, 1):
        if not started:
            if line.strip() == "BufferAssignment:":
                started = True
                continue
            if line.strip():
                raise _fail(path, lineno, line, "the 'BufferAssignment:' header")
            continue
        if not line.strip():
            continue
        if line.startswith("allocation "):
            m = _ALLOC.match(line)
            if not m:
                raise _fail(path, lineno, line, "an allocation header")
            attrs = m.group(3) or ""
            param = re.search(r"(?:^|, )parameter (\d+)", attrs)
            kinds = frozenset(k for k in _ALLOC_KINDS if k in attrs)
            current = int(m.group(1))
            allocs[current] = _Allocation(
                current, int(m.group(2)), int(param.group(1)) if param else None, kinds
            )
            continue
        if line.startswith(" value:"):
            m = _VALUE.match(line)
            if not m or current is None:
                raise _fail(path, lineno, line, "a value line")
            instr, index = m.group(1), m.group(2) or "{}"
            values.append(
                _Value(instr + index, instr, current, int(m.group(3)), int(m.group(4)), m.group(5))
            )
            continue
        # Anything after the allocations (newer XLAs may add sections) ends the list.
        if not line.startswith(" "):
            break
        raise _fail(path, lineno, line, "a buffer-assignment line")
    if not allocs:
        raise InspectError(f"{os.path.basename(path)}: no allocations found")
    return allocs, values


@dataclasses.dataclass(frozen=True)
class _LiveRanges:
    sequence: tuple[str, ...]
    ranges: Mapping[str, tuple[int, int]]
    xla_peak: tuple[int, int] | None  # (position, bytes)


_SEQ = re.compile(r"^\s+(\d+):(\S+)\s*$")
_RANGE = re.compile(r"^\s+(\S+?\{[\d,]*\}):(\d+)-(\d+)\s*$")
_PEAK_HEAD = re.compile(r"^\s+Live ranges at (\d+) \(peak\):\s*$")
_PEAK_LINE = re.compile(r"^\s+\S+: (\d+) bytes \(cumulative: (\d+) bytes\)\s*$")


def _parse_live_range(path: str, lines: Sequence[str]) -> _LiveRanges:
    sequence: list[str] = []
    ranges: dict[str, tuple[int, int]] = {}
    section = None
    peak_at, peak_bytes = None, None
    header = False
    for lineno, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped:
            continue
        if not header:
            if not stripped.startswith("HloLiveRange"):
                raise _fail(path, lineno, line, "the 'HloLiveRange' header")
            header = True
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent <= 2:
            m = _PEAK_HEAD.match(line)
            if stripped == "InstructionSequence:":
                section = "sequence"
            elif stripped == "BufferLiveRange:":
                section = "ranges"
            elif m:
                section, peak_at = "peak", int(m.group(1))
            else:
                section = "other"  # e.g. "Stack trace breakdown ...": not needed
            continue
        if section == "sequence":
            m = _SEQ.match(line)
            if not m or int(m.group(1)) != len(sequence):
                raise _fail(path, lineno, line, "an InstructionSequence entry")
            sequence.append(m.group(2))
        elif section == "ranges":
            m = _RANGE.match(line)
            if not m:
                raise _fail(path, lineno, line, "a BufferLiveRange entry")
            ranges[m.group(1)] = (int(m.group(2)), int(m.group(3)))
        elif section == "peak":
            m = _PEAK_LINE.match(line)
            if not m:
                raise _fail(path, lineno, line, "a peak live-range entry")
            peak_bytes = int(m.group(2))
    if not sequence or not ranges:
        raise InspectError(
            f"{os.path.basename(path)}: no InstructionSequence or BufferLiveRange section"
        )
    peak = (peak_at, peak_bytes) if peak_at is not None and peak_bytes is not None else None
    return _LiveRanges(tuple(sequence), ranges, peak)


@dataclasses.dataclass(frozen=True)
class _Instr:
    name: str
    computation: str
    opcode: str
    operands: tuple[str, ...]
    op_name: str
    body: str | None
    calls: str | None
    index: int | None


@dataclasses.dataclass(frozen=True)
class _Hlo:
    instructions: Mapping[str, _Instr]
    roots: Mapping[str, str]  # computation -> root instruction
    computations: Mapping[str, tuple[str, ...]]  # computation -> its instructions
    entry: str | None
    loops: Mapping[str, str]  # while body computation -> the while instruction
    callers: Mapping[str, str]  # fused/async computation -> the instruction calling it


_INSTR = re.compile(r"^\s+(ROOT\s+)?%?([^\s=%]+)\s*=\s*(.*)$")
_COMP = re.compile(r"^(?:ENTRY\s+)?%?([^\s(]+)\s.*\{\s*$")
_OPNAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')


def _parse_hlo(path: str, lines: Sequence[str]) -> _Hlo:
    instrs: dict[str, _Instr] = {}
    roots: dict[str, str] = {}
    comps: dict[str, list[str]] = {}
    comp = None
    entry = None
    for lineno, line in enumerate(lines, 1):
        if not line.strip() or line.startswith(("HloModule", "//")):
            continue
        if not line.startswith(" "):
            if line.strip() == "}":
                comp = None
                continue
            m = _COMP.match(line)
            if m:
                comp = m.group(1)
                comps.setdefault(comp, [])
                if line.startswith("ENTRY"):
                    entry = comp
            # Other top-level lines (FileNames, StackFrames tables...) are not needed.
            continue
        if comp is None:
            continue  # indented lines of a trailing table
        m = _INSTR.match(line)
        if not m:
            raise _fail(path, lineno, line, "an HLO instruction")
        root, name, rest = bool(m.group(1)), m.group(2), m.group(3)
        parsed = _split_instruction(rest)
        if parsed is None:
            raise _fail(path, lineno, line, "an HLO instruction's shape and opcode")
        opcode, operand_text, attrs = parsed
        op_name = _OPNAME.search(attrs)
        body = re.search(r"\bbody=%?([^\s,}]+)", attrs)
        calls = re.search(r"\bcalls=%?([^\s,}]+)", attrs)
        index = re.search(r"\bindex=(\d+)", attrs)
        instrs[name] = _Instr(
            name,
            comp,
            opcode,
            tuple(re.findall(r"%([^\s,()]+)", operand_text)),
            op_name.group(1).replace("\\'", "'").replace('\\"', '"') if op_name else "",
            body.group(1) if body else None,
            calls.group(1) if calls else None,
            int(operand_text)
            if opcode == "parameter" and operand_text.strip().isdigit()
            else int(index.group(1))
            if index
            else None,
        )
        comps[comp].append(name)
        if root:
            roots[comp] = name
    if not instrs:
        raise InspectError(f"{os.path.basename(path)}: no HLO instructions found")
    loops = {i.body: i.name for i in instrs.values() if i.opcode == "while" and i.body}
    callers = {i.calls: i.name for i in instrs.values() if i.calls}
    return _Hlo(instrs, roots, {c: tuple(v) for c, v in comps.items()}, entry, loops, callers)


def _split_instruction(rest: str) -> tuple[str, str, str] | None:
    # "<shape> <opcode>(<operands>), attr=..., metadata={...}"; a tuple shape is
    # parenthesised and may hold /*index=N*/ comments.
    i = _closing(rest, 0) + 1 if rest.startswith("(") else rest.find(" ")
    if i <= 0:
        return None
    m = re.compile(r"\s*([A-Za-z][\w\-]*)\(").match(rest, i)
    if not m:
        return None
    j = _closing(rest, m.end() - 1)
    return m.group(1), rest[m.end() : j], rest[j + 1 :]


def _closing(text: str, start: int) -> int:
    """Index of the parenthesis closing the one at ``start`` (or the text's end)."""
    depth = 0
    for j in range(start, len(text)):
        depth += text[j] == "("
        depth -= text[j] == ")"
        if depth == 0:
            return j
    return len(text)


# --------------------------------------------------------------------------- names


_STRUCTURAL = {
    "while",
    "body",
    "cond",
    "closed_call",
    "core_call",
    "checkpoint",
    "remat",
    "remat2",
    "rematted_computation",
    "eval_jaxpr",
    "scan",
    "custom_jvp_call",
    "custom_vjp_call",
}
_WRAPPER = re.compile(r"^(?:jvp|transpose|vmap|batched|remat|checkpoint)\((.*)\)$")


def _module_path(op_name: str) -> tuple[str, ...]:
    """jax op_name/name stack -> Flax module path and op, transforms and calls stripped."""
    out = []
    for seg in op_name.split("/"):
        while True:
            m = _WRAPPER.match(seg)
            if not m:
                break
            seg = m.group(1)
        if not seg or seg in _STRUCTURAL or seg.startswith(("jit(", "pjit(")):
            continue
        out.append(seg)
    return tuple(out)


_INPUT_KEY = ("<input>",)
_PASS_THROUGH = {"convert_element_type", "reduce_precision", "copy", "copy_p", "reshape", "squeeze"}


@dataclasses.dataclass(frozen=True)
class _Tag:
    name: str
    elements: int
    dtype: str


def _tag_index(closed: Any) -> dict[tuple[str, ...], list[_Tag]]:
    """Module path + op of each tagged value's producer -> its checkpoint names."""
    from jax.extend import core

    index: dict[tuple[str, ...], list[_Tag]] = {}

    def walk(jaxpr: Any, prefix: str) -> None:
        producers: dict[Any, Any] = {}
        for eqn in jaxpr.eqns:
            stack = f"{prefix}/{eqn.source_info.name_stack}"
            for v in eqn.outvars:
                producers[v] = eqn
            if eqn.primitive.name == "name" and "name" in eqn.params:
                src = eqn.invars[0]
                prod = producers.get(src)
                while prod is not None and prod.primitive.name in _PASS_THROUGH:
                    keys = [
                        _module_path(
                            f"{prefix}/{prod.source_info.name_stack}/{prod.primitive.name}"
                        )
                    ]
                    _add_tag(index, keys[0], eqn.params["name"], src.aval)
                    src = prod.invars[0]
                    prod = producers.get(src)
                if prod is not None:
                    key = _module_path(
                        f"{prefix}/{prod.source_info.name_stack}/{prod.primitive.name}"
                    )
                    _add_tag(index, key, eqn.params["name"], src.aval)
                elif hasattr(src, "aval"):  # a tagged input of a (scan) body
                    _add_tag(index, _INPUT_KEY, eqn.params["name"], src.aval)
            for param in eqn.params.values():
                for sub in param if isinstance(param, (list, tuple)) else (param,):
                    if isinstance(sub, core.ClosedJaxpr):
                        walk(sub.jaxpr, stack)
                    elif isinstance(sub, core.Jaxpr):
                        walk(sub, stack)

    walk(closed.jaxpr, "")
    return index


def _add_tag(
    index: dict[tuple[str, ...], list[_Tag]], key: tuple[str, ...], name: str, aval: Any
) -> None:
    if not key or not hasattr(aval, "shape"):
        return
    tag = _Tag(
        str(name), int(np.prod(aval.shape, dtype=np.int64)), _xla_dtype(np.dtype(aval.dtype))
    )
    entries = index.setdefault(key, [])
    if tag not in entries:
        entries.append(tag)


def _match_tag(
    tags: Mapping[tuple[str, ...], list[_Tag]], key: tuple[str, ...], elements: int, dtype: str
) -> str | None:
    names = sorted(
        {t.name for t in tags.get(key, ()) if t.elements == elements and t.dtype == dtype}
    )
    if not names:
        # The same op in another dtype (a convert fused into the producer).
        names = sorted({t.name for t in tags.get(key, ()) if t.elements == elements})
    return "|".join(names) if names else None


_LAYER = re.compile(r"^(?:\w*?layers?|\w*?blocks?|h)_\d+$", re.IGNORECASE)
_STACK = re.compile(r"^(?:\w*?layers?|\w*?blocks?|h)$", re.IGNORECASE)


def _layer_of(path: Sequence[str], scanned: bool) -> str:
    for seg in path:
        if _LAYER.match(seg):
            return seg
    if scanned:
        return "scanned layers"
    return "non-layer"


# --------------------------------------------------------------------------- analysis


_SHAPE = re.compile(r"^([a-z]\w*)\[([\d,]*)\]")


def _shape_of(text: str) -> tuple[str, tuple[int, ...]]:
    if text.startswith("("):
        return "tuple", ()
    m = _SHAPE.match(text)
    if not m:
        return "?", ()
    dims = tuple(int(d) for d in m.group(2).split(",") if d)
    return m.group(1), dims


def _phases(sequence: Sequence[str], hlo: _Hlo) -> tuple[Phase, ...]:
    """Forward / backward / optimizer spans, split where the op_names change most clearly.

    Each op is labelled by its jax name stack: ``transpose(`` backward, ``jvp(`` forward,
    anything else other (the optimizer after the backward pass). XLA hoists a few ops out
    of place (zero-initialised gradient accumulators, RoPE tables), so each boundary is
    the split that agrees with the most labels, not the first op of a kind.
    """
    labels = []
    for name in sequence:
        i = hlo.instructions.get(name)
        op = i.op_name if i is not None else ""
        labels.append("b" if "transpose(" in op else "f" if "jvp(" in op else "o" if op else "")
    n = len(labels)
    if "b" not in labels:
        return ()
    first = _split(labels, "f", "b", 0, n)
    last_b = max(i for i, x in enumerate(labels) if x == "b")
    second = _split(labels, "b", "o", first, last_b + 2 if last_b + 1 < n else n)
    out = []
    if first > 0:
        out.append(Phase("forward", 0, first - 1))
    out.append(Phase("backward", first, second - 1))
    if second < n:
        out.append(Phase("optimizer", second, n - 1))
    return tuple(out)


def _split(labels: Sequence[str], before: str, after: str, lo: int, hi: int) -> int:
    # The k in [lo, hi] maximising (#before in [lo, k)) + (#after in [k, hi)).
    best, best_k = -1, lo
    score = sum(1 for x in labels[lo:hi] if x == after)
    for k in range(lo, hi + 1):
        if score > best:
            best, best_k = score, k
        if k < hi:
            score += (labels[k] == before) - (labels[k] == after)
    return best_k


def _phase_at(phases: Sequence[Phase], position: int) -> str:
    for p in phases:
        if p.start <= position <= p.end:
            return p.name
    return "program"


@dataclasses.dataclass(frozen=True)
class _Live:
    """Values that occupy device memory, as arrays: address interval and live span."""

    values: tuple[_Value, ...]
    lo: np.ndarray  # global address of the first byte
    hi: np.ndarray  # one past the last byte
    start: np.ndarray
    end: np.ndarray
    temp: np.ndarray  # in the preallocated temp block
    fixed_bytes: int  # parameter allocations, held for the whole program


def _live_values(
    values: Sequence[_Value], allocs: Mapping[int, _Allocation], live: _LiveRanges, n: int
) -> _Live:
    base, at = {}, 0
    for a in sorted(allocs.values(), key=lambda a: a.index):
        base[a.index] = at
        at += a.size
    kept = []
    for v in values:
        a = allocs[v.allocation]
        if a.parameter is not None or a.kinds & {"thread-local", "constant"} or v.size == 0:
            continue
        if v.name not in live.ranges:
            continue
        s, e = live.ranges[v.name]
        if max(s, 0) <= min(e, n - 1):
            kept.append((v, max(s, 0), min(e, n - 1)))
    fixed = sum(a.size for a in allocs.values() if a.parameter is not None)
    lo = np.array([base[v.allocation] + v.offset for v, _, _ in kept], dtype=np.int64)
    return _Live(
        tuple(v for v, _, _ in kept),
        lo,
        lo + np.array([v.size for v, _, _ in kept], dtype=np.int64),
        np.array([s for _, s, _ in kept], dtype=np.int64),
        np.array([e for _, _, e in kept], dtype=np.int64),
        np.array(["preallocated-temp" in allocs[v.allocation].kinds for v, _, _ in kept]),
        fixed,
    )


def _union_bytes(lo: np.ndarray, hi: np.ndarray) -> int:
    """Bytes covered by the union of address intervals [lo, hi)."""
    if lo.size == 0:
        return 0
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    reach = np.maximum.accumulate(hi)
    prev = np.concatenate(([lo[0]], reach[:-1]))
    return int(np.maximum(hi - np.maximum(lo, prev), 0).sum())


def _timeline(lv: _Live, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Bytes occupied at each position (all memory, and the temp block alone).

    Buffers may share addresses while both are live (an op writing its output over an
    operand that dies there), so occupancy is the union of address ranges, not a sum.
    """
    total = np.zeros(n, dtype=np.int64)
    temp = np.zeros(n, dtype=np.int64)
    for t in range(n):
        mask = (lv.start <= t) & (lv.end >= t)
        total[t] = _union_bytes(lv.lo[mask], lv.hi[mask])
        tm = mask & lv.temp
        temp[t] = _union_bytes(lv.lo[tm], lv.hi[tm])
    return total + lv.fixed_bytes, temp


def _attribute(lv: _Live, t: int) -> list[tuple[_Value, int, tuple[int, int]]]:
    """Values live at ``t`` and the bytes each holds alone: a newer value owns the
    addresses it shares with an older one."""
    idx = np.nonzero((lv.start <= t) & (lv.end >= t))[0]
    order = sorted(idx, key=lambda i: (-int(lv.start[i]), -int(lv.hi[i] - lv.lo[i])))
    covered: list[tuple[int, int]] = []
    out = []
    for i in order:
        lo, hi = int(lv.lo[i]), int(lv.hi[i])
        own = hi - lo
        for c_lo, c_hi in covered:
            own -= max(0, min(hi, c_hi) - max(lo, c_lo))
        covered = _merge([*covered, (lo, hi)])
        if own > 0:
            out.append((lv.values[i], own, (int(lv.start[i]), int(lv.end[i]))))
    return out


def _merge(intervals: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _analyse(
    texts: Mapping[str, list[str]],
    dump: _DumpFiles,
    stats: Any,
    arg_leaves: Sequence[_ArgLeaf],
    tags: Mapping[tuple[str, ...], list[_Tag]],
    target_name: str,
) -> PeakReport:
    allocs, values = _parse_buffer_assignment(dump.buffer_assignment, texts[dump.buffer_assignment])
    live = _parse_live_range(dump.live_range, texts[dump.live_range])
    hlo = _parse_hlo(dump.hlo, texts[dump.hlo])
    ba_file = os.path.basename(dump.buffer_assignment)

    arg = int(stats.argument_size_in_bytes)
    out = int(stats.output_size_in_bytes)
    temp = int(stats.temp_size_in_bytes)
    alias = int(stats.alias_size_in_bytes)
    peak_bytes = arg + out + temp - alias
    xla_peak = int(getattr(stats, "peak_memory_in_bytes", 0) or 0) or None

    params = {a.parameter: a for a in allocs.values() if a.parameter is not None}
    param_total = sum(a.size for a in params.values())
    if param_total != arg:
        raise InspectError(
            f"{ba_file}: parameter allocations hold {param_total} bytes but the memory "
            f"analysis says {arg} argument bytes"
        )
    if sorted(params) != list(range(len(arg_leaves))):
        raise InspectError(
            f"{ba_file}: entry parameters {sorted(params)[:8]}... do not match the "
            f"{len(arg_leaves)} argument leaves that reach the program"
        )
    temp_blocks = sum(a.size for a in allocs.values() if "preallocated-temp" in a.kinds)
    if temp_blocks and temp_blocks != temp:
        raise InspectError(
            f"{ba_file}: the preallocated temp block is {temp_blocks} bytes but the memory "
            f"analysis says {temp}"
        )

    n = len(live.sequence)
    phases = _phases(live.sequence, hlo)
    first_backward = next((p.start for p in phases if p.name == "backward"), None)
    lv = _live_values(values, allocs, live, n)
    timeline, temp_live = _timeline(lv, n)
    if temp_blocks and int(temp_live.max()) > temp:
        worst = int(temp_live.argmax())
        raise InspectError(
            f"{os.path.basename(dump.live_range)}: {int(temp_live.max())} temp bytes live at "
            f"position {worst}, more than the {temp}-byte temp block: the live ranges were "
            "not read as XLA meant them"
        )
    pos = int(timeline.argmax())
    live_peak = int(timeline[pos])
    if live_peak > peak_bytes:
        raise InspectError(
            f"{os.path.basename(dump.live_range)}: {live_peak} bytes live at position {pos}, "
            f"more than the program's {peak_bytes} (argument + output + temp - alias)"
        )

    ctx = _Context(allocs, arg_leaves, hlo, tags, tuple(phases), first_backward, live)
    buffers = [_describe(v, size, span, ctx) for v, size, span in _attribute(lv, pos)]
    buffers += [_parameter_buffer(a, ctx) for a in allocs.values() if a.parameter is not None]
    buffers = [b for b in buffers if b.size_bytes > 0]
    buffers.sort(key=lambda b: (-b.size_bytes, b.name))
    if sum(b.size_bytes for b in buffers) != live_peak:
        raise InspectError(
            f"{os.path.basename(dump.live_range)}: the buffers live at position {pos} hold "
            f"{sum(b.size_bytes for b in buffers)} bytes, not the {live_peak} counted there"
        )

    by_category = dict.fromkeys(CATEGORIES, 0)
    by_layer: dict[str, int] = {}
    for b in buffers:
        by_category[b.category] += b.size_bytes
        by_layer[b.layer] = by_layer.get(b.layer, 0) + b.size_bytes
    by_category[FRAGMENTATION] = peak_bytes - live_peak
    by_layer = dict(sorted(by_layer.items(), key=lambda kv: -kv[1]))
    by_layer[FRAGMENTATION] = peak_bytes - live_peak

    at = live.sequence[pos]
    instr = hlo.instructions.get(at)
    parts = os.path.basename(dump.hlo).split(".")
    return PeakReport(
        target=target_name,
        peak_bytes=peak_bytes,
        live_peak_bytes=live_peak,
        fragmentation_bytes=peak_bytes - live_peak,
        peak_position=pos,
        peak_instruction=at,
        peak_op_name=instr.op_name if instr else "",
        peak_phase=_phase_at(phases, pos),
        schedule_length=n,
        argument_bytes=arg,
        output_bytes=out,
        temp_bytes=temp,
        alias_bytes=alias,
        xla_peak_bytes=xla_peak,
        xla_live_peak_bytes=live.xla_peak[1] if live.xla_peak else None,
        buffers=tuple(buffers),
        by_category=by_category,
        by_layer=by_layer,
        timeline=tuple(int(x) for x in timeline),
        phases=tuple(phases),
        module=parts[1] if len(parts) > 2 else "",
        jax_version=jax.__version__,
        compile_seconds=0.0,
        parse_seconds=0.0,
    )


@dataclasses.dataclass(frozen=True)
class _Context:
    allocs: Mapping[int, _Allocation]
    arg_leaves: Sequence[_ArgLeaf]
    hlo: _Hlo
    tags: Mapping[tuple[str, ...], list[_Tag]]
    phases: tuple[Phase, ...]
    first_backward: int | None
    live: _LiveRanges


def _parameter_buffer(alloc: _Allocation, ctx: _Context) -> PeakBuffer:
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
    entry: _Instr | None,
    op: str,
    ctx: _Context,
) -> PeakBuffer:
    leaf = ctx.arg_leaves[number]
    path = entry.op_name if entry else ""
    segs = [next(x for x in k if x) for k in re.findall(r"\['([^']*)'\]|\.(\w+)|\[(\d+)\]", path)]
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
        layer=_layer_of(segs, any(_STACK.match(s) for s in segs)),
        live=span,
        phase=_phase_at(ctx.phases, span[0]),
    )


def _describe(v: _Value, size: int, span: tuple[int, int], ctx: _Context) -> PeakBuffer:
    dtype, shape = _shape_of(v.shape_text)
    def_pos = span[0]
    phase = _phase_at(ctx.phases, def_pos)
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
    # Gradient accumulators are often zero-filled broadcasts XLA hoists to the start,
    # with no op_name; shaped like a parameter, they are gradients.
    zeros = not prod_op and "broadcast" in v.instruction
    if recompute:
        category = RECOMPUTE
    elif (backward or zeros) and _is_gradient(shape, dtype, ctx.arg_leaves):
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
    path = _module_path(named_op)
    scanned = "/while" in op_name or "/while" in named_op
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
        layer=_layer_of(path, scanned),
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
    producer: _Instr,
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
    i: _Instr | None = producer
    for _ in range(32):
        if i is None:
            break
        if i.op_name:
            name = _match_tag(ctx.tags, _module_path(i.op_name), elements, dtype)
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
            name = _match_tag(ctx.tags, _INPUT_KEY, elements, dtype)
            return name, producer.op_name
        else:
            break
        if nxt is not None and nxt not in hlo.instructions and "#" in nxt:
            nxt, _, k = nxt.rpartition("#")  # newer HLO text: "%x#k" is element k of x
            nxt_index = int(k) if k.isdigit() else None
        i, index = hlo.instructions.get(nxt) if nxt else None, nxt_index
    return None, producer.op_name


def _origin(hlo: _Hlo, name: str, index: int | None, depth: int = 0) -> _Instr | None:
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


def _is_entry_parameter(hlo: _Hlo, i: _Instr) -> bool:
    return i.opcode == "parameter" and i.computation == hlo.entry


def _parameter_number(i: _Instr) -> int | None:
    return i.index if i.opcode == "parameter" else None


def _is_gradient(shape: tuple[int, ...], dtype: str, arg_leaves: Sequence[_ArgLeaf]) -> bool:
    squeeze = lambda dims: tuple(d for d in dims if d != 1)
    dims = squeeze(shape)
    return bool(dims) and any(
        leaf.category == PARAMETER and squeeze(leaf.shape) == dims and leaf.dtype == dtype
        for leaf in arg_leaves
    )


# --------------------------------------------------------------------------- diff, plot


def diff(a: PeakReport, b: PeakReport) -> PeakDiff:
    """What ``b`` keeps at its peak that ``a`` does not ("why did my memory go up").

    Buffers are compared at each report's own peak, grouped by category and label (the
    checkpoint name, else the Flax module path and op).

    Args:
      a: the reference report (e.g. policy ``full``).
      b: the report to explain (e.g. policy ``none``).

    Returns:
      The PeakDiff.

    Example:
      >>> a, b = rk.inspect_step(step_full), rk.inspect_step(step_none)  # doctest: +SKIP
      >>> d = rk.diff_peaks(a, b)  # doctest: +SKIP
      >>> d.kept[0][:2]  # doctest: +SKIP
      ('saved activation', 'attn_probs')
    """
    la, lb = a.by_label(), b.by_label()
    rows = [(c, lab, la.get((c, lab), 0), lb.get((c, lab), 0)) for c, lab in {*la, *lb}]
    extra_a = a.by_category.get(FRAGMENTATION, 0)
    extra_b = b.by_category.get(FRAGMENTATION, 0)
    if extra_a or extra_b:
        rows.append((FRAGMENTATION, FRAGMENTATION, extra_a, extra_b))
    kept = sorted((r for r in rows if r[3] > r[2]), key=lambda r: (r[2] - r[3], r[1]))
    dropped = sorted((r for r in rows if r[2] > r[3]), key=lambda r: (r[3] - r[2], r[1]))
    cats = {c: b.by_category.get(c, 0) - a.by_category.get(c, 0) for c in CATEGORIES}
    return PeakDiff(
        peak_delta=b.peak_bytes - a.peak_bytes,
        by_category=cats,
        kept=tuple(kept),
        dropped=tuple(dropped),
        peak_phases=(a.peak_phase, b.peak_phase),
    )


_PHASE_COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "optimizer": "#55a868"}


def plot_timeline(
    report: PeakReport | Sequence[PeakReport],
    path: str | os.PathLike[str],
    *,
    labels: Sequence[str] | None = None,
    title: str | None = None,
    memory_bytes: int | None = None,
) -> Path:
    """Draws live bytes against schedule position as a PNG (matplotlib, Agg canvas).

    Phases are shaded when they can be told apart, the peak is marked, and the
    compiled peak (argument + output + temp - alias) is drawn as a dashed line.

    Args:
      report: one report, or several to overlay (positions scaled to 0..1 then).
      path: the PNG to write (parent directories are created).
      labels: legend labels (default: ``meta["policy"]`` or the module name).
      title: the plot title.
      memory_bytes: the device's memory, drawn as a line when given.

    Returns:
      The path written.

    Example:
      >>> rk.plot_timeline(r, "results/timeline.png")  # doctest: +SKIP
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    reports = [report] if isinstance(report, PeakReport) else list(report)
    if not reports:
        raise ValueError("plot_timeline needs at least one report")
    names = (
        list(labels)
        if labels is not None
        else [str(r.meta.get("policy") or r.module) for r in reports]
    )
    scale = len(reports) > 1
    fig = Figure(figsize=(9, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    gib = 2**30
    for r, name in zip(reports, names, strict=True):
        n = max(len(r.timeline), 1)
        xs = np.arange(n) / (n - 1 if scale and n > 1 else 1)
        (line,) = ax.plot(xs, np.asarray(r.timeline) / gib, lw=1.2, label=f"{name} (live)")
        px = r.peak_position / (n - 1 if scale and n > 1 else 1)
        ax.plot([px], [r.live_peak_bytes / gib], "o", color=line.get_color())
        ax.axhline(r.peak_bytes / gib, ls="--", lw=0.8, color=line.get_color())
        ax.annotate(
            f"peak {r.peak_bytes / gib:.2f} GiB ({r.peak_phase})",
            (px, r.live_peak_bytes / gib),
            textcoords="offset points",
            xytext=(5, 5),
            fontsize=8,
        )
    if not scale:
        r = reports[0]
        for p in r.phases:
            ax.axvspan(p.start, p.end + 1, color=_PHASE_COLORS.get(p.name, "#999"), alpha=0.12)
            ax.text(
                (p.start + p.end) / 2,
                0.02,
                p.name,
                transform=ax.get_xaxis_transform(),
                ha="center",
                fontsize=8,
            )
    if memory_bytes:
        ax.axhline(memory_bytes / gib, color="red", lw=0.8, label="device memory")
    ax.set_xlabel("schedule position" + (" (fraction)" if scale else ""))
    ax.set_ylabel("live GiB")
    ax.set_ylim(bottom=0)
    ax.set_title(title or f"memory over the step ({reports[0].target})", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out


# --------------------------------------------------------------------------- CLI


def add_inspect_parser(
    subparsers: Any, add_model_args: Callable[[argparse.ArgumentParser], None]
) -> argparse.ArgumentParser:
    """Adds ``remat-kit inspect`` to a subparsers object.

    Args:
      subparsers: what ``ArgumentParser.add_subparsers`` returned.
      add_model_args: adds --model --target --batch --seq ... (and --json) to a parser.

    Returns:
      The ``inspect`` parser.

    Example:
      >>> sub = parser.add_subparsers(dest="command")  # doctest: +SKIP
      >>> add_inspect_parser(sub, _add_model_args)  # doctest: +SKIP
    """
    p = subparsers.add_parser("inspect", help="what is live at the peak, and when")
    add_model_args(p)
    p.add_argument("--policy", default="full", help="policy name or spec")
    p.add_argument("--schedule", default="none", help="layer schedule (none, every:K, ...)")
    p.add_argument("--top", type=int, default=10, help="buffers shown at the peak")
    p.add_argument("--plot", type=Path, default=None, help="write the memory timeline PNG")
    p.add_argument(
        "--diff",
        nargs=2,
        metavar=("P1", "P2"),
        default=None,
        help="what policy P2 keeps at its peak that P1 does not",
    )
    with contextlib.suppress(argparse.ArgumentError):  # add_model_args may have it
        p.add_argument("--json", type=Path, default=None, help="write the result as JSON")
    return p


def run_inspect(args: argparse.Namespace, rk: Any) -> int:
    """Runs ``remat-kit inspect``: prints rich tables, writes --json/--plot.

    Args:
      args: parsed arguments of the ``inspect`` parser.
      rk: the ``remat_kit`` module.

    Returns:
      The exit code (0).

    Raises:
      ValueError: unknown model, policy or target (the CLI prints it on one line).

    Example:
      >>> run_inspect(parser.parse_args(["inspect", "--model", "tiny-llama"]), rk)  # doctest: +SKIP
    """
    import json

    from rich.console import Console

    target = rk.target(args.target, devices=getattr(args, "gpus", 1) or 1)
    policies = list(args.diff) if getattr(args, "diff", None) else [args.policy]
    reports = [_inspect_preset(args, rk, target, p) for p in policies]
    console = Console(width=160)
    for r in reports:
        console.print(_summary_table(r))
        console.print(_buffer_table(r, getattr(args, "top", 10)))
        console.print(_split_table(r))
    result: dict[str, Any] = {"reports": [r.to_dict() for r in reports]}
    if len(reports) == 2:
        d = diff(reports[0], reports[1])
        console.print(_diff_table(d, policies))
        result["diff"] = d.to_dict()
    if getattr(args, "plot", None):
        plot_timeline(
            reports if len(reports) > 1 else reports[0],
            args.plot,
            labels=policies,
            title=f"{args.model} b{args.batch} s{args.seq} on {target.name}",
            memory_bytes=target.memory_bytes,
        )
        console.print(f"timeline written to {args.plot}")
    if getattr(args, "json", None):
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(json.dumps(result if len(reports) > 1 else result["reports"][0], indent=2))
        tmp.replace(out)
    return 0


def _inspect_preset(args: argparse.Namespace, rk: Any, target: Target, policy: str) -> PeakReport:
    import models
    from models.measure import model_config, options_from_args

    if getattr(args, "shard", None):
        raise ValueError("inspect reads one device's buffers: drop --shard (report/fit take it)")
    opts = options_from_args(args)
    pol = rk.as_policy(policy)
    cfg = model_config(opts, pol, target, getattr(args, "schedule", "none"))
    step = rk.build_train_step(models.build(cfg), opts.train_config())
    meta = {
        "model": opts.model,
        "policy": pol.spec,
        "batch": opts.batch,
        "seq": opts.seq,
        "attention": cfg.attention,
        "optimizer": opts.optimizer,
    }
    return inspect_step(step, target, meta=meta)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f}"


def _summary_table(r: PeakReport) -> Any:
    from rich.table import Table

    t = Table(
        title=f"peak of {r.meta.get('model', r.module)} / {r.meta.get('policy', '')} on {r.target}"
    )
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("peak GiB (argument + output + temp - alias)", _gib(r.peak_bytes))
    t.add_row("live at the peak GiB", _gib(r.live_peak_bytes))
    t.add_row("fragmentation GiB", _gib(r.fragmentation_bytes))
    t.add_row("peak position", f"{r.peak_position} / {r.schedule_length} ({r.peak_phase})")
    t.add_row("op at the peak", r.peak_op_name or r.peak_instruction)
    t.add_row("phases", ", ".join(f"{p.name} {p.start}-{p.end}" for p in r.phases) or "-")
    return t


def _buffer_table(r: PeakReport, n: int) -> Any:
    from rich.table import Table

    t = Table(title=f"top {n} buffers live at the peak")
    for col in ("MiB", "category", "checkpoint name", "shape", "layer", "module path / op", "live"):
        t.add_column(col, justify="right" if col == "MiB" else "left")
    for b in r.top(n):
        t.add_row(
            f"{b.size_bytes / 2**20:.1f}",
            b.category,
            b.checkpoint_name or "-",
            f"{b.dtype}[{','.join(map(str, b.shape))}]",
            b.layer,
            b.module_path or b.name,
            f"{b.live[0]}-{b.live[1]}",
        )
    return t


def _split_table(r: PeakReport) -> Any:
    from rich.table import Table

    t = Table(title="bytes at the peak")
    t.add_column("category")
    t.add_column("GiB", justify="right")
    t.add_column("layer")
    t.add_column("GiB ", justify="right")
    cats = [(k, v) for k, v in r.by_category.items() if v]
    layers = list(r.by_layer.items())
    for i in range(max(len(cats), len(layers))):
        c = cats[i] if i < len(cats) else ("", None)
        lay = layers[i] if i < len(layers) else ("", None)
        t.add_row(
            c[0],
            _gib(c[1]) if c[1] is not None else "",
            lay[0],
            _gib(lay[1]) if lay[1] is not None else "",
        )
    return t


def _diff_table(d: PeakDiff, policies: Sequence[str]) -> Any:
    from rich.table import Table

    a, b = policies
    t = Table(
        title=f"what {b} keeps at its peak that {a} does not (peak {d.peak_delta / 2**30:+.2f} GiB)"
    )
    for col in ("category", "label", f"{a} MiB", f"{b} MiB", "delta MiB"):
        t.add_column(col, justify="left" if col in ("category", "label") else "right")
    for c, lab, x, y in d.kept[:15]:
        t.add_row(c, lab, f"{x / 2**20:.1f}", f"{y / 2**20:.1f}", f"{(y - x) / 2**20:+.1f}")
    return t
