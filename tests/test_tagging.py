"""remat_kit.tagging: naming the projections of models nobody tagged, without forking them."""

from __future__ import annotations

import warnings

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import remat_kit as rk
from remat_kit import names, tagging
from remat_kit.analysis import RematWarning
from remat_kit.residuals import tags_in

WIDTH = 16


class HFBlock(nn.Module):
    """Hugging Face's layer names, no checkpoint_name of its own."""

    @nn.compact
    def __call__(self, x, deterministic: bool = True):
        q = nn.Dense(WIDTH, name="q_proj")(x)
        k = nn.Dense(WIDTH, name="k_proj")(x)
        v = nn.Dense(WIDTH, name="v_proj")(x)
        probs = jax.nn.softmax(jnp.einsum("bsd,btd->bst", q, k), axis=-1)
        x = x + nn.Dense(WIDTH, name="o_proj")(jnp.einsum("bst,btd->bsd", probs, v))
        gate = nn.Dense(2 * WIDTH, name="gate_proj")(x)
        up = nn.Dense(2 * WIDTH, name="up_proj")(x)
        mid = nn.Dense(2 * WIDTH, name="mixer")(jnp.tanh(gate) * up)  # no rule names it
        return x + nn.Dense(WIDTH, name="down_proj")(mid)


class Stack(nn.Module):
    policy: object = "none"

    @nn.compact
    def __call__(self, x):
        block = rk.remat(HFBlock, self.policy)
        for i in range(2):
            x = block(name=f"layers_{i}")(x, deterministic=True)
        return x


X = jnp.linspace(-1.0, 1.0, 2 * 4 * WIDTH).reshape(2, 4, WIDTH)


def _loss(module):
    params = module.init(jax.random.key(0), X)
    return (lambda p: jnp.sum(module.apply(p, X) ** 2)), params


HF_EXPECTED = {
    "q_proj": names.QUERY_PROJ,
    "k_proj": names.KEY_PROJ,
    "v_proj": names.VALUE_PROJ,
    "o_proj": names.OUT_PROJ,
    "gate_proj": names.MLPWI_0,
    "up_proj": names.MLPWI_1,
    "down_proj": names.MLPWO,
}


@pytest.mark.parametrize(
    ("path", "tag"),
    [
        *((("model", "layers", "3", "self_attn", k), v) for k, v in HF_EXPECTED.items()),
        (("transformer", "h", "0", "attn", "c_attn"), names.QUERY_PROJ),
        (("transformer", "h", "0", "attn", "c_proj"), names.OUT_PROJ),
        (("transformer", "h", "0", "mlp", "c_fc"), names.MLPWI),
        (("transformer", "h", "0", "mlp", "c_proj"), names.MLPWO),
        (("transformer", "layer_0", "attn", "q_einsum"), names.QUERY_PROJ),
        (("transformer", "layer_0", "attn", "kv_einsum"), names.KEY_PROJ),
        (("transformer", "layer_0", "attn", "attn_vec_einsum"), names.OUT_PROJ),
        (("transformer", "layer_0", "mlp", "gating_einsum"), names.MLPWI_0),
        (("transformer", "layer_0", "mlp", "linear"), names.MLPWO),
        # No rule: the module path is the tag; a suffix rule must not match inside a name.
        (("transformer", "layer_0", "attn", "linear"), "transformer/layer_0/attn/linear"),
        (("model", "xq_proj"), "model/xq_proj"),
    ],
)
def test_rules_map_published_names_onto_the_vocabulary(path, tag):
    assert tagging.tag_for(path, tagging.rules("auto")) == tag


