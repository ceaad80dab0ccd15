"""Sharding: mesh plans, logical-axis rules, per-device reports, and the same step on 8 devices."""

import argparse
import dataclasses
import functools
import json
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import traverse_util
from flax.core import meta
from jax.sharding import PartitionSpec as P

import remat_kit as rk
import remat_kit_models as models
from remat_kit import sharding as rks
from remat_kit.cli._args import add_shard_args
from remat_kit.errors import BadValue
from remat_kit_models.configure import model_config
from remat_kit_models.source import train_step
from remat_kit_models.spec import PresetSpec

#: A bf16 Llama big enough for weights to dominate the per-device arguments, small enough to
#: compile for 8 deviceless H100s in a few seconds: its request (a mesh plan added per test)
#: and its train config.
GPU = PresetSpec(
    "tiny-llama",
    attention="xla",
    overrides=(
        ("layers", 2),
        ("width", 1024),
        ("heads", 8),
        ("kv_heads", 8),
        ("ff", 4096),
        ("vocab", 8192),
        ("max_seq", 1024),
    ),
)
GPU_CONFIG = rk.TrainConfig(
    8, 256, optimizer="adamw", precision=rk.train.regime(params="bf16", compute="bf16")
)


def _gpu_measure(shard, target):
    src = rk.sources.resolve(dataclasses.replace(GPU, shard=shard))
    return rk.sources.measure(src, "full", target, GPU_CONFIG, warn=False)


@functools.cache
def _gpu_report(shard):
    return _gpu_measure(shard, rk.target("h100", devices=8))


def _boxed(model="tiny-llama", **overrides):
    cfg = models.get_config(model, layers=2, **overrides)
    tok = jax.ShapeDtypeStruct((2, 16), jnp.int32)
    return jax.eval_shape(models.build(cfg).init, jax.random.key(0), tok)


def _flat_specs(boxed, plan):
    return traverse_util.flatten_dict(rks.param_specs(boxed, rk.parse_shard(plan))["params"])


# --- plans ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "devices", "canonical", "data"),
    [
        ("dp:8", None, "dp:8", 8),
        ("fsdp:8", 8, "fsdp:8", 8),
        ("tp:2,fsdp:4", 8, "fsdp:4,tp:2", 4),
        ("fsdp:4+dp:2", None, "dp:2,fsdp:4", 8),
        ("fsdp,tp:2", 16, "fsdp:8,tp:2", 8),
        ("tp", 4, "tp:4", 1),
    ],
)
def test_parse_shard(spec, devices, canonical, data):
    plan = rk.parse_shard(spec, devices)
    assert plan.spec == canonical
    assert plan.data_size == data
    assert rk.parse_shard(plan.spec) == plan
    assert plan.devices == (devices or plan.devices)


@pytest.mark.parametrize(
    ("spec", "devices", "match"),
    [
        ("fsdp:4", 8, r"mesh fsdp:4 holds 4 devices but the target has 8.*fsdp:8"),
        ("fsdp:3", 8, r"holds 3 devices but the target has 8"),
        ("fsdp:4,tp:4", 8, r"holds 16 devices"),
        ("zero:8", 8, r"unknown sharding axis 'zero'.*Valid: dp, fsdp, ep, cp, tp"),
        ("fdsp:8", 8, r"Did you mean fsdp"),
        ("fsdp:x", 8, r"cannot read size 'x' of axis 'fsdp'"),
        ("fsdp:0", 8, r"size '0'"),
        ("fsdp:4,fsdp:2", 8, r"fsdp named twice"),
        ("fsdp,tp", 8, r"leaves the size of fsdp, tp open"),
        ("fsdp,tp:3", 8, r"hold 3 devices, which does not divide the target's 8"),
        ("", 8, r"empty shard spec"),
    ],
)
def test_bad_shard_specs(spec, devices, match):
    with pytest.raises(ValueError, match=match) as err:
        rk.parse_shard(spec, devices)
    assert "\n" not in str(err.value)


