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
from remat_kit.render import compiling_words, length_words, live_line, progress

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
    err = " ".join(capsys.readouterr().err.split())  # the lines are wrapped to the terminal
    assert "advise: 2 GPUs (each planned by compiling, adaptively" in err
    assert "advise --scale-out: at most 12 compiles (fsdp over 2, 4, 8, 16, 32, 64 GPUs for " in err
    assert "each of the 2 GPUs one cannot serve" in err


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
        {
            "target": name,
            "devices": 2,
            "device": "GPU",
            "peak_bytes": 1,
            "policy": "full",
            "batch": 2,
        },
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


# --- the live line names what it compiles and fits the terminal (issue 59) -------------------


def test_the_live_line_keeps_the_batch_the_count_and_the_clock_as_it_narrows():
    said, now = "planning (cost model, solver, verifying compiles)", "minimal at batch 8"
    tail = " (7 of 28 compiles, 1:23)"
    whole = f"plan: {said}, {now}{tail}"  # 103 columns, written out
    assert live_line("plan", said, now, 7, 28, "compiles", 83.9, 200) == whole
    for width in range(1, 130):
        line = live_line("plan", said, now, 7, 28, "compiles", 83.9, width)
        assert len(line) <= width
        if width >= len(whole):
            assert line == whole
        elif width >= len(f"plan: …, {now}{tail}"):
            # The step's words give way first (cut short, ending in an ellipsis): what is
            # compiled, the count and the clock stay.
            assert line.startswith("plan: ") and line.endswith(f"…, {now}{tail}")
            assert said.startswith(line.removeprefix("plan: ").split("…")[0])
            assert len(line) >= width - 1  # a space before the cut is dropped, no more
    assert (
        live_line("fit", "", None, 1, None, "compiles", 5.0, 80)
        == "fit: starting (1 compile, 0:05)"
    )


def test_on_a_narrow_terminal_each_line_fits_and_the_live_one_names_the_batch(monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")  # what shutil.get_terminal_size reads first
    out, buf = _console(True)
    up_front = length_words(
        "fit over 3 policies",
        how="each policy's largest batch is found by compiling on both sides of it",
    )
    assert len(up_front) == 141  # the line: wider than most terminals
    with progress("fit", out, length=up_front, now=lambda: "batch 297") as step:
        step("none (1/3)")
        time.sleep(0.3)  # the line redraws as the spinner turns
        step("plan (3/3): the planner at the largest batch of full, then its plan")
        time.sleep(0.3)
    drawn = _drawn(buf)
    lines = [line.rstrip() for line in re.split(r"[\r\n]", drawn) if line.strip()]
    # Each line within the 60 columns, the spinner before the live one included.
    assert max(len(line) for line in lines) <= 60, lines
    # The line up front is wrapped between words, every word kept.
    assert " ".join(drawn.split()).startswith(up_front)
    assert "fit: none (1/3), batch 297 (0 compiles, 0:00)" in drawn
    # 105 columns of it in 58 (the spinner and its space take 2): the step's words are cut
    # to the 24 columns left them; what is compiled, the count and the clock stay.
    assert "fit: plan (3/3): the planner…, batch 297 (1 compile, 0:00)" in drawn


def test_a_workload_says_what_it_compiles_while_it_compiles():
    from helpers import memory_report

    seen = []

    def measure(policy, schedule, batch):
        seen.append((w.compiling, compiling_words([w]), compiling_words([w], policy=True)))
        return memory_report(peak_bytes=batch, policy=policy.spec)

    w = rk.sources.workload(
        rk.sources.Measured(measure, lambda p, s, b: float(b)), "h100", rk.TrainConfig(1, 16)
    )
    assert w.compiling is None
    w.report("minimal", batch=297)
    assert seen == [(("minimal", "none", 297), "batch 297", "minimal at batch 297")]
    assert w.compiling is None and compiling_words([w]) is None


def test_fit_names_the_batch_it_compiles_on_the_live_line(monkeypatch, capsys):
    from helpers import memory_report

    monkeypatch.setenv("COLUMNS", "70")

    def search(w, policy, schedule, **kwargs):
        def measure(p, s, batch):
            time.sleep(0.3)  # the line redraws while the "compile" runs
            return memory_report(peak_bytes=batch, policy=p.spec)

        object.__setattr__(w, "measure_fn", measure)  # a stand-in compile: no XLA
        w.compiled(policy, schedule, 297)
        raise _Stop

    monkeypatch.setattr("remat_kit.search._fit.max_batch", search)
    with pytest.raises(_Stop):
        main(["fit", *TINY, "--policies", "none,full"])
    err = _drawn_text(capsys.readouterr().err)
    assert "fit: none (1/2), batch 297 (0 compiles, 0:00)" in err
    lines = [line.rstrip() for line in re.split(r"[\r\n]", err) if line.strip()]
    assert max(len(line) for line in lines) <= 70, lines


def _drawn_text(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