#: Every rule of every rule set: the path a published model gives the layer, and its tag typed
#: out here (not read from remat_kit.names), so a rule pointing at the wrong name fails.
PUBLISHED = [
    ("hf", ("model", "layers", "0", "self_attn", "q_proj"), "query_proj"),
    ("hf", ("model", "layers", "0", "self_attn", "k_proj"), "key_proj"),
    ("hf", ("model", "layers", "0", "self_attn", "v_proj"), "value_proj"),
    ("hf", ("model", "layers", "0", "self_attn", "o_proj"), "out_proj"),
    ("hf", ("model", "layers", "0", "mlp", "gate_proj"), "mlpwi_0"),
    ("hf", ("model", "layers", "0", "mlp", "up_proj"), "mlpwi_1"),
    ("hf", ("model", "layers", "0", "mlp", "down_proj"), "mlpwo"),
    ("gpt2", ("transformer", "h", "0", "attn", "c_attn"), "query_proj"),
    ("gpt2", ("transformer", "h", "0", "attn", "c_proj"), "out_proj"),
    ("gpt2", ("transformer", "h", "0", "mlp", "c_fc"), "mlpwi"),
    ("gpt2", ("transformer", "h", "0", "mlp", "c_proj"), "mlpwo"),
    ("gemma", ("transformer", "layer_0", "attn", "q_einsum"), "query_proj"),
    ("gemma", ("transformer", "layer_0", "attn", "qkv_einsum"), "query_proj"),
    ("gemma", ("transformer", "layer_0", "attn", "kv_einsum"), "key_proj"),
    ("gemma", ("transformer", "layer_0", "attn", "attn_vec_einsum"), "out_proj"),
    ("gemma", ("transformer", "layer_0", "mlp", "gating_einsum"), "mlpwi_0"),
    ("gemma", ("transformer", "layer_0", "mlp", "linear"), "mlpwo"),
    # flax's examples/lm1b: decoder/encoderdecoderblock_N holds linen's attention and MlpBlock
    ("flax", ("decoder", "encoderdecoderblock_0", "MultiHeadDotProductAttention_0", "query"),
     "query_proj"),
    ("flax", ("decoder", "encoderdecoderblock_0", "MultiHeadDotProductAttention_0", "key"),
     "key_proj"),
    ("flax", ("decoder", "encoderdecoderblock_0", "MultiHeadDotProductAttention_0", "value"),
     "value_proj"),
    ("flax", ("decoder", "encoderdecoderblock_0", "MultiHeadDotProductAttention_0", "out"),
     "out_proj"),
    ("flax", ("decoder", "encoderdecoderblock_0", "MlpBlock_0", "Dense_0"), "mlpwi"),
    ("flax", ("decoder", "encoderdecoderblock_0", "MlpBlock_0", "Dense_1"), "mlpwo"),
]  # fmt: skip


def test_the_published_table_covers_every_rule_of_every_set():
    """A rule added to a set without a row here fails: each rule is matched by exactly one row."""
    rows = {(s, path) for s, path, _ in PUBLISHED}
    for name, rule_set in tagging.RULE_SETS.items():
        for rule in rule_set:
            hits = [path for s, path in rows if s == name and rule.matches(path)]
            assert len(hits) == 1, (name, rule.pattern, hits)
    assert {s for s, _, _ in PUBLISHED} == set(tagging.RULE_SETS)


@pytest.mark.parametrize(
    ("rule_set", "path", "tag"), PUBLISHED, ids=[f"{s}-{p[-1]}-{p[-2]}" for s, p, _ in PUBLISHED]
)
def test_every_rule_of_every_rule_set_gives_its_tag(rule_set, path, tag):
    assert tagging.tag_for(path, tagging.rules(rule_set)) == tag
    assert tagging.tag_for(path, tagging.rules("auto")) == tag  # no other set shadows it
    assert tagging.tag_for(path, tagging.rules("paths")) == "/".join(path)
    for other in set(tagging.RULE_SETS) - {rule_set}:
        assert tagging.tag_for(path, tagging.rules(other)) == "/".join(path), other
    # The rule names a whole path component: not one that ends or starts like it.
    near = (*path[:-1], "my_" + path[-1])
    assert tagging.tag_for(near, tagging.rules(rule_set)) == "/".join(near)
    assert tagging.tag_for(path[:-1], tagging.rules(rule_set)) == "/".join(path[:-1])


