"""Helpers shared by the experiment scripts: argument parsing, atomic JSON, tables."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
GIB = 2**30

# Experiments compile for GPUs that are not here: jax must start on its CPU platform.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(ROOT))


def parse(doc: str, argv: Sequence[str] | None, **defaults: Any) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--target", default=defaults.get("target", "h100-80gb"))
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--quick", action="store_true", help="fewer points, for a smoke run")
    return p.parse_args(argv)


def write_json(path: Path, data: Any) -> None:
    """Writes atomically: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)


def table(rows: list[dict[str, Any]], columns: Sequence[str], title: str = "") -> str:
    """The rows as a plain-text table."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for c in columns:
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(*[_cell(r.get(c)) for c in columns])
    console = Console(width=140)
    with console.capture() as captured:
        console.print(t)
    return captured.get()


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return "-" if v is None else str(v)


def progress(items: Sequence[Any], label: str):
    """Iterates ``items`` with a rich progress bar on stderr."""
    from rich.progress import track

    return track(items, description=label, transient=True)


def fit_exponent(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Slope of log y against log x: y ~ x^slope."""
    import numpy as np

    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])
