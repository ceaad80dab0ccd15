"""The catalogue: names, parameters, errors, and what each policy decides per tag."""

import fnmatch
import re

import jax
import jax.numpy as jnp
import pytest

import remat_kit as rk
from remat_kit import names
from remat_kit.errors import BadValue

REQUIRED = [
    "none",
    "full",
    "everything",
    "dots",
    "dots_no_batch",
    "offload_dots_no_batch",
    "block",
    "minimal",
    "qkv_proj",
    "context",
    "megatron",
    "names",
    "except",
    "offload",
    "either",
    "maxtext",
]


def test_catalogue_has_the_contract_names():
    got = rk.policy_names()
    assert got == sorted(got)
    assert set(REQUIRED) <= set(got)


@pytest.mark.parametrize(
    "name",
    [n for n in rk.policy_names() if n not in ("names", "except", "offload", "either", "maxtext")],
)
def test_every_simple_policy_has_description_and_callable(name):
    p = rk.policy(name)
    assert p.name == name and len(p.description) > 10
    assert (p.jax_policy is None) == (name == "none")


def test_none_is_no_remat_and_full_saves_nothing():
    assert not rk.policy("none").is_remat
    assert rk.policy("full").jax_policy is jax.checkpoint_policies.nothing_saveable


@pytest.mark.parametrize(
    ("name", "saved"),
    [
        ("block", {names.ATTN_OUT, names.BLOCK_OUT}),
        ("qkv_proj", {names.QUERY_PROJ, names.KEY_PROJ, names.VALUE_PROJ}),
        ("context", {names.CONTEXT}),
        # Spelled out, not the catalogue's own formula (a policy mapped to the wrong tuple
        # would pass a test that rebuilds the tuple the same way).
        (
            "minimal",
            {"query_proj", "key_proj", "value_proj", "out_proj"}
            | {"mlpwi_0", "mlpwi_1", "mlpwi", "mlpwo"},
        ),
        (
            "megatron",
            {"decoder_layer_input", "query_proj", "key_proj", "value_proj", "context"}
            | {"out_proj", "attn_out", "mlpwi_0", "mlpwi_1", "mlpwi", "mlpwo", "block_out"}
            | {"router_logits", "moe_mlpwi_0", "moe_mlpwi_1", "moe_mlpwo"},
        ),
        ("full", set()),
        ("everything", set(names.VOCABULARY)),
    ],
)
def test_name_decisions(name, saved):
    p = rk.policy(name)
    got = {n for n in names.VOCABULARY if rk.decide(p, n) == "save"}
    assert got == saved


def test_names_except_offload_either_decisions():
    p = rk.policy("names", save=["context", "mlpwo"])
    assert [rk.decide(p, n) for n in ("context", "mlpwo", "query_proj")] == [
        "save",
        "save",
        "recompute",
    ]
    e = rk.policy("except", names=["attn_scores", "attn_probs"])
    assert rk.decide(e, "attn_probs") == "recompute" and rk.decide(e, "context") == "save"
    o = rk.policy("offload", offload=["context"], save=["query_proj"])
    assert rk.decide(o, "context") == "offload" and rk.decide(o, "query_proj") == "save"
    assert rk.decide(o, "mlpwo") == "recompute"
    both = rk.policy("either", a="qkv_proj", b=o)
    assert rk.decide(both, "key_proj") == "save"
    assert rk.decide(both, "context") == "offload"
    assert rk.decide(both, "mlpwo") == "recompute"


@pytest.mark.parametrize("order", ["save first", "offload first"])
def test_either_ranks_save_over_offload_over_recompute(order):
    """One side saves context, the other offloads it: either keeps it on device."""
    save = rk.policy("names", save=["context"])
    off = rk.policy("offload", offload=["context", "query_proj"])
    a, b = (save, off) if order == "save first" else (off, save)
    both = rk.policy("either", a=a, b=b)
    assert rk.decide(both, "context") == "save"
    assert rk.decide(both, "query_proj") == "offload"
    assert rk.decide(both, "mlpwo") == "recompute"
    assert both.offloads


