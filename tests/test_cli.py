"""remat-kit on the command line: tables, JSON/CSV rows, one-line errors."""

import csv
import json
import re

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


def _small_request():
    """SMALL as a preset's source and train config, for the figures the tests compute apart."""
    import remat_kit as rk
    from remat_kit_models.spec import PresetSpec

    spec = PresetSpec("tiny-llama", attention="xla", overrides=(("width", 256), ("heads", 4)))
    return rk.sources.resolve(spec), rk.TrainConfig(2, 256, optimizer="sgd")


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


@pytest.mark.slow
def test_compare_writes_rows(compared):
    from remat_kit import sources

    code, out = compared
    assert code == 0
    rows = json.loads((out / "rows.json").read_text())
    assert [r["policy"] for r in rows] == ["none", "full", "offload_dots_no_batch"]
    none, full, off = rows
    for row in rows:
        assert row["schedule"] == "none" and row["attention"] == "xla"
        assert row["peak_bytes"] == (
            row["argument_bytes"] + row["output_bytes"] + row["temp_bytes"] - row["alias_bytes"]
        )
        # Savings against the "none" row, and recompute against its FLOPs (traced apart).
        assert row["saved_vs_none"] == pytest.approx(1 - row["peak_bytes"] / none["peak_bytes"])
        assert row["recompute_overhead"] == pytest.approx(
            row["flops"] / none["flops"] - 1, rel=1e-6, abs=1e-9
        )
    assert none["saved_vs_none"] == 0 and none["recompute_overhead"] == pytest.approx(0, abs=1e-9)
    assert full["peak_bytes"] < none["peak_bytes"]
    # What XLA put in host memory is what the trace says the policy offloads, to the byte.
    src, config = _small_request()
    kept = sources.residuals(src, "offload_dots_no_batch", "h100", config)
    offloaded = kept.bytes_by("offloaded")
    assert off["host_bytes"] == offloaded > 0 == none["host_bytes"] == full["host_bytes"]
    with open(out / "rows.csv") as f:
        got = list(csv.DictReader(f))
    assert [r["policy"] for r in got] == [r["policy"] for r in rows]
    assert [int(r["peak_bytes"]) for r in got] == [r["peak_bytes"] for r in rows]


@pytest.mark.slow
def test_compare_reads_the_flops_of_none_off_its_row(compared, tmp_path, monkeypatch):
    from remat_kit import sources

    _, out = compared
    none, full, _ = json.loads((out / "rows.json").read_text())
    # The row's FLOPs are the baseline a separate trace of "none" counts.
    src, config = _small_request()
    traced = sources.step_flops(src, "none", "h100", config)
    assert none["flops"] == pytest.approx(traced, rel=1e-9)
    assert full["recompute_overhead"] == pytest.approx(full["flops"] / traced - 1, rel=1e-9)
    assert full["recompute_overhead"] > 0.1

    def separate_trace(*args, **kwargs):
        raise AssertionError("compare traced the FLOPs of none beside its none row")

    monkeypatch.setattr(sources, "step_flops", separate_trace)
    args = ["compare", *SMALL, "--policies", "full,none", "--jobs", "1"]
    assert main([*args, "--json", str(tmp_path / "rows.json")]) == 0
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [r["recompute_overhead"] for r in rows] == pytest.approx(
        [full["recompute_overhead"], 0.0], abs=1e-12
    )
    # Without a "none" row the baseline is traced apart.
    with pytest.raises(AssertionError, match="beside its none row"):
        main(["compare", *SMALL, "--policies", "full", "--jobs", "1"])


@pytest.mark.slow
def test_report_prints_breakdown_and_residuals(tmp_path, capsys):
    assert main(["report", *SMALL, "--policy", "minimal", "--json", str(tmp_path / "r.json")]) == 0
    text = capsys.readouterr().out
    for needle in ("weights", "gradients", "optimizer state", "activations", "fits"):
        assert needle in text
    data = json.loads((tmp_path / "r.json").read_text())
    tags = data["residuals"]["tags"]
    # minimal: the projections kept, attention's internals and the residual sums recomputed.
    for tag in ("query_proj", "key_proj", "value_proj", "out_proj", "mlpwi_0", "mlpwi_1"):
        assert tags[tag] == "saved", tag
    for tag in ("attn_scores", "attn_probs", "context", "attn_out"):
        assert tags[tag] == "recomputed", tag
    assert tags["mlpwo"] in ("saved", "not needed")  # block_out = attn_out + mlpwo is kept
    assert data["peak_bytes"] == (
        data["argument_bytes"] + data["output_bytes"] + data["temp_bytes"] - data["alias_bytes"]
    )
    parts = data["breakdown"]
    fixed = parts["weights"] + parts["gradients"] + parts["optimizer"] + parts["batch"]
    assert parts["activations"] == data["peak_bytes"] - fixed - parts["grad_accumulator"]
    assert parts["optimizer"] == 0 and parts["weights"] == parts["gradients"]  # sgd


