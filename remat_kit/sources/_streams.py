"""The RNG streams a linen model draws from in training, found from flax's own refusal.

A linen model that trains with dropout asks its ``apply`` for a ``dropout`` stream; without
one flax raises ``InvalidRngError``, naming it. A train step is given every stream its model
asks for, as a training loop gives them (:meth:`remat_kit.sources.ModelSource.build_step`).

Example:
  >>> import flax.linen as nn, jax.numpy as jnp
  >>> class Dropping(nn.Module):
  ...     @nn.compact
  ...     def __call__(self, tokens):
  ...         x = nn.Embed(8, 4)(tokens)
  ...         return nn.Dense(8)(nn.Dropout(0.1, deterministic=False)(x))
  >>> streams_asked(Dropping(), None, 1, 4)
  ('dropout',)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import flax
import jax
import jax.numpy as jnp

__all__ = ["streams_asked"]


#: How flax names the stream a module asked for and did not get (``InvalidRngError``).
_ASKED = re.compile(r'needs PRNG for "([^"]+)"')


def streams_asked(
    module: Any, inputs: Callable[[Any], Mapping[str, Any]] | None, batch: int, seq: int
) -> tuple[str, ...]:
    """The streams ``module.apply`` asks for, traced (shapes only) at the step's
    micro-batch: each ``InvalidRngError`` names one, given on the next try. A model that
    fails otherwise is left to fail where the step is traced, with that trace's message."""
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    extra = inputs or (lambda t: {})
    try:
        params = jax.eval_shape(
            lambda k, t: module.init(k, t, **extra(t)), jax.random.key(0), tokens
        )
    except Exception:  # the step's own trace reports it
        return ()
    streams: list[str] = []
    while True:
        rngs = {name: jax.random.key(i) for i, name in enumerate(streams)}

        def forward(p: Any, t: jax.Array, rngs: Mapping[str, Any] = rngs) -> Any:
            return module.apply(p, t, **extra(t), rngs=rngs)

        try:
            jax.eval_shape(forward, params, tokens)
        except flax.errors.InvalidRngError as err:
            asked = _ASKED.search(str(err))
            if asked is None or asked.group(1) in streams:
                return tuple(streams)
            streams.append(asked.group(1))
            continue
        except Exception:  # the step's own trace reports it
            return tuple(streams)
        return tuple(streams)
