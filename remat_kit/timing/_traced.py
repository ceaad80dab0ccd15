"""Step time of a traced (not compiled) step: its FLOPs by kind at the device's rates.

The planner weighs every tag's recomputation before anything is compiled, from the traced
step's :class:`~remat_kit.flops.FlopCount`. Counting all of it as FLOPs at peak is what made a
recomputed norm or SwiGLU look free: those are elementwise work, bound by memory bandwidth.
Here each kind is priced at its own rate:

- ``matmul``: at the device's large-product rate (:meth:`Speed.matmul_flops_per_s`);
- ``attention_kernel`` (cuDNN flash attention, counted backward 2.5x forward): at the forward
  and backward attention efficiencies, in that 1 : 2.5 proportion;
- ``other`` (elementwise arithmetic and reductions, one FLOP per output element): at
  :data:`BYTES_PER_ELEMENTWISE_FLOP` bytes of device-memory traffic each, over the memory rate.

The elementwise figure is a calibration, not a datasheet number: on llama3-8b (b4 s2048, bf16,
h100) the compiled time model (:func:`remat_kit.timing.step_time`) prices ``minimal``'s
recomputation, which is only elementwise work (norms, RoPE, SwiGLU), at 37.9 ms for 2.71e10
recomputed elementwise FLOPs: 1.40 ps each, 4.2 bytes at the H100's 3.0 TB/s (launch costs
included). ``full``'s recomputation, priced this way, comes out at 140 ms against the compiled
model's 132 ms (+6%).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from remat_kit.flops import FlopCount
    from remat_kit.timing._speed import Speed

__all__ = [
    "BYTES_PER_ELEMENTWISE_FLOP",
    "traced_seconds",
]

#: Device-memory bytes one elementwise FLOP of a traced step costs (see the module docstring).
BYTES_PER_ELEMENTWISE_FLOP = 4.0

# Flash attention's backward does 2.5x the forward's FLOPs (remat_kit.flops counts it so).
_ATTENTION_FORWARD_SHARE = 1.0 / 3.5


def traced_seconds(count: FlopCount, speed: Speed) -> float:
    """The compute time of a traced step: each kind of FLOP at its rate.

    Args:
      count: the step's FLOPs by kind (:func:`remat_kit.flops.count_flops`).
      speed: the device's rates (:func:`remat_kit.timing.speed_of`).

    Returns:
      Seconds (no launch costs, collectives or host transfers: what recomputation adds is
      compute).

    Example:
      >>> import remat_kit as rk
      >>> from remat_kit.flops import FlopCount
      >>> h100 = rk.timing.speed_of(rk.target("h100"))
      >>> dots = FlopCount(total=8e14, matmul=8e14, attention_kernel=0.0, other=0.0)
      >>> norms = FlopCount(total=8e10, matmul=0.0, attention_kernel=0.0, other=8e10)
      >>> round(traced_seconds(dots, h100), 3), round(traced_seconds(norms, h100), 3)
      (0.999, 0.106)
    """
    forward, backward = speed.attention_efficiency
    attention_rate = speed.peak_flops / (
        _ATTENTION_FORWARD_SHARE / forward + (1 - _ATTENTION_FORWARD_SHARE) / backward
    )
    return (
        count.matmul / speed.matmul_flops_per_s("bf16")
        + count.attention_kernel / attention_rate
        + count.other * BYTES_PER_ELEMENTWISE_FLOP / speed.bytes_per_s()
    )
