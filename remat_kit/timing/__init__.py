"""Step time from the compiled program: the kernels it launches, priced on the device's rates.

:func:`kernels_of` (from :mod:`remat_kit.xla`, where the kernel record lives) reads the
optimized HLO of a compile (the one the memory analysis already made); :func:`speed_of` gives a
GPU target's rates; :func:`step_time` adds the kernels up into a :class:`StepTime` (seconds,
tokens/s, MFU, and where the time goes, recomputation included).

Example:
  >>> import jax, jax.numpy as jnp, remat_kit as rk
  >>> x = jax.ShapeDtypeStruct((2048, 2048), jnp.bfloat16)
  >>> text = jax.jit(lambda a: jnp.tanh(a @ a)).lower(x).compile().as_text()
  >>> t = rk.timing.step_time(rk.timing.kernels_of(text), rk.timing.speed_of(rk.target("h100")))
  >>> t.seconds > t.matmul_seconds > 0
  True
"""

from remat_kit.timing._model import StepTime, fresh_bytes_of, measure_cpu_speed, step_time
from remat_kit.timing._program import Launch, ProgramTimeline, program_timeline
from remat_kit.timing._speed import Speed, speed_of
from remat_kit.timing._traced import BYTES_PER_ELEMENTWISE_FLOP, traced_seconds
from remat_kit.timing._xla_schedule import (
    XlaEstimate,
    analytical_estimator_runs,
    read_schedule,
    xla_estimate,
)
from remat_kit.xla import KINDS, Kernel, kernels_of

__all__ = [
    "BYTES_PER_ELEMENTWISE_FLOP",
    "KINDS",
    "Kernel",
    "Launch",
    "ProgramTimeline",
    "Speed",
    "StepTime",
    "XlaEstimate",
    "analytical_estimator_runs",
    "fresh_bytes_of",
    "kernels_of",
    "measure_cpu_speed",
    "program_timeline",
    "read_schedule",
    "speed_of",
    "step_time",
    "traced_seconds",
    "xla_estimate",
]
