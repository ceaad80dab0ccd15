"""The planner's greedy sequence (steps 2 to 4 of :func:`remat_kit.search.plan`), traced only.

A :class:`State` says which tags a per-layer policy saves and which it offloads; the sequence
goes from "save every tagged tensor" to "save none", one move at a time, each move the one
freeing the most device bytes per extra FLOP. :class:`Positions` makes the sequence continuous
in layers. Nothing here compiles: bytes come from the traced residuals, costs from the traced
FLOPs, both cached in the :class:`~remat_kit.search.workload.Workload`.
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings
from collections.abc import Callable, Mapping, Sequence

from remat_kit.policies import Policy, policy
from remat_kit.schedules import Schedule
from remat_kit.schedules import schedule as _make_schedule
from remat_kit.search.workload import NO_REMAT, NO_SCHEDULE, Workload

#: A greedy step whose recompute costs less than this fraction of the step is "free".
_FREE_FLOPS = 1e-4


@dataclasses.dataclass(frozen=True)
class State:
    """One point of the greedy sequence: which tags are saved and which offloaded."""

    save: tuple[str, ...]
    offload: tuple[str, ...]
    device_bytes: int  # residual bytes kept on the device (traced)
    flops: float
    step: str  # how this state follows the previous one, e.g. "recompute mlpwi_0"

    @property
    def policy(self) -> Policy:
        return tag_policy(self.save, self.offload)


def tag_policy(save: Sequence[str], offload: Sequence[str]) -> Policy:
    """The ``names`` (or ``offload``) policy that saves ``save`` and offloads ``offload``.

    With nothing saved or offloaded that is ``full``.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the user's own tags, outside the vocabulary, are fine
        if offload:
            return policy("offload", offload=list(offload), save=list(save))
        # Saving no tagged tensor is what "full" means; name it so.
        return policy("names", save=list(save)) if save else policy("full")


def _state(
    workload: Workload, batch: int, save: Sequence[str], off: Sequence[str], step: str
) -> State:
    pol = tag_policy(save, off)
    res = workload._traced_residuals(pol, NO_SCHEDULE, batch)
    return State(
        tuple(save),
        tuple(off),
        res.bytes_by("saved"),
        workload._traced_flops(pol, NO_SCHEDULE, batch),
        step,
    )


def moves(workload: Workload, batch: int, cur: State) -> list[tuple[State, int]]:
    """Every state one recompute move away from ``cur``, with the device bytes it frees.

    A move recomputes one saved tag; when that only moves the bytes to tags it is computed
    from (``attn_out = x + out_proj`` keeps ``out_proj`` alive), those tags go with it.
    """

    def kept(st: State) -> dict[str, int]:
        res = workload._traced_residuals(st.policy, NO_SCHEDULE, batch)
        return {k: v["bytes"] for k, v in res.per_name().items() if v["kind"] != "offloaded"}

    out = []
    for tag in cur.save:
        rest = [t for t in cur.save if t != tag]
        nxt = _state(workload, batch, rest, cur.offload, f"recompute {tag}")
        freed = cur.device_bytes - nxt.device_bytes
        if freed <= 0:
            before, after = kept(cur), kept(nxt)
            grown = [t for t in rest if after.get(t, 0) > before.get(t, 0)]
            if not grown:
                continue
            move = (tag, *grown)
            nxt = _state(
                workload,
                batch,
                [t for t in cur.save if t not in move],
                cur.offload,
                f"recompute {'+'.join(move)}",
            )
            freed = cur.device_bytes - nxt.device_bytes
        if freed > 0:
            out.append((nxt, freed))
    return out


def sequence(workload: Workload, batch: int, *, offload: bool, hide: float) -> list[State]:
    """The greedy sequence of states (step 2 and 3 of :func:`plan`), cached in the workload."""
    key = ("sequence", batch, offload, hide)
    if key in workload._memo:
        return workload._memo[key]
    base = workload.baseline(batch)
    present = tuple(workload._traced_residuals(NO_REMAT, NO_SCHEDULE, batch).tags)

    def state(save: Sequence[str], off: Sequence[str], step: str) -> State:
        return _state(workload, batch, save, off, step)

    chain = [state(present, (), "save every tagged tensor")]
    while True:
        cur = chain[-1]
        scored = [
            ((freed / max(nxt.flops - cur.flops, 1e-9 * base), freed), i, nxt)
            for i, (nxt, freed) in enumerate(moves(workload, batch, cur))
        ]
        if not scored:
            break
        chain.append(max(scored, key=lambda item: item[:2])[2])

    window = _offload_window(workload, batch, hide) if offload else 0
    if window > 0 and len(chain) > 1:
        chain = _with_offload(workload, batch, chain, window, base, state)
    workload._memo[key] = chain
    return chain


