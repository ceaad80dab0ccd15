"""Where XLA's own rematerialization pass, not the policy, made an answer fit.

XLA's GPU compiler runs a rematerialization pass of its own when a program's live bytes
exceed the memory it is told the device has: it recomputes buffers the policy keeps, until
the program fits (or it gives up). A search's answer can then fit only because of it:
``none`` at the largest batch ``fit`` finds holds less than ``none`` promises (measured on a
4-layer, 22M-parameter GPT on an H100: XLA took 31.2 GiB off ``none``'s peak, which let
``none`` reach a larger batch than ``minimal``). Its step recomputes what the policy keeps,
which the traced recompute figure does not count, so it runs slower than the policy's name
says. :func:`xla_made_fit` is the note that says so (``xla_remat_made_fit``).

Example:
  >>> n = xla_made_fit("none", "none", "batch", 297, peak_bytes=59 * 2**30,
  ...                  saved_bytes=31 * 2**30, limit_bytes=60 * 2**30)
  >>> n.kind, n.data["policy"], n.data["saved_bytes"] == 31 * 2**30
  ('xla_remat_made_fit', 'none', True)
  >>> xla_made_fit("none", "none", "batch", 8, peak_bytes=2**30, saved_bytes=2**29,
  ...              limit_bytes=2 * 2**30) is None  # it would fit without XLA's pass too
  True
"""

from __future__ import annotations

from remat_kit.notes import Note

__all__ = [
    "XLA_REMAT_MIN_BYTES",
    "xla_made_fit",
]

#: Less than this taken off the peak is not XLA's pass acting (the reports' own threshold:
#: ``MemoryReport.xla_remat``).
XLA_REMAT_MIN_BYTES = 2**20


def xla_made_fit(
    policy: str,
    schedule: str,
    axis: str,
    value: int,
    *,
    peak_bytes: int,
    saved_bytes: int,
    limit_bytes: int,
) -> Note | None:
    """The note for an answer that fits ``limit_bytes`` only because XLA's own remat pass
    took ``saved_bytes`` off its peak; None where it fits without that (or does not fit).

    Args:
      policy, schedule: what was compiled (specs).
      axis: where the answer lies, ``batch`` or ``seq``.
      value: the batch (or sequence) that fits; 0: nothing fits (no note).
      peak_bytes: the compiled peak, after XLA's pass.
      saved_bytes: what XLA's pass took off it (``MemoryReport.xla_remat_saved_bytes``).
      limit_bytes: the limit the answer is judged against (the usable memory, a budget).

    Returns:
      A ``xla_remat_made_fit`` Note, or None.
    """
    made_it = peak_bytes <= limit_bytes < peak_bytes + saved_bytes
    if value <= 0 or saved_bytes < XLA_REMAT_MIN_BYTES or not made_it:
        return None
    return Note(
        "xla_remat_made_fit",
        {
            "policy": policy,
            "schedule": schedule,
            "axis": axis,
            "value": int(value),
            "saved_bytes": int(saved_bytes),
            "peak_bytes": int(peak_bytes),
            "limit_bytes": int(limit_bytes),
        },
    )