@pytest.mark.parametrize("what", ["targets", "policies", "models"])
def test_listings(what, capsys):
    import remat_kit as rk
    import remat_kit_models as models

    assert main([what]) == 0
    text = capsys.readouterr().out
    names = {
        "targets": rk.target_names,
        "policies": rk.policy_names,
        "models": models.preset_names,
    }[what]()
    missing = [n for n in names if n not in text]
    assert missing == []


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_inspect_is_wired(tmp_path, capsys):
    out = tmp_path / "peak.json"
    assert main(["inspect", *SMALL, "--policy", "full", "--top", "3", "--json", str(out)]) == 0
    assert "top 3 buffers" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["peak_bytes"] == sum(data["by_category"].values())


@pytest.mark.slow
def _without(argv, flag):
    """``argv`` without ``flag`` and its value (a flag is given once)."""
    at = argv.index(flag)
    return [*argv[:at], *argv[at + 2 :]]


# compiles for eight H100s
@pytest.mark.slow
def test_sharded_report_is_per_device(tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = [
        "report",
        *_without(SMALL, "--batch"),
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


# --- the error boundary: one line for remat_kit's errors, a traceback for anything else ---------

TINY = ["--model", "tiny-llama", "--seq", "64", "--batch", "2"]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["report", *TINY, "--vocab", "1"], "--vocab 1: vocab_size=1 leaves nothing"),
        (["report", *TINY, "--target", "h1000"], "--target h1000: unknown target 'h1000'"),
        (["report", "--model", "tiny-gpt2", "--seq", "4096"], "--seq 4096: seq=4096 exceeds"),
        (["report", *TINY, "--gpus", "8", "--hosts", "3"], "--hosts 3: devices=8 is not"),
        (
            ["report", *TINY[:-2], "--batch", "4", "--accum", "3"],
            "--accum 3: batch=4 does not split",
        ),
        (["plan", *TINY, "--budget", "lots"], "--budget lots: cannot read budget 'lots'"),
        (["report", "--model", "nowhere.py:f"], "--model nowhere.py:f: factory 'nowhere.py:f'"),
    ],
)
def test_the_cli_names_the_flag_of_a_bad_parameter(argv, line, capsys):
    """The library names the parameter (BadValue.param); the CLI puts the flag and value first."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"remat-kit: {line}"), err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_debug_raises_instead_of_one_line(capsys):
    from remat_kit.errors import UnknownName

    argv = ["report", *TINY, "--target", "h1000"]
    with pytest.raises(UnknownName) as info:
        main(["--debug", *argv])
    assert info.value.param == "target"
    with pytest.raises(UnknownName):
        main([*argv, "--debug"])  # after the command as well
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_debug_shows_the_full_traceback():
    import subprocess
    import sys

    argv = ["--debug", "report", *TINY, "--target", "h1000"]
    done = subprocess.run(
        [sys.executable, "-m", "remat_kit.cli", *argv], capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    assert "Traceback (most recent call last)" in done.stderr
    assert "remat_kit.errors.UnknownName: unknown target 'h1000'" in done.stderr


@pytest.mark.parametrize(
    "bug", [KeyError("oops"), ValueError("a plain ValueError"), TypeError("a plain TypeError")]
)
def test_a_bug_propagates_out_of_main(bug, monkeypatch, capsys):
    """Only remat_kit's own errors (and jax/XLA refusing a program) are user errors."""
    from remat_kit.cli import _listings as listings

    def broken(args):
        raise bug

    monkeypatch.setattr(listings, "run", broken)
    with pytest.raises(type(bug), match=str(bug.args[0])):
        main(["targets"])
    assert capsys.readouterr().err == ""


