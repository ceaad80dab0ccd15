"""A new kind of model source, whole: one module and one registration (an entry point).

A toy MLP language model asked for by name, ``--model toy-<width>``. Its kind claims the names
that start with ``toy-`` (the presets, a fallback, claim the other names without a colon); its
request is :class:`ToySpec`; its source is a factory's (``rk.sources.from_factory``), so the one
pipeline measures it like any other. It brings flags of its own, ``--toy-tokens`` (the spec's
``tokens``) and the switch ``--toy-norm`` (``norm``), takes the shared ``--layers``, and brings
a note, :data:`SMALL`, worded by its own words. Registered in
``toy_kinds-0.dist-info/entry_points.txt``::

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
    tokens: int = 256
    norm: bool = False

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
    tokens: int = 256
    norm: bool = False

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.tokens, self.width)(tokens)
        block = rk.remat(_Block, self.policy)
        for _ in range(self.layers):
            x = block(self.width)(x)
        if self.norm:
            x = nn.LayerNorm()(x)
        return nn.Dense(self.tokens)(x)


#: ``--toy-tokens``: the toy's vocabulary (a BadValue about ``tokens`` names this flag).
TOKENS = rk.sources.Option(
    "--toy-tokens", "tokens", "the toy's vocabulary", type="positive_int", params=("tokens",)
)

#: ``--toy-norm``: a switch (no value): given, a LayerNorm before the head.
NORM = rk.sources.Option("--toy-norm", "norm", "a LayerNorm before the head", type="switch")

#: The toy is no real model: said with its width.
SMALL = rk.notes.NoteKind(
    "toy_small", ("width",), lambda d: f"toy-{d['width']} is a toy: its figures fit no real model"
)


def _resolve(spec: ToySpec) -> rk.sources.StepSource:
    if spec.tokens < 2:
        raise rk.BadValue(
            f"tokens={spec.tokens}: a toy predicts among 2 tokens or more", param="tokens"
        )
    width = int(spec.model.removeprefix("toy-"))
    source = rk.sources.from_factory(
        lambda policy: _Toy(width, spec.layers, policy, spec.tokens, spec.norm)
    )
    return dataclasses.replace(source, spec=spec.name)  # its name in titles


TOY = rk.sources.SourceKind(
    "toy",
    ToySpec,
    _resolve,
    "model",
    claims=lambda name: name.startswith("toy-"),
    options=(rk.sources.LAYERS, TOKENS, NORM),
    notes=(SMALL,),
)
