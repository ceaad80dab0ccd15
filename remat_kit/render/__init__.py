"""The rendering layer: data in, text, tables, JSON, CSV and PNG out.

Library code returns data (frozen dataclasses with ``to_dict``); the CLI and the experiment
scripts hand it here to be shown or written. Nothing else formats a number or writes a file.
"""

from remat_kit.render.files import check_output, save_figure, write_csv, write_json, write_text
from remat_kit.render.format import GIB, console, fmt, gib, pct, short, text_table

__all__ = [
    "GIB",
    "check_output",
    "console",
    "fmt",
    "gib",
    "pct",
    "save_figure",
    "short",
    "text_table",
    "write_csv",
    "write_json",
    "write_text",
]
