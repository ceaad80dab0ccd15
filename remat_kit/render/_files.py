"""One way to write an output file: checked before any work, atomic, regular files only.

A report takes minutes to compile, so an output path is checked *before* (``check_output``) and
written *after* (``write_json``, ``write_csv``, ``write_text``, ``save_figure``) through a
temporary file in the same directory that replaces the destination in one ``os.replace``. A reader
never sees half a file, a failed write leaves nothing behind, and a path that is not a regular
file (a directory, a device such as /dev/full, a symlink, a FIFO) is refused, never replaced.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from remat_kit.errors import BadValue

__all__ = [
    "check_output",
    "check_profile_dir",
    "check_trace",
    "save_figure",
    "write_csv",
    "write_json",
    "write_profile",
    "write_text",
    "write_trace",
]


def check_output(
    path: str | os.PathLike[str], *, flag: str = "output", make_parents: bool = False
) -> Path:
    """Checks that ``path`` can be written as a new or replaced regular file.

    Args:
      path: where the file will go.
      flag: how the user named it (e.g. ``"--json"``), for the message.
      make_parents: create a missing parent directory (experiments' ``results/``); the CLI
        never does, so a typo in a directory name is an error, not a new directory.

    Returns:
      The path as a ``Path``.

    Raises:
      BadValue: the path is a directory, a symlink, a device or another non-regular file; its
        parent does not exist, is not a directory or is not writable.

    Example:
      >>> check_output("/tmp/report.json", flag="--json")
      PosixPath('/tmp/report.json')
      >>> check_output("/tmp", flag="--json")
      Traceback (most recent call last):
      remat_kit.errors.BadValue: --json '/tmp' is a directory, not a regular file: give a file path
    """
    p, st = _named(path, flag, "file")
    if st is not None and not stat.S_ISREG(st.st_mode):
        what = _kind(st.st_mode)
        raise BadValue(f"{flag} {str(p)!r} is {what}, not a regular file: give a file path")
    parent = p.parent
    if not parent.exists():
        if not make_parents:
            raise BadValue(f"{flag} {str(p)!r}: directory {str(parent)!r} does not exist")
        parent.mkdir(parents=True, exist_ok=True)
    if not parent.is_dir():
        raise BadValue(f"{flag} {str(p)!r}: {str(parent)!r} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BadValue(f"{flag} {str(p)!r}: directory {str(parent)!r} is not writable")
    # os.access answers yes to root everywhere, also where no file can be made (/proc, /sys, a
    # read-only mount): create and remove the kind of temporary file the write will use.
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=parent)
    except OSError as err:
        raise BadValue(
            f"{flag} {str(p)!r}: cannot create a file in {str(parent)!r} ({err.strerror or err})"
        ) from None
    os.close(fd)
    os.unlink(probe)
    return p


def _named(
    path: str | os.PathLike[str], flag: str, what: str
) -> tuple[Path, os.stat_result | None]:
    """The path and what is there now (``None``: nothing), once it names a ``what``."""
    p = Path(path)
    if str(path) == "" or p.name in ("", ".", ".."):
        raise BadValue(f"{flag} {str(path)!r} is not a {what} name")
    try:
        return p, os.lstat(p)
    except FileNotFoundError:
        return p, None
    except OSError as err:
        raise BadValue(f"{flag} {str(p)!r}: {err.strerror}") from None


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _mode_for(p: Path) -> int:
    try:
        return stat.S_IMODE(os.stat(p).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _atomic(
    path: str | os.PathLike[str],
    write: Callable[[io.BufferedWriter], None],
    *,
    flag: str,
    make_parents: bool,
) -> Path:
    p = check_output(path, flag=flag, make_parents=make_parents)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        # mkstemp makes the file 0600; give it the mode an ordinary open() would (or keep the
        # mode of the file it replaces).
        os.fchmod(fd, _mode_for(p))
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        # Re-checked just before the replace: the path may have changed during a long compile.
        check_output(p, flag=flag)
        os.replace(tmp, p)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError):
            raise BadValue(f"{flag} {str(p)!r}: {err.strerror or err}") from None
        raise
    return p


def write_text(
    path: str | os.PathLike[str], text: str, *, flag: str = "output", make_parents: bool = False
) -> Path:
    """Writes ``text`` (UTF-8) atomically to a regular file; see :func:`check_output`.

    Example:
      >>> with tempfile.TemporaryDirectory() as d:
      ...     write_text(Path(d) / "hello.txt", "hello").read_text()
      'hello'
    """
    data = text.encode()
    return _atomic(path, lambda f: f.write(data), flag=flag, make_parents=make_parents)


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return str(value)


def write_json(
    path: str | os.PathLike[str], data: Any, *, flag: str = "output", make_parents: bool = False
) -> Path:
    """Writes ``data`` as indented JSON atomically (numpy values become lists/numbers).

    Example:
      >>> with tempfile.TemporaryDirectory() as d:
      ...     print(write_json(Path(d) / "r.json", {"peak_bytes": 1}).read_text())
      {
        "peak_bytes": 1
      }
    """
    text = json.dumps(data, indent=2, default=_json_default)
    return write_text(path, text + "\n", flag=flag, make_parents=make_parents)


def write_csv(
    path: str | os.PathLike[str],
    rows: Iterable[Mapping[str, Any]],
    *,
    flag: str = "output",
    make_parents: bool = False,
) -> Path:
    """Writes ``rows`` as CSV atomically; the header is the union of keys in first-seen order.

    Example:
      >>> rows = [{"policy": "full", "peak": 1}, {"policy": "none", "seconds": 2}]
      >>> with tempfile.TemporaryDirectory() as d:
      ...     print(write_csv(Path(d) / "r.csv", rows).read_text())
      policy,peak,seconds
      full,1,
      none,,2
    """
    rows = list(rows)
    keys: list[str] = []
    for row in rows:
        keys.extend(k for k in row if k not in keys)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=keys)
    writer.writeheader()
    writer.writerows(rows)
    return write_text(path, buf.getvalue(), flag=flag, make_parents=make_parents)


def save_figure(
    fig: Any,
    path: str | os.PathLike[str],
    *,
    flag: str = "output",
    make_parents: bool = False,
    dpi: int = 130,
) -> Path:
    """Saves a matplotlib figure as PNG atomically and closes it.

    Example:
      >>> import matplotlib.pyplot as plt
      >>> with tempfile.TemporaryDirectory() as d:
      ...     save_figure(plt.figure(), Path(d) / "f.png").read_bytes()[1:4]
      b'PNG'
    """
    import matplotlib.pyplot as plt

    try:
        return _atomic(
            path,
            lambda f: fig.savefig(f, format="png", dpi=dpi, bbox_inches="tight"),
            flag=flag,
            make_parents=make_parents,
        )
    finally:
        plt.close(fig)


def check_trace(path: str | os.PathLike[str], *, flag: str = "output") -> Path:
    """:func:`check_output` for a Chrome trace: also a name ending in ``.json``.

    Perfetto and chrome://tracing tell a JSON trace from a protobuf one by its name, so a
    trace without the suffix would open as neither.

    Example:
      >>> check_trace("/tmp/step.trace", flag="--trace")
      Traceback (most recent call last):
      remat_kit.errors.BadValue: --trace '/tmp/step.trace' must end in .json (a JSON trace)
    """
    if Path(path).suffix.lower() != ".json":
        raise BadValue(f"{flag} {str(path)!r} must end in .json (a JSON trace)")
    return check_output(path, flag=flag)


def write_trace(
    path: str | os.PathLike[str], trace: Mapping[str, Any], *, flag: str = "output"
) -> Path:
    """Writes a Chrome trace (``render.trace_events``) as compact JSON, atomically.

    Compact: a step's trace holds one event per kernel launch and counter change, tens of
    thousands for a large model; indentation would double the file.

    Example:
      >>> with tempfile.TemporaryDirectory() as d:
      ...     write_trace(Path(d) / "t.json", {"traceEvents": []}).read_text()
      '{"traceEvents":[]}'
    """
    check_trace(path, flag=flag)
    text = json.dumps(trace, separators=(",", ":"), default=_json_default)
    return write_text(path, text, flag=flag)


def check_profile_dir(path: str | os.PathLike[str], *, flag: str = "output") -> Path:
    """Checks that ``path`` can become a new profile directory (XProf's ``--logdir``).

    A new or empty directory only: XProf lists every run under its logdir, so writing into a
    directory that holds others would mix our program with what is there.

    Args:
      path: the directory to write.
      flag: how the user named it (e.g. ``"--xprof"``), for the message.

    Returns:
      The path as a ``Path``.

    Raises:
      BadValue: the path is a file or another non-directory, a directory that is not empty,
        or in a parent that does not exist or is not writable.

    Example:
      >>> check_profile_dir("/etc/hosts", flag="-x")
      Traceback (most recent call last):
      remat_kit.errors.BadValue: -x '/etc/hosts' is not a directory: give a new or empty directory
    """
    p, st = _named(path, flag, "directory")
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise BadValue(f"{flag} {str(p)!r} is not a directory: give a new or empty directory")
        if any(p.iterdir()):
            raise BadValue(
                f"{flag} {str(p)!r} is not empty: give a new or empty directory (XProf "
                "would list what is there beside the program)"
            )
    parent = p.parent
    if not parent.is_dir():
        raise BadValue(f"{flag} {str(p)!r}: directory {str(parent)!r} does not exist")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=f".{p.name}.", dir=parent))
    except OSError as err:
        raise BadValue(
            f"{flag} {str(p)!r}: cannot create a directory in {str(parent)!r} "
            f"({err.strerror or err})"
        ) from None
    return p


def write_profile(
    path: str | os.PathLike[str], files: Mapping[str, bytes], *, flag: str = "output"
) -> Path:
    """Writes a directory of ``files`` (relative path -> bytes) at once: built beside it, then
    renamed into place, so a reader never sees half of it; see :func:`check_profile_dir`.

    Example:
      >>> with tempfile.TemporaryDirectory() as d:
      ...     out = write_profile(Path(d) / "prof", {"plugins/profile/run/x.pb": b"1"})
      ...     (out / "plugins/profile/run/x.pb").read_bytes()
      b'1'
    """
    p = check_profile_dir(path, flag=flag)
    tmp = tempfile.mkdtemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        for rel, data in files.items():
            dest = Path(tmp) / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            with open(dest, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, 0o777 & ~_umask())
        check_profile_dir(p, flag=flag)  # the path may have changed during a long compile
        os.rename(tmp, p)  # onto a missing or empty directory
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, OSError):
            raise BadValue(f"{flag} {str(p)!r}: {err.strerror or err}") from None
        raise
    return p


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
