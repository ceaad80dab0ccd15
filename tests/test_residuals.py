"""saved_residuals: which tags a policy keeps, offloads or recomputes, scanned or not."""

import jax
import jax.numpy as jnp
import pytest

import models
import remat_kit as rk
from remat_kit import names
from remat_kit.residuals import expected_decisions

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


@pytest.mark.parametrize(
    ("policy", "kind"), [("dots_no_batch", "saved"), ("offload_dots_no_batch", "offloaded")]
)
def test_dot_policies_report_the_projection_tags(policy, kind):
    # jax's dot policies keep the matmul output before its name op; it is still reported
    # under the tag, so "what does dots_no_batch keep" has an answer in tag names.
    rep, _ = _report(policy, scan=True)
    assert {t for t, d in rep.tags.items() if d == kind} == PROJ_LLAMA


NAME_BASED = [
    "block",
    "minimal",
    "qkv_proj",
    "context",
    "megatron",
    "minimal_offloaded",
    "names:save=context+mlpwo",
    "except:names=attn_probs+context",
    "offload:offload=mlpwi_0,save=key_proj",
    "either:a=qkv_proj,b=context",
]


@pytest.mark.parametrize("policy", NAME_BASED)
def test_name_based_policies_keep_what_they_name(policy):
    rep, _ = _report(policy, scan=True, tell_policy=True)
    intended = expected_decisions(policy, rep.tags)
    # Layer boundaries are kept as the next layer's input whatever the policy says.
    boundaries = {names.DECODER_LAYER_INPUT, names.BLOCK_OUT}
    for tag, got in rep.tags.items():
        if tag not in boundaries:
            assert got in (intended[tag], "not needed"), (tag, got, intended[tag])
    # And the policy did something: some tag it names is kept or offloaded.
    assert {d for t, d in rep.tags.items() if t not in boundaries} & {"saved", "offloaded"}
