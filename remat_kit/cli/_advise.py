"""``remat-kit advise``: for every GPU, does the step fit, with which plan (and how many GPUs)."""

from __future__ import annotations

import argparse
import functools
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Executor

from remat_kit import _workers
from remat_kit.cli._model import ModelRun, Request, print_notes, resolve
from remat_kit.cli._next import lora_request
from remat_kit.cli._placement import check_cluster, cluster_executor
from remat_kit.cli._values import flag_items
from remat_kit.errors import BadValue
from remat_kit.render import (
    ADVISE_DROP,
    advise_table,
    console,
    fitted,
    length_words,
    progress,
    write_json,
)
from remat_kit.search import (
    Advice,
    Cost,
    ScaleOut,
    advise,
    cost_of,
    gpus_needed,
    rank_costs,
)
from remat_kit.sources import Workload
from remat_kit.targets import (
    Price,
    Target,
    is_slice_name,
    load_prices,
    parse_prices,
    target,
    target_names,
)

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Plans the step on every target (and, with ``--scale-out``, the GPU count where one does
    not fit); prints the table, which says for each GPU why not and what would; writes --json.

    Args:
      args: parsed arguments of the ``advise`` parser.

    Returns:
      The exit code: 0, or 1 when no GPU fits (nor, with ``--scale-out``, any count of them).

    Raises:
      BadValue: an unknown name in ``--targets``, or a bad model or size.

    Example:
      ``remat-kit advise --model tiny-llama --targets h100,l4`` parses its flags and calls this.
    """
    # The caption's time is this command's: from here, past the plans and the scale-out, to
    # the table (what comes before is Python importing jax, a few seconds).
    start = time.perf_counter()
    # Every value, the output path included, is checked before the first trace or compile.
    if "--target" in getattr(args, "given", ()):
        raise BadValue(
            f"--target {args.target}: advise compares GPUs; name them with --targets "
            f"{args.target}[,OTHER...] (default: every GPU of the catalogue)"
        )
    if getattr(args, "node", None):
        raise BadValue(
            f"--node {args.node}: advise compares GPUs of every kind, and a node holds one; "
            "give --node to report, compare, plan or fit with its --target"
        )
    if getattr(args, "slices", 1) != 1:
        raise BadValue(
            f"--slices {args.slices}: advise plans each TPU generation on one slice (a chip, "
            "or with --scale-out the smallest slice that fits); give --slices to report, "
            "compare, plan or fit with a slice as --target (--target v5p-64 --slices 2)",
            param="slices",
        )
    check_cluster(args)
    run = resolve(args)
    prices, names = _checked(args, run)
    print_notes(run, args.wide)
    with cluster_executor(args) as executor:  # connected before any compile
        return _advise(args, run, prices, names, executor, start)


def _advise(
    args: argparse.Namespace,
    run: ModelRun,
    prices: dict[str, Price],
    names: list[str] | None,
    executor: Executor | None,
    start: float,
) -> int:
    """Plans every target (here, in ``--jobs`` processes or on the ``--cluster``), then
    ``--scale-out``; prints."""
    lora = lora_request(run)
    gpus = len(names) if names is not None else len(_catalogue_gpus())
    planned: list[str] = []
    length = length_words(
        "advise",
        gpus,
        unit="GPUs",
        how="each planned by compiling, adaptively: its plan, then its largest batch",
    )

    def step_done(words: str) -> None:
        planned.append(words)
        step(words)

    done = functools.partial(len, planned)
    with (
        warnings.catch_warnings(),
        progress("advise", total=gpus, done=done, unit="GPUs", length=length) as step,
    ):
        warnings.simplefilter("ignore")  # the tables show what matters
        rows = advise(
            # A partial of a module-level function: it pickles, so --jobs can use workers.
            functools.partial(
                _target_workload, run.request, args.gpus, args.hosts, args.mem_fraction
            ),
            run.batch,
            targets=names,
            headroom=args.headroom,
            offload=not args.no_offload,
            hide=args.hide,
            jobs=args.jobs,
            progress=step_done,
            # The LoRA hint from the LoRA step's own breakdown, as compare's and plan's.
            lora_for=None
            if lora is None
            else functools.partial(
                _target_workload, lora, args.gpus, args.hosts, args.mem_fraction
            ),
            executor=executor,
        )
    scale: dict[str, ScaleOut] = {}
    scale_seconds = None
    if args.scale_out:
        before = time.perf_counter()
        over = sum(not a.fits for a in rows)
        length = length_words(
            "advise --scale-out",
            over * len(SCALE_COUNTS),
            bound=True,
            how=f"fsdp over {', '.join(map(str, SCALE_COUNTS))} GPUs for each of the {over} "
            "GPUs one cannot serve, stopping at the first count that fits",
        )
        scaled: list[int] = []
        with progress(
            "advise --scale-out",
            total=over,
            done=functools.partial(len, scaled),
            unit="GPUs",
            length=length,
        ) as step:
            scale = _scale_out(args, run.request, rows, step, scaled, executor)
        scale_seconds = time.perf_counter() - before
    costs = rank_costs([cost_of(a, scale.get(a.target), prices) for a in rows], args.rank)
    return _print_advice(args, run, rows, scale, scale_seconds, costs, start)


def _checked(args: argparse.Namespace, run: ModelRun) -> tuple[dict[str, Price], list[str] | None]:
    """``--scale-out``, the prices and ``--targets``, checked before any compile:
    ``(prices, target names or None for the catalogue)``.

    Raises:
      BadValue: ``--scale-out`` for a source without a mesh plan, a bad price or price file,
        an unknown name in ``--targets`` or a GPU the step cannot run on (its attention
        kernel, its sizes).
    """
    if args.scale_out and "shard" not in run.kind.fields:
        raise BadValue(
            f"--scale-out shards the step with fsdp over more GPUs; a {run.kind.name} source "
            "takes no mesh plan: drop --scale-out"
        )
    # Prices are read before any compile: a bad one is one line, not a search's end.
    prices = {} if args.price_file is None else load_prices(args.price_file)
    prices.update(parse_prices(args.price))
    names = None
    if args.targets is not None:
        names = flag_items(args.targets, "--targets", example="h100,a100-80gb")
        for name in names:
            try:
                t = target(name, devices=args.gpus, hosts=args.hosts)
            except BadValue as err:  # its param is "target": name this flag, not --target
                raise BadValue(f"--targets {name!r}: {err}") from None
            run.source.check(run.config, t)  # the attention kernel and sizes for that GPU
    return prices, names


def _print_advice(
    args: argparse.Namespace,
    run: ModelRun,
    rows: list[Advice],
    scale: dict[str, ScaleOut],
    scale_seconds: float | None,
    costs: list[Cost],
    start: float,
) -> int:
    """Prints the table (rows by cost), writes ``--json``; the exit code: 1 when no GPU
    fits, nor any count of them with ``--scale-out``, else 0."""
    order = {c.target: i for i, c in enumerate(costs)}
    rows = sorted(rows, key=lambda a: order[a.target])
    out = console(args.wide)
    # Every row says why it does not fit and what would (the GPU count with --scale-out): the
    # table is the answer; each message is in --json.
    table = advise_table(
        rows,
        run,
        headroom=args.headroom,
        seconds=time.perf_counter() - start,
        scale_out=scale if args.scale_out else None,
        scale_seconds=scale_seconds,
        costs={c.target: c for c in costs},
    )
    out.print(fitted(table, out.width, ADVISE_DROP))
    if args.json:
        data = [
            {
                **a.to_dict(),
                "scale_out": scale[a.target].to_dict() if a.target in scale else None,
                "cost": costs[order[a.target]].to_dict(),
            }
            for a in rows
        ]
        write_json(args.json, data, flag="--json")
    if not any(a.fits for a in rows) and not any(s.devices for s in scale.values()):
        # Exit code 1: the search ran and found nothing that fits (docs/commands/index.md,
        # "Exit codes").
        sys.stderr.write(
            f"remat-kit: nothing fits: no GPU of {', '.join(a.target for a in rows)} fits "
            f"{run.model} batch {run.batch}"
            + ("" if args.scale_out else " (--scale-out tries several GPUs)")
            + "\n"
        )
        return 1
    return 0


#: The GPU counts ``--scale-out`` compiles, in order, until one fits.
SCALE_COUNTS = (2, 4, 8, 16, 32, 64)


def _catalogue_gpus() -> list[str]:
    """The GPUs ``advise`` plans when no ``--targets`` are named (``rk.advise``'s default)."""
    return [n for n in target_names() if n not in ("cpu", "local")]


def _target_workload(
    request: Request, gpus: int, hosts: int, mem_fraction: float | None, t: Target
) -> Workload:
    """The step's Workload on ``t`` with ``--gpus``/``--hosts``/``--mem-fraction``; a TPU
    slice named with its size (``v5p-64``, as ``t`` was built from ``--targets``) keeps it."""
    if is_slice_name(t.name):  # --mem-fraction and --hosts are the GPUs' (a TPU has neither)
        # t.name is the generation: rebuilt from it with devices=1, v5p-64 would be one chip.
        # A bare generation was built at one chip, so --gpus (when given) sizes it.
        return request.workload(t if gpus == 1 else target(t.name, devices=gpus))
    return request.workload(target(t.name, devices=gpus, hosts=hosts, mem_fraction=mem_fraction))


def _sharded_workload(request: Request, name: str, mem_fraction: float | None, n: int) -> Workload:
    """The step on ``n`` GPUs ``name`` with fsdp over all of them, 8 GPUs per host (as in the
    DGX/HGX machines these cards come in)."""
    # a TPU slice's hosts are Cloud TPU's (4 chips each) and it has no allocator fraction
    if is_slice_name(name):
        on = target(name, devices=n)
    else:
        on = target(name, devices=n, hosts=max(1, n // 8), mem_fraction=mem_fraction)
    return request.sharded(f"fsdp:{n}" if n > 1 else None).workload(on)


def _scale_counts(name: str) -> tuple[int, ...]:
    """The device counts ``--scale-out`` tries on ``name``: :data:`SCALE_COUNTS`, less, on a
    TPU, those that make no slice libtpu builds. Above one chip libtpu groups a slice's chips
    into hosts of 2x2x1 and refuses a grid those do not divide: two chips (``v5e:1x2``,
    ``v5p:1x2x1``; 4 TPU7x devices) are no slice, nor one Cloud TPU sells (MaxText's table
    starts v5e and v6e at 1 then 4 chips, v4 and v5p at 4, TPU7x at 1 then 4)."""
    if not is_slice_name(name):
        return SCALE_COUNTS
    counts = []
    for n in SCALE_COUNTS:
        s = target(name, devices=n).tpu_slice
        bounds = s.chips_per_host_bounds  # (1, 1, 1) for a lone chip
        if all(side % b == 0 for side, b in zip(s.grid, bounds, strict=False)):
            counts.append(n)
    return tuple(counts)


def _gpus_needed(
    request: Request, mem_fraction: float | None, headroom: float, name: str
) -> ScaleOut:
    """The fewest GPUs ``name`` that fit with fsdp + full (module-level, for a worker)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gpus_needed(
            functools.partial(_sharded_workload, request, name, mem_fraction),
            request.config.batch,
            counts=_scale_counts(name),
            headroom=headroom,
        )


def _scale_out(
    args: argparse.Namespace,
    request: Request,
    rows: Sequence[Advice],
    step: Callable[[str], None],
    done: list[int] | None = None,
    executor: Executor | None = None,
) -> dict[str, ScaleOut]:
    """For each target one GPU cannot serve: the fewest GPUs that fit with fsdp + full; the
    targets side by side in ``--jobs`` worker processes once one needs a compile (``done``
    gets the index of each as it ends), or on the ``--cluster``'s ``executor``."""
    names = [a.target for a in rows if not a.fits]
    one = functools.partial(_gpus_needed, request, args.mem_fraction, args.headroom)

    def on_done(i: int, so: ScaleOut) -> None:
        if done is not None:
            done.append(i)
        step(f"{so.target}: {so.devices or 'no'} GPUs")

    found = _workers.run(one, names, args.jobs, on_done=on_done, executor=executor)
    return dict(zip(names, found, strict=True))
