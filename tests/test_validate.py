"""remat_kit.validate on a CPU: the real-GPU check's logic with a fake statistics source.

The step really runs (on the CPU device); only the allocator's figures are scripted, so the
arithmetic (what is measured, the error, the matching of device kinds) is checked exactly.
"""

from __future__ import annotations

import glob
import types

import jax
import jax.numpy as jnp
import pytest

import remat_kit as rk
import remat_kit_models as models
from remat_kit import validate as validate_mod
from remat_kit.errors import BadValue, TargetError
from remat_kit.validate import LocalGPU, Validation, match_target, validate

H100_KIND = "NVIDIA H100 80GB HBM3"


class FakeStats:
    """Runs on the CPU device and answers ``memory_stats`` from a script (last one repeats).

    ``validate`` reads the statistics four times: on entry, before the arguments are placed,
    once they are placed, and after the steps.
    """

    def __init__(self, kind: str, script: list[dict[str, int]] | None):
        self.kind = kind
        self.script = script
        self.calls = 0

    def device(self):
        return jax.devices("cpu")[0]

    def device_kind(self) -> str:
        return self.kind

    def memory_stats(self):
        if self.script is None:
            return None
        stats = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return stats


def _script(baseline: int, placed: int, peak: int, limit: int) -> list[dict[str, int]]:
    first = {"bytes_in_use": baseline, "peak_bytes_in_use": baseline, "bytes_limit": limit}
    after_args = {"bytes_in_use": placed, "peak_bytes_in_use": placed, "bytes_limit": limit}
    after_steps = {"bytes_in_use": placed, "peak_bytes_in_use": peak, "bytes_limit": limit}
    return [first, first, after_args, after_steps]


@pytest.fixture(scope="module")
def step():
    cfg = models.get_config("tiny-llama", policy="full")
    return rk.build_train_step(models.build(cfg), rk.TrainConfig(batch=2, seq=32))


def _predicted(step, limit: int) -> int:
    # The prediction, computed here the way a user would: a deviceless compile for the H100
    # whose allocator has the local limit (XLA's remat pass works to it: a tiny limit changes
    # the program).
    t = rk.target("h100-80gb")
    t = t.with_mem_fraction(min(1.0, limit / t.memory_bytes))
    report = rk.memory_report(
        step.fn, *step.args, target=t, donate_argnums=step.donate_argnums, warn=False
    )
    return report.peak_bytes


def _predicted_step(step, limit: int) -> float:
    # The step-time model over the kernels of that same compile, called directly.
    from remat_kit.analysis import abstract
    from remat_kit.targets import analysis_options
    from remat_kit.timing import kernels_of, speed_of, step_time

    t = rk.target("h100-80gb")
    t = t.with_mem_fraction(min(1.0, limit / t.memory_bytes))
    args = tuple(abstract(a, t.sharding()) for a in step.args)
    jitted = jax.jit(step.fn, donate_argnums=step.donate_argnums)
    compiled = jitted.lower(*args).compile(compiler_options=analysis_options(t))
    return step_time(kernels_of(compiled.as_text()), speed_of(t)).seconds


@pytest.mark.slow
@pytest.mark.parametrize(
    "baseline, extra, limit",
    # A limit the step fits in and one it does not (XLA's remat pass works to it), each above
    # a baseline; a third case (no baseline, 60 GiB) ran the fitting path again and was dropped.
    [(123_456, 7_777_777, 2**30), (10_000, 2_000_000, 1_000)],
)
def test_measures_peak_above_baseline_and_the_error(step, baseline, extra, limit):
    predicted = _predicted(step, limit)
    fake = FakeStats(H100_KIND, _script(baseline, baseline + 4096, baseline + extra, limit))
    v = validate(step, steps=3, stats_source=fake)
    assert v.target == "h100-80gb"
    assert v.device_kind == H100_KIND
    assert v.measured_peak_bytes == extra
    assert v.predicted_peak_bytes == predicted
    assert v.error == pytest.approx(predicted / extra - 1.0)
    assert v.bytes_limit == limit
    assert v.predicted_fits is (predicted <= limit)
    assert not v.oom and v.note == ""
    assert v.step_seconds is not None and v.step_seconds > 0  # the steps really ran
    # the prediction beside it comes from the same deviceless compile's kernels
    assert v.predicted_step_seconds == pytest.approx(_predicted_step(step, limit))
    assert fake.calls == 4