def test_help_lists_every_command_without_importing_jax():
    import subprocess
    import sys

    from remat_kit.cli import COMMANDS

    code = (
        "import sys\n"
        "from remat_kit.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "print('jax' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    *text, last = done.stdout.strip().splitlines()
    assert last == "False"
    listed = " ".join(" ".join(text).split())
    for c in COMMANDS:
        assert f"{c.name} {c.help}" in listed, c.name
    assert "--debug" in listed


@pytest.mark.parametrize(
    "name",
    [
        "report",
        "compare",
        "fit",
        "plan",
        "advise",
        "inspect",
        "validate",
        "targets",
        "policies",
        "models",
    ],
)
def test_each_command_builds_its_own_help(name, capsys):
    from remat_kit.cli import COMMANDS

    assert name in {c.name for c in COMMANDS}
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: remat-kit {name}")
    assert "--debug" in out
    if name not in ("targets", "policies", "models"):
        assert "--model" in out and "--target" in out


def test_version_prints_the_installed_versions_and_exits_0(capsys):
    from importlib import metadata

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out == (
        f"remat-kit {metadata.version('remat-kit')} (jax {metadata.version('jax')}, "
        f"jaxlib {metadata.version('jaxlib')})"
    )


_CARD = {
    "name": "h100-96gb",
    "sms": 132,
    "fp32_per_sm": 128,
    "smem_per_sm": 233472,
    "smem_optin": 232448,
    "threads_per_sm": 2048,
    "hbm_bandwidth": 3.9e12,
    "l2_bytes": 52428800,
    "clock_ghz": 1.98,
    "memory_bytes": 96 * 2**30,
    "peak_bf16_flops": 989e12,
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["facts", "config"])
def test_a_gpu_from_a_file_is_a_target_on_the_command_line(kind, tmp_path):
    import remat_kit as rk

    if kind == "facts":
        card = tmp_path / "card.json"
        card.write_text(json.dumps(_CARD))
        name, memory = "h100-96gb", 96 * 2**30
    else:
        card = tmp_path / "my-l4.txt"
        card.write_text(rk.target("l4").target_config)
        name, memory = "my-l4", rk.target("l4").memory_bytes
    out = tmp_path / "r.json"
    argv = ["report", "--model", "tiny-llama", "--batch", "2", "--seq", "64"]
    assert main([*argv, "--target", str(card), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["target"] == name
    assert report["target_memory_bytes"] == memory
    assert report["usable_bytes"] == int(memory * 0.75)  # JAX's default allocator fraction
    # the same program as the library compiles for that card
    lib = rk.targets.custom_target("h100-96gb", {k: v for k, v in _CARD.items() if k != "name"})
    if kind == "facts":
        assert report["step_time"]["peak_flops"] == lib.peak_bf16_flops


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "says"),
    [
        # weights, gradients and AdamW state (1.24 B x 16 bytes, 18.4 GiB) exceed an L4's 16.9
        # usable (the compiled full step needs 17.8): the hints say where the parts alone fit,
        # and one compile finds the GPU whose usable 17.99 GiB holds the step (issue 45)
        (
            ["--model", "llama3.2-1b", "--batch", "1", "--seq", "512", "--policies", "full"],
            [
                "SGD (--optimizer sgd): no optimizer state, so these parts are",
                "next step: one rtx4090: compiled with full, the peak is",
                "(1 extra compile); run it with --target rtx4090",
            ],
        ),
        # the fixed part fits; the activations of 4096 x 2048 tokens do not: half the batch per
        # pass, the same global batch
        (
            [
                "--model",
                "tiny-llama",
                "--batch",
                "4096",
                "--seq",
                "2048",
                "--policies",
                "none,full",
            ],
            [
                "though weights, gradients and optimizer state fit",
                "next step: gradient accumulation over 2 (micro-batch 2048, the same global "
                "batch): compiled with full",
                "run it with --accum 2",
            ],
        ),
    ],
    ids=["fixed-part", "activations"],
)
def test_compare_ends_with_the_next_step_that_compiles_under_the_limit(argv, says, capsys):
    assert main(["compare", "--target", "l4", *argv]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "nothing fits:" in out and all(s in out for s in says), out


# --- --mem-fraction and the allocator, end to end (issue 27) ------------------------------------

#: What CUDA reported on a lent H100 80GB HBM3 (81080 MiB), written here, not read from the
#: catalogue.
H100_BYTES = 81080 * 2**20
MIB = 2**20


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("0", "must be in (0, 1]"),
        ("-0.1", "must be in (0, 1]"),
        ("1.5", "must be in (0, 1]"),
        ("abc", "'abc' is not a number"),
        # In (0, 1] but leaving the CUDA context less than 0.5 GiB of the card.
        ("1", "use at most 0.99"),
        ("0.995", "use at most 0.99"),
    ],
)
def test_a_refused_mem_fraction_is_one_line_naming_the_flag(value, says, capsys):
    try:
        code = main(["report", *TINY, "--target", "h100", "--mem-fraction", value])
    except SystemExit as exc:  # argparse-level refusals
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("remat-kit: ") and err.count("\n") == 1 and "Traceback" not in err
    assert "--mem-fraction" in err and says in err


class _FakeCompile:
    """xla.compile_memory without XLA: a program of ``peak`` bytes (all arguments); records the
    device_memory_size of every GPU topology the step's mesh is made from."""

    def __init__(self, monkeypatch, tmp_path, peak):
        from remat_kit.targets import _core as core
        from remat_kit.xla import CompiledMemory

        self.sizes = []
        real = core.gpu_topology

        def topology(config, *args, **kwargs):
            size = re.search(r"device_memory_size: (\d+)", config)
            self.sizes.append(int(size.group(1)))
            return real(config, *args, **kwargs)

        def compile_memory(lowered, **kwargs):
            return CompiledMemory(peak, 0, 0, 0, 0, 0, 0, None, None, 0, False, (), 0.0)

        monkeypatch.setenv("REMAT_KIT_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.setattr(core, "gpu_topology", topology)
        monkeypatch.setattr("remat_kit.xla.compile_memory", compile_memory)


def _report_json(tmp_path, capsys, *flags):
    out = tmp_path / "r.json"
    argv = ["report", *TINY, "--target", "h100", "--no-residuals", *flags, "--json", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "env", "fraction", "usable", "xla_size"),
    [
        # JAX's default: floor(0.75 x total); the compile gets the size whose 80% is that.
        ((), {}, 0.75, H100_BYTES * 3 // 4, None),
        (("--mem-fraction", "0.99"), {}, 0.99, H100_BYTES * 99 // 100, None),
        # 0.07 x total is ...945.6 bytes: the allocator floors it.
        (("--mem-fraction", "0.07"), {}, 0.07, H100_BYTES * 7 // 100, None),
        # The flag wins over the environment jax would read.
        (("--mem-fraction", "0.5"), {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}, 0.5,
         H100_BYTES // 2, None),
        # No pool: the card less the 512 MiB kept for the CUDA context; XLA gets the card.
        ((), {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, None, H100_BYTES - 512 * MIB,
         H100_BYTES),
    ],
)  # fmt: skip
def test_each_runtime_mode_reaches_the_json_and_the_compile(
    flags, env, fraction, usable, xla_size, monkeypatch, tmp_path, capsys
):
    for var in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_ALLOCATOR", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    fake = _FakeCompile(monkeypatch, tmp_path, peak=1024)
    d = _report_json(tmp_path, capsys, *flags)
    assert (d["mem_fraction"], d["usable_bytes"], d["target_memory_bytes"]) == (
        fraction,
        usable,
        H100_BYTES,
    )
    assert d["fits"] is True and d["fits_with_fraction"] is None
    assert fake.sizes, "the step was never laid out on the GPU's topology"
    if xla_size is not None:
        assert set(fake.sizes) == {xla_size}
    else:
        # Deviceless, XLA's remat pass takes floor(0.8 x size): it must be the process's limit.
        assert {s * 80 // 100 for s in fake.sizes} == {usable}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("over", "fits", "cell"), [(0, True, None), (1, False, 0.91)], ids=["at", "one-byte-over"]
)
def test_fits_is_peak_at_most_the_limit_to_the_byte(
    over, fits, cell, monkeypatch, tmp_path, capsys
):
    usable = H100_BYTES * 90 // 100  # floor(0.9 x total), JAX's bytes_limit at 0.9
    _FakeCompile(monkeypatch, tmp_path, peak=usable + over)
    d = _report_json(tmp_path, capsys, "--mem-fraction", "0.9")
    assert (d["peak_bytes"], d["usable_bytes"]) == (usable + over, usable)
    assert d["fits"] is fits
    # Over the limit, the smallest fraction that holds it: 0.91 (0.90 is one byte short).
    assert d["fits_with_fraction"] == cell


@pytest.mark.parametrize(
    ("xla", "hint"),
    [
        ("INTERNAL: Couldn't find output tile sizes that satisfy hlo: %dot = bf16[254,64]", True),
        ("INTERNAL: launch needs more blocks than the GPU allows", False),
    ],
)
def test_a_deviceless_tiling_refusal_says_which_seq_avoids_it(xla, hint, monkeypatch, capsys):
    import jax

    def refuse(self, *args, **kwargs):
        raise jax.errors.JaxRuntimeError(xla + "\n  HLO follows")

    monkeypatch.setattr(jax.stages.Lowered, "compile", refuse)
    argv = ["report", "--model", "tiny-llama", "--target", "h100", "--batch", "2", "--seq", "127"]
    assert main([*argv, "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and xla in err
    assert ("a --seq that is a multiple of 8 avoids it" in err) is hint


def test_plan_names_a_shorter_catalogue_policy_that_compiles_to_its_program():
    # The front marks catalogue points that are the plan's very program (same_as): the
    # shortest of them is what "use it" names, with the plan's own spec beside it.
    from types import SimpleNamespace as NS

    from remat_kit.cli._plan import _alike, _use_it
    from remat_kit.search import FrontPoint

    spec = "names:save=query_proj+key_proj+value_proj+out_proj+mlpwi_0+mlpwi_1+mlpwo"
    p = NS(policy=NS(spec=spec), schedule=NS(name="none", spec="none"), budget_bytes=12)

    def point(label, kind, same_as=None, budget=None, policy=None):
        return FrontPoint(label, kind, 1, 0.0, 0.0, same_as=same_as, budget_bytes=budget,
                          policy=policy or label)  # fmt: skip

    points = [
        point("plan (budget 0.00 GiB)", "plan", budget=12, policy=spec),
        point("minimal", "catalogue", same_as="plan (budget 0.00 GiB)"),
        point("dots", "catalogue", same_as="plan (budget 0.00 GiB)"),
        point("full", "catalogue"),
        point("plan (budget 0.00 GiB)", "plan", budget=11, policy="full"),  # a swept one
    ]
    assert _alike(p, points) == "dots"
    line = _use_it(p, "config", "dots")
    assert line.startswith(f"use it: --policy 'dots' (the same program as {spec}), or in code")
    assert _alike(p, points[:1] + points[3:]) is None  # nothing compiles to it
    assert _use_it(p, "arguments").startswith(f"use it: --policy '{spec}', or in code")


@pytest.mark.parametrize("command", ["report", "compare", "fit", "plan", "advise", "inspect"])
def test_a_commands_help_states_defaults_and_ends_with_examples(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "tokens per sequence (default: 2048)" in " ".join(out.split())
    examples = out[out.index("examples:\n") :].splitlines()[1:]
    assert len(examples) == 2 and all(e.startswith(f"  remat-kit {command} ") for e in examples)
    assert "(default: None)" not in out and "(default: False)" not in out


def test_every_help_example_parses():
    # An example a flag was renamed under would be refused: each is parsed as written.
    import shlex

    from remat_kit.cli import COMMANDS, _parser

    examples = [(c.name, e) for c in COMMANDS for e in c.examples]
    assert len(examples) >= 13
    for name, example in examples:
        parser, _ = _parser(name)
        args = parser.parse_args(shlex.split(example)[1:])
        assert args.command == name, example


def test_a_titles_model_names_the_presets_overrides(capsys):
    # --layers 6 changes every figure: the title names it, as the JSON's meta["model"] does.
    from remat_kit.cli._flags import declare
    from remat_kit.cli._model import resolve
    from remat_kit.cli._parser import Parser

    p = Parser(prog="remat-kit report")
    declare("report", p)
    args = p.parse_args(["--model", "tiny-llama", "--layers", "6", "--batch", "2", "--seq", "64"])
    args.given, args.command = frozenset({"--model", "--layers"}), "report"
    assert resolve(args).model == "tiny-llama (layers=6)"
    args = p.parse_args(["--model", "tiny-llama", "--batch", "2", "--seq", "64"])
    args.given, args.command = frozenset({"--model"}), "report"
    assert resolve(args).model == "tiny-llama"
