"""``remat-kit fit --over seq``: the longest sequence per policy, from the command line.

One search on tiny-llama for an H100 whose allocator may use 0.02% of it (a 16 MiB limit, so
the answers are a few thousand tokens): its table and its JSON, which must be what the
library call gives. Then the flags: what reaches the search, and every refusal as one line,
exit code 2, before any compile.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import sys

import pytest

import remat_kit as rk
from remat_kit.cli import main
from remat_kit.notes import Note

TINY = ["fit", "--model", "tiny-llama", "--target", "h100", "--optimizer", "sgd"]
FRACTION = 0.0002  # of the H100's memory: about 16 MiB (0.0003 took 13 compiles, this 11)
STEP = 128


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """The CLI's table, its JSON and exit code, for none, full and the planner."""
    path = tmp_path_factory.mktemp("seq") / "fit.json"
    argv = [*TINY, "--over", "seq", "--seq-step", str(STEP), "--mem-fraction", str(FRACTION)]
    argv += ["--policies", "none,full,plan", "--json", str(path), "--wide"]
    capture = pytest.MonkeyPatch()
    out, err = io.StringIO(), io.StringIO()
    capture.setattr(sys, "stdout", out)
    capture.setattr(sys, "stderr", err)
    try:
        code = main(argv)
    finally:
        capture.undo()
    return code, out.getvalue(), err.getvalue(), json.loads(path.read_text())


@pytest.mark.slow
def test_the_table_stars_the_longest_and_says_it_under_the_table(searched):
    code, out, err, data = searched
    assert code == 0, err
    rows = {row["label"]: row for row in data["rows"]}
    none, full = rows["none"], rows["full"]
    assert 0 < none["seq"] < full["seq"]
    title = "longest sequence: tiny-llama b1 sgd on h100-80gb, attention cudnn, step 128 tokens"
    assert title in " ".join(out.split())
    # The peaks are under the ~16 MiB limit, near it: the byte columns read in MiB (issue 45).
    for col in ("longest seq", "tokens/step", "peak MiB", "next step MiB", "compiles", "method"):
        assert col in out
    starred = [line for line in out.splitlines() if " * " in line or "* │" in line]
    assert starred and all("none" not in line.split("│")[1] for line in starred)
    ratio = full["seq"] / none["seq"]
    assert (
        f"longest: full at seq {full['seq']} (batch 1: {full['seq']:,} tokens per step)"
        f", {ratio:.1f}x none ({none['seq']})"
    ) in " ".join(out.split())


@pytest.mark.slow
def test_the_json_is_what_the_library_call_gives(searched):
    from remat_kit.targets.runtime import Runtime
    from remat_kit_models.spec import PresetSpec

    _, _, _, data = searched
    assert (data["over"], data["batch"], data["granularity"], data["cap"]) == (
        "seq",
        1,
        STEP,
        rk.search.DEFAULT_SEQ_CAP,
    )
    # The target as the CLI makes it: its runtime says where the fraction came from.
    target = dataclasses.replace(
        rk.target("h100", mem_fraction=FRACTION), runtime=Runtime(FRACTION, "--mem-fraction")
    )

    src = rk.sources.resolve(PresetSpec("tiny-llama"))

    @functools.cache
    def at(seq):
        # As the CLI builds it (strict: a policy naming no tag is an error; the default
        # regime named), so the programs are the ones it compiled, read back from the
        # session's compile cache.
        config = rk.TrainConfig(1, seq, optimizer="sgd", precision=rk.train.regime())
        return rk.sources.workload(src, target, config, strict=True)

    rows = {row["label"]: row for row in data["rows"]}
    for policy in ("none", "full"):
        fit = rk.search.max_seq(at, policy, granularity=STEP)
        row = rows[policy]
        fields = ("seq", "peak_bytes", "next_peak_bytes", "limit_bytes", "batch", "attention")
        for field in fields:
            assert row[field] == getattr(fit, field), (policy, field)
        assert row["note"] == fit.note.to_dict() and row["message"] == fit.message
        assert row["tokens_per_step"] == row["seq"] == row["value"] and row["unit"] == STEP
        assert row["compiles"] >= 3 and row["method"] in ("line", "quadratic", "bisection")
    # The planner's row: the longest sequence of full, with the plan that fits there.
    plan = next(row for label, row in rows.items() if label.startswith("plan"))
    assert plan["seq"] == rows["full"]["seq"] and plan["fits"]
    assert plan["peak_bytes"] <= plan["limit_bytes"]
    assert plan["note"]["kind"] == "plan_at_max_seq"


def _nothing(build, policy, schedule, **kwargs):
    return rk.search.Fit(
        "seq",
        policy=policy.spec,
        schedule="none",
        batch=kwargs["batch"],
        seq=0,
        unit=kwargs["granularity"],
        peak_bytes=10 * 2**30,
        next_peak_bytes=10 * 2**30,
        limit_bytes=2**30,
        recompute_overhead=None,
        compiles=1,
        seconds=0.1,
        note=Note(
            "seq_none_fits",
            {
                "policy": policy.spec,
                "batch": kwargs["batch"],
                "seq": kwargs["granularity"],
                "peak_bytes": 10 * 2**30,
                "limit_bytes": 2**30,
                "target": "h100-80gb",
            },
        ),
    )


