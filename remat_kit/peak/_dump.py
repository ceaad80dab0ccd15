"""The dump compile: one compile with XLA's debug dump switched on, and the dump's files.

The program is compiled for the target with ``compiler_options={"xla_dump_to": DIR}``
for that one compile (a temporary directory removed afterwards unless the caller keeps
it). Three files of the dump are read (see :mod:`remat_kit.peak._parsers`):
``*after_optimizations-buffer-assignment.txt``, ``*after_optimizations-live-range.txt``
and ``*after_optimizations.txt``.

Example:
  >>> import jax, jax.numpy as jnp
  >>> lowered = jax.jit(lambda a: a @ a).lower(jax.ShapeDtypeStruct((8, 8), jnp.float32))
  >>> compiled, files, texts = compile_with_dump(lowered)
  >>> files.hlo in texts
  True
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

from remat_kit.errors import InspectError
from remat_kit.xla import captured_stderr, compile_with

__all__ = [
    "DumpFiles",
    "compile_with_dump",
    "kept_leaves",
    "read_hlo_proto",
]


def compile_with_dump(
    lowered: Any,
    keep_dump: str | os.PathLike[str] | None = None,
    options: Mapping[str, Any] | None = None,
    *,
    protos: bool = False,
) -> tuple[Any, DumpFiles, dict[str, list[str]]]:
    """Compiles ``lowered`` with XLA's dump switched on and reads the dump's text.

    Args:
      lowered: what ``jax.jit(fn).lower(*args)`` returned.
      keep_dump: a directory to dump into and keep; default a temporary directory,
        removed before returning.
      protos: also dump each module as an ``xla.HloProto`` (the optimized one with its
        buffer assignment: :func:`read_hlo_proto`); keep the directory to read it.

    Returns:
      The compiled program, the dump's files, and each file's lines by path.

    Raises:
      InspectError: XLA wrote no dump, or not every file needed.

    Example:
      >>> import tempfile
      >>> x = jax.ShapeDtypeStruct((8, 8), jnp.float32)
      >>> lowered = jax.jit(lambda a: a @ a).lower(x)
      >>> with tempfile.TemporaryDirectory() as d:
      ...     compiled, files, texts = compile_with_dump(lowered, keep_dump=d)
      ...     os.path.dirname(files.hlo) == d, os.path.exists(files.hlo)
      (True, True)
    """
    if keep_dump is not None:
        Path(keep_dump).mkdir(parents=True, exist_ok=True)
        # XLA's own log lines (its remat pass, its scheduler) are the memory report's to
        # word; here they would reach the terminal raw.
        with captured_stderr():
            compiled = compile_with(lowered, options, _dump_options(str(keep_dump), protos))
        dump = DumpFiles.find(str(keep_dump), _module_name(compiled))
        return compiled, dump, dump.read()
    with tempfile.TemporaryDirectory(prefix="remat_kit_inspect_") as tmp:
        with captured_stderr():
            compiled = compile_with(lowered, options, _dump_options(tmp, protos))
        dump = DumpFiles.find(tmp, _module_name(compiled))
        # Read before the directory goes: the files do not outlive the ``with``.
        return compiled, dump, dump.read()


def _dump_options(directory: str, protos: bool = False) -> dict[str, Any]:
    # Only the dump location is needed: text HLO (with metadata), the buffer assignment
    # and the live ranges are dumped by default on both jax 0.10 and 0.12.
    out = {"xla_dump_to": directory, "xla_dump_hlo_as_text": True}
    if protos:
        out["xla_dump_hlo_as_proto"] = True
    return out


def read_hlo_proto(dump: DumpFiles) -> bytes:
    """The serialized ``xla.HloProto`` (module and buffer assignment) of the optimized
    module whose text is ``dump.hlo``, dumped by ``compile_with_dump(..., protos=True)``.

    Raises:
      InspectError: the dump holds no such file.
    """
    path = re.sub(r"\.txt$", ".hlo.pb", dump.hlo)
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise InspectError(
            f"{os.path.basename(path)}: XLA dumped no HloProto beside the optimized HLO "
            f"({err.strerror})"
        ) from None


def _module_name(compiled: Any) -> str | None:
    try:
        first = compiled.as_text().split("\n", 1)[0]
    except Exception:  # as_text is a debugging API; the file name is the fallback
        return None
    m = re.match(r"HloModule\s+([^\s,]+)", first)
    return m.group(1) if m else None


def kept_leaves(lowered: Any, n: int) -> list[int]:
    """Indices of the argument leaves that reach the compiled program, in order."""
    # jit drops unused arguments; the HLO parameters are the kept leaves, in order.
    kept = None
    lowering = getattr(lowered, "_lowering", None)
    compile_args = getattr(lowering, "compile_args", None)
    if isinstance(compile_args, Mapping):
        kept = compile_args.get("kept_var_idx")
    if kept is None:
        return list(range(n))
    return sorted(int(i) for i in kept)


@dataclasses.dataclass(frozen=True)
class DumpFiles:
    """The three dump files of one compiled module (paths)."""

    buffer_assignment: str
    live_range: str
    hlo: str

    @staticmethod
    def find(directory: str, module: str | None) -> DumpFiles:
        """The files of ``module`` dumped in ``directory``; InspectError if missing."""
        found = sorted(
            glob.glob(os.path.join(directory, "*after_optimizations-buffer-assignment.txt"))
        )
        if module is not None and len(found) > 1:
            named = [f for f in found if f".{module}." in os.path.basename(f)]
            found = named or found
        if not found:
            listing = sorted(os.listdir(directory))[:12]
            raise InspectError(
                f"XLA wrote no '*after_optimizations-buffer-assignment.txt' to {directory} "
                f"(jax {jax.__version__}; files there: {', '.join(listing) or 'none'}): this "
                "jaxlib does not dump its buffer assignment for xla_dump_to"
            )
        if len(found) > 1:
            raise InspectError(
                f"XLA dumped {len(found)} modules to {directory} and none is named "
                f"{module!r}: {', '.join(os.path.basename(f) for f in found)}"
            )
        stem = found[0][: -len("-buffer-assignment.txt")]
        files = DumpFiles(found[0], stem + "-live-range.txt", stem + ".txt")
        if not os.path.exists(files.live_range) and _holds_live_range(found[0]):
            # jax 0.9 writes the live ranges at the end of the buffer assignment.
            files = dataclasses.replace(files, live_range=found[0] + _EMBEDDED)
        for path in (files.live_range, files.hlo):
            if path.endswith(_EMBEDDED):
                continue
            if not os.path.exists(path):
                raise InspectError(
                    f"XLA dumped {os.path.basename(found[0])} but not {os.path.basename(path)} "
                    f"(jax {jax.__version__})"
                )
        return files

    def read(self) -> dict[str, list[str]]:
        """Each file's lines, by path (live ranges written inside the buffer assignment
        under their own key, the ``HloLiveRange`` section and what follows it)."""
        out = {}
        for path in (self.buffer_assignment, self.hlo):
            with open(path, encoding="utf-8", errors="replace") as f:
                out[path] = f.read().splitlines()
        if self.live_range.endswith(_EMBEDDED):
            lines = out[self.buffer_assignment]
            start = next(i for i, line in enumerate(lines) if line.startswith(_LIVE_HEADER))
            out[self.buffer_assignment], out[self.live_range] = lines[:start], lines[start:]
        else:
            with open(self.live_range, encoding="utf-8", errors="replace") as f:
                out[self.live_range] = f.read().splitlines()
        return out


#: How XLA's live-range text starts, in its own file or (jax 0.9) in the buffer assignment.
_LIVE_HEADER = "HloLiveRange"
#: The key of live ranges read from inside the buffer assignment.
_EMBEDDED = "#HloLiveRange"


def _holds_live_range(path: str) -> bool:
    with open(path, encoding="utf-8", errors="replace") as f:
        return any(line.startswith(_LIVE_HEADER) for line in f)