@pytest.mark.parametrize(
    ("spec", "saved"),
    [
        ("minimal_offloaded", set()),
        ("offload:offload=context+mlpwo,save=query_proj", {"query_proj"}),
        ("either:a=qkv_proj,b=minimal_offloaded", {"query_proj", "key_proj", "value_proj"}),
    ],
)
def test_recompute_instead_recomputes_what_was_offloaded(spec, saved):
    """The cost baseline of an offload policy: the same saves, every offload recomputed."""
    alt = rk.policies.recompute_instead(rk.policies.parse_policy(spec))
    got = {n: rk.decide(alt, n) for n in names.VOCABULARY}
    assert got == {n: "save" if n in saved else "recompute" for n in names.VOCABULARY}
    # Also for a matmul offloaded by pattern, not by name.
    from jax._src.lax import lax

    x = jax.core.ShapedArray((4, 8), jax.numpy.float32)
    w = jax.core.ShapedArray((8, 16), jax.numpy.float32)
    params = dict(
        dimension_numbers=(((1,), (0,)), ((), ())), precision=None, preferred_element_type=None
    )
    offloaded = rk.policy("offload_dots_no_batch")
    kind = rk.policies._policy.decision_kind
    assert kind(offloaded(lax.dot_general_p, x, w, **params)) == "offload"
    instead = rk.policies.recompute_instead(offloaded)
    assert kind(instead(lax.dot_general_p, x, w, **params)) == "recompute"


def test_except_does_not_save_untagged_values():
    # jax's save_anything_except_these_names saves every untagged value too; ours must not.
    from jax._src.lax import lax

    e = rk.policy("except", names=["context"])
    assert e(lax.exp_p) is False


def test_minimal_offloaded_offloads_projections():
    p = rk.policy("minimal_offloaded")
    assert {rk.decide(p, n) for n in names.PROJECTION_NAMES} == {"offload"}


def test_unknown_policy_lists_close_matches():
    with pytest.raises(ValueError, match=r"unknown policy 'minmal'.*Did you mean minimal"):
        rk.policy("minmal")


def test_bad_parameter_names_close_match():
    with pytest.raises(ValueError, match=r"no parameter 'saves'.*did you mean 'save'"):
        rk.policy("names", saves=["context"])
    with pytest.raises(ValueError, match="needs parameter"):
        rk.policy("names")


def test_wrong_types_raise_type_error():
    with pytest.raises(TypeError, match="list of tag names"):
        rk.policy("names", save="context")
    with pytest.raises(TypeError, match=r"holds 3; tag names are strings"):
        rk.policy("names", save=[3])
    with pytest.raises(TypeError, match="policy name must be a str, got int 3"):
        rk.policy(3)
    with pytest.raises(TypeError, match=r"policy must be a name, rk\.Policy or jax policy"):
        rk.as_policy(3.5)


def test_unknown_tag_warns_only():
    with pytest.warns(UserWarning, match="'query_prj' \\(did you mean 'query_proj'"):
        p = rk.policy("names", save=["query_prj"])
    assert rk.decide(p, "query_prj") == "save"


def test_offload_rejects_bad_destination_and_overlap():
    with pytest.raises(ValueError, match="unknown offload destination"):
        rk.policy("offload", offload=["context"], dst="disk")
    with pytest.raises(ValueError, match="both offloaded and saved"):
        rk.policy("offload", offload=["context"], save=["context"])


@pytest.mark.parametrize(
    "spec",
    [
        "minimal",
        "names:save=query_proj+mlpwo",
        "offload:offload=context,save=query_proj",
        "except:names=attn_probs+attn_scores",
        "maxtext:remat_policy=save_qkv_proj",
        "maxtext:remat_policy=minimal_offloaded",
        "maxtext:remat_policy=full",
    ],
)
def test_spec_round_trip(spec):
    p = rk.policies.parse_policy(spec)
    again = rk.policies.parse_policy(p.spec)
    assert again.spec == p.spec and again == p
    assert [rk.decide(again, n) for n in names.VOCABULARY] == [
        rk.decide(p, n) for n in names.VOCABULARY
    ]


def test_raw_callable_becomes_custom_policy_and_policy_is_callable():
    p = rk.as_policy(jax.checkpoint_policies.dots_saveable)
    assert p.name == "custom" and p.jax_policy is jax.checkpoint_policies.dots_saveable
    # A Policy is itself a jax policy callable.
    assert rk.decide(rk.policy("context"), "context") == "save"
    assert hash(rk.policy("minimal")) == hash(rk.policy("minimal"))


