"""Compiles on a Dask cluster (``--cluster``): the same figures as here, a rerun warm here, a
dead worker survived, failures named, and the errors that come before any compile.

The cluster is real: a scheduler and two worker processes on 127.0.0.1, started once for the
module (``distributed.LocalCluster``) and stopped after it. The workers keep their own cache
folder, so what reaches this process's cache came back with the results.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import threading
import time
import types

import pytest

from remat_kit import _workers, cache
from remat_kit._workers import _cluster, _tasks
from remat_kit.cli import main
from remat_kit.errors import BadValue

distributed = pytest.importorskip("distributed")

_TIMING = ("compile_seconds", "seconds")  # wall times: not figures of the program


# The tests that need no cluster first: they run before the module's cluster starts.


def test_a_worker_with_other_versions_is_refused_in_one_line(monkeypatch):
    here = _tasks.versions()
    theirs = {**here, "jax": "0.0.1"}

    class Client:
        closed = False

        def __init__(self, address, **kw):
            pass

        def wait_for_workers(self, n, timeout):
            pass

        def run(self, fn):
            return {"tcp://10.0.0.2:4000": theirs}

        def close(self):
            Client.closed = True

    # The fake client needs no network (what answers at 10.0.0.2:8786 depends on the machine).
    monkeypatch.setattr(_cluster, "_probe", lambda address, timeout: None)
    monkeypatch.setattr(_cluster, "_greet", lambda distributed, address, timeout: None)
    monkeypatch.setitem(sys.modules, "distributed", types.SimpleNamespace(Client=Client))
    with pytest.raises(BadValue, match=f"runs jax 0.0.1, this process jax {here['jax']}"):
        _workers.connect("tcp://10.0.0.2:8786")
    assert Client.closed


def test_without_distributed_the_cli_names_the_extra_before_any_compile(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import fails, as when absent
    before = cache.compiles()
    # A model that is not there: the missing extra is said first, before the model is read.
    argv = ["--model", "no/such/model.py:f", "--cluster", "tcp://127.0.0.1:8786"]
    for command in ("compare", "advise"):
        assert main([command, *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "pip install 'remat-kit[cluster]'" in err, err
    assert cache.compiles() == before
    with pytest.raises(BadValue, match=r"remat-kit\[cluster\]"):
        _workers.connect("tcp://127.0.0.1:8786")


@pytest.mark.parametrize(
    ("address", "says"),
    [("nonsense", "not a Dask scheduler's address"), ("tcp://127.0.0.1:9", "no Dask scheduler")],
)
def test_a_bad_address_is_one_line(address, says):
    with pytest.raises(BadValue, match=says):
        _workers.connect(address, timeout=0.5)


def test_a_port_that_does_not_answer_is_refused_before_a_client_starts(monkeypatch):
    # distributed's client has hung in its own start when it could not connect (a CI run
    # waited 19 minutes): the socket probe answers first, and no client is made.
    import distributed

    def no_client(*args, **kwargs):
        raise AssertionError("a Dask client was started for an address that does not answer")

    monkeypatch.setattr(distributed, "Client", no_client)
    with pytest.raises(BadValue, match=r"no Dask scheduler answered at 'tcp://127\.0\.0\.1:9'"):
        _workers.connect("tcp://127.0.0.1:9", timeout=0.5)


def _not_dask(conn):
    """What a port that is no Dask scheduler does with a connection: keeps it, silent
    (a stalled server), or answers in HTTP and closes it."""
    conns = []

    def serve(sock):
        while True:
            try:
                c, _ = sock.accept()
            except TimeoutError:  # look again whether the test is over
                continue
            except OSError:  # the listening socket was closed: the test is over
                return
            if conn == "silent":
                conns.append(c)
            else:
                with c:
                    c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    return serve, conns


@pytest.mark.parametrize(
    ("conn", "got"),
    [
        ("silent", "accepted a connection, then sent no Dask handshake"),
        ("http", "answered, not in Dask's protocol"),
    ],
)
def test_a_port_that_is_no_scheduler_is_refused_within_the_timeout(conn, got):
    # distributed's client waits for a handshake without end (it hung past 5 min at
    # timeout=2 for the silent port), and for the HTTP port it failed with a MemoryError
    # and left its loop thread running.
    serve, conns = _not_dask(conn)
    sock = socket.create_server(("127.0.0.1", 0))
    sock.settimeout(0.1)  # a blocked accept() would not see the socket closed
    server = threading.Thread(target=serve, args=(sock,), daemon=True)
    server.start()
    address = f"tcp://127.0.0.1:{sock.getsockname()[1]}"
    before = set(threading.enumerate())
    outcome = []

    def attempt():
        start = time.monotonic()
        try:
            _workers.connect(address, timeout=2)
        except BaseException as err:
            outcome.append(err)
        outcome.append(time.monotonic() - start)

    try:
        runner = threading.Thread(target=attempt, daemon=True)
        runner.start()
        runner.join(timeout=2 + 15)  # the hang bound: a hung connect fails here, not in CI
        assert not runner.is_alive(), f"connect({address!r}, timeout=2) still runs after 17 s"
        err, elapsed = outcome
        with pytest.raises(
            BadValue,
            match=rf"no Dask scheduler answered at {re.escape(repr(address))} "
            rf"within 2 s \(the port {re.escape(got)}\)",
        ):
            raise err
        assert err.param == "cluster" and "\n" not in str(err)
        assert elapsed < 2 + 15
        # No client, loop or connection thread of the attempt outlives it.
        assert set(threading.enumerate()) - before == set()
    finally:
        sock.close()
        for c in conns:
            c.close()
        server.join(timeout=5)


@pytest.mark.slow
def test_a_task_starts_jax_on_the_cpu_platform_where_the_worker_was_not_told():
    code = (
        "import os; from remat_kit._workers._tasks import call, payload; "
        "print(call(payload(os.getenv, 'JAX_PLATFORMS'), (), None).result)"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["cpu"], out.stderr[-500:]


def test_a_factory_file_travels_with_its_request(tmp_path):
    text = pathlib.Path("tests/data/factories.py").read_text(encoding="utf-8")
    request = functools.partial(print, {"model": "tests/data/factories.py:deep"})
    assert _tasks.factory_files(request) == (("tests/data/factories.py", text),)
    # On a worker the client's path need not exist: the shipped copy is what loads.
    from remat_kit.sources import load_factory

    blob = _tasks.payload(load_factory, "no/such/folder/model.py:deep")
    done = _tasks.call(blob, (("no/such/folder/model.py", text),), None)
    assert done.result.__name__ == "deep" and done.entries == ()
    with pytest.raises(BadValue, match="no such file"):
        _tasks.call(blob, (), None)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    workers_cache = tmp_path_factory.mktemp("workers_cache")
    lc = distributed.LocalCluster(
        n_workers=2,
        processes=True,
        threads_per_worker=1,
        host="127.0.0.1",
        # The scheduler serves HTTP (health, metrics) with the dashboard off too, at :8787
        # unless told: a port the OS picks, so a second cluster on the machine (another
        # pytest worker's, a user's) is no warning that 8787 is taken.
        dashboard_address=":0",
        worker_dashboard_address=None,
        env={"JAX_PLATFORMS": "cpu", cache.ENV_DIR: str(workers_cache)},
    )
    client = distributed.Client(lc, set_as_default=False)
    try:
        yield lc.scheduler_address, client
    finally:
        client.close()
        lc.close()


def _figures(path):
    rows = json.loads(path.read_text())
    return [{k: v for k, v in r.items() if k not in _TIMING} for r in rows]


@pytest.mark.slow
def test_compare_on_the_cluster_gives_the_local_figures_and_a_warm_rerun(
    cluster, tmp_path, monkeypatch
):
    address, _ = cluster
    argv = ["compare", "--model", "tiny-llama", "--batch", "2", "--seq", "32"]
    argv += ["--policies", "none,full"]
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "client_cache"))  # empty: all compile
    sent = len(_workers.remote_stats())
    assert main([*argv, "--cluster", address, "--json", str(tmp_path / "there.json")]) == 0
    remote = _workers.remote_stats()[sent:]
    # The first compiles here (that is how a cold sweep is told from a warm one), the
    # other in a worker process.
    assert len(remote) == 1 and remote[0].compiles >= 1
    assert remote[0].worker.rsplit(":", 1)[1] != str(os.getpid())
    # Here with an empty cache of its own (--no-cache would compile without the stand-in
    # ptxas, about three times slower).
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "here_cache"))
    before = cache.compiles()
    assert main([*argv, "--jobs", "1", "--json", str(tmp_path / "here.json")]) == 0
    assert cache.compiles() - before == 2  # both compiled here
    assert _figures(tmp_path / "there.json") == _figures(tmp_path / "here.json")
    # The worker's cache entries came back to this machine's cache: the rerun compiles
    # nothing, here or there.
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "client_cache"))
    before = cache.compiles()
    assert main([*argv, "--cluster", address, "--json", str(tmp_path / "again.json")]) == 0
    assert len(_workers.remote_stats()) == sent + 1 and cache.compiles() == before
    assert _figures(tmp_path / "again.json") == _figures(tmp_path / "here.json")


@pytest.mark.slow
def test_advise_on_the_cluster_gives_the_local_figures(cluster, tmp_path, monkeypatch):
    """One GPU under two names: the first is planned here, the second in a worker process
    (its own cache: it compiles too); the two rows must agree to the byte.

    Cold caches, not --no-cache (which compiles without the stand-in ptxas, about three
    times slower): an empty one here, and a batch no other test of the module compiles, so
    the workers' cache has none of its programs either."""
    address, _ = cluster
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "client_cache"))  # empty: all compile
    argv = ["advise", "--model", "tiny-llama", "--batch", "3", "--seq", "32"]
    argv += ["--targets", "h100,h100-80gb", "--cluster", address]
    sent = len(_workers.remote_stats())
    assert main([*argv, "--json", str(tmp_path / "advice.json")]) == 0
    remote = _workers.remote_stats()[sent:]
    assert len(remote) == 1 and remote[0].compiles >= 1
    here, there = _figures(tmp_path / "advice.json")
    assert here["target"] == there["target"] == "h100-80gb" and here["fits"]
    assert here == there


