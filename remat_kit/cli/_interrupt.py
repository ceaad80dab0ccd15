"""A stopped ``remat-kit`` run: one line, exit code 128 + the signal, no traceback, no
process and no half-written file left.

A run is stopped by Ctrl-C (SIGINT), by a scheduler or a CI timeout (SIGTERM: Slurm,
Kubernetes and ``timeout`` send it), or by a closed terminal (SIGHUP). Each is handled alike:

- While the CLI starts (its imports, the command module's, jax's: seconds), nothing needs
  cleaning up, and a ``KeyboardInterrupt`` raised inside an extension module's
  initialisation can abort the interpreter (jaxlib's MLIR bindings do): there, the signal
  prints the line and ends the process at once.
- Once the command runs (worker processes, files being written), the signal raises
  :class:`Stopped` (a ``KeyboardInterrupt``, as Python's own Ctrl-C), so that worker pools
  are stopped and temporary files removed on the way out, and notes that it came, so that
  the CLI's error boundary (``remat_kit.cli.main``) knows what it became in the code it cut
  short (an ``ImportError``, jax's backend start's ``RuntimeError``) for what it is.
- Python runs a signal handler only between bytecodes of the main thread, and an XLA
  compile holds the main thread in C++ for up to minutes: a scheduler that sends SIGTERM
  sends SIGKILL a grace period later (Slurm's ``KillWait``, 30 s by default). So the signal
  also wakes a thread of ours (``signal.set_wakeup_fd``, written by the C-level handler at
  once); if the run has not ended :data:`GRACE` seconds later, that thread stops this
  process's worker processes itself, prints the line and ends the process. Files are
  written whole or not at all (a temporary file renamed into place), so an end there leaves
  none half-written.

A worker process whose parent dies without a word (SIGKILL, the OOM killer) ends itself:
``remat_kit._workers`` watches the parent.

Importing this module as the CLI starts puts the handlers in place (``remat_kit.cli``
imports it first, so the CLI's own imports are covered).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import TextIO

__all__ = [
    "GRACE",
    "Stopped",
    "at_once",
    "came",
    "catch",
    "exit_code",
    "release",
    "reset",
    "running",
    "stop",
]

#: Seconds a stopped run has to end by itself before the wake-up thread ends it.
GRACE = 3.0

#: The signals that stop a run, and the word the one line gives each (the same three are held
#: while worker processes start: ``remat_kit._workers._local._STOPPING``).
_WORDS: dict[int, str] = {
    signal.SIGINT: "interrupted",
    signal.SIGTERM: "terminated (SIGTERM)",
    signal.SIGHUP: "hung up (SIGHUP)",
}

_CAME: list[int] = []  # the signals that came during this run
_AT_ONCE: list[bool] = []  # non-empty while the CLI starts: a signal ends the process at once
_WAKE: list[int] = []  # the wake-up pipe's write end and a copy of stderr (once a process)
_TIMERS: list[threading.Timer] = []  # the forced ends armed by this run's signals
_SAID: list[bool] = []  # non-empty once the line was written


class Stopped(KeyboardInterrupt):
    """The run was stopped by a signal (Ctrl-C, SIGTERM or SIGHUP).

    A ``KeyboardInterrupt``, so that every ``except KeyboardInterrupt`` and ``finally`` on
    the way out (worker pools, temporary files) treats it as Ctrl-C.

    Attributes:
      signum: the signal's number.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _CAME.append(signum)
    if _AT_ONCE:
        code = stop()
        sys.stderr.flush()
        os._exit(code)
    raise Stopped(signum)


def _unraisable(what: sys.UnraisableHookArgs) -> None:
    # sys.UnraisableHookArgs: typeshed's name for the hook's argument (not importable).
    # A signal that lands in a garbage-collection callback or a __del__ (jax has one) is
    # printed there as "Exception ignored" and goes no further: the run would go on. Print
    # nothing, and say it again a moment later, from outside the callback.
    if isinstance(what.exc_value, KeyboardInterrupt) and came():
        threading.Timer(0.01, _again).start()
        return
    _PREVIOUS_HOOK(what)


_PREVIOUS_HOOK = sys.unraisablehook


def _again() -> None:
    # To the main thread itself, so that a sleep or a wait there is cut short too.
    signal.pthread_kill(threading.main_thread().ident or 0, _CAME[-1] if _CAME else signal.SIGINT)


def _ours(signum: int) -> bool:
    # Only where the signal still does what Python does by default: a handler the program
    # that called the CLI put in place is kept, and so is an ignored SIGHUP (``nohup``).
    now = signal.getsignal(signum)
    if now is _on_signal:
        return True
    if signum == signal.SIGINT:
        return now is signal.default_int_handler
    return now == signal.SIG_DFL