def test_a_rule_pattern_with_a_parent_matches_only_under_that_parent():
    """gpt2's ``c_proj`` is the MLP's output under ``mlp`` and attention's under ``attn``."""
    gpt2 = tagging.rules("gpt2")
    assert tagging.tag_for(("h", "0", "mlp", "c_proj"), gpt2) == "mlpwo"
    assert tagging.tag_for(("h", "0", "attn", "c_proj"), gpt2) == "out_proj"
    assert tagging.tag_for(("h", "0", "other", "c_proj"), gpt2) == "h/0/other/c_proj"
    assert tagging.tag_for(("c_proj",), gpt2) == "c_proj"  # too short for the pattern
    # A user's rules, as pairs, first match wins; a glob matches within a component.
    mine = tagging.rules([("*_in", "mlpwi"), ("w_in", "never"), ("a/b", "ab")])
    assert tagging.tag_for(("m", "w_in"), mine) == "mlpwi"
    assert tagging.tag_for(("x", "a", "b"), mine) == "ab"
    assert tagging.tag_for(("a", "x", "b"), mine) == "a/x/b"


class Rotary(nn.Module):
    """Not a projection class: tagged only where a rule names it."""

    @nn.compact
    def __call__(self, x):
        return jnp.sin(x) * 2.0


class Named(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = Rotary(name="o_proj")(x)  # a rule names it: out_proj, whatever its class
        x = Rotary(name="rotary")(x)  # no rule, no projection class: no tag at all
        return nn.Dense(WIDTH, name="q_proj")(x)


def test_modules_a_rule_names_are_tagged_whatever_their_class():
    model = tagging.TaggedModule(Named(), "hf")
    params = model.init(jax.random.key(0), X)
    found = tags_in(jax.make_jaxpr(lambda p: model.apply(p, X))(params))
    assert set(found) == {"out_proj", "query_proj"}
    assert set(tags_in(jax.make_jaxpr(lambda p: Named().apply(p, X))(params))) == set()


@pytest.mark.parametrize(
    ("module", "want"),
    [(Named(), "TaggedModule(Named)"), (HFBlock(), "TaggedModule(HFBlock)")],
    ids=["Named", "HFBlock"],
)
def test_a_tagged_module_prints_as_the_class_it_wraps(module, want):
    # What a user sees printing or logging the wrapper: the model's class, not flax's whole
    # field dump (nor a TypeError from a repr that is not a string).
    assert repr(tagging.TaggedModule(module)) == want


def test_rule_sets_by_name_and_unknown_name():
    assert [r.tag for r in tagging.rules("gpt2")] == ["query_proj", "out_proj", "mlpwi", "mlpwo"]
    assert tagging.rules("paths") == ()
    assert len(tagging.rules("hf+gemma")) == len(tagging.RULE_SETS["hf"]) + len(
        tagging.RULE_SETS["gemma"]
    )
    with pytest.raises(rk.UnknownName, match=r"unknown tag rule set 'hff'.*Did you mean hf"):
        tagging.rules("hff")


@pytest.mark.slow
def test_tagged_module_names_every_projection_and_keeps_the_parameters():
    plain = Stack()
    tagged = tagging.TaggedModule(plain)
    params = plain.init(jax.random.key(0), X)
    tagged_params = tagged.init(jax.random.key(0), X)
    chex.assert_trees_all_equal(tagged_params, params)
    closed = jax.make_jaxpr(lambda p: tagged.apply(p, X))(params)
    found = tags_in(closed)
    assert set(found) == {*HF_EXPECTED.values(), "layers_0/mixer", "layers_1/mixer"}
    assert found[names.MLPWI_0] == (2 * 4 * 2 * WIDTH * 4, 2)  # bytes of one, two layers
    assert tags_in(jax.make_jaxpr(lambda p: plain.apply(p, X))(params)) == {}


@pytest.mark.slow
def test_tagging_leaves_values_and_gradients_unchanged():
    plain_loss, params = _loss(Stack("none"))
    tagged = tagging.TaggedModule(Stack("minimal"))
    tagged_loss = lambda p: jnp.sum(tagged.apply(p, X) ** 2)
    # f32 recomputation may reorder sums (jax 0.12 differs in the 6th digit): the suite's
    # gradient tolerance; the gradients here are of size ~20, so atol is 5e-7 of their scale.
    chex.assert_trees_all_close(
        jax.grad(tagged_loss)(params), jax.grad(plain_loss)(params), rtol=1e-5, atol=1e-5
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("policy", "saved"),
    [
        ("full", set()),
        ("qkv_proj", {"query_proj", "key_proj", "value_proj"}),
        ("names:save=layers_*/mixer", {"layers_0/mixer", "layers_1/mixer"}),
        ("names:save=layers_1/*+mlpwi_1", {"layers_1/mixer", "mlpwi_1"}),
    ],
)
def test_name_policies_act_on_an_untagged_model_once_tagged(policy, saved):
    tagged = tagging.TaggedModule(Stack(policy))
    params = tagged.init(jax.random.key(0), X)
    report = rk.saved_residuals(lambda p: jnp.sum(tagged.apply(p, X) ** 2), params, policy=policy)
    assert {t for t, d in report.tags.items() if d == "saved"} == saved


@pytest.mark.slow
def test_untagged_model_warns_that_a_name_policy_does_nothing():
    loss, params = _loss(Stack("minimal"))  # no tagging: the model has no tags at all
    with pytest.warns(RematWarning, match=r"'minimal' names query_proj.*tags none of them"):
        jax.grad(loss)(params)


def test_no_warning_when_the_policy_matches():
    tagged = tagging.TaggedModule(Stack("minimal"))
    params = tagged.init(jax.random.key(0), X)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematWarning)
        jax.grad(lambda p: jnp.sum(tagged.apply(p, X) ** 2))(params)