@pytest.mark.slow
def test_fit_searches_its_policies_on_the_cluster_with_the_local_answers(
    cluster, tmp_path, monkeypatch
):
    """The first policy's search runs here, the second in a worker process (its own cache:
    it compiles too); the rows, and the compiles counted, equal a local run's.

    Each run here with an empty cache of its own, not --no-cache (which compiles without
    the stand-in ptxas, about three times slower); no other test of the module compiles
    for an L4, so the workers' cache has none of these programs."""
    address, _ = cluster
    argv = ["fit", "--model", "tiny-llama", "--seq", "32", "--target", "l4"]
    argv += ["--policies", "full,none"]
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "cache_there"))  # empty: all compile
    sent = len(_workers.remote_stats())
    assert main([*argv, "--cluster", address, "--json", str(tmp_path / "there.json")]) == 0
    remote = _workers.remote_stats()[sent:]
    assert len(remote) == 1 and remote[0].compiles >= 1
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "cache_here"))  # empty again
    assert main([*argv, "--jobs", "1", "--json", str(tmp_path / "here.json")]) == 0
    there, here = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("there", "here"))
    assert there["compiles"] == here["compiles"]
    drop = {"seconds", *_TIMING}
    assert [{k: v for k, v in r.items() if k not in drop} for r in there["rows"]] == [
        {k: v for k, v in r.items() if k not in drop} for r in here["rows"]
    ]


