"""Shared fixtures. The suite runs on a CPU-only machine; GPU figures come from
deviceless compiles, which need JAX_PLATFORMS=cpu before jax initializes.

GPU compiles cost seconds each, so reports are built once per session and shared. The
session's private compile cache is the root conftest.py's (the doctests share it).
"""

import functools
import os
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
_sharded_runs: dict[str, subprocess.CompletedProcess | BaseException] = {}
_sharded_done: dict[str, threading.Event] = {}
_sharded_procs: list[subprocess.Popen] = []
_session_over = threading.Event()


def _run_sharded(group: str, env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    """Runs ``tests/sharded_step.py group`` to its end (8 fake devices, which must be fixed
    when jax starts: hence a subprocess)."""
    # Files, not pipes: nobody reads the output until the run is over.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "sharded_step.py"), group],
            env=env,
            stdout=out,
            stderr=err,
            text=True,
        )
        _sharded_procs.append(proc)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()  # its return code (-9) fails the test, with its stderr
            proc.wait()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())


def _run_in_background(groups: list[str]) -> None:
    """Runs ``groups`` one after the other in a thread: beside the in-process tests (one core
    for them, one for the subprocess) instead of holding up the tests that read them."""
    for group in groups:
        _sharded_done[group] = threading.Event()
    env = {  # taken here, not in the thread, while a test may be changing os.environ
        **os.environ,
        # -O0 code generation: a third of the compile time, the same HLO (the same numbers).
        "XLA_FLAGS": " ".join(
            [
                "--xla_force_host_platform_device_count=8",
                "--xla_backend_optimization_level=0",
                *PROCESS_FLAGS,
            ]
        ),
        "JAX_PLATFORMS": "cpu",
    }

    def work():
        for group in groups:
            try:
                if not _session_over.is_set():
                    _sharded_runs[group] = _run_sharded(group, env)
            except BaseException as e:  # handed to the test that reads it
                _sharded_runs[group] = e
            finally:
                _sharded_done[group].set()

    threading.Thread(target=work, name="sharded_step", daemon=True).start()


def _sharded_run(group: str) -> subprocess.CompletedProcess:
    """The finished run of ``tests/sharded_step.py group``: its exit code and output."""
    if group not in _sharded_done:  # not started with the session: run it now
        _run_in_background([group])
    _sharded_done[group].wait()
    got = _sharded_runs[group]
    if isinstance(got, BaseException):
        raise got
    return got


@pytest.fixture(autouse=True, scope="session")
def _sharded_steps_in_background(request, _private_compile_cache):
    """Starts the sharded-step runs the collected tests will read, in the order they come."""
    files = [item.path.name for item in request.session.items]
    groups = [SHARDED_GROUPS[f] for f in dict.fromkeys(files) if f in SHARDED_GROUPS]
    # Under pytest-xdist every worker collects every test but runs only its share: started
    # here, each group would run once per worker. There the test that reads a group starts it.
    if groups and "PYTEST_XDIST_WORKER" not in os.environ:
        _run_in_background(groups)
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
