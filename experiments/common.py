"""Helpers shared by the experiment scripts: argument parsing and the rendering layer's writers."""

from __future__ import annotations

import argparse
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
    p.add_argument(
        "--only", default="", help="comma-separated names of the cases to run (default: all)"
    )
    return p.parse_args(argv)


def preset_report(spec: Any, config: Any, policy: str, target: Any) -> Any:
    """The deviceless report of a preset's train step (``PresetSpec``) under ``policy`` on
    ``target``, sharded when the spec names a mesh: its ``step_time`` is the prediction."""
    import remat_kit as rk
    from remat_kit.policies import parse_policy
    from remat_kit.schedules import parse_schedule

    built = rk.sources.resolve(spec).build_step(
        parse_policy(policy), parse_schedule("none"), config, target, sharded=spec.shard is not None
    )
    step = built.step
    return rk.memory_report(
        step.fn,
        *step.args,
        target=target,
        donate_argnums=step.donate_argnums,
        in_shardings=getattr(step, "in_shardings", None),
        policy=None,
        warn=False,
        meta={"batch": config.batch, "seq": config.seq},
    )


def write_json(path: Path, data: Any) -> None:
    """Writes ``data`` atomically (remat_kit's one writer), creating results/ if needed."""
    from remat_kit.render import write_json as _write

    _write(path, data, flag="output", make_parents=True)


def save_png(fig: Any, path: Path) -> None:
    """Saves a matplotlib figure atomically and closes it."""
    from remat_kit.render import save_figure

    save_figure(fig, path, flag="output", make_parents=True, dpi=120)


def table(rows: list[dict[str, Any]], columns: Sequence[str], title: str = "") -> str:
    """The rows as a plain-text table."""
    from remat_kit.render import text_table

    return text_table(rows, columns, title)


def progress(items: Sequence[Any], label: str):
    """Iterates ``items`` with a rich progress bar on stderr."""
    from rich.progress import track

    return track(items, description=label, transient=True)


def fit_exponent(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Slope of log y against log x: y ~ x^slope."""
    import numpy as np

    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def run_parts(
    doc: str,
    argv: Sequence[str] | None,
    parts: dict[str, Any],
    name: str,
    readme_rows: Any,
    plot: Any,
) -> None:
    """Runs the parts ``--only`` names (all by default) into results/<name>.json and .png.

    A part not run keeps what an earlier run wrote; ``readme_rows(data)`` and ``plot(data,
    path)`` see every part's rows.
    """
    import json
    import time

    args = parse(doc, argv)
    asked = {s for s in args.only.split(",") if s}
    if asked - set(parts):
        raise SystemExit(f"--only: unknown part(s) {sorted(asked - set(parts))}; {sorted(parts)}")
    only = asked or set(parts)
    path = args.out / f"{name}.json"
    data: dict[str, Any] = {part: [] for part in parts}
    if path.exists():
        data.update({k: v for k, v in json.loads(path.read_text()).items() if k in data})
    for part in parts:
        if part in only:
            t0 = time.perf_counter()
            data[part] = parts[part](args)
            data[f"{part}_seconds"] = time.perf_counter() - t0
    data["readme_rows"] = readme_rows(data)
    write_json(path, data)
    plot(data, args.out / f"{name}.png")


def plot_pairs(
    rows: Sequence[dict[str, Any]], ours: str, theirs: str, path: Path, title: str
) -> None:
    """Side-by-side bars of two peak figures per row (ours vs an independent compile), GiB."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['model']}\n{str(r['policy'])[:28]}" for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(rows)), 4))
    ax.bar([x - 0.2 for x in xs], [r[ours] / 2**30 for r in rows], 0.4, label="remat-kit")
    ax.bar([x + 0.2 for x in xs], [r[theirs] / 2**30 for r in rows], 0.4, label=theirs)
    ax.set_xticks(list(xs), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("peak GiB")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    save_png(fig, path)