class NNXBlock(nnx.Module):
    def __init__(self, rngs):
        self.q_proj = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
        self.mixer = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
        self.down_proj = nnx.Linear(WIDTH, WIDTH, rngs=rngs)

    def __call__(self, x):
        return x + self.down_proj(jnp.tanh(self.mixer(self.q_proj(x))))


def test_tag_nnx_names_linear_layers_in_place():
    model = NNXBlock(nnx.Rngs(0))
    ref = nnx.split(model)[1]
    done = tagging.tag_nnx(model)
    assert done == {"q_proj": "query_proj", "mixer": "mixer", "down_proj": "mlpwo"}
    graphdef, state = nnx.split(model)
    chex.assert_trees_all_equal(nnx.to_pure_dict(state), nnx.to_pure_dict(ref))
    x = jnp.ones((2, WIDTH))
    closed = jax.make_jaxpr(lambda s: nnx.merge(graphdef, s)(x))(state)
    assert set(tags_in(closed)) == {"query_proj", "mixer", "mlpwo"}


class NNXMixed(nnx.Module):
    """Layers a tag is not for (a norm, a raw weight named like a rule) beside projections."""

    def __init__(self, rngs):
        self.a_norm = nnx.RMSNorm(WIDTH, rngs=rngs)
        self.o_proj = nnx.Param(jnp.eye(WIDTH))  # a weight, not a layer: never retyped
        self.up_proj = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
        self.z_norm = nnx.RMSNorm(WIDTH, rngs=rngs)
        self.down_proj = nnx.Linear(WIDTH, WIDTH, rngs=rngs)

    def __call__(self, x):
        h = self.up_proj(self.a_norm(x)) @ self.o_proj[...]
        return x + self.down_proj(self.z_norm(h))


def test_tag_nnx_skips_what_is_not_a_projection_and_tags_every_one_after_it():
    model = NNXMixed(nnx.Rngs(0))
    assert tagging.tag_nnx(model, "hf") == {"up_proj": "mlpwi_1", "down_proj": "mlpwo"}
    assert type(model.o_proj) is nnx.Param and type(model.a_norm) is nnx.RMSNorm
    graphdef, state = nnx.split(model)
    x = jnp.ones((2, WIDTH))
    closed = jax.make_jaxpr(lambda s: nnx.merge(graphdef, s)(x))(state)
    assert set(tags_in(closed)) == {"mlpwi_1", "mlpwo"}


