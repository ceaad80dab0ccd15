"""The ``remat-kit`` tables: reports, comparisons, fits, plans and advice as rich tables.

Each function takes data (reports, plans, rows) and returns a ``rich.table.Table`` for the caller
to print; nothing here compiles or measures. ``opts`` is the run's options as the CLI reads them
(``models.measure.Options``: model, batch, seq, optimizer, lora, accum, shard). The catalogue
listings (targets, policies, models) are in :mod:`remat_kit.render.listings`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.table import Table

from remat_kit.render.format import GIB, fmt, gib, pct, short
from remat_kit.schedules import label

if TYPE_CHECKING:
    from remat_kit.analysis import MemoryReport
    from remat_kit.residuals import ResidualReport
    from remat_kit.search import Advice, FrontPoint, Plan
    from remat_kit.targets import Target

__all__ = [
    "advise_table",
    "compare_rows",
    "compare_table",
    "decision_table",
    "fit_table",
    "plan_table",
    "report_table",
    "residual_table",
]

_MIB = 2**20
_YES_NO = {True: "[green]yes[/green]", False: "[red]no[/red]", None: "-"}


def compare_rows(reports: Sequence[MemoryReport]) -> list[dict[str, Any]]:
    """Flat rows of a comparison: the report fields plus savings against ``none``.

    Args:
      reports: one report per (policy, schedule), in the order to show.

    Returns:
      One JSON/CSV-ready dict per report. ``saved_vs_none`` is 1 - peak/peak(none) when
      ``none`` (without a schedule) is among the reports, else None.

    Example:
      >>> [r["policy"] for r in compare_rows(reports)]  # doctest: +SKIP
      ['none', 'full']
    """
    base = next((r for r in reports if r.policy == "none" and r.schedule == "none"), None)
    rows = []
    for r in reports:
        est = r.meta.get("offload_estimate") or {}
        row = {
            "policy": r.policy,
            "schedule": r.schedule,
            "attention": r.attention,
            "target": r.target,
            "peak_bytes": r.peak_bytes,
            "argument_bytes": r.argument_bytes,
            "output_bytes": r.output_bytes,
            "temp_bytes": r.temp_bytes,
            "alias_bytes": r.alias_bytes,
            "host_bytes": r.host_bytes,
            "xla_peak_bytes": r.xla_peak_bytes,
            "activation_bytes": r.breakdown.get("activations"),
            "flops": r.flops,
            "recompute_overhead": r.meta.get("recompute_overhead"),
            "saved_vs_none": (1 - r.peak_bytes / base.peak_bytes) if base else None,
            "fits": r.fits,
            "xla_remat": r.xla_remat,
            "compile_seconds": r.compile_seconds,
            "offload_transfer_seconds_est": est.get("transfer_seconds"),
            "offload_recompute_seconds_est": est.get("recompute_seconds"),
            "step_compute_seconds_est": est.get("step_compute_seconds"),
            **{
                f"meta_{k}": v
                for k, v in r.meta.items()
                if k not in ("recompute_overhead", "offload_estimate")
            },
            **{f"{k}_bytes": v for k, v in r.breakdown.items() if k != "activations"},
        }
        rows.append(row)
    return rows


def compare_table(
    rows: Sequence[Mapping[str, Any]], target: Target, opts: Any, seconds: float
) -> Table:
    """The ``compare`` table: one line per policy and schedule.

    Args:
      rows: what :func:`compare_rows` returned.
      target: the target compiled for.
      opts: the run's options (for the title).
      seconds: wall time of all compiles (for the caption).

    Returns:
      The table.

    Example:
      >>> console().print(compare_table(compare_rows(reports), t, opts, 12.0))  # doctest: +SKIP
    """
    title = (
        f"{opts.model} b{opts.batch} s{opts.seq} {opts.optimizer}"
        + (f" lora{opts.lora}" if opts.lora else "")
        + (f" accum{opts.accum}" if opts.accum > 1 else "")
        + (f" {opts.shard} over {target.devices} GPUs, per GPU" if opts.shard else "")
        + f" on {target.name} ({gib(target.memory_bytes)} GiB), attention={rows[0]['attention']}"
    )
    caption = f"compiled {len(rows)} programs in {seconds:.1f} s"
    if any(row["xla_remat"] for row in rows):
        caption += (
            "; (XLA remat): XLA's own rematerialization pass stepped in because the program "
            "came near the device memory, so that figure includes XLA's choices"
        )
    table = Table(title=title, caption=caption)
    offload = any(row["offload_transfer_seconds_est"] for row in rows)
    columns = ["policy", "peak GiB", "activations GiB", "host GiB", "saved vs none", "recompute"]
    if offload:
        columns.append("offload/recompute ms (est.)")
    columns += ["fits", "compile s"]
    for col in columns:
        table.add_column(
            col, justify="left" if col == "policy" else "right", no_wrap=col == "policy"
        )
    for row in rows:
        fits = _YES_NO[row["fits"]] + (" (XLA remat)" if row["xla_remat"] else "")
        cells = [
            label(row["policy"], row["schedule"]),
            gib(row["peak_bytes"]),
            gib(row["activation_bytes"]),
            gib(row["host_bytes"]),
            pct(row["saved_vs_none"]),
            pct(row["recompute_overhead"]),
        ]
        if offload:
            t_s = row["offload_transfer_seconds_est"]
            r_s = row["offload_recompute_seconds_est"]
            cells.append("-" if t_s is None else f"{t_s * 1e3:.0f} vs recompute {r_s * 1e3:.0f}")
        table.add_row(*cells, fits, f"{row['compile_seconds']:.1f}")
    return table


def report_table(r: MemoryReport, target: Target) -> Table:
    """The ``report`` table: the peak, its breakdown, XLA's four figures and the target's memory.

    Args:
      r: the report.
      target: the target compiled for.

    Returns:
      The table (fits, FLOPs, recompute and offload estimates in its caption).

    Example:
      >>> console().print(report_table(report, t))  # doctest: +SKIP
    """
    m = r.meta
    title = (
        f"{m.get('model')} b{m.get('batch')} s{m.get('seq')} {m.get('optimizer')} "
        f"policy={r.policy} schedule={r.schedule} attention={r.attention} on {target.name}"
    )
    table = Table(title=title, show_header=True)
    table.add_column("what")
    table.add_column("GiB", justify="right")
    lines = [
        ("peak (argument + output + temp - alias)", r.peak_bytes),
        ("  weights", r.breakdown.get("weights")),
        ("  gradients", r.breakdown.get("gradients")),
        ("  optimizer state", r.breakdown.get("optimizer")),
        ("  gradient accumulator", r.breakdown.get("grad_accumulator")),
        ("  batch", r.breakdown.get("batch")),
        ("  activations and temporaries", r.breakdown.get("activations")),
        ("XLA argument / output / temp / alias", None),
        ("  argument", r.argument_bytes),
        ("  output", r.output_bytes),
        ("  temp", r.temp_bytes),
        ("  alias", r.alias_bytes),
        ("host (offloaded, pinned host memory)", r.host_bytes),
        ("XLA's own peak", r.xla_peak_bytes),
        ("target memory", target.memory_bytes),
    ]
    for what, value in lines:
        table.add_row(what, "" if value is None else gib(value))
    fits = {True: "yes", False: "NO", None: "-"}[r.fits]
    table.caption = (
        f"fits: {fits} | {r.flops / 1e12:.1f} TFLOP/step, recompute overhead "
        f"{pct(r.meta.get('recompute_overhead'))} | compiled in {r.compile_seconds:.1f} s"
        + (" | XLA's own remat pass stepped in" if r.xla_remat else "")
    )
    est = r.meta.get("offload_estimate")
    if est:
        table.caption += (
            f"\noffload (estimates at the host link / bf16 peak): transfer "
            f"{est['transfer_seconds'] * 1e3:.0f} ms per step vs recomputing the same tensors "
            f"{est['recompute_seconds'] * 1e3:.0f} ms; step compute "
            f"{est['step_compute_seconds'] * 1e3:.0f} ms"
        )
    return table


def residual_table(res: ResidualReport, r: MemoryReport) -> Table:
    """What the policy keeps for the backward pass, per tag, per layer and in all layers.

    Args:
      res: the saved residuals of one micro-batch.
      r: the report of the same step (for its layer count).

    Returns:
      The table.

    Example:
      >>> console().print(residual_table(res, report))  # doctest: +SKIP
    """
    layers = r.meta.get("layers") or 1
    table = Table(title="what the policy keeps, per tag (one micro-batch)")
    for col in ("tag", "decision", "MiB per layer", "MiB all layers"):
        table.add_column(col, justify="left" if col in ("tag", "decision") else "right")
    by_name = res.per_name()
    for tag, decision in res.tags.items():
        row = by_name.get(tag)
        kept = row["bytes"] if row else 0
        per_layer = kept / max(layers, 1) if row else 0
        table.add_row(tag, decision, fmt(per_layer, _MIB), fmt(kept, _MIB))
    untagged = sum(v["bytes"] for k, v in by_name.items() if k not in res.tags)
    table.caption = (
        f"residuals kept on device {res.bytes_by('saved') / GIB:.2f} GiB "
        f"(untagged values and weights included: {untagged / GIB:.2f} GiB), "
        f"offloaded {res.bytes_by('offloaded') / GIB:.2f} GiB"
    )
    return table


def fit_table(
    rows: Sequence[Mapping[str, Any]],
    target: Target,
    opts: Any,
    *,
    headroom: float,
    compiles: int,
    seconds: float,
) -> Table:
    """The ``fit`` table: the largest batch per policy.

    Args:
      rows: ``{"label": ..., **BatchFit.to_dict()}`` per policy.
      target: the target compiled for.
      opts: the run's options (for the title).
      headroom: the fraction of device memory kept free (for the title).
      compiles: how many programs were compiled (for the caption).
      seconds: wall time of the search (for the caption).

    Returns:
      The table.

    Example:
      >>> fit_table(rows, t, opts, headroom=0.03, compiles=9, seconds=4.0)  # doctest: +SKIP
    """
    title = (
        f"largest batch: {opts.model} s{opts.seq} {opts.optimizer} on {target.name} "
        f"(limit {gib(rows[0]['limit_bytes'])} GiB = device - {100 * headroom:.0f}%)"
    )
    table = Table(title=title, caption=f"{compiles} compiles in {seconds:.1f} s")
    for col in ("policy", "max batch", "peak GiB", "next batch GiB", "recompute", "tokens/step"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for row in rows:
        table.add_row(
            short(row["label"]),
            str(row["max_batch"]),
            gib(row["peak_bytes"]),
            gib(row["next_peak_bytes"]),
            pct(row["recompute_overhead"]),
            str(row["tokens_per_step"]),
        )
    return table


def plan_table(
    p: Plan,
    points: Iterable[FrontPoint],
    target: Target,
    opts: Any,
    *,
    plan_seconds: float,
    seconds: float,
    compiles: int,
) -> Table:
    """The ``plan`` table: the plan beside the catalogue points, with the Pareto front marked.

    Args:
      p: the plan.
      points: the front points compiled beside it (the plan's own point included).
      target: the target compiled for.
      opts: the run's options (for the title).
      plan_seconds: wall time of the planner.
      seconds: wall time of everything.
      compiles: how many programs were compiled in all.

    Returns:
      The table.

    Example:
      >>> plan_table(p, pts, t, opts, plan_seconds=3, seconds=9, compiles=20)  # doctest: +SKIP
    """
    title = (
        f"plan for {opts.model} b{opts.batch} s{opts.seq} {opts.optimizer} on {target.name}: "
        f"budget {gib(p.budget_bytes)} GiB, attention="
        f"{p.report.attention if p.report is not None else '-'}"
    )
    caption = (
        f"plan found in {plan_seconds:.1f} s ({p.compiles} compiles); {compiles} compiles in "
        f"{seconds:.1f} s in all. overhead = recompute FLOPs + host transfer not hidden "
        "(estimate); * = on the Pareto front"
    )
    table = Table(title=title, caption=caption)
    for col in ("what", "peak GiB", "recompute", "overhead", "host GiB", "fits budget", "front"):
        table.add_column(col, justify="left" if col == "what" else "right")
    main = f"plan {p.budget_bytes / GIB:.2f} GiB"
    for pt in sorted(points, key=lambda q: (q.label != main, q.kind, q.peak_bytes)):
        if pt.label == main:
            what = f"PLAN: {p.label}"
        elif pt.kind == "plan":
            what = f"{pt.label} (plan at that budget)"
        else:
            what = pt.label
        table.add_row(
            short(what),
            gib(pt.peak_bytes),
            pct(pt.recompute_overhead),
            pct(pt.overhead),
            gib(p.host_bytes if pt.label == main else None),
            _YES_NO[pt.peak_bytes <= p.budget_bytes],
            "*" if not pt.dominated else f"dominated by {short(pt.dominated_by or '', 30)}",
        )
    return table


def decision_table(p: Plan) -> Table:
    """The plan, per tag: saved, offloaded or recomputed (and per layer range when it varies).

    Args:
      p: the plan.

    Returns:
      The table.

    Example:
      >>> console().print(decision_table(p))  # doctest: +SKIP
    """
    table = Table(title="the plan, per tag")
    table.add_column("tag")
    table.add_column("decision")
    if p.layers:
        table.add_column(f"layers 0-{p.layers - 1}")
    for tag, decision in p.decisions.items():
        cells = [tag, decision]
        if p.layers:
            cells.append(p.layer_decisions.get(tag, decision))
        table.add_row(*cells)
    return table


def advise_table(rows: Sequence[Advice], opts: Any, *, headroom: float, seconds: float) -> Table:
    """The ``advise`` table: for every GPU, does the step fit, with which plan.

    Args:
      rows: one ``Advice`` per target.
      opts: the run's options (for the title).
      headroom: the fraction of device memory kept free (for the caption).
      seconds: wall time of the search (for the caption).

    Returns:
      The table.

    Example:
      >>> console().print(advise_table(rows, opts, headroom=0.03, seconds=30))  # doctest: +SKIP
    """
    table = Table(
        title=f"which GPU: {opts.model} b{opts.batch} s{opts.seq} {opts.optimizer}",
        caption=(
            f"{seconds:.1f} s. fits = the plan's compiled peak <= device - "
            f"{100 * headroom:.0f}%; max batch with 'full'"
        ),
    )
    for col in ("target", "GiB", "fixed GiB", "fits", "plan", "peak GiB", "recompute", "max batch"):
        table.add_column(col, justify="left" if col in ("target", "plan") else "right")
    for a in rows:
        table.add_row(
            a.target,
            gib(a.memory_bytes, 0),
            gib(a.fixed_bytes),
            _YES_NO[bool(a.fits)],
            short(a.plan or "-"),
            gib(a.peak_bytes),
            pct(a.recompute_overhead),
            str(a.max_batch),
        )
    return table
