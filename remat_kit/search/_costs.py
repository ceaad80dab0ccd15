"""The planner's cost model (step 2 of :func:`remat_kit.search.plan`).

Nothing here compiles: bytes come from traced residuals, costs from traced FLOPs, both cached in
the :class:`~remat_kit.sources._workload.Workload`.

**The cost model** (:class:`CostModel`, built by :func:`cost_model`) starts from "save every
tagged tensor" and traces one step per tag with that tag recomputed. Every tag ``u`` then has

- ``size[u]``: its residual bytes over all layers when it is kept;
- ``needed[u]``: whether the backward pass reads it when every tag is saved. A tag that is not
  needed can become needed when another is recomputed: ``attn_out = x + out_proj`` is kept, so
  ``out_proj`` is not, until ``attn_out`` is recomputed from it. ``needs[t]`` lists the tags
  that recomputing ``t`` makes needed (the tags whose bytes grew in ``t``'s trace);
- ``cost[u]``: the FLOPs of recomputing it (for a tag needed only through another, traced with
  both recomputed);
- ``spill[t]``: untagged bytes that recomputing ``t`` leaves behind (the scan carry that stands
  in for ``decoder_layer_input``), so a single move is exactly what its trace says.

A plan decides, per tag, ``save`` / ``recompute`` / ``offload``, possibly differently in the first
``k`` layers (a ``layers`` schedule). Its device bytes are the untagged residuals plus the bytes
of every needed tag it saves plus its spills, its host bytes those of every needed tag it
offloads, its FLOPs those of every needed tag it recomputes, each per layer group in proportion
to the group's layers. Its overhead is recompute FLOPs against the step without remat, plus the
host round trip that does not hide behind ``hide`` x the step's compute (as
:meth:`Workload.overhead_of` counts it for a compiled report).

On a Llama block this is exact for every pair of tags: traced, all pairs of llama3-8b's tags
(13 with einsum attention, 12 with flash attention) are additive but ``attn_out`` /
``out_proj``, which the model captures.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping, Sequence

from remat_kit.policies import NO_REMAT, Policy, policy
from remat_kit.schedules import NO_SCHEDULE
from remat_kit.sources._workload import DEFAULT_HIDE, Workload

__all__ = [
    "CostModel",
    "Estimate",
    "cost_model",
    "tag_policy",
]


def tag_policy(save: Sequence[str], offload: Sequence[str]) -> Policy:
    """The ``names`` (or ``offload``) policy that saves ``save`` and offloads ``offload``.

    With nothing saved or offloaded that is ``full``.

    Example:
      >>> tag_policy(["query_proj"], []).spec
      'names:save=query_proj'
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the user's own tags, outside the vocabulary, are fine
        if offload:
            return policy("offload", offload=list(offload), save=list(save))
        # Saving no tagged tensor is what "full" means; name it so.
        return policy("names", save=list(save)) if save else policy("full")


@dataclasses.dataclass(frozen=True)
class Estimate:
    """What the cost model says of one assignment.

    Attributes:
      device_bytes: residual bytes kept on the device (traced bytes, model).
      host_bytes: residual bytes offloaded to host memory.
      flops: FLOPs of the step.
      recompute_overhead: ``flops / baseline - 1``.
      overhead: the objective's recomputation (time or FLOPs, :attr:`CostModel.objective`)
        plus the host transfer that does not hide behind compute.
    """

    device_bytes: float
    host_bytes: float
    flops: float
    recompute_overhead: float
    overhead: float


