"""What importing the user's code set in the process environment, and who set it.

Some libraries configure the JAX process they are imported into: EasyDeL 0.3 sets
``XLA_PYTHON_CLIENT_MEM_FRACTION=1.0`` and a long ``XLA_FLAGS`` at import. A training process
that imports them runs with those settings, so a report must use them too, and say where
they came from: an error about a fraction of 1.0 that the user never typed names the
library that set it. :func:`recording_environ` watches ``os.environ`` while a factory's
module is imported and returns each watched variable set, its value and the top-level
package whose code set it.

Example:
  >>> import os
  >>> with recording_environ() as sets:
  ...     os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  >>> [(s.name, s.value) for s in sets]
  [('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')]
  >>> del os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"]
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterator, MutableMapping
from typing import Any

from remat_kit.targets.runtime import ENV_VARS

__all__ = [
    "ALLOCATOR_VARS",
    "WATCHED",
    "EnvSet",
    "recording_environ",
]

#: Variables that decide what a JAX process on a GPU may allocate (targets.runtime).
ALLOCATOR_VARS: tuple[str, ...] = (*ENV_VARS, "XLA_PYTHON_CLIENT_ALLOCATOR")

#: Variables an import may set that change the memory a process gets or how XLA compiles.
WATCHED: tuple[str, ...] = (*ALLOCATOR_VARS, "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_FLAGS")

# Module names the factory loader gives a file it runs (sources._loading._load_file).
_FACTORY_MODULE = "_remat_kit_factory_"


@dataclasses.dataclass(frozen=True)
class EnvSet:
    """One environment variable that importing the user's code set.

    Attributes:
      name: the variable.
      value: the value it was given (the last, when set twice).
      by: the top-level package whose code set it (``easydel``), or the factory's file.
      before: its value before the import ("" when unset).
    """

    name: str
    value: str
    by: str
    before: str = ""

    def added(self) -> tuple[str, ...]:
        """The space-separated words the import added (the flags it appended to
        ``XLA_FLAGS``; a value it replaced is all new).

        Example:
          >>> EnvSet("XLA_FLAGS", "--a=1 --b=2 --c", "lib", before="--a=1").added()
          ('--b=2', '--c')
        """
        kept = set(self.before.split())
        return tuple(w for w in self.value.split() if w not in kept)

    def words(self) -> str:
        """``XLA_PYTHON_CLIENT_MEM_FRACTION=1.0, set by easydel at import``."""
        return f"{self.name}={self.value}, set by {self.by} at import"


class _Recorder:
    """``os.environ`` while the user's code is imported: reads go through, each write of a
    watched variable is recorded with the package that made it."""

    def __init__(self, real: MutableMapping[str, str], found: dict[str, EnvSet], file: str):
        self._real, self._found, self._file = real, found, file

    def _note(self, key: str, value: str) -> None:
        if key in WATCHED:
            first = self._found.get(key)
            before = first.before if first else self._real.get(key, "")
            self._found[key] = EnvSet(key, str(value), _setter(self._file), before)

    def __setitem__(self, key: str, value: str) -> None:
        self._note(key, value)
        self._real[key] = value

    def setdefault(self, key: str, value: str) -> str:
        if key not in self._real:
            self._note(key, value)
        return self._real.setdefault(key, value)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __getitem__(self, key: str) -> str:
        return self._real[key]

    def __delitem__(self, key: str) -> None:
        self._found.pop(key, None)
        del self._real[key]

    def __contains__(self, key: object) -> bool:
        return key in self._real

    def __iter__(self) -> Iterator[str]:
        return iter(self._real)

    def __len__(self) -> int:
        return len(self._real)

    def __repr__(self) -> str:
        return repr(self._real)

    def __getattr__(self, name: str) -> Any:  # get, copy, keys, pop ... of the real one
        return getattr(self._real, name)


def _setter(file: str) -> str:
    # The first frame outside this module and the os module: the code that made the write.
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__") in (__name__, "os"):
        frame = frame.f_back  # type: ignore[assignment]
    name = "" if frame is None else str(frame.f_globals.get("__name__", ""))
    if not name or name.startswith(_FACTORY_MODULE) or name == "__main__":
        return file
    return name.split(".")[0]


@contextlib.contextmanager
def recording_environ(file: str = "the model's file") -> Iterator[list[EnvSet]]:
    """Within the context, writes to watched variables of ``os.environ`` are recorded.

    ``os.environ`` is replaced by a recorder for the duration (the module's own ``getenv``
    reads through it), and restored on exit, error or not.

    Args:
      file: what to call the user's own file when its top-level code makes the write.

    Yields:
      A list, filled on exit with one :class:`EnvSet` per variable set, in the order of
      :data:`WATCHED`.
    """
    found: dict[str, EnvSet] = {}
    out: list[EnvSet] = []
    real = os.environ
    # The same object is put back on exit: nothing is cleared, only watched for a while.
    os.environ = _Recorder(real, found, file)  # type: ignore[assignment]  # noqa: B003
    try:
        yield out
    finally:
        os.environ = real  # noqa: B003
        out.extend(found[name] for name in WATCHED if name in found)