@pytest.mark.slow
def test_to_dict_is_json_ready(step):
    import json

    fake = FakeStats(H100_KIND, _script(0, 10, 2_000_000, 2**30))
    v = validate(step, steps=1, stats_source=fake, meta={"model": "tiny-llama"})
    data = json.loads(json.dumps(v.to_dict()))
    assert data["error"] == pytest.approx(v.error)
    assert data["meta"] == {"model": "tiny-llama"}
    assert data["step_seconds"] is None  # one step: no warm step to time
    assert isinstance(v, Validation)


@pytest.mark.slow
def test_no_new_peak_is_no_measurement(step):
    # The process peaked higher before the steps (e.g. an earlier check in the same process).
    script = _script(0, 1000, 1000, 2**30)
    script[0] = script[1] = {"bytes_in_use": 0, "peak_bytes_in_use": 9_000_000}
    script[3] = {"bytes_in_use": 1000, "peak_bytes_in_use": 9_000_000, "bytes_limit": 2**30}
    v = validate(step, steps=2, stats_source=FakeStats(H100_KIND, script))
    assert v.measured_peak_bytes is None
    assert v.error is None
    assert "fresh process" in v.note


@pytest.mark.slow
def test_explicit_target_overrides_the_match(step):
    fake = FakeStats("NVIDIA Some Future GPU", _script(0, 10, 3_000_000, 2**30))
    v = validate(step, target="a100-80gb", steps=1, stats_source=fake)
    assert v.target == "a100-80gb"


def test_unknown_device_kind_names_the_known_ones(step):
    fake = FakeStats("NVIDIA Some Future GPU", _script(0, 10, 3_000_000, 2**30))
    with pytest.raises(TargetError, match=r"no catalogue target for device kind.*h100-80gb"):
        validate(step, stats_source=fake)


def test_no_statistics_is_not_a_gpu(step):
    with pytest.raises(TargetError, match="no allocator statistics"):
        validate(step, stats_source=FakeStats(H100_KIND, None))


@pytest.mark.parametrize("steps", [0, -1, True, 2.0])
def test_bad_step_count(step, steps):
    with pytest.raises(BadValue, match="steps="):
        validate(step, steps=steps, stats_source=FakeStats(H100_KIND, _script(0, 1, 2, 3)))


def test_cpu_target_is_refused(step):
    with pytest.raises(BadValue, match="not a GPU target"):
        validate(step, target="cpu", stats_source=FakeStats(H100_KIND, _script(0, 1, 2, 3)))


@pytest.mark.slow
def test_compiles_with_the_local_allocator_limit(step, monkeypatch):
    # The prediction is compiled with the limit the local allocator reports, not the env's.
    seen = {}

    def fake_report(fn, *args, target, **kw):
        seen["usable"] = target.usable_bytes
        return types.SimpleNamespace(peak_bytes=1, step_time=None)

    monkeypatch.setattr(validate_mod, "memory_report", fake_report)
    limit = 70 * 2**30
    validate(step, steps=1, stats_source=FakeStats(H100_KIND, _script(0, 1, 5, limit)))
    assert abs(seen["usable"] - limit) <= 1


