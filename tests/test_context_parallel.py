"""Context parallelism (``--shard cp:N``): plans, numerics, the compiled program, bad inputs.

The numerics run in a subprocess over 8 fake CPU devices (``tests/sharded_step.py cp``); the
program and its memory come from deviceless compiles for H100s.
"""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sharded_step
from flax import traverse_util
from jax.sharding import PartitionSpec as P

import remat_kit as rk
import remat_kit_models as models
from helpers import axis_groups, collectives
from remat_kit import sharding as rks
from remat_kit.analysis import abstract
from remat_kit.cli import main
from remat_kit.errors import BadValue
from remat_kit.render import report_table
from remat_kit.targets import analysis_options
from remat_kit_models.axes import constrain

#: A bf16 Llama whose activations dominate its step (1024..4096 tokens, width 512), small
#: enough to compile for up to 8 deviceless H100s in a few seconds.
CP = dict(
    model="tiny-llama",
    batch=1,
    seq=2048,
    optimizer="sgd",
    param_dtype="bf16",
    dtype="bf16",
    attention="xla",
    overrides=(
        ("layers", 2),
        ("width", 512),
        ("heads", 8),
        ("kv_heads", 4),
        ("ff", 1024),
        ("vocab", 1024),
        ("max_seq", 4096),
    ),
)


def _request(shard, **changes):
    """CP with ``changes`` (CP's keys) over the mesh plan ``shard``: the preset's spec and its
    train config."""
    from remat_kit_models.spec import PresetSpec

    fields = {**CP, **changes}
    spec = PresetSpec(
        fields["model"], overrides=fields["overrides"], attention=fields["attention"], shard=shard
    )
    config = rk.TrainConfig(
        fields["batch"],
        fields["seq"],
        optimizer=fields["optimizer"],
        precision=rk.train.regime(params=fields["param_dtype"], compute=fields["dtype"]),
    )
    return spec, config


def _target(shard):
    return rk.target("h100", devices=rk.parse_shard(shard).devices)


@functools.cache
def _report(shard, **changes):
    spec, config = _request(shard, **changes)
    return rk.sources.measure(rk.sources.resolve(spec), "full", _target(shard), config, warn=False)


@functools.cache
def _program(shard, **changes):
    """The optimized HLO of the step for H100s, and its mesh."""
    from remat_kit_models.configure import model_config
    from remat_kit_models.source import train_step

    t, (spec, config) = _target(shard), _request(shard, **changes)
    step = train_step(spec, model_config(spec, config, "full", t), config, t)
    args = [abstract(a, s) for a, s in zip(step.args, step.in_shardings, strict=True)]
    jitted = jax.jit(step.fn, in_shardings=step.in_shardings, out_shardings=step.out_shardings)
    # Analysis-only codegen (a stand-in ptxas): the same optimized HLO, without the machine
    # code nobody reads here (test_codegen checks the two compiles agree).
    compiled = jitted.lower(*args).compile(compiler_options=analysis_options(t))
    return compiled.as_text(), step.mesh


def _cp_groups(mesh):
    """The device groups of the mesh's cp axis, as the partition ids HLO names them."""
    return axis_groups(mesh, "cp")


# --- plans and rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "canonical", "data", "seq_ways", "act_seq", "embed"),
    [
        ("cp:8", "cp:8", 1, 8, "cp", "cp"),
        ("cp:4,fsdp:2", "fsdp:2,cp:4", 2, 4, "cp", ("fsdp", "cp")),
        # With cp, tp splits heads and MLP only (MeshPlan.seq_axes says why).
        ("tp:2,cp:2,fsdp:2", "fsdp:2,cp:2,tp:2", 2, 2, "cp", ("fsdp", "cp")),
        ("cp:2,dp:4", "dp:4,cp:2", 4, 2, "cp", "cp"),
        ("fsdp:4,tp:2", "fsdp:4,tp:2", 4, 2, "tp", "fsdp"),
    ],
)
def test_cp_plan_and_rules(spec, canonical, data, seq_ways, act_seq, embed):
    plan = rk.parse_shard(spec)
    rules = dict(plan.rules())
    assert plan.spec == canonical and rk.parse_shard(plan.spec) == plan
    # cp is not a data axis: its devices share their samples and split each sequence.
    assert plan.data_size == data and "cp" not in plan.data_axes
    assert plan.seq_ways == seq_ways
    assert rules["act_seq"] == act_seq and rules["embed"] == embed
    assert rules["act_len"] == ("cp" if "cp" in spec else None)
    assert "cp" not in str(rules["act_batch"]) and rules["heads"] == rules["act_heads"]
    assert set(rules) == set(rks.PARAM_AXES) | set(rks.ACTIVATION_AXES)


