"""Layer schedules: gradients unchanged, structure as specified, memory as promised."""

import functools

import chex
import jax
import jax.numpy as jnp
import pytest

import remat_kit as rk
import remat_kit_models as models
from helpers import loss_and_grads, losses_and_grads, on_both_layouts, tokens
from remat_kit import checks

SCHEDULES = ["every:2", "every:3", "sqrt", "nested:2", "nested:3", "layers:0-1=full,rest=minimal"]
# Each schedule on both layouts (a scanned stack is split into segments, an unrolled one is
# not), the models swapped between layouts: each schedule meets both models, one of them
# with dropout's key threaded through its segments.
GRADIENT_CASES = on_both_layouts(SCHEDULES)


@functools.cache
def _setup(model, scan):
    # 5 layers: every:2 and every:3 leave a remainder segment; nested:2 and :3 too.
    cfg = models.get_config(
        model, layers=5, scan_layers=scan, dropout_rate=0.1 if model == "tiny-gpt2" else 0.0
    )
    toks = tokens(seq=17)
    params = models.build(cfg).init(jax.random.key(0), toks[:, :-1])
    key = jax.random.key(3) if cfg.dropout_rate else None
    return cfg, toks, params, key, loss_and_grads(cfg, params, toks, dropout_key=key)


@functools.cache
def _gradients(model: str, scan: bool) -> dict:
    # The gradient cases of one model and layout, compiled as one program (helpers).
    cfg, toks, params, key, _ = _setup(model, scan)
    cases = [c.values[0] for c in GRADIENT_CASES if c.values[1:] == (model, scan)]
    configs = [cfg.replace(schedule=s, policy="minimal") for s in cases]
    got = losses_and_grads(configs, params, toks, dropout_key=key)
    return dict(zip(cases, got, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize(("schedule", "model", "scan"), GRADIENT_CASES)
def test_schedule_keeps_gradients(schedule, model, scan):
    ref = _setup(model, scan)[-1]
    got = _gradients(model, scan)[schedule]
    chex.assert_trees_all_close(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("spec", "layers", "expected"),
    [
        ("none", 8, [(8,)]),
        ("every:2", 8, [(4, 2)]),
        ("every:4", 10, [(2, 4), (1, 2)]),
        ("sqrt", 100, [(10, 10)]),
        ("sqrt", 32, [(5, 6), (1, 2)]),
        ("nested:2", 16, [(4, 4)]),
        ("nested:3", 64, [(4, 4, 4)]),
        ("nested:3", 30, [(3, 3, 3), (1, 2), (1,)]),
        ("layers:0-7=full,rest=minimal", 12, [(8,), (4,)]),
    ],
)
def test_runs(spec, layers, expected):
    runs = rk.parse_schedule(spec).runs(layers, "none")
    assert [r.lengths for r in runs] == expected
    assert sum(r.layers for r in runs) == layers
    assert [r.start for r in runs] == [sum(r.layers for r in runs[:i]) for i in range(len(runs))]


def test_layer_plan_policies():
    s = rk.schedule("layers", plan={range(0, 8): "full", 9: "qkv_proj", "rest": "minimal"})
    runs = s.runs(12, "none")
    assert [(r.start, r.layers, r.policy.name) for r in runs] == [
        (0, 8, "full"),
        (8, 1, "minimal"),
        (9, 1, "qkv_proj"),
        (10, 2, "minimal"),
    ]
    assert rk.parse_schedule(s.spec).runs(12, "none") == runs
    # Without "rest", unnamed layers use the model's policy.
    runs = rk.parse_schedule("layers:0-1=full").runs(4, "context")
    assert [r.policy.name for r in runs] == ["full", "context"]


def _checkpoints(closed):
    """(layer scope, policy name) of every top-level checkpoint of a jaxpr, in order."""
    return [
        (str(e.source_info.name_stack), checks.policy_of(e.params["policy"]).name)
        for e in closed.jaxpr.eqns
        if e.primitive.name in ("checkpoint", "remat2", "remat")
    ]


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scan"])
def test_a_layer_plan_puts_each_policy_on_the_layers_it_names(scan):
    """Which layer is checkpointed with which policy, not only how many are: the plan's policy
    on the layers it names, the model's elsewhere, no checkpoint on a ``none`` layer."""
    w = jnp.ones((6, 3, 3)) * 0.1

    def f(params):
        return rk.apply_layers(
            lambda p, h, k: jnp.tanh(h @ p),
            params if scan else list(params),
            jnp.ones((2, 3)),
            n_layers=6,
            schedule="layers:0=none,2=full,4-5=dots",
            policy="minimal",
            scan=scan,
        )

    closed = jax.make_jaxpr(f)(w)
    got = [checks.policy_of(p).name for p, _ in checks.checkpoint_policies(closed)]
    if scan:  # a run of layers is one checkpoint inside its scan: one per run after layer 0
        assert got == ["minimal", "full", "minimal", "dots"]
    else:
        assert got == ["minimal", "full", "minimal", "dots", "dots"]
        assert _checkpoints(closed) == [
            ("layers_1", "minimal"),
            ("layers_2", "full"),
            ("layers_3", "minimal"),
            ("layers_4", "dots"),
            ("layers_5", "dots"),
        ]


@pytest.mark.slow
def test_apply_layers_matches_a_python_loop():
    w = jax.random.normal(jax.random.key(0), (7, 5, 5)) * 0.3
    x = jnp.ones((3, 5))
    layer = lambda p, h, k: jnp.tanh(h @ p)
    ref = x
    for i in range(7):
        ref = layer(w[i], ref, None)
    for spec in ("none", "every:3", "sqrt", "nested:3"):
        for scan in (True, False):
            params = w if scan else list(w)
            got = rk.apply_layers(
                layer, params, x, n_layers=7, schedule=spec, policy="full", scan=scan
            )
            # Entries near zero are sums that cancel (terms ~0.1, result ~1e-3): their relative
            # error is not bounded by f32's, so an absolute floor of a few ulps of the terms.
            # A skipped or repeated layer moves them by ~1e-2.
            chex.assert_trees_all_close(got, ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        ("every", ValueError, "expected a number after"),
        ("every:0", ValueError, "n=0 must be >= 1"),
        ("every:x", ValueError, "expected a number"),
        ("nested:1", ValueError, "levels=1 must be >= 2"),
        ("sqrtt", ValueError, "Did you mean sqrt"),
        ("layers:0-3", ValueError, "expected 0-7=full"),
        ("layers:0-3=ful", ValueError, "unknown policy 'ful'"),
        ("layers:0-3=full,2-5=minimal", ValueError, "overlap"),
        ("sqrt:3", ValueError, "takes no argument"),
    ],
)
def test_bad_specs(spec, error, match):
    with pytest.raises(error, match=match):
        rk.parse_schedule(spec)


def test_plan_beyond_the_model_fails():
    with pytest.raises(ValueError, match="model has 4"):
        rk.parse_schedule("layers:0-7=full").runs(4, "none")
    with pytest.raises(TypeError, match=r"n must be an int, got float 2\.0"):
        rk.schedule("every", n=2.0)


@pytest.mark.parametrize(
    ("name", "kwargs"), [("every", {"n": 2}), ("sqrt", {}), ("nested", {"levels": 2})]
)
def test_inner_sets_the_policy_inside_segments(name, kwargs):
    """``inner`` is the per-layer policy inside a segment; without it, the model's policy."""
    own = rk.schedule(name, inner="minimal", **kwargs).runs(9, "full")
    assert {r.policy.name for r in own} == {"minimal"}
    assert sum(r.layers for r in own) == 9
    default = rk.schedule(name, **kwargs).runs(9, "full")
    assert {r.policy.name for r in default} == {"full"}
    assert [r.lengths for r in own] == [r.lengths for r in default]


@pytest.mark.slow
def test_segments_cut_gpu_activations(small):
    none, every2 = small("none"), small("none", schedule="every:2")
    full = small("full")
    assert every2.breakdown["activations"] < none.breakdown["activations"] * 0.7
    # A segment is recomputed whole: about one extra forward, like per-layer "full".
    assert every2.meta["recompute_overhead"] == pytest.approx(
        full.meta["recompute_overhead"], rel=0.35
    )
    assert every2.schedule == "every:2"