def test_nothing_fits_is_one_line_and_exit_1(monkeypatch, capsys):
    monkeypatch.setattr("remat_kit.search._fit.max_seq", _nothing)
    argv = [*TINY, "--over", "seq", "--seq-step", "512", "--policies", "none,full"]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert err == (
        "remat-kit: nothing fits: even at seq 512 (batch 1) the smallest peak is 10.00 GiB "
        "(none), over the 1.00 GiB limit on h100-80gb; try a shorter --seq-step, a smaller "
        "--batch, or remat-kit advise for a GPU\n"
    )
    assert "none fits" in out and "longest:" not in out


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ([], {"batch": 1, "granularity": 1024, "cap": 2**20}),
        (["--batch", "3", "--seq-step", "256"], {"batch": 3, "granularity": 256, "cap": 2**20}),
        (["--max-seq", "8192"], {"batch": 1, "granularity": 1024, "cap": 8192}),
        (["--accum", "2"], {"batch": 2, "granularity": 1024, "cap": 2**20}),
        (["--headroom", "0.1"], {"headroom": 0.1}),
    ],
)
def test_the_flags_reach_the_search(monkeypatch, extra, expected):
    seen = {}

    def record(build, policy, schedule, **kwargs):
        seen.update(kwargs, policy=policy.spec, first=build.at(seq=kwargs["granularity"]))
        raise SystemExit(0)  # the search itself is not what is checked here

    monkeypatch.setattr("remat_kit.search._fit.max_seq", record)
    with pytest.raises(SystemExit):
        main([*TINY, "--over", "seq", "--policy", "full", *extra])
    assert {k: seen[k] for k in expected} == expected
    assert seen["policy"] == "full" and seen["first"].seq == seen["granularity"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--over", "seq", "--objective", "throughput"],
            "--objective throughput with --over seq: the throughput search picks the batch at "
            "one --seq; drop one of them",
        ),
        (
            ["--over", "seq", "--cluster", "tcp://127.0.0.1:9"],
            "--cluster tcp://127.0.0.1:9 with --over seq: the sequence search compiles one "
            "probe after another, each placed by the last; drop --cluster",
        ),
        (
            ["--over", "seq", "--seq", "4096"],
            "--seq 4096: fit --over seq searches the sequence; drop --seq (--seq-step sets the "
            "granularity, --max-seq the longest)",
        ),
        (
            ["--seq-step", "512"],
            "--seq-step 512 needs --over seq (it is the granularity of the sequence search)",
        ),
        (
            ["--over", "batch", "--seq-step", "512"],
            "--seq-step 512 needs --over seq (it is the granularity of the sequence search)",
        ),
        (["--over", "seq", "--seq-step", "0"], "argument --seq-step: 0 must be positive"),
        (["--over", "sequence"], "argument --over: invalid choice: 'sequence'"),
        (
            ["--over", "seq", "--seq-step", "2048", "--max-seq", "1024"],
            "--seq-step 2048 is longer than --max-seq 1024: nothing to search; give a "
            "--seq-step of at most 1024",
        ),
        (
            ["--over", "seq", "--global-batch", "8"],
            "--global-batch 8 with --over seq: the sequence search keeps --batch fixed; give "
            "--batch N",
        ),
        (  # the plan's own check of the sequence, at the shortest searched
            ["--over", "seq", "--gpus", "2", "--shard", "tp:2", "--seq-step", "63"],
            "--seq-step 63: seq=63 does not split over tp:2",
        ),
        (
            ["--over", "seq", "--gpus", "2", "--shard", "dp:2", "--batch", "3"],
            "--batch 3 does not split into --accum 1 x 2 data-parallel GPUs; use a multiple of 2",
        ),
        (
            ["--batch", "2"],
            "--batch 2: fit searches the batch (from where the trace puts the largest); drop "
            "--batch, or measure one batch with report (--over seq searches the sequence at a "
            "given batch)",
        ),
        (
            ["--over", "seq", "--model", "tiny-gpt2", "--seq-step", "256"],
            "--seq-step 256: seq=256 exceeds tiny-gpt2's learned positions (128); use seq <= "
            "128 or a larger max_seq_len",
        ),
        (
            ["--over", "seq", "--policies", "full,ful"],
            "--policies 'ful': unknown policy 'ful'. Did you mean full?",
        ),
    ],
)
def test_bad_flags_are_one_line_before_any_compile(extra, message, capsys, no_compile):
    try:
        # a --model among the extras is the model (the flag is given once)
        base = (
            TINY
            if "--model" not in extra
            else [a for a in TINY if a not in ("--model", "tiny-llama")]
        )
        code = main([*base, *extra])
    except SystemExit as done:  # argparse's own refusals exit
        code = done.code
    assert code == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"remat-kit: {message}") and err.count("\n") == 1, err
    assert "Traceback" not in out + err


def test_help_names_the_flags(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--over {batch,seq}" in text and "--seq-step N" in text
    assert "1048576 tokens" in text
