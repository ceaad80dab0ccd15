"""XLA's own estimate of a step's time: the latency-hiding scheduler's schedule, read back.

When XLA schedules a GPU program it prices every instruction with a latency estimator and can
dump the schedule (``--xla_dump_latency_hiding_schedule``): per scheduled computation (the
entry and each loop body), every instruction's start and end, in "cycles" of which
``cycles_per_microsecond`` make a microsecond, and statistics (total cycles, cycles wasted
waiting on each kind of collective). With ``xla_gpu_enable_analytical_latency_estimator`` the
prices come from XLA's GPU performance model (a roofline over the device description); without
it, from fixed costs per kind of instruction, which are no time at all.

:func:`xla_estimate` compiles the program once more with the dump switched on and adds it up:
the entry's total, less the time it gives its ``while`` instructions, plus each loop body's
total times the loop's trip count (recursively). Measured on this deviceless compile (jax 0.10):
the analytical estimator gives a ``while`` a large default (73 ms for tiny-llama's backward
loop, whose four trips take 88 us by its own body schedule), so the entry's total alone is not
the step; it charges no launch cost per kernel. With jax 0.12 the analytical estimator aborts
the process in a deviceless compile (a failed ``CHECK`` in XLA's ``shape.h``: ``buffer !=
nullptr``), which no ``try`` can catch; there :func:`xla_estimate` answers None without
compiling.
"""

from __future__ import annotations

import dataclasses
import glob
import itertools
import os
import re
import tempfile
from collections.abc import Mapping
from typing import Any

__all__ = [
    "XlaEstimate",
    "analytical_estimator_runs",
    "read_schedule",
    "xla_estimate",
]

#: What the dump needs: the schedule, priced by XLA's GPU performance model.
SCHEDULE_OPTIONS: Mapping[str, Any] = {
    "xla_dump_latency_hiding_schedule": True,
    "xla_gpu_enable_analytical_latency_estimator": True,
}


@dataclasses.dataclass(frozen=True)
class XlaEstimate:
    """XLA's latency-hiding scheduler's estimate of one run of a program.

    Attributes:
      seconds: the step: the entry's total less its loops, plus each loop body's total times
        its trip count.
      computations: scheduled computation name -> (seconds of one run, runs per step).
      wasted_seconds: collective kind -> seconds the schedule waits on it, per step.
    """

    seconds: float
    computations: Mapping[str, tuple[float, int]]
    wasted_seconds: Mapping[str, float]


_COMPUTATION = re.compile(r"^  computations \{\n    name: \"([^\"]+)\"", re.M)
_INSTRUCTION = re.compile(
    r"    instructions \{\n      name: \"([^\"]+)\"\n      opcode: \"([^\"]+)\""
    r"(.*?)\n      id: (\d+)\n",
    re.S,
)
_SCHEDULE = re.compile(r"^computation_schedules \{\n  computation_id: (\d+)\n(.*?)^\}", re.M | re.S)
_TIMED = re.compile(
    r"id: (\d+)\n\s+start_timestamp_cycles: ([-\d.e+]+)\n\s+end_timestamp_cycles: ([-\d.e+]+)"
)
_TRIPS = re.compile(r'known_trip_count\\?":\{\\?"n\\?":\\?"(\d+)')
_CALLED = re.compile(r"called_computation_ids: (\d+)")
_WASTED = re.compile(r"(\w+)_wasted_cycles: ([-\d.e+]+)")


