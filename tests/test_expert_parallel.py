"""Expert parallelism (``--shard ep:N``): experts split over devices, all-to-all dispatch.

One tiny MoE step per mesh is compiled for H100s and shared by the tests (module cache); the
checks read the optimized HLO (which collectives, over which groups, made by which op) and
the per-device figures of the report.
"""

import functools
import json
import re

import jax
import pytest

import remat_kit as rk
from helpers import axis_groups, collectives
from remat_kit.analysis import abstract
from remat_kit.cli import main
from remat_kit.errors import BadValue
from remat_kit.targets import analysis_options

BATCH, SEQ = 8, 128


#: The train config of every step here (the regime our models train in by default).
CONFIG = rk.TrainConfig(BATCH, SEQ, optimizer="adamw", precision="mixed")


def _spec(shard, **overrides):
    from remat_kit_models.spec import PresetSpec

    return PresetSpec("tiny-moe", shard=shard, overrides=overrides)


def _target(shard):
    return rk.target("h100", devices=rk.parse_shard(shard).devices)


@functools.cache
def _program(shard, policy="minimal", **overrides):
    """The optimized HLO of the step for H100s, and the model config it was built from."""
    import jax

    from remat_kit_models.configure import model_config
    from remat_kit_models.source import train_step

    t, spec = _target(shard), _spec(shard, **overrides)
    cfg = model_config(spec, CONFIG, policy, t)
    step = train_step(spec, cfg, CONFIG, t)
    args = [abstract(a, s) for a, s in zip(step.args, step.in_shardings, strict=True)]
    jitted = jax.jit(step.fn, in_shardings=step.in_shardings, out_shardings=step.out_shardings)
    # Analysis-only codegen (a stand-in ptxas): the same optimized HLO, without the minutes
    # of machine code nobody reads here (test_codegen checks the two compiles agree).
    compiled = jitted.lower(*args).compile(compiler_options=analysis_options(t))
    return compiled.as_text(), cfg


@pytest.mark.slow
@pytest.mark.parametrize("shard", ["ep:4", "fsdp:2,ep:2"])
def test_tokens_reach_their_experts_by_all_to_all_over_ep(shard):
    text, cfg = _program(shard)
    assert cfg.moe_impl == "capacity"  # switched from ragged: ep partitions the einsums only
    ep = axis_groups(_step(shard).mesh, "ep")
    moe = [groups for _, groups, name in collectives(text, "all-to-all") if "/moe/" in name]
    # Dispatch and combine, forward and backward, in the MoE layer, over the ep groups.
    assert len(moe) >= 4, collectives(text, "all-to-all")
    assert all(groups == ep for groups in moe), (moe, ep)


@functools.cache
def _step(shard):
    from remat_kit_models.configure import model_config
    from remat_kit_models.source import train_step

    t, spec = _target(shard), _spec(shard)
    return train_step(spec, model_config(spec, CONFIG, "minimal", t), CONFIG, t)


@pytest.mark.parametrize(
    ("shard", "expert", "dense"),
    [
        # Stacked over the scanned layers: [layers, experts, d, f]; experts over ep, width over
        # what the weight axes leave; a dense weight's width over fsdp and ep together.
        ("ep:4", (None, "ep", None, None), (None, "ep", None)),
        ("fsdp:2,ep:2", (None, "ep", "fsdp", None), (None, ("fsdp", "ep"), None)),
    ],
)
def test_expert_weights_are_split_by_their_experts(shard, expert, dense):
    specs = {
        "/".join(str(getattr(k, "key", k)) for k in path): tuple(s.spec)
        for path, s in jax.tree_util.tree_flatten_with_path(_step(shard).in_shardings[0])[0]
    }
    wi = [spec for path, spec in specs.items() if path.endswith("moe/wi_0")]
    gate = [spec for path, spec in specs.items() if path.endswith("mlp/wi_0") or "query" in path]
    assert wi and {_padded(s, 4) for s in wi} == {expert}, specs
    assert gate and {_padded(s, 3)[:2] for s in gate} >= {dense[:2]}, specs


def _padded(spec, n):
    return tuple(spec) + (None,) * (n - len(spec))


@functools.cache
def _report(shard, policy="minimal"):
    return rk.sources.measure(
        rk.sources.resolve(_spec(shard)), policy, _target(shard), CONFIG, warn=False
    )


@pytest.mark.slow
def test_a_recomputed_dispatch_is_reported():
    # minimal saves the expert GEMMs, not the dispatched tokens: the backward pass replays
    # the dispatch all-to-all; none never does.
    minimal = _report("ep:4").meta["collectives"]["all-to-all"]
    none = _report("ep:4", "none").meta["collectives"]["all-to-all"]
    assert 0 < minimal["recomputed_launches"] < minimal["launches"]
    assert none["recomputed_launches"] == 0 and none["launches"] > 0
    assert _report("ep:4").meta["batch_per_device"] == BATCH // 4


@pytest.mark.parametrize(
    ("shard", "asked", "impl"),
    [("ep:4", None, "capacity"), ("ep:4", "ragged", "ragged"), ("fsdp:4", None, "ragged")],
)
def test_the_experts_run_as_asked_else_as_the_mesh_needs(shard, asked, impl):
    from remat_kit_models.configure import model_config

    overrides = {} if asked is None else {"moe_impl": asked}
    cfg = model_config(_spec(shard, **overrides), CONFIG, "minimal", _target(shard))
    assert cfg.moe_impl == impl


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (
            ["--model", "tiny-llama", "--gpus", "4", "--shard", "ep:4"],
            r"ep:4 splits the experts of a mixture-of-experts model, and this model has none",
        ),
        (
            ["--model", "tiny-moe", "--gpus", "3", "--shard", "ep:3"],
            r"ep:3 does not split 4 experts evenly: use an ep size in \[2, 4\]",
        ),
        (
            ["--model", "tiny-moe", "--top-k", "5"],
            r"experts_per_token=5",
        ),
    ],
)
def test_bad_expert_settings_fail_before_a_compile(argv, match, capsys):
    assert main(["report", *argv, "--batch", "12", "--seq", "64", "--target", "h100"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("remat-kit: ") and len(err.splitlines()) == 1
    assert re.search(match, err), err


@pytest.mark.slow
def test_the_report_says_how_the_experts_ran(tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = ["report", "--model", "tiny-moe", "--target", "h100", "--gpus", "4", "--shard", "ep:4"]
    assert main([*argv, "--batch", "8", "--seq", "128", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "experts: 4 routed, 2 per token, as capacity einsum dispatch (capacity factor 1.25" in (
        " ".join(text.split())
    )
    meta = json.loads(out.read_text())["meta"]
    assert meta["experts"] == {
        "routed": 4,
        "per_token": 2,
        "impl": "capacity",
        "capacity_factor": 1.25,
    }
    assert meta["collectives"]["all-to-all"]["groups"] == [4]


def test_ep_check_is_a_bad_value():
    with pytest.raises(BadValue, match="does not split"):
        rk.parse_shard("ep:3").check_experts(4)
