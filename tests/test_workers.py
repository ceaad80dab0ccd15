"""Independent compiles in spawned worker processes (``--jobs``): order, fallbacks, results."""

from __future__ import annotations

import functools
import json
import os
import signal
import threading
import time

import pytest

import remat_kit as rk
from remat_kit import _workers, cache
from remat_kit.cli import main


def _compiles(x):
    """Stands for an item that compiled a program: the cache's counter grows."""
    cache._entries._compiled += 1
    return x * x, os.getpid(), os.environ.get("JAX_PLATFORMS")


def _cached(x):
    return x * x, os.getpid(), os.environ.get("JAX_PLATFORMS")


def test_items_that_compile_go_to_spawned_workers():
    seen = []
    got = _workers.run(_compiles, [1, 2, 3, 4, 5], jobs=2, on_done=lambda i, r: seen.append(i))
    assert [r[0] for r in got] == [1, 4, 9, 16, 25]  # in the order of the items
    assert got[0][1] == os.getpid()  # the first runs here, and compiles
    assert {r[1] for r in got[1:]} - {os.getpid()}, "the rest must run in workers"
    assert all(r[2] == "cpu" for r in got[1:])  # workers start on jax's CPU platform
    assert sorted(seen) == [0, 1, 2, 3, 4]


def test_cached_items_start_no_worker():
    got = _workers.run(_cached, [1, 2, 3], jobs=2)
    assert [r[0] for r in got] == [1, 4, 9] and {r[1] for r in got} == {os.getpid()}


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_jobs_must_be_a_positive_int(bad):
    with pytest.raises(TypeError, match="positive int"):
        _workers.run(_cached, [1], jobs=bad)


def test_advise_with_jobs_needs_a_workload_factory_that_pickles():
    with pytest.raises(TypeError, match="must pickle"):
        rk.advise(lambda t: None, 1, targets=["h100", "a100-40gb"], jobs=2)


@pytest.mark.slow
def test_compare_with_two_jobs_gives_the_same_rows(tmp_path, monkeypatch):
    """The CLI's --jobs 2 (workers, no cache) and --jobs 1 print the same figures.

    The --jobs 1 side compiles into an empty cache of its own rather than under --no-cache
    (which compiles without the stand-in ptxas, a few times slower): the same figures
    (tests/test_codegen.py), and what it writes is not in the directory checked below."""
    argv = ["compare", "--model", "tiny-llama", "--batch", "2", "--seq", "64"]
    argv += ["--policies", "none,full,minimal"]
    out = {}
    for jobs, cache_dir, off in ((1, "ref_cache", []), (2, "cache", ["--no-cache"])):
        monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / cache_dir))
        path = tmp_path / f"j{jobs}.json"
        assert main([*argv, *off, "--jobs", str(jobs), "--json", str(path)]) == 0
        out[jobs] = json.loads(path.read_text())
    peaks = {j: [(r["policy"], r["peak_bytes"]) for r in rows] for j, rows in out.items()}
    assert peaks[1] == peaks[2] and len(peaks[1]) == 3
    assert not (tmp_path / "cache").exists()  # --no-cache wrote nothing, workers included


def _fake_measure(policy, schedule, batch):
    """A compile stand-in: peak grows with the batch; counts as a compile for the cache."""
    cache._entries._compiled += 1
    peak = 2**30 + batch * 2**28 + (0 if policy.is_remat else 2**29)
    t = rk.target("h100")
    return rk.MemoryReport(
        target="h100-80gb",
        target_memory_bytes=t.memory_bytes,
        usable_bytes=t.usable_bytes,
        mem_fraction=t.mem_fraction,
        fits_with_fraction=None,
        devices=1,
        peak_bytes=peak,
        argument_bytes=2**30,
        output_bytes=0,
        temp_bytes=peak - 2**30,
        alias_bytes=0,
        host_bytes=0,
        host_temp_bytes=0,
        generated_code_bytes=0,
        xla_peak_bytes=None,
        flops=float(batch),
        flops_detail={},
        tags=(),
        xla_remat=False,
        xla_remat_saved_bytes=0,
        xla_remat_limit_bytes=None,
        policy=policy.spec,
        schedule=schedule.spec,
        attention=None,
        compile_seconds=0.0,
    )


