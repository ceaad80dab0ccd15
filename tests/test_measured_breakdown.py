"""The measured breakdown: roles at the compiled peak from XLA's buffer assignment."""

from __future__ import annotations

import json

import jax
import pytest

import remat_kit as rk
import remat_kit_models as models
from remat_kit.breakdown import MEASURED_PARTS, measured_breakdown
from remat_kit.cli import main
from remat_kit.errors import BadValue
from remat_kit_models.measure import Options, measure


def _bytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


@pytest.fixture(scope="module", params=[True, False], ids=["scan", "unrolled"])
def step(request):
    cfg = models.get_config("tiny-llama", policy="minimal", scan_layers=request.param)
    config = rk.TrainConfig(batch=2, seq=64, precision="bf16")
    return rk.build_train_step(models.build(cfg), config)


def test_parts_sum_to_the_compiled_peak(step):
    parts = measured_breakdown(step, "h100")
    report = rk.memory_report(
        step.fn, *step.args, target="h100", donate_argnums=step.donate_argnums, warn=False
    )
    roles = {k: v for k, v in parts.items() if k != "peak"}
    assert set(roles) == set(MEASURED_PARTS)
    assert sum(roles.values()) == parts["peak"] == report.peak_bytes
    assert all(v >= 0 for v in roles.values()), roles
    # Arguments live through the whole step: all of them are at the peak.
    assert parts["weights"] >= _bytes(step.args[:2])
    assert parts["optimizer"] >= _bytes(step.args[2])
    assert parts["batch"] == _bytes(step.args[3])
    # Gradients at the peak are at most one per trained weight (none when it is in the
    # forward pass, as for the unrolled stack here).
    assert 0 <= parts["gradients"] <= _bytes(step.args[0])
    assert parts["saved_activations"] > 0  # minimal keeps the projections


def test_report_keeps_the_estimate_labelled():
    opts = Options("tiny-llama", 2, 64, precision="bf16")
    measured = measure(opts, "minimal", "h100", measured_breakdown=True)
    estimated = measure(opts, "minimal", "h100")
    assert measured.peak_bytes == estimated.peak_bytes
    assert measured.meta["breakdown"] == "measured"
    assert measured.meta["breakdown_estimate"] == dict(estimated.breakdown)
    b = measured.breakdown
    keys = ("saved_activations", "recompute_workspace", "temporaries", "fragmentation")
    assert b["activations"] == sum(b[k] for k in keys)
    fixed = b["weights"] + b["gradients"] + b["optimizer"] + b["batch"]
    assert fixed + b["activations"] == measured.peak_bytes


def test_sharded_step_is_refused():
    with pytest.raises(BadValue, match="unsharded"):
        measure(
            Options("tiny-llama", 8, 64, shard="fsdp:8"),
            "full",
            rk.target("h100", devices=8),
            measured_breakdown=True,
        )


def test_cli_flag(tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = ["report", "--model", "tiny-llama", "--batch", "2", "--seq", "64", "--target", "h100"]
    assert main([*argv, "--no-residuals", "--measured-breakdown", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "from XLA's buffer assignment" in text and "saved activations" in text
    data = json.loads(out.read_text())
    parts = {k: v for k, v in data["breakdown"].items() if k in MEASURED_PARTS}
    assert sum(parts.values()) == data["peak_bytes"]
    assert data["meta"]["breakdown"] == "measured"
