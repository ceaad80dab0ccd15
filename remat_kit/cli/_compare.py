"""``remat-kit compare``: a table of policies (and schedules) for one model and target."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time
import warnings
from typing import Any

from remat_kit import _workers, sources
from remat_kit.analysis import MemoryReport
from remat_kit.cli._model import Request, resolve, run_notes
from remat_kit.cli._values import flag_items, policy_arg, schedule_arg
from remat_kit.comparison import compare_rows
from remat_kit.errors import BadValue
from remat_kit.notes import Note, label, shared_words, words
from remat_kit.policies import NO_REMAT
from remat_kit.render import (
    SCHEDULER_WORDS,
    compare_table,
    console,
    fitted,
    length_words,
    progress,
    write_csv,
    write_json,
    xla_limits_words,
)
from remat_kit.search import FRONT_POLICIES, Change
from remat_kit.targets import target, target_names

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Compiles every (policy, schedule) for the target; prints the table, writes --json/--csv.

    Args:
      args: parsed arguments of the ``compare`` parser.

    Returns:
      The exit code (0).

    Raises:
      BadValue: empty ``--policies`` or ``--schedules``, or an unknown name in them (before
        any compile), or a bad model, target or size.

    Example:
      ``remat-kit compare --model tiny-llama --policies none,full`` parses its flags and calls this.
    """
    # Every value, output paths included, is checked before the first trace or compile.
    run = resolve(args)
    target = run.target
    specs = flag_items(args.policies, "--policies", example="none,full,minimal")
    policies = [policy_arg(s, "--policies", own_names=run.own_names) for s in specs]
    # One whose tags the model lacks is skipped and named under the table; where the user
    # named them all, or one half-matches (a typo), it is an error (before any compile).
    policies, skipped = sources.usable_policies(
        run.source,
        run.config,
        target,
        policies,
        given=args.policies != ",".join(FRONT_POLICIES),
    )
    sched_specs = args.schedules.replace(";", " ").split()
    schedules = [schedule_arg(s, "--schedules", run.n_layers) for s in sched_specs]
    if not schedules:
        raise BadValue("--schedules is empty; give e.g. 'none;every:2;sqrt'")
    cases = [(p, s) for s in schedules for p in policies]
    start = time.perf_counter()
    # The recompute overhead is against the FLOPs of "none". A "none" row counts them from
    # its own trace, so a separate trace of them (two shallow copies of an unrolled model:
    # a tenth of compare's time) is made only without one. Not for a sharded step, whose
    # rows trace the program the mesh runs.
    plain = [i for i, (p, s) in enumerate(cases) if p.spec == "none" and s.name == "none"]
    if run.source.mesh_plan(target) is not None:
        plain = []
    baseline = None if plain else sources.step_flops(run.source, NO_REMAT, target, run.config)
    # The programs are independent: with --jobs N they compile side by side in N processes
    # (not for a local target: workers compile for jax's CPU platform).
    jobs = 1 if target.kind == "local" else args.jobs
    done: list[int] = []
    what = f"compare on {target.name}" + (
        f" in {min(jobs, len(cases))} processes" if jobs > 1 else ""
    )
    length = length_words(what, len(cases), how="one per policy and schedule")
    with progress(what, total=len(cases), done=lambda: len(done), length=length) as step:
        step(f"{label(cases[0][0].spec, cases[0][1].spec)}")

        def on_done(i: int, r: MemoryReport) -> None:
            done.append(i)
            if len(done) < len(cases):
                step(f"{label(r.policy, r.schedule)} done")

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # printed once, after the table
            reports = _workers.run(
                functools.partial(_measure_case, run.request, target, baseline),
                [(p.spec, sch.spec) for p, sch in cases],
                jobs,
                on_done=on_done,
            )
    if baseline is None:
        baseline = reports[plain[0]].flops
        if baseline:  # as measure() takes it: no FLOPs, no overhead
            reports = [sources.with_baseline(r, baseline) for r in reports]
    return _print_rows(args, run, reports, skipped, time.perf_counter() - start)


