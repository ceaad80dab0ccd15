"""Targets: where a program's memory is measured.

A :class:`Target` is either a named NVIDIA GPU that XLA compiles for without the card being present
("deviceless": the CUDA compiler plugin and a ``GpuTargetConfigProto`` describing the card), the CPU
host, or the local devices. It hands out the :class:`jax.sharding.Mesh` and
:class:`jax.sharding.NamedSharding` that abstract arguments (``jax.ShapeDtypeStruct``) carry, so
that ``jax.jit(f).lower(*args).compile().memory_analysis()`` reports the memory of that GPU.

Example:
  >>> import remat_kit.targets as rkt
  >>> t = rkt.target("h100")
  >>> t.name, t.memory_bytes
  ('h100-80gb', 85018542080)
  >>> x = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16, sharding=t.sharding())
  >>> x.sharding.mesh.devices.shape  # one H100 this machine need not have
  (1,)
"""

from remat_kit.errors import TargetError
from remat_kit.targets.core import (
    Target,
    as_target,
    check_deviceless,
    cudnn_attention_available,
    target,
    target_names,
)
from remat_kit.targets.custom import custom_target, target_from_config
from remat_kit.targets.platform import configure_for_deviceless
from remat_kit.targets.runtime import DEFAULT_MEM_FRACTION, Runtime, runtime_from_env

__all__ = [
    "DEFAULT_MEM_FRACTION",
    "Runtime",
    "Target",
    "TargetError",
    "as_target",
    "check_deviceless",
    "configure_for_deviceless",
    "cudnn_attention_available",
    "custom_target",
    "runtime_from_env",
    "target",
    "target_from_config",
    "target_names",
]
