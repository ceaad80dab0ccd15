"""Live bytes along a compiled program, by phase and layer: what depth extrapolation fits.

A train step's peak is not one figure that grows with depth: it is the largest of the live
bytes at every point of the schedule, and different points grow at different rates (the
start of the backward pass holds every saved activation; the end of it, every layer's
gradient). :func:`live_sections` reads XLA's dump of one compile and gives the most bytes
live in each *section* of the schedule: a phase (forward, backward, optimizer) and, inside
it, the stretch that runs one unrolled layer (by the layer's index) or the stretches before
the first and after the last layer. :mod:`remat_kit.sources._depth` fits those per section
across shallow copies of a model and takes the largest at full depth.

Example:
  >>> import tempfile
  >>> x = jax.ShapeDtypeStruct((64, 64), jnp.float32)
  >>> with tempfile.TemporaryDirectory() as d:
  ...     _ = rk.memory_report(lambda a: jnp.tanh(a @ a), x, target="h100", dump_to=d)
  ...     secs = live_sections(d)
  >>> max(secs.values()) >= 64 * 64 * 4
  True
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from remat_kit.peak._attribute import _live_values, _timeline
from remat_kit.peak._dump import DumpFiles
from remat_kit.peak._parsers import Hlo, parse_buffer_assignment, parse_hlo, parse_live_range
from remat_kit.peak._phases import phases_of
from remat_kit.peak._tags import layer_of, module_path

__all__ = [
    "Section",
    "live_sections",
    "position_layers",
    "sections_of",
]

_INDEX = re.compile(r"_(\d+)$")


@dataclasses.dataclass(frozen=True, order=True)
class Section:
    """A stretch of the schedule.

    Attributes:
      phase: ``forward``, ``backward``, ``optimizer`` or ``program`` (no backward pass).
      role: ``layer`` (the stretch from one unrolled layer's first instruction to the
        next layer's), ``before`` (before the phase's first layer instruction) or
        ``after`` (after its last).
      layer: the layer's index for ``layer``, else -1.
    """

    phase: str
    role: str
    layer: int = -1


def sections_of(
    timeline: Sequence[int], phases: Sequence[tuple[str, int, int]], layers: Sequence[str]
) -> dict[Section, int]:
    """The most bytes live in each section of a schedule.

    Args:
      timeline: live bytes at each schedule position (arguments included).
      phases: ``(name, first, last)`` spans covering the schedule.
      layers: each position's layer label (``layers_3``, ``non-layer``, ``scanned layers``).

    Returns:
      Section -> the largest live bytes in it.

    Example:
      >>> got = sections_of([5, 9, 7, 4], [("forward", 0, 3)],
      ...                   ["non-layer", "layers_0", "layers_1", "non-layer"])
      >>> [(s.role, s.layer, b) for s, b in sorted(got.items(), key=lambda kv: kv[0].layer)]
      [('before', -1, 5), ('after', -1, 4), ('layer', 0, 9), ('layer', 1, 7)]
    """
    index = [_layer_index(label) for label in layers]
    out: dict[Section, int] = {}
    for name, first, last in phases:
        marked = [p for p in range(first, last + 1) if index[p] is not None]
        current = -1
        for p in range(first, last + 1):
            if index[p] is not None:
                current = index[p]
            if not marked or p < marked[0]:
                sec = Section(name, "before")
            elif p > marked[-1]:
                sec = Section(name, "after")
            else:
                sec = Section(name, "layer", current)
            out[sec] = max(out.get(sec, 0), int(timeline[p]))
    return out


def live_sections(directory: str) -> dict[Section, int]:
    """:func:`sections_of` the one program XLA dumped to ``directory``.

    Args:
      directory: where a compile dumped (``rk.memory_report(..., dump_to=directory)``).

    Returns:
      Section -> the largest live bytes in it (device memory; arguments included).

    Raises:
      InspectError: no dump there, or a dump line that cannot be read.
    """
    dump = DumpFiles.find(directory, None)
    texts = dump.read()
    allocs, values = parse_buffer_assignment(dump.buffer_assignment, texts[dump.buffer_assignment])
    live = parse_live_range(dump.live_range, texts[dump.live_range])
    hlo = parse_hlo(dump.hlo, texts[dump.hlo])
    n = len(live.sequence)
    timeline, _ = _timeline(_live_values(values, allocs, live, n), n)
    spans = [(p.name, p.start, p.end) for p in phases_of(live.sequence, hlo)] or [
        ("program", 0, n - 1)
    ]
    return sections_of(timeline.tolist(), spans, position_layers(hlo, live.sequence))


def position_layers(hlo: Hlo, sequence: Sequence[str]) -> list[str]:
    """The layer label of the instruction at each schedule position, from its op_name."""
    out = []
    for name in sequence:
        instr = hlo.instructions.get(name)
        op_name = instr.op_name if instr else ""
        out.append(layer_of(module_path(op_name), "/while" in op_name))
    return out


def _layer_index(label: str) -> int | None:
    m = _INDEX.search(label)
    return int(m.group(1)) if m else None
