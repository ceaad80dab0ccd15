"""The predicted step as a timeline: each kernel priced by the step-time model, in program order.

:func:`remat_kit.timing.step_time` adds the kernels of a step up; this lays the same kernels out
along XLA's schedule. The schedule is the one XLA's live-range dump flattens (a while loop's
condition and body listed once, just before the ``while``): each loop's span is replayed as
many times as the loop runs (``known_trip_count``, as :func:`~remat_kit.xla.kernels_of` counts
it), so every launch of a step is one :class:`Launch` at a start time. Each launch takes its
priced seconds plus the per-launch cost; an asynchronous collective runs beside the stream
(only its launch cost on it), and whatever of those collectives the step's compute cannot hide
is the last launch's wait. The launches therefore end at ``step_time(...).seconds``.

Example:
  >>> import jax, jax.numpy as jnp, remat_kit as rk
  >>> from remat_kit.timing import kernels_of, speed_of, step_time
  >>> from remat_kit.xla import read_hlo
  >>> x = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16)
  >>> text = jax.jit(lambda a: jnp.tanh(a @ a)).lower(x).compile().as_text()
  >>> entry = read_hlo(text.splitlines()).entry
  >>> seq = [i.name for i in read_hlo(text.splitlines()).computations[entry]]
  >>> speed = speed_of(rk.target("h100"))
  >>> t = program_timeline(text, seq, speed)
  >>> abs(t.seconds - step_time(kernels_of(text), speed).seconds) < 1e-15
  True
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from remat_kit.timing._model import _seconds, step_time
from remat_kit.timing._speed import Speed
from remat_kit.xla import HloInstruction, HloModule, Kernel, kernels_of, read_hlo
from remat_kit.xla._cost import _cost
from remat_kit.xla._kernels import _holds_collective, _is_wrapper, _trip_count, _walk
from remat_kit.xla._opcodes import _FREE

__all__ = [
    "Launch",
    "ProgramTimeline",
    "program_timeline",
]

#: Calls whose computations the live-range schedule lists before the calling instruction.
_CALLS = ("body", "condition", "to_apply", "calls", "true_computation", "false_computation")


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch of the step, on the predicted timeline.

    Attributes:
      kernel: the kernel (``count`` 1: one launch).
      start: seconds from the step's start.
      seconds: how long it occupies its stream (priced time plus the launch cost; an
        asynchronous collective: its priced time, beside the stream).
      step: index into :attr:`ProgramTimeline.steps` of the schedule position it runs at.
      beside: an asynchronous collective, running beside the compute stream.
    """

    kernel: Kernel
    start: float
    seconds: float
    step: int
    beside: bool = False


@dataclasses.dataclass(frozen=True)
class ProgramTimeline:
    """A step laid out in time.

    Attributes:
      steps: ``(schedule position, start seconds)`` in execution order: a position inside a
        loop appears once per iteration.
      launches: every launch, in execution order.
      exposed_seconds: asynchronous collectives' time their windows could not hide, and the
        compute's loss to contention while they ran (the step waits for both at its end,
        as :func:`~remat_kit.timing.step_time` counts them).
      seconds: the step's length: ``step_time(kernels_of(text), speed).seconds``.
    """

    steps: tuple[tuple[int, float], ...]
    launches: tuple[Launch, ...]
    exposed_seconds: float
    seconds: float


