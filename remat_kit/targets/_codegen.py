"""Compiler options for compiles whose machine code is never run: a GPU compile without ptxas.

A deviceless GPU compile exists here only for its memory analysis, which XLA computes from the
buffer assignment of the optimised HLO, before any machine code is made. Making the machine code
is still most of the compile's time: XLA emits LLVM IR, optimises it, and hands each PTX module
to NVIDIA's ``ptxas`` (a separate process per module, two at a time on two cores). Measured on
llama3-8b b4 s2048 for an H100 (``experiments/compile_speed.py``): the same analysis, byte for
byte, in about 55% of the time when

- ``xla_gpu_cuda_data_dir`` points at a CUDA directory whose ``bin/ptxas`` is a stand-in that
  writes an empty object file (``ptxas --version``, which XLA asks to choose PTX features, is
  answered by the real one; ``nvvm/`` links to the real libdevice);
- ``xla_backend_optimization_level`` is 0 and ``xla_llvm_disable_expensive_passes`` is set
  (LLVM's optimisation of code that will not run);
- ``xla_gpu_autotune_level`` is 0. jax 0.12's XLA (its ``config-assigner`` pass) no longer
  takes a Triton GEMM's first configuration as it is when there is no card: it compiles the
  fusion with candidates until one compiles ("Using first compilable config" in its log). At
  the default level it also sends other fusions through it: 91 module compiles for one
  tiny-llama step, 17 at level 0 (one per unique GEMM fusion, and the program's own). Level 0
  does not skip those 16: they are still about 60% of XLA's compile of that step and of
  llama3-8b's (``experiments/compile_phases.py``, results/compile_phases.json), and no option
  of this XLA skips them (its per-fusion autotune cache is written only by a tuning run).
  Measured: ``compare --model llama3-8b --target h100 --batch 4 --seq 2048`` on jax 0.12.0.1,
  the eleven rows' JSON equal to the byte (peaks, kernels, step times), 46 s -> 28 s.

jax 0.12's XLA also no longer runs ``ptxas`` as a process: it compiles PTX in-process with
``libnvJitLink`` (21% of the compile under ``perf``), which the stand-in cannot replace. Only
``XLA_FLAGS`` switches it back (as a compiler option it is ignored: XLA picks the PTX
compiler when the backend starts), so :func:`set_process_flags` puts
:data:`PROCESS_FLAGS` there; the CLI and the worker processes call it before jax starts.

Most of what is left of a deviceless compile is Triton: XLA lowers each Triton fusion through
MLIR to LLVM to PTX (23% of a process compiling tests/data/factories.py:deep under ``perf``),
once to find a configuration that compiles and once to emit it, and again in the next program
that has the same fusion: the four policies of one model share most of theirs. XLA keeps the
kernels it made in a file when ``xla_gpu_kernel_cache_file`` names one, and takes a fusion
with the same fingerprint from there. Each process that compiles with the stand-in gets a file
of its own (:func:`kernel_cache_file`), in a directory removed when it exits: its kernels are
the stand-in's empty objects, which no compile that runs may read, and XLA rewrites the file
without a lock, which two processes must not share. Measured: ``compare --model llama3-8b
--target h100 --batch 4 --seq 2048`` cold, median of 4 in turn with the code before, 23.9 s ->
18.0 s, its JSON the same to the byte but for the compile seconds.

The stand-in lives in the user's cache directory (:func:`remat_kit.cache.cache_dir`), private
to the user, created once and atomically. Where no real ``ptxas`` is found, the directory
cannot be written, or the cache is off (``--no-cache`` writes nothing there), only the LLVM
options are used. ``REMAT_KIT_FULL_CODEGEN=1`` turns all of
this off: the compile is then jax's own but for :data:`DEVICELESS_OPTIONS`. CPU and local
targets get no options (their programs may be run).

Every deviceless GPU compile, ``REMAT_KIT_FULL_CODEGEN`` or not, gets
:data:`DEVICELESS_OPTIONS`: ``xla_gpu_exhaustive_tiling_search``. With no card to time
kernels on, XLA's autotuner gives each Triton GEMM fusion a default config without
compiling it (``autotuner_pass.cc``: ``use_default_config`` when deviceless;
``Autotuner::GetDefaultConfig``: the first backend's ``GetDefaultConfig``;
``TritonBackend::GetDefaultConfig``: ``configs[0]`` of the search space, which
``GetSupportedConfigsForDot`` first restricts to the card generation's default set,
"Restricting configs to the default set"). On a card the autotuner compiles every candidate
and drops the ones that fail; deviceless, that first one is used as it is, and
``ConvertTritonGemmConfig`` (``FindBlockLevelParameters``) then fails with "Couldn't find
output tile sizes that satisfy hlo: dot ..." when its contracting tile does not fit the
dot's contraction: e.g. block_k 128 (sm_80's first default) over the 8 x 96 (heads x
head_dim) of an attention output projection, whose transpose is fused into the GEMM
(``report --width 6144 --heads 64 --shard tp:8`` on an A100; H100s fail the same way at
larger shapes). Without the restriction the first config is the search space's smallest,
block_k 16, which fits such contractions. A process on the card accepts the option (its
autotuner searches more tilings); the tiling is internal to the fusion's kernel, so the
buffers XLA assigns and the analysis are the same: byte-identical reports, with and without
it, on the nine programs tried that compile either way (GPT-2, Llama and BERT presets and the
Megatron shape on H100; A100, RTX 4090, L4, H100; one GPU, fsdp:4, tp:8). On jax 0.12.0.1
the A100 case above (``report --model llama3-8b --width 6144 --heads 64 --gpus 8 --shard
tp:8``) compiles without it too, with the stand-in and with ``REMAT_KIT_FULL_CODEGEN=1``, its
JSON the same to the byte but for the seconds; no program is known there that needs it, and
it stays for the shapes and XLA versions that do. (The default-config path above is XLA's
before jax 0.12; jax 0.12.0.1's compiles candidates until one compiles, as said above, and
with this option they start at the smallest tiling: block_m 16, block_n 8, block_k 16, the
configuration its log shows chosen for each of a small two-layer gradient's seven GEMMs.)

Example:
  >>> from remat_kit.targets import analysis_options, target
  >>> analysis_options(target("cpu"))
  {}
  >>> "xla_llvm_disable_expensive_passes" in analysis_options(target("h100"))
  True
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import multiprocessing.util
import os
import shlex
import shutil
import tempfile
import threading
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

# The stand-in lives in the cache's directory and follows its switch; the cache names it in
# its keys by what it is (STUB_MARK), not where it lives. That knowledge sits in the cache,
# below this module, so the two never import each other.
from remat_kit import cache
from remat_kit._switches import switch
from remat_kit.cache import KERNEL_CACHE_OPTION, STUB_MARK, STUB_OPTION, key_options

__all__ = [
    "DEVICELESS_OPTIONS",
    "ENV_FULL",
    "KERNEL_DIR_PREFIX",
    "PROCESS_FLAGS",
    "STUB_MARK",
    "analysis_options",
    "end_process",
    "kernel_cache_file",
    "kernel_dir_stowed",
    "key_options",
    "real_cuda_dir",
    "remove_kernel_dirs",
    "set_process_flags",
    "stub_cuda_dir",
]

#: Environment variable that, set to 1, compiles GPU targets with full code generation.
ENV_FULL = "REMAT_KIT_FULL_CODEGEN"

#: Options every deviceless GPU compile gets, ``REMAT_KIT_FULL_CODEGEN`` or not: without
#: them XLA cannot compile some programs for the card at all (module docstring).
DEVICELESS_OPTIONS = MappingProxyType({"xla_gpu_exhaustive_tiling_search": True})

_LLVM_OPTIONS = {
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
    "xla_gpu_autotune_level": 0,
}

#: ``XLA_FLAGS`` entries for a process whose GPU compiles are only analysed: PTX goes to
#: ``ptxas`` (the stand-in, where the compile names it) instead of the in-process nvJitLink.
#: The same machine code either way, so a process that runs on a card loses nothing.
PROCESS_FLAGS: tuple[str, ...] = ("--xla_gpu_enable_libnvjitlink=false",)
_CUDA_DIR_OPTION = STUB_OPTION

_SCRIPT = """#!/bin/sh
# remat_kit: a ptxas stand-in for compiles that are only analysed (their code never runs).
# It writes an empty object file; "--version" is answered by the real ptxas.
for a in "$@"; do
  if [ "$a" = --version ]; then exec {real} "$@"; fi
