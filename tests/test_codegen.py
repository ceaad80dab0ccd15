"""Analysis-only GPU compiles: no machine code, the same memory analysis."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import jax
import pytest

import remat_kit as rk
from remat_kit import cache, xla
from remat_kit.analysis import abstract
from remat_kit.targets import _codegen as codegen

needs_ptxas = pytest.mark.skipif(
    codegen.real_cuda_dir() is None, reason="no CUDA ptxas (the jax[cuda12] wheels) here"
)


def _figures(mem):
    d = mem.to_dict()
    for k in ("compile_seconds", "xla_messages"):
        d.pop(k)
    return d


def _lowered(policy, target):
    from conftest import small_request
    from remat_kit_models.configure import model_config
    from remat_kit_models.source import train_step

    spec, config = small_request()
    step = train_step(spec, model_config(spec, config, policy, target), config, target)
    args = abstract(step.args, target.sharding())
    return jax.jit(step.fn, donate_argnums=step.donate_argnums).lower(*args)


@pytest.mark.slow
@needs_ptxas
# One case meets everything the options do: a program with host memory (its device side is
# what a plain policy's is) on a GPU architecture other than the H100 most tests compile for.
# Each further case compiled the same kernels through the same options (an H100 with host
# memory, an RTX 4090 under full: about 25 s each of full machine code) and was dropped.
@pytest.mark.parametrize("target,policy", [("rtx4090", "offload_dots_no_batch")])
def test_analysis_only_compile_reads_the_same_analysis(target, policy):
    t = rk.target(target)
    options = codegen.analysis_options(t)
    assert options.get("xla_gpu_cuda_data_dir"), "a stand-in ptxas must be in use here"
    low = _lowered(policy, t)
    full = xla.compile_memory(low, measure_xla_remat=False)
    fast = xla.compile_memory(low, options=options, measure_xla_remat=False)
    assert _figures(fast) == _figures(full)
    # XLA took the kernel file: the next program with these fusions reads them from there.
    assert os.path.getsize(options[cache.KERNEL_CACHE_OPTION]) > 0
    if "offload" in policy:
        assert fast.host_bytes > 0  # the comparison covers host memory too


@needs_ptxas
def test_stand_in_writes_an_empty_object_and_asks_the_real_ptxas_its_version(tmp_path):
    stub = codegen.stub_cuda_dir(tmp_path / "root")
    real = codegen.real_cuda_dir()
    exe = str(stub / "bin" / "ptxas")
    (tmp_path / "k.ptx").write_text("// not even PTX: it is never read")
    out = tmp_path / "k.cubin"
    out.write_text("stale")
    subprocess.run([exe, str(tmp_path / "k.ptx"), "-o", str(out), "-arch", "sm_90a"], check=True)
    assert out.read_bytes() == b""
    mine = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    theirs = subprocess.run(
        [str(real / "bin" / "ptxas"), "--version"], capture_output=True, text=True, check=True
    )
    assert mine.stdout == theirs.stdout and "ptxas" in mine.stdout
    assert (stub / "nvvm").resolve() == (real / "nvvm").resolve()
    # XLA runs it: nobody but its owner may change what it runs.
    mode = stat.S_IMODE(os.stat(exe).st_mode)
    assert mode & 0o700 == 0o700 and mode & 0o022 == 0, oct(mode)


@needs_ptxas
@pytest.mark.parametrize("where", ["new", "under-new-folders", "existing"])
def test_stand_in_is_made_once_in_place(tmp_path, where):
    # A fresh machine's cache folder and the folders above it may not exist yet; a folder
    # another run (or another CUDA's stand-in) made already is used as it is.
    root = (
        tmp_path / "cache" / "remat_kit" / "root"
        if where == "under-new-folders"
        else tmp_path / "root"
    )
    if where == "existing":
        root.mkdir()
    first = codegen.stub_cuda_dir(root)
    assert first is not None and first.parent == root
    script = (first / "bin" / "ptxas").stat().st_mtime_ns
    assert codegen.stub_cuda_dir(root) == first
    assert (first / "bin" / "ptxas").stat().st_mtime_ns == script, "made again"
    assert [p.name for p in root.iterdir()] == [first.name], "a temporary directory was left"


@needs_ptxas
def test_no_stand_in_where_the_cache_directory_cannot_be_written(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert codegen.stub_cuda_dir(blocker / "root") is None
    monkeypatch.setenv(cache.ENV_DIR, str(blocker / "cache"))
    options = codegen.analysis_options(rk.target("h100"))
    assert "xla_gpu_cuda_data_dir" not in options
    assert options["xla_backend_optimization_level"] == 0


@needs_ptxas
def test_no_stand_in_when_the_cache_is_off(tmp_path, monkeypatch):
    """--no-cache writes nothing in the cache directory, the stand-in included."""
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "cache"))
    with cache.bypassed():
        options = codegen.analysis_options(rk.target("h100"))
    assert "xla_gpu_cuda_data_dir" not in options and options
    assert not (tmp_path / "cache").exists()
    assert "xla_gpu_cuda_data_dir" in codegen.analysis_options(rk.target("h100"))


@needs_ptxas
def test_the_kernel_file_goes_with_the_stand_in_and_is_the_processs_own(monkeypatch):
    option = cache.KERNEL_CACHE_OPTION
    mine = codegen.kernel_cache_file()
    assert codegen.analysis_options(rk.target("h100"))[option] == str(mine)
    assert stat.S_IMODE(mine.parent.stat().st_mode) == 0o700
    with cache.bypassed():  # no stand-in: the kernels would be real, and nobody's to share
        assert option not in codegen.analysis_options(rk.target("h100"))
    monkeypatch.setenv(codegen.ENV_FULL, "1")
    assert option not in codegen.analysis_options(rk.target("h100"))
    # A forked child (another process id) writes a file of its own.
    monkeypatch.setattr(codegen.os, "getpid", lambda: -1)
    child = codegen.kernel_cache_file()
    try:
        assert child is not None and child.parent != mine.parent
    finally:
        shutil.rmtree(child.parent)


@pytest.mark.slow
def test_the_kernel_directory_goes_when_the_process_exits():
    code = "from remat_kit.targets._codegen import kernel_cache_file as f; print(f().parent)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    made = Path(out.strip())
    assert made.name.startswith("remat_kit_kernels_") and not made.exists()


@pytest.mark.parametrize("forked", [False, True], ids=["owner", "forked-child"])
def test_a_kernel_directory_is_removed_at_exit_by_its_own_process_only(
    tmp_path, monkeypatch, forked
):
    # The fast half of the test above: the exit hooks a kernel directory is made with
    # (atexit's and multiprocessing's, caught here, not run at exit) remove it in the
    # process that made it, and not in a forked child, which inherits the hooks while the
    # parent still uses the directory.
    import tempfile

    hooks = []
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(codegen.atexit, "register", hooks.append)
    finalize = lambda obj, hook, **kw: hooks.append(hook)
    monkeypatch.setattr(codegen.multiprocessing.util, "Finalize", finalize)
    made = codegen._kernel_dir.__wrapped__(os.getpid())
    assert made is not None and made.parent == tmp_path and len(hooks) == 2
    # Named by its owner, as the clean-up of ended processes' directories finds them (screen
    # 97: _codegen.py:225's `prefix=` left out made a directory nothing would clean).
    assert codegen._kernel_dirs(os.getpid()) == [made]
    if forked:
        monkeypatch.setattr(codegen.os, "getpid", lambda: os.getppid())
    for hook in hooks:
        hook()
    assert made.exists() is forked


@pytest.mark.parametrize("target", ["cpu", "local"])
def test_targets_whose_programs_run_get_no_options(target):
    assert codegen.analysis_options(rk.target(target)) == {}


def test_full_codegen_switch(monkeypatch):
    monkeypatch.setenv(codegen.ENV_FULL, "1")
    # What a deviceless compile needs to succeed at all stays (issue 22); the speed-ups go.
    assert codegen.analysis_options(rk.target("h100")) == dict(codegen.DEVICELESS_OPTIONS)
    monkeypatch.setenv(codegen.ENV_FULL, "0")
    options = codegen.analysis_options(rk.target("h100"))
    assert options.items() > codegen.DEVICELESS_OPTIONS.items()


def test_key_names_the_stand_in_by_what_it_is(tmp_path):
    program, t = "module @m {}", rk.target("h100")
    mine = {"xla_backend_optimization_level": 0, "xla_gpu_cuda_data_dir": "/home/a/x"}
    yours = {"xla_backend_optimization_level": 0, "xla_gpu_cuda_data_dir": "/home/b/y"}
    # Each process keeps its kernels in a file of its own: one key across processes.
    mine[cache.KERNEL_CACHE_OPTION] = "/tmp/remat_kit_kernels_a/kernels.bin"
    yours[cache.KERNEL_CACHE_OPTION] = "/tmp/remat_kit_kernels_b/kernels.bin"
    key = lambda o: cache.entry_key(program, t, codegen.key_options(o))
    assert key(mine) == key(yours)
    assert key(mine) != key({}), "a full compile and an analysis-only one share no entry"


def test_gpu_reports_compile_with_the_targets_options(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path))  # empty: every report compiles
    seen = []
    real = xla.compile_memory

    def spy(lowered, **kw):
        seen.append(kw.get("options"))
        return real(lowered, **kw)

    monkeypatch.setattr(xla, "compile_memory", spy)
    x = jax.ShapeDtypeStruct((128, 128), jax.numpy.bfloat16)
    rk.memory_report(lambda a: a @ a, x, target="h100", warn=False)
    rk.memory_report(lambda a: a @ a, x, target="cpu", warn=False)
    gpu = codegen.analysis_options(rk.target("h100"))
    assert seen == [gpu, {}] and "xla_gpu_cuda_data_dir" in gpu


class _Refusing:
    """A lowered program whose compile refuses options it does not know."""

    def __init__(self, message):
        self.message, self.calls = message, []

    def compile(self, compiler_options=None):
        self.calls.append(compiler_options)
        if compiler_options and "xla_new_option" in compiler_options:
            raise RuntimeError(self.message)
        return "compiled"


@pytest.mark.parametrize(
    "message",
    [
        "INVALID_ARGUMENT: No such compile option: 'xla_new_option'",
        "INVALID_ARGUMENT: While setting option xla_new_option, 'x' is not a valid int32 value.",
    ],
)
def test_an_option_xla_does_not_know_is_dropped_and_the_required_kept(message):
    low = _Refusing(message)
    got = xla.compile_with(low, {"xla_new_option": 1}, {"xla_dump_to": "/d"})
    assert got == "compiled"
    assert low.calls == [{"xla_new_option": 1, "xla_dump_to": "/d"}, {"xla_dump_to": "/d"}]


def test_other_compile_errors_are_raised():
    low = _Refusing("RESOURCE_EXHAUSTED: out of memory")
    with pytest.raises(RuntimeError, match="out of memory"):
        xla.compile_with(low, {"xla_new_option": 1})
    assert len(low.calls) == 1


def test_kernel_dirs_of_ended_processes_are_removed_the_living_kept(tmp_path, monkeypatch):
    """Each process's kernel directory is named by its pid: one whose process has ended is
    removed, a living process's (the parent of this one), this process's own (unless
    ``mine``) and a name with no pid are kept. The ended pid is a child waited for here."""
    import tempfile

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    prefix = codegen.KERNEL_DIR_PREFIX
    dead = tmp_path / f"{prefix}{ended.pid}_a"
    kept = [tmp_path / f"{prefix}{os.getppid()}_b", tmp_path / f"{prefix}not-a-pid_c"]
    own = tmp_path / f"{prefix}{os.getpid()}_d"
    for d in (dead, *kept, own):
        d.mkdir()
    assert codegen.remove_kernel_dirs() == [dead]
    assert not dead.exists() and all(d.exists() for d in (*kept, own))
    assert codegen.remove_kernel_dirs(mine=True) == [own]
    assert all(d.exists() for d in kept)


def test_a_kernel_dir_of_another_user_s_process_is_kept(tmp_path, monkeypatch):
    """os.kill on another user's living process raises PermissionError: that process is
    alive and its directory stays (issue 58 mutant _codegen.py:262 of the seed-59 sample)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    other = tmp_path / f"{codegen.KERNEL_DIR_PREFIX}{os.getpid() + 1}_a"
    other.mkdir()

    def kill(pid, sig):
        assert (pid, sig) == (os.getpid() + 1, 0)
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(codegen.os, "kill", kill)
    assert codegen.remove_kernel_dirs() == []
    assert other.exists()