def test_out_of_memory_is_reported(monkeypatch):
    # A step that fails the way XLA does when the allocator is exhausted.
    def boom(_):
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8 bytes")

    def fn(tr, fr, opt, batch):
        jax.debug.callback(boom, tr["w"])
        return tr, opt, jnp.sum(tr["w"])

    w = jax.ShapeDtypeStruct((8,), jnp.float32)
    fake_step = types.SimpleNamespace(fn=fn, args=({"w": w}, {}, {}, {}), donate_argnums=())
    # The callback cannot be compiled for a GPU here; the prediction is not under test.
    monkeypatch.setattr(
        validate_mod,
        "memory_report",
        lambda *a, **k: types.SimpleNamespace(peak_bytes=64, step_time=None),
    )
    v = validate(fake_step, steps=2, stats_source=FakeStats(H100_KIND, _script(0, 32, 64, 99)))
    assert v.oom
    assert v.measured_peak_bytes is None and v.error is None
    assert "running the step" in v.note


def test_other_runtime_errors_propagate(monkeypatch):
    def boom(_):
        raise RuntimeError("something else broke")

    def fn(tr, fr, opt, batch):
        jax.debug.callback(boom, tr["w"])
        return tr, opt, jnp.sum(tr["w"])

    w = jax.ShapeDtypeStruct((8,), jnp.float32)
    fake_step = types.SimpleNamespace(fn=fn, args=({"w": w}, {}, {}, {}), donate_argnums=())
    monkeypatch.setattr(
        validate_mod,
        "memory_report",
        lambda *a, **k: types.SimpleNamespace(peak_bytes=64, step_time=None),
    )
    with pytest.raises(Exception, match="something else broke"):
        validate(fake_step, steps=1, stats_source=FakeStats(H100_KIND, _script(0, 1, 2, 3)))


@pytest.mark.slow
def test_dropout_step_gets_its_key(monkeypatch):
    # A step with a dropout stream takes a fifth argument; validate feeds it through.
    cfg = models.get_config("tiny-gpt2", layers=2, dropout_rate=0.1, policy="full")
    step = rk.build_train_step(
        models.build(cfg, deterministic=False),
        rk.TrainConfig(batch=2, seq=16),
        rng_streams=("dropout",),
    )
    monkeypatch.setattr(
        validate_mod, "memory_report", lambda *a, **k: types.SimpleNamespace(peak_bytes=10)
    )
    v = validate(step, steps=2, stats_source=FakeStats(H100_KIND, _script(0, 1, 20, 99)))
    assert v.measured_peak_bytes == 20


# Device kinds as jax reports them (shared/gpu_targets.md, NAME column).
@pytest.mark.parametrize(
    "kind, name",
    [
        ("NVIDIA H100 80GB HBM3", "h100-80gb"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H200", "h200"),  # as jax named a lent one
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("NVIDIA L4", "l4"),
    ],
)
def test_match_target(kind, name):
    assert match_target(kind).name == name


@pytest.mark.skipif(bool(glob.glob("/dev/nvidia[0-9]*")), reason="this machine has a GPU")
def test_local_gpu_without_a_gpu_says_so():
    with pytest.raises(TargetError, match="no NVIDIA GPU"):
        LocalGPU()


@pytest.mark.skipif(bool(glob.glob("/dev/nvidia[0-9]*")), reason="this machine has a GPU")
def test_cli_without_a_gpu_exits_2_and_writes_nothing(tmp_path, capsys):
    from remat_kit.cli import main

    out = tmp_path / "v.json"
    code = main(
        ["validate", "--model", "tiny-llama", "--batch", "2", "--seq", "32", "--json", str(out)]
    )
    assert code == 2
    assert "no NVIDIA GPU" in capsys.readouterr().err
    assert not out.exists()


def test_cli_refuses_a_deviceless_target(capsys):
    from remat_kit.cli import main

    assert main(["validate", "--model", "tiny-llama", "--target", "h100"]) == 2
    assert "--compare-with" in capsys.readouterr().err


@pytest.mark.skipif(bool(glob.glob("/dev/nvidia[0-9]*")), reason="this machine has a GPU")
def test_experiment_without_a_gpu_writes_nothing(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "experiments" / "gpu_validation.py"
    done = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode != 0
    assert "no NVIDIA GPU" in done.stderr
    assert list(tmp_path.iterdir()) == []
