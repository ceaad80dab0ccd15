"""Compile a function for a Target from abstract shapes and read XLA's memory analysis.

Nothing is allocated: arguments become ``jax.ShapeDtypeStruct`` s placed on the
target's mesh, the program is lowered and compiled for that target (a GPU that need
not be present), and the compiled program's ``memory_analysis()`` gives the figures.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax

from remat_kit import flops as _flops
from remat_kit import names as _names
from remat_kit._shapes import array_bytes
from remat_kit.cache import compiled_memory
from remat_kit.errors import BadType, BadValue, RematWarning
from remat_kit.notes import Note, words
from remat_kit.policies import Policy, as_policy, decide
from remat_kit.residuals import tags_in
from remat_kit.sharding import collective_summary
from remat_kit.targets import Target, analysis_options, as_target
from remat_kit.timing import Kernel, StepTime, speed_of, step_time

# Below this, XLA's remat pass moved nothing worth a mark (it clones even when it saves nothing).
_XLA_REMAT_MIN_BYTES = 2**20

__all__ = [
    "MemoryReport",
    "RematWarning",
    "ReportMeta",
    "TransferEstimate",
    "abstract",
    "memory_report",
    "report_notes",
    "transfer_estimate",
]


@dataclasses.dataclass(frozen=True, eq=False)
class ReportMeta(Mapping[str, Any]):
    """A report's labels: what was measured, and how. The labels code reads are typed fields;
    a label no code reads (a source's own: its import environment, its RNG streams ...)
    stays in ``extra``.

    It reads as the mapping it replaces, so the JSON is unchanged: ``dict(meta)``,
    ``meta["batch"]``, ``meta.get("depth")`` and ``{**meta, "depth": d}`` see every field that
    is set and every ``extra`` label. A field left None is no label (a label given as None is
    left out of the JSON, where it was written as ``null``). Code reads the fields:
    ``r.meta.batch``.

    Attributes:
      model, policy: what was measured (a model spec; a policy label where the caller set one).
      batch, seq: the global batch and the tokens per sequence.
      optimizer, lora, accum: the optimizer, the LoRA rank (0: none) and gradient accumulation.
      mesh, devices, batch_per_device: a sharded step's mesh spec, its devices and the batch
        each holds.
      precision: the precision record (``TrainStep.precision``).
      dropout: the dropout rate (None: none given).
      remat_impl: which of jax's remat implementations traced the step (``default``,
        ``remat3``).
      layers, params: the model's layers and parameters, where the source knows them.
      program: the compiled program's fingerprint: policies that lower alike share it.
      collectives: what the devices exchange per step
        (:func:`remat_kit.sharding.collective_summary`; a sharded step only).
      depth: how an unrolled model's figures were made (``mode``: ``extrapolated``,
        ``verified`` or ``full``; :mod:`remat_kit.sources._depth`).
      recompute_overhead: extra FLOPs of recomputation against the step without remat.
      offload_estimate: host transfers against recomputation
        (:class:`TransferEstimate` as a dict).
      breakdown: ``measured`` when the breakdown was read at the peak;
        ``breakdown_estimate`` the arithmetic one beside it.
      roles: where a user's own step says its parameters, optimizer state and batch are
        (``not given`` when it did not say).
      loss_given: whether a user's own step returns its loss.
      experts: how an MoE model's experts ran (routed, per token, ``impl``).
      extra: every other label, as given.

    Example:
      >>> m = ReportMeta.of({"model": "tiny-llama", "batch": 2, "seq": 16, "why": "a test"})
      >>> m.batch * m.seq, m.extra, dict(m)
      (32, {'why': 'a test'}, {'model': 'tiny-llama', 'batch': 2, 'seq': 16, 'why': 'a test'})
    """

    model: str | None = None
    policy: str | None = None
    batch: int | None = None
    seq: int | None = None
    optimizer: str | None = None
    lora: int | None = None
    accum: int | None = None
    mesh: str | None = None
    devices: int | None = None
    batch_per_device: int | None = None
    precision: Mapping[str, str] | None = None
    dropout: float | None = None
    remat_impl: str | None = None
    layers: int | None = None
    params: int | None = None
    program: str | None = None
    collectives: Mapping[str, Any] | None = None
    depth: Mapping[str, Any] | None = None
    recompute_overhead: float | None = None
    offload_estimate: Mapping[str, Any] | None = None
    breakdown: str | None = None
    breakdown_estimate: Mapping[str, int] | None = None
    roles: Mapping[str, Any] | str | None = None
    loss_given: bool | None = None
    experts: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, labels: Mapping[str, Any] | None) -> ReportMeta:
        """The labels of a mapping: each key that names a field fills it, the rest go to
        ``extra`` (a ReportMeta is returned as it is).

        Raises:
          BadType: ``labels`` is not a mapping, or a key is not a string.

        Example:
          >>> ReportMeta.of({"depth": {"mode": "full"}, "scan": True}).depth
          {'mode': 'full'}
        """
        if isinstance(labels, ReportMeta):
            return labels
        if labels is None:
            return cls()
        if not isinstance(labels, Mapping) or not all(isinstance(k, str) for k in labels):
            raise BadType(f"a report's meta is a mapping of str to labels, got {labels!r}")
        given = dict(labels)
        fields = {k: given.pop(k) for k in _META_FIELDS if k in given}
        return cls(**fields, extra=given)

    def _set(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in _META_FIELDS if getattr(self, k) is not None}
        out.update(self.extra)
        return out

    def __getitem__(self, key: str) -> Any:
        return self._set()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._set())

    def __len__(self) -> int:
        return len(self._set())

    def __repr__(self) -> str:
        return f"ReportMeta({self._set()!r})"


#: The typed labels, in the order a dict of them lists them.
_META_FIELDS = tuple(f.name for f in dataclasses.fields(ReportMeta) if f.name != "extra")


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """XLA's memory analysis of one compiled program for one target, per device.

    Attributes:
      target: target name; ``target_memory_bytes`` its device memory (None for cpu).
      usable_bytes: what one JAX process may allocate per device on the target: device memory
        times the allocator fraction (``mem_fraction``, JAX's default 0.75); None for cpu.
      mem_fraction: the allocator fraction assumed (None: no pool, or not a GPU).
      fits_with_fraction: when the peak is over ``usable_bytes``, the smallest fraction that
        would make it fit (None when it fits, or when no fraction can).
      devices: devices the program was compiled for (figures are per device).
      peak_bytes: argument + output + temp - alias, the usual total (MaxText, JAX's
        host-offloading guide).
      argument_bytes, output_bytes, temp_bytes, alias_bytes: XLA's fields.
      host_bytes: bytes in pinned host memory (offloaded activations), all host fields.
      host_temp_bytes: host temporaries alone.
      xla_peak_bytes: XLA's own peak when this jaxlib reports one, else None.
      flops: FLOPs of the whole program per step, recomputation included, scan bodies
        times their trip count (counted from the jaxpr; XLA has none for these compiles).
      flops_detail: FlopCount.to_dict().
      tags: checkpoint-name tags present in the program.
      xla_remat: XLA's rematerialization pass changed the program (it saved at least 1 MiB);
        the figures then include XLA's choices, not only the policy's.
      xla_remat_saved_bytes: what that pass took off the peak (0: it changed nothing).
      xla_remat_limit_bytes: the limit the pass worked to, when XLA's log states it.
      policy, schedule, attention: what was measured (labels, set by the caller).
      compile_seconds: lowering + compiling wall time.
      breakdown: bytes by role (weights, gradients, optimizer, ...) when the caller
        knows them (remat_kit.train does); activation bytes are what is left.
      meta: the labels of what was measured (:class:`ReportMeta`: model, batch, seq, ...;
        a mapping given here becomes one).
      notes: what the user should know (:class:`remat_kit.notes.Note`: a kind and its
        figures), also issued as RematWarning; ``warnings`` are their words.
      step_time: the predicted step time on the target (:class:`remat_kit.timing.StepTime`,
        from the kernels of this same compile); None where the target has no speed figures
        (the CPU, a local device).
    """

    target: str
    target_memory_bytes: int | None
    usable_bytes: int | None
    mem_fraction: float | None
    fits_with_fraction: float | None
    devices: int
    peak_bytes: int
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    host_bytes: int
    host_temp_bytes: int
    generated_code_bytes: int
    xla_peak_bytes: int | None
    flops: float
    flops_detail: Mapping[str, Any]
    tags: tuple[str, ...]
    xla_remat: bool
    xla_remat_saved_bytes: int
    xla_remat_limit_bytes: int | None
    policy: str | None
    schedule: str | None
    attention: str | None
    compile_seconds: float
    breakdown: Mapping[str, int] = dataclasses.field(default_factory=dict)
    meta: ReportMeta = dataclasses.field(default_factory=ReportMeta)
    notes: tuple[Note, ...] = ()
    step_time: StepTime | None = None

    def __post_init__(self) -> None:
        # Labels arrive as plain dicts from every writer ({**r.meta, "depth": d} included):
        # typed once, here.
        object.__setattr__(self, "meta", ReportMeta.of(self.meta))

    @property
    def fits(self) -> bool | None:
        """peak_bytes <= what a JAX process may allocate there (None without a size)."""
        if self.usable_bytes is None:
            return None
        return self.peak_bytes <= self.usable_bytes

    @property
    def tokens_per_step(self) -> int | None:
        """Tokens per step (batch x seq) from the report's labels; None without them."""
        batch, seq = self.meta.batch, self.meta.seq
        if isinstance(batch, int) and isinstance(seq, int):
            return batch * seq
        return None

    @property
    def over_by_bytes(self) -> int | None:
        """How far the peak exceeds the usable memory (negative: room left)."""
        if self.usable_bytes is None:
            return None
        return self.peak_bytes - self.usable_bytes

    @property
    def warnings(self) -> tuple[str, ...]:
        """The notes in words, one line each (:func:`remat_kit.notes.words`)."""
        return tuple(words(n) for n in self.notes)

    def replace(self, **changes: Any) -> MemoryReport:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field (each note as ``Note.to_dict()``), plus ``fits`` and
        ``warnings`` (the notes in words), which :meth:`from_dict` does not read back."""
        out = dataclasses.asdict(self)
        out["breakdown"] = dict(self.breakdown)
        out["meta"] = dict(self.meta)
        out["flops_detail"] = dict(self.flops_detail)
        out["tags"] = list(self.tags)
        out["notes"] = [n.to_dict() for n in self.notes]
        out["warnings"] = list(self.warnings)
        out["fits"] = self.fits
        out["step_time"] = self.step_time.to_dict() if self.step_time is not None else None
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryReport:
        """The report :meth:`to_dict` wrote (``fits`` and ``warnings`` are derived, so they are
        not read back).

        Raises:
          ValueError: a field missing or unknown (data from another version).

        Example:
          >>> x = jax.ShapeDtypeStruct((8, 8), jnp.float32)
          >>> r = rk.memory_report(lambda a: a @ a, x, target="cpu")
          >>> MemoryReport.from_dict(r.to_dict()) == r
          True
        """
        names = {f.name for f in dataclasses.fields(cls)}
        derived = {"fits", "warnings"}
        given = set(data) - derived
        if given != names:
            raise BadValue(
                f"not a MemoryReport: missing {sorted(names - given)}, unknown "
                f"{sorted(given - names)}"
            )
        values = {k: v for k, v in data.items() if k not in derived}
        values["tags"] = tuple(values["tags"])
        values["notes"] = tuple(Note.from_dict(n) for n in values["notes"])
        if values["step_time"] is not None:
            values["step_time"] = StepTime.from_dict(values["step_time"])
        return cls(**values)


def abstract(tree: Any, sharding: Any = None) -> Any:
    """Arrays and ShapeDtypeStructs -> ShapeDtypeStructs (optionally placed on ``sharding``).

    Args:
      tree: a pytree of arrays, ShapeDtypeStructs or anything with shape and dtype.
      sharding: a Sharding for every leaf, or a pytree prefix of Shardings; leaves that
        already carry a NamedSharding on the same mesh keep theirs.

    Returns:
      The same pytree of ShapeDtypeStructs.
    """

    def one(x: Any, s: Any) -> Any:
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise BadType(
                f"memory_report arguments must be arrays or jax.ShapeDtypeStruct, got "
                f"{type(x).__name__} {x!r}"
            )
        own = getattr(x, "sharding", None)
        keep = (
            own is not None
            and s is not None
            and getattr(own, "mesh", None) == getattr(s, "mesh", None)
        )
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=own if keep else s)

    if sharding is None or not isinstance(sharding, jax.sharding.Sharding):
        if sharding is None:
            return jax.tree.map(lambda x: one(x, None), tree)
        return jax.tree.map(one, tree, sharding)
    return jax.tree.map(lambda x: one(x, sharding), tree)


def memory_report(
    fn: Callable[..., Any],
    *args: Any,
    target: Target | str = "h100-80gb",
    donate_argnums: int | Sequence[int] = (),
    in_shardings: Any = None,
    out_shardings: Any = None,
    policy: Policy | str | None = None,
    schedule: str | None = None,
    attention: str | None = None,
    meta: Mapping[str, Any] | None = None,
    count_flops: bool = True,
    warn: bool = True,
    dump_to: str | None = None,
) -> MemoryReport:
    """Compiles ``fn(*args)`` for ``target`` and reports its memory, per device.

    Args:
      fn: a jittable callable.
      *args: arrays or ``jax.ShapeDtypeStruct`` pytrees (nothing is allocated).
      target: a Target or target name; GPU targets compile deviceless.
      donate_argnums: arguments whose buffers the outputs may reuse (train state).
      in_shardings: a Sharding (or pytree prefix) per argument; default replicated on
        the target's mesh.
      out_shardings: passed to ``jax.jit``.
      policy: the policy the program was built with: a label in the report, and the
        basis of the "matched no tag" and "moved nothing to host" warnings.
      schedule: label of the layer schedule used.
      attention: label of the attention implementation used.
      meta: extra labels kept in the report.
      count_flops: count FLOPs from the jaxpr (a second trace; cheap).
      warn: also issue the report's warnings as ``RematWarning``.
      dump_to: a directory where XLA dumps this compile (:mod:`remat_kit.peak` reads it);
        the program is then compiled even when the on-disk cache holds its analysis.

    Returns:
      The MemoryReport.

    Raises:
      TypeError: an argument leaf is not array-like.
      remat_kit.BadValue: ``in_shardings`` is a sequence whose length is not the arguments'.
      remat_kit.TargetError: the GPU target cannot be compiled for here (one line on why).

    Example:
      >>> import jax, jax.numpy as jnp, remat_kit as rk
      >>> x = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16)
      >>> r = rk.memory_report(lambda a: a @ a, x, target="h100")
      >>> r.argument_bytes, r.fits
      (2097152, True)
    """
    t = as_target(target)
    pol = as_policy(policy) if policy is not None else None
    shardings = in_shardings if in_shardings is not None else t.sharding()
    if in_shardings is not None and isinstance(in_shardings, Sequence):
        if len(in_shardings) != len(args):
            raise BadValue(
                f"in_shardings has {len(in_shardings)} shardings for {len(args)} arguments: "
                "give one sharding for each argument, or one for all",
                param="in_shardings",
            )
        abstract_args = tuple(abstract(a, s) for a, s in zip(args, in_shardings, strict=True))
    else:
        abstract_args = tuple(abstract(a, shardings) for a in args)

    start = time.perf_counter()
    jitted = jax.jit(fn, donate_argnums=donate_argnums, out_shardings=out_shardings)
    with warnings.catch_warnings():
        # Donation of buffers the output cannot reuse is routine for train states.
        warnings.filterwarnings("ignore", message=".*donated buffers were not usable.*")
        # One trace serves the lowering, the FLOP count and the tags: on a cached compile
        # tracing is most of a report's time.
        traced = jitted.trace(*abstract_args)
        lowered = traced.lower()
        # remat_kit.xla.compile_memory, cached on disk; no machine code for a GPU target.
        mem = compiled_memory(lowered, t, options=analysis_options(t), dump_to=dump_to)
    seconds = time.perf_counter() - start

    closed = traced.jaxpr if count_flops or pol is not None else None
    count = _flops.count_jaxpr_flops(closed) if count_flops and closed is not None else None
    tags = tuple(sorted(tags_in(closed))) if closed is not None else ()

    report = MemoryReport(
        target=t.name,
        target_memory_bytes=t.memory_bytes,
        usable_bytes=t.usable_bytes,
        mem_fraction=t.mem_fraction,
        fits_with_fraction=None
        if t.fits(mem.peak_bytes) is not False
        else t.fraction_to_fit(mem.peak_bytes),
        devices=t.devices,
        peak_bytes=mem.peak_bytes,
        argument_bytes=mem.argument_bytes,
        output_bytes=mem.output_bytes,
        temp_bytes=mem.temp_bytes,
        alias_bytes=mem.alias_bytes,
        host_bytes=mem.host_bytes,
        host_temp_bytes=mem.host_temp_bytes,
        generated_code_bytes=mem.generated_code_bytes,
        xla_peak_bytes=mem.xla_peak_bytes,
        flops=float(count.total) if count is not None else float("nan"),
        flops_detail=count.to_dict() if count is not None else {},
        tags=tags,
        xla_remat=mem.xla_remat_saved_bytes >= _XLA_REMAT_MIN_BYTES,
        xla_remat_saved_bytes=mem.xla_remat_saved_bytes,
        xla_remat_limit_bytes=mem.xla_remat_limit_bytes,
        policy=pol.spec if pol is not None else None,
        schedule=schedule,
        attention=attention,
        compile_seconds=seconds,
        # Which program this is (policies that lower alike share it): fronts merge on it.
        meta={
            **dict(meta or {}),
            **({"program": mem.program} if mem.program else {}),
            # What the devices exchange per step (all-gathers of fsdp/cp, tp's reductions).
            **({"collectives": collective_summary(mem.kernels)} if t.devices > 1 else {}),
        },
        step_time=_step_time(mem.kernels, t),
    )
    notes = report_notes(report, pol, t) + [Note("xla_log", {"line": m}) for m in mem.xla_messages]
    report = report.replace(notes=tuple(notes))
    if warn:
        for text in report.warnings:
            warnings.warn(text, RematWarning, stacklevel=2)
    return report


def _step_time(kernels: Sequence[Kernel], t: Target) -> StepTime | None:
    speed = speed_of(t)
    if speed is None or not kernels:
        return None
    return step_time(kernels, speed, devices_per_host=t.devices_per_host)


def report_notes(r: MemoryReport, pol: Policy | None, t: Target) -> list[Note]:
    """The notes a report's own figures call for (no tag matched, nothing offloaded, XLA's
    remat pass, does not fit): for a report built from others' figures as well.

    Example:
      >>> r = rk.memory_report(lambda a: a * 2, jnp.zeros(4), target="cpu", warn=False)
      >>> report_notes(r, None, rk.target("cpu"))
      []
    """
    notes = []
    if pol is not None and pol.tags:
        # decide() matches the way the policy does (globs over module-path tags included).
        matched = [tag for tag in r.tags if decide(pol, tag) != "recompute"]
        if pol.is_remat and not matched:
            notes.append(
                Note("no_tag_matched", {"policy": pol.spec, "names": pol.tags, "tags": r.tags})
            )
    flash = _names.CONTEXT in r.tags and not set(_names.SCORE_NAMES) & set(r.tags)
    if (
        pol is not None
        and pol.tags
        and flash
        and any(decide(pol, n) != "save" for n in _names.SCORE_NAMES)
    ):
        kept = [t for t in r.tags if decide(pol, t) == "save"]
        if _names.CONTEXT in kept:
            notes.append(Note("flash_recomputes_scores", {"policy": pol.spec, "kept": kept}))
    if pol is not None and pol.offloads and t.kind == "cpu":
        # XLA's CPU backend has no separate host memory space: it reports 0 host bytes for
        # every program, so 0 here says nothing about what the policy offloads.
        notes.append(Note("offload_on_cpu", {"policy": pol.spec}))
    elif pol is not None and pol.offloads and r.host_temp_bytes == 0 and r.host_bytes == 0:
        notes.append(Note("offload_moved_nothing", {"policy": pol.spec}))
    if r.xla_remat:
        notes.append(Note("xla_remat", {"target": t.name, "saved_bytes": r.xla_remat_saved_bytes}))
    if r.fits is False:
        notes.append(
            Note(
                "does_not_fit",
                {
                    "target": t.label,
                    # the environment setting of the allocator, e.g. XLA_..._FRACTION=0.75
                    "runtime": t.runtime.setting() if t.runtime is not None else None,
                    "usable_bytes": r.usable_bytes,
                    "memory_bytes": r.target_memory_bytes,
                    "peak_bytes": r.peak_bytes,
                    "over_bytes": r.over_by_bytes,
                    "fits_with_fraction": r.fits_with_fraction,
                    "reserved_by": "libtpu" if t.kind == "tpu" else None,
                },
            )
        )
    return notes


class TransferEstimate(NamedTuple):
    """Offload against recompute for one step, estimated from a compiled report.

    Estimates, not measurements: bytes come from XLA, times from the target's
    public peak figures (host link per direction, dense bf16 throughput).

    Attributes:
      host_bytes: activations offloaded per step (XLA's host temp bytes).
      transfer_seconds: device->host in the forward pass plus host->device in the
        backward pass over the host link.
      recompute_seconds: the same tensors recomputed instead, at peak bf16 throughput
        (None when the recompute FLOPs are unknown).
      step_compute_seconds: the whole step's FLOPs at peak bf16 throughput.
      link_bound: the transfers take longer than the step's compute, so they cannot
        hide behind it.
    """

    host_bytes: int
    transfer_seconds: float
    recompute_seconds: float | None
    step_compute_seconds: float
    link_bound: bool


def transfer_estimate(
    report: MemoryReport, target: Target, recompute_flops: float | None = None
) -> TransferEstimate | None:
    """Estimates what offloading costs on ``target``'s host link, beside recomputing.

    Args:
      report: a compiled report with host bytes.
      target: the target it was compiled for (its host link and bf16 peak are used).
      recompute_flops: extra FLOPs of recomputing the offloaded tensors instead.

    Returns:
      The estimate, or None when nothing was offloaded or the target lacks the figures.
    """
    bytes_ = report.host_temp_bytes or report.host_bytes
    if not bytes_ or not target.host_link_bandwidth or not target.peak_bf16_flops:
        return None
    transfer = 2 * bytes_ / target.host_link_bandwidth
    step = report.flops / target.peak_bf16_flops
    recompute = None if recompute_flops is None else recompute_flops / target.peak_bf16_flops
    return TransferEstimate(int(bytes_), transfer, recompute, step, transfer > step)


def nbytes(tree: Any) -> int:
    """Total bytes of a pytree of arrays or ShapeDtypeStructs."""
    return int(sum(array_bytes(x.shape, x.dtype) for x in jax.tree.leaves(tree)))