class Einsum(nn.Module):
    """gemma's Einsum layer: a weight named by ``weight_name``, applied by an equation."""

    shape: tuple[int, ...]
    weight_name: str = "w"

    @nn.compact
    def __call__(self, eq, x):
        return jnp.einsum(eq, x, self.param(self.weight_name, nn.initializers.normal(), self.shape))


class GemmaFeedForward(nn.Module):
    """gemma's FeedForward: two Einsums sharing the module's scope (nn.share_scope)."""

    @nn.compact
    def __call__(self, x):
        gating = Einsum((2, WIDTH, 2 * WIDTH), weight_name="gating_einsum")
        nn.share_scope(self, gating)
        gate = gating("...F,NFH->...NH", x)
        linear = Einsum((2 * WIDTH, WIDTH), weight_name="linear")
        nn.share_scope(self, linear)
        return linear("...H,HF->...F", nn.gelu(gate[..., 0, :]) * gate[..., 1, :])


class GemmaBlock(nn.Module):
    def setup(self):
        self.mlp = GemmaFeedForward()

    def __call__(self, x):
        return x + self.mlp(x)


class OwnScope(nn.Module):
    @nn.compact
    def __call__(self, x):
        # An Einsum in a scope of its own, named like its weight: its path already ends with
        # the weight's name, which must not be added again.
        return Einsum((WIDTH, WIDTH), weight_name="w_up", name="w_up")("...d,de->...e", x)


class Holder(nn.Module):
    @nn.compact
    def __call__(self, x):
        return OwnScope(name="mlp")(x)


def test_an_einsum_named_like_its_weight_is_tagged_by_its_path_once():
    model = tagging.TaggedModule(Holder(), "paths")
    params = model.init(jax.random.key(0), X)
    found = tags_in(jax.make_jaxpr(lambda p: model.apply(p, X))(params))
    assert set(found) == {"mlp/w_up"}


def test_gemma_einsums_sharing_a_scope_get_their_own_tags():
    model = tagging.TaggedModule(GemmaBlock())
    params = model.init(jax.random.key(0), X)
    assert set(params["params"]["mlp"]) == {"gating_einsum", "linear"}  # gemma's layout
    found = tags_in(jax.make_jaxpr(lambda p: model.apply(p, X))(params))
    assert set(found) == {names.MLPWI_0, names.MLPWO}


# --- a model's own names: alias sets -------------------------------------------------------------


def _own_named(*pairs):
    # A fresh function per trace: jax replays a cached trace of the same function and shapes.
    from jax.ad_checkpoint import checkpoint_name

    def f(x):
        for i, tag in enumerate(pairs):
            x = checkpoint_name(x * (i + 2.0), tag)
        return x

    return lambda: tags_in(jax.make_jaxpr(f)(1.0))


def test_aliasing_adds_our_name_beside_the_models_and_restores_the_primitive():
    with tagging.aliasing({"attn_query": names.QUERY_PROJ, "residual": "block_out"}):
        inside = _own_named("attn_query", "mlp_gat")()
    assert sorted(inside) == ["attn_query", "mlp_gat", "query_proj"]
    assert sorted(_own_named("attn_query", "mlp_gat")()) == ["attn_query", "mlp_gat"]
    with pytest.raises(RuntimeError), tagging.aliasing({"attn_query": "query_proj"}):
        raise RuntimeError("a failed trace")
    assert sorted(_own_named("attn_query")()) == ["attn_query"]  # restored after the error


def test_nested_aliasing_applies_both_and_unwinds_in_order():
    with tagging.aliasing(tagging.aliases("easydel")):
        with tagging.aliasing(tagging.aliases("maxtext")):
            both = _own_named("attn_key", "attention_out")()
        one = _own_named("attn_key", "attention_out")()
    assert sorted(both) == ["attention_out", "attn_key", "context", "key_proj"]
    assert sorted(one) == ["attention_out", "attn_key", "key_proj"]
    assert sorted(_own_named("attn_key", "attention_out")()) == ["attention_out", "attn_key"]


