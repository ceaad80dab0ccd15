"""Precision regimes of a train step: the dtypes of weights, compute, gradients and optimizer state.

The regimes the field trains in (all-bf16; mixed: f32 master weights and optimizer state with bf16
compute; bf16 weights with f32 Adam moments; f32), as data, and the optax wrapper that keeps an
optimizer's whole state in one dtype (optax's ``mu_dtype`` covers Adam's first moment only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from remat_kit.errors import BadValue, unknown

__all__ = [
    "DEFAULT_PRECISION",
    "PRECISIONS",
    "Precision",
    "cast_floats",
    "precision",
    "regime",
    "with_state_dtype",
]

_SHORT_DTYPES: Mapping[str, Any] = {"bf16": jnp.bfloat16, "f32": jnp.float32, "f16": jnp.float16}


def _float_dtype(value: Any, what: str) -> jnp.dtype:
    # Regimes name dtypes the CLI way ("bf16"); numpy names and jnp dtypes work too.
    try:
        dtype = jnp.dtype(_SHORT_DTYPES.get(value, value) if isinstance(value, str) else value)
    except TypeError:
        dtype = None
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise BadValue(
            f"{what}={value!r} is not a floating dtype; use one of {', '.join(_SHORT_DTYPES)}"
        )
    return dtype


@dataclasses.dataclass(frozen=True)
class Precision:
    """A training precision regime: the dtype of each thing a train step holds.

    Gradients always have the dtype of the weights they belong to (JAX differentiates a bf16
    weight into a bf16 gradient), so ``grads`` is ``params``.

    Attributes:
      name: the regime, e.g. ``"mixed"`` (see ``PRECISIONS``); ``"custom"`` once changed.
      params: dtype of the trained weights: the copy the optimizer updates (master weights).
      compute: dtype the model computes in (matmul operands, activations). The module
        decides it: build the module with this dtype (``models.measure`` does);
        ``build_train_step`` records it and cannot enforce it on an arbitrary module.
      optimizer_state: dtype of the optimizer's floating state (Adam's two moments).
      frozen: dtype of weights that are not trained (LoRA's base weights).
      description: one line for listings.

    Example:
      >>> p = precision("mixed")
      >>> p.params.name, p.compute.name, p.grads.name, p.optimizer_state.name
      ('float32', 'bfloat16', 'float32', 'float32')
    """

    name: str
    params: Any
    compute: Any
    optimizer_state: Any
    frozen: Any
    description: str = ""

    def __post_init__(self) -> None:
        for field in ("params", "compute", "optimizer_state", "frozen"):
            object.__setattr__(self, field, _float_dtype(getattr(self, field), field))

    @property
    def grads(self) -> jnp.dtype:
        """The gradients' dtype: that of the trained weights."""
        return self.params

    def replace(self, **changes: Any) -> Precision:
        """A copy with ``changes``; named ``"custom"`` unless a name is given."""
        dtypes = {k: v for k, v in changes.items() if k not in ("name", "description")}
        if dtypes and "name" not in changes:
            changes = {**changes, "name": "custom", "description": ""}
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, str]:
        """JSON-ready: the name and every dtype by its numpy name (``"bfloat16"``)."""
        return {
            "name": self.name,
            "params": self.params.name,
            "compute": self.compute.name,
            "grads": self.grads.name,
            "optimizer_state": self.optimizer_state.name,
            "frozen": self.frozen.name,
        }


_BF16, _F32 = jnp.bfloat16, jnp.float32

#: The named regimes. ``mixed`` is what MaxText (weight_dtype=float32, dtype=bfloat16),
#: Levanter (mp=p=f32,c=bfloat16) and the Hugging Face Trainer (``bf16=True`` on an f32
#: model) train with; LoRA keeps its base weights in bf16 under every bf16 regime, and
#: under ``mixed`` its adapters in f32 (PEFT's ``autocast_adapter_dtype``).
PRECISIONS: Mapping[str, Precision] = {
    "mixed": Precision(
        "mixed",
        params=_F32,
        compute=_BF16,
        optimizer_state=_F32,
        frozen=_BF16,
        description="f32 master weights, gradients and optimizer state; bf16 compute",
    ),
    "bf16": Precision(
        "bf16",
        params=_BF16,
        compute=_BF16,
        optimizer_state=_BF16,
        frozen=_BF16,
        description="everything bf16: weights, gradients, optimizer state and compute",
    ),
    "bf16-f32-moments": Precision(
        "bf16-f32-moments",
        params=_BF16,
        compute=_BF16,
        optimizer_state=_F32,
        frozen=_BF16,
        description="bf16 weights and gradients, f32 optimizer state (Adam moments)",
    ),
    "f32": Precision(
        "f32",
        params=_F32,
        compute=_F32,
        optimizer_state=_F32,
        frozen=_F32,
        description="everything f32",
    ),
}

#: The regime reports use unless told otherwise: the field's convention for bf16 training.
DEFAULT_PRECISION = "mixed"


