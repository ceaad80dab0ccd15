"""``{results-table} NAME``: a table generated at build time from ``results/*.json``.

The experiments write their figures to ``results/``; these tables read them as the page is
built, so a page cannot show a figure the results no longer hold. ``claims`` is
``experiments/run_all.py``'s own table (the same function draws it there).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from _tables import table
from docutils import nodes
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
GIB = 2**30

Rows = tuple[tuple[str, ...], list[tuple[str, ...]], str]


def _load(name: str) -> dict | list:
    return json.loads((RESULTS / f"{name}.json").read_text())


def _pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:+.{digits}f}%"


def _gpu_validation(name: str) -> Rows:
    data = _load(name)
    rows = []
    for r in data["rows"]:
        m = r["meta"]
        measured = "out of memory" if r["oom"] else f"{r['measured_peak_bytes'] / GIB:.2f}"
        step = r.get("predicted_step_seconds")
        time = "" if step is None else f"{r['step_seconds']:.3f} / {step:.3f}"
        rows.append(
            (
                f"{m['model']} b{m['batch']} s{m['seq']}",
                m["policy"],
                f"{r['predicted_peak_bytes'] / GIB:.2f}",
                measured,
                "" if r["oom"] else _pct(r["error"], 2),
                time,
            )
        )
    header = ("model", "policy", "predicted GiB", "measured GiB", "error", "step s run / predicted")
    return header, rows, data["summary"]["device"]


def _step_time() -> Rows:
    rows = []
    for r in _load("step_time")["h100"]:
        measured = r["measured s"]
        rows.append(
            (
                r["model"],
                r["policy"],
                "-" if measured is None else f"{measured:.3f}",
                f"{r['predicted s']:.3f}",
                _pct(r["error"]) if r["error"] is not None else r["ran"],
            )
        )
    header = ("model", "policy", "measured s", "predicted s", "error")
    return header, rows, "steps timed on the lent H100 (results/step_time.json, 'h100')"


def _published() -> Rows:
    rows = []
    for r in _load("step_time")["published"]:
        published = f"{r['published s']:.3f}"
        if r.get("published TFLOP/s"):
            published += f" ({r['published TFLOP/s']:.0f} TFLOP/s)"
        split = r["split"]
        compute = split["matmul"] + split["attention"] + split["memory"]
        rows.append(
            (
                r["run"],
                r["node"],
                r["shard"],
                published,
                f"{r['predicted s']:.3f}",
                _pct(r["error"]),
                f"{compute:.3f}",
                f"{split['collective']:.3f}",
                f"{split['contention']:.3f}",
            )
        )
    header = ("run", "node", "mesh", "published s", "predicted s", "error", "compute s",
              "exposed collectives s", "contention s")  # fmt: skip
    return header, rows, "published MaxText runs (results/step_time.json, 'published')"


def _maxtext_scale() -> Rows:
    data = _load("maxtext_scale")
    five = ("argument", "output", "alias", "temp", "generated_code")
    rows = [
        (
            r["name"],
            r["policy"],
            f"{r['gpus']}" + (f" ({r['hosts']} hosts)" if r["hosts"] > 1 else ""),
            str(r["ours_argument"] + r["ours_output"] + r["ours_temp"] - r["ours_alias"]),
            str(r["ours_temp"]),
            str(r["maxtext_temp"]),
            "yes" if all(r[f"ours_{f}"] == r[f"maxtext_{f}"] for f in five) else "no",
        )
        for r in data["rows"]
    ]
    where = f"compile-only H100s, {data['codegen']} codegen (results/maxtext_scale.json)"
    header = (
        "config",
        "policy",
        "GPUs",
        "peak B",
        "temp B ours",
        "temp B MaxText",
        "all five equal",
    )
    return header, rows, where


def _flax_examples() -> Rows:
    rows = [
        (r["model"], r["policy"], str(r["ours"]), str(r["bare"]), "yes" if r["equal"] else "no")
        for r in _load("flax_examples")
    ]
    return ("model", "policy", "ours B", "bare B", "equal"), rows, "h100, bare jax.jit + optax"


def _external_models() -> Rows:
    data = _load("external_models")
    rows = [
        (
            r["policy"],
            f"{r['ours_peak_gib']:.2f}",
            f"{r['hf_peak_gib']:.2f}",
            _pct(r["peak_diff_pct"] / 100),
        )
        if "hf_peak_gib" in r
        else (r["policy"], f"{r['ours_peak_gib']:.2f}", "-", "not compared: no such tensor there")
        for r in data["rows"]
    ]
    step = data["step"]
    where = (
        f"{data['target']}, b{step['batch']} s{step['seq']} {step['optimizer']} {step['precision']}"
    )
    return ("policy", "llama3-8b preset GiB", "HF Flax Llama GiB", "difference"), rows, where


def _library_models() -> Rows:
    rows = []
    for lib, data in _load("library_models")["libraries"].items():
        for r in data["rows"]:
            rows.append(
                (
                    f"{lib} ({data['library']})",
                    r["policy"],
                    f"{r['ours_gib']:.2f}",
                    f"{r['bare_gib']:.2f}",
                    _pct(r["diff_pct"] / 100, 2),
                )
            )
    return ("library", "policy", "ours GiB", "bare GiB", "difference"), rows, "h100"


def _claims() -> Rows:
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import run_all
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    lines = run_all.table_markdown().splitlines()
    split = [tuple(c.strip() for c in line.strip("|").split(" | ")) for line in lines]
    return split[0], split[2:], "experiments/run_all.py"


TABLES: dict[str, Callable[[], Rows]] = {
    "gpu-validation-h100": lambda: _gpu_validation("gpu_validation"),
    "gpu-validation-h200": lambda: _gpu_validation("gpu_validation_h200"),
    "step-time-h100": _step_time,
    "step-time-published": _published,
    "maxtext-scale": _maxtext_scale,
    "flax-examples": _flax_examples,
    "external-models": _external_models,
    "library-models": _library_models,
    "claims": _claims,
}


class ResultsDirective(SphinxDirective):
    """One table of ``TABLES``, with a line naming where its figures come from."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        if name not in TABLES:
            raise self.error(f"unknown results table {name!r}; known: {', '.join(TABLES)}")
        header, rows, where = TABLES[name]()
        note = nodes.paragraph(text=f"Generated when this page was built, from {where}.")
        return [table(header, rows), note]


def setup(app):  # Sphinx calls it to load the extension
    app.add_directive("results-table", ResultsDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