@dataclasses.dataclass(frozen=True)
class CostModel:
    """The planner's cost model of one step at one batch size (see the module docstring).

    Attributes:
      tags: the tags of the step, in trace order.
      n_layers: layers of the stack (per-layer figures are totals / ``n_layers``).
      saved_bytes: device residual bytes with every tag saved (traced).
      saved_flops: FLOPs of the step with every tag saved (traced).
      baseline_flops: FLOPs of the step without rematerialization.
      size: tag -> residual bytes over all layers when it is kept.
      needed: tag -> read by the backward pass when every tag is saved.
      needs: tag -> tags that recomputing it makes needed.
      spill: tag -> untagged device bytes that recomputing it adds.
      cost: tag -> FLOPs of recomputing it (when it is needed).
      offloadable: tags that may be offloaded (empty when offload is off or cannot be costed).
      weight: tag -> what recomputing it adds to the objective, as a fraction of the step
        without remat: its seconds at the target's rates (``time``) or its FLOPs (``flops``).
      saved_weight: the objective's overhead of the step with every tag saved (the
        recomputation that no tag decision removes), the same unit.
      objective: ``time`` or ``flops`` (``time`` on a target without rates falls back to
        ``flops``).
      step_seconds: the step's compute time without remat (None: unknown), as the objective
        estimates it (:meth:`Workload.step_seconds`).
      link_bandwidth: the host link, bytes/s per direction (None: unknown).
      hide: fraction of the step's compute time transfers may take and stay hidden.
    """

    tags: tuple[str, ...]
    n_layers: int
    saved_bytes: int
    saved_flops: float
    baseline_flops: float
    size: Mapping[str, int]
    needed: Mapping[str, bool]
    needs: Mapping[str, tuple[str, ...]]
    spill: Mapping[str, int]
    cost: Mapping[str, float]
    weight: Mapping[str, float]
    saved_weight: float = 0.0
    objective: str = "flops"
    offloadable: frozenset[str] = frozenset()
    step_seconds: float | None = None
    link_bandwidth: float | None = None
    hide: float = DEFAULT_HIDE

    @property
    def untagged_bytes(self) -> int:
        """Device residual bytes no tag decision changes (arguments, the scan carry, ...)."""
        return self.saved_bytes - sum(self.size[u] for u in self.tags if self.needed[u])

    def can_be_needed(self, tag: str) -> bool:
        """The tag is needed when every tag is saved, or some recompute makes it needed."""
        return self.needed[tag] or any(tag in self.needs[t] for t in self.tags)

    def evaluate(
        self,
        decisions: Mapping[str, str],
        first: Mapping[str, str] | None = None,
        layers: int = 0,
    ) -> Estimate:
        """The model's figures for ``decisions`` (and ``first`` in the first ``layers`` layers).

        Args:
          decisions: tag -> ``save`` | ``recompute`` | ``offload``; missing tags are saved.
          first: the decisions of the first ``layers`` layers, when they differ.
          layers: how many layers follow ``first``.

        Returns:
          The Estimate.

        Example:
          >>> m = cost_model(w, 2, offload=False, hide=0.5)
          >>> m.evaluate({}).device_bytes - m.evaluate({"mlpwi_1": "recompute"}).device_bytes
          3968.0
        """
        groups = [(decisions, 1.0)]
        if layers and first is not None:
            frac = layers / self.n_layers
            groups = [(first, frac), (decisions, 1.0 - frac)]
        dev, host = float(self.untagged_bytes), 0.0
        flops, weight = float(self.saved_flops), self.saved_weight
        for dec, w in groups:
            rec = {t for t in self.tags if dec.get(t, "save") == "recompute"}
            for u in self.tags:
                need = self.needed[u] or any(u in self.needs[t] for t in rec)
                d = dec.get(u, "save")
                if need and d == "save":
                    dev += w * self.size[u]
                elif need and d == "offload":
                    host += w * self.size[u]
                elif need:
                    flops += w * self.cost[u]
                    weight += w * self.weight[u]
            dev += w * sum(self.spill[t] for t in rec)
        recompute = flops / self.baseline_flops - 1.0
        return Estimate(dev, host, flops, recompute, weight + self.exposed(host))

    def exposed(self, host_bytes: float) -> float:
        """Transfer time of ``host_bytes`` beyond what hides behind compute, per step time."""
        if host_bytes <= 0:
            return 0.0
        if not self.step_seconds or not self.link_bandwidth:
            return math.inf
        transfer = 2.0 * host_bytes / self.link_bandwidth
        return max(0.0, transfer - self.hide * self.step_seconds) / self.step_seconds


