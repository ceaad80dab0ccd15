"""``remat-kit plan``: the cheapest plan whose compiled peak fits a budget, and its Pareto front."""

from __future__ import annotations

import argparse
import functools
import sys
import warnings
from collections.abc import Sequence

from remat_kit import sources
from remat_kit.cli._model import ModelRun, print_caveats, print_notes, resolve, with_spread
from remat_kit.cli._next import lora_request
from remat_kit.cli._placement import check_cluster, cluster_executor
from remat_kit.cli._values import budget_arg, flag_items, host_budget_arg, policy_arg
from remat_kit.notes import words
from remat_kit.policies import Policy
from remat_kit.render import (
    compiling_words,
    console,
    decision_table,
    fitted,
    length_words,
    opts_precision,
    plan_table,
    plot_front,
    progress,
    run_words,
    write_json,
)
from remat_kit.search import (
    FRONT_POLICIES,
    FrontPoint,
    Plan,
    PlanFront,
    check_budget,
    compile_bound,
    limit_for,
    plan_front,
)
from remat_kit.sources import Workload

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Plans under the budget; prints the plan and front tables, writes --json/--plot.

    Args:
      args: parsed arguments of the ``plan`` parser.

    Returns:
      The exit code: 0 when the plan fits the budget, 1 when nothing does (the planner's
      message goes to stderr).

    Raises:
      BadValue: an unreadable budget, one over the device, or an unknown policy in
        ``--policies`` (before any compile); ``--cluster`` without Dask, or with no
        scheduler at its address.
      DoesNotFit: the budget is below what no policy removes (the CLI exits 1 on it).

    Example:
      ``remat-kit plan --model tiny-llama --budget 0.5`` parses its flags and calls this.
    """
    check_cluster(args)  # Dask's absence is one line, before the model is read
    # Every value, output paths included, is checked before the first trace or compile.
    run = resolve(args)
    target = run.target
    budget = None if args.budget is None else budget_arg(args.budget, target.memory_bytes)
    specs = flag_items(args.policies, "--policies", example="full,minimal", allow_empty=True)
    catalogue = [policy_arg(s, "--policies", own_names=run.own_names) for s in specs]
    # The default catalogue drops policies whose tags the model lacks; named ones must match.
    catalogue, skipped = sources.usable_policies(
        run.source,
        run.config,
        target,
        catalogue,
        given=args.policies != ",".join(FRONT_POLICIES),
    )
    # One the model's steps cannot take (MaxText's pipeline and an offload no config line
    # sets) is left out, with the source's reason; one the user named is refused as it is
    # built.
    refused = []
    if args.policies == ",".join(FRONT_POLICIES):
        catalogue, refused = sources.buildable_policies(run.source, run.config, target, catalogue)
    host_budget = None if args.host_budget is None else host_budget_arg(args.host_budget)
    w = sources.workload(run.source, target, run.config, depth=run.depth)
    print_notes(run, args.wide)
    with cluster_executor(args) as executor:  # connected before any compile
        # --jobs / --cluster: the front's catalogue and schedules compile side by side.
        w = with_spread(w, args, run, executor)
        found = _search(args, run, w, budget, catalogue, host_budget)
    if skipped:
        console(args.wide).print(
            f"not on the front (the model tags none of their tensors): {', '.join(skipped)}"
        )
    for note in refused:
        console(args.wide).print(f"not on the front: {words(note)}", highlight=False)
    return _print_plan(args, run, w, found)


def _search(
    args: argparse.Namespace,
    run: ModelRun,
    w: Workload,
    budget: int | None,
    catalogue: list[Policy],
    host_budget: int | None,
) -> PlanFront:
    """The budget checked, the bound said, then the plan and its front (a progress line)."""
    target = run.target
    # A budget below what no policy removes is one line (exit 1), before the search's length.
    lora = lora_request(run)  # sizes the LoRA hint, as compare's (traced, no compile)
    check_budget(
        w,
        run.batch,
        limit_for(target, budget, args.headroom),
        lora=None if lora is None else lora.workload(target),
    )
    bound = compile_bound(w, catalogue, sweep=args.sweep)
    length = length_words(
        "plan",
        bound,
        bound=True,
        how="none, the solver's plans, full's schedules if none of them fits, and the "
        f"{len(catalogue)} policies beside it; fewer once one fits"
        if bound is not None
        else "--sweep plans at the budgets the front finds",
    )
    done = functools.partial(getattr, w, "compiles")
    with (
        warnings.catch_warnings(),
        progress(
            "plan",
            total=bound,
            done=done,
            length=length,
            now=functools.partial(compiling_words, [w], policy=True),
        ) as step,
    ):
        warnings.simplefilter("ignore")  # the tables show what matters
        # --sweep adds the whole curve; --plot only draws: what is dominated must not depend
        # on whether it is drawn.
        return plan_front(
            w,
            run.batch,
            budget,
            catalogue=catalogue,
            host_budget=host_budget,
            offload=not args.no_offload,
            hide=args.hide,
            headroom=args.headroom,
            sweep=args.sweep,
            objective=args.objective,
            progress=step,
        )


def _print_plan(args: argparse.Namespace, run: ModelRun, w: Workload, found: PlanFront) -> int:
    """Prints the plan and front tables and how to use the plan, writes ``--plot`` and
    ``--json``; the exit code: 0 when the plan fits the budget, else 1."""
    p, points, target = found.plan, found.points, run.target
    out = console(args.wide)
    table = plan_table(
        p,
        points,
        target,
        run,
        plan_seconds=found.plan_seconds,
        seconds=found.seconds,
        compiles=w.compiles,
    )
    out.print(fitted(table, out.width))
    out.print(fitted(decision_table(p), out.width))
    # A program that fits the budget only because XLA's own remat pass stepped in.
    print_caveats(found.caveats, args.wide)
    if not p.fits:
        sys.stderr.write(f"remat-kit: {p.message}\n")
    else:
        out.print(p.message)
        out.print(_use_it(p, run.source.applies_in_code, _alike(p, points)))
        lines = _config_lines(run, p)
        if lines is not None:
            out.print(config_words(lines))
    if args.plot:
        plot_front(
            points,
            args.plot,
            title=f"{run_words(run)} on {target.label}",
            budget_bytes=p.budget_bytes,
            device_bytes=target.memory_bytes,
            usable_bytes=target.usable_bytes,
            precision=opts_precision(run),
            objective=args.objective,
        )
    if args.json:
        lines = _config_lines(run, p)
        record = found.to_dict() | ({"config_lines": list(lines)} if lines is not None else {})
        write_json(args.json, record, flag="--json")
    return 0 if p.fits else 1


def _config_lines(run: ModelRun, p: Plan) -> tuple[str, ...] | None:
    """The lines of the model's own config that set the plan (MaxText's), or None."""
    if p.schedule.name != "none":
        return None
    return run.source.policy_lines(p.policy, run.config, run.target)


def config_words(lines: Sequence[str]) -> str:
    """How ``plan`` prints the config lines of its answer.

    Example:
      >>> print(config_words(["remat_policy: custom", "query_proj: device"]))
      in the model's config:
        remat_policy: custom
        query_proj: device
    """
    return "in the model's config:\n" + "\n".join(f"  {line}" for line in lines)


def _alike(p: Plan, points: Sequence[FrontPoint]) -> str | None:
    """The shortest catalogue policy that compiles to the plan's very program (the front
    marks it ``same_as`` the plan), or None: a name to use in place of a long spec."""
    mine = next(
        (pt for pt in points if pt.kind == "plan" and pt.budget_bytes == p.budget_bytes), None
    )
    if mine is None or p.schedule.name != "none":
        return None
    alike = [
        pt.policy
        for pt in points
        if pt.kind == "catalogue" and pt.same_as == mine.label and pt.policy is not None
    ]
    shorter = [spec for spec in alike if len(spec) < len(p.policy.spec)]
    return min(shorter, key=len) if shorter else None


def _use_it(p: Plan, applies: str, alike: str | None = None) -> str:
    """How to apply the plan: its flags, and where the source applies policies in code
    (``applies``: the StepSource's ``applies_in_code``), the call that does. Where a shorter
    catalogue policy compiles to the same program (``alike``), that is the name given."""
    spec = alike or p.policy.spec
    flags = f"--policy '{spec}'" + (
        f" --schedule '{p.schedule.spec}'" if p.schedule.name != "none" else ""
    )
    same = f" (the same program as {p.policy.spec})" if alike else ""
    code = None
    if applies == "config":  # a preset: the policy and schedule are its config's fields
        code = "remat_kit_models.get_config(..., policy=plan.policy, schedule=plan.schedule)"
        if alike:
            code = f"remat_kit_models.get_config(..., policy={alike!r})"
    elif applies == "lines":  # lines of the model's own config file, printed next
        code = None
    elif p.schedule.name == "none":  # the user's factory or step applies its policy
        code = f"hand your model rk.policy({spec!r}) as its policy"
    elif applies == "arguments":
        code = (
            f"hand your model rk.policy({spec!r}) as its policy and "
            f"schedule=rk.parse_schedule({p.schedule.spec!r})"
        )
    # else a per-layer plan applied through --block: the flags are the way to give it
    return f"use it: {flags}{same}" + (f", or in code: {code}" if code else "")