done
out=
prev=
for a in "$@"; do
  if [ "$prev" = -o ]; then out=$a; fi
  prev=$a
done
if [ -n "$out" ]; then : > "$out"; fi
"""


def analysis_options(target: Any) -> dict[str, Any]:
    """Compiler options for compiling a program for ``target`` only to analyse it.

    Args:
      target: an ``rk.Target``.

    Returns:
      For a deviceless GPU target, :data:`DEVICELESS_OPTIONS` and the options described in
      the module docstring (without ``xla_gpu_cuda_data_dir`` when no stand-in could be made
      or the cache is off; only :data:`DEVICELESS_OPTIONS` when ``REMAT_KIT_FULL_CODEGEN=1``),
      with the target's own ``xla_options`` (a slop factor it was given, which does change
      the program: a real process compiles the step with it too); for other targets their
      own ``xla_options`` alone (``{}`` for most).

    Example:
      >>> import remat_kit as rk
      >>> analysis_options(rk.target("cpu"))
      {}
    """
    # The target's own (XLA's pass's slop factor): it changes the program, unlike the rest,
    # and a GPU in the process compiles with it as a deviceless one does.
    own: dict[str, Any] = dict(getattr(target, "xla_options", {}))
    if getattr(target, "kind", None) != "gpu":
        return own
    options: dict[str, Any] = {**DEVICELESS_OPTIONS, **own}
    if switch(ENV_FULL):
        return options
    options.update(_LLVM_OPTIONS)
    stub = stub_cuda_dir() if cache.enabled() else None
    if stub is not None:
        options[_CUDA_DIR_OPTION] = str(stub)
        kernels = kernel_cache_file()
        if kernels is not None:
            options[KERNEL_CACHE_OPTION] = str(kernels)
    return options


def kernel_cache_file() -> Path | None:
    """This process's file for the kernels XLA makes in analysis-only compiles.

    A fresh directory per process (keyed by its id, so a forked child gets its own), removed
    when the process exits; XLA creates the file in it at the first compile.

    Returns:
      The file's path, or None when no temporary directory can be made.

    Example:
      >>> kernel_cache_file() == kernel_cache_file()
      True
    """
    directory = _kernel_dir(os.getpid())
    return None if directory is None else directory / "kernels.bin"


#: The kernel directories' names: the prefix, then the id of the process that owns one.
KERNEL_DIR_PREFIX = "remat_kit_kernels_"


#: Held while a kernel directory is made or removed: a worker's watch on its parent (another
#: thread) removes this process's directory and ends the process while a compile in the main
#: thread may be making it (:func:`end_process`).
_DIRS_LOCK = threading.RLock()


@functools.cache
def _kernel_dir(pid: int) -> Path | None:
    with _DIRS_LOCK:
        remove_kernel_dirs()  # those of processes that ended without removing theirs
        try:
            directory = Path(tempfile.mkdtemp(prefix=f"{KERNEL_DIR_PREFIX}{pid}_"))
        except OSError:
            return None

    def remove() -> None:
        if os.getpid() == pid:  # not a forked child that inherited the handler
            shutil.rmtree(directory, ignore_errors=True)

    atexit.register(remove)
    # A multiprocessing worker ends with os._exit, past atexit; its own exit hook runs this.
    multiprocessing.util.Finalize(None, remove, exitpriority=0)
    return directory


def remove_kernel_dirs(mine: bool = False) -> list[Path]:
    """Removes the kernel directories (:func:`kernel_cache_file`) of processes that ended
    without removing their own: a worker stopped by a signal, a process killed outright.

    Args:
      mine: remove this process's too (it is about to end without its exit hooks).

    Returns:
      The directories removed.

    Example:
      >>> gone = remove_kernel_dirs()  # what any process on this machine left, if it ended
      >>> all(d.name.startswith(KERNEL_DIR_PREFIX) and not d.exists() for d in gone)
      True
    """
    gone = []
    with _DIRS_LOCK:
        for d in _kernel_dirs():
            owner = d.name[len(KERNEL_DIR_PREFIX) :].split("_", 1)[0]
            if not owner.isdigit() or (int(owner) == os.getpid() and not mine):
                continue
            if int(owner) != os.getpid() and _alive(int(owner)):
                continue
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d)
    return gone


def _kernel_dirs(pid: int | None = None) -> list[Path]:
    """The kernel directories in the temporary directory: all, or process ``pid``'s."""
    owner = "*" if pid is None else str(pid)
    try:
        return list(Path(tempfile.gettempdir()).glob(f"{KERNEL_DIR_PREFIX}{owner}_*"))
    except OSError:
        return []