def test_cp_sits_between_the_data_axes_and_tp():
    assert rks.STRATEGIES == ("dp", "fsdp", "ep", "cp", "tp")
    mesh = rk.parse_shard("tp:2,cp:2,fsdp:2").mesh(rk.target("h100", devices=8))
    assert tuple(mesh.shape) == ("fsdp", "cp", "tp")


@pytest.mark.parametrize(("spec", "devices"), [("cp:8", 8), ("fsdp:2,cp:4", 8), ("cp:2,tp:2", 4)])
def test_batch_is_split_over_the_data_axes_and_its_sequence_over_cp(spec, devices):
    plan = rk.parse_shard(spec)
    data = plan.data_axes
    want = P(data[0] if data else None, "cp")
    assert rks.batch_sharding(plan, plan.mesh(rk.target("h100", devices=devices))).spec == want


def test_weights_are_split_over_fsdp_and_cp_together():
    cfg = models.get_config("tiny-llama", layers=2)
    tok = jax.ShapeDtypeStruct((2, 16), jnp.int32)
    boxed = jax.eval_shape(models.build(cfg).init, jax.random.key(0), tok)
    specs = traverse_util.flatten_dict(
        rks.param_specs(boxed, rk.parse_shard("fsdp:2,cp:4"))["params"]
    )
    both = ("fsdp", "cp")
    attention = ("decoder", "layers", "attention")
    assert specs[(*attention, "query", "kernel")] == P(None, both, None, None)
    assert specs[(*attention, "out", "kernel")] == P(None, None, None, both)
    assert specs[("embed", "embedding")] == P(None, both)
    assert specs[("lm_head", "kernel")] == P(both, None)
    cp_only = traverse_util.flatten_dict(rks.param_specs(boxed, rk.parse_shard("cp:8"))["params"])
    assert cp_only[("decoder", "layers", "mlp", "wi_0", "kernel")] == P(None, "cp", None)
    # A parameter without logical names: its largest dimension fsdp x cp divides.
    tree = {"w": jax.ShapeDtypeStruct((6, 16), jnp.float32)}
    assert rks.param_specs(tree, rk.parse_shard("fsdp:2,cp:4")) == {"w": P(None, both)}


# --- the same step on 8 (fake CPU) devices ------------------------------------------------------


