"""The ``remat-kit`` tables: reports, comparisons, fits, plans and advice as rich tables.

Each function takes data (reports, plans, rows) and returns a ``rich.table.Table`` for the caller
to print; nothing here compiles or measures. ``opts`` is the run's options as the CLI reads them
(:class:`RunOptions`: model, batch, seq, optimizer, lora, accum, shard, as
``models.options.Options`` has them). The catalogue listings (targets, policies, models) are in
:mod:`remat_kit.render._listings`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from rich.table import Table

from remat_kit._units import Unit, byte_unit, flops_words, pct, second_unit, size
from remat_kit._units import seconds as duration
from remat_kit.notes import label
from remat_kit.render._captions import (
    collective_words,
    depth_words,
    expert_words,
    fits_rule,
    limit_words,
    runtime_words,
)
from remat_kit.render._format import short
from remat_kit.render._timing import step_time_words
from remat_kit.render._titles import (
    RunOptions,
    opts_precision,
    run_words,
    training_line,
)

if TYPE_CHECKING:
    from remat_kit.analysis import MemoryReport, ReportMeta
    from remat_kit.residuals import ResidualReport
    from remat_kit.search import Fit
    from remat_kit.targets import Target

__all__ = [
    "FitRow",
    "compare_table",
    "fit_table",
    "report_table",
    "residual_table",
]

# How wide a name may run in a column that is the answer before it breaks (between tokens).
_NAME_WIDTH = 28
_FRONT_WIDTH = 24
_YES_NO = {True: "[green]yes[/green]", False: "[red]no[/red]", None: "-"}


@dataclasses.dataclass(frozen=True)
class FitRow:
    """One line of the ``fit`` table: what it is called and the search's answer.

    Attributes:
      label: the policy (``policy @ schedule``), or ``plan: ...`` for the planner's.
      fit: the search's answer (along the batch, or the sequence).
    """

    label: str
    fit: Fit

    def to_dict(self) -> dict[str, Any]:
        """``{"label": ..., **Fit.to_dict()}``: a JSON row."""
        return {"label": self.label, **self.fit.to_dict()}


def _cut(nbytes: int) -> str:
    """What XLA's remat pass took off, never "0.0": in the unit that suits it, one decimal.

    Example:
      >>> _cut(int(1.25 * 2**30)), _cut(40 * 2**20)
      ('1.2 GiB', '40.0 MiB')
    """
    return size(nbytes, 1)


def _unit_header(name: str, unit: Unit) -> str:
    """A figure column's header with its unit on the line below: ``peak\nMiB``."""
    return f"{name}\n{unit.name}"


def _limit_lines(target: Target, usable: int | None) -> list[tuple[str, Any]]:
    """The target's memory and the limit a process gets; where the device reports none (a
    CPU), words say so instead of a blank cell."""
    if target.memory_bytes is None and usable is None:
        return [("target memory: not reported by this device (fits unknown)", "n/a")]
    return [
        ("target memory", target.memory_bytes),
        (f"  usable by a JAX process ({runtime_words(target)})", usable),
    ]


