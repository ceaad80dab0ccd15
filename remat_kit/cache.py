"""A persistent cache of compiled memory analyses: the same program twice is compiled once.

A compile for a GPU target costs seconds to tens of seconds; what it tells us (XLA's memory
analysis, what its remat pass did, its warnings) is a few hundred bytes of JSON. This module
keeps those bytes on disk, keyed by everything that determines them:

- the lowered program (sha256 of ``lowered.as_text()``: StableHLO with shapes, shardings and
  the policy's effect on the graph already in it; see :func:`fingerprint` for the one
  process-specific number it can hold);
- the target: name, kind, devices, hosts, its ``GpuTargetConfigProto`` text (which carries the
  device memory size XLA's remat pass works to) and the runtime (allocator fraction);
- compiler options passed by the caller and ``XLA_FLAGS``;
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

Example:
  >>> import jax, jax.numpy as jnp
  >>> from remat_kit import cache, target
  >>> low = jax.jit(lambda a: a @ a).lower(jax.ShapeDtypeStruct((8, 8), jnp.float32))
  >>> cache.compiled_memory(low, target("cpu")).argument_bytes
  256
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from remat_kit import xla
from remat_kit.errors import BadType
from remat_kit.xla import CompiledMemory, Kernel

__all__ = [
    "ENV_DIR",
    "ENV_OFF",
    "KERNEL_CACHE_OPTION",
    "STUB_MARK",
    "STUB_OPTION",
    "bypassed",
    "cache_dir",
    "code_fingerprint",
    "compiled_memory",
    "compiles",
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

#: Environment variable naming the cache directory.
ENV_DIR = "REMAT_KIT_CACHE_DIR"
#: Environment variable that turns the cache off when set to 1 (or true/yes).
ENV_OFF = "REMAT_KIT_NO_CACHE"
#: What the ptxas stand-in's directory (remat_kit.targets._codegen) becomes in a key: its path
#: is the user's own, what it does is the same everywhere.
STUB_MARK = "ptxas-stand-in-1"
#: The compiler option that points XLA at the stand-in.
STUB_OPTION = "xla_gpu_cuda_data_dir"
#: The compiler option that names the file where XLA keeps the kernels it made
#: (:func:`remat_kit.targets._codegen.kernel_cache_file`): where they are kept changes no
#: figure, so no key sees it.
KERNEL_CACHE_OPTION = "xla_gpu_kernel_cache_file"
#: Bumped when what a record means changes without its fields changing.
FORMAT = 1

_override: bool | None = None
_compiled = 0  # programs compiled by compiled_memory in this process (misses and bypasses)


def cache_dir() -> Path:
    """Where entries live: ``$REMAT_KIT_CACHE_DIR``, ``$XDG_CACHE_HOME/remat_kit`` or
    ``~/.cache/remat_kit`` (read at every call, so a test or a CLI flag may change it).

    Example:
      >>> from unittest import mock
      >>> with mock.patch.dict(os.environ, {ENV_DIR: "/tmp/rk-cache"}):
      ...     str(cache_dir())
      '/tmp/rk-cache'
    """
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "remat_kit"


def enabled() -> bool:
    """Whether the cache is read and written: :func:`set_enabled` if called, else the
    environment (``REMAT_KIT_NO_CACHE=1`` turns it off).

    Example:
      >>> set_enabled(False); enabled()
      False
      >>> set_enabled(None)
    """
    if _override is not None:
        return _override
    return os.environ.get(ENV_OFF, "").strip().lower() not in ("1", "true", "yes", "on")


def set_enabled(flag: bool | None) -> None:
    """Turns the cache on or off for this process (None: follow ``REMAT_KIT_NO_CACHE``).

    Args:
      flag: True, False, or None.

    Raises:
      TypeError: anything else.

    Example:
      >>> set_enabled(False)  # what --no-cache does
      >>> enabled()
      False
      >>> set_enabled(None)  # back to REMAT_KIT_NO_CACHE
    """
    global _override
    if flag is not None and not isinstance(flag, bool):
        raise BadType(f"set_enabled takes True, False or None, got {flag!r}")
    _override = flag


@contextlib.contextmanager
def bypassed() -> Iterator[None]:
    """Within the block the cache is neither read nor written (the CLI's ``--no-cache``).

    Example:
      >>> with bypassed():
      ...     enabled()
      False
    """
    global _override
    before = _override
    _override = False
    try:
        yield
    finally:
        _override = before


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
    root = Path(__file__).resolve().parent
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
        "rates": [getattr(target, f, None) for f in ("peak_bf16_flops", "host_link_bandwidth")],
        "jax": {name: repr(getattr(jax.config, name, None)) for name in _JAX_SETTINGS},
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "versions": _versions(),
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()


def remember(
    kind: str,
    parts: Mapping[str, Any],
    target: Any,
    compute: Callable[[], Any],
    *,
    encode: Callable[[Any], Any] = lambda value: value,
    decode: Callable[[Any], Any] = lambda stored: stored,
) -> Any:
    """``compute()``, remembered on disk under the request that asks for it.

    ``parts`` must name everything the answer depends on besides the target, the jax settings
    and versions (which the key adds): for a program built by this package, the options, the
    policy and :func:`code_fingerprint` of the packages that build it. With the cache off
    (:func:`enabled`) this is ``compute()``. A stored value that ``decode`` rejects (raises
    ``KeyError``, ``TypeError`` or ``ValueError``) is computed again and rewritten.

    Args:
      kind: a namespace for the answer (``"report"``).
      parts: JSON-ready values (``default=str`` for the rest).
      target: the ``rk.Target``.
      compute: makes the answer.
      encode: the answer as JSON-ready data.
      decode: the answer from that data.

    Returns:
      The answer.

    Example:
      >>> remember("answer", {"q": 6 * 7}, rk.target("cpu"), lambda: 42)
      42
      >>> remember("answer", {"q": 6 * 7}, rk.target("cpu"), lambda: 0)  # read back
      42
    """
    if not enabled():
        return compute()
    key = request_key(kind, parts, target)
    record = load(key)
    if record is not None and "value" in record:
        try:
            return decode(record["value"])
        except (KeyError, TypeError, ValueError):
            pass  # written by another version, or damaged: compute it again
    value = compute()
    store(key, {"value": encode(value)})
    return value


@functools.cache
def code_fingerprint(*packages: str) -> str:
    """sha256 over the Python source of ``packages`` (every ``.py`` file under each, by path).

    The answer a package's code gives for the same options changes only when that code does.
    Read once per process.

    Args:
      *packages: importable package names (``"remat_kit"``, ``"models"``).

    Returns:
      64 hex digits.

    Example:
      >>> len(code_fingerprint("remat_kit"))
      64
    """
    import importlib

    digest = hashlib.sha256()
    for name in packages:
        module = importlib.import_module(name)
        for folder in getattr(module, "__path__", []):
            root = Path(folder)
            for path in sorted(root.rglob("*.py")):
                digest.update(f"{name}/{path.relative_to(root).as_posix()}\0".encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()


_CALLBACK_ID = re.compile(r'backend_config = "(\d+)"')
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def fingerprint(program_text: str) -> str:
    """sha256 of a lowered program's text, stable across processes.

    jax's ``custom_partitioning`` (cuDNN attention's sharding rule, for one) lowers to a
    ``@CustomSPMDPartitioning`` call whose ``backend_config`` is the ``id()`` of a Python
    object: a different number in every process for the same program. That number is replaced
    by what it stands for (the partitioning callbacks' qualified names and static arguments);
    when it cannot be resolved, the text is left as it is (a miss, never a wrong hit).

    Example:
      >>> fingerprint("module {}") == fingerprint("module {}")
      True
    """
    if "CustomSPMDPartitioning" in program_text:
        lines = program_text.split("\n")
        for i, line in enumerate(lines):
            if "CustomSPMDPartitioning" in line:
                lines[i] = _CALLBACK_ID.sub(_callback_words, line)
        program_text = "\n".join(lines)
    return hashlib.sha256(program_text.encode()).hexdigest()


def _callback_words(m: re.Match[str]) -> str:
    try:
        from jax._src import custom_partitioning  # private: guarded, used for a name only

        info = custom_partitioning._sharding_callbacks.get(m.group(1).encode())
    except Exception:  # a jax without it: keep the id (a cache miss)
        info = None
    if info is None:
        return m.group(0)
    fns = (info.partition, info.propagate_user_sharding, info.infer_sharding_from_operands)
    words = _ADDRESS.sub("0x", f"{[_callable_words(f) for f in fns]} {info.static_args!r}")
    digest = hashlib.sha256(words.encode()).hexdigest()
    return f'backend_config = "{digest}"'


def _callable_words(f: Any) -> str:
    """A function by name, code and what its closure holds (two closures of one function over
    different values are different partitioners)."""
    if f is None:
        return "None"
    code = getattr(f, "__code__", None)
    cells = getattr(f, "__closure__", None) or ()
    held = []
    for cell in cells:
        try:
            held.append(repr(cell.cell_contents))
        except ValueError:  # an empty cell
            held.append("<empty>")
    body = hashlib.sha256(code.co_code).hexdigest() if code is not None else ""
    name = f"{getattr(f, '__module__', '')}.{getattr(f, '__qualname__', type(f).__name__)}"
    return f"{name}:{body}:{held}"


def _local_devices() -> list[str]:
    # The "local" target is whatever this machine holds: name it in the key.
    import jax

    return [f"{d.platform}:{getattr(d, 'device_kind', '')}" for d in jax.local_devices()]


def _path(key: str) -> Path:
    return cache_dir() / f"v{FORMAT}" / key[:2] / f"{key}.json"


def load(key: str) -> dict[str, Any] | None:
    """The record stored under ``key``, or None (absent, unreadable or not a record).

    Example:
      >>> load("0" * 64) is None
      True
    """
    try:
        with open(_path(key), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key:
        return None
    record = data.get("record")
    return record if isinstance(record, dict) else None


def store(key: str, record: Mapping[str, Any]) -> bool:
    """Writes ``record`` under ``key`` atomically (temporary file, then ``os.replace``).

    A cache that cannot be written (read-only home, full disk) is not an error: the answer
    was computed, it is only not remembered.

    Args:
      key: from :func:`entry_key`.
      record: JSON-ready data.

    Returns:
      Whether it was written.

    Example:
      >>> key = entry_key("module {}", rk.target("cpu"))
      >>> store(key, {"a": 1}), load(key)
      (True, {'a': 1})
    """
    path = _path(key)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:8]}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"key": key, "written": time.time(), "record": dict(record)}, f)
        os.replace(tmp, path)
        return True
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return False


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


def compiled_memory(
    lowered: Any,
    target: Any,
    compile_fn: Callable[[Any], CompiledMemory] | None = None,
    *,
    options: Mapping[str, Any] | None = None,
    dump_to: str | None = None,
) -> CompiledMemory:
    """``compile_fn(lowered)``, remembered on disk across runs (see the module docstring).

    On a hit nothing is compiled; the record's ``compile_seconds`` is then the time it took to
    read it back.

    Args:
      lowered: a ``jax.stages.Lowered``.
      target: the ``rk.Target`` it was lowered for.
      compile_fn: compiles it and reads the analysis (None: :func:`remat_kit.xla.compile_memory`
        with ``options``).
      options: compiler options of the compile (the target's analysis options), part of the
        key (the stand-in ``ptxas``'s path by what it is, not where it lives).
      dump_to: a directory for XLA's dump (:func:`remat_kit.xla.compile_memory`): the
        program is then compiled even when the disk holds its analysis, and the analysis
        is stored.

    Returns:
      The CompiledMemory.

    Example:
      >>> low = jax.jit(lambda a: a @ a).lower(jax.ShapeDtypeStruct((8, 8), jnp.float32))
      >>> compiled_memory(low, rk.target("cpu")).argument_bytes
      256
    """
    global _compiled
    if compile_fn is None:
        # Looked up now, so a patched one is used.
        compile_fn = functools.partial(xla.compile_memory, options=options, dump_to=dump_to)
    text = lowered.as_text()
    # The same program whatever asked for it: what lets a front merge identical programs.
    program = fingerprint(text)[:16]
    if not enabled():
        _compiled += 1
        return dataclasses.replace(compile_fn(lowered), program=program)
    start = time.perf_counter()
    key = entry_key(text, target, key_options(options or {}))
    record = load(key) if dump_to is None else None  # a dump needs a compile
    if record is not None:
        got = _from_record(record)
        if got is not None:
            return dataclasses.replace(
                got, compile_seconds=time.perf_counter() - start, program=program
            )
    _compiled += 1
    mem = dataclasses.replace(compile_fn(lowered), program=program)
    store(key, mem.to_dict())
    return mem


def compiles() -> int:
    """Programs :func:`compiled_memory` has compiled in this process (not read from disk).

    Example:
      >>> low = jax.jit(lambda a: a * 3).lower(jax.ShapeDtypeStruct((3,), jnp.float32))
      >>> before = compiles()
      >>> a = compiled_memory(low, rk.target("cpu"))
      >>> b = compiled_memory(low, rk.target("cpu"))  # the same program: read from disk
      >>> compiles() - before
      1
    """
    return _compiled


def _from_record(record: Mapping[str, Any]) -> CompiledMemory | None:
    """A CompiledMemory from a stored record; None when a field is missing, extra or of the
    wrong type (a record written by another version, or damaged)."""
    fields = {f.name: str(f.type) for f in dataclasses.fields(CompiledMemory)}
    if set(record) != set(fields):
        return None
    values: dict[str, Any] = {}
    for name, kind in fields.items():
        value = record[name]
        if value is None and "None" in kind:
            values[name] = None
        elif (kind.startswith("int") and type(value) is int) or (
            kind == "bool" and type(value) is bool
        ):
            values[name] = value
        elif kind == "float" and type(value) in (int, float):
            values[name] = float(value)
        elif kind == "str" and isinstance(value, str):
            values[name] = value
        elif name == "kernels" and isinstance(value, list):
            try:
                values[name] = tuple(Kernel.from_list(v) for v in value)
            except (TypeError, ValueError):
                return None
        elif kind.startswith("tuple[str") and isinstance(value, list):
            if not all(isinstance(v, str) for v in value):
                return None
            values[name] = tuple(value)
        else:
            return None
    return CompiledMemory(**values)
