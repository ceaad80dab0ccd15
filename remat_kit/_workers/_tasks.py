"""What a cluster worker runs for one item: its platform set before jax, the factory files
shipped with it, the compile, and the cache entries it wrote sent back.

This module imports only the standard library: a worker unpickles the task's function by
importing this module, and it must set ``JAX_PLATFORMS`` before anything imports jax (the
item's code, unpickled inside :func:`call`, does). It serves any
``concurrent.futures.Executor`` whose workers run Python: a Dask cluster's, or a local pool.

Example:
  >>> import pickle
  >>> out = call(pickle.dumps((abs, -3)), (), None)
  >>> out.result, out.entries
  (3, ())
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import pickle
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "Done",
    "call",
    "factory_files",
    "payload",
    "shipped",
    "shipped_path",
    "versions",
]

#: A factory or own step given by file, ``path/to/file.py:NAME``: the file is shipped.
_FILE_SPEC = re.compile(r"(?P<path>.+\.py):[A-Za-z_][A-Za-z0-9_]*")

#: The distributions whose versions must agree between the client and every worker: a
#: compile's figures depend on them (the cache keys name them too).
PACKAGES = ("jax", "jaxlib", "remat-kit", "jax-cuda12-plugin", "jax-cuda13-plugin")


@dataclasses.dataclass(frozen=True)
class Done:
    """One item's answer from a worker.

    Attributes:
      result: what the item's function returned.
      entries: ``(key, record)`` of every cache entry the worker wrote for it, to be stored
        in the client's cache (the worker's disk may be another machine's).
      seconds: the item's wall time on the worker.
      compiles: programs it compiled (the worker's cache did not have them).
      peak_rss_bytes: the worker process's largest resident memory while the item ran
        (sampled every 20 ms; None where ``/proc`` is absent); ``start_rss_bytes`` before.
      worker: the worker's host name and process id.
    """

    result: Any
    entries: tuple[tuple[str, dict[str, Any]], ...]
    seconds: float = 0.0
    compiles: int = 0
    peak_rss_bytes: int | None = None
    start_rss_bytes: int | None = None
    worker: str = ""


def versions() -> dict[str, str | None]:
    """Python's version and those of :data:`PACKAGES` installed here (None: not installed).

    Read from the installed distributions' metadata, so jax is not imported.

    Example:
      >>> v = versions(); v["python"] == ".".join(map(str, sys.version_info[:3])), "jax" in v
      (True, True)
    """
    out: dict[str, str | None] = {"python": ".".join(map(str, sys.version_info[:3]))}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def factory_files(obj: Any) -> tuple[tuple[str, str], ...]:
    """``(location, source)`` of every ``file.py:NAME`` string in ``obj`` naming a file here.

    Found by pickling ``obj`` (every string it holds, in any dataclass or partial): the
    request of a command names its factory that way.

    Example:
      >>> [loc for loc, _ in factory_files(("tests/data/factories.py:deep", "x.py:f"))]
      ['tests/data/factories.py']
    """
    found: dict[str, str] = {}

    class _Scan(pickle.Pickler):
        def persistent_id(self, o: Any) -> None:
            if type(o) is str and (m := _FILE_SPEC.fullmatch(o)):
                path = Path(m["path"])
                if str(path) not in found and path.is_file():
                    # Keyed as the loader spells the location (``Path``'s text of it).
                    found[str(path)] = path.read_text(encoding="utf-8")
            return None

    _Scan(_Null(), protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return tuple(found.items())


class _Null:
    def write(self, b: bytes) -> int:
        return len(b)


# Factory files this worker was sent: the location the request names -> the copy here.
_SHIPPED: dict[str, str] = {}


@contextlib.contextmanager
def shipped(copies: dict[str, str]) -> Iterator[None]:
    """Within the block, a factory file named at a key of ``copies`` is read from its value
    (a cluster worker's copy of the client's file; see :func:`shipped_path`).

    Example:
      >>> with shipped({"gone/model.py": "tests/data/factories.py"}):
      ...     shipped_path("gone/model.py"), shipped_path("other.py")
      ('tests/data/factories.py', 'other.py')
    """
    before = dict(_SHIPPED)
    _SHIPPED.update(copies)
    try:
        yield
    finally:
        _SHIPPED.clear()
        _SHIPPED.update(before)


def shipped_path(location: str) -> str:
    """Where the factory file a request names at ``location`` is read from here: the copy
    this worker was sent (:func:`shipped`), else the location itself."""
    return _SHIPPED.get(location, location)


def payload(fn: Any, item: Any) -> bytes:
    """``(fn, item)`` pickled: a worker unpickles it after setting its platform."""
    return pickle.dumps((fn, item), protocol=pickle.HIGHEST_PROTOCOL)


def call(blob: bytes, files: tuple[tuple[str, str], ...], cache_flag: bool | None) -> Done:
    """Runs one item on a worker: ``fn(item)`` of the pickled ``(fn, item)``.

    Args:
      blob: :func:`payload`.
      files: :func:`factory_files` of the request: each written under a temporary folder
        named by its hash and read from there in place of its location.
      cache_flag: the client's cache switch (``remat_kit.cache.set_enabled``).

    Returns:
      A :class:`Done`.
    """
    if "jax" not in sys.modules:
        # Deviceless GPU compiles run on jax's CPU platform; a GPU here stays untouched.
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    copies = {loc: _written(source, loc) for loc, source in files}
    from remat_kit import cache
    from remat_kit.cache import _store

    cache.set_enabled(cache_flag)
    t0 = time.perf_counter()
    before = cache.compiles()
    with shipped(copies), _store.journal() as entries, _peak_rss() as rss:
        fn, item = pickle.loads(blob)
        result = fn(item)
    return Done(
        result=result,
        entries=tuple(entries),
        seconds=time.perf_counter() - t0,
        compiles=cache.compiles() - before,
        peak_rss_bytes=rss.get("peak"),
        start_rss_bytes=rss.get("start"),
        worker=f"{os.uname().nodename}:{os.getpid()}",
    )


def _written(source: str, location: str) -> str:
    """The shipped file's path on this worker: ``<tmp>/remat_kit_factories/<sha>/<name>``
    (written once per content; the name kept, so its error messages read as the user's)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / "remat_kit_factories" / digest
    path = folder / Path(location).name
    if not path.is_file() or path.read_text(encoding="utf-8") != source:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(source)
        os.replace(tmp, path)
    return str(path)


def _rss() -> int | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def _peak_rss() -> Iterator[dict[str, int]]:
    """The process's resident memory at the start and its peak, sampled in a thread."""
    out: dict[str, int] = {}
    start = _rss()
    if start is None:
        yield out
        return
    out["start"] = out["peak"] = start
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            now = _rss() or 0
            out["peak"] = max(out["peak"], now)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield out
    finally:
        stop.set()
        thread.join()
        out["peak"] = max(out["peak"], _rss() or 0)