def test_an_aliased_tensor_is_saved_by_either_name_with_the_same_value_and_gradient():
    from jax.ad_checkpoint import checkpoint_name

    w = jnp.linspace(-1.0, 1.0, WIDTH * WIDTH).reshape(WIDTH, WIDTH)

    def loss(w, x):
        h = checkpoint_name(jnp.tanh(x @ w), "mlp_up")
        return jnp.sum(jnp.sin(h @ w))

    x = X[0]
    plain = jax.value_and_grad(loss)(w, x)
    for spec in ("names:save=mlpwi_1", "names:save=mlp_up"):
        with warnings.catch_warnings(), tagging.aliasing(tagging.aliases("easydel")):
            warnings.simplefilter("ignore")  # mlp_up is not our name
            f = jax.checkpoint(loss, policy=rk.policies.parse_policy(spec))
            res = rk.saved_residuals(f, w, x)
            got = jax.value_and_grad(f)(w, x)
        assert res.tags["mlp_up"] != "recomputed" or res.tags["mlpwi_1"] != "recomputed"
        chex.assert_trees_all_close(got, plain, rtol=1e-6)
    with tagging.aliasing(tagging.aliases("easydel")):
        res = rk.saved_residuals(jax.checkpoint(loss, policy=rk.policy("full")), w, x)
    assert res.tags == {"mlp_up": "recomputed", "mlpwi_1": "recomputed"}
    assert res.same == {"mlp_up": ("mlpwi_1",), "mlpwi_1": ("mlp_up",)}


@pytest.mark.parametrize(
    ("own", "expected"),
    [
        (
            ["attn_query", "mlp_gate", "residual"],
            {"attn_query": "query_proj", "mlp_gate": "mlpwi_0"},
        ),
        (["qkv_proj", "attention_out"], {"qkv_proj": "query_proj", "attention_out": "context"}),
        # A model that already gives a tensor our name keeps it for that tensor alone.
        (["qkv_proj", "query_proj", "attention_out"], {"attention_out": "context"}),
        (["residual", "embeddings"], {}),
        ([], {}),
    ],
)
def test_aliases_for_picks_the_sets_whose_names_the_trace_holds(own, expected):
    assert tagging.aliases_for(own) == expected


def test_alias_sets_map_onto_our_vocabulary_and_by_name():
    for table in tagging.ALIAS_SETS.values():
        assert set(table.values()) <= set(names.VOCABULARY)
        assert not set(table) & set(names.VOCABULARY)  # their names, not ours
    assert tagging.aliases("hf+easydel")["mlp_down"] == names.MLPWO
    assert tagging.rules("hf+easydel") == tagging.rules("hf")  # an alias set names no layer
    assert tagging.aliases("hf") == {} and tagging.aliases("auto") == {}
    with pytest.raises(rk.UnknownName, match=r"easydl.*easydel"):
        tagging.aliases("easydl")
    with pytest.raises(rk.UnknownName, match=r"'auto'"):
        tagging.rules("auto+easydel")


class _TiedHead(nn.Module):
    """An embedding whose ``attend`` is the output head (a method other than __call__)."""

    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(11, 4)
        hidden = nn.Dense(4, name="q_proj")(embed(tokens))
        return embed.attend(hidden)


def test_tagging_leaves_what_a_modules_other_methods_return_as_it_was():
    # tagging names the outputs of modules' __call__ only: a tied head's attend (another
    # method) gives the same logits inside the context as outside (traced, not run), and
    # the projection is tagged inside only.
    model, tokens = _TiedHead(), jax.ShapeDtypeStruct((2, 3), jnp.int32)
    params = jax.eval_shape(model.init, jax.random.key(0), tokens)
    plain = jax.make_jaxpr(model.apply)(params, tokens)
    with tagging.tagging("hf"):
        tagged = jax.make_jaxpr(model.apply)(params, tokens)
    assert [v.aval for v in tagged.jaxpr.outvars] == [v.aval for v in plain.jaxpr.outvars]
    assert plain.out_avals[0].shape == (2, 3, 11)
    assert set(tags_in(tagged)) == {names.QUERY_PROJ}
    assert not tags_in(plain)
