"""Shared fixtures. The suite runs on a CPU-only machine; GPU figures come from
deviceless compiles, which need JAX_PLATFORMS=cpu before jax initializes.

GPU compiles cost seconds each, so reports are built once per session and shared. The
session's private compile cache is the root conftest.py's (the doctests share it).
"""

import functools
import os
import signal
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest

from remat_kit.targets import PROCESS_FLAGS

HERE = Path(__file__).resolve().parent

#: A small bf16 Llama whose train step shows remat effects on a GPU target.
SMALL = dict(
    model="tiny-llama",
    batch=4,
    seq=1024,
    optimizer="sgd",
    param_dtype="bf16",
    dtype="bf16",
    attention="xla",
    overrides=(
        ("layers", 4),
        ("width", 512),
        ("heads", 8),
        ("kv_heads", 4),
        ("ff", 1024),
        ("vocab", 1024),
        ("max_seq", 1024),
    ),
)


#: SMALL's keys that shape the model (``PresetSpec``); the rest set the train config.
_SPEC_KEYS = ("overrides", "lora", "attention", "scan_layers", "dropout", "shard")
_CONFIG_KEYS = ("batch", "seq", "optimizer", "accum", "precision", "param_dtype", "dtype")


def small_request(scan: bool = True, **changes):
    """SMALL with ``changes`` (SMALL's keys) as a preset spec and its train config."""
    import remat_kit as rk
    from remat_kit_models.spec import PresetSpec

    fields = {**SMALL, "scan_layers": scan, **changes}
    unknown = set(fields) - {"model", *_SPEC_KEYS, *_CONFIG_KEYS}
    if unknown:
        raise TypeError(f"not a key of SMALL: {sorted(unknown)}")
    spec = PresetSpec(fields["model"], **{k: fields[k] for k in _SPEC_KEYS if k in fields})
    config = rk.TrainConfig(
        fields["batch"],
        fields["seq"],
        optimizer=fields.get("optimizer", "adamw"),
        accum=fields.get("accum", 1),
        lora=spec.lora > 0,
        precision=rk.train.regime(
            fields.get("precision"), params=fields.get("param_dtype"), compute=fields.get("dtype")
        ),
    )
    return spec, config


@functools.cache
def small_report(
    policy: str, target: str = "h100-80gb", scan: bool = True, schedule: str = "none", **changes
):
    """The compiled report of SMALL under ``policy`` (cached for the session)."""
    import remat_kit as rk

    spec, config = small_request(scan, **changes)
    src = rk.sources.resolve(spec)
    baseline = rk.sources.step_flops(src, "none", target, config)
    return rk.sources.measure(
        src, policy, target, config, schedule=schedule, baseline=baseline, warn=False
    )


@pytest.fixture(scope="session")
def small():
    return small_report


# --- tests/sharded_step.py: one train step on 8 fake CPU devices, in a subprocess -----------------

#: The test file that reads each group of tests/sharded_step.py.
SHARDED_GROUPS = {"test_context_parallel.py": "cp", "test_sharding.py": "sharding"}
#: The groups the session's collected tests read, all run by one subprocess: jax starts once
#: and each model's one-device reference compiles once for both files.
_sharded_groups: list[str] = []
_sharded_whole: dict[tuple[str, ...], subprocess.CompletedProcess | BaseException] = {}
_sharded_done: dict[tuple[str, ...], threading.Event] = {}
_sharded_procs: list[subprocess.Popen] = []
_sharded_lock = threading.Lock()
_sharded_shared: list[Path] = []  # under pytest-xdist: the folder the workers share
_session_over = threading.Event()


def _sharded_env() -> dict:
    """The subprocess's environment: 8 fake CPU devices, and the compile flags of the suite
    (tests/../conftest.py) and of the CLI, which XLA reads as jax starts there."""
    return {  # taken by the caller, not in a thread, while a test may be changing os.environ
        **os.environ,
        "XLA_FLAGS": " ".join(
            [
                "--xla_force_host_platform_device_count=8",
                # -O0 code generation: a third of the compile time, the same HLO (the same
                # numbers); the machine code of a compile made on one thread.
                "--xla_backend_optimization_level=0",
                "--xla_cpu_parallel_codegen_split_count=1",
                *PROCESS_FLAGS,
            ]
        ),
        "JAX_PLATFORMS": "cpu",
    }


def _run_sharded(groups: tuple[str, ...], env: dict, timeout: float = 900):
    """Runs ``tests/sharded_step.py *groups`` to its end (8 fake devices, which must be fixed
    when jax starts: hence a subprocess)."""
    # Files, not pipes: nobody reads the output until the run is over.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "sharded_step.py"), *groups],
            env=env,
            stdout=out,
            stderr=err,
            text=True,
        )
        _sharded_procs.append(proc)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()  # its return code (-9) fails the tests, with its stderr
            proc.wait()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())