@pytest.fixture(scope="module")
def cp_rows(sharded_run):
    # Started with the session (the sharded_run fixture): it runs beside the other tests.
    proc = sharded_run("cp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
@pytest.mark.parametrize("case", sharded_step.CASES["cp"], ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_cp_step_matches_one_device(cp_rows, case):
    """Loss, gradients, updated weights and AdamW state equal the one-device step's (f32)."""
    model, plan, policy, accum = case
    (row,) = [r for r in cp_rows if r.get("plan") == plan and r["model"] == model]
    assert (row["policy"], row["accum"]) == (policy, accum)
    assert row["loss"] == pytest.approx(row["ref_loss"], rel=1e-4)
    assert row["max_grad_diff"] < 1e-5
    # One device holds 1/(fsdp x cp x tp) of an MLP kernel.
    parsed = rk.parse_shard(plan)
    ways = parsed.size("fsdp") * parsed.size("cp") * parsed.size("tp")
    assert np.prod(row["kernel_shard"]) * ways == np.prod(row["kernel_shape"])


@pytest.mark.slow
@pytest.mark.parametrize("plan", sharded_step.FLASH_PLANS)
@pytest.mark.parametrize("causal", [True, False])
def test_flash_attention_per_device_matches_one_device(cp_rows, plan, causal):
    """The shard_map path cuDNN attention takes under cp, run with XLA's kernel on CPUs."""
    (row,) = [r for r in cp_rows if r.get("flash") == plan and r["causal"] == causal]
    assert row["max_diff"] < 1e-5 and row["max_grad_diff"] < 1e-4


# --- the compiled program for H100s ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("shard", "attention"),
    [("cp:4", "xla"), ("fsdp:2,cp:4", "xla"), ("cp:2,tp:2", "xla"), ("fsdp:2,cp:4", "cudnn")],
)
def test_attention_gathers_keys_and_values_over_cp(shard, attention):
    if attention == "cudnn" and not rk.cudnn_attention_available(rk.target("h100")):
        pytest.skip("cuDNN attention does not compile here (pip install 'jax[cuda12]')")
    seq, plan = CP["seq"], rk.parse_shard(shard)
    batch = plan.data_size
    text, mesh = _program(shard, attention=attention, batch=batch)
    cp = _cp_groups(mesh)
    kv_heads = dict(CP["overrides"])["kv_heads"] // plan.size("tp")

    gathers = [(dtype, d, name) for arrays, groups, name in collectives(text, "all-gather")
               if groups == cp for dtype, d in arrays]  # fmt: skip
    # Keys and values gathered whole (their sequence complete) over the cp group, in
    # attention, each once where the forward pass needs it and once where policy "full"
    # recomputes it in the backward pass: 4 arrays. (XLA combines all-gathers, so an op_name
    # may list several ops, the recomputed ones under another module's name first.)
    whole = [(d, name) for dtype, d, name in gathers if seq in d and dtype in ("bf16", "f32")]
    whole_kv = [(d, name) for d, name in whole if kv_heads in d]
    assert len(whole_kv) == 4, gathers
    assert any("/attention/" in name for _, name in whole_kv), whole_kv
    # And nothing else: the residual stream, the queries, the MLP and the logits stay split.
    assert len(whole) == len(whole_kv), whole
    # Backward: their gradients (whole on every GPU) reduce-scattered over cp to the sequence
    # split (XLA's reduce-scatter pass keeps no op_name: told apart by shape).
    local = seq // plan.size("cp")
    scattered = [d for arrays, groups, _ in collectives(text, "reduce-scatter") if groups == cp
                 for _, d in arrays]  # fmt: skip
    assert any(local in d and kv_heads in d for d in scattered), scattered


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["xla", "cudnn"])
def test_activation_bytes_shrink_with_cp(attention):
    """One sequence over 1, 2, 4, 8 H100s: each GPU holds a shrinking share of it."""
    if attention == "cudnn" and not rk.cudnn_attention_available(rk.target("h100")):
        pytest.skip("cuDNN attention does not compile here (pip install 'jax[cuda12]')")
    seq = 4096
    acts = {n: _report(f"cp:{n}", attention=attention, seq=seq) for n in (1, 2, 4, 8)}
    one = acts[1].breakdown["activations"]
    for n, r in acts.items():
        assert r.attention == attention and r.devices == n
        # Weights and gradients: split n ways (the embed dimension over cp).
        assert r.breakdown["weights"] == pytest.approx(acts[1].breakdown["weights"] / n, rel=0.02)
        assert r.argument_bytes == pytest.approx(acts[1].argument_bytes / n, rel=0.02)
    # Activations per GPU: at most 0.8, 0.5, 0.3 of one GPU's at cp 2, 4, 8 and fewer at every
    # step (jax 0.10.2 measures 0.65, 0.39, 0.20 with xla; 0.77, 0.48, 0.27 with cudnn). Not
    # 1/n: keys and values (and their gradients) are whole on every GPU of the group, XLA
    # keeps two (seq/n x seq) score buffers where one GPU keeps one, and cuDNN's per-device
    # causal mask is a (seq/n x seq) bias with its gradient.
    ratios = {n: acts[n].breakdown["activations"] / one for n in acts}
    assert ratios[2] < 0.8 and ratios[4] < 0.5 and ratios[8] < 0.3, ratios
    assert ratios[8] < ratios[4] < ratios[2] < 1, ratios


@pytest.mark.slow
def test_no_collective_is_recomputed_when_nothing_is():
    spec, config = _request("fsdp:2,cp:4", batch=2)
    src = rk.sources.resolve(spec)
    r = rk.sources.measure(src, "none", _target("fsdp:2,cp:4"), config, warn=False)
    rows = r.meta["collectives"].values()
    assert rows and all(row["recomputed_launches"] == row["recomputed_bytes"] == 0 for row in rows)


