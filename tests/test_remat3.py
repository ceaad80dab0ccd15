"""jax's two remat implementations: the default and ``jax_remat3`` (env ``JAX_REMAT3``).

Under the flag, ``checkpoint_name`` and ``jax.checkpoint`` bind "hi" primitives whose
equations carry everything in one ``_prim`` param, so a walker that reads ``eqn.params`` or a
primitive's printed name sees no tag and no checkpoint (issue 42: ``--policy minimal`` was
refused with "tags there: none"). Every reader here is run under both, with expected values
written down from the function traced (its tags, its products' shapes).
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name

import remat_kit as rk
from remat_kit import _jaxpr, cache, checks
from remat_kit.flops import count_flops
from remat_kit.residuals import tags_in
from remat_kit.sources._depth import layer_kinds

N = 8  # a layer's width: its product is 2 * N * N * N FLOPs on an (N, N) input


@pytest.fixture(params=[False, True], ids=["default", "remat3"])
def remat3(request):
    """Runs the test under each implementation, and restores the flag afterwards."""
    before = jax.config.jax_remat3
    jax.config.update("jax_remat3", request.param)
    yield request.param
    jax.config.update("jax_remat3", before)


def _layer(x, w):
    h = checkpoint_name(x @ w, "mlpwi")
    return checkpoint_name(jnp.sin(h), "block_out")


def _model(policy):
    layer = rk.remat(_layer, policy)

    def loss(x, w):
        return layer(layer(x, w), w).sum()

    return loss


ARGS = (jnp.ones((N, N)), jnp.ones((N, N)))


def test_tags_checkpoints_and_their_bodies_are_read(remat3):
    forward = jax.make_jaxpr(_model("full"))(*ARGS)
    assert tags_in(forward) == {"mlpwi": (N * N * 4, 2), "block_out": (N * N * 4, 2)}
    calls = [e for e in forward.jaxpr.eqns if _jaxpr.is_checkpoint(e)]
    assert len(calls) == 2
    assert _jaxpr.kind_of(calls[0]) == ("RematTraced" if remat3 else "remat2")
    body = _jaxpr.open_jaxpr(_jaxpr.params_of(calls[0])["jaxpr"])
    assert [t for t in map(_jaxpr.tag_of, body.eqns) if t] == ["mlpwi", "block_out"]
    assert _jaxpr.sub_jaxprs(calls[0])  # the walkers descend into the body
    assert layer_kinds(forward) == 1  # two checkpoints, one kind of layer


@pytest.mark.parametrize(
    ("policy", "mlpwi"),
    [("full", "recomputed"), ("minimal", "saved"), ("names:save=mlpwi", "saved")],
)
def test_name_policies_decide_on_the_tags(remat3, policy, mlpwi):
    report = rk.saved_residuals(_model(policy), *ARGS, policy=policy)
    # block_out is the second layer's input, which its checkpoint keeps whatever the policy.
    assert report.tags == {"mlpwi": mlpwi, "block_out": "saved"}


@pytest.mark.parametrize("policy", ["none", "full"])
def test_flops_count_what_the_backward_pass_recomputes(remat3, policy):
    grad = jax.grad(_model(policy), argnums=1)
    product = 2.0 * N * N * N
    # Two layers, the gradient of the weight only: forward one product each; backward the
    # weight's gradient in each and the input's in the second only (the first layer's input
    # is not differentiated). Under full each layer's product runs again before its backward.
    expected = (2 + 3) * product + (2 * product if policy == "full" else 0)
    assert count_flops(grad, *ARGS).matmul == expected


def test_a_policy_found_in_a_jaxpr_is_the_one_rk_remat_was_given(remat3):
    forward = jax.make_jaxpr(_model("minimal"))(*ARGS)
    found = checks.checkpoint_policies(forward)
    assert len(found) == 2
    assert all(checks.same_policy(fn, rk.policy("minimal")) for fn, _ in found)
    assert all(tags == {"mlpwi", "block_out"} for _, tags in found)


def test_the_flag_is_part_of_every_remembered_answer(remat3):
    t = rk.target("cpu")
    key = cache.request_key("report", {"model": "m"}, t)
    jax.config.update("jax_remat3", not remat3)
    try:
        assert cache.request_key("report", {"model": "m"}, t) != key
    finally:
        jax.config.update("jax_remat3", remat3)


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["0", "1"])
def test_report_with_a_name_policy_runs_and_says_which_remat_it_traced(tmp_path, flag):
    """The command of issue 42 in a fresh process (the flag is read when jax starts)."""
    import os
    import subprocess
    import sys

    out = tmp_path / "r.json"
    argv = ["report", "--model", "tiny-llama", "--target", "h100", "--batch", "2"]
    argv += ["--seq", "256", "--precision", "bf16", "--optimizer", "sgd", "--policy", "minimal"]
    env = {**os.environ, "JAX_REMAT3": flag}
    done = subprocess.run(
        [sys.executable, "-m", "remat_kit.cli", *argv, "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    meta = json.loads(out.read_text())["meta"]
    assert meta["remat_impl"] == ("remat3" if flag == "1" else "default")
    assert ("traced with jax_remat3" in done.stdout) == (flag == "1")
    residuals = json.loads(out.read_text())["residuals"]["tags"]
    assert {t for t, k in residuals.items() if k == "saved"} >= {"query_proj", "mlpwi_0"}
