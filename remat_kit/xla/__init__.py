"""What XLA says about a compiled program: its memory, its remat pass, its log and its kernels.

:func:`compile_memory` compiles a lowered program and reads the memory analysis, the lines XLA's
rematerialization pass logs and (from the optimized HLO) the kernels the step launches:
:func:`kernels_of` turns that HLO into :class:`Kernel` records, which
:mod:`remat_kit.timing` prices on a device's rates. :func:`read_hlo` is the one reader of HLO
text (the kernels and the peak inspector's dump both go through it). Everything here reads
XLA's output; nothing here decides.

Example:
  >>> import jax, jax.numpy as jnp
  >>> x = jax.ShapeDtypeStruct((256, 512), jnp.float32)
  >>> mem = compile_memory(jax.jit(lambda a, b: a @ b.T).lower(x, x))
  >>> mem.argument_bytes, [k.kind for k in mem.kernels if k.kind == "gemm"]
  (1048576, ['gemm'])
"""

from remat_kit.xla._compile import (
    CompiledMemory,
    captured_stderr,
    compile_memory,
    compile_with,
    over_device_memory,
    parse_xla_log,
    xla_peak,
)
from remat_kit.xla._hlo import HloInstruction, HloModule, named_operands, read_hlo, shape_of
from remat_kit.xla._kernel import KINDS, Kernel
from remat_kit.xla._kernels import kernels_of

__all__ = [
    "KINDS",
    "CompiledMemory",
    "HloInstruction",
    "HloModule",
    "Kernel",
    "captured_stderr",
    "compile_memory",
    "compile_with",
    "kernels_of",
    "named_operands",
    "over_device_memory",
    "parse_xla_log",
    "read_hlo",
    "shape_of",
    "xla_peak",
]
