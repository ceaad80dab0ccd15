"""The two kinds of entry, remembered on disk and read back: a compile's analysis under the
program (:func:`compiled_memory`), with what a caller read off its dump where one was asked
for (:func:`dump_read`), and a whole answer under the request that produced it
(:func:`remember`).

Example:
  >>> low = jax.jit(lambda a: a @ a).lower(jax.ShapeDtypeStruct((8, 8), jnp.float32))
  >>> compiled_memory(low, rk.target("cpu")).argument_bytes
  256
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from remat_kit import xla
from remat_kit.cache._fingerprint import fingerprint
from remat_kit.cache._keys import entry_key, key_options, request_key
from remat_kit.cache._store import load, store
from remat_kit.cache._switch import enabled
from remat_kit.xla import CompiledMemory, Kernel

__all__ = [
    "DumpRead",
    "compiled_memory",
    "compiles",
    "dump_read",
    "remember",
]

_compiled = 0  # programs compiled by compiled_memory in this process (misses and bypasses)


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


@dataclasses.dataclass
class DumpRead:
    """What a reader made of a compile's dump (:func:`dump_read`): the value of the last
    dumping compile inside the block, read off the dump or back from the disk.

    Attributes:
      read: ``directory -> value``: reads XLA's dump (a JSON-ready value).
      code: what names ``read``'s code in the key (a digest of its package's source).
      value: its value for the last dumping compile (None before one).
    """

    read: Callable[[str], Any]
    code: str
    value: Any = None


_reading: contextvars.ContextVar[DumpRead | None] = contextvars.ContextVar(
    "remat_kit_dump_read", default=None
)


@contextlib.contextmanager
def dump_read(read: Callable[[str], Any], code: str) -> Iterator[DumpRead]:
    """Within the block, a compile that dumps (:func:`compiled_memory` ``dump_to``) has its
    dump read by ``read`` and the value remembered with its analysis, under the program's key
    and ``code``: the same program again is read back, not compiled. Without the block a dump
    always costs a compile (what is in it is not remembered).

    Args:
      read: ``directory -> value``: reads the dump (JSON-ready; it must round-trip).
      code: names ``read``'s code in the key (:func:`code_fingerprint` of its package): a
        value read by other code is not read back.

    Yields:
      The DumpRead, whose ``value`` the compile sets.

    Example:
      >>> import os, tempfile
      >>> low = jax.jit(lambda a: a @ a).lower(jax.ShapeDtypeStruct((8, 8), jnp.float32))
      >>> with tempfile.TemporaryDirectory() as d, dump_read(lambda at: len(os.listdir(at)) > 0,
      ...                                                    "listed-1") as got:
      ...     _ = compiled_memory(low, rk.target("cpu"), dump_to=d)
      >>> got.value
      True
    """
    got = DumpRead(read, code)
    token = _reading.set(got)
    try:
        yield got
    finally:
        _reading.reset(token)


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
        is stored; inside :func:`dump_read`, the reader's value is stored with it and a
        program read before is not compiled (nothing is then written to ``dump_to``).

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
    reader = _reading.get() if dump_to is not None else None
    if not enabled():
        _compiled += 1
        mem = dataclasses.replace(compile_fn(lowered), program=program)
        if reader is not None:
            reader.value = reader.read(dump_to)
        return mem
    start = time.perf_counter()
    keyed = key_options(options or {})
    key = entry_key(text, target, keyed)
    # A dump's reading is kept under the program and the reader's code: the compile's
    # analysis and the reader's value, both or neither.
    dump_key = None if reader is None else entry_key(text, target, {**keyed, _READ: reader.code})
    if dump_key is not None:
        held = load(dump_key) or {}
        record, read = held.get("memory"), held.get("read")
    else:  # a dump no reader remembers needs a compile
        record, read = (load(key) if dump_to is None else None), None
    got = _from_record(record) if isinstance(record, dict) else None
    if got is not None and (reader is None or read is not None):
        if reader is not None:
            reader.value = read
        return dataclasses.replace(
            got, compile_seconds=time.perf_counter() - start, program=program
        )
    _compiled += 1
    mem = dataclasses.replace(compile_fn(lowered), program=program)
    store(key, mem.to_dict())
    if reader is not None and dump_key is not None:  # both set together
        reader.value = reader.read(dump_to)
        store(dump_key, {"memory": mem.to_dict(), "read": reader.value})
    return mem


#: The key option that names the code a dump was read by (:func:`dump_read`).
_READ = "remat_kit_dump_read"


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
