"""Every way a ``remat-kit`` run is stopped leaves no process and no half-written file.

A real ``compare`` with two compile workers is started in a session of its own and stopped
each way a run is stopped: Ctrl-C (SIGINT to the terminal's process group), a scheduler's
SIGTERM and a closed terminal's SIGHUP (to the main process alone, as ``kill``, Kubernetes and
``timeout`` send them), and a parent killed outright (SIGKILL: no handler runs). Every process
of the session (workers, multiprocessing's resource tracker) must be gone soon after, and the
``--json`` file and the cache hold no temporary file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remat_kit.cli import _interrupt

# Each run starts with Python's own handling of the stopping signals, whatever a test before
# it in this worker left (tests/conftest.py's python_signals).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("python_signals")]

#: How long a stopped run's processes may take to go (a worker looks at its parent every
#: 0.5 s; a compile-bound main thread is ended GRACE seconds after the signal).
SETTLE = _interrupt.GRACE + 10.0


def _session(sid: int) -> list[tuple[int, str]]:
    """The live processes of session ``sid``: (pid, command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[3]) == sid:  # state, ppid, pgrp, session
            found.append((int(entry.name), cmd.strip()))
    return found


def _workers(sid: int) -> list[int]:
    return [pid for pid, cmd in _session(sid) if "spawn_main" in cmd]


def _wait(what, timeout: float, every: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(every)
    return what()


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (``SigCgt`` in its status)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next((line.split()[1] for line in text.splitlines() if line.startswith("SigCgt:")), "0")
    return bool(int(mask, 16) >> (signum - 1) & 1)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize(
    ("how", "moment"),
    [
        # starting: the CLI's imports (Ctrl-C there: tests/test_interrupt.py); workers: the
        # first worker is seen (it may still be starting: the race a parent watch must not
        # lose); compiling: 3 s on, the workers and the main process mid-compile (the one
        # case that compiles full machine code to last that long, about 20 s). SIGHUP takes
        # SIGTERM's path but for its word and its handler's rule (nohup): run once, with
        # workers up.
        ("SIGTERM", "starting"),
        ("SIGINT", "workers"),
        ("SIGHUP", "workers"),
        ("SIGKILL", "workers"),  # the parent dies: no handler runs
        ("SIGTERM", "compiling"),
    ],
)
def test_a_stopped_run_leaves_no_process_and_no_partial_file(how, moment, tmp_path):
    signum = getattr(signal, how)
    cache, out = tmp_path / "cache", tmp_path / "out.json"
    argv = ["compare", "--model", "tiny-llama", "--batch", "1", "--seq", "64", "--jobs", "2"]
    env = {**os.environ, "REMAT_KIT_CACHE_DIR": str(cache), "TMPDIR": str(tmp_path)}
    if moment == "compiling":
        # Full machine code (real ptxas): the run lasts about 40 s on a quiet machine where
        # the analysis-only one finished within the 3 s after its first worker (CI, quiet:
        # exit 0, the signal too late).
        env["REMAT_KIT_FULL_CODEGEN"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "remat_kit.cli", *argv, "--json", str(out)],
        # An empty cache: every policy compiles. The temporary directory is the test's, so
        # that what the run leaves there (XLA's kernel directories) is seen.
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own session: its processes are found by session id
    )
    try:
        if moment == "starting":
            # The CLI's handler is in (the kernel says the process catches the signal) while
            # its imports go on: a fixed sleep raced a loaded machine's slow start.
            assert _wait(lambda: _catches(proc.pid, signum), timeout=60), "no handler"
        else:
            assert _wait(lambda: _workers(proc.pid), timeout=120), "no worker started"
            if moment == "compiling":
                time.sleep(3.0)
        if how == "SIGINT":
            os.killpg(proc.pid, signum)  # a terminal's Ctrl-C reaches the whole group
        else:
            os.kill(proc.pid, signum)
        # The process itself must end; its pipes are read after the session is checked
        # (a worker's child still holding them open is what ``left`` reports, where a
        # ``communicate`` would wait on it and fail as a hang of the run).
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 60 s after {how}: {_session(proc.pid)}")
        left = _wait(lambda: not _session(proc.pid), timeout=SETTLE) or _session(proc.pid)
        _, err = proc.communicate(timeout=SETTLE)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid, _ in _session(proc.pid):
            os.kill(pid, signal.SIGKILL)
    assert left is True, f"left running: {left}"
    if how != "SIGKILL":
        words = {"SIGINT": "interrupted", "SIGTERM": "terminated", "SIGHUP": "hung up"}[how]
        assert proc.returncode == 128 + signum, err[-2000:]
        assert "Traceback" not in err, err[-2000:]
        assert err.splitlines()[-1].startswith(f"remat-kit: {words}"), err[-2000:]
        assert err.count("remat-kit:") == 1, err
    else:
        assert proc.returncode == -signal.SIGKILL
    # No half-written file: the answer is whole or absent, and no temporary file is left.
    if out.exists():
        json.loads(out.read_text())
    strays = [
        p
        for p in tmp_path.rglob("*")
        if p.name.endswith(".tmp") or ".probe." in p.name or p.name.startswith("remat_kit_")
    ]
    assert not strays, strays


#: A process with a kernel directory that starts two workers and is killed outright (SIGKILL)
#: the moment its first worker's interpreter is started, before that worker is sent what to
#: run: the one moment no process of remat-kit is left to remove the directory.
_KILLED_AS_A_WORKER_STARTS = """
import os, signal
import multiprocessing.util as util
from remat_kit._workers import _local
from remat_kit.targets import _codegen

print(_codegen.kernel_cache_file().parent, flush=True)
real = util.spawnv_passfds

def spawned(path, args, passfds):
    pid = real(path, args, passfds)
    if "spawn_main" in " ".join(map(str, args)):  # a worker, not the resource tracker
        os.kill(os.getpid(), signal.SIGKILL)
    return pid

util.spawnv_passfds = spawned
_local._submit(_local._pool(2), abs, [-1, -2], 0)
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_run_killed_as_its_first_worker_starts_leaves_no_kernel_directory(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_AS_A_WORKER_STARTS],
        env={**os.environ, "TMPDIR": str(tmp_path), "JAX_PLATFORMS": "cpu"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=60)
        left = _wait(lambda: not _session(proc.pid), timeout=SETTLE) or _session(proc.pid)
    finally:
        for pid, _ in _session(proc.pid):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL, err[-2000:]
    assert left is True, f"left running: {left}"
    made = Path(out.strip())
    assert made.name.startswith("remat_kit_kernels_"), out
    assert not made.exists()
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith("remat_kit_")]