@pytest.mark.slow
def test_report_shows_cp_collectives():
    r = _report("fsdp:2,cp:4", batch=2)
    collectives = r.meta["collectives"]
    assert 4 in collectives["all-gather"]["groups"]  # keys and values over cp
    assert 8 in collectives["all-gather"]["groups"]  # weights over fsdp x cp
    assert collectives["all-gather"]["launches"] > 0 and collectives["all-gather"]["bytes"] > 0
    assert rk.MemoryReport.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    caption = report_table(r, _target("fsdp:2,cp:4")).caption
    assert "collectives per step, per GPU: all-gather" in caption and "groups of 2, 4, 8" in caption
    assert r.meta["mesh"] == "fsdp:2,cp:4" and r.meta["batch_per_device"] == 1
    # Under full, the layers' gathers of keys and values run again in the backward pass.
    again = collectives["all-gather"]["recomputed_launches"]
    assert 0 < again < collectives["all-gather"]["launches"]
    assert 0 < collectives["all-gather"]["recomputed_bytes"] < collectives["all-gather"]["bytes"]
    assert f"{again}x" in caption and "recomputed in the backward pass" in caption
    # No step of the program replicates a whole activation ("Involuntary full
    # rematerialization" of the embedding lookup, say).
    assert not [w for w in r.warnings if "Involuntary" in w], r.warnings


# --- bad inputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "seq", "match"),
    [
        (
            "cp:4",
            1022,
            r"seq=1022 does not split over cp:4 \(context parallelism splits each sequence 4 "
            r"ways\): use a sequence length that is a multiple of 4, e\.g\. 1020 or 1024$",
        ),
        ("cp:4,tp:2", 1022, r"seq=1022 does not split over cp:4 .*e\.g\. 1020 or 1024$"),
        ("cp:8", 4, r"seq=4 does not split over cp:8.*e\.g\. 8$"),
        ("tp:4", 30, r"seq=30 does not split over tp:4 \(sequence parallelism between blocks"),
    ],
)
def test_seq_must_split_over_cp(spec, seq, match):
    plan = rk.parse_shard(spec)
    with pytest.raises(BadValue, match=match) as err:
        plan.check_seq(seq)
    assert "\n" not in str(err.value) and err.value.param == "seq"
    # The train step checks it too, before any trace or compile.
    cfg = models.get_config("tiny-llama", layers=1)
    config = rk.TrainConfig(batch=plan.data_size, seq=seq)
    with pytest.raises(BadValue, match=match):
        rk.build_train_step(
            models.build(cfg),
            config,
            sharding=plan,
            mesh=plan.mesh(rk.target("h100", devices=plan.devices)),
        )


def test_cli_refuses_a_seq_cp_does_not_divide(capsys):
    code = main(
        [
            "report",
            "--model",
            "tiny-llama",
            "--seq",
            "1022",
            "--batch",
            "1",
            "--gpus",
            "4",
            "--shard",
            "cp:4",
            "--no-residuals",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("remat-kit: ") and "seq=1022 does not split over cp:4" in err


def test_cp_is_not_a_data_axis_for_the_batch():
    cfg = models.get_config("tiny-llama", layers=1)
    plan = rk.parse_shard("fsdp:2,cp:4")
    mesh = plan.mesh(rk.target("h100", devices=8))
    with pytest.raises(
        BadValue,
        match=r"batch=3 does not split over the data axes of "
        r"fsdp:2,cp:4 \(2 ways\)",
    ):
        rk.build_train_step(
            models.build(cfg), rk.TrainConfig(batch=3, seq=64), sharding=plan, mesh=mesh
        )
    step = rk.build_train_step(
        models.build(cfg), rk.TrainConfig(batch=2, seq=64), sharding=plan, mesh=mesh
    )
    tokens = step.in_shardings[3]["tokens"]
    assert tokens.shard_shape((2, 64)) == (1, 16)  # a sample per fsdp group, a quarter of it


def test_cudnn_under_cp_needs_an_even_share_of_the_sequence():
    """cuDNN trains with its (offset) mask only on even lengths: refused, or auto picks xla."""
    from remat_kit_models.configure import model_config

    t = _target("cp:4")
    if not rk.cudnn_attention_available(t):
        pytest.skip("cuDNN attention does not compile here (pip install 'jax[cuda12]')")
    with pytest.raises(BadValue, match=r"attention='cudnn' cannot train tiny-llama: its training "
                       r"kernel needs an even number of tokens per device \(got seq=1028 over "
                       r"cp:4: 257\): use seq=1024 or 1032, or attention='xla'$"):  # fmt: skip
        model_config(*_request("cp:4", attention="cudnn", seq=1028), "full", t)
    assert model_config(*_request("cp:4", attention="auto", seq=1028), "full", t).attention == "xla"
    assert (
        model_config(*_request("cp:4", attention="auto", seq=1032), "full", t).attention == "cudnn"
    )
    # The per-device path checks it too (a library user's own call), before any compile.
    from remat_kit_models.attention import flash_attention

    plan = rk.parse_shard("cp:4")
    q = jax.ShapeDtypeStruct((1, 1028, 8, 64), jnp.bfloat16)

    def attend(q):
        with plan.activation_context(plan.mesh(t)):
            return flash_attention(q, q, q, causal=True)

    with pytest.raises(BadValue, match=r"even number of tokens per device \(seq 1028 / 4 = 257\)"):
        jax.eval_shape(attend, q)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("ctx:4", r"unknown sharding axis 'ctx' in 'ctx:4'\. Valid: dp, fsdp, ep, cp, tp \(e\.g\."),
        ("cpp:4", r"unknown sharding axis 'cpp'.*Did you mean cp\?"),
        ("cp:4,cp:2", r"cp named twice"),
        ("cp:0", r"cannot read size '0' of axis 'cp'"),
        ("cp,fsdp", r"leaves the size of cp, fsdp open"),
    ],
)
def test_bad_cp_specs(spec, match):
    with pytest.raises(BadValue, match=match) as err:
        rk.parse_shard(spec, 8)
    assert "\n" not in str(err.value)


