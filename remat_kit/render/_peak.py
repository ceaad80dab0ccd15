"""The peak inspector's tables: a PeakReport or PeakDiff in, a ``rich.table.Table`` out.

Nothing here compiles or measures; ``remat-kit inspect`` prints what these return.

Example:
  >>> from remat_kit.render import peak_table
  >>> r = rk.inspect(lambda a: (a @ a) @ a, jnp.ones((64, 64)), target="cpu")
  >>> list(peak_table(r).columns[0].cells)[:3]
  ['peak (argument + output + temp - alias)', 'live at the peak', 'fragmentation']
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from remat_kit._units import byte_unit, size
from remat_kit.peak import PeakDiff, PeakReport
from remat_kit.render._titles import training_line
from remat_kit.render._wrap import cell

__all__ = [
    "buffer_table",
    "diff_table",
    "peak_table",
    "split_table",
]

# The widest a shape or an op's path runs before it breaks (between tokens, never cut).
_SHAPE_WIDTH = 24
_PATH_WIDTH = 28


def peak_table(r: PeakReport) -> Table:
    """The peak's figures: compiled and live bytes, fragmentation, where it falls.

    Args:
      r: the report.

    The title names the run as the other commands' titles do (model, batch, sequence,
    optimizer, LoRA rank, accumulation, where ``meta`` has them), and a ``fits`` row says
    whether the peak fits what a process may use (``meta["usable_bytes"]``) and by how much
    it is over when it does not.

    Returns:
      A two-column table (figure, value).

    Example:
      >>> r = rk.inspect(lambda a: (a @ a) @ a, jnp.ones((64, 64)), target="cpu",
      ...                meta={"model": "two matmuls", "policy": "none"})
      >>> peak_table(r).title
      'peak of two matmuls / none on cpu'
    """
    m = r.meta
    run = str(m.get("model", r.module))
    for key, word in (("batch", "b"), ("seq", "s")):
        if m.get(key) is not None:
            run += f" {word}{m[key]}"
    if m.get("optimizer"):
        run += f" {m['optimizer']}"
    run += f" lora{m['lora']}" if m.get("lora") else ""
    run += f" accum{m['accum']}" if (m.get("accum") or 1) > 1 else ""
    t = Table(
        title=f"peak of {run} / {m.get('policy', '')} on {r.target}"
        + training_line(m.get("precision"), m.get("dropout"))
    )
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("peak (argument + output + temp - alias)", size(r.peak_bytes))
    usable = m.get("usable_bytes")
    if usable is not None:
        over = r.peak_bytes - usable
        t.add_row(
            "fits",
            f"yes: {size(usable - r.peak_bytes)} to spare of {size(usable)} usable"
            if over <= 0
            else f"NO: {size(over)} over the {size(usable)} usable",
        )
    t.add_row("live at the peak", size(r.live_peak_bytes))
    t.add_row("fragmentation", size(r.fragmentation_bytes))
    t.add_row("peak position", f"{r.peak_position} / {r.schedule_length} ({r.peak_phase})")
    t.add_row("op at the peak", r.peak_op_name or r.peak_instruction)
    t.add_row("phases", ", ".join(f"{p.name} {p.start}-{p.end}" for p in r.phases) or "-")
    return t


def buffer_table(r: PeakReport, n: int) -> Table:
    """The ``n`` largest buffers live at the peak, one row each.

    Args:
      r: the report.
      n: how many buffers.

    Returns:
      The table (size in one unit, category, checkpoint name, shape, layer, module path, live
      span); a long shape or path breaks between its tokens rather than being cut.

    Example:
      >>> r = rk.inspect(lambda a: (a @ a) @ a, jnp.ones((64, 64)), target="cpu")
      >>> t = buffer_table(r, 3)
      >>> t.title, list(t.columns[1].cells)
      ('top 3 buffers live at the peak', ['input', 'other temporaries', 'other temporaries'])
    """
    t = Table(title=f"top {n} buffers live at the peak")
    top = r.top(n)
    unit = byte_unit(b.size_bytes for b in top)
    columns = (unit.name, "category", "checkpoint name", "shape", "layer", "module path / op")
    for col in (*columns, "live"):
        # A shape is read whole: it keeps its line, broken only between dimensions.
        t.add_column(col, justify="right" if col == unit.name else "left", no_wrap=col == "shape")
    for b in top:
        t.add_row(
            unit.cell(b.size_bytes, 1),
            b.category,
            b.checkpoint_name or "-",
            cell(f"{b.dtype}[{','.join(map(str, b.shape))}]", _SHAPE_WIDTH),
            b.layer,
            cell(b.module_path or b.name, _PATH_WIDTH),
            f"{b.live[0]}-{b.live[1]}",
        )
    return t


def split_table(r: PeakReport) -> Table:
    """Bytes at the peak by category and by layer, side by side.

    Args:
      r: the report.

    Returns:
      The table (category, bytes, layer, bytes, the two byte columns in one unit); empty
      categories are left out.

    Example:
      >>> r = rk.inspect(lambda a: (a @ a) @ a, jnp.ones((64, 64)), target="cpu")
      >>> t = split_table(r)
      >>> t.title, list(t.columns[0].cells)
      ('bytes at the peak', ['input', 'other temporaries'])
    """
    t = Table(title="bytes at the peak")
    cats = [(k, v) for k, v in r.by_category.items() if v]
    layers = list(r.by_layer.items())
    unit = byte_unit([v for _, v in cats] + [v for _, v in layers])  # both split one peak
    t.add_column("category")
    t.add_column(unit.name, justify="right")
    t.add_column("layer")
    t.add_column(f"{unit.name} ", justify="right")
    for i in range(max(len(cats), len(layers))):
        c = cats[i] if i < len(cats) else ("", None)
        lay = layers[i] if i < len(layers) else ("", None)
        t.add_row(
            c[0],
            unit.cell(c[1]) if c[1] is not None else "",
            lay[0],
            unit.cell(lay[1]) if lay[1] is not None else "",
        )
    return t


def diff_table(d: PeakDiff, policies: Sequence[str]) -> Table:
    """What the second policy keeps at its peak that the first does not (15 largest rows).

    Args:
      d: ``rk.peak.diff(a, b)``.
      policies: the two labels, ``a``'s then ``b``'s.

    Returns:
      The table (category, label, the bytes in each and the delta, in one unit).

    Example:
      >>> x = jnp.ones((64, 64))
      >>> a = rk.inspect(lambda a: a @ a, x, target="cpu")
      >>> b = rk.inspect(lambda a: (a @ a) @ a, x, target="cpu")
      >>> diff_table(rk.peak.diff(a, b), ["one", "two"]).title
      'what two keeps at its peak that one does not (peak +16.00 KiB)'
    """
    a, b = policies
    sign = "+" if d.peak_delta >= 0 else "-"
    t = Table(
        title=f"what {b} keeps at its peak that {a} does not (peak {sign}{size(abs(d.peak_delta))})"
    )
    kept = d.kept[:15]
    unit = byte_unit(v for _, _, x, y in kept for v in (x, y))
    for col in ("category", "label", f"{a} {unit.name}", f"{b} {unit.name}", f"delta {unit.name}"):
        t.add_column(col, justify="left" if col in ("category", "label") else "right")
    for c, lab, x, y in kept:
        t.add_row(c, lab, unit.cell(x, 1), unit.cell(y, 1), f"{(y - x) / unit.size:+.1f}")
    return t