def read_schedule(text: str) -> XlaEstimate:
    """The estimate in a dumped schedule (``<module>.schedule.txt``, a text proto).

    Args:
      text: the dump's text.

    Returns:
      The XlaEstimate.

    Raises:
      ValueError: the text holds no schedule of the entry computation.

    Example:
      >>> from pathlib import Path
      >>> text = (Path(rk.__file__).parent.parent / "tests/data/tiny_schedule.txt").read_text()
      >>> e = read_schedule(text)
      >>> round(e.seconds * 1e6, 1), e.computations["body"][1]  # 8.4 + 4 x 25 us
      (108.4, 4)
    """
    end = text.find("\ncomputation_schedules {")
    module = text if end < 0 else text[:end]  # the HLO module; the schedules follow it
    starts = [m.start() for m in _COMPUTATION.finditer(module)] + [len(module)]
    owner: dict[int, str] = {}  # computation id -> its name, from the proto's ``id:`` line
    whiles: dict[int, tuple[int, int]] = {}  # instruction id -> (body id, trips)
    for a, b in itertools.pairwise(starts):
        block = module[a:b]
        comp_id = re.findall(r"^    id: (\d+)$", block, re.M)
        name = _COMPUTATION.match(block)
        if comp_id and name:
            owner[int(comp_id[-1])] = name.group(1)
        for m in _INSTRUCTION.finditer(block):
            iid, opcode = int(m.group(4)), m.group(2)
            if opcode == "while":
                after = block[m.end() : m.end() + 4000]  # its called ids and backend config
                called = [int(c) for c in _CALLED.findall(after)[:2]]
                trips = _TRIPS.search(after)
                if called:
                    whiles[iid] = (called[0], int(trips.group(1)) if trips else 1)
    entry = re.search(r"^  entry_computation_id: (\d+)", text, re.M)
    per_us = re.search(r"cycles_per_microsecond: ([\d.e+]+)", text)
    scale = 1e-6 / float(per_us.group(1)) if per_us else 1e-6
    schedules: dict[int, tuple[float, dict[int, float], dict[str, float]]] = {}
    for m in _SCHEDULE.finditer(text):
        block = m.group(2)
        total = re.search(r"total_cycles: ([-\d.e+]+)", block)
        spans = {int(i): float(e) - float(s) for i, s, e in _TIMED.findall(block)}
        wasted = {k: float(v) for k, v in _WASTED.findall(block) if k != "total"}
        schedules[int(m.group(1))] = (float(total.group(1)) if total else 0.0, spans, wasted)
    if entry is None or int(entry.group(1)) not in schedules:
        raise ValueError("the text holds no schedule of the entry computation")

    runs: dict[str, tuple[float, int]] = {}
    wasted_total: dict[str, float] = {}

    def cost(comp: int, times: int) -> float:
        total, spans, wasted = schedules[comp]
        inner = 0.0
        for iid, span in spans.items():
            if iid in whiles and whiles[iid][0] in schedules:
                body, trips = whiles[iid]
                total -= span
                inner += trips * cost(body, times * trips)
        name = owner.get(comp, str(comp))
        runs[name] = (schedules[comp][0] * scale, times)
        for k, v in wasted.items():
            wasted_total[k] = wasted_total.get(k, 0.0) + v * times * scale
        return total + inner

    seconds = cost(int(entry.group(1)), 1) * scale
    return XlaEstimate(seconds, runs, wasted_total)


def analytical_estimator_runs() -> bool:
    """Whether this jaxlib's XLA can run its analytical latency estimator deviceless.

    jax 0.12.0.1's aborts the process on it (measured on tiny-llama, fsdp:2 over two H100s);
    jax 0.10.2's runs it.
    """
    import jax

    major, minor = (int(p) for p in jax.__version__.split(".")[:2])
    return (major, minor) < (0, 12)


def xla_estimate(lowered: Any, target: Any) -> XlaEstimate | None:
    """Compiles ``lowered`` for ``target`` with the schedule dumped and reads XLA's estimate.

    One more compile (the memory analysis's is not reused: the dump must be switched on when
    XLA schedules).

    Args:
      lowered: a ``jax.stages.Lowered`` of the step.
      target: the ``rk.Target`` (a GPU: XLA:CPU dumps no such schedule).

    Returns:
      The XlaEstimate, or None where XLA wrote no schedule: it schedules a program on one
      device without its latency-hiding scheduler (measured: jax 0.10, h100), so only
      programs over several devices have one; also None, with nothing compiled, where the
      estimator would abort the process (:func:`analytical_estimator_runs`).
    """
    if not analytical_estimator_runs():
        return None
    from remat_kit.targets import analysis_options
    from remat_kit.xla import captured_stderr, compile_with

    with tempfile.TemporaryDirectory(prefix="remat_kit_schedule_") as tmp:
        with captured_stderr():
            dump = {"xla_dump_to": tmp, **SCHEDULE_OPTIONS}
            compile_with(lowered, analysis_options(target), dump)
        found = sorted(glob.glob(os.path.join(tmp, "*.schedule.txt")))
        if not found:
            return None
        with open(found[0]) as f:
            return read_schedule(f.read())
