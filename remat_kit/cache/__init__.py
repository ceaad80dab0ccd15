"""A persistent cache of compiled memory analyses: the same program twice is compiled once.

A compile for a GPU target costs seconds to tens of seconds; what it tells us (XLA's memory
analysis, what its remat pass did, its warnings) is a few hundred bytes of JSON. This package
keeps those bytes on disk, keyed by everything that determines them:

- the lowered program (sha256 of ``lowered.as_text()``: StableHLO with shapes, shardings and
  the policy's effect on the graph already in it; see :func:`fingerprint` for the one
  process-specific number it can hold);
- the target: name, kind, devices, hosts, its ``GpuTargetConfigProto`` text (which carries the
  device memory size XLA's remat pass works to) and the runtime (allocator fraction);
- compiler options passed by the caller, ``XLA_FLAGS`` and ``LIBTPU_INIT_ARGS`` (libtpu's flags);
- the jax, jaxlib and CUDA plugin versions, the fields of the stored record and the source of
  the code that derives it from the compile (XLA's log lines in words, the kernels).

A second kind of entry, :func:`remember`, keeps a whole answer (a report, a FLOP count) under
the *request* that produced it: the caller's options, the target, the source of the code that
builds the program (:func:`code_fingerprint`), the jax configuration and the versions. A warm
run then skips even tracing and lowering; any change to the code or the options is a miss,
and the program-level entry above still answers it without a compile when the program
turned out the same.

Entries are small JSON files under :func:`cache_dir` (``$REMAT_KIT_CACHE_DIR``, else
``$XDG_CACHE_HOME/remat_kit``, else ``~/.cache/remat_kit``). A write goes to a temporary file in
the same directory and is renamed into place (``os.replace``), so concurrent runs never read a
half-written entry; an entry that cannot be read or does not have the expected fields is
ignored and rewritten. ``REMAT_KIT_NO_CACHE=1``, :func:`set_enabled` ``(False)`` or the block
:func:`bypassed` (the CLI's ``--no-cache``) bypass it: nothing is read or written.

One concept per module, the data flowing one way:

- ``_store``: where entries live, their on-disk format, reading and writing one;
- ``_switch``: whether the cache is read and written (``REMAT_KIT_NO_CACHE``, ``--no-cache``);
- ``_fingerprint``: stable digests of a lowered program's text and of a package's source;
- ``_keys``: the key of a compile and of a request (what goes into each);
- ``_entries``: the two kinds of entry, remembered and read back (:func:`compiled_memory`,
  with what :func:`dump_read` reads off a compile's dump, and :func:`remember`).

Example:
  >>> import jax, jax.numpy as jnp
  >>> from remat_kit import cache, target
  >>> low = jax.jit(lambda a: a @ a).lower(jax.ShapeDtypeStruct((8, 8), jnp.float32))
  >>> cache.compiled_memory(low, target("cpu")).argument_bytes
  256
"""

from remat_kit.cache._entries import DumpRead, compiled_memory, compiles, dump_read, remember
from remat_kit.cache._fingerprint import code_fingerprint, fingerprint
from remat_kit.cache._keys import (
    KERNEL_CACHE_OPTION,
    STUB_MARK,
    STUB_OPTION,
    entry_key,
    key_options,
    request_key,
)
from remat_kit.cache._store import ENV_DIR, cache_dir, dir_problem, load, store
from remat_kit.cache._switch import ENV_OFF, bypassed, enabled, set_enabled

__all__ = [
    "ENV_DIR",
    "ENV_OFF",
    "KERNEL_CACHE_OPTION",
    "STUB_MARK",
    "STUB_OPTION",
    "DumpRead",
    "bypassed",
    "cache_dir",
    "code_fingerprint",
    "compiled_memory",
    "compiles",
    "dir_problem",
    "dump_read",
    "enabled",
    "entry_key",
    "fingerprint",
    "key_options",
    "load",
    "remember",
    "request_key",
    "set_enabled",
    "store",
]
