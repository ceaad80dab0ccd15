"""Factories whose import sets the process environment (``tests/data/envlib``), for the tests
that remat-kit names who set it."""

import sys

import flax.linen as nn

sys.modules.pop("envlib", None)  # imported afresh on every load, as in a new process
import envlib  # noqa: E402, F401


class _Tiny(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        return nn.Dense(64, name="lm_head")(nn.Embed(64, 16)(tokens))


def tiny(policy):
    """An embedding and a head; the import above set the allocator's fraction."""
    return _Tiny()
