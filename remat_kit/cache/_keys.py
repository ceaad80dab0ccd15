"""The key of an entry: sha256 over everything that determines what it holds.

A compile's key (:func:`entry_key`) names the lowered program, the target, the compiler
options (:func:`key_options`: the stand-in ``ptxas`` by what it is, not where it lives),
``XLA_FLAGS`` and ``LIBTPU_INIT_ARGS``, the jax, jaxlib and CUDA plugin versions, the fields of
the stored record and the source of the code that derives it from the compile (the
:mod:`remat_kit.xla` package). A request's key (:func:`request_key`) names what was asked, the
target and the rates the answer is priced at, the jax settings that change a traced program,
``XLA_FLAGS``, ``LIBTPU_INIT_ARGS`` and the versions.

Example:
  >>> from remat_kit import target
  >>> entry_key("module {}", target("cpu")) == entry_key("module {}", target("cpu"))
  True
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from remat_kit.cache._fingerprint import fingerprint
from remat_kit.cache._store import FORMAT
from remat_kit.xla import CompiledMemory

__all__ = [
    "KERNEL_CACHE_OPTION",
    "STUB_MARK",
    "STUB_OPTION",
    "entry_key",
    "key_options",
    "request_key",
]

#: What the ptxas stand-in's directory (remat_kit.targets._codegen) becomes in a key: its path
#: is the user's own, what it does is the same everywhere.
STUB_MARK = "ptxas-stand-in-1"
#: The compiler option that points XLA at the stand-in.
STUB_OPTION = "xla_gpu_cuda_data_dir"
#: The compiler option that names the file where XLA keeps the kernels it made
#: (:func:`remat_kit.targets._codegen.kernel_cache_file`): where they are kept changes no
#: figure, so no key sees it.
KERNEL_CACHE_OPTION = "xla_gpu_kernel_cache_file"


@functools.cache
def _versions() -> tuple[tuple[str, str], ...]:
    out = []
    for dist in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin"):
        try:
            out.append((dist, metadata.version(dist)))
        except metadata.PackageNotFoundError:
            out.append((dist, ""))
    return tuple(out)


@functools.cache
def _record_code() -> str:
    """sha256 of the code that turns a compile into the stored record: XLA's log lines become
    sentences and its HLO becomes kernels there, so a record written before that code changed
    would carry the old sentences and kernels (the program alone does not key them). That code
    is the :mod:`remat_kit.xla` package, every file of it."""
    root = Path(__file__).resolve().parents[1]  # remat_kit/, above this package
    digest = hashlib.sha256()
    for path in sorted((root / "xla").glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def entry_key(program_text: str, target: Any, options: Mapping[str, Any] | None = None) -> str:
    """The key of a compiled program: sha256 over all that determines its analysis.

    Args:
      program_text: the lowered program's text (``lowered.as_text()``).
      target: the ``rk.Target`` it is compiled for.
      options: compiler options the caller passes to the compile (None: none).

    Returns:
      64 hex digits.

    Example:
      >>> from remat_kit import target
      >>> entry_key("module {}", target("cpu")) == entry_key("module {}", target("cpu"))
      True
    """
    parts = {
        "format": FORMAT,
        "record": [f.name for f in dataclasses.fields(CompiledMemory)],
        "derived_by": _record_code(),
        "program": fingerprint(program_text),
        "target": _target_parts(target),
        "options": sorted((str(k), str(v)) for k, v in (options or {}).items()),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        # libtpu's own flags: its compiles follow them as GPU compiles follow XLA_FLAGS
        # (a benchmark's DISABLE_COLLECTIVE_MATMUL changes the program's kernels)
        "libtpu_init_args": os.environ.get("LIBTPU_INIT_ARGS", ""),
        "versions": _versions(),
    }
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def _target_parts(target: Any) -> dict[str, Any]:
    return {
        "name": getattr(target, "name", str(target)),
        "kind": getattr(target, "kind", None),
        "devices": getattr(target, "devices", None),
        "hosts": getattr(target, "hosts", None),
        "config": getattr(target, "target_config", None),
        "runtime": repr(getattr(target, "runtime", None)),
        "local": _local_devices() if getattr(target, "kind", None) == "local" else None,
    }


def _local_devices() -> list[str]:
    # The "local" target is whatever this machine holds: name it in the key.
    import jax

    return [f"{d.platform}:{getattr(d, 'device_kind', '')}" for d in jax.local_devices()]


#: jax settings that change what a traced program is (dtypes, matmul precision, promotion,
#: and jax_remat3: which remat implementation traces jax.checkpoint and checkpoint_name).
_JAX_SETTINGS = (
    "jax_remat3",
    "jax_enable_x64",
    "jax_default_matmul_precision",
    "jax_numpy_dtype_promotion",
    "jax_numpy_rank_promotion",
    "jax_default_prng_impl",
)


def request_key(kind: str, parts: Mapping[str, Any], target: Any) -> str:
    """The key of an answer by the request that produced it (see :func:`remember`).

    Args:
      kind: what the answer is (``"report"``, ``"flops"``, ...): a namespace.
      parts: JSON-ready values that, with the code, determine the answer (options, policy).
      target: the ``rk.Target`` the answer is for.

    Returns:
      64 hex digits.

    Example:
      >>> from remat_kit import target
      >>> a = request_key("flops", {"model": "m"}, target("cpu"))
      >>> a == request_key("flops", {"model": "m"}, target("cpu"))
      True
      >>> a == request_key("flops", {"model": "n"}, target("cpu"))
      False
    """
    import jax

    blob = {
        "format": FORMAT,
        "kind": kind,
        "parts": parts,
        "target": _target_parts(target),
        # Not in the compile, but a remembered report's step time and offload estimate are
        # priced at them (a custom card edited under the same name must not read back).
        # the node's network prices the collectives, so the step time, not the compile
        "rates": [
            getattr(target, f, None) for f in ("peak_bf16_flops", "host_link_bandwidth", "node")
        ],
        "jax": {name: repr(getattr(jax.config, name, None)) for name in _JAX_SETTINGS},
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "libtpu_init_args": os.environ.get("LIBTPU_INIT_ARGS", ""),
        "versions": _versions(),
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()


def key_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` as a cache key sees them: the stand-in's path (the user's own) becomes
    :data:`STUB_MARK`, so that the key names what the options do, not where they live; the
    kernel file (:data:`KERNEL_CACHE_OPTION`, one per process) is left out.

    Example:
      >>> key_options({"xla_gpu_cuda_data_dir": "/home/u/.cache/remat_kit/ptxas/ab12",
      ...              "xla_gpu_kernel_cache_file": "/tmp/remat_kit_kernels_x/1.bin"})
      {'xla_gpu_cuda_data_dir': 'ptxas-stand-in-1'}
    """
    out = {k: v for k, v in options.items() if k != KERNEL_CACHE_OPTION}
    if STUB_OPTION in out:
        out[STUB_OPTION] = STUB_MARK
    return out