def _offload_window(workload: Workload, batch: int, hide: float) -> int:
    """Bytes per step whose host round trip hides behind ``hide`` of the step's compute."""
    step = workload.step_seconds(batch)
    link = workload.target.host_link_bandwidth
    if not step or not link:
        return 0
    return int(hide * step * link / 2)


def _with_offload(
    workload: Workload,
    batch: int,
    chain: list[State],
    window: int,
    base: float,
    state: Callable[[Sequence[str], Sequence[str], str], State],
) -> list[State]:
    """Offloads, instead of recomputing, the costliest-per-byte tags that fit the window."""
    costs = [b.flops - a.flops for a, b in itertools.pairwise(chain)]
    n_free = 0
    while n_free < len(costs) and costs[n_free] <= _FREE_FLOPS * base:
        n_free += 1
    pivot = chain[n_free]
    # Single tags only: a compound step (attn_out+out_proj) is cheaper recomputed than moved.
    paid = [s.step.removeprefix("recompute ") for s in chain[n_free + 1 :]]
    paid = [t for t in paid if "+" not in t]
    if not paid:
        return chain
    kept = workload._traced_residuals(pivot.policy, NO_SCHEDULE, batch).per_name()
    chosen, used = [], 0
    for tag in reversed(paid):  # the most expensive to recompute per byte come last
        size = kept.get(tag, {}).get("bytes", 0)
        if size and used + size <= window:
            chosen.append(tag)
            used += size
    if not chosen:
        return chain
    out = chain[: n_free + 1]
    for tag in chosen:
        cur = out[-1]
        out.append(state([t for t in cur.save if t != tag], (*cur.offload, tag), f"offload {tag}"))
    for st in chain[n_free + 1 :]:
        move = st.step.removeprefix("recompute ").split("+")
        if move[0] in chosen and len(move) == 1:
            continue
        cur = out[-1]
        out.append(state([t for t in cur.save if t not in move], cur.offload, st.step))
    return out


class Positions:
    """Positions ``x = i * L + k`` along the greedy sequence (step 4 of :func:`plan`)."""

    def __init__(self, states: Sequence[State], n_layers: int) -> None:
        self.states, self.L = list(states), n_layers
        self.last = (len(self.states) - 1) * n_layers

    def split(self, x: int) -> tuple[int, int]:
        i, k = divmod(x, self.L)
        if i >= len(self.states) - 1:
            return len(self.states) - 1, 0
        return i, k

    def candidate(self, x: int) -> tuple[Policy, Schedule]:
        i, k = self.split(x)
        pol = self.states[i].policy
        if not k:
            return pol, NO_SCHEDULE
        # "rest" named too, so the schedule alone says what every layer does.
        layers = {range(0, k): self.states[i + 1].policy, "rest": pol}
        return pol, _make_schedule("layers", plan=layers)

    def device_bytes(self, x: int) -> float:
        i, k = self.split(x)
        a = self.states[i].device_bytes
        if not k:
            return float(a)
        return a + (self.states[i + 1].device_bytes - a) * k / self.L

    def predict(self, known: Mapping[int, int], x: int, penalty: int = 0) -> int:
        """Compiled peak at ``x`` from compiled neighbours: a secant on residual bytes."""
        left = max((p for p in known if p < x), default=None)
        right = min((p for p in known if p > x), default=None)
        bx = self.device_bytes(x)
        if left is not None and right is not None:
            bl, br = self.device_bytes(left), self.device_bytes(right)
            if bl != br:
                slope = min(max((known[left] - known[right]) / (bl - br), 0.25), 4.0)
                return int(known[right] + (bx - br) * slope) + penalty
        anchor = right if right is not None else left
        assert anchor is not None
        return int(known[anchor] + (bx - self.device_bytes(anchor))) + penalty
