"""A new kind of model source, whole: one module and one registration (an entry point).

A toy MLP language model asked for by name, ``--model toy-<width>``. Its kind claims the names
that start with ``toy-`` (the presets, a fallback, claim the other names without a colon); its
request is :class:`ToySpec`; its source is a factory's (``rk.sources.from_factory``), so the one
pipeline measures it like any other. Registered in ``toy_kinds-0.dist-info/entry_points.txt``::

    [remat_kit.sources]
    toy = toy_source:TOY
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn

import remat_kit as rk


@dataclasses.dataclass(frozen=True)
class ToySpec:
    """A toy model: its name gives the width; ``layers`` the depth."""

    model: str
    layers: int = 2

    @property
    def name(self) -> str:
        return self.model


class _Block(nn.Module):
    width: int

    @nn.compact
    def __call__(self, x):
        return x + nn.Dense(self.width)(nn.relu(nn.Dense(self.width)(x)))


class _Toy(nn.Module):
    width: int
    layers: int
    policy: rk.Policy

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(256, self.width)(tokens)
        block = rk.remat(_Block, self.policy)
        for _ in range(self.layers):
            x = block(self.width)(x)
        return nn.Dense(256)(x)


def _resolve(spec: ToySpec) -> rk.sources.StepSource:
    width = int(spec.model.removeprefix("toy-"))
    source = rk.sources.from_factory(lambda policy: _Toy(width, spec.layers, policy))
    return dataclasses.replace(source, spec=spec.name)  # its name in titles


TOY = rk.sources.SourceKind(
    "toy", ToySpec, _resolve, "model", claims=lambda name: name.startswith("toy-")
)