def test_a_kernel_dir_of_a_living_process_whose_proc_entry_cannot_be_read_is_kept(
    tmp_path, monkeypatch
):
    """A process os.kill answers is alive unless /proc says it is a zombie: with no /proc to
    read (another OS, a sandbox) its directory stays."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    living = tmp_path / f"{codegen.KERNEL_DIR_PREFIX}{os.getpid() + 1}_a"
    living.mkdir()
    monkeypatch.setattr(codegen.os, "kill", lambda pid, sig: None)
    read = Path.read_text

    def no_proc(self, *args, **kwargs):
        if str(self).startswith("/proc/"):
            raise FileNotFoundError(2, "No such file or directory", str(self))
        return read(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", no_proc)
    assert codegen.remove_kernel_dirs() == []
    assert living.exists()


@pytest.mark.parametrize("living_first", [True, False], ids=["living-listed-first", "last"])
def test_every_ended_process_s_kernel_dir_goes_whatever_the_listing_order(
    tmp_path, monkeypatch, living_first
):
    """A living process's directory is skipped, not where the cleaning stops: the ended
    processes' directories listed after it go too. The directory's listing order is the
    file system's, so both orders are given here (glob's answer sorted either way)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    prefix = codegen.KERNEL_DIR_PREFIX
    living = tmp_path / f"{prefix}{os.getpid() + 1}_a"
    ended = [tmp_path / f"{prefix}{os.getpid() + n}_a" for n in (2, 3)]
    for d in (living, *ended):
        d.mkdir()
    monkeypatch.setattr(codegen, "_alive", lambda pid: pid == os.getpid() + 1)
    glob = Path.glob

    def ordered(self, pattern):  # the living one first or last
        return sorted(glob(self, pattern), key=lambda d: (d == living) != living_first)

    monkeypatch.setattr(Path, "glob", ordered)
    assert sorted(codegen.remove_kernel_dirs()) == ended
    assert living.exists() and not any(d.exists() for d in ended)