def program_timeline(
    hlo_text: str,
    sequence: Sequence[str],
    speed: Speed,
    *,
    devices_per_host: int | None = None,
) -> ProgramTimeline:
    """Lays the kernels of a compiled program out along its schedule.

    Args:
      hlo_text: the optimized HLO (``compiled.as_text()`` or XLA's
        ``*after_optimizations.txt`` dump).
      sequence: the flattened schedule (the live-range dump's ``InstructionSequence``).
      speed: the device's rates (:func:`remat_kit.timing.speed_of`).
      devices_per_host: as for :func:`remat_kit.timing.step_time`.

    Returns:
      The ProgramTimeline.

    Raises:
      ValueError: the text has no ENTRY computation.
    """
    module = read_hlo(hlo_text.splitlines())
    if module.entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    instrs = {i.name: i for comp in module.computations.values() for i in comp}
    comp_of = {name: i.computation for name, i in instrs.items()}
    order = _expand(module, sequence, 0, len(sequence), {module.entry}, instrs, comp_of)
    sequenced = {comp_of.get(n) for n in sequence}

    launch_cost = speed.kernel_seconds
    clock = inline = 0.0
    steps: list[tuple[int, float]] = []
    launches: list[Launch] = []
    for pos in order:
        steps.append((pos, clock))
        instr = instrs.get(sequence[pos])
        for k in _kernels_at(module, instr, sequenced):
            priced = _seconds(k, speed, devices_per_host)
            if k.kind == "collective" and k.asynchronous:
                launches.append(Launch(k, clock, priced, len(steps) - 1, beside=True))
                clock += launch_cost
                continue
            if k.kind == "collective":
                inline += priced
            launches.append(Launch(k, clock, priced + launch_cost, len(steps) - 1))
            clock += priced + launch_cost
    # What the step waits for at its end: the asynchronous collectives their windows could
    # not hide and the compute's loss to contention, as step_time counts them.
    whole = step_time(kernels_of(hlo_text), speed, devices_per_host=devices_per_host)
    exposed = whole.collective_seconds - inline + whole.contention_seconds
    return ProgramTimeline(tuple(steps), tuple(launches), exposed, clock + exposed)


def _kernels_at(
    module: HloModule, instr: HloInstruction | None, sequenced: set[str | None]
) -> list[Kernel]:
    # What kernels_of's walk would cost for this one instruction; the computations it calls
    # that the schedule lists are laid out at their own positions.
    if instr is None or instr.opcode in _FREE:
        return []
    op = instr.opcode
    if op in ("while", "call", "async-start", "conditional") or (
        op == "fusion" and _is_wrapper(module, instr)
    ):
        called = _called(instr)
        if any(c in sequenced for c in called):
            return []
        if op == "conditional":
            called = called[:1]
        times = _trip_count(instr, module) if op == "while" else 1
        out: dict[tuple[object, ...], Kernel] = {}
        for c in called:
            # An async pair's wrapped collective runs beside the stream, as kernels_of's walk
            # reads it (asynchronous, in a window of its own), not inline.
            wrap = int(op == "async-start" and _holds_collective(module, c))
            _walk(module, c, times, out, set(), wrap, [wrap], wrapped=wrap)
        return [dataclasses.replace(k, count=1) for k in out.values() for _ in range(k.count)]
    k = _cost(module, instr, 1)
    return [] if k is None else [k]


def _called(instr: HloInstruction) -> list[str]:
    out = []
    for key in _CALLS:
        m = re.search(rf"\b{key}=%?([^\s,}}]+)", instr.attrs)
        if m:
            out.append(m.group(1))
    m = re.search(r"branch_computations=\{([^}]*)\}", instr.attrs)
    if m:
        out += [c.strip().lstrip("%") for c in m.group(1).split(",") if c.strip()]
    return out


def _expand(
    module: HloModule,
    sequence: Sequence[str],
    lo: int,
    hi: int,
    own: set[str],
    instrs: Mapping[str, HloInstruction],
    comp_of: Mapping[str, str],
) -> list[int]:
    """Positions of ``sequence[lo:hi]`` in execution order: the span of computations an
    instruction calls (listed just before it) replayed as often as it runs them."""
    out: list[int] = []
    sub = lo
    for p in range(lo, hi):
        name = sequence[p]
        comp = comp_of.get(name)
        if comp is not None and comp not in own:
            continue  # inside a called computation: laid out when its caller is met
        if comp is None:
            # A name the HLO text does not hold (the dump's own views of a tuple): it runs
            # where it stands, inside the span around it if one is open.
            if sub == p:
                out.append(p)
                sub = p + 1
            continue
        instr = instrs[name]  # comp_of holds just the names instrs does: comp is not None
        if sub < p:
            called = set(_called(instr))
            span = _expand(module, sequence, sub, p, called, instrs, comp_of) if called else []
            if instr.opcode == "while":
                out += span * _trip_count(instr, module)  # XLA:TPU's loops: their counter
            elif instr.opcode == "conditional":
                # kernels_of costs one branch (the first): so does the timeline.
                out += _expand(module, sequence, sub, p, set(_called(instr)[:1]), instrs, comp_of)
            else:
                out += span
        out.append(p)
        sub = p + 1
    return out