def test_rules_per_strategy():
    dp = dict(rk.parse_shard("dp:8").rules())
    fsdp = dict(rk.parse_shard("fsdp:8").rules())
    both = dict(rk.parse_shard("dp:2,fsdp:2,tp:2").rules())
    assert all(v is None for k, v in dp.items() if k != "act_batch") and dp["act_batch"] == "dp"
    assert fsdp["embed"] == "fsdp" and fsdp["heads"] is None and fsdp["act_batch"] == "fsdp"
    assert both["act_batch"] == ("dp", "fsdp")
    assert both["heads"] == both["mlp"] == both["vocab"] == both["act_seq"] == "tp"
    assert set(both) == set(rks.PARAM_AXES) | set(rks.ACTIVATION_AXES)


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt2"])
def test_every_model_axis_has_a_rule(model):
    # A typo in a model's logical name would silently leave that parameter replicated.
    boxed = _boxed(model, lora_rank=2, scan_layers=True)
    flat = traverse_util.flatten_dict(boxed["params"])
    assert len(flat) > 10
    for path, box in flat.items():
        assert isinstance(box, meta.AxisMetadata), f"{'/'.join(path)} has no logical axes"
        assert set(box.names) <= set(rks.PARAM_AXES), (path, box.names)
        assert len(box.names) == len(box.value.shape), path


def test_param_specs_fsdp_tp_dp():
    fsdp = _flat_specs(_boxed(), "fsdp:8")
    tp = _flat_specs(_boxed(), "tp:2")
    both = _flat_specs(_boxed(), "fsdp:4,tp:2")
    dp = _flat_specs(_boxed(), "dp:8")
    q = ("decoder", "layers", "attention", "query", "kernel")  # layers, embed, heads, head_dim
    out = ("decoder", "layers", "attention", "out", "kernel")  # layers, heads, head_dim, embed
    wi = ("decoder", "layers", "mlp", "wi_0", "kernel")  # layers, embed, mlp
    assert fsdp[q] == P(None, "fsdp", None, None) and fsdp[out] == P(None, None, None, "fsdp")
    assert tp[q] == P(None, None, "tp", None) and tp[wi] == P(None, None, "tp")
    assert both[q] == P(None, "fsdp", "tp", None) and both[("embed", "embedding")] == P(
        "tp", "fsdp"
    )
    assert both[("lm_head", "kernel")] == P("fsdp", "tp")
    assert both[("final_norm", "scale")] == P(None)
    assert all(spec == P(*[None] * len(spec)) for spec in dp.values())


def test_axis_that_does_not_divide_raises_one_line():
    # tiny-llama has 2 KV heads: 8-way tensor parallelism cannot split them.
    with pytest.raises(ValueError, match=r"tp:8 splits logical axis 'kv_heads' \(size 2\)") as err:
        rks.param_specs(_boxed(), rk.parse_shard("tp:8"))
    assert "decoder/layers/attention/key/kernel" in str(err.value)
    assert "[1, 2]" in str(err.value) and "\n" not in str(err.value)


def test_unannotated_params_are_split_by_shape_under_fsdp():
    tree = {"w": jax.ShapeDtypeStruct((6, 16), jnp.float32), "b": jnp.zeros((3,))}
    specs = rks.param_specs(tree, rk.parse_shard("fsdp:4"))
    assert specs == {"w": P(None, "fsdp"), "b": P()}
    assert rks.param_specs(tree, rk.parse_shard("tp:4")) == {"w": P(), "b": P()}


def test_opt_state_follows_the_parameters():
    mesh = jax.sharding.Mesh(jax.devices()[:1], ("fsdp",))
    params = {"layer": {"w": jax.ShapeDtypeStruct((4, 8), jnp.float32)}}
    sh = {"layer": {"w": jax.sharding.NamedSharding(mesh, P(None, "fsdp"))}}
    for name in ("adamw", "adafactor"):
        opt = jax.eval_shape(rk.train.make_optimizer(name).init, params)
        got = rks.opt_state_shardings(opt, params, sh, mesh)
        leaves = [
            (jax.tree_util.keystr(path), x.shape, s.spec)
            for (path, x), s in zip(
                jax.tree_util.tree_flatten_with_path(opt)[0], jax.tree.leaves(got), strict=True
            )
        ]
        mirrored = [spec for _, shape, spec in leaves if shape == (4, 8)]
        others = [spec for _, shape, spec in leaves if shape != (4, 8)]
        if name == "adamw":
            assert mirrored == [P(None, "fsdp")] * 2  # mu, nu
        assert others and all(spec == P() for spec in others)  # count, factored moments


