"""Memory budgets: reading one, the limit a search works to, and what no policy can go under.

Example:
  >>> from remat_kit.search import parse_budget
  >>> parse_budget("52GiB")
  55834574848
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from remat_kit.errors import BadType, BadValue, DoesNotFit, UnitlessBudget
from remat_kit.notes import Note, hint_words, words
from remat_kit.policies import FULL, NO_REMAT
from remat_kit.schedules import NO_SCHEDULE
from remat_kit.sources._workload import FIXED_PARTS, Workload
from remat_kit.targets import Target, target_names
from remat_kit.targets import target as _target

__all__ = [
    "DEFAULT_HEADROOM",
    "check_budget",
    "parse_budget",
]

#: Share of the *usable* memory kept free beyond the runtime's own limit, by default none: the
#: limit is what a JAX process may allocate on the target (device memory times the allocator
#: fraction, ``Target.usable_bytes``; see remat_kit.targets.runtime), the same limit every
#: report's "fits" uses.
DEFAULT_HEADROOM = 0.0

#: Bytes in a GiB, for messages.
GIB = 2**30

_UNITS = {
    "": None,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
    "%": None,
}
_BUDGET_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z%]*)\s*$")


def parse_budget(text: str | float | int, device_bytes: int | None = None) -> int:
    """Reads a memory budget: ``"52GiB"``, ``"40GB"``, ``"0.8"`` or ``"80%"`` (of the device).

    Args:
      text: bytes with a unit (B, KB/MB/GB/TB in powers of 1000; KiB/MiB/GiB/TiB and the
        one-letter K/M/G/T in powers of 1024), a fraction of the device in (0, 1], or a
        percentage. An int is bytes; a float in (0, 1] a fraction.
      device_bytes: the device's memory, needed for fractions and checked against.

    Returns:
      The budget in bytes.

    Raises:
      BadValue: unreadable text, a non-positive budget, or a budget above ``device_bytes``
        (``param="budget"``).
      UnitlessBudget: a bare number above 1 (bytes need a unit), or a fraction without a
        device size.
      BadType: neither a string nor a number.

    Example:
      >>> parse_budget("52GiB"), parse_budget("0.5", device_bytes=80 * 10**9)
      (55834574848, 40000000000)
    """
    if isinstance(text, bool):
        raise BadType(f"budget must be a string or number, got {text!r}", param="budget")
    if isinstance(text, int):
        value, unit = float(text), "b"
    elif isinstance(text, float):
        value, unit = text, ""
    elif isinstance(text, str):
        m = _BUDGET_RE.match(text)
        if not m or m.group(2).lower() not in _UNITS:
            raise BadValue(
                f"cannot read budget {text!r}: write e.g. 52GiB, 40GB, 0.8 (fraction of the "
                "device) or 80%",
                param="budget",
            )
        value, unit = float(m.group(1)), m.group(2).lower()
    else:
        raise BadType(
            f"budget must be a string or number, got {type(text).__name__} {text!r}",
            param="budget",
        )
    if value <= 0:
        raise BadValue(f"budget {text!r} must be positive", param="budget")
    if unit in ("", "%"):
        frac = value / 100.0 if unit == "%" else value
        if unit == "" and value > 1:
            raise UnitlessBudget(
                f"budget {text!r} is a bare number above 1: give a unit (52GiB, 40GB) or a "
                "fraction of the device in (0, 1]",
                param="budget",
            )
        if frac > 1:
            raise BadValue(f"budget {text!r} is more than the whole device", param="budget")
        if device_bytes is None:
            raise UnitlessBudget(
                f"budget {text!r} is a fraction of the device but the target has no memory "
                "size: give bytes with a unit, e.g. 52GiB",
                param="budget",
            )
        return int(frac * device_bytes)
    budget = int(value * _UNITS[unit])
    if device_bytes is not None and budget > device_bytes:
        raise BadValue(
            f"budget {text!r} ({budget / GIB:.2f} GiB) is larger than the device's "
            f"{device_bytes / GIB:.2f} GiB; give at most {device_bytes / GIB:.1f}GiB or a "
            "fraction such as 0.9",
            param="budget",
        )
    return budget


def limit_for(target: Target, budget: int | None, headroom: float) -> int:
    """The bytes a search works to: ``budget``, or the usable memory less ``headroom`` of it.

    The usable memory is what a JAX process may allocate on the target
    (``Target.usable_bytes``: device memory times the allocator fraction).

    Raises:
      ValueError: a headroom outside [0, 1), a target without a memory size and no budget, a
        non-positive budget or one above the device.
      TypeError: a budget that is not an int of bytes.
    """
    if not 0.0 <= headroom < 1.0:
        raise BadValue(f"headroom={headroom!r} must be in [0, 1)", param="headroom")
    mem = target.memory_bytes
    if budget is None:
        usable = target.usable_bytes
        if usable is None:
            raise BadValue(
                f"target {target.name!r} has no memory size: give a budget in bytes, e.g. 16GiB",
                param="budget",
            )
        return int(usable * (1.0 - headroom))
    if isinstance(budget, bool) or not isinstance(budget, int):
        raise BadType(
            f"budget must be an int of bytes (see rk.parse_budget), got {budget!r}",
            param="budget",
        )
    if budget <= 0:
        raise BadValue(f"budget={budget} must be positive", param="budget")
    if mem is not None and budget > mem:
        raise BadValue(
            f"budget {budget / GIB:.2f} GiB is larger than {target.name}'s "
            f"{mem / GIB:.2f} GiB of device memory",
            param="budget",
        )
    return budget


def check_budget(
    workload: Workload, batch: int, budget: int, *, lora: Workload | None = None
) -> None:
    """Raises if ``budget`` is below what no rematerialization can remove.

    Weights, gradients, optimizer state, the batch and a gradient accumulator stay whatever
    the policy; a budget below their sum is infeasible before any activation is counted. A
    scanned stack holds every gradient at once; an unrolled one need not (XLA may apply each
    layer's update as soon as its gradient exists), so when only the gradients put the sum over
    the budget, the compiled step decides: ``full``, and where it is over the budget ``none``
    too, the budget refused only where both are over it. Neither is always the smaller: where
    the activations are small beside the update (a short sequence), ``full``'s recomputed
    temporaries put it over ``none`` (the llama3.2-1b preset at 2 layers, b1 s128, adamw: a few
    hundred bytes). One compile, two at most, both shared with the search.

    Args:
      workload: the step (its breakdown gives the fixed parts).
      batch: the batch to check.
      budget: bytes.
      lora: the same step with LoRA adapters trained alone, where there is one: its
        breakdown (traced, as ``report --lora`` shows it) sizes the LoRA hint; None: no
        LoRA hint, since nothing computes it.

    Raises:
      DoesNotFit: with the byte breakdown (``parts``, ``fixed_bytes``) and what would fit
        instead (``hints``: SGD, LoRA, a GPU with more memory, more GPUs sharded), each from
        the breakdown's arithmetic, judged against the limit it names, and offered only where
        that arithmetic puts the fixed parts under it; a ``ValueError``, with all of that in
        its message.

    Example:
      >>> check_budget(w, 2, 2**20)  # 1 MiB: enough
      >>> check_budget(w, 2, 10_000)
      Traceback (most recent call last):
      remat_kit.errors.DoesNotFit: tiny_model s16 sgd does not fit ... whatever the policy: ...
    """
    parts = workload.breakdown(batch)
    fixed = sum(parts.get(k, 0) for k in FIXED_PARTS)
    if fixed <= budget:
        return
    measured = None
    if fixed - parts.get("gradients", 0) <= budget:
        # Every gradient live at once is what a scanned stack does (its gradients are one
        # stacked carry); an unrolled one may apply each layer's update as its gradient is
        # formed, so the shapes overstate the floor. Weights, optimizer state and the batch are
        # inputs and stay: only in this band do the compiled steps decide, the least of
        # `full` and `none` (with small activations `full`'s recomputation peaks higher).
        for policy in (FULL, NO_REMAT):
            peak = workload.compiled(policy, NO_SCHEDULE, batch).peak_bytes
            measured = peak if measured is None else min(measured, peak)
            if measured <= budget:
                return
    lora_fixed = None if lora is None else lora.fixed_bytes(batch)
    hints = _what_would_fit(workload, parts, fixed, budget, lora_fixed, measured)
    fixed_parts = {k: parts[k] for k in FIXED_PARTS if k in parts}
    note = Note(
        "fixed_over_budget",
        {
            "label": workload.label,
            "target": workload.target.name,
            "limit_bytes": budget,
            "parts": fixed_parts,
            "fixed_bytes": fixed,
            "compiled_bytes": measured,
            "hints": hints,
        },
    )
    raise DoesNotFit(
        words(note),
        target=workload.target.name,
        limit_bytes=budget,
        parts=fixed_parts,
        hints=[hint_words(h) for h in hints],
        note=note.to_dict(),
    )


#: A sharding hint past this many GPUs is no hint: the budget is a typo (1KiB for 1 GiB).
MAX_GPUS_HINT = 1024


def _what_would_fit(
    workload: Workload,
    parts: Mapping[str, int],
    fixed: int,
    budget: int,
    lora_fixed: int | None = None,
    measured: int | None = None,
) -> list[dict[str, Any]]:
    """What would fit instead, as data (:data:`remat_kit.notes.HINT_KINDS`).

    Each hint is the breakdown's own arithmetic (no margin guessed for activations) and is
    offered only where it puts what no policy removes under the limit it names: a necessary
    condition, which a compile (``remat_kit.search.next_step``) turns into an answer.

    Args:
      workload: the step.
      parts: its breakdown at the batch (per GPU when sharded).
      fixed: the fixed parts (weights, gradients, optimizer state, batch, accumulator).
      budget: the limit, bytes.
      lora_fixed: the fixed parts of the same step trained with LoRA, or None.
      measured: the least compiled peak of ``full`` and ``none`` where they were compiled:
        what another GPU must hold of this step (it may hold fewer gradients at once than the
        parts say).
    """
    # What a GPU must hold to run this very step: the compiled `full`/`none`, else the parts.
    need = fixed if measured is None else measured
    hints: list[dict[str, Any]] = []
    state = parts.get("optimizer", 0)
    if state and fixed - state <= budget:
        # No optimizer state to keep: the rest is under the limit.
        hints.append(
            {
                "kind": "sgd",
                "fixed_bytes": fixed - state,
                "from_bytes": fixed,
                "limit_bytes": budget,
            }
        )
    if lora_fixed is not None and parts.get("gradients", 0) and lora_fixed <= budget:
        hints.append(
            {
                "kind": "lora",
                "fixed_bytes": lora_fixed,
                "limit_bytes": budget,
            }
        )
    devices = workload.target.devices
    hint = _device_hint(workload.target, need)
    if hint is not None:
        hints.append(hint)
    # Sharded over all GPUs (FSDP/ZeRO-3) the fixed parts of all of them split evenly: the
    # fewest GPUs in all, more than now, that puts each GPU's share under the limit.
    total = fixed * devices
    n = max(devices + 1, math.ceil(total / budget))
    if n <= MAX_GPUS_HINT:
        hints.append(
            {
                "kind": "shard",
                "gpus": n,
                "each_bytes": total / n,
                "devices": devices,
                "limit_bytes": budget,
            }
        )
    else:
        hints.append(
            {"kind": "no_realistic", "budget_bytes": budget, "fixed_bytes": fixed, "gpus": n}
        )
    return hints


def _device_hint(target: Target, need: int) -> dict[str, Any] | None:
    """A budget the device gives where it holds the ``need`` bytes of this step
    (``larger_budget``), else the smallest GPUs that hold them (``bigger_gpu``); None: none
    does."""
    here = target.usable_bytes  # what a process may use: None where not known
    if here is not None and need <= here:  # the budget asked for less than the device gives
        return {
            "kind": "larger_budget",
            "target": target.name,
            "usable_bytes": here,
            "fixed_bytes": need,
            "budget_gib": max(1, math.ceil(need / GIB)),
        }
    # A GPU whose usable memory (the same limit every report's fits uses) holds the fixed
    # parts as this step's mesh splits them.
    bigger = [
        [t.name, usable]
        for t, usable in _gpus(target.mem_fraction)
        if usable >= need and usable > (here or 0)
    ]
    if bigger:
        # The smallest that hold them: the cheapest change of GPU.
        bigger.sort(key=lambda g: (g[1], g[0]))
        return {"kind": "bigger_gpu", "gpus": bigger[:BIGGER_SHOWN], "fixed_bytes": need}
    return None


#: GPUs a ``bigger_gpu`` hint names at most (the smallest that hold the fixed parts).
BIGGER_SHOWN = 3


def _gpus(mem_fraction: float | None) -> list[tuple[Target, int]]:
    """Every GPU of the catalogue with what a process may use on it at ``mem_fraction`` (the
    step's own allocator fraction; None: each GPU's default)."""
    out = []
    for name in target_names("gpu"):  # a GPU's step is pointed at another GPU
        t = _target(name)
        if mem_fraction is not None and t.memory_bytes:
            try:
                t = t.with_mem_fraction(mem_fraction)
            except BadValue:  # more than that card's allocator may take
                continue
        out.append((t, t.usable_bytes or 0))
    return out
