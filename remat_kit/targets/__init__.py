"""Targets: where a program's memory is measured.

A :class:`Target` is either a named NVIDIA GPU that XLA compiles for without the card being present
("deviceless": the CUDA compiler plugin and a ``GpuTargetConfigProto`` describing the card), a
TPU slice libtpu compiles for the same way (``v5p-64``: libtpu's own topology of the slice), the
CPU host, or the local devices. It hands out the :class:`jax.sharding.Mesh` and
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
from remat_kit.targets._catalogue import ALIASES, GPU_FACTS
from remat_kit.targets._codegen import (
    PROCESS_FLAGS,
    analysis_options,
    end_process,
    kernel_dir_stowed,
    remove_kernel_dirs,
    set_process_flags,
)
from remat_kit.targets._core import Target, check_deviceless
from remat_kit.targets._custom import custom_target, target_from_config
from remat_kit.targets._named import (
    as_target,
    cudnn_attention_available,
    target,
    target_names,
)
from remat_kit.targets._nodes import NODES, Node, node, node_names
from remat_kit.targets._platform import check_platforms, configure_for_deviceless
from remat_kit.targets._prices import (
    PRICE_CAVEAT,
    PRICE_TABLE_DATE,
    PRICES,
    Price,
    billed_units,
    cost_per_million_tokens,
    load_prices,
    parse_prices,
    price_for,
)
from remat_kit.targets._slices import GENERATIONS as TPU_GENERATIONS
from remat_kit.targets._slices import Slice, device_word_of, is_slice_name, parse_slice
from remat_kit.targets._tpus import TPU_FACTS
from remat_kit.targets.runtime import DEFAULT_MEM_FRACTION, Runtime, runtime_from_env

__all__ = [
    "ALIASES",
    "DEFAULT_MEM_FRACTION",
    "GPU_FACTS",
    "NODES",
    "PRICES",
    "PRICE_CAVEAT",
    "PRICE_TABLE_DATE",
    "PROCESS_FLAGS",
    "TPU_FACTS",
    "TPU_GENERATIONS",
    "Node",
    "Price",
    "Runtime",
    "Slice",
    "Target",
    "TargetError",
    "analysis_options",
    "as_target",
    "billed_units",
    "check_deviceless",
    "check_platforms",
    "configure_for_deviceless",
    "cost_per_million_tokens",
    "cudnn_attention_available",
    "custom_target",
    "device_word_of",
    "end_process",
    "is_slice_name",
    "kernel_dir_stowed",
    "load_prices",
    "node",
    "node_names",
    "parse_prices",
    "parse_slice",
    "price_for",
    "remove_kernel_dirs",
    "runtime_from_env",
    "set_process_flags",
    "target",
    "target_from_config",
    "target_names",
]
