"""One measuring pipeline (rk.sources): every kind of model source is measured the same way.

A preset, a factory and a source nobody here wrote (a minimal StepSource) go through the same
measure / residuals / step_flops / workload; the library never asks which kind it holds, and
remat_kit never imports the presets (a plugin: ``rk.sources.resolve`` finds them).
"""

from __future__ import annotations

import ast
import dataclasses
import warnings
from pathlib import Path

import flax.linen as nn
import jax
import pytest
from jax.ad_checkpoint import checkpoint_name

import remat_kit as rk
import remat_kit_models as models
import remat_kit_models.source
from remat_kit import sources
from remat_kit.policies import parse_policy
from remat_kit_models.spec import PresetSpec

ROOT = Path(__file__).parent.parent
FACTORIES = str(Path(__file__).parent / "data" / "factories.py")
CONFIG = rk.TrainConfig(batch=2, seq=16, optimizer="sgd")


class _Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = checkpoint_name(nn.Dense(32, name="up")(x), "mlpwi")
        return x + nn.Dense(x.shape[-1], name="down")(nn.gelu(h))


class _Tiny(nn.Module):
    policy: rk.Policy

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(64, 16)(tokens)
        for i in range(2):
            x = rk.remat(_Block, self.policy)(name=f"layers_{i}")(x)
        return nn.Dense(64)(x)


@dataclasses.dataclass(frozen=True)
class _OwnSource(sources.StepSource):
    """A source written against the protocol alone (its defaults inherited): the pipeline
    must serve it unchanged."""

    spec: str = "own"

    @property
    def schedule_kinds(self) -> frozenset[str]:
        return frozenset({"none"})

    def n_layers(self) -> int:
        return 2

    def at_depth(self, layers):
        del layers

    def check(self, config, target) -> None:
        del config, target

    def build_step(self, policy, schedule, config, target, *, sharded=True):
        step = rk.build_train_step(_Tiny(policy), config)
        return sources.SourceStep(step, policy, schedule, "xla", {"layers": 2, "own": True})

    def check_step(self, built, what) -> None:
        del built, what

    def mesh_plan(self, target):
        return None

    def cache_parts(self):
        return None

    def label(self, config, target) -> str:
        return f"own s{config.seq}"


def test_every_kind_of_source_is_a_step_source():
    preset = sources.resolve(PresetSpec("tiny-llama"))
    factory = sources.resolve(sources.FactorySpec(f"{FACTORIES}:untagged"))
    assert isinstance(preset, models.source.PresetSource)
    assert isinstance(factory, sources.ModelSource)
    for src in (preset, factory, _OwnSource()):
        assert isinstance(src, sources.StepSource)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["none", "full", "names:save=mlpwi"])
