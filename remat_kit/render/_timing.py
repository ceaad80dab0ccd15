"""Words for a predicted step time (:class:`remat_kit.timing.StepTime`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from remat_kit._units import seconds as _seconds_words

if TYPE_CHECKING:
    from remat_kit.timing import StepTime

__all__ = [
    "step_time_words",
]


#: The split's parts as the line says them: what the step waits for, and why.
_WORDS = {
    "collective": "exposed collectives",
    "contention": "compute beside collectives",
}


def step_time_words(t: StepTime, tokens: int | None) -> str:
    """One line on a predicted step time: seconds, tokens/s, MFU and where the time goes.

    Example:
      >>> from remat_kit.timing import Kernel, speed_of, step_time
      >>> k = Kernel("gemm", count=1, flops=8e11, bytes=0, dtype="bf16")
      >>> step_time_words(step_time([k], speed_of(rk.target("h100"))), 2048)
      'step time (est.): 1.0 ms, 2,044,648 tok/s, MFU 81%: matmul 100%'
      >>> ag = Kernel("collective", count=1, flops=0.0, bytes=10**9, group=8, op="all-gather")
      >>> step_time_words(step_time([k, ag], speed_of(rk.target("h100"))), None)
      'step time (est.): 3.4 ms, MFU 24%: matmul 30%, exposed collectives 70%'
    """
    parts = [
        (_WORDS.get(name, name), seconds) for name, seconds in t.split().items() if seconds > 0
    ]
    where = ", ".join(f"{name} {seconds / t.seconds:.0%}" for name, seconds in parts if
                      seconds / t.seconds >= 0.005)  # fmt: skip
    line = f"step time (est.): {_seconds_words(t.seconds)}"
    if tokens:
        line += f", {t.tokens_per_second(tokens):,.0f} tok/s"
    line += f", MFU {t.mfu:.0%}: {where}"
    if t.recompute_seconds > 0:
        line += f"; recomputation {_seconds_words(t.recompute_seconds)}"
    return line