def compare_table(
    rows: Sequence[Mapping[str, Any]], target: Target, opts: RunOptions, seconds: float
) -> Table:
    """The ``compare`` table: one line per policy and schedule.

    Args:
      rows: what :func:`remat_kit.comparison.compare_rows` returned.
      target: the target compiled for.
      opts: the run's options (for the title).
      seconds: wall time of all compiles (for the caption).

    Returns:
      The table.
    """
    title = (
        run_words(opts)
        + (
            f" over {target.devices} {target.device_word}s, per {target.device_word}"
            if opts.shard
            else ""
        )
        + f" on {target.label} ({size(target.memory_bytes)}), attention={rows[0]['attention']}"
        + training_line(
            rows[0].get("meta_precision"),
            rows[0].get("meta_dropout"),
            rows[0].get("meta_remat_impl"),
        )
    )
    remembered = sum(1 for row in rows if row["compile_seconds"] == 0.0)
    caption = f"{fits_rule(target)}\n{len(rows)} programs in {seconds:.1f} s" + (
        f" ({remembered} remembered from an earlier run: not traced or compiled again)"
        if remembered
        else ""
    )
    caption += _compare_legend(rows)
    table = Table(title=title, caption=caption)
    offload = any(row["offload_transfer_seconds_est"] for row in rows)
    timed = any(row["step_seconds"] is not None for row in rows)
    # One unit for the memory columns (a row's activations read against its peak), and one for
    # the step times, each chosen by its largest figure. Two-line headers: a figure column is
    # as narrow as its figures.
    mem = byte_unit(
        row[k] for row in rows for k in ("peak_bytes", "activation_bytes", "host_bytes")
    )
    step = second_unit(row["step_seconds"] for row in rows)
    columns = [
        "policy",
        _unit_header("peak", mem),
        _unit_header("activations", mem),
        _unit_header("host", mem),
        "saved vs\nnone",
        "recompute",
    ]
    if timed:
        columns += [f"step {step.name}\n(est.)", "time vs\nnone", "tok/s"]
        caption += (
            f"\nrecompute: extra FLOPs; step {step.name}: predicted from the compiled kernels at "
            "the target's rates (remat_kit.timing)"
        )
    moved = second_unit(
        row[k]
        for row in rows
        for k in ("offload_transfer_seconds_est", "offload_recompute_seconds_est")
    )
    if offload:
        columns.append(f"offload /\nrecompute\n{moved.name} (est.)")
    columns += ["fits", "compile\ns"]
    for col in columns:
        table.add_column(
            col, justify="left" if col == "policy" else "right", no_wrap=col == "policy"
        )
    depths = [row.get("meta_depth") or {} for row in rows]
    if any(d.get("mode") == "extrapolated" for d in depths):
        caption += "\n~ " + depth_words(
            max(
                (d for d in depths if d.get("mode") == "extrapolated"),
                key=lambda d: d["residual_bytes"],
            )
        )
    for d in {depth_words(d) for d in depths if d.get("mode") in ("verified", "full")}:
        caption += "\n" + d
    for row in rows:
        fits = _fits_cell(row)
        if row["xla_remat"]:
            fits += f", XLA -{_cut(row['xla_remat_saved_bytes'])}"
        mark = "~" if (row.get("meta_depth") or {}).get("mode") == "extrapolated" else ""
        cells = [
            label(row["policy"], row["schedule"]),
            mark + mem.cell(row["peak_bytes"]),
            mem.cell(row["activation_bytes"]),
            # XLA's CPU backend has no host memory space: its 0 would read "nothing moved".
            "n/a" if target.kind == "cpu" else mem.cell(row["host_bytes"]),
            pct(row["saved_vs_none"]),
            pct(row["recompute_overhead"]),
        ]
        if timed:
            cells += [
                step.cell(row["step_seconds"], 3 if step.name == "s" else 2),
                pct(row["time_vs_none"]),
                "-" if row["tokens_per_second"] is None else f"{row['tokens_per_second']:,.0f}",
            ]
        if offload:
            t_s = row["offload_transfer_seconds_est"]
            r_s = row["offload_recompute_seconds_est"]
            cells.append("-" if t_s is None else f"{moved.cell(t_s, 0)} / {moved.cell(r_s, 0)}")
        table.add_row(*cells, fits, f"{row['compile_seconds']:.1f}")
    table.caption = caption  # the lines added since the table was made
    return table


def _compare_legend(rows: Sequence[Mapping[str, Any]]) -> str:
    """The fits column's marks explained, each with the figure of the first row that carries it;
    a mark no row carries is not explained.

    Example:
      >>> row = {"fits": False, "fits_with_fraction": 0.8, "xla_remat": False}
      >>> _compare_legend([row])
      '; no (0.8): fits with XLA_PYTHON_CLIENT_MEM_FRACTION=0.8'
      >>> _compare_legend([row | {"fits": True, "fits_with_fraction": None}])
      ''
    """
    legend = ""
    short_of = [row["fits_with_fraction"] for row in rows if _with_fraction(row)]
    if short_of:
        legend += (
            f"; no ({short_of[0]:g}): fits with XLA_PYTHON_CLIENT_MEM_FRACTION={short_of[0]:g}"
        )
    cut = [row["xla_remat_saved_bytes"] for row in rows if row["xla_remat"]]
    if cut:
        legend += (
            f"; XLA -{_cut(cut[0])}: XLA's own rematerialization pass took that much off the "
            "peak, so the figure includes XLA's choices"
        )
    return legend


def _with_fraction(row: Mapping[str, Any]) -> bool:
    """Whether ``row``'s fits cell names the fraction it would fit with (``no (0.8)``)."""
    return row["fits"] is False and row["fits_with_fraction"] is not None


