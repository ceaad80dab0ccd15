"""Compile a lowered program and read what XLA says about it: memory, its remat pass, its log.

XLA's GPU compiler runs its own rematerialization pass when a program exceeds the memory limit
it was given (see :mod:`remat_kit.targets.runtime` for the limit), and reports failure only as
a C++ log line on stderr ("Can't reduce memory use below ..."). This module captures those
lines during the compile, so the user sees them as report warnings rather than raw log output,
and measures what the pass really saved: the log states it when the pass falls short, and a
second compile with the pass disabled states it when the pass succeeded (only then, since that
costs a compile). The pass clones instructions even when it saves nothing, so the mere presence
of clones is not evidence that it changed the program.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from remat_kit.xla._kernel import Kernel
from remat_kit.xla._kernels import kernels_of

__all__ = [
    "CompiledMemory",
    "captured_stderr",
    "compile_memory",
    "compile_with",
    "over_device_memory",
    "parse_xla_log",
    "xla_peak",
]

_LOG = logging.getLogger(__name__)
# How Python's warnings module prints a warning: path:line: Category: message.
_PY_WARNING = re.compile(r"^\S.*:\d+: \w+: ")
# glog's prefix: severity, date, time, thread, file:line]
_GLOG = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ ([\w.]+:\d+)\] (.*)$")
_CANT_REDUCE = re.compile(
    r"Can't reduce memory use below .*?\((\d+) bytes\) by rematerialization; only reduced to "
    r".*?\((\d+) bytes\), down from .*?\((\d+) bytes\) originally"
)
# Instructions the remat pass cloned are named <original>.remat<N>; metadata is stripped first,
# since op names from jax.checkpoint mention "remat" too.
_BASE_LIMIT = re.compile(
    r"byte size of input/output arguments \((\d+)\) exceeds the base limit \((\d+)\)"
)
_CLONE = re.compile(r"%?[\w.\-]+\.remat\d*\b")
_METADATA = re.compile(r"metadata=\{[^}]*\}")
_DISABLE_REMAT = {"xla_disable_hlo_passes": "rematerialization"}
# How jaxlib refuses a compile option it does not know, or one of another type.
_UNKNOWN_OPTION = ("No such compile option", "While setting option")


@dataclasses.dataclass(frozen=True)
class CompiledMemory:
    """XLA's memory analysis of one compiled program, with what its remat pass did.

    Attributes:
      argument_bytes, output_bytes, temp_bytes, alias_bytes, generated_code_bytes: XLA's fields
        (device memory, per device).
      host_bytes: all pinned-host fields (argument + output + temp - alias).
      host_temp_bytes: host temporaries alone (offloaded activations).
      xla_peak_bytes: XLA's own peak when this jaxlib reports one, else None.
      xla_remat_limit_bytes: the limit XLA's remat pass worked to, when its log states it.
      xla_remat_saved_bytes: bytes XLA's remat pass took off the program (0: it changed
        nothing, or did not run).
      xla_remat_fell_short: the pass could not get under its limit (XLA's warning).
      xla_messages: XLA's warnings during the compile, as sentences for the user.
      compile_seconds: wall time of the compile (both compiles when a second was needed).
      kernels: the kernels the program launches, read from its optimized HLO
        (:func:`remat_kit.xla.kernels_of`): what the step-time model prices.
      program: a fingerprint of the lowered program (16 hex digits of
        :func:`remat_kit.cache.fingerprint`; ``""`` where not taken): two policies that
        lower to the same program (``dots`` and ``minimal`` on a Llama) have the same one.
      over_device: the compiler refused the program as over the device's memory (libtpu's
        ``CompileTimeHbmOom``: a TPU compile, deviceless too, stops there, where a GPU's
        compiles and reports). Its total is then ``temp_bytes`` alone, as the refusal states
        it (to 0.01 of its unit: libtpu prints no bytes), and there are no kernels.
    """

    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    generated_code_bytes: int
    host_bytes: int
    host_temp_bytes: int
    xla_peak_bytes: int | None
    xla_remat_limit_bytes: int | None
    xla_remat_saved_bytes: int
    xla_remat_fell_short: bool
    xla_messages: tuple[str, ...]
    compile_seconds: float
    kernels: tuple[Kernel, ...] = ()
    program: str = ""
    over_device: bool = False

    @property
    def peak_bytes(self) -> int:
        """argument + output + temp - alias: the usual total (MaxText, JAX's offload guide)."""
        return self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["xla_messages"] = list(self.xla_messages)
        out["kernels"] = [k.to_list() for k in self.kernels]
        return out


def compile_memory(
    lowered: Any,
    *,
    options: Mapping[str, Any] | None = None,
    measure_xla_remat: bool = True,
    dump_to: str | None = None,
) -> CompiledMemory:
    """Compiles ``lowered`` and reads its memory analysis and XLA's remat outcome.

    Args:
      lowered: a ``jax.stages.Lowered`` (``jax.jit(f).lower(*abstract_args)``).
      options: compiler options that make the compile cheaper without changing its analysis
        (:func:`remat_kit.targets.analysis_options`); an XLA that does not know one
        of them compiles without them.
      measure_xla_remat: when XLA's pass cloned instructions and said nothing, compile once
        more without it to learn what it saved (False: report 0 saved in that case).
      dump_to: a directory for XLA's dump of this compile (buffer assignment, live
        ranges, optimized HLO: :mod:`remat_kit.peak` reads them); the compile that measures
        XLA's remat pass, if any, dumps nothing.

    Returns:
      A CompiledMemory.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> low = jax.jit(lambda a: a @ a).lower(jax.ShapeDtypeStruct((8, 8), jnp.float32))
      >>> compile_memory(low).argument_bytes
      256
    """
    start = time.perf_counter()
    with captured_stderr() as log:
        dump = {"xla_dump_to": dump_to, "xla_dump_hlo_as_text": True} if dump_to else None
        try:
            compiled = compile_with(lowered, options, dump)
        except Exception as err:  # jaxlib's own error type
            refused = over_device_memory(str(err))
            if refused is None:
                raise
            return _refused(refused, time.perf_counter() - start)
    stats = compiled.memory_analysis()
    text = _text_of(compiled)  # printed once: a deep unrolled step's text takes a second
    lines = log.lines
    limit, saved, fell_short = _remat_from_log(lines)
    if not fell_short and measure_xla_remat and _has_remat_clones(text):
        with captured_stderr():
            plain = compile_with(lowered, options, _DISABLE_REMAT).memory_analysis()
        saved = max(0, _peak(plain) - _peak(stats))
    return CompiledMemory(
        argument_bytes=int(stats.argument_size_in_bytes),
        output_bytes=int(stats.output_size_in_bytes),
        temp_bytes=int(stats.temp_size_in_bytes),
        alias_bytes=int(stats.alias_size_in_bytes),
        generated_code_bytes=int(stats.generated_code_size_in_bytes),
        host_bytes=(
            int(getattr(stats, "host_argument_size_in_bytes", 0))
            + int(getattr(stats, "host_output_size_in_bytes", 0))
            + int(getattr(stats, "host_temp_size_in_bytes", 0))
            - int(getattr(stats, "host_alias_size_in_bytes", 0))
        ),
        host_temp_bytes=int(getattr(stats, "host_temp_size_in_bytes", 0)),
        xla_peak_bytes=xla_peak(stats),
        xla_remat_limit_bytes=limit,
        xla_remat_saved_bytes=saved,
        xla_remat_fell_short=fell_short,
        xla_messages=tuple(parse_xla_log(lines)),
        compile_seconds=time.perf_counter() - start,
        kernels=kernels_of(text) if text else (),
    )


# libtpu's refusal of a program over the device's memory (E1000, openxla.org/xla/errors/error_1000).
_HBM_OOM = re.compile(
    r"CompileTimeHbmOom: .*?required for HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds "
    r"available HBM \(([\d.]+)([KMGT]?)\)"
)
_UNIT = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def over_device_memory(message: str) -> tuple[int, int] | None:
    """``(required, available)`` bytes when ``message`` is libtpu refusing a program as over
    the device's memory, else None. libtpu prints binary units to two decimals (``15.75G`` is
    a v5e's 16,909,336,576 B limit), so the bytes are good to 0.005 of the unit.

    Example:
      >>> over_device_memory("RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory "
      ...     "on HBM, the total memory required for HLO temporaries (48.00G) exceeds available "
      ...     "HBM (15.75G). HLO module: jit__lambda.")
      (51539607552, 16911433728)
      >>> over_device_memory("INVALID_ARGUMENT: something else") is None
      True
    """
    m = _HBM_OOM.search(message)
    if m is None:
        return None
    need, need_unit, have, have_unit = m.groups()
    return round(float(need) * _UNIT[need_unit]), round(float(have) * _UNIT[have_unit])


def _refused(refused: tuple[int, int], seconds: float) -> CompiledMemory:
    need, have = refused
    return CompiledMemory(
        argument_bytes=0,
        output_bytes=0,
        temp_bytes=need,
        alias_bytes=0,
        generated_code_bytes=0,
        host_bytes=0,
        host_temp_bytes=0,
        xla_peak_bytes=None,
        xla_remat_limit_bytes=have,
        xla_remat_saved_bytes=0,
        xla_remat_fell_short=True,
        xla_messages=(
            f"the TPU compiler refused the program: it needs {need / 2**30:.2f} GiB of "
            f"the {have / 2**30:.2f} GiB a device holds, after its own rematerialization "
            "(libtpu's CompileTimeHbmOom; its figures to 0.01 GiB)",
        ),
        compile_seconds=seconds,
        over_device=True,
    )


def compile_with(
    lowered: Any,
    options: Mapping[str, Any] | None,
    required: Mapping[str, Any] | None = None,
) -> Any:
    """``lowered.compile()`` with ``required`` options and, where XLA knows them, ``options``.

    Args:
      lowered: a ``jax.stages.Lowered``.
      options: options that only make the compile cheaper; dropped when XLA rejects one
        (a version that renamed or removed it, or takes another type).
      required: options the compile must have (a dump directory, a pass switched off).

    Returns:
      The compiled program.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> low = jax.jit(lambda a: a + 1).lower(jax.ShapeDtypeStruct((4,), jnp.float32))
      >>> compile_with(low, {"xla_no_such_option": 1}).memory_analysis().argument_size_in_bytes
      16
    """
    merged = {**(options or {}), **(required or {})}
    if not merged:
        return lowered.compile()
    try:
        return lowered.compile(compiler_options=merged)
    except Exception as err:  # jaxlib raises its own runtime error type
        if not options or not any(m in str(err) for m in _UNKNOWN_OPTION):
            raise
    return lowered.compile(compiler_options=dict(required)) if required else lowered.compile()


def parse_xla_log(lines: list[str]) -> list[str]:
    """XLA's warnings and errors among ``lines`` (glog format), as sentences for a report.

    The remat pass's "Can't reduce memory use" line becomes one sentence with GiB figures;
    other warnings keep their text, without glog's prefix. Info lines are dropped.

    Example:
      >>> parse_xla_log(["W1122 07:36:53.647390   18076 hlo_rematerialization.cc:3231] "
      ...     "Can't reduce memory use below 1.00GiB (1073741824 bytes) by rematerialization; "
      ...     "only reduced to 2.00GiB (2147483648 bytes), down from 3.00GiB (3221225472 bytes) "
      ...     "originally"])[0].split(": ")[1]
      'it reached 2.00 GiB, from 3.00 GiB'
      >>> parse_xla_log(["W1124 02:20:01.1 7 gpu_hlo_schedule.cc:968] The byte size of "
      ...     "input/output arguments (96363200824) exceeds the base limit (63707234304). This "
      ...     "indicates an error in the calculation!"])[0][:64]
      "XLA: the step's inputs and outputs alone (89.75 GiB: weights, gr"

    """
    out = []
    for line in lines:
        m = _GLOG.match(line.strip())
        if m is None or m.group(1) == "I":
            continue
        text = m.group(3).strip()
        cant = _CANT_REDUCE.search(text)
        if cant:
            limit, reached, before = (int(g) / 2**30 for g in cant.groups())
            text = (
                f"XLA's rematerialization pass could not bring the program under its limit of "
                f"{limit:.2f} GiB: it reached {reached:.2f} GiB, from {before:.2f} GiB"
            )
        elif _BASE_LIMIT.search(text):
            args_, limit = (int(g) / 2**30 for g in _BASE_LIMIT.search(text).groups())
            # XLA calls it "an error in the calculation"; it is a program that cannot fit.
            text = (
                f"XLA: the step's inputs and outputs alone ({args_:.2f} GiB: weights, "
                f"gradients, optimizer state, batch) exceed the {limit:.2f} GiB its scheduler "
                "plans for"
            )
        else:
            text = f"XLA ({m.group(2)}): {text}"
        if text not in out:
            out.append(text)
    return out


def _remat_from_log(lines: list[str]) -> tuple[int | None, int, bool]:
    for line in lines:
        m = _CANT_REDUCE.search(line)
        if m:
            limit, reached, before = (int(g) for g in m.groups())
            return limit, max(0, before - reached), True
    return None, 0, False


def _text_of(compiled: Any) -> str:
    # The optimized HLO of the compile the memory analysis read: the step-time model and the
    # remat-clone check need no other.
    try:
        return compiled.as_text() or ""
    except Exception:  # a debugging API: a backend that keeps no text gives no kernels
        return ""


def _has_remat_clones(text: str) -> bool:
    return bool(text) and _CLONE.search(_METADATA.sub("", text)) is not None


def xla_peak(stats: Any) -> int | None:
    """XLA's own ``peak_memory_in_bytes`` where it is the program's peak, else None.

    jaxlib before 0.10 fills the field with something else: for tiny-llama ``full`` b2 s64
    on an H100 target, jax 0.9.2 reported 2,170,940 B where the arguments alone are
    2,170,628 B and the peak of its own live ranges is 3,210,720 B (jax 0.10.2: 3,895,364 B
    of a 3,917,792 B peak).

    Args:
      stats: ``compiled.memory_analysis()``.

    Returns:
      The bytes, or None (not reported, or not a peak on this jaxlib).
    """
    import jaxlib

    if tuple(int(p) for p in re.findall(r"\d+", jaxlib.__version__)[:2]) < (0, 10):
        return None
    return int(getattr(stats, "peak_memory_in_bytes", 0) or 0) or None


def _peak(stats: Any) -> int:
    return int(
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        + stats.temp_size_in_bytes
        - stats.alias_size_in_bytes
    )


def _not_xla(lines: list[str]) -> list[str]:
    """The lines of a captured stderr that XLA did not write: a Python warning (its line and
    the source line under it) and anything before XLA's first line. A line after an XLA line
    that is not a Python warning continues XLA's message (XLA logs multi-line messages, whose
    later lines carry no glog prefix): it stays captured, never reaching the user raw.

    Example:
      >>> _not_xla(["W1124 02:20:01.1 7 gpu_hlo_schedule.cc:968] first", "  second line",
      ...           "/x.py:3: UserWarning: careful", "  warnings.warn('careful')"])
      ['/x.py:3: UserWarning: careful', "  warnings.warn('careful')"]
    """
    out: list[str] = []
    in_xla = in_warning = False
    for line in lines:
        if not line.strip():
            continue
        if _GLOG.match(line.strip()):
            in_xla, in_warning = True, False
        elif _PY_WARNING.match(line):
            in_xla, in_warning = False, True
            out.append(line)
        elif in_warning and line.startswith(" "):
            out.append(line)  # the source line Python prints under its warning
        elif in_xla:
            _LOG.debug("XLA: %s", line)  # shown by a logging handler at DEBUG, never raw
        else:
            out.append(line)
    return out


# File descriptor 2 is the process's, not a thread's: two captures open at once in one process
# (compiles in a thread pool) would each take the other's lines, or lose them to the real
# stderr, and the later to close would leave descriptor 2 on the earlier's deleted file. One
# capture at a time; re-entrant, as a capture may open inside another in the same thread.
_CAPTURE = threading.RLock()


class _Log:
    lines: list[str]

    def __init__(self) -> None:
        self.lines = []


@contextlib.contextmanager
def captured_stderr(echo: bool = True) -> Iterator[_Log]:
    """Redirects file descriptor 2 (where XLA's C++ logs go) to a file for the duration.

    What is not an XLA log line (a Python warning printed meanwhile) is written back to the
    real stderr afterwards, so nothing the user should see is lost.

    Args:
      echo: write those lines back; False keeps every line in ``lines`` only (a library's
        start-up chatter the caller words itself when it matters).

    Returns:
      A context manager; the object it yields holds the captured ``lines`` once it exits.

    Example:
      >>> with captured_stderr() as log:
      ...     _ = os.write(2, b"W1124 02:20:01.1 7 hlo_rematerialization.cc:3231] raw" + b"\\n")
      >>> log.lines
      ['W1124 02:20:01.1 7 hlo_rematerialization.cc:3231] raw']
    """
    log = _Log()
    with _CAPTURE:
        sys.stderr.flush()
        saved = os.dup(2)
        with tempfile.TemporaryFile() as tmp:
            os.dup2(tmp.fileno(), 2)
            try:
                yield log
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
                tmp.seek(0)
                text = tmp.read().decode(errors="replace")
                log.lines = text.splitlines()
                other = _not_xla(log.lines) if echo else []
                if other:
                    sys.stderr.write("\n".join(other) + "\n")
