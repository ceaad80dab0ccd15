"""What a JAX process on a GPU may really allocate, and the limit its compiler is given.

These are the rules of jaxlib's GPU runtime, read from its source (jax 0.10.x–0.12):

* The BFC allocator takes ``floor(total_memory * fraction)`` bytes of the card: the *total*
  memory that ``cuMemGetInfo`` reports, not the free memory (xla/pjrt/gpu/gpu_helpers.cc,
  ``CreateBFCAllocator``). The fraction is 0.75 unless ``XLA_CLIENT_MEM_FRACTION`` (or its
  older name ``XLA_PYTHON_CLIENT_MEM_FRACTION``) says otherwise
  (xla/pjrt/plugin/xla_gpu/xla_gpu_allocator_config.h: ``double memory_fraction = 0.75``;
  jaxlib/xla_client.py ``generate_pjrt_gpu_plugin_options``; jax docs "GPU memory
  allocation": "JAX will preallocate 75% of the total GPU memory"). This is
  ``device.memory_stats()["bytes_limit"]``. ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` changes
  when it is taken, not the limit. ``XLA_PYTHON_CLIENT_ALLOCATOR=platform`` has no pool: the
  process may use the card minus what lives outside XLA.
* Outside that pool live the CUDA context and the cuDNN/cuBLAS handles (cuBLAS *workspaces* are
  XLA temporaries, already in the figures). No jax or XLA source gives their size; about 300 MB
  is reported for a CUDA context with lazy module loading (CUDA >= 11.7, pytorch#107667). We
  reserve :data:`OUTSIDE_HEAP_BYTES` for them: it only bounds how high a fraction can go.
* A real process hands ``bytes_limit`` to XLA's compiler as the module's
  ``device_memory_size`` (jaxlib/py_client.cc), and XLA's rematerialization pass then works to
  ``(bytes_limit - parameters - outputs) * 0.95`` (xla/service/gpu/gpu_hlo_schedule.cc,
  ``GetSchedulerMemoryLimit``; slop factor 95). A deviceless compile has no module size, so XLA
  takes 80% of the target config's ``device_memory_size`` instead. Handing the deviceless
  compile ``device_memory_size = bytes_limit / 0.8`` therefore gives its remat pass exactly the
  limit the real process would (checked byte-exact against XLA's own log line).
* The 95 is ``xla_gpu_memory_limit_slop_factor`` (xla/debug_options_flags.cc, default 95), a
  debug option a compile takes like any other (``jax.jit(..., compiler_options=...)``). Both
  bases go through it, so a deviceless compile and a real process given the same factor work
  to the same limit; a lower factor is how one step asks XLA's pass for a tighter limit than
  its process's (what ``rk.auto`` uses for ``none`` under XLA's
  own pass at a budget: :attr:`remat_kit.targets.Target.slop_factor`, on a named GPU or a
  GPU in the process alike).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping

from remat_kit.errors import BadValue

__all__ = [
    "DEFAULT_MEM_FRACTION",
    "ENV_VARS",
    "OUTSIDE_HEAP_BYTES",
    "SLOP_FACTOR",
    "SLOP_OPTION",
    "Runtime",
    "compile_memory_size",
    "fraction_to_fit",
    "max_mem_fraction",
    "outside_heap_bytes",
    "runtime_from_env",
]

#: JAX's default share of the card for its allocator.
DEFAULT_MEM_FRACTION = 0.75

#: The values jaxlib 0.12 takes for ``XLA_PYTHON_CLIENT_ALLOCATOR`` (jaxlib/xla_client.py,
#: ``generate_pjrt_gpu_plugin_options``, which refuses any other as the GPU backend starts);
#: all but "platform" are given the memory fraction below.
ALLOCATORS = ("default", "platform", "bfc", "cuda_async", "vmm", "address")

#: The environment variables jaxlib reads for the fraction, preferred name first.
ENV_VARS = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")

#: What we keep free outside XLA's pool for the CUDA context and library handles (an
#: assumption documented above, not a measurement).
OUTSIDE_HEAP_BYTES = 512 * 2**20

#: XLA's default share, in percent, of (limit - inputs - outputs) its GPU scheduler and
#: rematerialization pass work to (xla/debug_options_flags.cc,
#: ``set_xla_gpu_memory_limit_slop_factor(95)``).
SLOP_FACTOR = 95

#: The debug option that sets it for one compile.
SLOP_OPTION = "xla_gpu_memory_limit_slop_factor"

# XLA takes this share of a deviceless target's device_memory_size as its base limit.
_DEVICELESS_BASE = 0.8


@dataclasses.dataclass(frozen=True)
class Runtime:
    """How a JAX process on the GPU allocates: the allocator and its share of the card.

    Attributes:
      mem_fraction: the BFC allocator's share of total memory; None for the platform
        allocator (no pool, no fraction).
      source: where the fraction came from: ``"default"``, an environment variable's name,
        ``"--mem-fraction"``, or ``"platform allocator"``.

    Example:
      >>> Runtime(0.9, "--mem-fraction").usable_bytes(80 * 2**30) == int(0.9 * 80 * 2**30)
      True
    """

    mem_fraction: float | None = DEFAULT_MEM_FRACTION
    source: str = "default"

    def __post_init__(self) -> None:
        f = self.mem_fraction
        if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float))):
            raise BadValue(
                f"memory fraction {f!r} must be a number in (0, 1]", param="mem_fraction"
            )
        if f is not None and not 0.0 < f <= 1.0:
            raise BadValue(
                f"memory fraction {f} from {self.source} must be in (0, 1]; JAX's default is "
                f"{DEFAULT_MEM_FRACTION}",
                param="mem_fraction",
            )

    def usable_bytes(self, memory_bytes: int) -> int:
        """What the process may allocate on a card of ``memory_bytes`` (``bytes_limit``)."""
        if self.mem_fraction is None:
            return max(0, memory_bytes - outside_heap_bytes(memory_bytes))
        return math.floor(memory_bytes * self.mem_fraction)

    def setting(self) -> str:
        """The environment setting that selects this runtime, e.g. ``XLA_..._FRACTION=0.75``."""
        if self.mem_fraction is None:
            return "XLA_PYTHON_CLIENT_ALLOCATOR=platform"
        return f"XLA_PYTHON_CLIENT_MEM_FRACTION={self.mem_fraction:g}"

    def to_dict(self) -> dict[str, object]:
        return {"mem_fraction": self.mem_fraction, "mem_fraction_source": self.source}


def max_mem_fraction(memory_bytes: int) -> float:
    """The highest fraction (2 decimals) that leaves :data:`OUTSIDE_HEAP_BYTES` free.

    Example:
      >>> max_mem_fraction(80 * 2**30)
      0.99
    """
    return math.floor(100 * (memory_bytes - outside_heap_bytes(memory_bytes)) / memory_bytes) / 100


def outside_heap_bytes(memory_bytes: int) -> int:
    """What we keep free outside XLA's pool on a card of ``memory_bytes``.

    :data:`OUTSIDE_HEAP_BYTES`, or a sixteenth of the card for toy targets smaller than 8 GiB
    (test models of a few MiB), so that their fractions stay meaningful.
    """
    return min(OUTSIDE_HEAP_BYTES, memory_bytes // 16)


def fraction_to_fit(nbytes: int, memory_bytes: int) -> float | None:
    """The smallest fraction (2 decimals) whose pool holds ``nbytes``; None if none can.

    Example:
      >>> fraction_to_fit(70 * 2**30, 80 * 2**30)
      0.88
      >>> fraction_to_fit(29 * 2**30, 100 * 2**30)  # 0.29 of it, in floats, is a byte short
      0.3
    """
    f = math.ceil(100 * nbytes / memory_bytes) / 100
    while math.floor(memory_bytes * f) < nbytes:  # guard the float rounding at the boundary
        f = round(f + 0.01, 2)
    return f if f <= max_mem_fraction(memory_bytes) else None


def compile_memory_size(memory_bytes: int, runtime: Runtime) -> int:
    """The ``device_memory_size`` a deviceless compile needs to see the runtime's limit.

    XLA's GPU compiler bases its rematerialization limit on ``floor(0.8 * size)`` when it
    compiles without a device, and on the allocator's ``bytes_limit`` in a real process; this
    is the size for which the two agree (see the module docstring).

    Example:
      >>> compile_memory_size(85018542080, Runtime())   # an H100 at JAX's default 0.75
      79704883200
    """
    if runtime.mem_fraction is None:
        return memory_bytes  # no module limit in the real process either: XLA takes 80% too
    limit = runtime.usable_bytes(memory_bytes)
    size = math.ceil(limit / _DEVICELESS_BASE)
    while math.floor(size * 80 / 100) > limit:
        size -= 1
    return size


def runtime_from_env(environ: Mapping[str, str] | None = None) -> Runtime:
    """The runtime a JAX process started with ``environ`` (default ``os.environ``) would get.

    Raises:
      BadValue: both fraction variables set (jaxlib refuses that too), one that is not a
        number in (0, 1], or an allocator jax does not know.

    Example:
      >>> runtime_from_env({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".9"}).mem_fraction
      0.9
      >>> runtime_from_env({}).source
      'default'
    """
    env = os.environ if environ is None else environ
    allocator = env.get("XLA_PYTHON_CLIENT_ALLOCATOR", "").strip().lower()
    if allocator == "platform":
        return Runtime(None, "platform allocator")
    if allocator not in ("", *ALLOCATORS):
        # jax refuses it as its GPU backend starts; here it would be read as the default.
        raise BadValue(
            f"XLA_PYTHON_CLIENT_ALLOCATOR={allocator!r} is not an allocator jax knows: "
            f"{', '.join(ALLOCATORS)}"
        )
    set_vars = [v for v in ENV_VARS if env.get(v, "").strip()]
    if len(set_vars) > 1:
        raise BadValue(f"both {' and '.join(set_vars)} are set; jax accepts only one of them")
    if not set_vars:
        return Runtime()
    name = set_vars[0]
    text = env[name].strip()
    try:
        value = float(text)
    except ValueError:
        raise BadValue(f"{name}={text!r} is not a number; e.g. {name}=0.9") from None
    return Runtime(value, name)