def _print_rows(
    args: argparse.Namespace,
    run: Any,
    reports: list[MemoryReport],
    skipped: list[str],
    seconds: float,
) -> int:
    """Prints the table and the notes the rows share (once, naming the rows), writes
    ``--json`` and ``--csv``; the exit code (0)."""
    target = run.target
    rows = compare_rows(reports)
    out = console(args.wide)
    out.print(fitted(compare_table(rows, target, run, seconds), out.width))
    if skipped:
        there = ", ".join(sources.tags(run.source, run.config, target)) or "none"
        out.print(
            f"not compared (the model tags none of their tensors): {', '.join(skipped)}; "
            f"the model's tags: {there}"
        )
    for line in run_notes(run):
        out.print(f"[yellow]note:[/yellow] {line}")
    # Not fitting and XLA's own remat are in the table's fits column already; a note that
    # several rows share (an XLA log line about the inputs) is printed once, naming them.
    shared: dict[str, list[str]] = {}
    for r in reports:
        for note in r.notes:
            if note.kind not in ("does_not_fit", "xla_remat"):
                shared.setdefault(shared_words(note), []).append(label(r.policy, r.schedule))
    limits = xla_limits_words(
        target,
        [r.xla_remat_limit_bytes for r in reports if r.xla_remat_limit_bytes],
        any(SCHEDULER_WORDS in line for line in shared),
    )
    if limits and shared:
        out.print(limits)
    for note, labels in shared.items():
        who = f"all {len(labels)} rows" if len(labels) == len(reports) > 1 else ", ".join(labels)
        out.print(f"[yellow]{who}:[/yellow] {note}")
    if reports and not any(r.fits for r in reports if r.fits is not None) and target.usable_bytes:
        lines = _next_steps(args, run, reports)
        out.print(f"[bold]nothing fits:[/bold] {lines[0]}")
        for line in lines[1:]:
            out.print(line)
    if args.json:
        write_json(args.json, rows, flag="--json")
    if args.csv:
        write_csv(args.csv, rows, flag="--csv")
    return 0


def _measure_case(
    request: Request, target: Any, baseline: float | None, case: tuple[str, str]
) -> Any:
    """One row of the comparison: the report of ``(policy spec, schedule spec)``; a module-level
    function of the picklable request, so a worker process can run it."""
    from remat_kit.policies import parse_policy
    from remat_kit.schedules import parse_schedule

    policy, schedule = case
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sources.measure(
            request.source(),
            parse_policy(policy),
            target,
            request.config,
            schedule=parse_schedule(schedule),
            baseline=baseline,
            depth=request.depth,
        )


def _next_steps(args: argparse.Namespace, run: Any, reports: Any) -> list[str]:
    """What to do when no row fits, as lines: why (the fixed part's verdict and hints from the
    breakdown's arithmetic, ``check_budget``), then the one next step that works, found by
    compiling ``full`` for at most two changes (``rk.search.next_step``), with its flags."""
    from remat_kit.errors import DoesNotFit
    from remat_kit.search import check_budget, next_step

    target = run.target
    w = sources.workload(run.source, target, run.config, depth=run.depth)
    lora = _lora_request(run)
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

#: The LoRA rank a next step tries (a common one; README's examples use it).
LORA_RANK = 16


def _lora_request(run: Any) -> Request | None:
    """The run with LoRA adapters trained alone, where its kind takes a rank and has none."""
    if "lora" not in run.kind.fields or run.lora:
        return None
    spec = dataclasses.replace(run.spec, lora=LORA_RANK)
    return Request(spec, dataclasses.replace(run.config, lora=True), run.depth)


def _changes(
    args: argparse.Namespace, run: Any, w: Any, lora: Request | None, full: Any
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


def _bigger_gpu(t: Any, need: int, fraction: Any) -> str | None:
    """The GPU of the catalogue with the least usable memory that is over ``need`` bytes and
    over this one's (the limit every report's fits uses), or None."""
    best = None
    for name in target_names():
        if name in SPECIAL:
            continue
        usable = target(name, mem_fraction=fraction).usable_bytes or 0
        bigger = usable >= need and usable > (t.usable_bytes or 0)
        if bigger and (best is None or usable < best[0]):
            best = (usable, name)
    return None if best is None else best[1]


def _change_flags(change: dict[str, Any], run: Any) -> str:
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