def test_per_device_bytes():
    mesh = jax.sharding.Mesh(jax.devices()[:1], ("fsdp",))
    x = jax.ShapeDtypeStruct((8, 4), jnp.float32)
    assert rks.per_device_bytes(x) == 128
    assert rks.per_device_bytes({"a": x, "b": x}, jax.sharding.NamedSharding(mesh, P())) == 256


def test_batch_and_mesh_errors():
    cfg = models.get_config("tiny-llama", layers=2)
    with pytest.raises(ValueError, match=r"batch=6 does not split over the data axes of fsdp:4"):
        rk.build_train_step(
            models.build(cfg), rk.TrainConfig(batch=6, seq=16), sharding="fsdp:4", mesh=_mesh(4)
        )
    with pytest.raises(ValueError, match=r"micro-batch 2 \(batch=4, accum=2\).*multiple of 8"):
        rk.build_train_step(
            models.build(cfg),
            rk.TrainConfig(batch=4, seq=16, accum=2),
            sharding="fsdp:4",
            mesh=_mesh(4),
        )
    with pytest.raises(ValueError, match=r"mesh fsdp:8 holds 8 devices but the target has 4"):
        rk.build_train_step(
            models.build(cfg), rk.TrainConfig(batch=8, seq=16), sharding="fsdp:8", mesh=_mesh(4)
        )


def _mesh(n):
    return rk.parse_shard(f"fsdp:{n}").mesh(rk.target("h100", devices=n))


def test_multi_host_mesh():
    t = rk.target("h100", devices=16, hosts=2)
    mesh = rk.parse_shard("fsdp:8,tp:2").mesh(t)
    assert dict(mesh.shape) == {"fsdp": 8, "tp": 2}
    with pytest.raises(ValueError, match="holds 8 devices but the target has 16"):
        rk.parse_shard("fsdp:8").mesh(t)


def test_add_shard_args(capsys):
    p = argparse.ArgumentParser()
    p.add_argument("--gpus", type=int, default=1)
    add_shard_args(p)
    args = p.parse_args(["--gpus", "16", "--hosts", "2", "--shard", "fsdp:8,tp:2"])
    assert (args.shard, args.hosts) == ("fsdp:8,tp:2", 2)
    assert p.parse_args([]).shard is None
    with pytest.raises(SystemExit) as exc:
        p.parse_args(["--shard", "zero:8"])
    assert exc.value.code == 2
    assert "argument --shard: unknown sharding axis 'zero'" in capsys.readouterr().err


def test_grad_accumulator_is_per_device_under_fsdp():
    """The accumulator has the gradients' shape and sharding: one GPU holds 1/8 under fsdp:8."""
    config = dataclasses.replace(GPU_CONFIG, batch=16, accum=2)
    one, eight = GPU, dataclasses.replace(GPU, shard="fsdp:8")
    t1, t8 = rk.target("h100"), rk.target("h100", devices=8)
    b1 = train_step(one, model_config(one, config, "full", t1), config, t1).breakdown
    b8 = train_step(eight, model_config(eight, config, "full", t8), config, t8).breakdown
    cfg = model_config(one, config, "full", t1)
    # bf16 weights, no accumulator dtype given: the gradients' bytes, 2 per parameter.
    assert b1["grad_accumulator"] == b1["gradients"] == 2 * cfg.param_count()
    assert b8["grad_accumulator"] == b8["gradients"]
    assert b8["grad_accumulator"] == pytest.approx(b1["grad_accumulator"] / 8, rel=0.01)


# --- per-device reports for 8 deviceless H100s --------------------------------------------------


@pytest.mark.slow
def test_fsdp_splits_weights_and_optimizer_eight_ways():
    dp, fsdp = _gpu_report("dp:8"), _gpu_report("fsdp:8")
    assert dp.devices == fsdp.devices == 8
    assert fsdp.meta["mesh"] == "fsdp:8" and fsdp.meta["devices"] == 8
    for part in ("weights", "gradients", "optimizer"):
        assert fsdp.breakdown[part] == pytest.approx(dp.breakdown[part] / 8, rel=0.01)
    # XLA's own accounting: the arguments one GPU holds (weights + AdamW state) shrink 8x.
    assert fsdp.argument_bytes == pytest.approx(dp.argument_bytes / 8, rel=0.02)
    assert fsdp.peak_bytes < dp.peak_bytes / 2