def report_table(r: MemoryReport, target: Target) -> Table:
    """The ``report`` table: the peak, its breakdown, XLA's four figures and the target's memory.

    Args:
      r: the report.
      target: the target compiled for.

    Returns:
      The table (fits, FLOPs, recompute and offload estimates in its caption).

    Example:
      >>> t = report_table(w.report("full", batch=2), w.target)
      >>> t.title.splitlines()[0]
      "tiny_model b2 s16 sgd policy=full schedule=none attention=model's own on h100-80gb"
      >>> list(t.columns[0].cells)[0]
      'peak (argument + output + temp - alias)'
    """
    m = r.meta
    # Every setting that changed the figures, as the other commands' titles name them.
    run = SimpleNamespace(
        model=m.model,
        batch=m.batch,
        seq=m.seq,
        optimizer=m.optimizer,
        lora=m.lora or 0,
        accum=m.accum or 1,
        shard=m.mesh,
    )
    word = target.device_word
    over = f" over {m.devices} {word}s, per {word}" if m.mesh and m.devices else ""
    title = (
        f"{run_words(run)}{over} "
        f"policy={r.policy} schedule={r.schedule} attention={r.attention} on {target.label}"
        + training_line(m.precision, m.dropout, m.remat_impl)
    )
    table = Table(title=title, show_header=True)
    table.add_column("what")
    # Each figure in the unit that suits it: the rows run from a few bytes to the GPU's memory.
    table.add_column("size", justify="right")
    lines = [
        ("peak (argument + output + temp - alias)", r.peak_bytes),
        *_breakdown_lines(r.breakdown, m),
        ("XLA argument / output / temp / alias", None),
        ("  argument", r.argument_bytes),
        ("  output", r.output_bytes),
        ("  temp", r.temp_bytes),
        ("  alias", r.alias_bytes),
        (
            # XLA's CPU backend has no host memory space: its 0 would read "nothing moved".
            ("host (offloaded): not measured on cpu", "n/a")
            if target.kind == "cpu"
            else ("host (offloaded, pinned host memory)", r.host_bytes)
        ),
        ("XLA's own peak", r.xla_peak_bytes),
        *_limit_lines(target, r.usable_bytes),
    ]
    for what, value in lines:
        cell = value if isinstance(value, str) else "" if value is None else size(value)
        table.add_row(what, cell)
    fits = {True: "yes", False: "NO", None: "-"}[r.fits]
    if r.fits_with_fraction is not None:
        fits += f" (fits with XLA_PYTHON_CLIENT_MEM_FRACTION={r.fits_with_fraction:g})"
    table.caption = (
        f"fits: {fits} | {flops_words(r.flops)}/step, recompute overhead "
        f"{pct(r.meta.recompute_overhead)} | "
        + (
            f"compiled in {r.compile_seconds:.1f} s"
            if r.compile_seconds
            else "remembered from an earlier run"
        )
        + (
            f" | XLA's own remat pass took {size(r.xla_remat_saved_bytes)} off the peak"
            if r.xla_remat
            else ""
        )
    )
    if r.step_time is not None:
        table.caption += "\n" + step_time_words(r.step_time, r.tokens_per_step)
    if m.experts:
        table.caption += "\n" + expert_words(m.experts)
    if m.depth:
        table.caption += "\n" + depth_words(m.depth)
    if m.collectives:
        table.caption += "\n" + collective_words(m.collectives, target.device_word)
    est = m.offload_estimate
    if est:
        table.caption += (
            f"\noffload (estimates at the host link / bf16 peak): transfer "
            f"{duration(est['transfer_seconds'])} per step vs recomputing the same tensors "
            f"{duration(est['recompute_seconds'])}; step compute "
            f"{duration(est['step_compute_seconds'])}"
        )
    return table


def _gpus(meta: ReportMeta) -> int:
    # A source labels a sharded step's devices (ours from the mesh plan, a trainer's from
    # its own mesh); a step that labels none is one device's.
    return int(meta.devices or 1)


def residual_table(res: ResidualReport, r: MemoryReport, device: str = "GPU") -> Table:
    """What the policy keeps for the backward pass, per tag, per layer and in all layers.

    Args:
      res: the saved residuals of one micro-batch.
      r: the report of the same step (for its layer count).
      device: what one device of the target is called (``Target.device_word``).

    Returns:
      The table.

    Example:
      >>> t = residual_table(w.residuals("minimal", batch=2), w.report("minimal", batch=2))
      >>> list(zip(t.columns[0].cells, t.columns[1].cells))
      [('mlpwi_1', 'saved'), ('mlpwo', 'not needed'), ('lm_head', 'recomputed')]
    """
    # A model whose layers cannot be counted (an NNX factory): most tags occur once a layer.
    counts = sorted(res.tag_count.values())
    layers = r.meta.layers or max(counts, key=lambda c: (counts.count(c), c), default=1)
    # The residuals are traced from the unsharded step (the global micro-batch, whole weights)
    # beside a report of figures per GPU: over several GPUs the title and caption say so.
    whole = _gpus(r.meta) > 1
    table = Table(
        title="what the policy keeps, per tag (one micro-batch"
        + (f" of the global batch, the step unsharded: not per {device})" if whole else ")")
    )
    kept = {tag: res.kept_bytes(tag) for tag in res.tags}  # under each name of a value
    per_layer = {tag: k / max(layers, 1) for tag, k in kept.items()}
    one, all_ = byte_unit(per_layer.values()), byte_unit(kept.values())
    for col in ("tag", "decision", f"{one.name} per layer", f"{all_.name} all layers"):
        table.add_column(col, justify="left" if col in ("tag", "decision") else "right")
    for tag, decision in res.tags.items():
        table.add_row(tag, decision, one.cell(per_layer[tag]), all_.cell(kept[tag]))
    # The part must be of the same kind as the whole: untagged residuals kept on device (an
    # offloaded untagged value is in the offloaded figure, not in what the device keeps).
    untagged = sum(x.nbytes for x in res.residuals if not x.tagged and x.kind == "saved")
    offloaded = res.bytes_by("offloaded")
    table.caption = (
        "residuals kept on device"
        + (f" (the unsharded step, not per {device})" if whole else "")
        + f" {size(res.bytes_by('saved'))} "
        f"(of which untagged values and weights: {size(untagged)}), "
        f"offloaded {size(offloaded)}"
        + (
            " (from the trace: a cpu compile does not measure host memory)"
            if offloaded and r.target == "cpu"
            else ""
        )
    )
    return table