@pytest.mark.parametrize("missing", ["bin/ptxas", "nvvm/libdevice"])
def test_a_cuda_dir_needs_both_ptxas_and_libdevice(tmp_path, monkeypatch, missing):
    def cuda(name, parts):
        root = tmp_path / name
        for part in parts:
            if part == "bin/ptxas":
                (root / "bin").mkdir(parents=True)
                (root / "bin" / "ptxas").write_text("#!/bin/sh\n")
                (root / "bin" / "ptxas").chmod(0o755)
            else:
                (root / part).mkdir(parents=True)
        return root

    half = cuda("half", [p for p in ("bin/ptxas", "nvvm/libdevice") if p != missing])
    whole = cuda("whole", ["bin/ptxas", "nvvm/libdevice"])
    monkeypatch.setitem(sys.modules, "nvidia.cuda_nvcc", None)  # no wheel: import fails
    monkeypatch.setenv("CUDA_HOME", str(half))
    monkeypatch.setenv("CUDA_PATH", str(whole))
    assert codegen.real_cuda_dir() == whole.resolve()


def test_a_kernel_dir_another_process_removed_first_is_no_error(tmp_path, monkeypatch):
    """Two processes cleaning at once: the directory of an ended process is gone before this
    one's rmtree reaches it (here: removed while its owner is asked after)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    raced = tmp_path / f"{codegen.KERNEL_DIR_PREFIX}{os.getpid() + 1}_a"
    (raced / "kernels").mkdir(parents=True)

    def ended_and_cleaned(pid):
        shutil.rmtree(raced)  # the other process's cleaning
        return False

    monkeypatch.setattr(codegen, "_alive", ended_and_cleaned)
    assert codegen.remove_kernel_dirs() == [raced]
    assert not raced.exists()


@pytest.mark.parametrize("raises", [False, True], ids=["body-returns", "body-raises"])
def test_the_kernel_dir_is_off_the_disk_while_stowed_and_back_after(tmp_path, monkeypatch, raises):
    """This process's kernel directory (and only its) is absent inside ``kernel_dir_stowed``
    and back with the same files after, the body's error or not."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    prefix = codegen.KERNEL_DIR_PREFIX
    own = tmp_path / f"{prefix}{os.getpid()}_a"
    # Another process's, whose pid starts with this one's digits: not this process's.
    other = tmp_path / f"{prefix}{os.getpid()}1_b"
    for d in (own, other):
        d.mkdir(mode=0o700)
    (own / "kernels.bin").write_bytes(b"\x00kernels\xff")
    seen = []
    caught = pytest.raises(KeyError) if raises else contextlib.nullcontext()
    with caught, codegen.kernel_dir_stowed():
        seen.append((own.exists(), other.exists()))
        if raises:
            raise KeyError("body")
    assert seen == [(False, True)]
    assert (own / "kernels.bin").read_bytes() == b"\x00kernels\xff"
    assert stat.S_IMODE(own.stat().st_mode) == 0o700 and other.exists()


