"""Stable digests of what a key names: a lowered program's text (the same program in every
process) and the Python source of packages (the code that builds a remembered answer).

Example:
  >>> fingerprint("module {}") == fingerprint("module {}"), len(code_fingerprint("remat_kit"))
  (True, 64)
"""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path
from typing import Any

__all__ = [
    "code_fingerprint",
    "fingerprint",
]

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