def end_process(code: int) -> NoReturn:
    """Removes the kernel directories of ended processes and this process's own, then ends
    this process at once (``os._exit(code)``: no exit hook runs), no thread of it making a
    directory in between.

    For a process that must end now: a worker whose parent is gone, a run stopped mid-compile.
    """
    with _DIRS_LOCK:  # never released: the process ends inside
        remove_kernel_dirs(mine=True)
        os._exit(code)


@contextlib.contextmanager
def kernel_dir_stowed() -> Iterator[None]:
    """Inside, this process's kernel directory is off the disk, its files kept in memory;
    they are put back on the way out.

    For starting worker processes. Such a worker is started before it is sent what to run
    (``spawn``), and a parent killed outright (SIGKILL) between the two leaves no process of
    remat-kit running: a started worker removes the directories of ended processes
    (:func:`end_process`), one cut at its start cannot. A directory that is not on disk
    then cannot be left behind.

    Example:
      >>> with kernel_dir_stowed():
      ...     _kernel_dirs(os.getpid())
      []
    """
    stowed: dict[Path, dict[str, bytes]] = {}
    with _DIRS_LOCK:
        for d in _kernel_dirs(os.getpid()):
            stowed[d] = {}  # made again on the way out, whatever could be read of it
            with contextlib.suppress(OSError):
                stowed[d] = {f.name: f.read_bytes() for f in d.iterdir() if f.is_file()}
            shutil.rmtree(d, ignore_errors=True)
    try:
        yield
    finally:
        with _DIRS_LOCK:
            for d, files in stowed.items():
                # Made again as mkdtemp made it, private to the user: XLA writes its file there
                # at this process's next compile. One that cannot be made again is XLA's to
                # report at that compile.
                with contextlib.suppress(OSError):
                    d.mkdir(mode=0o700)
                    for name, data in files.items():
                        (d / name).write_bytes(data)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: alive, and not ours to clean
    try:  # a zombie (ended, its parent yet to read its exit code) answers os.kill too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def set_process_flags(environ: MutableMapping[str, str] | None = None) -> tuple[str, ...]:
    """Adds :data:`PROCESS_FLAGS` to ``XLA_FLAGS``, keeping what is there.

    XLA reads ``XLA_FLAGS`` once, when jax starts its first backend: call this before that
    (the CLI does, first thing; worker processes inherit the variable). A flag already in
    ``XLA_FLAGS`` under the same name, with whatever value, is the user's and stays. Nothing
    is added when ``REMAT_KIT_FULL_CODEGEN`` is set.

    Args:
      environ: the environment to change (None: ``os.environ``).

    Returns:
      The flags it added (empty when there was nothing to add).

    Example:
      >>> env = {"XLA_FLAGS": "--xla_dump_to=/tmp/d"}
      >>> set_process_flags(env)
      ('--xla_gpu_enable_libnvjitlink=false',)
      >>> env["XLA_FLAGS"]
      '--xla_dump_to=/tmp/d --xla_gpu_enable_libnvjitlink=false'
      >>> set_process_flags(env)
      ()
    """
    env = os.environ if environ is None else environ
    if switch(ENV_FULL, env):
        return ()
    have = env.get("XLA_FLAGS", "")
    names = {f.split("=", 1)[0] for f in have.split()}
    added = tuple(f for f in PROCESS_FLAGS if f.split("=", 1)[0] not in names)
    if added:
        env["XLA_FLAGS"] = " ".join([have, *added]).strip()
    return added


