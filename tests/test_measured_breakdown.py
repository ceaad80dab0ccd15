"""The measured breakdown: roles at the compiled peak from XLA's buffer assignment."""

from __future__ import annotations

import json
import types

import jax
import pytest

import remat_kit as rk
import remat_kit_models as models
from helpers import memory_report
from remat_kit.breakdown import (
    MEASURED_PARTS,
    add_breakdown,
    add_measured_breakdown,
    measured_breakdown,
)
from remat_kit.cli import main
from remat_kit.errors import BadValue, InspectError
from remat_kit_models.spec import PresetSpec


def _bytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


@pytest.fixture(scope="module", params=[True, False], ids=["scan", "unrolled"])
def step(request):
    # Two layers unrolled (the scanned stack compiles one body whatever its depth): the
    # parts and the peak are read the same way at any depth.
    layers = 4 if request.param else 2
    cfg = models.get_config(
        "tiny-llama", policy="minimal", scan_layers=request.param, n_layers=layers
    )
    config = rk.TrainConfig(batch=2, seq=64, precision="bf16")
    return rk.build_train_step(models.build(cfg), config)


@pytest.mark.slow
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


@pytest.mark.slow
def test_report_keeps_the_estimate_labelled():
    src = rk.sources.resolve(PresetSpec("tiny-llama"))
    config = rk.TrainConfig(2, 64, precision="bf16")
    measured = rk.sources.measure(
        src, "minimal", "h100", config, warn=False, measured_breakdown=True
    )
    estimated = rk.sources.measure(src, "minimal", "h100", config, warn=False)
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
        rk.sources.measure(
            rk.sources.resolve(PresetSpec("tiny-llama", shard="fsdp:8")),
            "full",
            rk.target("h100", devices=8),
            rk.TrainConfig(8, 64),
            warn=False,
            measured_breakdown=True,
        )


@pytest.mark.slow
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


# --- the arithmetic, on fakes (no compile) --------------------------------------------------------

#: The shapes' parts, each a different power of two so a part left out or subtracted shows.
SHAPES = {"weights": 1, "optimizer": 2, "batch": 4, "gradients": 8, "grad_accumulator": 16}


def _report(peak):
    return memory_report(None, peak_bytes=peak, meta={"model": "fake"})


def _step(plan=None):
    return types.SimpleNamespace(breakdown=dict(SHAPES), plan=plan)


@pytest.mark.parametrize(("peak", "activations"), [(100, 69), (31, 0)])
def test_activations_are_the_rest_of_the_peak(peak, activations):
    """Exactly the parts (31 bytes) is no activation and no note."""
    r = add_breakdown(_report(peak), _step())
    assert dict(r.breakdown) == {**SHAPES, "activations": activations}
    assert [n.kind for n in r.notes] == []


def test_a_peak_under_the_shapes_parts_says_they_are_an_upper_bound():
    r = add_breakdown(_report(30), _step())  # 31 bytes of parts, 30 at the peak
    assert r.breakdown["activations"] == 0
    (note,) = r.notes
    assert note.kind == "breakdown_upper_bound"
    assert note.data == {"peak_bytes": 30, "known_bytes": 31}


@pytest.mark.parametrize("missing", ["weights", "optimizer", "batch", "gradients"])
def test_a_step_whose_roles_are_not_all_known_keeps_those_it_has_and_no_rest(missing):
    """A user's step that named only some roles: the report carries those, and no
    ``activations`` (the rest of what is not known is not the activations)."""
    step = _step()
    del step.breakdown[missing]
    r = add_breakdown(_report(100), step)
    assert dict(r.breakdown) == {k: v for k, v in SHAPES.items() if k != missing}
    assert r.peak_bytes == 100 and [n.kind for n in r.notes] == []


#: The inspector's bytes by category, each a different power of two.
CATEGORIES = {
    "parameter": 1,
    "gradient": 2,
    "optimizer state": 4,
    "input": 8,
    "saved activation": 16,
    "recomputation workspace": 32,
    "other temporaries": 64,
    "fragmentation": 128,
}


def _inspector(monkeypatch, peak=255, by_category=CATEGORIES):
    seen = []

    def inspect_step(step, target):
        seen.append(target)
        return types.SimpleNamespace(by_category=dict(by_category), peak_bytes=peak)

    monkeypatch.setattr("remat_kit.breakdown._peak.inspect_step", inspect_step)
    return seen


def test_measured_parts_read_each_category_of_the_inspector(monkeypatch):
    seen = _inspector(monkeypatch)
    assert measured_breakdown(_step(), "h200") == {
        "weights": 1,
        "gradients": 2,
        "optimizer": 4,
        "batch": 8,
        "saved_activations": 16,
        "recompute_workspace": 32,
        "temporaries": 64,
        "fragmentation": 128,
        "peak": 255,
    }
    assert seen == ["h200"]
    # A category absent at the peak is 0, not missing.
    absent = {k: v for k, v in CATEGORIES.items() if k != "parameter"}
    _inspector(monkeypatch, peak=254, by_category=absent)
    assert measured_breakdown(_step())["weights"] == 0


def test_measured_parts_that_do_not_sum_to_the_peak_are_an_error(monkeypatch):
    _inspector(monkeypatch, peak=256)
    with pytest.raises(InspectError, match="sum to 255 bytes, not the compiled peak 256"):
        measured_breakdown(_step())
    with pytest.raises(BadValue, match="sharded"):
        measured_breakdown(_step(plan=types.SimpleNamespace(spec="fsdp:2")))


def test_the_measured_breakdown_replaces_the_estimate_and_keeps_it_in_meta(monkeypatch):
    _inspector(monkeypatch)
    r = add_measured_breakdown(_report(255), _step(), "h100")
    assert dict(r.breakdown) == {
        "weights": 1,
        "gradients": 2,
        "optimizer": 4,
        "batch": 8,
        "saved_activations": 16,
        "recompute_workspace": 32,
        "temporaries": 64,
        "fragmentation": 128,
        "activations": 16 + 32 + 64 + 128,
    }
    assert r.meta == {
        "model": "fake",
        "breakdown": "measured",
        "breakdown_estimate": {**SHAPES, "activations": 255 - 31},
    }
    with pytest.raises(InspectError, match="peaks at 255 bytes, the report's at 256"):
        add_measured_breakdown(_report(256), _step(), "h100")
