"""A mixture-of-experts layer (Mixtral, Qwen3-MoE): a router and SwiGLU experts.

Each token's router logits (a Dense d -> E, in f32) are scored by a softmax or a sigmoid and
the token goes to its top ``experts_per_token`` experts; their outputs are summed weighted by
the scores (renormalised over the top k with ``norm_topk_prob``). The experts are SwiGLU MLPs
whose weights are stacked over the experts: ``wi_0``, ``wi_1`` (E, d, f) and ``wo`` (E, f, d).

Two ways to run the experts, one switch (``ModelConfig.moe_impl``):

- ``"ragged"`` (dropless): the k copies of every token are sorted by expert and each expert
  multiplies its contiguous rows (``jax.lax.ragged_dot``, a grouped GEMM), then the rows go
  back to their tokens. No token is dropped and no padding is computed.
- ``"capacity"`` (GShard / Switch): per sequence, each expert takes at most
  ``C = ceil(k * seq * capacity_factor / E)`` tokens, placed by a one-hot dispatch tensor in
  token order; the tokens past an expert's capacity are dropped (only the residual carries
  them). Every step is an einsum over an expert axis, which GSPMD turns into all-to-alls
  when the experts are split over ``ep``.

Tags: the router logits are ``router_logits``; each expert GEMM output is tagged twice, its
MoE name inside the dense one (``moe_mlpwi_0`` then ``mlpwi_0``, likewise ``mlpwi_1`` and
``mlpwo``), so a policy that saves the MLP projections saves the experts' as well.

The load-balancing loss (Switch / Mixtral: ``E * sum_e f_e * P_e``, ``f_e`` the fraction of
routed slots that chose expert e, ``P_e`` the mean router probability of e) enters through
the backward pass: the router logits pass through an identity whose gradient adds
``router_aux_loss_coef * d aux / d logits``. The gradients are those of ``loss + coef *
sum over layers of aux`` while the train step's loss function stays as it is (its reported
loss value does not include the auxiliary term).
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from remat_kit import names
from remat_kit_models.axes import (
    DISPATCHED_AXES,
    EXPERT_HIDDEN_AXES,
    GROUPED_AXES,
    constrain,
    partitioned,
)
from remat_kit_models.config import ModelConfig

__all__ = ["MoE", "balancing_loss", "capacity", "route"]


def _tag(x: jax.Array, moe_name: str, dense_name: str) -> jax.Array:
    # The MoE name inside the dense one: saving either keeps the tensor.
    return checkpoint_name(checkpoint_name(x, moe_name), dense_name)


def _scores(logits: jax.Array, scoring: str) -> jax.Array:
    return jax.nn.softmax(logits, axis=-1) if scoring == "softmax" else jax.nn.sigmoid(logits)


def route(
    logits: jax.Array, k: int, *, scoring: str = "softmax", norm_topk_prob: bool = False
) -> tuple[jax.Array, jax.Array]:
    """Each token's top-``k`` experts and their weights.

    Args:
      logits: router logits (..., E).
      k: experts per token.
      scoring: ``"softmax"`` over the experts or an independent ``"sigmoid"`` per expert.
      norm_topk_prob: divide the k weights by their sum (Mixtral, Qwen3: the same as a
        softmax over the k chosen logits).

    Returns:
      ``(weights, experts)``, each (..., k): f32 weights and int32 expert ids, best first.

    Example:
      >>> w, e = route(jnp.array([[0.0, 2.0, 1.0]]), 2, norm_topk_prob=True)
      >>> e.tolist(), round(float(w.sum()), 6)
      ([[1, 2]], 1.0)
    """
    weights, experts = jax.lax.top_k(_scores(logits.astype(jnp.float32), scoring), k)
    if norm_topk_prob:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, experts


def balancing_loss(logits: jax.Array, k: int, scoring: str = "softmax") -> jax.Array:
    """The Switch / Mixtral load-balancing loss ``E * sum_e f_e * P_e`` of one layer.

    ``f_e``: the fraction of tokens whose top ``k`` include expert e (summing to k, as in
    Hugging Face's ``load_balancing_loss_func``); ``P_e``: the router probability of e averaged
    over the tokens (sigmoid scores normalised to sum to 1 per token). Perfect balance gives k.

    Example:
      >>> round(float(balancing_loss(5.0 * jnp.eye(4), 1)), 6)  # one token each: f_e = P_e = 1/4
      1.0
    """
    n = logits.shape[-1]
    flat = logits.reshape(-1, n).astype(jnp.float32)
    probs = _scores(flat, scoring)
    if scoring == "sigmoid":
        probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
    _, chosen = jax.lax.top_k(flat, k)
    fraction = jnp.mean(jnp.sum(jax.nn.one_hot(chosen, n, dtype=jnp.float32), axis=1), axis=0)
    return n * jnp.sum(jax.lax.stop_gradient(fraction) * jnp.mean(probs, axis=0))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _balanced(logits: jax.Array, coef: float, k: int, scoring: str) -> jax.Array:
    return logits


def _balanced_fwd(
    logits: jax.Array, coef: float, k: int, scoring: str
) -> tuple[jax.Array, jax.Array]:
    return logits, logits


def _balanced_bwd(
    coef: float, k: int, scoring: str, logits: jax.Array, g: jax.Array
) -> tuple[jax.Array]:
    aux = jax.grad(balancing_loss)(logits, k, scoring)
    return (g + (coef * aux).astype(g.dtype),)


_balanced.defvjp(_balanced_fwd, _balanced_bwd)


def capacity(cfg: ModelConfig, tokens_per_group: int) -> int:
    """Slots per expert and group of the capacity path: ``ceil(k * tokens * factor / E)``.

    Example:
      >>> from remat_kit_models import get_config
      >>> capacity(get_config("mixtral-8x7b"), 4096)  # 2 * 4096 * 1.25 / 8
      1280
    """
    k, n = cfg.experts_per_token, cfg.n_experts
    return max(1, math.ceil(k * tokens_per_group * cfg.capacity_factor / n))


class MoE(nn.Module):
    """Routed SwiGLU experts over (batch, seq, d_model) -> (batch, seq, d_model).

    Parameters: ``router/kernel`` (d, E) and the stacked expert weights ``wi_0``, ``wi_1``
    (E, d, f) and ``wo`` (E, f, d), with logical axes ``exp`` / ``embed`` / ``mlp``.
    """

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg
        n, d, f = cfg.n_experts, cfg.d_model, cfg.expert_d_ff
        router = nn.Dense(
            n,
            use_bias=False,
            dtype=jnp.float32,
            param_dtype=cfg.param_dtype,
            kernel_init=partitioned(nn.initializers.normal(0.02), ("embed", None)),
            name="router",
        )
        logits = checkpoint_name(router(x), names.ROUTER_LOGITS)
        if cfg.router_aux_loss_coef:
            logits = _balanced(
                logits, float(cfg.router_aux_loss_coef), cfg.experts_per_token, cfg.router_scoring
            )
        weights, experts = route(
            logits,
            cfg.experts_per_token,
            scoring=cfg.router_scoring,
            norm_topk_prob=cfg.norm_topk_prob,
        )
        init = nn.initializers.normal(0.02)
        param = lambda name, shape, axes: self.param(
            name, partitioned(init, axes), shape, cfg.param_dtype
        ).astype(cfg.dtype)
        wi_0 = param("wi_0", (n, d, f), ("exp", "embed", "mlp"))
        wi_1 = param("wi_1", (n, d, f), ("exp", "embed", "mlp"))
        wo = param("wo", (n, f, d), ("exp", "mlp", "embed"))
        x = x.astype(cfg.dtype)
        run = _ragged if cfg.moe_impl == "ragged" else _capacity
        return run(cfg, x, weights, experts, (wi_0, wi_1, wo))


def _activation(cfg: ModelConfig) -> jax.Array:
    return nn.silu if cfg.mlp_activation == "silu" else nn.gelu


def _ragged(
    cfg: ModelConfig,
    x: jax.Array,
    weights: jax.Array,
    experts: jax.Array,
    w: tuple[jax.Array, jax.Array, jax.Array],
) -> jax.Array:
    # Dropless: the k copies of each token sorted by expert, one grouped GEMM per weight.
    b, s, d = x.shape
    k, n = cfg.experts_per_token, cfg.n_experts
    tokens = x.reshape(b * s, d)
    chosen = experts.reshape(-1)  # token-major: copy j of token t at t * k + j
    order = jnp.argsort(chosen, stable=True)
    rows = tokens[order // k]  # (b*s*k, d), grouped by expert
    sizes = jnp.bincount(chosen, length=n).astype(jnp.int32)
    gemm = lambda lhs, rhs: jax.lax.ragged_dot(lhs, rhs, sizes)
    gate = _tag(gemm(rows, w[0]), names.MOE_MLPWI_0, names.MLPWI_0)
    up = _tag(gemm(rows, w[1]), names.MOE_MLPWI_1, names.MLPWI_1)
    out = _tag(gemm(_activation(cfg)(gate) * up, w[2]), names.MOE_MLPWO, names.MLPWO)
    back = jnp.zeros_like(order).at[order].set(jnp.arange(order.size, dtype=order.dtype))
    out = out[back].reshape(b * s, k, d)  # each copy back in its token's place
    y = jnp.einsum("tkd,tk->td", out, weights.reshape(b * s, k).astype(out.dtype))
    return y.reshape(b, s, d)


def _capacity(
    cfg: ModelConfig,
    x: jax.Array,
    weights: jax.Array,
    experts: jax.Array,
    w: tuple[jax.Array, jax.Array, jax.Array],
) -> jax.Array:
    # GShard / Switch: per sequence (group g), each expert's first C routed slots in token
    # order (token t's k choices before token t + 1's); the rest are dropped.
    g, s, _ = x.shape
    k, n = cfg.experts_per_token, cfg.n_experts
    c = capacity(cfg, s)
    chosen = jax.nn.one_hot(experts, n, dtype=jnp.int32)  # g, s, k, e
    slots = chosen.reshape(g, s * k, n)
    position = jnp.sum((jnp.cumsum(slots, axis=1) - 1) * slots, axis=-1).reshape(g, s, k)
    place = jax.nn.one_hot(position, c, dtype=x.dtype)  # all zero past the capacity: dropped
    mask = chosen.astype(x.dtype)
    dispatch = jnp.einsum("gske,gskc->gsec", mask, place)
    combine = jnp.einsum("gske,gskc,gsk->gsec", mask, place, weights.astype(x.dtype))
    # Made split by groups, then resharded by experts: the all-to-all dispatch under ep.
    routed = constrain(jnp.einsum("gsec,gsd->egcd", dispatch, x), GROUPED_AXES)
    routed = constrain(routed, DISPATCHED_AXES)
    hidden = lambda h, moe_name, name: _tag(constrain(h, EXPERT_HIDDEN_AXES), moe_name, name)
    gate = hidden(jnp.einsum("egcd,edf->egcf", routed, w[0]), names.MOE_MLPWI_0, names.MLPWI_0)
    up = hidden(jnp.einsum("egcd,edf->egcf", routed, w[1]), names.MOE_MLPWI_1, names.MLPWI_1)
    out = jnp.einsum("egcf,efd->egcd", _activation(cfg)(gate) * up, w[2])
    out = _tag(constrain(out, DISPATCHED_AXES), names.MOE_MLPWO, names.MLPWO)
    # Back to the groups' devices (the all-to-all combine under ep) before the combine.
    return jnp.einsum("gsec,egcd->gsd", combine, constrain(out, GROUPED_AXES))
