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

from remat_kit.timing.model import StepTime, fresh_bytes_of, measure_cpu_speed, step_time
from remat_kit.timing.speed import Speed, speed_of
from remat_kit.xla import KINDS, Kernel, kernels_of

__all__ = [
    "KINDS",
    "Kernel",
    "Speed",
    "StepTime",
    "fresh_bytes_of",
    "kernels_of",
    "measure_cpu_speed",
    "speed_of",
    "step_time",
]