def cost_model(
    workload: Workload, batch: int, *, offload: bool, hide: float, objective: str = "time"
) -> CostModel:
    """Traces the cost model of ``workload`` at ``batch`` (cached in the workload).

    One trace with every tag saved, one per tag with that tag recomputed, and one per tag that
    only another's recompute makes needed (with both recomputed): ``2 + 2 * tags`` traces of
    residuals and FLOPs at most, no compile.

    Args:
      workload: the step (needs residuals: ``Workload.plannable``).
      batch: the batch size.
      offload: allow offloading (only where the target's host link and peak FLOPs are known).
      hide: fraction of the step's compute time transfers may take and stay hidden.
      objective: ``time`` (each tag's recomputation at the target's rates, offload at the
        host link's measured efficiency and not hidden, as :mod:`remat_kit.timing` prices a
        compiled step; ``hide`` is then 0) or ``flops``.

    Returns:
      The CostModel.

    Raises:
      BadValue: the workload has no residuals (``Workload.plannable``).

    Example:
      >>> m = cost_model(w, 2, offload=False, hide=0.5)
      >>> m.tags, m.size["mlpwi_1"]
      (('mlpwi_1', 'mlpwo'), 4096)
      >>> round(m.evaluate({"mlpwi_1": "recompute"}).recompute_overhead, 3)
      0.082
    """
    key = ("cost_model", batch, offload, hide, objective)
    if key in workload.memo:
        return workload.memo[key]
    # One decision per value: a value a model names twice (its own name and ours beside it,
    # MaxText's MoE names) is saved or recomputed under its first name.
    traced = workload.traced_residuals(NO_REMAT, NO_SCHEDULE, batch)
    every: tuple[str, ...] = ()
    for t in traced.tags:
        if not set(traced.same.get(t, ())) & set(every):
            every += (t,)
    # A tag outside every checkpoint (the head after the stack) is kept whatever the policy
    # says: no decision is made for it, so no plan names it (the traces below save it, which
    # changes nothing). The first of them says which tags a checkpoint holds; where none
    # does (a model that ignores its policy), every tag stays.
    inside = workload.traced_residuals(tag_policy(every, ()), NO_SCHEDULE, batch).checkpointed
    present = tuple(
        t for t in every if not inside or t in inside or set(traced.same.get(t, ())) & inside
    )

    timed = objective == "time" and workload.traced_seconds(NO_REMAT, NO_SCHEDULE, batch)
    base_cost = (
        workload.traced_seconds(NO_REMAT, NO_SCHEDULE, batch) if timed else workload.baseline(batch)
    )

    def trace(recomputed: Sequence[str]) -> tuple[int, float, dict[str, int], float]:
        pol = tag_policy([t for t in every if t not in recomputed], ())
        res = workload.traced_residuals(pol, NO_SCHEDULE, batch)
        kept = {
            name: sum(
                r.nbytes
                for r in res.residuals
                if r.kind == "saved" and (r.name == name or r.name in res.same.get(name, ()))
            )
            for name in present
        }
        flops = workload.traced_flops(pol, NO_SCHEDULE, batch)
        cost = workload.traced_seconds(pol, NO_SCHEDULE, batch) if timed else flops
        return res.bytes_by("saved"), flops, kept, cost / base_cost

    def saving(nbytes: int) -> float:
        # A residual kept is written in the forward pass and read in the backward: recomputing
        # it saves that traffic (what makes `full` faster than `none` on an H100 for
        # gpt2-medium, measured), as a fraction of the step.
        return 2.0 * nbytes / workload.speed.bytes_per_s() / base_cost if timed else 0.0

    base_bytes, base_flops, base_kept, base_weight = trace(())
    needed = {u: base_kept[u] > 0 for u in present}
    size = dict(base_kept)
    needs: dict[str, tuple[str, ...]] = {}
    spill: dict[str, int] = {}
    cost: dict[str, float] = {}
    weight: dict[str, float] = {}
    singles = {t: trace((t,)) for t in present}
    for t, (_, f, kept, _) in singles.items():
        grown = tuple(u for u in present if u != t and kept[u] > base_kept[u])
        needs[t] = grown
        for u in grown:
            size[u] = max(size[u], kept[u])
        cost[t] = max(0.0, f - base_flops) if needed[t] else 0.0
    for t, (b, _, kept, wt) in singles.items():
        weight[t] = wt - base_weight - saving(size[t]) if needed[t] else 0.0
        freed = base_bytes - b
        growth = sum(kept[u] - base_kept[u] for u in needs[t])
        spill[t] = (size[t] if needed[t] else 0) - growth - freed
    for u in present:
        if needed[u]:
            continue
        via = next((t for t in present if u in needs[t]), None)
        if via is not None:
            # Needed only when ``via`` is recomputed: its cost is the pair's beyond via's own.
            pair = trace((via, u))
            cost[u] = max(0.0, pair[1] - singles[via][1])
            weight[u] = pair[3] - singles[via][3] - saving(size[u])
    step = workload.step_seconds(batch, "time" if timed else "flops")
    link = workload.target.host_link_bandwidth
    if timed and workload.speed.host_link:
        # As the compiled time model prices offload: at the link's measured efficiency and
        # not hidden (XLA did not overlap offload copies with compute on an H100).
        link = workload.speed.host_link * workload.speed.host_link_efficiency
        hide = 0.0
    can_offload = offload and bool(step) and bool(link)
    model = CostModel(
        tags=present,
        n_layers=max(1, int(workload.n_layers)),
        saved_bytes=base_bytes,
        saved_flops=base_flops,
        baseline_flops=workload.baseline(batch),
        size=size,
        needed=needed,
        needs=needs,
        spill=spill,
        cost=cost,
        weight=weight,
        saved_weight=base_weight - 1.0,
        objective="time" if timed else "flops",
        offloadable=frozenset(u for u in present if can_offload and size[u] > 0),
        step_seconds=step,
        link_bandwidth=link,
        hide=hide,
    )
    workload.memo[key] = model
    return model
