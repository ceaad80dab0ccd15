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

__all__ = ["ATTENTION_KINDS", "FAMILIES", "MLP_ACTIVATIONS", "ModelConfig", "blame_overrides"]

FAMILIES = ("llama", "gpt2")
ATTENTION_KINDS = ("xla", "cudnn", "auto")
#: The gated MLP's activation (Llama family): SwiGLU, or GeGLU (Gemma; tanh approximation).
MLP_ACTIVATIONS = ("silu", "gelu")

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
    policy: rk.Policy = "none"  # type: ignore[assignment]  # normalised in __post_init__
    schedule: rk.Schedule = "none"  # type: ignore[assignment]
    attention: str = "xla"
    lora_rank: int = 0
    lora_alpha: float = 16.0
    # Variants of the Llama family read from Hugging Face configs (models.hf): Qwen2's
    # biases on q/k/v, Gemma's GeGLU MLP and embeddings scaled by sqrt(d_model).
    qkv_bias: bool = False
    mlp_activation: str = "silu"
    embed_scale: bool = False

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
            mlp = 3 * d * self.d_ff
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
