"""Where the cache lives and how an entry is kept: a small JSON file per key under
:func:`cache_dir`, written to a temporary file and renamed into place (``os.replace``), so
concurrent runs never read a half-written entry; an entry that cannot be read or is not a
record reads as absent.

Example:
  >>> key = "0123abcd" * 8  # 64 hex digits, as remat_kit.cache.entry_key makes them
  >>> store(key, {"a": 1}), load(key)
  (True, {'a': 1})
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "ENV_DIR",
    "FORMAT",
    "cache_dir",
    "dir_problem",
    "journal",
    "load",
    "store",
]

#: Environment variable naming the cache directory.
ENV_DIR = "REMAT_KIT_CACHE_DIR"
#: Bumped when what a record means changes without its fields changing.
FORMAT = 1


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


def dir_problem() -> str | None:
    """Why :func:`cache_dir` cannot hold entries, in a few words, or None when it can.

    Tried as a write is: the directory made if missing, a file made in it and removed. A
    cache that cannot be written only costs time (:func:`store` is then a no-op), so the
    caller decides whether and how to say so.

    Example:
      >>> from unittest import mock
      >>> with mock.patch.dict(os.environ, {ENV_DIR: "/dev/null/cache"}):
      ...     dir_problem()
      'cannot be made (Not a directory)'
    """
    where = cache_dir()
    try:
        where.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        return "is not a directory"
    except OSError as err:
        return f"cannot be made ({err.strerror or type(err).__name__})"
    try:
        fd, probe = tempfile.mkstemp(prefix=".probe.", dir=where)
    except OSError as err:
        return f"is not writable ({err.strerror or type(err).__name__})"
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None


# The entries written while a journal is open (a cluster worker sends them to the client,
# whose disk is not the worker's); one per thread.
_journals = threading.local()


@contextlib.contextmanager
def journal() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Within the block, every entry this thread stores is also listed, ``(key, record)``.

    Example:
      >>> with journal() as written:
      ...     _ = store("89abcdef" * 8, {"c": 3})
      >>> written
      [('89abcdef89abcdef89abcdef89abcdef89abcdef89abcdef89abcdef89abcdef', {'c': 3})]
    """
    written: list[tuple[str, dict[str, Any]]] = []
    outer = getattr(_journals, "open", None)
    _journals.open = written
    try:
        yield written
    finally:
        _journals.open = outer


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
      key: 64 hex digits (:func:`remat_kit.cache.entry_key`, ``request_key``).
      record: JSON-ready data.

    Returns:
      Whether it was written.

    Example:
      >>> key = "4567cdef" * 8
      >>> store(key, {"b": 2}), load(key)
      (True, {'b': 2})
    """
    path = _path(key)
    written = getattr(_journals, "open", None)
    if written is not None:
        written.append((key, dict(record)))
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
