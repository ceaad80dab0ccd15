"""``remat-kit fit``: the largest batch that fits, per policy (or the planner's best plan)."""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any

from remat_kit.cli._args import add_model_args, add_search_args, comma_list, target_from_args
from remat_kit.policies import parse_policy
from remat_kit.render import console, write_json
from remat_kit.render.tables import fit_table
from remat_kit.schedules import label, parse_schedule
from remat_kit.search import max_batch, max_batch_plan

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Adds ``fit`` to the ``remat-kit`` subparsers.

    Args:
      subparsers: what ``ArgumentParser.add_subparsers`` returned.

    Returns:
      The ``fit`` parser.

    Example:
      >>> add_parser(parser.add_subparsers(dest="command"))  # doctest: +SKIP
    """
    p = subparsers.add_parser("fit", help="the largest batch that fits, per policy")
    add_model_args(p)
    p.add_argument("--policy", default=None, help="one policy (name or spec)")
    p.add_argument(
        "--policies",
        default="none,full,minimal,plan",
        help="comma-separated policies; 'plan' is the planner at the largest batch",
    )
    p.add_argument("--schedule", default="none", help="layer schedule for every policy")
    add_search_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Searches the largest batch per policy; prints the table and messages, writes --json.

    Args:
      args: parsed arguments of the ``fit`` parser.

    Returns:
      The exit code (0).

    Raises:
      ValueError: empty ``--policies`` or an unknown name in them (before any compile), or a
        bad model, target, schedule or size.

    Example:
      >>> run(parser.parse_args(["fit", "--model", "tiny-llama"]))  # doctest: +SKIP
      0
    """
    from models.measure import options_from_args, workload

    opts = options_from_args(args)
    target = target_from_args(args)
    specs = [args.policy] if args.policy else comma_list(args.policies)
    if not specs:
        raise ValueError("--policies is empty; give names such as none,full,minimal,plan")
    # Keyed by spec, so a policy named twice is searched once; None stands for the planner.
    policies = {s: None if s == "plan" else parse_policy(s) for s in specs}  # fail early
    schedule = parse_schedule(args.schedule)
    w = workload(opts, target)
    start = time.perf_counter()
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tables show what matters
        for pol in policies.values():
            if pol is None:
                fit, _ = max_batch_plan(
                    w,
                    headroom=args.headroom,
                    start=opts.batch,
                    offload=not args.no_offload,
                    hide=args.hide,
                )
                name = f"plan: {label(fit.policy, fit.schedule)}" if fit.fits else "plan"
            else:
                fit = max_batch(w, pol, schedule, headroom=args.headroom, start=opts.batch)
                name = label(fit.policy, fit.schedule)
            rows.append({"label": name, **fit.to_dict()})
    seconds = time.perf_counter() - start
    out = console()
    out.print(
        fit_table(rows, target, opts, headroom=args.headroom, compiles=w.compiles, seconds=seconds)
    )
    for row in rows:
        if not row["fits"] or row["label"].startswith("plan"):
            out.print(row["message"])
    if args.json:
        write_json(
            args.json, {"seconds": seconds, "compiles": w.compiles, "rows": rows}, flag="--json"
        )
    return 0
