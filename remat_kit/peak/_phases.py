"""Phases of a train step's schedule: where the forward pass ends and the optimizer begins.

Each op is placed by the jax name stack in its HLO ``op_name``: ``jvp(...)`` forward,
``transpose(...)`` backward, anything else after the backward pass the optimizer.

Example:
  >>> phase_at([Phase("forward", 0, 9), Phase("backward", 10, 30)], 12)
  'backward'
"""

from __future__ import annotations

from collections.abc import Sequence

from remat_kit.peak._parsers import Hlo
from remat_kit.peak._types import Phase

__all__ = [
    "phase_at",
    "phases_of",
]


def phases_of(sequence: Sequence[str], hlo: Hlo) -> tuple[Phase, ...]:
    """Forward / backward / optimizer spans, split where the op_names change most clearly.

    Each op is labelled by its jax name stack: ``transpose(`` backward, ``jvp(`` forward,
    anything else other (the optimizer after the backward pass). XLA hoists a few ops out
    of place (zero-initialised gradient accumulators, RoPE tables), so each boundary is
    the split that agrees with the most labels, not the first op of a kind.

    Args:
      sequence: the schedule (instruction names, in order).
      hlo: the optimized HLO, for each instruction's ``op_name``.

    Returns:
      The phases in order; empty when the program has no backward pass.

    Example:
      >>> from remat_kit.peak._dump import compile_with_dump
      >>> from remat_kit.peak._parsers import parse_hlo, parse_live_range
      >>> grad = jax.jit(jax.grad(lambda a: jnp.sin(a @ a).sum()))
      >>> _, dump, texts = compile_with_dump(grad.lower(jnp.ones((8, 8))))
      >>> live = parse_live_range(dump.live_range, texts[dump.live_range])
      >>> phases_of(live.sequence, parse_hlo(dump.hlo, texts[dump.hlo]))
      (Phase(name='forward', start=0, end=2), Phase(name='backward', start=3, end=5))
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


def phase_at(phases: Sequence[Phase], position: int) -> str:
    """The name of the phase holding schedule ``position``; ``program`` when none does."""
    for p in phases:
        if p.start <= position <= p.end:
            return p.name
    return "program"
