"""What a GPU costs per token: predicted tokens/s of ``advise``'s answers priced per GPU-hour.

:func:`cost_of` turns one :class:`~remat_kit.search.Advice` (and, where one GPU does not fit,
the :class:`~remat_kit.search.ScaleOut` count that does) into a :class:`Cost`: GPUs billed,
tokens/s, the price used and dollars per million tokens. :func:`rank_costs` orders targets by
cost or by speed, those without a figure last.

Example (an Advice's fields that count here; ``rk.advise`` returns whole ones):
  >>> import types
  >>> a = types.SimpleNamespace(target="h100-80gb", devices=1, fits=True,
  ...                           tokens_per_second=10_000.0)
  >>> c = cost_of(a)
  >>> c.gpus, round(c.usd_per_million_tokens, 4), c.price.provider
  (1, 0.1108, 'RunPod (Secure Cloud)')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from remat_kit.errors import BadValue
from remat_kit.targets import Price, billed_units, cost_per_million_tokens, price_for

if TYPE_CHECKING:
    from remat_kit.search._advise import Advice, ScaleOut

__all__ = [
    "RANKINGS",
    "Cost",
    "cost_of",
    "rank_costs",
]

#: How :func:`rank_costs` may order targets: dollars per million tokens, tokens/s, or as given.
RANKINGS = ("cost", "speed", "name")


@dataclasses.dataclass(frozen=True)
class Cost:
    """What training on one target costs per token.

    Attributes:
      target: the target's name.
      gpus: devices the step runs on: the step's own, or the scale-out count where one did
        not fit; billed per GPU, or per chip on a TPU (:func:`~remat_kit.targets.billed_units`).
      tokens_per_second: predicted, all ``gpus`` together (None: nothing fits, or no rates).
      price: the price of one GPU-hour (a TPU's: one chip-hour) used (None: no price known).
      usd_per_million_tokens: dollars per million tokens (None without tokens/s or price).
      scaled: the figures are the scale-out's (``gpus`` GPUs, fsdp + full).
    """

    target: str
    gpus: int
    tokens_per_second: float | None
    price: Price | None
    usd_per_million_tokens: float | None
    scaled: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, the price as ``Price.to_dict()``."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["price"] = None if self.price is None else self.price.to_dict()
        return out


def cost_of(
    advice: Advice,
    scale_out: ScaleOut | None = None,
    prices: Mapping[str, Price] | None = None,
) -> Cost:
    """The cost per token of one target: from its plan when one GPU (or ``--gpus``) fits,
    else from the scale-out's GPU count.

    Args:
      advice: the target's advice.
      scale_out: the fewest GPUs that fit where ``advice`` does not (or None).
      prices: user prices that win over the shipped table
        (:func:`remat_kit.targets.parse_prices`, ``load_prices``).

    Returns:
      The :class:`Cost`.
    """
    gpus, tps, scaled = advice.devices, advice.tokens_per_second, False
    if not advice.fits and scale_out is not None and scale_out.devices:
        gpus, tps, scaled = scale_out.devices, scale_out.tokens_per_second, True
    price = price_for(advice.target, prices)
    usd = None
    if price is not None and tps:
        # A TPU's price is per chip (two devices on TPU7x), a GPU's per device.
        usd = cost_per_million_tokens(price, billed_units(advice.target, gpus), tps)
    return Cost(advice.target, gpus, tps, price, usd, scaled)


def rank_costs(costs: Sequence[Cost], by: str = "cost") -> list[Cost]:
    """``costs`` ordered: cheapest per token first (``cost``), fastest first (``speed``), or
    as given (``name``); a target without the figure keeps its place after those with one.

    Raises:
      BadValue: ``by`` is not one of :data:`RANKINGS`.

    Example:
      >>> a, b = Cost("a", 1, 10.0, None, None), Cost("b", 1, 20.0, None, None)
      >>> [c.target for c in rank_costs([a, b], "speed")]
      ['b', 'a']
    """
    if by not in RANKINGS:
        raise BadValue(f"rank by {by!r}: valid are {', '.join(RANKINGS)}", param="rank")
    if by == "name":
        return list(costs)
    if by == "cost":
        known = [c for c in costs if c.usd_per_million_tokens is not None]
        known.sort(key=lambda c: c.usd_per_million_tokens)
        unknown = [c for c in costs if c.usd_per_million_tokens is None]
    else:
        known = [c for c in costs if c.tokens_per_second]
        known.sort(key=lambda c: -c.tokens_per_second)
        unknown = [c for c in costs if not c.tokens_per_second]
    return known + unknown
