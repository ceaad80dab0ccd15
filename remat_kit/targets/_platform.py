"""The platform side of deviceless compiles: jax on its CPU platform, the compile plugins,
topologies.

XLA compiles for an NVIDIA GPU that is not there through the CUDA compile plugin and a topology
built from the target's ``GpuTargetConfigProto``; that works only while jax has not started its
backends with the plugin probing for a driver. A TPU slice is compiled for through libtpu (the
``libtpu`` wheel that ``jax[tpu]`` pins) and the topology libtpu builds from the slice's name,
with jax on its CPU platform as well. These helpers arrange that and say what to change when it
cannot be arranged.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import importlib
import importlib.metadata
import os
import sys
from collections.abc import Iterator
from typing import Any

import jax

from remat_kit.errors import TargetError
from remat_kit.targets._codegen import set_process_flags
from remat_kit.xla import captured_stderr

__all__ = [
    "check_local_gpu",
    "check_platforms",
    "configure_for_deviceless",
    "configure_if_no_gpu",
    "gpu_topology",
    "platform_error",
    "start_backends",
    "tpu_topology",
]

_PLUGIN_MESSAGE = "compiling for {name} needs the CUDA 12 compile plugin: pip install 'jax[cuda12]'"
_PLATFORMS_MESSAGE = (
    "compiling for {name} needs jax started without probing for a CUDA driver (it probed and found "
    "none): set JAX_PLATFORMS=cpu (or JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1) in the environment "
    "before importing jax, or call remat_kit.targets.configure_for_deviceless() first ({error})"
)


def configure_for_deviceless() -> None:
    """Sets ``JAX_PLATFORMS=cpu`` if nothing chose the platforms yet; the CLI calls it at start-up.

    Deviceless GPU compiles fail once jax has initialized its backends with the CUDA plugin probing
    for a driver that is absent. This does nothing if jax's backends are already initialized or if
    ``JAX_PLATFORMS``/``JAX_SKIP_CUDA_CONSTRAINTS_CHECK`` (or ``jax.config.jax_platforms``) is
    already set. Note it also makes the ``"local"`` target the CPU: skip it when measuring on a
    real GPU. Before jax's backends start it also puts
    :data:`~remat_kit.targets.PROCESS_FLAGS` in ``XLA_FLAGS`` (XLA reads them then).

    Example:
      >>> configure_for_deviceless()
    """
    if _backends_initialized():
        return
    check_platforms()
    set_process_flags()
    if os.environ.get("JAX_PLATFORMS") or os.environ.get("JAX_SKIP_CUDA_CONSTRAINTS_CHECK"):
        return
    if "jax" in sys.modules:
        if jax.config.jax_platforms:
            return
        jax.config.update("jax_platforms", "cpu")
    os.environ["JAX_PLATFORMS"] = "cpu"


#: What ``JAX_PLATFORMS`` names for an NVIDIA GPU.
_GPU_PLATFORMS = frozenset({"cuda", "gpu"})


def check_platforms() -> None:
    """Refuses a ``JAX_PLATFORMS`` that asks for a GPU on a machine without one (commonly
    exported on GPU boxes, then carried to a laptop): jax would fail to start its backends,
    with two tracebacks, before anything is compiled. A deviceless compile for a named GPU
    needs no GPU, only jax's CPU platform.

    Raises:
      TargetError: ``JAX_PLATFORMS`` names ``cuda`` or ``gpu`` and the machine has no NVIDIA
        device (no ``/dev/nvidia*``); the message says what to set.

    Example:
      >>> import os
      >>> from unittest import mock
      >>> with mock.patch.dict(os.environ, {"JAX_PLATFORMS": "cpu"}):
      ...     check_platforms()  # nothing to refuse
    """
    asked = os.environ.get("JAX_PLATFORMS", "")
    named = {p.strip().lower() for p in asked.split(",") if p.strip()}
    if named & _GPU_PLATFORMS and not glob.glob("/dev/nvidia[0-9]*"):
        raise TargetError(
            f"JAX_PLATFORMS={asked} asks jax for a GPU this machine does not have (no "
            "/dev/nvidia*): unset it or set JAX_PLATFORMS=cpu (a compile for a named GPU "
            "needs none)"
        )
    # With libtpu installed, jax would start it, which logs a page about a TPU VM's missing
    # metadata before it fails: refuse first, as for a GPU.
    if "tpu" in named and not _has_tpu_device():
        raise TargetError(
            f"JAX_PLATFORMS={asked} asks jax for a TPU this machine does not have (no "
            "/dev/accel* or /dev/vfio): unset it or set JAX_PLATFORMS=cpu (a compile for a TPU "
            "slice needs none)"
        )


def check_local_gpu() -> None:
    """Refuses the ``local`` target on a machine with no NVIDIA GPU: there the CUDA plugin's
    driver probe can only fail, and the CPU jax would fall back to reports no memory limit,
    so no ``fits`` could be judged. (``rk.target("local")`` itself still takes the CPU: the
    library's tests build meshes of host devices with it.)

    Raises:
      TargetError: no ``/dev/nvidia*`` device; the message names the targets to use instead.

    Example:
      >>> import glob
      >>> if glob.glob("/dev/nvidia[0-9]*"):
      ...     check_local_gpu()  # a GPU is here: nothing to refuse
    """
    if not _has_nvidia_device():
        raise TargetError(
            "target 'local' measures this machine's GPU, and it has none (no /dev/nvidia*): "
            "name the GPU to compile for (a catalogue name, e.g. h100, or a GPU file), or cpu "
            "for this machine's CPU"
        )


def platform_error(err: BaseException) -> TargetError | None:
    """The one-line error for jax failing to start a platform ``JAX_PLATFORMS`` names (a TPU,
    ROCm or a name jax does not know, on a machine without it), or None for any other error.

    jax raises it (a ``RuntimeError``, after a first traceback) wherever its backends first
    start, which is no fixed place in a run: callers turn it into this at their boundary.

    Args:
      err: an exception a run raised.

    Returns:
      A :class:`TargetError` that names the setting and what to set instead, or None.

    Example:
      >>> print(platform_error(RuntimeError("Unable to initialize backend 'tpu': no libtpu")))
      JAX_PLATFORMS=... asks jax for a platform it could not start (backend 'tpu': no libtpu); ...
      >>> platform_error(ValueError("something else")) is None
      True
    """
    text = str(err).strip()
    if not isinstance(err, RuntimeError) or not text.startswith("Unable to initialize backend"):
        return None
    first = text.splitlines()[0].removeprefix("Unable to initialize ")
    first = first.split(" (set JAX_PLATFORMS=")[0]  # jax's own hint; ours follows
    asked = os.environ.get("JAX_PLATFORMS", "")
    return TargetError(
        f"JAX_PLATFORMS={asked or '...'} asks jax for a platform it could not start ({first}); "
        "unset it or set JAX_PLATFORMS=cpu (a compile for a named GPU needs none)"
    )


def start_backends() -> None:
    """Starts jax's backends now, which a run does anyway at its first jax operation: the
    CLI does it where a Ctrl-C ends the process at once (jax's plugin discovery logs a
    ``KeyboardInterrupt`` that lands in it as a traceback, and goes on), once the model is
    imported (XLA reads ``XLA_FLAGS`` as its first backend starts).

    Raises:
      RuntimeError: jax could not start a platform ``JAX_PLATFORMS`` names (see
        :func:`platform_error`).

    Example:
      >>> start_backends()
    """
    jax.devices()


def _has_nvidia_device() -> bool:
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def configure_if_no_gpu() -> None:
    # On a machine with no NVIDIA device the CUDA plugin's driver probe can only fail (a cuInit
    # traceback, then no topology); choose jax's CPU platform for the user, as the CLI does. With
    # a GPU present the plugin starts normally and compiles deviceless as well, so leave it be.
    if not glob.glob("/dev/nvidia[0-9]*"):
        configure_for_deviceless()


def gpu_topology(config: str, topology: str, name: str) -> Any:
    """The deviceless topology for a ``GpuTargetConfigProto`` text (``name`` for messages).

    Raises:
      TargetError: the plugin is missing, jax probed for a driver, or XLA rejected the config.
    """
    configure_if_no_gpu()
    try:
        return _cached_topology(config, topology)
    except (NotImplementedError, RuntimeError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        if not _cuda_plugin_installed():
            raise TargetError(_PLUGIN_MESSAGE.format(name=name)) from err
        if isinstance(err, NotImplementedError) or "not implemented" in first.lower():
            raise TargetError(_PLATFORMS_MESSAGE.format(name=name, error=first)) from err
        raise TargetError(f"XLA rejected the target config of {name!r}: {first}") from err


@functools.lru_cache(maxsize=64)
def _cached_topology(config: str, topology: str) -> Any:
    from jax.experimental import topologies

    return topologies.get_topology_desc(platform="cuda", target_config=config, topology=topology)


def _cuda_plugin_installed() -> bool:
    # jax[cuda12] installs xla_cuda12; jax[cuda13] (jax >= 0.7) installs xla_cuda13. Either
    # compiles for the catalogue's cards.
    for name in ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13"):
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        return True
    return False


def _backends_initialized() -> bool:
    try:
        from jax._src import xla_bridge

        check = getattr(xla_bridge, "backends_are_initialized", None)
        if check is not None:
            return bool(check())
        return bool(getattr(xla_bridge, "_backends", {}))
    except Exception:  # private API; assume initialized, stay hands-off
        return True


_LIBTPU_MISSING = (
    "compiling for {name} needs libtpu, which this environment lacks: pip install "
    "'remat-kit[tpu]' (jax[tpu]=={jax} brings the libtpu this jax was built with)"
)
_LIBTPU_MISMATCH = (
    "compiling for {name} needs the libtpu jax {jax} was built with ({want}), and libtpu {have} "
    "is installed: pip install 'jax[tpu]=={jax}'"
)


def tpu_topology(args: tuple[tuple[str, Any], ...], name: str) -> Any:
    """The deviceless topology of a TPU slice, built by libtpu (``name`` for messages).

    Args:
      args: ``jax.experimental.topologies.get_topology_desc``'s keyword arguments as sorted
        pairs (:meth:`remat_kit.targets._slices.Slice.topology_args`).
      name: the slice's name, for messages.

    Raises:
      TargetError: libtpu is missing or is not the one this jax pins, or libtpu refused the
        topology (its reason kept).
    """
    _check_libtpu(name)
    if not _has_tpu_device():
        configure_for_deviceless()
    try:
        return _cached_tpu_topology(args)
    except Exception as err:  # libtpu raises JaxRuntimeError, ValueError or RuntimeError
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise TargetError(
            f"libtpu could not build {name} ({dict(args)['topology_name']}): {first}"
        ) from err


@functools.lru_cache(maxsize=64)
def _cached_tpu_topology(args: tuple[tuple[str, Any], ...]) -> Any:
    from jax.experimental import topologies

    with _libtpu_start():
        return topologies.get_topology_desc(platform="tpu", **dict(args))


@contextlib.contextmanager
def _libtpu_start() -> Iterator[None]:
    # libtpu's first start in a process reads its environment once. Two settings matter for a
    # process that only compiles: without ALLOW_MULTIPLE_LIBTPU_LOAD it takes a machine-wide
    # lock (/tmp/libtpu_lockfile) that makes a second process's start fail ("Internal error
    # when accessing libtpu multi-process lockfile"), so parallel compiles and test workers
    # would refuse each other; and off a TPU VM it logs that the VM's metadata is missing
    # (the accelerator type, the worker hostnames), which says nothing about the compile.
    # Both are scoped to the start: the variable is restored, the lines are kept only for an
    # error.
    before = os.environ.get("ALLOW_MULTIPLE_LIBTPU_LOAD")
    os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    try:
        with captured_stderr(echo=False):
            yield
    finally:
        if before is None:
            os.environ.pop("ALLOW_MULTIPLE_LIBTPU_LOAD", None)
        else:
            os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = before


def _has_tpu_device() -> bool:
    # A TPU VM exposes its chips as /dev/accel* (v4, v5p) or /dev/vfio/* (v5e and later).
    return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


@functools.lru_cache(maxsize=1)
def _libtpu_pin() -> tuple[str | None, str | None]:
    """(installed libtpu version or None, the specifier jax's ``tpu`` extra pins or None)."""
    from packaging.requirements import Requirement

    try:
        have = importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        have = None
    want = None
    for line in importlib.metadata.requires("jax") or ():
        req = Requirement(line)
        if (
            req.name == "libtpu"
            and req.marker is not None
            and req.marker.evaluate({"extra": "tpu"})
        ):
            want = str(req.specifier)
    return have, want


def _check_libtpu(name: str) -> None:
    from packaging.specifiers import SpecifierSet

    have, want = _libtpu_pin()
    if have is None:
        raise TargetError(_LIBTPU_MISSING.format(name=name, jax=jax.__version__))
    if want is not None and have not in SpecifierSet(want):
        raise TargetError(
            _LIBTPU_MISMATCH.format(name=name, jax=jax.__version__, want=f"libtpu{want}", have=have)
        )
