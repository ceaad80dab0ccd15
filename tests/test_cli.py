"""remat-kit on the command line: tables, JSON/CSV rows, one-line errors."""

import csv
import json

import pytest

from remat_kit.cli import main

SMALL = [
    "--model",
    "tiny-llama",
    "--target",
    "h100",
    "--batch",
    "2",
    "--seq",
    "256",
    "--optimizer",
    "sgd",
    "--width",
    "256",
    "--heads",
    "4",
    "--attention",
    "xla",
]


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli")
    code = main(
        [
            "compare",
            *SMALL,
            "--policies",
            "none,full,offload_dots_no_batch",
            "--json",
            str(out / "rows.json"),
            "--csv",
            str(out / "rows.csv"),
        ]
    )
    return code, out


def test_compare_writes_rows(compared):
    code, out = compared
    assert code == 0
    rows = json.loads((out / "rows.json").read_text())
    assert [r["policy"] for r in rows] == ["none", "full", "offload_dots_no_batch"]
    for row in rows:
        for key in (
            "policy",
            "schedule",
            "peak_bytes",
            "temp_bytes",
            "host_bytes",
            "flops",
            "recompute_overhead",
            "fits",
        ):
            assert key in row
    none, full, off = rows
    assert full["peak_bytes"] < none["peak_bytes"] and full["recompute_overhead"] > 0.1
    assert off["host_bytes"] > 0 == none["host_bytes"]
    assert none["saved_vs_none"] == 0 and full["saved_vs_none"] > 0
    with open(out / "rows.csv") as f:
        assert [r["policy"] for r in csv.DictReader(f)] == [r["policy"] for r in rows]


def test_report_prints_breakdown_and_residuals(tmp_path, capsys):
    assert main(["report", *SMALL, "--policy", "minimal", "--json", str(tmp_path / "r.json")]) == 0
    text = capsys.readouterr().out
    for needle in (
        "weights",
        "gradients",
        "optimizer state",
        "activations",
        "query_proj",
        "saved",
        "recomputed",
        "fits",
    ):
        assert needle in text
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["residuals"]["tags"]["query_proj"] == "saved"
    assert data["residuals"]["tags"]["attn_probs"] == "recomputed"
    assert data["peak_bytes"] == (
        data["argument_bytes"] + data["output_bytes"] + data["temp_bytes"] - data["alias_bytes"]
    )


@pytest.mark.parametrize("what", ["targets", "policies", "models"])
def test_listings(what, capsys):
    assert main([what]) == 0
    text = capsys.readouterr().out
    expected = {"targets": "h100-80gb", "policies": "megatron", "models": "llama3-70b"}[what]
    assert expected in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["report", "--model", "llama3-7b"], "unknown model 'llama3-7b'"),
        (["report", "--model", "tiny-llama", "--target", "h1000"], "unknown target 'h1000'"),
        (["report", "--model", "tiny-llama", "--policy", "minmal"], "Did you mean minimal"),
        (["report", "--model", "tiny-llama", "--batch", "0"], "must be positive"),
        (["report", "--model", "tiny-llama", "--seq", "-3"], "must be positive"),
        (["report", "--model", "tiny-llama", "--lora", "4096"], "lora_rank=4096 exceeds"),
        (["compare", "--model", "tiny-llama", "--policies", ","], "--policies is empty"),
        (["report", "--model", "tiny-gpt2", "--seq", "4096"], "exceeds tiny-gpt2's"),
        (["report", "--model", "tiny-llama", "--optimizer", "adamm"], "unknown optimizer"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, message, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse-level errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert err.startswith("remat-kit: ") and err.count("\n") == 1 and "Traceback" not in err


def test_report_with_schedule(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert (
        main(
            [
                "report",
                *SMALL,
                "--policy",
                "none",
                "--schedule",
                "every:2",
                "--no-residuals",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    assert "schedule=every:2" in capsys.readouterr().out
    assert json.loads(out.read_text())["schedule"] == "every:2"
    code = main(["report", *SMALL, "--schedule", "evry:2"])
    assert code == 2 and "Did you mean every" in capsys.readouterr().err


def test_inspect_is_wired(tmp_path, capsys):
    out = tmp_path / "peak.json"
    assert main(["inspect", *SMALL, "--policy", "full", "--top", "3", "--json", str(out)]) == 0
    assert "top 3 buffers" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["peak_bytes"] == sum(data["by_category"].values())


def test_sharded_report_is_per_device(tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = [
        "report",
        *SMALL,
        "--batch",
        "8",
        "--policy",
        "full",
        "--gpus",
        "8",
        "--shard",
        "fsdp:8",
        "--no-residuals",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert data["devices"] == 8 and data["meta"]["mesh"] == "fsdp:8"
    code = main(["report", *SMALL, "--gpus", "8", "--shard", "fsdp:3"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("remat-kit: ") and err.count("\n") == 1
