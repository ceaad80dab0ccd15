"""Ctrl-C at any moment of a ``remat-kit`` run: one line, exit code 130, no traceback.

Two phases. While the CLI starts (its imports, the command module's, jax's: seconds),
nothing needs cleaning up, and a ``KeyboardInterrupt`` raised inside an extension module's
initialisation can abort the interpreter (jaxlib's MLIR bindings do): there, Ctrl-C prints
the line and ends the process at once. Once the command runs (worker processes, files being
written), Ctrl-C raises ``KeyboardInterrupt`` as Python's own handler does, and notes that
it came, so that the CLI's error boundary (``remat_kit.cli.main``) knows what it became in
the code it cut short (an ``ImportError``, jax's backend start's ``RuntimeError``) for what
it is. Importing this module as the CLI starts puts the handler in place (``remat_kit.cli``
imports it first, so the CLI's own imports are covered).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["at_once", "came", "catch", "reset", "running", "stop"]

_CAME: list[bool] = []  # non-empty once a Ctrl-C came during this run
_AT_ONCE: list[bool] = []  # non-empty while the CLI starts: Ctrl-C ends the process at once


def _on_sigint(signum: int, frame: Any) -> None:
    _CAME.append(True)
    if _AT_ONCE:
        stop()
        sys.stderr.flush()
        os._exit(130)
    raise KeyboardInterrupt  # as Python's own handler, noted above


def _unraisable(what: Any) -> None:
    # A Ctrl-C that lands in a garbage-collection callback or a __del__ (jax has one) is
    # printed there as "Exception ignored" and goes no further: the run would go on. Print
    # nothing, and say it again a moment later, from outside the callback.
    if isinstance(what.exc_value, KeyboardInterrupt) and came():
        threading.Timer(0.01, _again).start()
        return
    _PREVIOUS_HOOK(what)


_PREVIOUS_HOOK = sys.unraisablehook


def _again() -> None:
    # To the main thread itself, so that a sleep or a wait there is cut short too.
    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)


def catch() -> None:
    """Puts the handler in place, where Ctrl-C still does what Python does by default (not
    in a thread, nor where the program that called the CLI put a handler of its own).

    Example:
      >>> catch()
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) in (signal.default_int_handler, _on_sigint):
        signal.signal(signal.SIGINT, _on_sigint)
        sys.unraisablehook = _unraisable


def came() -> bool:
    """Whether a Ctrl-C came since the last :func:`reset`.

    Example:
      >>> reset(); came()
      False
    """
    return bool(_CAME)


def reset(starting: bool = True) -> None:
    """Forgets earlier Ctrl-Cs: a run starts (``starting``: until :func:`running`, Ctrl-C
    ends the process at once).

    Example:
      >>> reset(starting=False)
    """
    _CAME.clear()
    _AT_ONCE.clear()
    if starting:
        _AT_ONCE.append(True)


def running() -> None:
    """The command runs: from here Ctrl-C raises ``KeyboardInterrupt``, so that worker
    processes are stopped and files closed on the way out.

    Example:
      >>> running()
    """
    _AT_ONCE.clear()


@contextlib.contextmanager
def at_once() -> Iterator[None]:
    """Inside, Ctrl-C ends the process at once again, as while the CLI starts: for code that
    swallows a ``KeyboardInterrupt`` (jax's plugin discovery, as its backends start, logs one
    as a traceback and goes on).

    Example:
      >>> with at_once():
      ...     pass
    """
    was = bool(_AT_ONCE)
    _AT_ONCE.append(True)
    try:
        yield
    finally:
        if not was:
            _AT_ONCE.clear()


def stop() -> int:
    """Ends an interrupted run: one line on stderr; a second Ctrl-C while the process exits
    is ignored rather than turned into a traceback.

    Returns:
      130, the shell's code for SIGINT (128 + 2).
    """
    if _AS_CLI and signal.getsignal(signal.SIGINT) is _on_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stderr.write("remat-kit: interrupted\n")
    return 130


# As the CLI starts (the console script, python -m remat_kit.cli), its imports are covered;
# a program that imports remat_kit.cli for other reasons keeps Python's Ctrl-C until main,
# and gets it back after.
_ARGV0 = sys.argv[0] if sys.argv else ""
_AS_CLI = (
    os.path.basename(_ARGV0) == "remat-kit"  # the console script
    or _ARGV0 == "-m"  # python -m remat_kit.cli, while it imports the package
    or _ARGV0.endswith(os.path.join("remat_kit", "cli", "__main__.py"))
)
if _AS_CLI:
    reset()
    catch()
