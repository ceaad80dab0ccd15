"""What XLA's compiler says: its remat pass's outcome and its log lines, read without a GPU."""

import os
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from remat_kit import xla

GLOG = "W1122 07:36:53.647390   18076 hlo_rematerialization.cc:3231] "
CANT = (
    "Can't reduce memory use below {a:.2f}GiB ({a_b} bytes) by rematerialization; only reduced "
    "to {r:.2f}GiB ({r_b} bytes), down from {o:.2f}GiB ({o_b} bytes) originally"
)


def _cant(limit, reached, before):
    g = 2**30
    return GLOG + CANT.format(
        a=limit / g, a_b=limit, r=reached / g, r_b=reached, o=before / g, o_b=before
    )


def _stats(temp):
    return SimpleNamespace(
        argument_size_in_bytes=1000,
        output_size_in_bytes=10,
        temp_size_in_bytes=temp,
        alias_size_in_bytes=0,
        generated_code_size_in_bytes=0,
    )


class _Compiled:
    def __init__(self, temp, text):
        self._temp, self._text = temp, text

    def memory_analysis(self):
        return _stats(self._temp)

    def as_text(self):
        return self._text


class _Lowered:
    """A lowered program whose compile logs ``log`` and whose remat-free compile is bigger."""

    def __init__(self, temp, temp_without_remat, text, log=""):
        self.temp, self.plain, self.text, self.log = temp, temp_without_remat, text, log
        self.options = []

    def compile(self, compiler_options=None):
        import os

        self.options.append(compiler_options)
        if self.log:
            os.write(2, (self.log + "\n").encode())
        if compiler_options == {"xla_disable_hlo_passes": "rematerialization"}:
            return _Compiled(self.plain, "ENTRY %main { %x = f32[] parameter(0) }")
        return _Compiled(self.temp, self.text)


CLONED = 'ENTRY %main {\n  %fusion.3.remat2 = f32[8]{0} fusion(%p), metadata={op_name="x"}\n}'
# jax.checkpoint's op names mention remat too: metadata alone is no evidence of XLA's pass.
ONLY_METADATA = (
    'ENTRY %main {\n  %fusion.3 = f32[8]{0} fusion(%p), metadata={op_name="jvp(block.remat)"}\n}'
)


def test_pass_that_fell_short_reports_its_own_figures_and_no_second_compile():
    low = _Lowered(500, 900, CLONED, log=_cant(300, 500 + 10, 800 + 10))
    mem = xla.compile_memory(low)
    assert mem.xla_remat_fell_short and mem.xla_remat_limit_bytes == 300
    assert mem.xla_remat_saved_bytes == 300  # 810 -> 510, from XLA's own line
    assert low.options == [None]  # the log said it all
    assert mem.xla_messages == (
        "XLA's rematerialization pass could not bring the program under its limit of 0.00 GiB: "
        "it reached 0.00 GiB, from 0.00 GiB",
    )


def test_pass_that_succeeded_is_measured_by_compiling_without_it():
    low = _Lowered(500, 900, CLONED)
    mem = xla.compile_memory(low)
    assert mem.xla_remat_saved_bytes == 400 and not mem.xla_remat_fell_short
    assert low.options == [None, {"xla_disable_hlo_passes": "rematerialization"}]


@pytest.mark.parametrize(
    ("text", "measure", "compiles"),
    [(ONLY_METADATA, True, 1), (CLONED, False, 1)],
)
def test_no_clones_or_no_measuring_means_one_compile_and_nothing_saved(text, measure, compiles):
    low = _Lowered(500, 900, text)
    mem = xla.compile_memory(low, measure_xla_remat=measure)
    assert mem.xla_remat_saved_bytes == 0 and len(low.options) == compiles


def test_other_warnings_are_kept_and_info_lines_dropped():
    lines = [
        "I1122 07:36:53.647390   18076 gpu_compiler.cc:1] chatter",
        "W1122 07:36:53.647390   18076 gemm_fusion.cc:42] something odd",
        "W1122 07:36:53.647390   18076 gemm_fusion.cc:42] something odd",
        "not a log line",
    ]
    assert xla.parse_xla_log(lines) == ["XLA (gemm_fusion.cc:42): something odd"]


def test_peak_is_argument_output_temp_minus_alias():
    mem = xla.compile_memory(_Lowered(500, 500, ONLY_METADATA))
    assert mem.peak_bytes == 1000 + 10 + 500


class _Slow(_Lowered):
    """A compile that takes a while before it logs: two at once overlap in time."""

    def compile(self, compiler_options=None):
        time.sleep(0.1)
        return super().compile(compiler_options)


def test_compiles_side_by_side_in_threads_each_keep_their_own_log_lines():
    # File descriptor 2 is the process's: two captures open at once would swap their lines,
    # or lose one to the real stderr, and leave descriptor 2 on a deleted file.
    lowered = [_Slow(500, 900, CLONED, log=_cant(300 + i, 510, 810)) for i in range(4)]
    before = os.fstat(2)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(xla.compile_memory, lowered))
    assert [m.xla_remat_limit_bytes for m in got] == [300, 301, 302, 303]
    assert [len(m.xla_messages) for m in got] == [1, 1, 1, 1]
    after = os.fstat(2)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
