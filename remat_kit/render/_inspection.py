"""The files of an inspection: a Perfetto trace and an XProf profile of compiled programs.

What ``remat-kit inspect --trace FILE --xprof DIR`` writes, for any ``rk.PeakReport`` made with
``series=True`` (the trace) and ``hlo_proto=True`` (the profile): the CLI's reports of a
preset's step, or ``step.inspect(...)`` of a step wrapped by ``rk.auto`` (the decided program).

Example:
  >>> import tempfile
  >>> with tempfile.TemporaryDirectory() as d:
  ...     r = rk.inspect(lambda a: a @ a, jax.ShapeDtypeStruct((64, 64), "float32"),
  ...                    target="h100", series=True, hlo_proto=True)
  ...     got = write_inspection([r], rk.target("h100"), ["mine"], trace=f"{d}/t.json",
  ...                            xprof=f"{d}/prof")
  ...     sorted(got), got["xprof"].name
  (['trace', 'xprof'], 'prof')
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from remat_kit.errors import BadValue
from remat_kit.peak import PeakReport, step_trace
from remat_kit.render._files import check_profile_dir, check_trace, write_profile, write_trace
from remat_kit.render._trace import trace_events
from remat_kit.render._xprof import xspace

__all__ = [
    "PROFILE_HOST",
    "PROFILE_XPLANE",
    "write_inspection",
]

#: The host XProf names, and where its one run's XSpace goes under the profile directory.
PROFILE_HOST = "remat-kit"
PROFILE_XPLANE = f"plugins/profile/{PROFILE_HOST}/{PROFILE_HOST}.xplane.pb"


def write_inspection(
    reports: Sequence[PeakReport],
    target: Any,
    labels: Sequence[str],
    *,
    trace: str | os.PathLike[str] | None = None,
    xprof: str | os.PathLike[str] | None = None,
    trace_flag: str = "trace",
    xprof_flag: str = "xprof",
) -> dict[str, Path]:
    """Writes the Perfetto trace and/or the XProf profile of ``reports``, atomically.

    Both paths are checked before anything is written.

    Args:
      reports: the programs (one process, or one module, each); ``series`` for a trace,
        ``hlo_proto`` for a profile.
      target: the ``rk.Target`` they were compiled for (its step-time model prices the
        trace's kernels).
      labels: each report's name in the trace (a policy).
      trace: a ``.json`` file: the predicted kernels beside the live bytes (Perfetto).
      xprof: a new or empty directory: ``xprof --logdir DIR``, then Memory Viewer.
      trace_flag, xprof_flag: how the caller named the paths, for the messages.

    Returns:
      ``{"trace": path, "xprof": path}`` for what was written.

    Raises:
      BadValue: a trace not ending in ``.json``, a profile directory that holds files, or a
        report made without the data the file needs.
    """
    if trace is not None:
        check_trace(trace, flag=trace_flag)
        if any(r.series is None for r in reports):
            raise BadValue(f"{trace_flag} needs reports made with series=True", param="trace")
    if xprof is not None:
        check_profile_dir(xprof, flag=xprof_flag)
        if any(r.hlo_proto is None for r in reports):
            raise BadValue(f"{xprof_flag} needs reports made with hlo_proto=True", param="xprof")
    out: dict[str, Path] = {}
    if trace is not None:
        doc = trace_events([step_trace(r, target) for r in reports], labels)
        out["trace"] = write_trace(trace, doc, flag=trace_flag)
    if xprof is not None:
        programs = [(r.module or "module", r.hlo_proto or b"") for r in reports]
        files = {PROFILE_XPLANE: xspace(programs, host=PROFILE_HOST)}
        out["xprof"] = write_profile(xprof, files, flag=xprof_flag)
    return out