def test_end_process_removes_its_kernel_dir_and_lets_no_thread_make_one_until_it_is_gone(
    tmp_path, monkeypatch
):
    """A worker's parent watch (another thread) ends the process while a compile may be
    making its kernel directory: the directory is gone when the process ends, and no other
    thread can take the directories' lock from then on (os._exit stands in here)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    own = tmp_path / f"{codegen.KERNEL_DIR_PREFIX}{os.getpid()}_a"
    own.mkdir()
    seen = []

    class Ended(Exception):
        pass

    def exit_(code):
        took = []
        other = threading.Thread(
            target=lambda: took.append(codegen._DIRS_LOCK.acquire(timeout=0.2))
        )
        other.start()
        other.join()
        seen.append((code, own.exists(), took))
        raise Ended

    monkeypatch.setattr(codegen.os, "_exit", exit_)
    with pytest.raises(Ended):
        codegen.end_process(3)
    assert seen == [(3, False, [False])]


def test_a_kernel_dir_whose_file_cannot_be_read_is_still_made_again(tmp_path, monkeypatch):
    """Its kernels are lost (XLA makes them again), not the directory XLA writes into."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    own = tmp_path / f"{codegen.KERNEL_DIR_PREFIX}{os.getpid()}_a"
    own.mkdir(mode=0o700)
    (own / "kernels.bin").write_bytes(b"kernels")

    def unreadable(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", unreadable)
    with codegen.kernel_dir_stowed():
        assert not own.exists()
    assert own.is_dir() and stat.S_IMODE(own.stat().st_mode) == 0o700


def test_a_kernel_dir_gone_before_it_is_stowed_is_no_error_and_is_made_again(tmp_path, monkeypatch):
    """Listed, then removed by another process (a worker's parent watch) before the stow
    removes it: starting the workers goes on, and the directory is made again after."""
    gone = tmp_path / f"{codegen.KERNEL_DIR_PREFIX}{os.getpid()}_gone"
    monkeypatch.setattr(codegen, "_kernel_dirs", lambda pid: [gone] if not gone.exists() else [])
    with codegen.kernel_dir_stowed():
        assert not gone.exists()
    assert gone.is_dir() and stat.S_IMODE(gone.stat().st_mode) == 0o700


def test_a_zombie_is_not_alive_and_a_running_process_is():
    """An ended child its parent has not reaped (a zombie) still answers os.kill: its kernel
    directory is an ended process's, to clean. /proc's state field says Z."""
    import time

    ended = subprocess.Popen(["true"])
    running = subprocess.Popen(["sleep", "30"])
    try:
        state = ""
        for _ in range(500):  # not reaped: Popen.wait is not called until the end
            state = Path(f"/proc/{ended.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state == "Z":
                break
            time.sleep(0.01)
        assert state == "Z"
        assert codegen._alive(ended.pid) is False
        assert codegen._alive(running.pid) is True
    finally:
        running.kill()
        running.wait()
        ended.wait()


@pytest.mark.parametrize(
    ("stat_line", "alive"),
    [("4242 (x) Z y) S 1 4242 4242 0 -1", True), ("4242 (x) S y) Z 1 4242 4242 0 -1", False)],
    ids=["running", "zombie"],
)
def test_a_process_is_read_by_the_state_after_its_name_whatever_the_name_holds(
    monkeypatch, stat_line, alive
):
    """/proc/<pid>/stat is ``pid (comm) state ...``, and a process may name itself anything,
    ``x) Z y`` included: the state is the field after the last parenthesis (screen 97:
    _codegen.py:333's ``rsplit(")", 1)`` read with 2 took a word of the name)."""
    monkeypatch.setattr(codegen.os, "kill", lambda pid, sig: None)
    read = Path.read_text

    def proc(self, *args, **kwargs):
        return stat_line if str(self) == "/proc/4242/stat" else read(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", proc)
    assert codegen._alive(4242) is alive


@pytest.mark.parametrize("broken", [None, "nvvm-elsewhere", "ptxas-not-runnable"])
def test_a_stand_in_is_whole_only_with_a_runnable_ptxas_and_the_real_nvvm(tmp_path, broken):
    """A stand-in another run left is used only when its ``ptxas`` runs and its ``nvvm`` is the
    real CUDA's; either missing, it is built again (screen 97: _codegen.py:442 ``and`` read as
    ``or``)."""
    real, other = tmp_path / "cuda", tmp_path / "other-cuda"
    for cuda in (real, other):
        (cuda / "nvvm").mkdir(parents=True)
    d = tmp_path / "stand-in"
    (d / "bin").mkdir(parents=True)
    exe = d / "bin" / "ptxas"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o644 if broken == "ptxas-not-runnable" else 0o755)
    (d / "nvvm").symlink_to((other if broken == "nvvm-elsewhere" else real) / "nvvm")
    assert codegen._complete(d, real) is (broken is None)


@pytest.mark.parametrize(
    ("environ", "added", "after"),
    [
        ({}, codegen.PROCESS_FLAGS, " ".join(codegen.PROCESS_FLAGS)),
        # The user's value of the same flag stays, whatever it is.
        (
            {"XLA_FLAGS": "--xla_gpu_enable_libnvjitlink=true"},
            (),
            "--xla_gpu_enable_libnvjitlink=true",
        ),
        # Full code generation asked for: nothing added (screen 97: _codegen.py:363's
        # `return ()` read as `return None`).
        ({codegen.ENV_FULL: "1", "XLA_FLAGS": "--a=1"}, (), "--a=1"),
    ],
    ids=["empty", "the-users-own", "full-codegen"],
)
def test_process_flags_are_added_once_and_never_over_the_users(environ, added, after):
    env = dict(environ)
    assert codegen.set_process_flags(env) == added
    assert env["XLA_FLAGS"] == after


def test_an_unreadable_temporary_directory_holds_no_kernel_directory(tmp_path, monkeypatch):
    """Listing the temporary directory fails (a permission, a vanished mount): no kernel
    directory is found and none removed, without an error (screen 97: _codegen.py:273's
    ``return []`` read as ``return None``)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def refused(self, pattern):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "glob", refused)
    assert codegen._kernel_dirs() == [] and codegen.remove_kernel_dirs() == []
