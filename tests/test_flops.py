"""Tests for remat_kit.flops: FLOPs from the jaxpr, recomputation and loop trips included."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from remat_kit.flops import FlopCount, count_flops, count_jaxpr_flops, scan_operand_split

S = jax.ShapeDtypeStruct
F32 = jnp.float32


def _spec(*shape: int, dtype=F32) -> jax.ShapeDtypeStruct:
    return S(shape, dtype)


# --------------------------------------------------------------------------------------------------
# Matmuls and convolutions


def test_single_matmul_is_2mkn():
    m, k, n = 7, 11, 13
    got = count_flops(jnp.matmul, _spec(m, k), _spec(k, n))
    assert got.matmul == 2 * m * k * n
    assert got.total == got.matmul
    assert got.other == 0 and got.attention_kernel == 0


def test_batched_einsum_counts_batch_dims():
    b, h, q, k, d = 2, 3, 5, 7, 4
    got = count_flops(
        lambda a, c: jnp.einsum("bhqd,bhkd->bhqk", a, c), _spec(b, h, q, d), _spec(b, h, k, d)
    )
    assert got.matmul == 2 * b * h * q * k * d


def test_conv_counts_kernel_window_and_feature_groups():
    n, c, hw, o, kk, groups = 2, 4, 8, 6, 3, 2
    lhs, rhs = _spec(n, c, hw, hw), _spec(o, c // groups, kk, kk)

    def conv(x, w):
        return jax.lax.conv_general_dilated(
            x, w, window_strides=(1, 1), padding="SAME", feature_group_count=groups
        )

    got = count_flops(conv, lhs, rhs)
    assert got.matmul == 2 * (n * o * hw * hw) * kk * kk * c / groups


def test_elementwise_counts_output_elements_and_ignores_data_movement():
    def f(x):
        y = jnp.tanh(x).T.reshape(-1)  # tanh: 12; transpose/reshape: free
        return jnp.sum(y * 2.0)  # mul: 12; reduce_sum: 12 input elements

    got = count_flops(f, _spec(3, 4))
    assert got.other == 36
    assert got.matmul == 0


# --------------------------------------------------------------------------------------------------
# Loops and branches


def test_scan_multiplies_body_by_length_and_matches_unrolled():
    length, d = 6, 16
    w = _spec(d, d)
    x = _spec(4, d)

    def scanned(w, x):
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=length)[0]

    def unrolled(w, x):
        for _ in range(length):
            x = jnp.tanh(x @ w)
        return x

    single = count_flops(lambda w, x: x @ w, w, x).matmul
    got = count_flops(scanned, w, x)
    ref = count_flops(unrolled, w, x)
    assert got.matmul == length * single
    assert got.total == pytest.approx(ref.total, rel=0.02)


def test_fori_loop_with_static_bounds_counts_trip_count():
    d, trips = 8, 5
    w = _spec(d, d)

    # Python-int bounds become a scan; traced-constant bounds stay a while loop: test both.
    def as_scan(w):
        return jax.lax.fori_loop(0, trips, lambda i, c: c @ w, jnp.eye(d))

    def as_while(w):
        return jax.lax.fori_loop(0, jnp.int32(trips), lambda i, c: c @ w, jnp.eye(d))

    single = 2 * d**3
    assert "while" in str(jax.make_jaxpr(as_while)(w))
    for fn in (as_scan, as_while):
        got = count_flops(fn, w)
        assert got.matmul == trips * single
        assert got.unknown_loops == 0


def test_scan_operand_split_reads_consts_and_carry():
    # jax < 0.12 stores num_consts/num_carry as scan params; jax 0.12 an ft_in flat tree.
    def f(w, b, c0, xs):
        def body(carry, x):
            h, k = carry
            return (jnp.tanh(h @ w + b), k + 1), x * 2.0

        return jax.lax.scan(body, (c0, jnp.int32(0)), xs)

    closed = jax.make_jaxpr(f)(_spec(4, 4), _spec(4), _spec(4), _spec(3, 4))
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "scan"]
    assert scan_operand_split(eqn) == (2, 2)
    assert len(eqn.invars) == 2 + 2 + 1


def test_while_loop_inside_scan_reads_its_bound_from_a_scan_const():
    d, trips, length = 8, 5, 3
    # A concrete closure constant: the outer jaxpr holds its value and hands it to the scan as a
    # const operand, so the while loop's bound inside the body is known statically.
    bound = jnp.full((), trips, jnp.int32)

    def f(w):
        def body(c, _):
            state = (jnp.int32(0), c)
            out = jax.lax.while_loop(lambda s: s[0] < bound, lambda s: (s[0] + 1, s[1] @ w), state)
            return out[1], None

        return jax.lax.scan(body, jnp.eye(d), None, length=length)[0]

    got = count_flops(f, _spec(d, d))
    assert got.unknown_loops == 0
    assert got.matmul == length * trips * 2 * d**3


def test_while_loop_with_literal_bound_and_step():
    def f(x):
        # i = 3, 5, 7, ..., 19: 9 trips
        return jax.lax.while_loop(lambda c: c[0] < 20, lambda c: (c[0] + 2, c[1] * 2.0), (3, x))

    got = count_flops(f, _spec(10))
    # 9 body multiplies of 10 elements; the integer counter and compare are not FLOPs.
    assert got.other == 9 * 10
    assert got.unknown_loops == 0


def test_while_loop_with_dynamic_bound_is_counted_once_and_flagged():
    d = 8

    def f(n, w):
        return jax.lax.fori_loop(0, n, lambda i, c: c @ w, jnp.eye(d))

    got = count_flops(f, S((), jnp.int32), _spec(d, d))
    assert got.matmul == 2 * d**3
    assert got.unknown_loops == 1


def test_cond_takes_most_expensive_branch():
    d = 9

    def f(p, x):
        return jax.lax.cond(p, lambda x: x @ x, lambda x: x + 1.0, x)

    got = count_flops(f, S((), jnp.bool_), _spec(d, d))
    assert got.matmul == 2 * d**3
    assert got.other == 0  # the cheap branch (add) is not added on top


# --------------------------------------------------------------------------------------------------
# Rematerialization


def _two_layer(w1, w2, x):
    return jnp.sum(jnp.tanh(x @ w1) @ w2)


def test_checkpoint_recompute_is_counted():
    m, k, n, p = 8, 16, 32, 4
    args = (_spec(k, n), _spec(n, p), _spec(m, k))
    d1, d2 = 2 * m * k * n, 2 * m * n * p  # the two forward dots

    grad = jax.grad(_two_layer, argnums=(0, 1, 2))
    remat = jax.checkpoint(_two_layer, policy=jax.checkpoint_policies.nothing_saveable)
    grad_remat = jax.grad(remat, argnums=(0, 1, 2))

    plain = count_flops(grad, *args)
    rematted = count_flops(grad_remat, *args)
    # forward (d1 + d2) + backward: dW2 and dh (d2 each), dW1 and dx (d1 each) = 3 x forward.
    assert plain.matmul == 3 * (d1 + d2)
    # Full remat recomputes x @ w1 in the backward; JAX drops the recompute of h @ w2 because its
    # output is not needed for any gradient.
    assert rematted.matmul == 3 * (d1 + d2) + d1
    assert rematted.other > plain.other  # tanh is recomputed too


def test_scan_over_layers_matches_unrolled_under_grad_with_checkpoint():
    layers, d, batch = 4, 32, 8
    x = _spec(batch, d)
    layer = jax.checkpoint(lambda h, w: jnp.tanh(h @ w))

    def scanned(ws, x):
        return jnp.sum(jax.lax.scan(lambda h, w: (layer(h, w), None), x, ws)[0])

    # One parameter per layer, as an unrolled model holds them (slicing a stacked array instead
    # would add pad + add_any ops for the weight gradients that the scan does not have).
    def unrolled(ws, x):
        for w in ws:
            x = layer(x, w)
        return jnp.sum(x)

    got = count_flops(jax.grad(scanned, argnums=(0, 1)), _spec(layers, d, d), x)
    ref = count_flops(jax.grad(unrolled, argnums=(0, 1)), [_spec(d, d)] * layers, x)
    single = 2 * batch * d * d
    # Per layer: forward, recompute, dW, dh.
    assert ref.matmul == layers * 4 * single
    assert got.matmul == pytest.approx(ref.matmul, rel=0.02)
    assert got.total == pytest.approx(ref.total, rel=0.02)


# --------------------------------------------------------------------------------------------------
# Custom derivative rules are counted once


def test_custom_jvp_and_custom_vjp_forward_counted_once():
    d = 12

    @jax.custom_jvp
    def jvp_fn(x):
        return x @ x

    jvp_fn.defjvp(lambda p, t: (jvp_fn(p[0]), t[0] @ p[0] + p[0] @ t[0]))

    @jax.custom_vjp
    def vjp_fn(x):
        return x @ x

    vjp_fn.defvjp(lambda x: (x @ x, x), lambda x, g: (g @ x.T + x.T @ g,))

    for fn in (jvp_fn, vjp_fn):
        assert count_flops(fn, _spec(d, d)).matmul == 2 * d**3


# --------------------------------------------------------------------------------------------------
# Opaque cuDNN attention (traces on a CPU-only machine; only compiling it needs a GPU)


def _cudnn_attention(causal: bool):
    def f(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, implementation="cudnn", is_causal=causal)

    return f


@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_attention_forward_counted_from_shapes(causal):
    b, t, heads, hd = 2, 128, 4, 64
    q = _spec(b, t, heads, hd, dtype=jnp.bfloat16)
    got = count_flops(_cudnn_attention(causal), q, q, q)
    full = 4 * b * t * t * heads * hd
    assert got.attention_kernel == (full / 2 if causal else full)
    assert got.matmul == 0


def test_cudnn_attention_backward_is_2_5x_forward():
    b, t, heads, hd = 1, 256, 2, 64
    q = _spec(b, t, heads, hd, dtype=jnp.bfloat16)
    attend = _cudnn_attention(causal=True)

    def loss(q, k, v):
        return jnp.sum(attend(q, k, v).astype(F32))

    fwd = count_flops(attend, q, q, q).attention_kernel
    got = count_flops(jax.grad(loss, argnums=(0, 1, 2)), q, q, q)
    assert got.attention_kernel == pytest.approx(fwd * (1 + 2.5))


def test_cudnn_attention_recompute_under_checkpoint():
    b, t, heads, hd = 1, 128, 2, 64
    q = _spec(b, t, heads, hd, dtype=jnp.bfloat16)
    attend = _cudnn_attention(causal=False)

    def loss(q, k, v):
        return jnp.sum(attend(q, k, v).astype(F32))

    fwd = count_flops(attend, q, q, q).attention_kernel
    remat = jax.checkpoint(loss, policy=jax.checkpoint_policies.nothing_saveable)
    got = count_flops(jax.grad(remat, argnums=(0, 1, 2)), q, q, q)
    assert got.attention_kernel == pytest.approx(fwd * (2 + 2.5))


# --------------------------------------------------------------------------------------------------
# API surface


def test_count_jaxpr_flops_and_to_dict():
    closed = jax.make_jaxpr(jnp.matmul)(_spec(2, 3), _spec(3, 4))
    got = count_jaxpr_flops(closed)
    assert isinstance(got, FlopCount)
    assert got == count_flops(jnp.matmul, _spec(2, 3), _spec(3, 4))
    assert got.to_dict() == {
        "total": 48.0,
        "matmul": 48.0,
        "attention_kernel": 0.0,
        "other": 0.0,
        "unknown_loops": 0,
    }
    assert count_jaxpr_flops(closed.jaxpr) == got  # an open Jaxpr works too


def test_jit_inside_is_recursed_into():
    inner = jax.jit(lambda a, b: a @ b)
    assert count_flops(lambda a, b: inner(a, b) + 1.0, _spec(4, 5), _spec(5, 6)).matmul == 240


def test_bad_arguments_raise_type_error():
    with pytest.raises(TypeError, match="callable"):
        count_flops(42)
    with pytest.raises(TypeError, match="ClosedJaxpr"):
        count_jaxpr_flops("not a jaxpr")