def test_a_source_written_against_the_protocol_is_measured_like_a_bare_compile(policy):
    src = _OwnSource()
    pol = parse_policy(policy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = sources.measure(src, pol, "h100", CONFIG, strict=True)
    # The same step compiled by hand: the pipeline adds labels, never bytes.
    step = rk.build_train_step(_Tiny(pol), CONFIG)
    bare = rk.memory_report(step.fn, *step.args, target="h100", donate_argnums=step.donate_argnums)
    assert got.peak_bytes == bare.peak_bytes and got.temp_bytes == bare.temp_bytes
    assert got.meta["own"] is True and got.meta["layers"] == 2 and got.meta["model"] == "own"
    assert got.attention == "xla"


@pytest.mark.slow
def test_the_protocol_source_gets_the_search_and_the_tag_check():
    src = _OwnSource()
    w = sources.workload(src, "h100", CONFIG)
    assert w.label == "own s16" and w.schedule_kinds == frozenset({"none"})
    # Its tags come from its own trace; a policy naming another tag is refused.
    assert "mlpwi" in sources.tags(src, CONFIG, "h100")
    with pytest.raises(rk.errors.BadValue, match="query_proj"):
        sources.check_policies(src, CONFIG, "h100", ["names:save=query_proj"])
    full, none = w.report("full", batch=2), w.report("none", batch=2)
    assert full.peak_bytes < none.peak_bytes


@pytest.mark.slow
def test_a_factory_gets_the_measured_breakdown_presets_have():
    src = sources.from_factory(f"{FACTORIES}:untagged")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = sources.measure(src, "full", "h100", CONFIG, measured_breakdown=True)
    assert r.meta["breakdown"] == "measured"
    assert "breakdown_estimate" in r.meta


def test_a_sharded_measured_breakdown_is_refused_before_any_compile():
    src = sources.resolve(PresetSpec("tiny-llama", shard="fsdp:8"))
    with pytest.raises(rk.errors.BadValue, match="unsharded") as err:
        sources.measure(src, "full", rk.target("h100", devices=8), CONFIG, measured_breakdown=True)
    assert err.value.param == "measured_breakdown"


@pytest.mark.slow
def test_preset_and_factory_labels_and_meta_come_from_the_same_pipeline():
    config = rk.TrainConfig(batch=2, seq=16, optimizer="sgd")
    preset = sources.resolve(PresetSpec("tiny-llama", attention="xla"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = sources.measure(preset, "full", "h100", config)
        b = sources.measure(sources.from_factory(f"{FACTORIES}:preset"), "full", "h100", config)
    shared = {"batch", "seq", "optimizer", "accum", "tokens_per_step", "layers"}
    assert {k: a.meta[k] for k in shared} == {k: b.meta[k] for k in shared}
    assert a.meta["model"] == "tiny-llama" and b.meta["model"].endswith(":preset")


def _imports_presets(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        if any(n.split(".")[0] in ("remat_kit_models", "models") for n in names):
            return True
    return False


def test_remat_kit_never_imports_the_presets():
    files = sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "remat_kit").rglob("*.py") if _imports_presets(p)
    )
    assert files == []


def test_a_factory_takes_no_preset_options():
    # A factory builds its own model: its kind's spec has no field for the presets' options,
    # so a request for one cannot carry them.
    kind = sources.kind_named("model", f"{FACTORIES}:untagged")
    assert kind.name == "factory" and not {"lora", "dropout"} & set(kind.fields)
    with pytest.raises(TypeError, match="lora"):
        sources.FactorySpec(f"{FACTORIES}:untagged", lora=4, dropout=0.1)


def test_tags_are_traced_once_per_source_and_config(monkeypatch):
    src = _OwnSource()
    calls = []
    real = jax.make_jaxpr

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(jax, "make_jaxpr", counting)
    config = dataclasses.replace(CONFIG, seq=24)  # not traced by another test
    first = sources.tags(src, config, "h100")
    again = sources.tags(src, dataclasses.replace(config, batch=4), "h100")
    assert first == again and len(calls) == 1


@pytest.mark.parametrize(
    ("shard", "accum", "multiple"), [(None, 2, 2), ("fsdp:4", 1, 4), ("dp:2,tp:2", 2, 4)]
)
def test_a_sharded_workload_steps_the_batch_by_data_ways_and_accumulation(shard, accum, multiple):
    spec = PresetSpec("tiny-llama", shard=shard)
    config = rk.TrainConfig(8, 16, optimizer="sgd", accum=accum)
    t = rk.target("h100", devices=4)
    w = sources.workload(sources.resolve(spec), t, config)
    assert w.batch_multiple == multiple
    assert w.label == "tiny-llama s16 sgd" + (f" {rk.parse_shard(shard, 4).spec}" if shard else "")
    # The planner sizes one device's share: residuals traced at batch / data ways.
    per_device = w.residuals("none", batch=8)
    whole = sources.residuals(
        sources.resolve(dataclasses.replace(spec, shard=None)),
        "none",
        t,
        dataclasses.replace(config, batch=8 // (multiple // accum)),
    )
    assert per_device.bytes_by("saved") == whole.bytes_by("saved")


@dataclasses.dataclass(frozen=True, eq=False)
class _RecordingSource(_OwnSource):
    """Notes how each step was asked for (hashed and compared by its spec, as _OwnSource)."""

    asked: list = dataclasses.field(default_factory=list)

    def build_step(self, policy, schedule, config, target, *, sharded=True):
        self.asked.append((policy, sharded))
        return super().build_step(policy, schedule, config, target, sharded=sharded)


def test_the_offload_estimate_traces_the_recompute_alternative_unsharded():
    """What offloading costs beside recomputing: the same step with the offloaded tensors
    recomputed, traced (never compiled) and unsharded, however the measured step was built."""
    from remat_kit.sources._steps import _with_offload_estimate

    src = _RecordingSource()
    pol = parse_policy("offload:offload=mlpwi")
    t = rk.target("h100")
    report = rk.memory_report(lambda x: x, jax.ShapeDtypeStruct((4,), "float32"), target="cpu")
    report = report.replace(host_bytes=2**20, host_temp_bytes=2**20, flops=1.0)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        got = _with_offload_estimate(report, src, pol, rk.parse_schedule("none"), CONFIG, t)
    # The alternative is remat_kit's own policy: no warning about it reaches the user.
    assert not [w for w in said if issubclass(w.category, rk.RematWarning)]
    ((alt, sharded),) = src.asked
    assert sharded is False
    assert rk.decide(alt, "mlpwi") == "recompute" and not alt.offloads
    est = got.meta["offload_estimate"]
    assert est["host_bytes"] == 2**20
    assert est["transfer_seconds"] == pytest.approx(2 * 2**20 / t.host_link_bandwidth)
    assert est["recompute_seconds"] > 0


@pytest.mark.slow
def test_an_offload_that_moved_nothing_traces_no_recompute_alternative():
    # On the CPU target XLA keeps everything where it is: nothing moved, nothing to price.
    src = _RecordingSource(spec="own, offloading on a CPU")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = sources.measure(src, "offload:offload=mlpwi", "cpu", CONFIG)
    assert got.host_bytes == 0 and "offload_estimate" not in got.meta
    assert src.asked and all(policy.offloads for policy, _ in src.asked), src.asked


def test_tags_are_read_from_the_unsharded_step_under_none():
    src = _RecordingSource(spec="own, for its tags")
    assert sources.tags(src, CONFIG, "h100") == ("mlpwi",)
    ((policy, sharded),) = src.asked
    assert policy.name == "none" and sharded is False


def test_a_parameter_count_counts_elements_not_bytes():
    from remat_kit.sources._steps import nbytes_count

    tree = {
        "w": jax.ShapeDtypeStruct((3, 4), "float32"),
        "b": jax.ShapeDtypeStruct((5,), "bfloat16"),
    }
    assert nbytes_count(tree) == 17
