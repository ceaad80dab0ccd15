"""rk.remat on linen classes, NNX classes and functions; direct and decorator forms."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

import remat_kit as rk


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = checkpoint_name(nn.Dense(16, name="wi")(x), "mlpwi")
        return checkpoint_name(nn.Dense(4, name="wo")(jnp.tanh(h)), "mlpwo")


def _residual_names(fn, *args):
    return sorted(r.name for r in rk.saved_residuals(fn, *args).residuals if r.tagged)


def _linen_loss(cls):
    module = cls()
    x = jnp.linspace(-1, 1, 24).reshape(3, 8)
    params = module.init(jax.random.key(0), x)
    return (lambda p: jnp.sum(module.apply(p, x) ** 2)), params


def test_none_returns_the_class_itself():
    assert rk.remat(MLP, "none") is MLP


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["full", "mlpwi", "dots", "minimal"])
def test_linen_direct_and_decorator_agree(policy):
    spec = "names:save=mlpwi" if policy == "mlpwi" else policy
    direct = rk.remat(MLP, spec)

    @rk.remat(spec)
    class Decorated(MLP):
        pass

    ref_loss, params = _linen_loss(MLP)
    ref = jax.grad(ref_loss)(params)
    for cls in (direct, Decorated):
        loss, _ = _linen_loss(cls)
        chex.assert_trees_all_close(jax.grad(loss)(params), ref)


@pytest.mark.slow
def test_linen_policy_changes_what_is_saved():
    full_loss, params = _linen_loss(rk.remat(MLP, "full"))
    keep_loss, _ = _linen_loss(rk.remat(MLP, rk.policy("names", save=["mlpwi"])))
    none_loss, _ = _linen_loss(MLP)
    assert "mlpwi" not in _residual_names(full_loss, params)
    assert "mlpwi" in _residual_names(keep_loss, params)

    # Without remat the hidden activations are kept; "full" keeps far fewer bytes.
    def activation_bytes(fn):
        res = rk.saved_residuals(fn, params).residuals
        return sum(r.nbytes for r in res if r.name not in ("argument", "<constant>"))

    assert activation_bytes(none_loss) > activation_bytes(full_loss)


def test_raw_jax_policy_callable_as_decorator():
    @rk.remat(jax.checkpoint_policies.nothing_saveable)
    class Full(MLP):
        pass

    loss, params = _linen_loss(Full)
    assert _residual_names(loss, params) == []


class NNXBlock(nnx.Module):
    def __init__(self, rngs):
        self.wi = nnx.Linear(8, 16, rngs=rngs)
        self.wo = nnx.Linear(16, 8, rngs=rngs)

    def __call__(self, x):
        h = checkpoint_name(self.wi(x), "mlpwi")
        return x + self.wo(jnp.tanh(h))


@pytest.mark.parametrize("policy", ["full", "names:save=mlpwi"])
def test_nnx_block_keeps_gradients_and_changes_residuals(policy):
    x = jnp.linspace(-1, 1, 24).reshape(3, 8)
    Remat = rk.remat(NNXBlock, policy)
    assert issubclass(Remat, NNXBlock)
    ref, got = NNXBlock(nnx.Rngs(0)), Remat(nnx.Rngs(0))

    def loss(model, x):
        return jnp.sum(model(x) ** 2)

    g_ref = nnx.grad(loss)(ref, x)
    g_got = nnx.grad(loss)(got, x)
    chex.assert_trees_all_close(nnx.state(g_got), nnx.state(g_ref), rtol=1e-6)

    graphdef, state = nnx.split(got)

    def functional(state, x):
        return loss(nnx.merge(graphdef, state), x)

    names = _residual_names(functional, state, x)
    assert ("mlpwi" in names) == (policy != "full")


class KeywordBlock(nnx.Module):
    """Called with arrays as keywords, as EasyDeL calls its decoder layers."""

    def __init__(self, rngs):
        self.wi = nnx.Linear(8, 16, rngs=rngs)
        self.wo = nnx.Linear(16, 8, rngs=rngs)

    def __call__(self, hidden_states, *, scale, deterministic=True):
        h = checkpoint_name(self.wi(hidden_states * scale), "mlpwi")
        return hidden_states + self.wo(jnp.tanh(h))


@pytest.mark.parametrize("policy", ["full", "names:save=mlpwi"])
def test_array_keyword_arguments_pass_through_the_checkpoint(policy):
    x = jnp.linspace(-1, 1, 24).reshape(3, 8)
    scale = jnp.full((3, 8), 0.5)
    ref, got = KeywordBlock(nnx.Rngs(0)), rk.remat(KeywordBlock, policy)(nnx.Rngs(0))

    def loss(model, x, scale):
        return jnp.sum(model(hidden_states=x, scale=scale, deterministic=True) ** 2)

    chex.assert_trees_all_close(
        nnx.state(nnx.grad(loss)(got, x, scale)),
        nnx.state(nnx.grad(loss)(ref, x, scale)),
        rtol=1e-6,
    )
    graphdef, state = nnx.split(got)

    def functional(state, x, scale):
        return loss(nnx.merge(graphdef, state), x, scale)

    names = _residual_names(functional, state, x, scale)
    assert ("mlpwi" in names) == (policy != "full")


def test_function_wrap_and_prevent_cse_flag():
    def f(x):
        return jnp.sin(jnp.sin(x)).sum()

    g = rk.remat(f, "full", prevent_cse=False)
    x = jnp.arange(4.0)
    chex.assert_trees_all_close(jax.grad(g)(x), jax.grad(f)(x))
    jaxpr = jax.make_jaxpr(g)(x)
    remat_eqns = [
        e
        for e in jaxpr.jaxpr.eqns
        if "remat" in e.primitive.name or e.primitive.name == "checkpoint"
    ]
    assert remat_eqns and remat_eqns[0].params["prevent_cse"] is False


def test_bad_inputs():
    with pytest.raises(TypeError, match="needs a policy"):
        rk.remat(MLP)
    with pytest.raises(TypeError, match="Module class or a function"):
        rk.remat(3, "full")
    with pytest.raises(TypeError, match="linen or NNX Module class"):
        rk.remat(dict, "full")
    with pytest.raises(ValueError, match="unknown policy"):
        rk.remat(MLP, "fulll")


class RepeatNNX(nnx.Module):
    """Applies its layer ``times`` times: ``times`` must stay a Python value (static)."""

    def __init__(self, rngs):
        self.w = nnx.Linear(8, 8, rngs=rngs)

    def __call__(self, x, times):
        for _ in range(int(times)):
            x = jnp.tanh(checkpoint_name(self.w(x), "mlpwi"))
        return x


class RepeatLinen(nn.Module):
    @nn.compact
    def __call__(self, x, times):
        dense = nn.Dense(8, name="w")
        for _ in range(int(times)):
            x = jnp.tanh(checkpoint_name(dense(x), "mlpwi"))
        return x


def test_static_argnums_count_after_the_module():
    """Position 1 is ``times`` (after ``self`` and ``x``), for NNX and linen alike.

    ``times`` is a numpy integer: an array leaf, so without ``static_argnums`` it would be
    traced and ``int(times)`` would fail; counted from the wrong origin, ``x`` would be held
    static and ``times`` traced.
    """
    x = jnp.linspace(-1, 1, 24).reshape(3, 8)
    times = np.int64(3)

    ref, got = RepeatNNX(nnx.Rngs(0)), rk.remat(RepeatNNX, "full", static_argnums=1)(nnx.Rngs(0))

    def loss(model, x):
        return jnp.sum(model(x, times) ** 2)

    chex.assert_trees_all_close(
        nnx.state(nnx.grad(loss)(got, x)), nnx.state(nnx.grad(loss)(ref, x)), rtol=1e-6
    )

    module = rk.remat(RepeatLinen, "full", static_argnums=(1,))()
    params = RepeatLinen().init(jax.random.key(0), x, times)
    want = jax.grad(lambda p: jnp.sum(RepeatLinen().apply(p, x, times) ** 2))(params)
    have = jax.grad(lambda p: jnp.sum(module.apply(p, x, times) ** 2))(params)
    chex.assert_trees_all_close(have, want, rtol=1e-6)
    bare = rk.remat(RepeatLinen, "full")()  # no static_argnums: times is traced
    with pytest.raises(jax.errors.ConcretizationTypeError):
        jax.grad(lambda p: jnp.sum(bare.apply(p, x, times) ** 2))(params)
