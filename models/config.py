"""ModelConfig: the shape, dtypes and checkpointing switches of a transformer preset."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Collection, Iterator
from typing import Any

import jax.numpy as jnp

import remat_kit as rk
from remat_kit.errors import BadValue

__all__ = [
    "ATTENTION_KINDS",
    "FAMILIES",
    "MLP_ACTIVATIONS",
    "MOE_IMPLS",
    "ROUTER_SCORINGS",
    "ModelConfig",
    "blame_overrides",
]

FAMILIES = ("llama", "gpt2")
ATTENTION_KINDS = ("xla", "cudnn", "auto")
#: The gated MLP's activation (Llama family): SwiGLU, or GeGLU (Gemma; tanh approximation).
MLP_ACTIVATIONS = ("silu", "gelu")
#: How a mixture-of-experts layer runs its experts (models.moe): dropless grouped matmuls
#: (``jax.lax.ragged_dot``) or GShard/Switch's fixed-capacity dispatch einsums.
MOE_IMPLS = ("ragged", "capacity")
#: How the router turns logits into expert weights: softmax (Mixtral, Qwen3) or sigmoid.
ROUTER_SCORINGS = ("softmax", "sigmoid")

_DTYPES = {
    "bf16": jnp.bfloat16,
    "bfloat16": jnp.bfloat16,
    "f32": jnp.float32,
    "float32": jnp.float32,
    "f16": jnp.float16,
    "float16": jnp.float16,
}


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def _listed(values: list[int], most: int = 12) -> str:
    # Up to ``most`` values; past that, the first ones, an ellipsis and the largest.
    shown = [str(v) for v in values]
    return ", ".join(shown if len(shown) <= most else [*shown[: most - 1], "...", shown[-1]])


def _odd_head(cfg: ModelConfig) -> str:
    """Why an odd head size cannot be built, and the head counts (or widths) that can."""
    rule = "the llama family's rotary position embedding rotates pairs of dimensions"
    if cfg.head_dim is not None:
        return f"head_dim={cfg.head_dim} is odd: {rule}; use an even head_dim"
    d, n, kv = cfg.d_model, cfg.n_heads, cfg.n_kv_heads
    head = f"head size {d // n} (d_model={d} / n_heads={n}) is odd: {rule}"
    wide = f"a d_model that is a multiple of {2 * n}"
    even = [h for h in _divisors(d) if (d // h) % 2 == 0 and h % kv == 0]
    if not even:
        return f"{head}; use {wide} (no n_heads divisible by n_kv_heads={kv} gives an even one)"
    return f"{head}; use n_heads in {_listed(even)} (n_kv_heads={kv}), or {wide}"


#: Fields a rule of :class:`ModelConfig` ties together: the head size is d_model / n_heads.
_HEAD_SPLIT = ("d_model", "n_heads")


@contextlib.contextmanager
def blame_overrides(changed: Collection[str]) -> Iterator[None]:
    """A ``BadValue`` about the width and the head count names the one the caller changed.

    A rule between ``d_model`` and ``n_heads`` (the head size) is raised naming one of them
    (``BadValue.param``); when the caller overrode only the other, the error names that one
    instead, so the CLI puts the flag that was given in front of the message.

    Args:
      changed: the ``ModelConfig`` fields the caller overrode.

    Example:
      >>> try:
      ...     with blame_overrides({"d_model"}):
      ...         ModelConfig("x", "llama", 256, d_model=4, n_layers=1, n_heads=4, n_kv_heads=1,
      ...                     d_ff=8)
      ... except BadValue as err:
      ...     print(err.param)
      d_model
    """
    try:
        yield
    except BadValue as err:
        if err.param in _HEAD_SPLIT and err.param not in changed:
            other = _HEAD_SPLIT[1 - _HEAD_SPLIT.index(err.param)]
            if other in changed:
                err.param = other
        raise


def as_dtype(d: Any) -> Any:
    """Reads a dtype from a string such as ``"bf16"`` or passes a jnp dtype through."""
    if isinstance(d, str):
        try:
            return _DTYPES[d]
        except KeyError:
            raise BadValue(f"unknown dtype {d!r}; valid: {', '.join(_DTYPES)}") from None
    return d


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Everything a model needs: published shape, dtypes and the remat switches.

    ``policy`` is the one-line switch for the whole model (the Hugging Face
    ``gradient_checkpointing_enable()`` of this project): every block is wrapped with it.
    It is given as a name, spec, ``rk.Policy`` or jax policy callable and held as an
    ``rk.Policy`` (``schedule`` likewise as an ``rk.Schedule``): normalised once, here.
    """

    name: str
    family: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    max_seq_len: int = 2048
    head_dim: int | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 500_000.0
    tie_embeddings: bool = False
    causal: bool = True
    dropout_rate: float = 0.0
    dtype: Any = jnp.bfloat16
    param_dtype: Any = jnp.bfloat16
    scan_layers: bool = True
    policy: rk.Policy = rk.policies.NO_REMAT  # a name or spec given is made one in __post_init__
    schedule: rk.Schedule = "none"  # type: ignore[assignment]
    attention: str = "xla"
    lora_rank: int = 0
    lora_alpha: float = 16.0
    # Variants of the Llama family read from Hugging Face configs (models.hf): Qwen2's
    # biases on q/k/v, Gemma's GeGLU MLP and embeddings scaled by sqrt(d_model).
    qkv_bias: bool = False
    mlp_activation: str = "silu"
    embed_scale: bool = False
    # Qwen3: RMSNorm over head_dim on each head of q and k, before the rotary embedding.
    qk_norm: bool = False
    # Mixture of experts (models.moe), llama family: ``n_experts`` routed SwiGLU experts of
    # width ``moe_d_ff`` (default d_ff) in place of the MLP, each token sent to its top
    # ``experts_per_token``; ``n_shared_experts`` always-on experts of the same width beside
    # them (DeepSeek / Qwen2-MoE). 0 experts: the dense MLP of width d_ff. LoRA adapts the
    # attention and the shared experts; the router and the routed experts get no adapter.
    n_experts: int = 0
    experts_per_token: int = 0
    moe_d_ff: int | None = None
    n_shared_experts: int = 0
    router_scoring: str = "softmax"
    norm_topk_prob: bool = False
    router_aux_loss_coef: float = 0.0
    moe_impl: str = "ragged"
    capacity_factor: float = 1.25

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise BadValue(
                f"unknown family {self.family!r}; valid: {', '.join(FAMILIES)}", param="family"
            )
        if self.attention not in ATTENTION_KINDS:
            raise BadValue(
                f"unknown attention {self.attention!r}; valid: {', '.join(ATTENTION_KINDS)}",
                param="attention",
            )
        for field in (
            "vocab_size",
            "d_model",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "d_ff",
            "max_seq_len",
        ):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise BadValue(f"{field}={value!r} must be a positive int", param=field)
        if self.vocab_size < 2:
            raise BadValue(
                f"vocab_size={self.vocab_size} leaves nothing to predict (the loss is 0 and "
                "every gradient vanishes): use a vocabulary of at least 2 tokens",
                param="vocab_size",
            )
        if self.head_dim is None and self.d_model % self.n_heads:
            raise BadValue(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads} (n_heads "
                f"that divide it: {_listed(_divisors(self.d_model))}); pass head_dim or a width "
                "that is a multiple of the head count",
                param="d_model",
            )
        if self.n_heads % self.n_kv_heads:
            raise BadValue(
                f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads} (valid: "
                f"{_listed(_divisors(self.n_heads))})",
                param="n_kv_heads",
            )
        if self.family == "llama" and self.dim_per_head % 2:
            # The rotary embedding rotates the two halves of each head (attention.rope).
            raise BadValue(
                _odd_head(self), param="n_heads" if self.head_dim is None else "head_dim"
            )
        if not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            raise BadValue(
                f"lora_rank={self.lora_rank!r} must be a non-negative int", param="lora_rank"
            )
        if self.lora_rank > min(self.d_model, self.d_ff):
            raise BadValue(
                f"lora_rank={self.lora_rank} exceeds the model width {self.d_model}: "
                f"use a rank below {min(self.d_model, self.d_ff)}",
                param="lora_rank",
            )
        if self.mlp_activation not in MLP_ACTIVATIONS:
            raise BadValue(
                f"unknown mlp_activation {self.mlp_activation!r}; valid: "
                f"{', '.join(MLP_ACTIVATIONS)}",
                param="mlp_activation",
            )
        self._check_moe()
        if not isinstance(self.qk_norm, bool):
            raise BadValue(f"qk_norm={self.qk_norm!r} must be true or false", param="qk_norm")
        if self.qk_norm and self.family != "llama":
            raise BadValue(
                f"qk_norm=True is modelled for the llama family only, not {self.family!r}",
                param="qk_norm",
            )
        if not 0.0 <= self.dropout_rate < 1.0:
            raise BadValue(
                f"dropout_rate={self.dropout_rate!r} must be in [0, 1)", param="dropout_rate"
            )
        object.__setattr__(self, "policy", rk.as_policy(self.policy))
        object.__setattr__(self, "schedule", rk.parse_schedule(self.schedule))
        object.__setattr__(self, "dtype", as_dtype(self.dtype))
        object.__setattr__(self, "param_dtype", as_dtype(self.param_dtype))
        if self.attention == "cudnn":
            if self.dropout_rate > 0.0:
                raise BadValue(
                    "attention='cudnn' has no attention dropout in jax.nn.dot_product_attention; "
                    f"use attention='xla' or dropout_rate=0 (got {self.dropout_rate})",
                    param="dropout_rate",
                )
            if jnp.dtype(self.dtype).itemsize != 2:
                raise BadValue(
                    f"attention='cudnn' needs a 16-bit compute dtype (bf16/f16), got "
                    f"{jnp.dtype(self.dtype).name}: pass dtype='bf16' or attention='xla'",
                    param="dtype",
                )

    def _check_moe(self) -> None:
        # Every mixture-of-experts field, before anything is built (BadValue names the field).
        def whole(field: str, least: int) -> int:
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                kind = "a positive int" if least else "a non-negative int"
                raise BadValue(f"{field}={value!r} must be {kind}", param=field)
            return value

        n, k = whole("n_experts", 0), whole("experts_per_token", 0)
        shared = whole("n_shared_experts", 0)
        if self.moe_d_ff is not None:
            whole("moe_d_ff", 1)
        if self.router_scoring not in ROUTER_SCORINGS:
            raise BadValue(
                f"unknown router_scoring {self.router_scoring!r}; valid: "
                f"{', '.join(ROUTER_SCORINGS)}",
                param="router_scoring",
            )
        if self.moe_impl not in MOE_IMPLS:
            raise BadValue(
                f"unknown moe_impl {self.moe_impl!r}; valid: {', '.join(MOE_IMPLS)}",
                param="moe_impl",
            )
        if not isinstance(self.norm_topk_prob, bool):
            raise BadValue(
                f"norm_topk_prob={self.norm_topk_prob!r} must be true or false",
                param="norm_topk_prob",
            )
        for field in ("router_aux_loss_coef", "capacity_factor"):
            value = getattr(self, field)
            if not isinstance(value, int | float) or isinstance(value, bool) or value != value:
                raise BadValue(f"{field}={value!r} must be a number", param=field)
        if self.router_aux_loss_coef < 0:
            raise BadValue(
                f"router_aux_loss_coef={self.router_aux_loss_coef!r} must be >= 0 (0: no "
                "load-balancing loss)",
                param="router_aux_loss_coef",
            )
        if not self.capacity_factor > 0 or self.capacity_factor == float("inf"):
            raise BadValue(
                f"capacity_factor={self.capacity_factor!r} must be a positive finite number "
                f"(1.25 is GShard's; {n / max(k, 1):g} = n_experts / experts_per_token drops "
                "no token)",
                param="capacity_factor",
            )
        if n == 0:
            if k or shared:
                field = "experts_per_token" if k else "n_shared_experts"
                raise BadValue(
                    f"{field}={getattr(self, field)} needs routed experts: set n_experts > 0 "
                    "(n_experts=0 is the dense MLP)",
                    param=field,
                )
            return
        if self.family != "llama":
            raise BadValue(
                f"n_experts={n}: mixture-of-experts layers are modelled for the llama family "
                f"only, not {self.family!r}; use n_experts=0",
                param="n_experts",
            )
        if not 1 <= k <= n:
            raise BadValue(
                f"experts_per_token={k} must be in 1..n_experts={n} (the top-k experts each "
                "token is sent to)",
                param="experts_per_token",
            )

    @property
    def expert_d_ff(self) -> int:
        """The hidden width of one expert (``moe_d_ff``, or ``d_ff`` when unset)."""
        return self.moe_d_ff or self.d_ff

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def param_count(self) -> int:
        """Parameter count from the shapes (embedding, blocks, norms, head)."""
        d, h = self.d_model, self.dim_per_head
        attn = d * h * (self.n_heads * 2 + self.n_kv_heads * 2)
        if self.family == "llama":
            attn += h * (self.n_heads + 2 * self.n_kv_heads) if self.qkv_bias else 0
            attn += 2 * h if self.qk_norm else 0
            mlp = 3 * d * self.d_ff
            if self.n_experts:
                f, n = self.expert_d_ff, self.n_experts
                # router, routed experts, shared experts (one MLP of their summed width)
                mlp = d * n + n * 3 * d * f + 3 * d * f * self.n_shared_experts
            norms = 2 * d
            extra = d  # final norm
            pos = 0
        else:
            mlp = 2 * d * self.d_ff + self.d_ff + d
            attn += h * (self.n_heads * 2 + self.n_kv_heads * 2) - h * self.n_heads + d
            norms = 4 * d
            extra = 2 * d
            pos = self.max_seq_len * d
        head = 0 if self.tie_embeddings else d * self.vocab_size
        return self.vocab_size * d + pos + self.n_layers * (attn + mlp + norms) + extra + head