# MaxText's remat_policy values (maxtext 0.2.5, configs/base.yml and
# layers/nnx_decoders.py NNXDecoder.get_remat_policy), spelled out: "custom" and "none" are refused.
MAXTEXT_VALUES = [
    "minimal_with_context",
    "minimal_flash",
    "minimal",
    "minimal_with_quantization",
    "minimal_with_context_and_quantization",
    "save_dot_with_context_except_mlp",
    "save_dot_except_mlpwi",
    "save_dot_except_mlp",
    "save_qkv_proj",
    "qkv_proj_offloaded",
    "minimal_offloaded",
    "save_out_proj",
    "full",
]
# Every name MaxText's policies or its "custom" keys name, and ours.
MAXTEXT_TAGS = sorted(
    {*names.VOCABULARY, "kv_proj", "qkv_proj", "quantization", "query_wa_proj", "kv_wa_proj"}
    | {"mla_q", "mla_kv", "attention_out", "engram", "moe_x_sorted", "moe_routing_maps"}
)


def _maxtext_decisions(p):
    """Each tag's decision (and where an offload goes) under a jax policy; None: save nothing."""
    from jax.ad_checkpoint import name_p

    out = {}
    for n in MAXTEXT_TAGS:
        got = False if p is None else p(name_p, name=n)
        kind = rk.policies._policy.decision_kind(got)
        out[n] = (kind, (got.src, got.dst)) if kind == "offload" else kind
    return out


@pytest.mark.parametrize("value", MAXTEXT_VALUES)
# MaxText's model code: about 9 s to import in a worker, then a config and a trace
@pytest.mark.slow
def test_maxtext_family_decides_as_maxtext(value):
    """rk.policy("maxtext", remat_policy=v) against MaxText's own get_remat_policy for v."""
    import functools
    import types

    nnx_decoders = pytest.importorskip("maxtext.layers.nnx_decoders")
    decoder = nnx_decoders.NNXDecoder
    config = types.SimpleNamespace(
        remat_policy=value, scan_layers=False, tensors_on_device=[], tensors_to_offload=[]
    )
    stand_in = types.SimpleNamespace(config=config)
    stand_in.minimal_policy = functools.partial(decoder.minimal_policy, stand_in)
    expected = _maxtext_decisions(decoder.get_remat_policy(stand_in))

    p = rk.policy("maxtext", remat_policy=value)
    assert _maxtext_decisions(p) == expected
    assert p.is_remat and p.name == "maxtext" and p.params == {"remat_policy": value}
    assert set(p.tags) == {n for n, d in expected.items() if d != "recompute"}
    assert p.offloads == any(d != "recompute" and d != "save" for d in expected.values())


_MT_QKV = {"query_proj", "value_proj", "key_proj", "kv_proj", "qkv_proj"}
_MT_MINIMAL = _MT_QKV | {"out_proj", "mlpwi_0", "mlpwi_1", "mlpwi", "mlpwo"}


# Spelled out from maxtext 0.2.5's nnx_decoders.py, for CI without maxtext installed.
@pytest.mark.parametrize(
    ("value", "saved", "offloaded"),
    [
        ("minimal_with_context", _MT_MINIMAL | {"context"}, set()),
        ("minimal_flash", _MT_MINIMAL | {"context"}, set()),
        ("minimal", _MT_MINIMAL, set()),
        ("minimal_with_quantization", _MT_MINIMAL | {"quantization"}, set()),
        ("minimal_with_context_and_quantization", _MT_MINIMAL | {"context", "quantization"}, set()),
        ("save_dot_with_context_except_mlp", _MT_QKV | {"context", "out_proj"}, set()),
        ("save_dot_except_mlpwi", _MT_QKV | {"out_proj", "mlpwo"}, set()),
        ("save_dot_except_mlp", _MT_QKV | {"out_proj"}, set()),
        ("save_qkv_proj", _MT_QKV, set()),
        # Not qkv_proj: MaxText leaves the fused projection out of this one.
        ("qkv_proj_offloaded", set(), {"query_proj", "value_proj", "key_proj", "kv_proj"}),
        ("minimal_offloaded", set(), _MT_MINIMAL),
        ("save_out_proj", {"out_proj"}, set()),
        ("full", set(), set()),
    ],
)
def test_maxtext_family_without_maxtext(value, saved, offloaded):
    assert value in MAXTEXT_VALUES
    got = _maxtext_decisions(rk.policy("maxtext", remat_policy=value))
    assert {n for n, d in got.items() if d == "save"} == saved
    assert {n for n, d in got.items() if d == ("offload", ("device", "pinned_host"))} == offloaded
    assert {n for n, d in got.items() if d == "recompute"} == set(MAXTEXT_TAGS) - saved - offloaded


