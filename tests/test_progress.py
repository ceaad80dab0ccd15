"""A long search says up front how many compiles it will make, and shows each as it goes
(issue 45).

The searches are replaced by stand-ins that stop at once, so what is said before the first
compile is checked without compiling; the live line is drawn on a console made a terminal.
"""

from __future__ import annotations

import io
import re
import time

import pytest
from rich.console import Console

import remat_kit as rk
from remat_kit.cli import main
from remat_kit.render import length_words, progress

TINY = ["--model", "tiny-llama", "--target", "h100", "--seq", "64"]


@pytest.fixture(autouse=True)
def _terminal(monkeypatch):
    """stderr taken for a terminal (rich reads TTY_COMPATIBLE): where the lines are drawn."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")


class _Stop(Exception):
    """Raised by a stand-in search: what was said before it is the test's."""


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((("compare", 11), {}), "compare: 11 compiles"),
        ((("next step", 2), {"bound": True}), "next step: at most 2 compiles (it stops at the "),
        ((("next step", 1), {"bound": True}), "next step: at most 1 compile (it stops"),
        ((("fit",), {}), "fit: adaptive, so the compiles are counted as they go"),
        ((("advise", 3), {"unit": "GPUs", "how": "each planned"}), "advise: 3 GPUs (each planned)"),
    ],
)
def test_the_length_is_said_as_a_count_a_bound_or_adaptive(args, said):
    (pos, kw) = args
    assert length_words(*pos, **kw).startswith(said)


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=200), buf


def test_off_a_terminal_nothing_is_written():
    out, buf = _console(False)
    with progress("compare", out, total=3, length="compare: 3 compiles") as step:
        step("full")
        step("minimal")
    assert buf.getvalue() == ""  # stderr keeps only what went wrong (one line)


def test_on_a_terminal_the_length_comes_first():
    out, buf = _console(True)
    with progress("compare", out, total=3, length="compare: 3 compiles") as step:
        step("full")
    assert _drawn(buf).startswith("compare: 3 compiles\n")


def _drawn(buf: io.StringIO) -> str:
    """What a terminal showed: the frames rich drew, without their control codes."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())


def test_on_a_terminal_the_line_counts_each_compile_of_the_total():
    out, buf = _console(True)
    done = [0]
    with progress("compare", out, total=11, done=lambda: done[0]) as step:
        step("full")
        time.sleep(0.3)  # the line redraws as the spinner turns
        done[0] = 3  # three compiles end between steps: the line shows them
        time.sleep(0.3)
    assert "compare: full (0 of 11 compiles, 0:00)" in _drawn(buf)
    assert "compare: full (3 of 11 compiles, 0:00)" in _drawn(buf)


def test_without_a_total_the_line_counts_the_steps_so_far():
    out, buf = _console(True)
    with progress("fit", out) as step:
        step("none (1/2)")
        step("full (2/2)")
        time.sleep(0.3)
    assert "fit: full (2/2) (1 compile, 0:00)" in _drawn(buf)


def test_plan_says_its_bound_before_the_first_compile(monkeypatch, capsys):
    def stop(w, *a, **kw):
        raise _Stop

    monkeypatch.setattr("remat_kit.cli._plan.plan_front", stop)
    with pytest.raises(_Stop):
        main(["plan", *TINY, "--batch", "2", "--policies", "full,minimal"])
    err = capsys.readouterr().err
    # none, 6 solver plans, full's 5 schedules and the 2 policies, each maybe compiled whole to
    # confirm what shallow copies of the unrolled tiny-llama say: 2 x 14.
    assert "plan: at most 28 compiles (none, the solver's plans, full's schedules" in err


def test_fit_says_it_is_adaptive_before_the_first_compile(monkeypatch, capsys):
    def stop(*a, **kw):
        raise _Stop

    monkeypatch.setattr("remat_kit.cli._fit.fastest", stop)
    with pytest.raises(_Stop):
        main(["fit", *TINY, "--objective", "throughput", "--policies", "none,full"])
    err = capsys.readouterr().err
    assert err.startswith("fit --objective throughput over 2 policies: adaptive (")
    assert "so the compiles are counted as they go" in err


def test_advise_says_how_many_gpus_and_the_scale_outs_bound(monkeypatch, capsys):
    from remat_kit.search import Advice, ScaleOut

    def plans(workload_for, batch, targets=None, progress=None, **kwargs):
        rows = []
        for name in targets:
            rows.append(Advice(name, 1, False, None, None, None, None, 0, 2, _NOTE, 0.0))
            progress(f"{name} done")
        return rows

    def counts(workload_for, batch, **kwargs):
        assert kwargs["counts"] == (2, 4, 8, 16, 32, 64)
        name = workload_for.args[1]
        return ScaleOut(name, 2, batch, "full", 1, ((2, 1),), _fits_note(name))

    monkeypatch.setattr("remat_kit.cli._advise.advise", plans)
    monkeypatch.setattr("remat_kit.cli._advise.gpus_needed", counts)
    argv = ["advise", "--model", "tiny-llama", "--seq", "64", "--targets", "l4,h100"]
    assert main([*argv, "--scale-out"]) == 0
    err = capsys.readouterr().err
    assert "advise: 2 GPUs (each planned by compiling, adaptively" in err
    assert "advise --scale-out: at most 12 compiles (fsdp over 2, 4, 8, 16, 32, 64 GPUs for " in err
    assert "each of the 2 GPUs one cannot serve" in " ".join(err.split())


_NOTE = rk.notes.Note(
    "plan_nothing_fits",
    {
        "target": "l4",
        "batch": 1,
        "budget_bytes": 1,
        "peak_bytes": 2,
        "policy": "full",
        "schedule": "none",
    },
)


def _fits_note(name):
    return rk.notes.Note(
        "scale_out_fits",
        {"target": name, "devices": 2, "peak_bytes": 1, "policy": "full", "batch": 2},
    )


def test_compare_says_its_count_before_the_first_compile(monkeypatch, capsys):
    def stop(*a, **kw):
        raise _Stop

    monkeypatch.setattr("remat_kit.cli._compare._workers.run", stop)
    argv = ["compare", *TINY, "--batch", "2", "--policies", "none,full,minimal"]
    with pytest.raises(_Stop):
        main([*argv, "--schedules", "none;every:2", "--jobs", "1"])
    err = capsys.readouterr().err
    assert "compare on h100-80gb: 6 compiles (one per policy and schedule)" in err