def real_cuda_dir() -> Path | None:
    """The CUDA directory XLA would use by default: the ``nvidia-cuda-nvcc`` wheel's (with
    ``bin/ptxas`` and ``nvvm/libdevice``), else ``$CUDA_HOME``/``$CUDA_PATH``, else
    ``/usr/local/cuda``; None when none has both.

    Example:
      >>> found = real_cuda_dir()  # e.g. .../site-packages/nvidia/cuda_nvcc
      >>> found is None or (found / "bin" / "ptxas").exists()
      True
    """
    candidates = []
    try:
        import nvidia.cuda_nvcc as nvcc  # the wheel jax[cuda12] installs

        candidates += [Path(p) for p in getattr(nvcc, "__path__", [])]
    except ImportError:
        pass
    candidates += [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    candidates.append(Path("/usr/local/cuda"))
    for c in candidates:
        if os.access(c / "bin" / "ptxas", os.X_OK) and (c / "nvvm" / "libdevice").is_dir():
            return c.resolve()
    return None


def stub_cuda_dir(root: Path | None = None) -> Path | None:
    """A CUDA directory whose ``ptxas`` is the stand-in, made once under ``root``.

    Args:
      root: where to keep it (None: ``<cache dir>/ptxas``).

    Returns:
      Its path, or None when no real CUDA directory was found or ``root`` cannot be written.

    Example:
      >>> stub_cuda_dir(Path("/tmp/rk-stub")) is None or True
      True
    """
    real = real_cuda_dir()
    if real is None:
        return None
    if root is None:
        root = cache.cache_dir() / "ptxas"
    script = _SCRIPT.format(real=shlex.quote(str(real / "bin" / "ptxas")))
    digest = hashlib.sha256(f"{real}\n{script}".encode()).hexdigest()[:16]
    final = root / digest
    if _complete(final, real):
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        # Built in a fresh directory and renamed into place: a concurrent run sees either
        # nothing or the whole stand-in.
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
        try:
            (tmp / "bin").mkdir()
            exe = tmp / "bin" / "ptxas"
            exe.write_text(script)
            exe.chmod(0o755)
            (tmp / "nvvm").symlink_to(real / "nvvm", target_is_directory=True)
            with contextlib.suppress(OSError):  # another run put it there first
                os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        return None
    return final if _complete(final, real) else None


def _complete(d: Path, real: Path) -> bool:
    return (
        os.access(d / "bin" / "ptxas", os.X_OK)
        and (d / "nvvm").resolve() == (real / "nvvm").resolve()
    )