def _compiles(marker_dir, x):
    """An item that counts as a compile; the item 3 kills its worker the first time."""
    cache._entries._compiled += 1
    marker = os.path.join(marker_dir, f"died-{x}")
    if x == 3 and not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(1)  # the worker process dies mid-sweep; its nanny starts another
    return x * x, os.getpid()


def _fails(x):
    cache._entries._compiled += 1
    if x == 2:
        raise RuntimeError("out of host memory\nsecond line")
    return x


@pytest.mark.slow
def test_a_worker_that_dies_mid_sweep_is_replaced_and_the_sweep_completes(cluster, tmp_path):
    _, client = cluster
    fn = functools.partial(_compiles, str(tmp_path))
    got = _workers.run(fn, [1, 2, 3, 4, 5], jobs=1, executor=client.get_executor())
    assert [r[0] for r in got] == [1, 4, 9, 16, 25]
    assert (tmp_path / "died-3").exists()  # it did die once, and was run again


@pytest.mark.slow
def test_an_item_that_raises_is_named_and_the_others_complete(cluster, tmp_path):
    _, client = cluster
    seen = []
    with pytest.raises(_workers.ClusterError, match=r"1 of 4 items .*2: RuntimeError: out of") as e:
        _workers.run(
            _fails,
            [1, 2, 3, 4],
            jobs=1,
            executor=client.get_executor(),
            on_done=lambda i, r: seen.append(r),
        )
    assert "\n" not in str(e.value) and e.value.failures == (("2", e.value.failures[0][1]),)
    assert sorted(seen) == [1, 3, 4]