def _group_of(whole: subprocess.CompletedProcess, group: str) -> subprocess.CompletedProcess:
    """``group``'s share of a run of several groups, as a run of that group alone reads: its
    rows, and exit code 0 only if the run said the group passed (a run that died before
    saying so fails each group it had not finished)."""
    import json

    rows, passed = [], False
    for line in whole.stdout.splitlines():
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if row.pop("group", None) != group:
            continue
        if "passed" in row:
            passed = row["passed"] is True
        else:
            rows.append(json.dumps(row))
    code = 0 if passed else (whole.returncode or 1)
    out = "".join(f"{row}\n" for row in rows)
    return subprocess.CompletedProcess(whole.args, code, out, whole.stderr)


def _run_in_background(groups: tuple[str, ...]) -> None:
    """Runs ``groups`` in one subprocess, from a thread: beside the in-process tests (one core
    for them, one for the subprocess) instead of holding up the tests that read them."""
    _sharded_done[groups] = threading.Event()
    env = _sharded_env()

    def work():
        try:
            if not _session_over.is_set():
                _sharded_whole[groups] = _run_sharded(groups, env)
        except BaseException as e:  # handed to the tests that read it
            _sharded_whole[groups] = e
        finally:
            _sharded_done[groups].set()

    threading.Thread(target=work, name="sharded_step", daemon=True).start()


def _shared_run(groups: tuple[str, ...], group: str) -> subprocess.CompletedProcess:
    """Under pytest-xdist: the run of ``groups``, made once for all the session's workers.
    The first worker to need it runs it while holding a lock on a file in the folder the
    workers share; another reads what it wrote. One that finds the run still going runs its
    own ``group`` alone rather than wait on it idle (the cost of two runs, as before)."""
    import fcntl
    import json

    folder = _sharded_shared[0]
    name = "sharded_step-" + "-".join(groups)
    result = folder / f"{name}.json"
    with open(folder / f"{name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _run_sharded((group,), _sharded_env())
        if result.exists():
            got = json.loads(result.read_text())
            return subprocess.CompletedProcess(*got)
        proc = _run_sharded(groups, _sharded_env())
        part = result.with_suffix(".part")
        part.write_text(json.dumps([proc.args, proc.returncode, proc.stdout, proc.stderr]))
        part.replace(result)
        return proc


def _sharded_run(group: str) -> subprocess.CompletedProcess:
    """The finished run of ``tests/sharded_step.py group``: its exit code and output (its
    share of the one run of the session's groups)."""
    groups = tuple(_sharded_groups) if group in _sharded_groups else (group,)
    if _sharded_shared:
        return _group_of(_shared_run(groups, group), group)
    with _sharded_lock:
        if groups not in _sharded_done:  # not started with the session: run it now
            _run_in_background(groups)
    _sharded_done[groups].wait()
    got = _sharded_whole[groups]
    if isinstance(got, BaseException):
        raise got
    return _group_of(got, group)


@pytest.fixture(autouse=True, scope="session")
def _sharded_steps_in_background(request, tmp_path_factory, _private_compile_cache):
    """Starts the one sharded-step run of the groups the collected tests will read."""
    files = [item.path.name for item in request.session.items]
    _sharded_groups[:] = [SHARDED_GROUPS[f] for f in dict.fromkeys(files) if f in SHARDED_GROUPS]
    if "PYTEST_XDIST_WORKER" in os.environ:
        # Under pytest-xdist every worker collects every test but runs only its share (a
        # file whole, under --dist loadfile): the first test that reads a group runs them
        # all, once for the workers, which share the folder above their own basetemp.
        _sharded_shared[:] = [tmp_path_factory.getbasetemp().parent]
    elif _sharded_groups:
        _run_in_background(tuple(_sharded_groups))
    yield
    _session_over.set()
    for proc in _sharded_procs:
        if proc.poll() is None:  # a run the session stopped before reading (-x, ^C)
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def sharded_run():
    """``sharded_run(group)``: the finished run of ``tests/sharded_step.py group``, which the
    session started when it began (this module's state: the test files must not import it)."""
    return _sharded_run


@pytest.fixture
def python_signals():
    """Python's own handling of the signals that stop a run (Ctrl-C's handler, SIGTERM and
    SIGHUP at their defaults) in this process for the test, whatever a test before it in
    this worker left: a run started here inherits an ignored signal (exec keeps SIG_IGN),
    and the CLI, as a background job or ``nohup`` asks, then leaves it ignored. A CI worker
    had SIGINT ignored by the time test_stop ran: its Ctrl-C reached nothing, the run ended
    0."""
    stopping = {
        signal.SIGINT: signal.default_int_handler,
        signal.SIGTERM: signal.SIG_DFL,
        signal.SIGHUP: signal.SIG_DFL,
    }
    before = {s: signal.getsignal(s) for s in stopping}
    for s, handler in stopping.items():
        signal.signal(s, handler)
    yield
    for s, handler in before.items():
        signal.signal(s, handler)


@pytest.fixture
def pool():
    """A thread pool as the ``concurrent.futures.Executor`` a spread or a sweep sends its
    items to: the seam's tests see which item ran where without starting processes."""
    with ThreadPoolExecutor(2) as ex:
        yield ex


@pytest.fixture
def no_compile(monkeypatch):
    """Fails the test if anything reaches XLA's compile: an input refused before any."""
    import jax

    def refuse(self, *args, **kwargs):
        raise AssertionError("compiled: this input must be refused before any compile")

    monkeypatch.setattr(jax.stages.Lowered, "compile", refuse)
