"""How a user's module is run for a train step: an NNX model behind linen's ``init`` /
``apply``, a module run inside contexts (tagging, a patched block) with its logits checked as
they are traced, Hugging Face's keyword inputs, and a linen module re-typed so that an
``nn.jit`` cache cannot replay another policy's trace.

Example:
  >>> hf_inputs(jnp.zeros((1, 3), jnp.int32))["attention_mask"].tolist()
  [[1, 1, 1]]
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

from remat_kit.errors import BadOutput, BadValue
from remat_kit.train import logits_of

__all__ = [
    "HF_INPUTS",
    "MADE_INPUTS",
    "Applied",
    "NNXModel",
    "auto_inputs",
    "check_logits",
    "hf_inputs",
    "retyped",
]

# Keyword inputs a Hugging Face Flax model needs beside the tokens (its rotary embedding
# indexes by position_ids; None is not accepted).
HF_INPUTS = ("attention_mask", "position_ids")


#: What a model's forward pass may require beside the tokens, by its parameter's name, and
#: what each is made of: unpadded sequences, so positions count from 0 and every token is in
#: segment 1; a cache is None (training); a required mask is the causal ``[batch, seq, seq]``
#: attention mask (gemma's ``attention_mask``, flax's examples), an ``input_mask`` the tokens'
#: ``[batch, seq]`` padding mask.
_POSITIONS = ("positions", "position_ids", "decoder_positions", "inputs_positions", "segment_pos")
_SEGMENTS = ("segment_ids", "decoder_segment_ids", "inputs_segmentation")
_CACHES = ("cache", "kv_cache", "past_key_values", "decode_cache")
_MASKS = ("attention_mask", "attn_mask", "mask")
_PADDING = ("input_mask", "padding_mask")
MADE_INPUTS = (*_POSITIONS, *_SEGMENTS, *_CACHES, *_MASKS, *_PADDING)


def auto_inputs(call: Callable[..., Any], spec: str = "the model") -> Any:
    """The inputs a module's ``__call__`` takes beside the tokens, made from the tokens.

    Hugging Face's keywords where it takes both (``attention_mask``, ``position_ids``: its
    mask is ``[batch, seq]``), and every other parameter it requires after the tokens, by name
    (:data:`MADE_INPUTS`: gemma's ``positions, cache, attention_mask``, MaxText's
    ``decoder_positions, decoder_segment_ids``); None where it requires none.

    Args:
      call: the module class's ``__call__`` (``self`` first, then the tokens).
      spec: the model's name for the message.

    Returns:
      ``tokens -> {name: value}``, or None.

    Raises:
      BadValue: a required parameter none of those names says how to make.

    Example:
      >>> def call(self, last_tokens, positions, cache, attention_mask): ...
      >>> made = auto_inputs(call)(jnp.zeros((2, 3), jnp.int32))
      >>> made["positions"].tolist()[0], made["cache"], made["attention_mask"].shape
      ([0, 1, 2], None, (2, 3, 3))
    """
    try:
        params = list(inspect.signature(call).parameters.values())[2:]  # self, tokens
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    required = [p.name for p in params if p.kind in kinds and p.default is p.empty]
    names = {p.name for p in params}
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    hf = var_kw or set(HF_INPUTS) <= names
    if hf:
        # Hugging Face's pair (its attention_mask is the [batch, seq] padding mask), and
        # anything else it requires.
        required = [n for n in required if n not in HF_INPUTS]
    if not required:
        return hf_inputs if hf else None
    unknown = [n for n in required if n not in MADE_INPUTS]
    if unknown:
        raise BadValue(
            f"{spec} requires {', '.join(unknown)} beside the tokens, which remat_kit cannot "
            "make from them (it makes positions, segment ids, caches and masks by their usual "
            "names: rk.sources.MADE_INPUTS); give them defaults, or wrap the model in a "
            "module that takes the tokens only",
            param="model",
        )
    made = functools.partial(_made, tuple(required))
    return (lambda tokens: {**hf_inputs(tokens), **made(tokens)}) if hf else made


def _made(names: tuple[str, ...], tokens: jax.Array) -> dict[str, Any]:
    b, s = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    causal = jnp.broadcast_to(jnp.tril(jnp.ones((s, s), jnp.bool_)), (b, s, s))
    out: dict[str, Any] = {}
    for name in names:
        if name in _POSITIONS:
            out[name] = positions
        elif name in _SEGMENTS:
            out[name] = jnp.ones((b, s), jnp.int32)
        elif name in _CACHES:
            out[name] = None
        elif name in _MASKS:
            out[name] = causal
        else:
            out[name] = jnp.ones((b, s), jnp.bool_)
    return out


def hf_inputs(tokens: jax.Array) -> dict[str, jax.Array]:
    """Hugging Face's keyword inputs for a batch of unpadded sequences.

    Args:
      tokens: int32 ``[batch, seq]``.

    Returns:
      ``attention_mask`` (all ones) and ``position_ids`` (``0 .. seq-1`` per row).

    Example:
      >>> hf_inputs(jnp.zeros((2, 3), jnp.int32))["position_ids"].tolist()
      [[0, 1, 2], [0, 1, 2]]
    """
    b, s = tokens.shape
    return {
        "attention_mask": jnp.ones((b, s), jnp.int32),
        "position_ids": jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s)),
    }


class NNXModel:
    """An NNX model behind linen's ``init``/``apply``: parameters in, logits out.

    Built from an abstract model (``nnx.eval_shape``), so no weight is allocated. Parameters
    (``nnx.Param``) are the trained state; the rest (RNG keys and counts, batch statistics)
    is a constant of the step.
    """

    def __init__(self, model: Any) -> None:
        self.graphdef, self.params, self.rest = nnx.split(model, nnx.Param, ...)

    def init(self, key: Any, *args: Any, **kwargs: Any) -> Any:
        shapes = nnx.to_pure_dict(self.params)  # State.to_pure_dict is deprecated (flax 0.12)
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def apply(self, variables: Any, *args: Any, rngs: Any = None, **kwargs: Any) -> Any:
        if rngs:
            raise BadValue(
                "an NNX model draws its random numbers from its own nnx.Rngs: build it with "
                "the streams it needs; rng_streams are for linen models"
            )
        params = jax.tree.map(lambda x: x, self.params)  # a copy to fill
        nnx.replace_by_pure_dict(params, variables)
        rest = jax.tree.map(_concrete, self.rest)
        return nnx.merge(self.graphdef, params, rest)(*args, **kwargs)


def check_logits(model: str, logits: Any, tokens: Any) -> None:
    """Raises unless ``logits`` is ``[batch, seq, vocab]`` for ``tokens`` ``[batch, seq]``.

    Reads shapes only: call it on traced (abstract) values, before a loss is computed.

    Args:
      model: the model's name for the message (a factory's ``file.py:NAME``).
      logits: what the model's output gave as logits.
      tokens: the tokens it was given.

    Raises:
      BadOutput: naming ``model``, the shape it returned and the one expected.

    Example:
      >>> check_logits("f.py:pooled", jnp.zeros((2, 256)), jnp.zeros((2, 16), jnp.int32))
      Traceback (most recent call last):
      remat_kit.errors.BadOutput: f.py:pooled returned logits of shape [2, 256] for tokens ...
    """
    shape, given = tuple(getattr(logits, "shape", ())), tuple(tokens.shape)
    if len(shape) == 3 and shape[:2] == given:
        return
    got = f"[{', '.join(map(str, shape))}]"
    raise BadOutput(
        f"{model} returned logits of shape {got} for tokens of shape "
        f"[{', '.join(map(str, given))}]: a model maps tokens [batch, seq] to logits [batch, "
        f"seq, vocab], here [{', '.join(map(str, given))}, vocab] (an array, or an output "
        "whose .logits has that shape)",
        model=model,
        shape=shape,
        tokens=given,
    )


def _concrete(x: Any) -> Any:
    if not isinstance(x, jax.ShapeDtypeStruct):
        return x
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        key = jax.random.key(0)
        return jax.random.split(key, x.shape) if x.shape else key
    return jnp.zeros(x.shape, x.dtype)


class Applied:
    """A module's ``init``/``apply`` run inside contexts (tagging, a patched block class).

    ``apply(variables, tokens, ...)`` checks the shape of the logits it returns (read by
    ``output``) as soon as they are traced, before any loss is computed from them.
    """

    def __init__(
        self,
        module: Any,
        contexts: Callable[[], contextlib.AbstractContextManager],
        spec: str = "the model",
        output: Callable[[Any], jax.Array] | None = None,
    ):
        self.module, self._contexts = module, contexts
        self.spec, self._output = spec, output or logits_of

    def init(self, *args: Any, **kwargs: Any) -> Any:
        with self._contexts():
            return self.module.init(*args, **kwargs)

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        with self._contexts():
            out = self.module.apply(*args, **kwargs)
        if len(args) > 1 and "method" not in kwargs:  # variables, tokens: the forward pass
            check_logits(self.spec, self._output(out), args[1])
        return out

    def __repr__(self) -> str:
        inner = getattr(self.module, "module", self.module)
        return f"{type(inner).__name__} (model source)"


def retyped(module: nn.Module) -> nn.Module:
    """``module`` as an instance of a new subclass of its class, fields unchanged.

    A model whose ``__call__`` is wrapped in ``nn.jit`` (gemma's ``Transformer``) caches its
    trace under the module's fingerprint: its class and fields, which a patched block class
    does not change. The trace made for the first policy would be replayed for every later
    one; a class of its own per build gives each policy a trace of its own.

    Args:
      module: a linen module as a factory returned it.

    Returns:
      An equal module (same fields) of a fresh subclass of its class.

    Example:
      >>> m = nn.Dense(4)
      >>> r = retyped(m)
      >>> type(r) is not nn.Dense and isinstance(r, nn.Dense), r.features
      (True, 4)
    """
    cls = type(module)
    sub = type(
        cls.__name__, (cls,), {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
    )
    fields = {
        f.name: getattr(module, f.name)
        for f in dataclasses.fields(module)
        if f.init and f.name not in ("parent", "name") and hasattr(module, f.name)
    }
    return sub(**fields)