def test_examples_name_cp(capsys):
    assert "cp:8" in rks._EXAMPLES and "fsdp:2,cp:4" in rks._EXAMPLES
    with pytest.raises(BadValue, match=r"valid: dp, fsdp, ep, cp, tp"):
        rks.MeshPlan((("sp", 8),))
    with pytest.raises(SystemExit) as exit_:
        main(["report", "--model", "tiny-llama", "--gpus", "4", "--shard", "seq:4"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert "unknown sharding axis 'seq' in 'seq:4'. Valid: dp, fsdp, ep, cp, tp" in err


@pytest.mark.slow
@pytest.mark.parametrize(
    ("factory", "ok"),
    [("tests/data/factories.py:untagged", False), ("tests/data/factories.py:preset", True)],
)
def test_cp_needs_a_model_that_splits_its_sequence(factory, ok):
    """A factory's model without act_seq constraints is refused before any compile."""
    src = rk.sources.from_factory(factory)
    plan = rk.parse_shard("cp:4")
    mesh = plan.mesh(rk.target("h100", devices=4))
    config = rk.TrainConfig(batch=4, seq=64, optimizer="sgd")
    if ok:
        step = src.build("full").train_step(config, sharding=plan, mesh=mesh)
        assert step.plan == plan
        return
    with pytest.raises(
        BadValue,
        match=r"cp:4 splits each sequence over 4 devices, but .* "
        r"constrains no activation's sequence axis.*e\.g\. fsdp:4$",
    ) as err:
        src.build("full").train_step(config, sharding=plan, mesh=mesh)
    assert "\n" not in str(err.value) and err.value.param == "shard"
    # Other plans need nothing of the model.
    fsdp = rk.parse_shard("fsdp:4")
    src.build("full").train_step(
        config, sharding=fsdp, mesh=fsdp.mesh(rk.target("h100", devices=4))
    )


def test_sequence_constraints_counts_only_splits_of_the_sequence():
    plan = rk.parse_shard("cp:4")
    mesh = plan.mesh(rk.target("h100", devices=4))
    x = jax.ShapeDtypeStruct((2, 64, 16), jnp.float32)

    def constrained(*names):
        def fn(x):
            with plan.activation_context(mesh):
                return constrain(x, names) * 2

        return jax.make_jaxpr(fn)(x)

    assert rks.sequence_constraints(constrained("act_batch", "act_seq", "act_embed"), 64) == 1
    assert rks.sequence_constraints(constrained("act_batch", None, "act_embed"), 64) == 0
    assert rks.sequence_constraints(constrained("act_batch", None, "embed"), 64) == 0  # width
