"""When nothing fits: what the fixed part's arithmetic says, and the one next step that works.

``compare`` ends a table where no row fits with :func:`next_step_lines`: the fixed part's
verdict and hints (``rk.search.check_budget``, the LoRA hint from the LoRA step's own breakdown,
:func:`lora_request`), then the first change whose step, compiled under ``full``, fits
(``rk.search.next_step``, at most :data:`MAX_NEXT_COMPILES` compiles), written as the flags
that make it. ``plan`` sizes its LoRA hint the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import warnings
from collections.abc import Sequence
from typing import Any

from remat_kit import sources
from remat_kit.analysis import MemoryReport
from remat_kit.cli._model import ModelRun, Request
from remat_kit.errors import DoesNotFit
from remat_kit.notes import Note, label, words
from remat_kit.render import length_words, progress
from remat_kit.search import Change, check_budget, next_step
from remat_kit.sources import Workload
from remat_kit.targets import Target, target, target_names

__all__ = [
    "LORA_RANK",
    "MAX_NEXT_COMPILES",
    "lora_request",
    "next_step_lines",
]


def next_step_lines(
    args: argparse.Namespace, run: ModelRun, reports: Sequence[MemoryReport]
) -> list[str]:
    """What to do when no row fits, as lines: why (the fixed part's verdict and hints from the
    breakdown's arithmetic, ``check_budget``), then the one next step that works, found by
    compiling ``full`` for at most two changes (``rk.search.next_step``), with its flags."""
    target = run.target
    w = sources.workload(run.source, target, run.config, depth=run.depth)
    lora = lora_request(run)
    try:
        check_budget(
            w, run.batch, target.usable_bytes, lora=None if lora is None else lora.workload(target)
        )
        smallest = min(reports, key=lambda r: r.peak_bytes)
        why = [
            words(
                Note(
                    "rows_none_fit",
                    {
                        "policy": label(smallest.policy, smallest.schedule),
                        "batch": run.batch,
                        "peak_bytes": smallest.peak_bytes,
                        "limit_bytes": target.usable_bytes,
                        "target": target.name,
                    },
                )
            )
        ]
    except DoesNotFit as err:
        why = [words(Note.from_dict(err.note))]
    full = next((r for r in reports if r.policy == "full" and r.schedule == "none"), None)
    changes = _changes(args, run, w, lora, full)
    if not changes:
        return why
    budget = min(MAX_NEXT_COMPILES, len(changes))
    length = length_words("next step", budget, bound=True)
    with warnings.catch_warnings(), progress("next step", total=budget, length=length) as step:
        warnings.simplefilter("ignore")
        found = next_step(changes, max_compiles=budget, progress=step)
    if found.fits:
        flags = _change_flags(found.change.to_dict(), run)
        why.append(f"[bold]next step:[/bold] {found.message}; run it with {flags}")
    else:
        why.append(
            f"{found.message}; remat-kit advise --scale-out finds a GPU count for every GPU."
        )
    return why


#: Targets that are no GPU of the catalogue.
SPECIAL = ("cpu", "local")

#: Compiles ``compare`` spends on the next step when nothing fits.
MAX_NEXT_COMPILES = 2

#: The LoRA rank a next step tries (a common one; the docs' examples use it).
LORA_RANK = 16


def lora_request(run: ModelRun) -> Request | None:
    """The run with LoRA adapters trained alone, where its kind takes a rank and has none."""
    if "lora" not in run.kind.fields or run.lora:
        return None
    spec = dataclasses.replace(run.spec, lora=LORA_RANK)
    return Request(spec, dataclasses.replace(run.config, lora=True), run.depth)


def _changes(
    args: argparse.Namespace,
    run: ModelRun,
    w: Workload,
    lora: Request | None,
    full: MemoryReport | None,
) -> list[Change]:
    """The changes to try, the smallest to the user first, each passing the breakdown's
    arithmetic (``check_budget``'s): with the fixed part under the limit, accumulation (the
    same global batch in smaller micro-batches) or a smaller batch; over it, one GPU with more
    usable memory than the compiled ``full`` needs, then fsdp over twice the GPUs (more
    GPUs first where the run has several already), then LoRA."""
    t, batch, config = run.target, run.batch, run.config
    limit = t.usable_bytes
    fraction = getattr(args, "mem_fraction", None)
    req = run.request
    out: list[Change] = []
    if w.fixed_bytes(batch) <= limit:
        if "accum" in run.kind.trains:
            for k in (2, 4):
                accum = config.accum * k
                if batch % accum == 0:
                    cfg = dataclasses.replace(config, accum=accum)
                    out.append(
                        Change(
                            "accum",
                            {"accum": accum, "micro_batch": batch // accum},
                            functools.partial(Request(run.spec, cfg, run.depth).workload, t),
                            batch,
                        )
                    )
        if batch > 1:
            cfg = dataclasses.replace(config, batch=batch // 2)
            out.append(
                Change(
                    "smaller_batch",
                    {"batch": batch // 2},
                    functools.partial(Request(run.spec, cfg, run.depth).workload, t),
                    batch // 2,
                )
            )
        return out
    need = w.fixed_bytes(batch) if full is None else full.peak_bytes
    gpus = []
    bigger = _bigger_gpu(t, need, fraction)
    if bigger is not None:
        on = target(bigger, devices=t.devices, hosts=t.hosts, mem_fraction=fraction)
        gpus.append(
            Change("bigger_gpu", {"target": bigger}, functools.partial(req.workload, on), batch)
        )
    # A GPU from a file is not in the catalogue: more of it cannot be named again here.
    if "shard" in run.kind.fields and t.name in target_names() and t.name not in SPECIAL:
        # The fewest GPUs, a power of two above today's count, that put each GPU's even share
        # of the fixed parts under the limit (check_budget's arithmetic).
        share = -(-w.fixed_bytes(batch) * t.devices // limit)
        n = 2 * t.devices
        while n < share:
            n *= 2
        on = target(t.name, devices=n, hosts=max(1, n // 8), mem_fraction=fraction)
        b = -(-batch // n) * n  # fsdp gives each GPU whole samples
        sharded = dataclasses.replace(req, config=dataclasses.replace(config, batch=b))
        gpus.append(
            Change(
                "shard",
                {"target": t.name, "devices": n, "batch": b},
                functools.partial(sharded.sharded(f"fsdp:{n}").workload, on),
                b,
            )
        )
    out += gpus if t.devices == 1 else gpus[::-1]
    if lora is not None:
        out.append(Change("lora", {"rank": LORA_RANK}, functools.partial(lora.workload, t), batch))
    return out


def _bigger_gpu(t: Target, need: int, fraction: float | None) -> str | None:
    """The GPU of the catalogue with the least usable memory that is over ``need`` bytes and
    over this one's (the limit every report's fits uses), or None."""
    best = None
    names = target_names("tpu" if t.kind == "tpu" else "gpu")  # the same kind of device
    for name in names:
        usable = target(name, mem_fraction=None if t.kind == "tpu" else fraction).usable_bytes or 0
        bigger = usable >= need and usable > (t.usable_bytes or 0)
        if bigger and (best is None or usable < best[0]):
            best = (usable, name)
    return None if best is None else best[1]


def _change_flags(change: dict[str, Any], run: ModelRun) -> str:
    """The flags that make ``change`` (the one place a next step is written as a command)."""
    kind = change["kind"]
    if kind == "accum":
        return f"--accum {change['accum']}"
    if kind == "smaller_batch":
        return f"--batch {change['batch']}"
    if kind == "bigger_gpu":
        return f"--target {change['target']}"
    if kind == "shard":
        n = change["devices"]
        hosts = f" --hosts {n // 8}" if n > 8 else ""
        grown = f" --batch {change['batch']}" if change["batch"] != run.batch else ""
        return f"--gpus {n}{hosts} --shard fsdp:{n}{grown}"
    return f"--lora {LORA_RANK}"