def test_maxtext_family_reads_from_a_spec_as_one_string():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # kv_proj, qkv_proj, quantization: no vocabulary warning
        p = rk.policies.parse_policy("maxtext:remat_policy=minimal_with_quantization")
        rk.policy("names", save=["kv_proj", "qkv_proj", "quantization"])
    assert p.params == {"remat_policy": "minimal_with_quantization"}
    assert p == rk.policy("maxtext", remat_policy="minimal_with_quantization")
    assert p.spec == "maxtext:remat_policy=minimal_with_quantization"
    # The names MaxText adds to ours are no typo of a model's own: a preset without them passes.
    assert rk.checks.check_policy_matches(p, ["query_proj", "mlpwo"], strict=True) is None
    # "full" is the catalogue's full (jax.checkpoint(policy=None) under MaxText), never no remat.
    full = rk.policy("maxtext", remat_policy="full")
    assert full.jax_policy is rk.policy("full").jax_policy and not full.tags


def test_maxtext_family_refuses_unknown_custom_and_none():
    with pytest.raises(BadValue, match=r"unknown MaxText remat_policy 'save_qkv'.*save_qkv_proj"):
        rk.policy("maxtext", remat_policy="save_qkv")
    with pytest.raises(BadValue, match=r"Valid: full, minimal, minimal_flash,.*save_qkv_proj$"):
        rk.policies.parse_policy("maxtext:remat_policy=bogus")
    with pytest.raises(BadValue, match=r"'custom'.*per tensor.*'offload' family.*offload:offload="):
        rk.policy("maxtext", remat_policy="custom")
    with pytest.raises(BadValue, match=r"'none'.*policy=None.*same as remat_policy=full"):
        rk.policies.parse_policy("maxtext:remat_policy=none")
    with pytest.raises(BadValue, match="needs parameter"):
        rk.policy("maxtext")
    with pytest.raises(TypeError, match=r"remat_policy=\['minimal'\] must be one of MaxText's"):
        rk.policy("maxtext", remat_policy=["minimal"])
    with pytest.raises(BadValue) as err:
        rk.policy("maxtext", remat_policy="bogus")
    assert sorted(err.value.known) == sorted(MAXTEXT_VALUES)


@pytest.mark.parametrize(
    ("offload", "save"),
    [
        (["layers_*/mixer"], ["query_proj"]),  # a glob offloaded
        (["query_proj"], ["layers_*/mixer"]),  # a glob saved (the planner writes these)
        (["layers_0/mixer"], ["layers_?/mixer"]),  # both match layers_0: saved, as jax checks
    ],
)
def test_offload_globs_are_the_exact_names_they_match(offload, save):
    # Tags of a model nobody tagged are module paths, one per layer: a glob in an offload
    # policy's lists must act as the names it matches do in jax's own policy.
    from jax.ad_checkpoint import checkpoint_name

    tags = ("layers_0/mixer", "layers_1/mixer", "query_proj", "context")

    def f(x):
        for t in tags:
            x = checkpoint_name(jnp.sin(x) * 2.0, t)
        return jnp.sum(x)

    def exact(names):
        return [t for t in tags if any(fnmatch.fnmatchcase(t, n) for n in names)]

    saved = exact(save)
    moved = [t for t in exact(offload) if t not in saved]
    want = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=saved,
        names_which_can_be_offloaded=moved,
        offload_src="device",
        offload_dst="pinned_host",
    )
    got = rk.policy("offload", offload=offload, save=save).jax_policy

    def grad_jaxpr(policy):
        text = str(jax.make_jaxpr(jax.grad(jax.checkpoint(f, policy=policy)))(jnp.ones(3)))
        return re.sub(r"<function \S+ at 0x\w+>", "<policy>", text)  # all but its name

    assert grad_jaxpr(got) == grad_jaxpr(want)
    assert {t: rk.decide(rk.policy("offload", offload=offload, save=save), t) for t in tags} == {
        t: "save" if t in saved else "offload" if t in moved else "recompute" for t in tags
    }
