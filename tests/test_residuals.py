"""saved_residuals: which tags a policy keeps, offloads or recomputes, scanned or not."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import remat_kit as rk
import remat_kit_models as models
from helpers import memory_report
from remat_kit import names

PROJ_LLAMA = {
    names.QUERY_PROJ,
    names.KEY_PROJ,
    names.VALUE_PROJ,
    names.OUT_PROJ,
    names.MLPWI_0,
    names.MLPWI_1,
}


def _report(policy, scan, model="tiny-llama", tell_policy=False):
    cfg = models.get_config(model, policy=policy, scan_layers=scan)
    module = models.build(cfg)
    tok = jax.ShapeDtypeStruct((2, 16), jnp.int32)
    params = jax.eval_shape(module.init, jax.random.key(0), tok)
    known = policy if tell_policy else None
    loss = lambda p, t: module.apply(p, t).mean()
    return rk.saved_residuals(loss, params, tok, policy=known), cfg


def _kept(rep, kind="saved"):
    return {t for t, d in rep.tags.items() if d == kind}


@pytest.mark.parametrize("scan", [True, False], ids=["scan", "unrolled"])
def test_full_keeps_only_layer_inputs(scan):
    rep, cfg = _report("full", scan)
    # A block's output is the next block's input: the only thing "full" keeps.
    inputs = {names.BLOCK_OUT, names.DECODER_LAYER_INPUT}
    assert _kept(rep) - inputs == set()
    layer_inputs = [r for r in rep.residuals if r.name in ("<layer input>", *inputs)]
    assert sum(r.layers for r in layer_inputs) >= cfg.n_layers - 1


@pytest.mark.parametrize("scan", [True, False], ids=["scan", "unrolled"])
def test_minimal_keeps_projections_recomputes_attention(scan):
    rep, cfg = _report("minimal", scan)
    assert _kept(rep) >= PROJ_LLAMA
    for tag in (names.ATTN_SCORES, names.ATTN_PROBS, names.CONTEXT):
        assert rep.tags[tag] == "recomputed"
    by_name = rep.per_name()
    # One per layer, with the projection's shape: b x s x heads x head_dim.
    q = by_name[names.QUERY_PROJ]
    assert q["count"] == cfg.n_layers
    assert q["per_layer_bytes"] == 2 * 16 * cfg.n_heads * cfg.dim_per_head * 4


@pytest.mark.parametrize("scan", [True, False], ids=["scan", "unrolled"])
def test_offload_and_save(scan):
    rep, _ = _report("offload:offload=context,save=query_proj", scan)
    assert rep.tags[names.CONTEXT] == "offloaded"
    assert rep.tags[names.QUERY_PROJ] == "saved"
    assert rep.tags[names.MLPWI_0] == "recomputed"
    assert rep.bytes_by("offloaded") == rep.per_name()[names.CONTEXT]["bytes"] > 0


def test_except_recomputes_what_it_excludes():
    rep, _ = _report("except:names=attn_scores+attn_probs+context", scan=False, tell_policy=True)
    for tag in (names.ATTN_SCORES, names.ATTN_PROBS, names.CONTEXT):
        assert rep.tags[tag] == "recomputed"
    assert PROJ_LLAMA - {names.OUT_PROJ} <= _kept(rep)
    # attn_out = x + out_proj is kept, so the backward pass never reads out_proj.
    assert rep.tags[names.OUT_PROJ] == "not needed"
    # jax's own save_anything_except_these_names would also keep untagged values
    # (the softmax internals); ours keeps no untagged activation inside the blocks.
    untagged = [r for r in rep.residuals if r.name == "<exp>"]
    assert untagged == []


def test_megatron_keeps_context_but_not_scores():
    rep, _ = _report("megatron", scan=True, model="tiny-gpt2")
    assert rep.tags[names.CONTEXT] == "saved" and rep.tags[names.MLPWI] == "saved"
    assert rep.tags[names.ATTN_SCORES] == rep.tags[names.ATTN_PROBS] == "recomputed"


def test_none_keeps_more_than_full():
    none, _ = _report("none", scan=True)
    full, _ = _report("full", scan=True)
    assert none.bytes_by("saved") > 2 * full.bytes_by("saved")
    assert rk.policy("none").jax_policy is None


def test_tag_counts_cover_every_layer():
    rep, cfg = _report("full", scan=True)
    assert rep.tag_count[names.QUERY_PROJ] == cfg.n_layers
    assert rep.tag_bytes[names.QUERY_PROJ] == 2 * 16 * cfg.n_heads * cfg.dim_per_head * 4
    assert set(rep.to_dict()) >= {"tags", "by_name", "saved_bytes", "offloaded_bytes"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("policy", "kind"), [("dots_no_batch", "saved"), ("offload_dots_no_batch", "offloaded")]
)
def test_dot_policies_report_the_projection_tags(policy, kind):
    # jax's dot policies keep the matmul output before its name op; it is still reported
    # under the tag, so "what does dots_no_batch keep" has an answer in tag names.
    rep, _ = _report(policy, scan=True)
    assert {t for t, d in rep.tags.items() if d == kind} == PROJ_LLAMA


@pytest.mark.parametrize(
    ("policy", "kind"), [("dots_no_batch", "saved"), ("offload_dots_no_batch", "offloaded")]
)
def test_dot_policies_name_projections_with_a_bias(policy, kind):
    """GPT-2's Dense adds a bias after the matmul, before the tag: still reported by tag.

    Otherwise the table read "recomputed" for every projection beside an untagged
    "<dot_general>" of the same bytes.
    """
    rep, cfg = _report(policy, scan=True, model="tiny-gpt2")
    proj = {names.QUERY_PROJ, names.KEY_PROJ, names.VALUE_PROJ, names.OUT_PROJ, names.MLPWI}
    assert {t for t, d in rep.tags.items() if d == kind} == proj
    assert [r for r in rep.residuals if r.name == "<dot_general>"] == []
    # Each a layer's b x s x width (or x d_ff) activation in f32, over all layers.
    by_name = rep.per_name()
    assert by_name[names.QUERY_PROJ]["bytes"] == cfg.n_layers * 2 * 16 * cfg.d_model * 4
    assert by_name[names.MLPWI]["bytes"] == cfg.n_layers * 2 * 16 * cfg.d_ff * 4


QKV = {names.QUERY_PROJ, names.KEY_PROJ, names.VALUE_PROJ}

#: What each policy keeps in a tiny Llama, written out from the policies' definitions (not
#: from rk.decide): (saved, offloaded). Every other tag inside a block is recomputed.
NAME_BASED = {
    "block": ({names.ATTN_OUT}, set()),
    "minimal": (PROJ_LLAMA | {names.MLPWO}, set()),
    "qkv_proj": (QKV, set()),
    "context": ({names.CONTEXT}, set()),
    "megatron": (PROJ_LLAMA | {names.MLPWO, names.CONTEXT, names.ATTN_OUT}, set()),
    "minimal_offloaded": (set(), PROJ_LLAMA | {names.MLPWO}),
    "names:save=context+mlpwo": ({names.CONTEXT, names.MLPWO}, set()),
    "except:names=attn_probs+context": (
        PROJ_LLAMA | {names.MLPWO, names.ATTN_SCORES, names.ATTN_OUT},
        set(),
    ),
    "offload:offload=mlpwi_0,save=key_proj": ({names.KEY_PROJ}, {names.MLPWI_0}),
    "either:a=qkv_proj,b=context": (QKV | {names.CONTEXT}, set()),
}

#: Tags the backward pass never reads when their sum with the residual stream is kept: a policy
#: may name them and still find them "not needed" (d(x + y)/dy needs neither x nor y).
SUMMED = {names.OUT_PROJ, names.MLPWO}


@pytest.mark.parametrize("policy", list(NAME_BASED))
def test_name_based_policies_keep_what_they_name(policy):
    rep, _ = _report(policy, scan=True, tell_policy=True)
    saved, offloaded = NAME_BASED[policy]
    # Layer boundaries are kept as the next layer's input whatever the policy says.
    boundaries = {names.DECODER_LAYER_INPUT, names.BLOCK_OUT}
    inside = {t: d for t, d in rep.tags.items() if t not in boundaries}
    assert set(inside) == set(PROJ_LLAMA | QKV) | {
        names.ATTN_SCORES,
        names.ATTN_PROBS,
        names.CONTEXT,
        names.ATTN_OUT,
        names.MLPWO,
    }
    for tag, got in inside.items():
        want = "saved" if tag in saved else "offloaded" if tag in offloaded else "recomputed"
        if want != "recomputed" and tag in SUMMED and got == "not needed":
            continue
        assert got == want, (tag, got, want)
    # And the policy did something: some tag it names is kept or offloaded.
    assert {d for d in inside.values()} & {"saved", "offloaded"}


def _bare_report(target):
    return memory_report(
        target,
        flops=1e12,
        policy="offload_dots_no_batch",
        attention="xla",
        meta={"layers": 4},
    )


def _render(table):
    from rich.console import Console

    out = Console(width=240, record=True)
    out.print(table)
    # The words, without the box-drawing characters between cells.
    text = "".join(" " if "\u2500" <= c <= "\u257f" else c for c in out.export_text())
    return " ".join(text.split())


def test_residual_table_parts_are_parts_of_their_whole():
    """An offloaded untagged value is offloaded, not part of what the device keeps."""
    from remat_kit.render import residual_table

    gib = 2**30
    res = rk.residuals.ResidualReport(
        residuals=(
            rk.residuals.Residual("argument", (), "float32", 1 * gib, "saved", 1, ""),
            rk.residuals.Residual("<dot_general>", (), "float32", 2 * gib, "offloaded", 4, ""),
            rk.residuals.Residual("query_proj", (), "float32", 3 * gib, "saved", 4, ""),
            rk.residuals.Residual("context", (), "float32", 4 * gib, "offloaded", 4, ""),
        ),
        tags={"query_proj": "saved", "context": "offloaded", "mlpwo": "recomputed"},
        tag_bytes={},
        tag_count={},
    )
    text = _render(residual_table(res, _bare_report("h100")))
    assert (
        "kept on device 4.00 GiB (of which untagged values and weights: 1.00 GiB), "
        "offloaded 6.00 GiB" in text
    )
    # GiB per layer, all 4 layers: each column in the unit of its largest figure (issue 45).
    assert "GiB per layer" in text and "context offloaded 1.00 4.00" in text
    assert "mlpwo recomputed 0.00 0.00" in text
    assert "cpu" not in text
    on_cpu = _render(residual_table(res, _bare_report("cpu")))
    assert "offloaded 6.00 GiB (from the trace: a cpu compile does not measure host memory)" in (
        on_cpu
    )


@pytest.mark.parametrize(
    "meta, whole",
    [
        ({"layers": 4}, False),
        ({"layers": 4, "mesh": "fsdp:2", "devices": 2}, True),
        # a trainer's own mesh (MaxText's): its source labels the mesh's devices
        ({"layers": 4, "devices": 8, "maxtext": {"mesh": {"fsdp": 8}}}, True),
        ({"layers": 4, "devices": 1, "maxtext": {"mesh": {"none": 1}}}, False),
    ],
)
def test_residual_table_over_several_gpus_says_its_figures_are_the_unsharded_step(meta, whole):
    # The residuals are traced from the unsharded step beside a report per GPU.
    from remat_kit.render import residual_table

    res = rk.residuals.ResidualReport(
        residuals=(rk.residuals.Residual("argument", (), "float32", 2**30, "saved", 1, ""),),
        tags={"mlpwo": "recomputed"},
        tag_bytes={},
        tag_count={},
    )
    bare = dataclasses.replace(_bare_report("h100"), meta=meta)
    table = residual_table(res, bare)
    text = _render(table)
    assert ("not per GPU" in table.title) is whole
    kept = (
        "kept on device (the unsharded step, not per GPU) 1.00 GiB"
        if whole
        else ("kept on device 1.00 GiB")
    )
    assert kept in text


@pytest.mark.parametrize("layers_known", [True, False])
def test_a_value_with_two_names_counts_under_both_per_layer(layers_known):
    # A model's own name with ours beside it (tagging.aliasing): the residual carries one of
    # them, the table shows its bytes under both. Without a layer count (an NNX factory),
    # the layers are the tags' most common number of occurrences.
    from remat_kit.render import residual_table

    mib = 2**20
    res = rk.residuals.ResidualReport(
        residuals=tuple(
            rk.residuals.Residual("query_proj", (), "float32", mib, "saved", 1, "")
            for _ in range(4)
        ),
        tags={"attn_query": "saved", "query_proj": "saved", "lm_head": "recomputed"},
        tag_bytes={},
        tag_count={"attn_query": 4, "query_proj": 4, "lm_head": 1},
        same={"attn_query": ("query_proj",), "query_proj": ("attn_query",)},
    )
    bare = _bare_report("h100")
    if not layers_known:
        bare = dataclasses.replace(bare, meta={})
    text = _render(residual_table(res, bare))
    assert "attn_query saved 1.00 4.00" in text and "query_proj saved 1.00 4.00" in text
    assert "lm_head recomputed 0.00 0.00" in text


def test_report_table_says_host_memory_is_not_measured_on_cpu():
    from remat_kit.render import report_table

    cpu = _render(report_table(_bare_report("cpu"), rk.target("cpu")))
    assert "host (offloaded): not measured on cpu n/a" in cpu
    gpu = _render(report_table(_bare_report("h100"), rk.target("h100")))
    assert "host (offloaded, pinned host memory) 0 B" in gpu and "n/a" not in gpu


def test_checkpointed_names_the_tags_inside_a_checkpoint_only():
    from jax.ad_checkpoint import checkpoint_name

    def block(x):
        return jnp.sin(checkpoint_name(x * 2.0, "inside"))

    def f(x):
        y = jax.checkpoint(block, policy=jax.checkpoint_policies.nothing_saveable)(x)
        return jnp.sum(jnp.cos(checkpoint_name(y * 3.0, "outside")))

    x = jnp.ones((4,))
    assert rk.saved_residuals(f, x).checkpointed == {"inside"}
    # Without a checkpoint nothing is inside one.
    assert rk.saved_residuals(lambda x: block(x).sum(), x).checkpointed == set()


@pytest.mark.parametrize("between", ["sharding_constraint", "reshape"])
def test_a_name_of_a_constrained_name_is_the_same_value(between):
    # MaxText's pipeline: a stage's `decoder_layer_input` is its `iteration_input` under a
    # sharding constraint, and the iteration's checkpoint saves both names. jax keeps the
    # value once, under the inner name: the outer is kept too, not recomputed, with its bytes.
    import contextlib
    import io

    from jax.ad_checkpoint import checkpoint_name

    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    keep = {
        "sharding_constraint": lambda v: jax.lax.with_sharding_constraint(v, one),
        "reshape": lambda v: v.reshape(4, 8).reshape(32),
    }[between]

    def iteration(x):
        x = checkpoint_name(x, "iteration_input")
        y = checkpoint_name(keep(x), "decoder_layer_input")
        return jnp.sin(y) * y

    policy = jax.checkpoint_policies.save_only_these_names("iteration_input", "decoder_layer_input")
    f = lambda x: jnp.sum(jax.checkpoint(iteration, policy=policy)(x))
    x = jnp.ones((32,))
    rep = rk.saved_residuals(f, x)
    assert rep.tags == {"iteration_input": "saved", "decoder_layer_input": "saved"}
    assert rep.kept_bytes("iteration_input") == rep.kept_bytes("decoder_layer_input") == 128
    # jax's own account: one value of 32 f32 kept, besides nothing else.
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        jax.ad_checkpoint.print_saved_residuals(f, x)
    assert out.getvalue().splitlines()[0].startswith("f32[32] ")
    assert rep.bytes_by() == 128 * len(out.getvalue().splitlines())