@pytest.mark.slow
def test_tp_shards_heads_and_mlp():
    t = rk.target("h100", devices=8)
    spec = dataclasses.replace(GPU, shard="tp:8")
    step = train_step(spec, model_config(spec, GPU_CONFIG, "full", t), GPU_CONFIG, t)
    layer = step.in_shardings[0]["params"]["decoder"]["layers"]
    assert layer["attention"]["query"]["kernel"].spec == P(None, None, "tp", None)
    assert layer["mlp"]["wo"]["kernel"].spec == P(None, "tp", None)
    tp, dp = _gpu_report("tp:8"), _gpu_report("dp:8")
    assert tp.argument_bytes < dp.argument_bytes / 6  # norms stay replicated


def test_bad_mesh_for_the_target_raises():
    with pytest.raises(ValueError, match=r"mesh fsdp:4 holds 4 devices but the target has 8"):
        _gpu_measure("fsdp:4", rk.target("h100", devices=8))
    with pytest.raises(
        ValueError, match=r"tp:16 splits logical axis 'kv_heads' \(size 8\).*in \[1, 2, 4, 8\]"
    ):
        _gpu_measure("tp:16", rk.target("h100", devices=16, hosts=2))


# --- the same step on 8 real (fake CPU) devices ---------------------------------------------------


@pytest.mark.slow
def test_sharded_step_matches_one_device(sharded_run):
    # Started with the session (the sharded_run fixture): it runs beside the other tests.
    proc = sharded_run("sharding")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert {r["plan"] for r in rows} == {"fsdp:8", "fsdp:4,tp:2", "dp:4,tp:2"}
    for r in rows:
        assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-5)
        assert r["max_grad_diff"] < 1e-5


@pytest.mark.parametrize(
    ("spec", "names", "want"),
    [
        # An expert weight: its experts over ep, its width over what is left of the weight axes.
        ("fsdp:2,ep:4", ("exp", "embed", "mlp"), ("ep", "fsdp", None)),
        ("ep:8", ("exp", "embed", "mlp"), ("ep", None, None)),
        ("ep:4,tp:2", ("exp", "mlp", "embed"), ("ep", "tp", None)),
        # Any other weight: its width over fsdp and ep together (ZeRO-3 over both).
        ("fsdp:2,ep:4", ("embed", "mlp"), (("fsdp", "ep"), None)),
        ("ep:8", ("vocab", "embed"), (None, "ep")),
        # Activations: ep is a data axis; dispatched tokens take it for their experts.
        ("fsdp:2,ep:4", ("act_batch", "act_seq", "act_embed"), (("fsdp", "ep"), None, None)),
        ("fsdp:2,ep:4", ("act_exp", "act_batch", None, "act_embed"), ("ep", "fsdp", None, None)),
        ("ep:8", ("act_exp", "act_batch", None, "act_embed"), ("ep", None, None, None)),
        # Without ep the expert axes are whole.
        ("fsdp:8", ("exp", "embed", "mlp"), (None, "fsdp", None)),
    ],
)
def test_expert_parallel_rules(spec, names, want):
    plan = rk.parse_shard(spec)
    got = tuple(nn.logical_to_mesh_axes(names, plan.rules()))
    assert got == want


@pytest.mark.parametrize(
    ("spec", "data", "weights"),
    [("ep:8", ("ep",), ("ep",)), ("dp:2,fsdp:2,ep:2", ("dp", "fsdp", "ep"), ("fsdp", "ep"))],
)
def test_ep_is_a_data_axis_and_a_weight_axis(spec, data, weights):
    plan = rk.parse_shard(spec)
    assert plan.data_axes == data and plan.weight_axes == weights
    assert plan.data_size == math.prod(plan.size(a) for a in data)


@pytest.mark.parametrize(
    ("spec", "experts", "match"),
    [
        ("ep:3", 8, r"ep:3 does not split 8 experts evenly: use an ep size in \[2, 4, 8\]"),
        ("ep:16", 8, r"ep:16 does not split 8 experts"),
        ("fsdp:2,ep:4", 0, r"ep:4 splits the experts .* this model has none"),
    ],
)
def test_ep_must_split_the_experts(spec, experts, match):
    with pytest.raises(BadValue, match=match):
        rk.parse_shard(spec).check_experts(experts)


@pytest.mark.parametrize(("spec", "experts"), [("ep:8", 8), ("fsdp:8", 0), ("ep:4", 128)])
def test_ep_that_splits_the_experts_passes(spec, experts):
    rk.parse_shard(spec).check_experts(experts)
