"""The peak inspector's tables: a PeakReport or PeakDiff in, a ``rich.table.Table`` out.

Nothing here compiles or measures; ``remat-kit inspect`` prints what these return.

Example:
  >>> from remat_kit.render import peak_table
  >>> r = rk.inspect(lambda a: (a @ a) @ a, jnp.ones((64, 64)), target="cpu")
  >>> list(peak_table(r).columns[0].cells)[:3]
  ['peak GiB (argument + output + temp - alias)', 'live at the peak GiB', 'fragmentation GiB']
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from remat_kit.peak import PeakDiff, PeakReport
from remat_kit.render._format import gib

__all__ = [
    "buffer_table",
    "diff_table",
    "peak_table",
    "split_table",
]

_MIB = 2**20


def peak_table(r: PeakReport) -> Table:
    """The peak's figures: compiled and live bytes, fragmentation, where it falls.

    Args:
      r: the report.

    Returns:
      A two-column table (figure, value).

    Example:
      >>> r = rk.inspect(lambda a: (a @ a) @ a, jnp.ones((64, 64)), target="cpu",
      ...                meta={"model": "two matmuls", "policy": "none"})
      >>> peak_table(r).title
      'peak of two matmuls / none on cpu'
    """
    t = Table(
        title=f"peak of {r.meta.get('model', r.module)} / {r.meta.get('policy', '')} on {r.target}"
    )
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("peak GiB (argument + output + temp - alias)", gib(r.peak_bytes))
    t.add_row("live at the peak GiB", gib(r.live_peak_bytes))
    t.add_row("fragmentation GiB", gib(r.fragmentation_bytes))
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
      The table (MiB, category, checkpoint name, shape, layer, module path, live span).

    Example:
      >>> r = rk.inspect(lambda a: (a @ a) @ a, jnp.ones((64, 64)), target="cpu")
      >>> t = buffer_table(r, 3)
      >>> t.title, list(t.columns[1].cells)
      ('top 3 buffers live at the peak', ['input', 'other temporaries', 'other temporaries'])
    """
    t = Table(title=f"top {n} buffers live at the peak")
    for col in ("MiB", "category", "checkpoint name", "shape", "layer", "module path / op", "live"):
        t.add_column(col, justify="right" if col == "MiB" else "left")
    for b in r.top(n):
        t.add_row(
            f"{b.size_bytes / _MIB:.1f}",
            b.category,
            b.checkpoint_name or "-",
            f"{b.dtype}[{','.join(map(str, b.shape))}]",
            b.layer,
            b.module_path or b.name,
            f"{b.live[0]}-{b.live[1]}",
        )
    return t


def split_table(r: PeakReport) -> Table:
    """Bytes at the peak by category and by layer, side by side.

    Args:
      r: the report.

    Returns:
      The table (category, GiB, layer, GiB); empty categories are left out.

    Example:
      >>> r = rk.inspect(lambda a: (a @ a) @ a, jnp.ones((64, 64)), target="cpu")
      >>> t = split_table(r)
      >>> t.title, list(t.columns[0].cells)
      ('bytes at the peak', ['input', 'other temporaries'])
    """
    t = Table(title="bytes at the peak")
    t.add_column("category")
    t.add_column("GiB", justify="right")
    t.add_column("layer")
    t.add_column("GiB ", justify="right")
    cats = [(k, v) for k, v in r.by_category.items() if v]
    layers = list(r.by_layer.items())
    for i in range(max(len(cats), len(layers))):
        c = cats[i] if i < len(cats) else ("", None)
        lay = layers[i] if i < len(layers) else ("", None)
        t.add_row(
            c[0],
            gib(c[1]) if c[1] is not None else "",
            lay[0],
            gib(lay[1]) if lay[1] is not None else "",
        )
    return t


def diff_table(d: PeakDiff, policies: Sequence[str]) -> Table:
    """What the second policy keeps at its peak that the first does not (15 largest rows).

    Args:
      d: ``rk.peak.diff(a, b)``.
      policies: the two labels, ``a``'s then ``b``'s.

    Returns:
      The table (category, label, MiB in each, delta).

    Example:
      >>> x = jnp.ones((64, 64))
      >>> a = rk.inspect(lambda a: a @ a, x, target="cpu")
      >>> b = rk.inspect(lambda a: (a @ a) @ a, x, target="cpu")
      >>> diff_table(rk.peak.diff(a, b), ["one", "two"]).title
      'what two keeps at its peak that one does not (peak +0.00 GiB)'
    """
    a, b = policies
    t = Table(
        title=f"what {b} keeps at its peak that {a} does not (peak {d.peak_delta / 2**30:+.2f} GiB)"
    )
    for col in ("category", "label", f"{a} MiB", f"{b} MiB", "delta MiB"):
        t.add_column(col, justify="left" if col in ("category", "label") else "right")
    for c, lab, x, y in d.kept[:15]:
        t.add_row(c, lab, f"{x / _MIB:.1f}", f"{y / _MIB:.1f}", f"{(y - x) / _MIB:+.1f}")
    return t