def fit_table(
    rows: Sequence[FitRow],
    target: Target,
    opts: RunOptions,
    *,
    headroom: float,
    compiles: int,
    seconds: float,
) -> Table:
    """The ``fit`` table: the largest batch per policy.

    Args:
      rows: one FitRow per policy.
      target: the target compiled for.
      opts: the run's options (for the title).
      headroom: the fraction of device memory kept free (for the title).
      compiles: how many programs were compiled (for the caption).
      seconds: wall time of the search (for the caption).

    Returns:
      The table.
    """
    title = (
        f"largest batch: {run_words(opts, batch=False)} on {target.label} "
        f"(limit {size(rows[0].fit.limit_bytes)} = {limit_words(target, headroom)})"
        + training_line(opts_precision(opts), None)
    )
    table = Table(title=title, caption=f"{compiles} compiles in {seconds:.1f} s")
    # Over several devices the batch is global; what each holds is what a trainer's config
    # names (MaxText's per_device_batch_size).
    per_gpu = (f"per {target.device_word}",) if target.devices > 1 else ()
    mem = byte_unit(b for row in rows for b in (row.fit.peak_bytes, row.fit.next_peak_bytes))
    columns = (
        "policy",
        "max batch",
        *per_gpu,
        f"peak {mem.name}",
        f"next batch {mem.name}",
        "recompute",
    )
    for col in (*columns, "tokens/step"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for row in rows:
        fit = row.fit
        table.add_row(
            short(row.label),
            str(fit.batch),
            *(f"{fit.batch / target.devices:g}" for _ in per_gpu),
            mem.cell(fit.peak_bytes),
            mem.cell(fit.next_peak_bytes),
            pct(fit.recompute_overhead),
            str(fit.tokens_per_step),
        )
    return table


def _fits_cell(row: Mapping[str, Any]) -> str:
    """A compare row's fits cell: ``yes``, ``no``, or ``no (0.8)`` with the fraction it would
    fit with (explained by :func:`_compare_legend`)."""
    cell = _YES_NO[row["fits"]]
    return cell + (f" ({row['fits_with_fraction']:g})" if _with_fraction(row) else "")


def _breakdown_lines(
    parts: Mapping[str, int], meta: ReportMeta
) -> list[tuple[str, int | str | None]]:
    if meta.breakdown == "measured":
        est = meta.breakdown_estimate or {}
        return [
            ("  live at the peak, from XLA's buffer assignment:", None),
            ("  weights", parts.get("weights")),
            ("  gradients", parts.get("gradients")),
            ("  optimizer state", parts.get("optimizer")),
            ("  batch", parts.get("batch")),
            ("  saved activations", parts.get("saved_activations")),
            ("  recomputation workspace", parts.get("recompute_workspace")),
            ("  other temporaries", parts.get("temporaries")),
            ("  fragmentation (reserved, free at the peak)", parts.get("fragmentation")),
            ("  activations, estimate (peak - shapes of the rest)", est.get("activations")),
        ]
    # A user's step names the roles of its arguments or not (meta "roles"): a part it does
    # not name is unknown, not blank.
    missing = "unknown" if meta.roles is not None else None
    if meta.roles is not None and "grad_accumulator" not in parts:
        missing_acc: str | None = "unknown (in the rest)" if "activations" in parts else missing
    else:
        missing_acc = missing
    return [
        ("  estimate from shapes (activations = the rest):", None),
        ("  weights", parts.get("weights", missing)),
        ("  gradients", parts.get("gradients", missing)),
        ("  optimizer state", parts.get("optimizer", missing)),
        ("  gradient accumulator", parts.get("grad_accumulator", missing_acc)),
        ("  batch", parts.get("batch", missing)),
        ("  activations and temporaries", parts.get("activations", missing)),
    ]
