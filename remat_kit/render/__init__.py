"""The rendering layer: data in, text, tables, JSON, CSV and PNG out.

Library code returns data (frozen dataclasses with ``to_dict``); the CLI and the experiment
scripts hand it here to be shown or written. Nothing else writes a file; a figure reads as
:mod:`remat_kit._units` has it (shared with the notes' words), and ``GIB``, ``fmt``, ``gib``
and ``pct`` are re-exported from there.
"""

from remat_kit._units import GIB, fmt, gib, pct
from remat_kit.render._advice import ADVISE_DROP, advise_table
from remat_kit.render._captions import (
    SCHEDULER_WORDS,
    depth_words,
    flags_words,
    limit_words,
    nothing_fits_words,
    xla_limits_words,
)
from remat_kit.render._files import (
    check_output,
    check_profile_dir,
    check_trace,
    save_figure,
    write_csv,
    write_json,
    write_profile,
    write_text,
    write_trace,
)
from remat_kit.render._format import console, short, text_table
from remat_kit.render._front import front_figure, plot_front
from remat_kit.render._inspection import PROFILE_HOST, PROFILE_XPLANE, write_inspection
from remat_kit.render._layout import DROP_FIRST, fitted
from remat_kit.render._listings import (
    models_table,
    nodes_table,
    policies_table,
    targets_table,
    tpus_table,
)
from remat_kit.render._peak import buffer_table, diff_table, peak_table, split_table
from remat_kit.render._plan_tables import decision_table, plan_table
from remat_kit.render._progress import compiling_words, length_words, live_line, progress
from remat_kit.render._seq import longest_words, seq_table
from remat_kit.render._tables import (
    FitRow,
    compare_table,
    fit_table,
    report_table,
    residual_table,
)
from remat_kit.render._throughput import fastest_words, throughput_table
from remat_kit.render._timeline import plot_timeline, timeline_figure
from remat_kit.render._titles import RunOptions, opts_precision, precision_words, run_words
from remat_kit.render._trace import trace_events
from remat_kit.render._validation import validation_table
from remat_kit.render._xprof import module_names, xspace

__all__ = [
    "ADVISE_DROP",
    "DROP_FIRST",
    "GIB",
    "PROFILE_HOST",
    "PROFILE_XPLANE",
    "SCHEDULER_WORDS",
    "FitRow",
    "RunOptions",
    "advise_table",
    "buffer_table",
    "check_output",
    "check_profile_dir",
    "check_trace",
    "compare_table",
    "compiling_words",
    "console",
    "decision_table",
    "depth_words",
    "diff_table",
    "fastest_words",
    "fit_table",
    "fitted",
    "flags_words",
    "fmt",
    "front_figure",
    "gib",
    "length_words",
    "limit_words",
    "live_line",
    "longest_words",
    "models_table",
    "module_names",
    "nodes_table",
    "nothing_fits_words",
    "opts_precision",
    "pct",
    "peak_table",
    "plan_table",
    "plot_front",
    "plot_timeline",
    "policies_table",
    "precision_words",
    "progress",
    "report_table",
    "residual_table",
    "run_words",
    "save_figure",
    "seq_table",
    "short",
    "split_table",
    "targets_table",
    "text_table",
    "throughput_table",
    "timeline_figure",
    "tpus_table",
    "trace_events",
    "validation_table",
    "write_csv",
    "write_inspection",
    "write_json",
    "write_profile",
    "write_text",
    "write_trace",
    "xla_limits_words",
    "xspace",
]