def catch() -> None:
    """Puts the handlers in place (in the main thread, for each signal still at Python's
    default) and the wake-up thread that ends a run which does not end by itself.

    Example:
      >>> catch()
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in _WORDS:
        if _ours(signum):
            signal.signal(signum, _on_signal)
    sys.unraisablehook = _unraisable
    _wake_up()


def _wake_up() -> None:
    # The C-level handler writes each signal's number to this pipe as it comes, even while
    # the main thread is inside a compile; a thread of ours reads it. Made once per process,
    # and only where no one else (an asyncio loop in the main thread) has the wake-up fd.
    if _WAKE:
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    try:
        if signal.set_wakeup_fd(write, warn_on_full_buffer=False) != -1:
            signal.set_wakeup_fd(-1)  # someone else's: theirs, not ours (put back below)
            raise ValueError
    except ValueError:
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(-1)
        os.close(read)
        os.close(write)
        return
    _WAKE.append(write)
    with contextlib.suppress(OSError):
        _WAKE.append(os.dup(2))  # the stderr the run starts with (see _Fd2)
    threading.Thread(target=_watch, args=(read,), name="remat-kit-stop", daemon=True).start()


def _watch(read: int) -> None:
    while True:
        try:
            got = os.read(read, 64)
        except OSError:
            return
        if not got:
            return
        stopping = [s for s in got if s in _WORDS and signal.getsignal(s) is _on_signal]
        if stopping and not _AT_ONCE:
            timer = threading.Timer(GRACE, _force, args=(stopping[0],))
            timer.daemon = True  # never what keeps a finished process alive
            _TIMERS.append(timer)
            timer.start()


def _force(signum: int) -> None:
    """The run did not end within :data:`GRACE` seconds of the signal (the main thread is in
    a compile): stop the worker processes, say the line, end the process."""
    children = multiprocessing.active_children()
    for p in children:
        p.terminate()
    for p in children:
        p.join(timeout=1)
        if p.is_alive():
            p.kill()
    if not _CAME:
        _CAME.append(signum)
    # Straight to the file descriptor: sys.stderr may be a progress display's buffer (rich's
    # Live redirects it), or its lock held by the main thread, and nothing flushes after
    # os._exit; a compile may have file descriptor 2 captured.
    code = exit_code() if _SAID else stop(_Fd2())
    codegen = sys.modules.get("remat_kit.targets._codegen")  # loaded if anything compiled
    if codegen is not None:
        codegen.end_process(code)  # its kernel directory too: os._exit runs no exit hook
    os._exit(code)


class _Fd2:
    """The stderr the run started with, unbuffered: what :func:`stop` writes reaches it at
    once, even while a compile has file descriptor 2 captured (``remat_kit.xla``)."""

    def write(self, text: str) -> None:
        with contextlib.suppress(OSError):
            os.write(_WAKE[1] if len(_WAKE) > 1 else 2, text.encode())

    def flush(self) -> None:
        pass


def came() -> bool:
    """Whether a stopping signal came since the last :func:`reset`.

    Example:
      >>> reset(); came()
      False
    """
    return bool(_CAME)


def exit_code() -> int:
    """The exit code of a stopped run: 128 + the first signal's number (130 for Ctrl-C,
    143 for SIGTERM, 129 for SIGHUP), as a shell reports a process that signal ended.

    Example:
      >>> reset(); exit_code()
      130
    """
    return 128 + (_CAME[0] if _CAME else signal.SIGINT)


def reset(starting: bool = True) -> None:
    """Forgets earlier signals: a run starts (``starting``: until :func:`running`, a signal
    ends the process at once).

    Example:
      >>> reset(starting=False)
    """
    _disarm()
    _CAME.clear()
    _AT_ONCE.clear()
    _SAID.clear()
    if starting:
        _AT_ONCE.append(True)


def running() -> None:
    """The command runs: from here a signal raises :class:`Stopped`, so that worker
    processes are stopped and files closed on the way out.

    Example:
      >>> running()
    """
    _AT_ONCE.clear()


def release() -> None:
    """``main`` returns to a program that called it: that program gets Python's defaults
    back (the CLI itself keeps its handlers until the process ends).

    Example:
      >>> release()
    """
    _AT_ONCE.clear()
    if _AS_CLI or threading.current_thread() is not threading.main_thread():
        return
    for signum in _WORDS:
        if signal.getsignal(signum) is _on_signal:
            default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
            signal.signal(signum, default)


@contextlib.contextmanager
def at_once() -> Iterator[None]:
    """Inside, a signal ends the process at once again, as while the CLI starts: for code
    that swallows a ``KeyboardInterrupt`` (jax's plugin discovery, as its backends start,
    logs one as a traceback and goes on).

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


def stop(stream: TextIO | _Fd2 | None = None) -> int:
    """Ends a stopped run: one line (``remat-kit: interrupted`` for Ctrl-C); a second
    signal while the process exits is ignored rather than turned into a traceback.

    Args:
      stream: where the line goes (None: ``sys.stderr``).

    Returns:
      The exit code, :func:`exit_code`.
    """
    if threading.current_thread() is threading.main_thread():
        if _AS_CLI:
            for signum in _WORDS:
                if signal.getsignal(signum) is _on_signal:
                    signal.signal(signum, signal.SIG_IGN)
        else:
            _disarm()  # main returns to its caller's own code: no forced end there
    _SAID.append(True)
    out = sys.stderr if stream is None else stream
    out.write(f"remat-kit: {_WORDS.get(_CAME[0] if _CAME else signal.SIGINT)}\n")
    out.flush()
    return exit_code()


def _disarm() -> None:
    while _TIMERS:
        _TIMERS.pop().cancel()


# As the CLI starts (the console script, python -m remat_kit.cli), its imports are covered;
# a program that imports remat_kit.cli for other reasons keeps Python's defaults until main.
_ARGV0 = sys.argv[0] if sys.argv else ""
_AS_CLI = multiprocessing.parent_process() is None and (  # a spawned worker has the CLI's argv
    os.path.basename(_ARGV0) == "remat-kit"  # the console script
    or _ARGV0 == "-m"  # python -m remat_kit.cli, while it imports the package
    or _ARGV0.endswith(os.path.join("remat_kit", "cli", "__main__.py"))
)
if _AS_CLI:
    reset()
    catch()