def precision(name: str | Precision) -> Precision:
    """A precision regime by name (see ``PRECISIONS``); a Precision passes through.

    Args:
      name: ``"mixed"``, ``"bf16"``, ``"bf16-f32-moments"`` or ``"f32"``, or a Precision.

    Returns:
      The Precision.

    Raises:
      UnknownName: not a regime (a ValueError naming the close matches).

    Example:
      >>> precision("bf16-f32-moments").optimizer_state.name
      'float32'
    """
    if isinstance(name, Precision):
        return name
    try:
        return PRECISIONS[name]
    except (KeyError, TypeError):
        raise unknown("precision", name, PRECISIONS, n=2, param="precision") from None


#: The weights' dtype alone, without a regime's name: the regime with those weights.
_REGIME_OF_WEIGHTS = {"float32": "mixed", "bfloat16": "bf16"}


def regime(
    name: str | Precision | None = None, *, params: Any = None, compute: Any = None
) -> Precision:
    """The regime a request names: by name, by the weights' dtype, with a compute dtype over it.

    ``params`` alone picks the regime with those weights (``f32`` -> ``mixed``, ``bf16`` ->
    ``bf16``: the older way to ask) and must agree with ``name`` when both are given;
    ``compute`` replaces the compute dtype (the regime is then ``"custom"``). Nothing given:
    :data:`DEFAULT_PRECISION`.

    Args:
      name: a regime name (``PRECISIONS``) or Precision, or None.
      params: the trained weights' dtype (``"f32"``, ``"bf16"``), or None.
      compute: the compute dtype, or None.

    Returns:
      The Precision.

    Raises:
      BadValue: an unknown regime or dtype, or ``params`` the regime contradicts.

    Example:
      >>> regime(params="f32").name, regime("bf16", compute="f32").compute.name
      ('mixed', 'float32')
    """
    if params is not None:
        weights = _float_dtype(params, "param_dtype")
        by_weights = _REGIME_OF_WEIGHTS.get(weights.name)
        if by_weights is None:
            raise BadValue(
                f"param_dtype={params!r}: use bf16 or f32 (or a precision: "
                f"{', '.join(PRECISIONS)})",
                param="param_dtype",
            )
        if name is not None and precision(name).params != weights:
            named = precision(name)
            raise BadValue(
                f"param_dtype={params} contradicts precision={named.name} (weights "
                f"{named.params.name}): drop param_dtype, or use precision={by_weights}",
                param="param_dtype",
            )
        name = name or by_weights
    chosen = precision(name or DEFAULT_PRECISION)
    if compute is not None:
        dtype = _float_dtype(compute, "dtype")
        if dtype != chosen.compute:
            chosen = chosen.replace(compute=dtype)
    return chosen


def cast_floats(tree: Any, dtype: Any) -> Any:
    # Abstract (ShapeDtypeStruct) or concrete leaves; integer leaves (step counts) are kept.
    def one(x: Any) -> Any:
        if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype == dtype:
            return x
        if isinstance(x, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(x.shape, dtype)
        return x.astype(dtype)

    return jax.tree.map(one, tree)


def with_state_dtype(
    inner: optax.GradientTransformation, dtype: Any
) -> optax.GradientTransformationExtraArgs:
    """``inner`` with its floating state (e.g. Adam's moments) kept in ``dtype``.

    optax's ``mu_dtype`` sets only Adam's first moment; the second follows the weights
    (optax 0.2.8 ``scale_by_adam``: ``nu = zeros_like(params)``). This wrapper initialises
    the state from the weights cast to ``dtype`` and casts the new state back to the old
    state's dtypes after each update, so every floating state leaf stays in ``dtype``
    whatever the weights' dtype. Gradients and weights enter the update in ``dtype``, so
    the update is the one ``inner`` computes on ``dtype`` copies; ``optax.apply_updates``
    casts it to the weights' dtype.

    Args:
      inner: any optax transformation.
      dtype: the state's floating dtype.

    Returns:
      The wrapped transformation.

    Example:
      >>> opt = with_state_dtype(optax.adamw(1e-4), jnp.float32)
      >>> state = opt.init({"w": jnp.zeros(3, jnp.bfloat16)})
      >>> state[0].mu["w"].dtype, state[0].nu["w"].dtype
      (dtype('float32'), dtype('float32'))
    """
    dtype = _float_dtype(dtype, "dtype")
    inner = optax.with_extra_args_support(inner)

    def init(params: Any) -> Any:
        return inner.init(cast_floats(params, dtype))

    def update(updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        # In ``dtype`` from the start: (1 - b1) * g on a bf16 gradient would round in bf16
        # before it reaches the f32 moment.
        up = cast_floats(updates, dtype)
        new_updates, new_state = inner.update(up, state, cast_floats(params, dtype), **extra)
        new_state = jax.tree.map(lambda new, old: new.astype(old.dtype), new_state, state)
        return new_updates, new_state

    return optax.GradientTransformationExtraArgs(init, update)
