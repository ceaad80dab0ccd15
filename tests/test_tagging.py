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


def test_rule_sets_by_name_and_unknown_name():
    assert [r.tag for r in tagging.rules("gpt2")] == ["query_proj", "out_proj", "mlpwi", "mlpwo"]
    assert tagging.rules("paths") == ()
    assert len(tagging.rules("hf+gemma")) == len(tagging.RULE_SETS["hf"]) + len(
        tagging.RULE_SETS["gemma"]
    )
    with pytest.raises(rk.UnknownName, match=r"unknown tag rule set 'hff'.*Did you mean hf"):
        tagging.rules("hff")


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


def test_tagging_leaves_values_and_gradients_unchanged():
    plain_loss, params = _loss(Stack("none"))
    tagged = tagging.TaggedModule(Stack("minimal"))
    tagged_loss = lambda p: jnp.sum(tagged.apply(p, X) ** 2)
    # f32 recomputation may reorder sums (jax 0.12 differs in the 6th digit): the suite's
    # gradient tolerance; the gradients here are of size ~20, so atol is 5e-7 of their scale.
    chex.assert_trees_all_close(
        jax.grad(tagged_loss)(params), jax.grad(plain_loss)(params), rtol=1e-5, atol=1e-5
    )


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


def test_gemma_einsums_sharing_a_scope_get_their_own_tags():
    model = tagging.TaggedModule(GemmaBlock())
    params = model.init(jax.random.key(0), X)
    assert set(params["params"]["mlp"]) == {"gating_einsum", "linear"}  # gemma's layout
    found = tags_in(jax.make_jaxpr(lambda p: model.apply(p, X))(params))
    assert set(found) == {names.MLPWI_0, names.MLPWO}
