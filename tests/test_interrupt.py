"""Ctrl-C at any moment of a ``remat-kit`` run: one line, ``remat-kit: interrupted``, exit 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from remat_kit.cli import main

ONE_LINE = "remat-kit: interrupted\n"


# Each test starts from Python's own Ctrl-C, whatever a test before it in this worker left
# (tests/conftest.py's python_signals).
pytestmark = pytest.mark.usefixtures("python_signals")


@pytest.fixture
def own_sigint():
    # main() puts its handler in place in this process: give pytest its own back after.
    before = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, before)
    sys.unraisablehook = sys.__unraisablehook__


@pytest.mark.parametrize(
    "delay",
    [
        0.3,  # the CLI's own imports
        1.2,  # the command module's import: jax, jaxlib's extension modules
        # the run (workers, tracing, compiles): tests/test_stop.py, each signal
    ],
)
def test_ctrl_c_at_a_moment_is_one_line_and_130(delay, tmp_path):
    env = {**os.environ, "REMAT_KIT_CACHE_DIR": str(tmp_path)}
    argv = ["compare", "--model", "tiny-llama", "--batch", "1", "--seq", "64", "--no-cache"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "remat_kit.cli", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "Exception ignored" not in err, err[-2000:]
    assert err.endswith(ONE_LINE) and err.count("remat-kit:") == 1, err


def _listing_run(monkeypatch, run):
    import remat_kit.cli._listings as listings

    monkeypatch.setattr(listings, "run", run)


def test_ctrl_c_raised_as_keyboard_interrupt(monkeypatch, capsys, own_sigint):
    def run(args):
        signal.raise_signal(signal.SIGINT)  # the handler raises here
        return 0

    _listing_run(monkeypatch, run)
    assert main(["targets"]) == 130
    assert capsys.readouterr().err == ONE_LINE


def test_ctrl_c_that_became_another_error(monkeypatch, capsys, own_sigint):
    # An extension module's import turns a KeyboardInterrupt into an ImportError.
    def run(args):
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt as err:
            raise ImportError("Encountered an error while initializing the extension.") from err
        return 0

    _listing_run(monkeypatch, run)
    assert main(["targets"]) == 130
    assert capsys.readouterr().err == ONE_LINE


def test_the_same_error_without_ctrl_c_is_a_bug_with_its_traceback(monkeypatch, own_sigint):
    def run(args):
        raise ImportError("a real one")

    _listing_run(monkeypatch, run)
    with pytest.raises(ImportError, match="a real one"):
        main(["targets"])


def test_ctrl_c_inside_a_del_still_stops_the_run(monkeypatch, capsys, own_sigint):
    # Python prints a KeyboardInterrupt raised in __del__ (or a gc callback) as "Exception
    # ignored" and goes on; the CLI says nothing there and stops the run just after.
    class Finalized:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)

    def run(args):
        Finalized()  # collected at once: the Ctrl-C lands in its __del__
        time.sleep(5)  # the interrupt comes again here
        return 0

    _listing_run(monkeypatch, run)
    started = time.monotonic()
    assert main(["targets"]) == 130
    assert time.monotonic() - started < 4
    assert capsys.readouterr().err == ONE_LINE


STOPS = [
    (signal.SIGINT, 130, ONE_LINE),
    (signal.SIGTERM, 143, "remat-kit: terminated (SIGTERM)\n"),
    (signal.SIGHUP, 129, "remat-kit: hung up (SIGHUP)\n"),
]


@pytest.mark.parametrize(("signum", "code", "line"), STOPS, ids=lambda v: str(v).strip())
def test_a_signal_while_the_cli_starts_ends_the_process_at_once(signum, code, line):
    # While the CLI starts (its imports, jax's), a KeyboardInterrupt raised inside an
    # extension module's initialisation can abort the interpreter: the handler ends the
    # process there and then (no finally block runs, nothing is printed but the line).
    program = (
        "import sys, signal\n"
        "sys.argv = ['remat-kit']\n"
        "from remat_kit.cli import _interrupt\n"
        "_interrupt.reset(); _interrupt.catch()\n"
        "try:\n"
        f"    signal.raise_signal({int(signum)})\n"
        "finally:\n"
        "    print('went on')\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (code, "", line)


@pytest.mark.parametrize(("signum", "code", "line"), STOPS[1:], ids=["SIGTERM", "SIGHUP"])
def test_a_scheduler_s_signal_in_the_run_is_one_line_and_its_code(
    signum, code, line, monkeypatch, capsys, own_sigint
):
    cleaned = []

    def run(args):
        try:
            signal.raise_signal(signum)  # the handler raises here, as Ctrl-C's does
        finally:
            cleaned.append(True)  # what a worker pool's or a file's cleanup would do
        return 0

    _listing_run(monkeypatch, run)
    assert main(["targets"]) == code
    assert cleaned == [True]
    assert capsys.readouterr().err == line
    # main hands the caller's program Python's default back
    assert signal.getsignal(signum) == signal.SIG_DFL


# starts a process: jax's imports and backends, seconds each
@pytest.mark.slow
def test_a_run_held_in_a_compile_is_ended_after_the_grace(tmp_path):
    # Python runs a handler only between the main thread's bytecodes; a compile holds it in
    # C++ for minutes. The wake-up thread ends the run GRACE seconds after the signal.
    program = (
        "import hashlib, sys\n"
        "sys.argv = ['remat-kit']\n"
        "from remat_kit.cli import _interrupt\n"
        "_interrupt.reset(); _interrupt.catch(); _interrupt.running()\n"
        "print('ready', flush=True)\n"
        # C code that does not return to Python for a minute or more, as a compile
        "hashlib.pbkdf2_hmac('sha256', b'k', b's', 10**9)\n"
        "print('went on')\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline() == "ready\n"
    time.sleep(0.5)  # into the C call
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    took = time.monotonic() - started
    assert (proc.returncode, out, err) == (143, "", "remat-kit: terminated (SIGTERM)\n")
    assert 0.8 * _interrupt_grace() <= took < 20, took


# starts a process: jax's imports and backends, seconds each
@pytest.mark.slow
def test_ctrl_c_while_jax_starts_its_backends_ends_the_process_at_once():
    # jax's plugin discovery logs a KeyboardInterrupt that lands in it as a traceback and
    # goes on: the CLI starts the backends where Ctrl-C still ends the process there.
    code = (
        "import sys, signal\n"
        "sys.argv = ['remat-kit']\n"
        "from remat_kit.cli import _model, main\n"
        "def start():  # as jax's plugin discovery: the KeyboardInterrupt swallowed\n"
        "    try:\n"
        "        signal.raise_signal(signal.SIGINT)\n"
        "    except KeyboardInterrupt:\n"
        "        print('swallowed', file=sys.stderr)\n"
        "    sys.exit(5)  # and the run went on\n"
        "_model.start_backends = start\n"
        "main(['report', '--model', 'tiny-llama'])\n"
        "print('main returned')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", ONE_LINE)


def _interrupt_grace():
    from remat_kit.cli import _interrupt

    return _interrupt.GRACE