def _fake_workload(scale, t):
    return rk.sources.workload(
        rk.sources.Measured(
            _fake_measure,
            lambda p, s, b: scale * b * (1.2 if p.is_remat else 1.0),
            breakdown_fn=lambda b: {"weights": 2**29},
        ),
        t,
        rk.TrainConfig(1, 8),
    )


@pytest.mark.slow
def test_advise_workers_match_one_process():
    make = functools.partial(_fake_workload, 1.0)
    names = ["h100", "rtx4090", "l4", "a100-40gb"]
    one = rk.advise(make, 2, targets=names, jobs=1)
    two = rk.advise(make, 2, targets=names, jobs=2)
    rows = [(a.target, a.fits, a.plan, a.peak_bytes, a.max_batch) for a in one]
    assert rows == [(a.target, a.fits, a.plan, a.peak_bytes, a.max_batch) for a in two]
    assert [a.target for a in one] == ["h100-80gb", "rtx4090", "l4", "a100-40gb"]
    assert all(a.max_batch > 2 for a in one)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_stopping_the_pool_ends_a_worker_mid_job_at_once():
    import multiprocessing
    import time
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    fut = pool.submit(time.sleep, 60)  # a compile that would hold the pool for a minute
    deadline = time.perf_counter() + 60
    while not fut.running() and time.perf_counter() < deadline:  # a worker is on the job
        time.sleep(0.05)
    workers = list(pool._processes.values())
    start = time.perf_counter()
    _workers._local._stop(pool)
    assert time.perf_counter() - start < 5
    # By pid: the executor's own thread may reap a worker first, and then the Process object
    # cannot tell (is_alive stays True); gone or a zombie is dead.
    assert workers
    deadline = time.perf_counter() + 5
    while any(_running(p.pid) for p in workers) and time.perf_counter() < deadline:
        time.sleep(0.05)
    assert not any(_running(p.pid) for p in workers)
    # (the future itself is failed later, by the executor's own thread: not checked here)
    del fut


class _Came(Exception):
    pass


class _SpawningPool:
    """A pool whose first worker's start brings a stopping signal, as a Ctrl-C or a SIGTERM
    that comes while ``spawn`` starts a worker; the kernel hands it to another thread (one of
    jax's), whose mask is not the main thread's."""

    def __init__(self, signum, thread):
        self.signum, self.thread, self.submitted = signum, thread, []

    def submit(self, fn, item):
        from concurrent.futures import Future

        if not self.submitted:
            signal.pthread_kill(self.thread.ident, self.signum)
            time.sleep(0.05)  # the main thread's bytecodes, where Python runs the handler
        self.submitted.append(item)
        return Future()


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="POSIX signals")
@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_while_workers_start_is_acted_on_once_all_have_started(name):
    signum = getattr(signal, name)
    came = []

    def handler(s, frame):
        came.append(s)
        raise _Came(s)

    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    pool = _SpawningPool(signum, other)
    before = signal.signal(signum, handler)
    try:
        with pytest.raises(_Came):
            _workers._local._submit(pool, abs, [-1, -2, -3, -4], 1)
        # Every worker started (none left reading a cut pipe), then the handler ran: once,
        # and it is the handler in place again.
        assert pool.submitted == [-2, -3, -4]
        assert came == [signum]
        assert signal.getsignal(signum) is handler
    finally:
        signal.signal(signum, before)
        stop.set()


@pytest.mark.parametrize("command", ["policies", "report"])
def test_ctrl_c_is_one_line_and_exit_130(command, monkeypatch, capsys):
    import remat_kit.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt

    real = cli._parser

    def parser(name):
        p, runs = real(name)
        return p, {k: interrupted for k in runs}

    monkeypatch.setattr(cli, "_parser", parser)
    argv = [command] if command == "policies" else [command, "--model", "tiny-llama"]
    assert main(argv) == 130
    out, err = capsys.readouterr()
    assert err == "remat-kit: interrupted\n" and "Traceback" not in out