@pytest.mark.slow
def test_connect_checks_the_workers_versions(cluster):
    address, client = cluster
    client.wait_for_workers(2, timeout=30)  # one may be restarting after the test above
    got = _workers.connect(address)
    try:
        assert got.workers == 2
        assert all(v == _tasks.versions() for v in got.versions.values())
    finally:
        got.close()


def _fake_row(self, pol):
    """A policy's throughput row without its search: the batch tells the policies apart; a
    compile counted as the search would."""
    cache._entries._compiled += 1
    self.workload._cache.reports[("fake", pol.spec)] = None  # counts as one compile
    batch = {"none": 2, "full": 8, "minimal": 4}[pol.spec]
    row = self._none_fits(pol.spec, pol.spec, 2**20, None, largest=batch)
    return dataclasses.replace(row, batch=batch, micro_batch=batch, accum=1)


def test_fit_throughput_hands_its_policies_to_any_executor(monkeypatch):
    """``fastest(executor=...)``: the catalogue policies and the ``none`` baseline are the
    executor's items (a thread pool here: any ``concurrent.futures.Executor``); each row lands
    in its policy's place, the compiles of all are counted."""
    from concurrent.futures import ThreadPoolExecutor

    import remat_kit as rk
    from remat_kit.cli._fit import _accumulating
    from remat_kit.cli._model import Request
    from remat_kit.search import _throughput
    from remat_kit_models.spec import PresetSpec

    monkeypatch.setattr(_throughput._Search, "policy", _fake_row)
    request = Request(PresetSpec("tiny-llama"), rk.TrainConfig(2, 32, optimizer="sgd"))
    build = functools.partial(_accumulating, request, rk.target("h100"), None, 1)
    kw = {"limit_bytes": 2**24}
    here = rk.search.fastest(build(), ["minimal", "full"], **kw)
    with ThreadPoolExecutor(2) as pool:
        there = rk.search.fastest(
            build(), ["minimal", "full"], executor=pool, workload_for=build, **kw
        )
        with pytest.raises(BadValue, match="workload_for"):
            rk.search.fastest(build(), ["full"], executor=pool, **kw)
    assert [(r.policy, r.batch) for r in there.rows] == [("minimal", 4), ("full", 8)]
    assert there.rows == here.rows
    assert there.baseline.policy == "none" and there.baseline == here.baseline
    assert there.compiles == here.compiles == 3
