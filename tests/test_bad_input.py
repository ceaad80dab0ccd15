"""Bad input fails early and clearly: one ``remat-kit: ...`` line, a documented exit code, no
traceback, no file written or left behind, and no compile (XLA's compile entry point is patched
to fail the test if reached: every check here runs on names and shapes, in milliseconds).

The library half: the same mistakes made through the API raise a typed error whose message
names the bad value.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import time
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import remat_kit as rk
import remat_kit_models as models
from remat_kit.cli import main
from remat_kit.errors import BadOutput, BadValue, DoesNotFit, UnknownName
from remat_kit.notes import Note
from remat_kit.render import check_output, write_json
from remat_kit_models.configure import check_sizes, cudnn_problem, resolve_attention

TINY = ["--model", "tiny-llama", "--seq", "64", "--batch", "2"]
DATA = Path(__file__).resolve().parent / "data"
TINY_FIT = TINY[:-2]  # fit searches the batch: --batch is refused there


def _r(*argv):
    return ["report", *TINY, *argv]


def _r_with(*argv):
    """``report`` on tiny-llama with ``argv``'s --seq and --batch in place of TINY's (a flag
    given twice is refused)."""
    return ["report", "--model", "tiny-llama", *argv]


# (argv, what the one line must say, exit code). Placeholders: {dir} an existing directory,
# {link} a symlink to a file, {fifo} a FIFO, {file} a regular file, {tmp} the test's directory,
# {data} the tests' data directory (factories).
CLI_CASES = [
    # output paths: refused before the compile, never replaced
    (_r("--json", "{dir}"), "is a directory, not a regular file", 2),
    (_r("--json", "/dev/full"), "--json '/dev/full' is a device", 2),
    (_r("--json", "{link}"), "is a symbolic link", 2),
    (_r("--json", "{fifo}"), "is a FIFO", 2),
    (_r("--json", "{tmp}/missing/r.json"), "does not exist", 2),
    (_r("--json", "/proc/c.json"), "cannot create a file in '/proc'", 2),
    (_r("--json", "{file}/r.json"), "Not a directory", 2),
    (_r("--json", ""), "is not a file name", 2),
    (["compare", *TINY, "--csv", "{dir}"], "--csv", 2),
    (["plan", *TINY, "--plot", "{tmp}/missing/front.png"], "--plot", 2),
    (["inspect", *TINY, "--plot", "{dir}"], "--plot", 2),
    (["fit", *TINY_FIT, "--json", "/dev/full"], "is a device", 2),
    (_r("--json", "{tmp}/r.txt"), "r.txt: writes JSON; give a path ending in .json", 2),
    (
        ["plan", *TINY, "--plot", "{tmp}/out.txt"],
        "writes a PNG image; give a path ending in .png",
        2,
    ),
    (["compare", *TINY, "--csv", "{tmp}/r.json"], "writes CSV; give a path ending in .csv", 2),
    (["validate", *TINY, "--json", "{tmp}/v.txt"], "writes JSON; give a path ending in .json", 2),
    (
        ["compare", *TINY, "--json", "{tmp}/r.json", "--csv", "{tmp}/r.json"],
        "--csv",  # the same path twice: one of them has the other's suffix
        2,
    ),
    # a GPU from a file
    (_r("--target", "{tmp}/missing.json"), "missing.json: no such file", 2),
    (_r("--target", "{file}.json"), "no such file", 2),
    (_r("--target", "{fifo}"), "no such file", 2),
    (_r("--target", "{list}"), "the JSON must be an object of the card's facts", 2),
    (_r("--target", "{thin}"), "missing fp32_per_sm", 2),
    (_r("--target", "{broken}"), "not readable JSON", 2),
    # flags a command would not act on
    (_r("--gpus", "8"), "--gpus 8 without --shard: the step would be compiled for one GPU", 2),
    (
        ["advise", *TINY, "--target", "l4"],
        "--target l4: advise compares GPUs; name them with --targets",
        2,
    ),
    (["fit", *TINY], "--batch 2: fit searches the batch", 2),
    (
        ["report", "--model", "llama3-8b", "--seq", "2048", "--max-seq", "1024"],
        "--max-seq 1024: max_seq_len=1024 is below seq=2048",
        2,
    ),
    # policies
    (_r("--policy", "names:save=query_prj"), "did you mean 'query_proj'", 2),
    (_r("--policy", "names:save="), "needs at least one tag", 2),
    (_r("--policy", "minmal"), "Did you mean minimal", 2),
    (_r("--policy", "offload:offload=context,save=context"), "both offloaded and saved", 2),
    (_r("--policy", "offload:offload=context,dst=gpu"), "unknown offload destination", 2),
    (_r("--policy", "names:save query_proj"), "expected key=value", 2),
    (_r("--policy", "either:a=qkv_proj"), "needs parameter(s) b", 2),
    (["compare", *TINY, "--policies", "none,,full"], "--policies 'none,,full' has an empty", 2),
    (["compare", *TINY, "--policies", ","], "--policies is empty", 2),
    (
        ["compare", *TINY, "--policies", "full,none,full"],
        "--policies 'full,none,full' names full twice: give each once",
        2,
    ),
    (["fit", *TINY_FIT, "--policies", "full,"], "has an empty item", 2),
    (["plan", *TINY, "--policies", "full,dotz"], "unknown policy 'dotz'", 2),
    (["inspect", *TINY, "--diff", "full", "minmal"], "--diff 'minmal'", 2),
    # schedules, checked against the model's 4 layers
    (_r("--schedule", "every:64"), "the model has 4", 2),
    (_r("--schedule", "every:0"), "--schedule 'every:0'", 2),
    (_r("--schedule", "evry:2"), "Did you mean every", 2),
    (_r("--schedule", "layers:0-9=full"), "the model has 4", 2),
    (_r("--schedule", "sqrt:3"), "takes no argument", 2),
    (["fit", *TINY_FIT, "--schedule", "nested:0"], "--schedule 'nested:0'", 2),
    (["compare", *TINY, "--schedules", "none;every:x"], "--schedules 'every:x'", 2),
    # budgets
    (["plan", *TINY, "--budget", "-5GiB"], "--budget '-5GiB' must be positive", 2),
    (["plan", *TINY, "--budget=-5GiB"], "must be positive", 2),
    (["plan", *TINY, "--budget", "lots"], "cannot read budget", 2),
    (["plan", *TINY, "--budget", "200GiB"], "larger than the device", 2),
    (["plan", *TINY, "--budget", "0"], "must be positive", 2),
    (["plan", *TINY, "--budget", "1.5"], "bare number above 1", 2),
    (["plan", *TINY, "--budget", "1KiB"], "absurdly small", 1),  # nothing fits: exit 1
    (["plan", *TINY, "--headroom", "1.5"], "must be in [0, 1)", 2),
    # sizes, model overrides, attention
    (["report", "--model", "gpt2-small", "--seq", "512", "--batch", "1000000000"], "32-bit", 2),
    (_r_with("--seq", "128", "--batch", "16000000", "--vocab", "100000"), "logits alone", 2),
    (_r("--width", "4000000"), "of weights per device", 2),
    (_r("--batch", "0"), "must be positive", 2),
    (_r("--seq", "-3"), "must be positive", 2),
    (_r("--vocab", "1"), "--vocab 1: vocab_size=1", 2),
    (_r("--width", "65"), "--width 65", 2),
    (_r("--kv-heads", "3"), "--kv-heads 3: n_kv_heads=3 must divide n_heads=4 (valid: 1, 2, 4)", 2),
    (
        _r("--heads", "3"),
        "--heads 3: d_model=64 is not divisible by n_heads=3 (n_heads that divide it: 1, 2, 4, 8, "
        "16, 32, 64)",
        2,
    ),
    # head sizes the rotary embedding cannot halve (jax: "array split does not result in an
    # equal division", with a traceback)
    (
        _r("--heads", "64", "--kv-heads", "1"),
        "--heads 64: head size 1 (d_model=64 / n_heads=64) is odd: the llama family's rotary "
        "position embedding rotates pairs of dimensions; use n_heads in 1, 2, 4, 8, 16, 32 "
        "(n_kv_heads=1), or a d_model that is a multiple of 128",
        2,
    ),
    (
        _r("--width", "4"),
        "--width 4: head size 1 (d_model=4 / n_heads=4) is odd: the llama family's rotary "
        "position embedding rotates pairs of dimensions; use n_heads in 2 (n_kv_heads=2), or a "
        "d_model that is a multiple of 8",
        2,
    ),
    (
        _r("--width", "66", "--heads", "2", "--kv-heads", "2"),
        "--heads 2: head size 33 (d_model=66 / n_heads=2) is odd: the llama family's rotary "
        "position embedding rotates pairs of dimensions; use a d_model that is a multiple of 4 "
        "(no n_heads divisible by n_kv_heads=2 gives an even one)",
        2,
    ),
    (
        ["report", "--model", "llama3-8b", "--seq", "64", "--width", "96"],
        "--width 96: head size 3 (d_model=96 / n_heads=32) is odd",
        2,
    ),
    (
        ["report", "--hf-config", "{data}/hf/llama3-8b.json", "--seq", "64", "--width", "96"],
        "--width 96: head size 3 (d_model=96 / n_heads=32) is odd",
        2,
    ),
    # a factory whose output is not logits [batch, seq, vocab] (jax: "indices and arr must have
    # the same number of dimensions", with a traceback)
    (
        ["report", "--model", "{data}/factories.py:pooled", "--seq", "64", "--batch", "2"],
        "factories.py:pooled returned logits of shape [2, 256] for tokens of shape [2, 64]: a "
        "model maps tokens [batch, seq] to logits [batch, seq, vocab], here [2, 64, vocab] (an "
        "array, or an output whose .logits has that shape)",
        2,
    ),
    (  # compare traces one sequence first (the tags its policies may name)
        ["compare", "--model", "{data}/factories.py:scored", "--seq", "64", "--batch", "2"],
        "factories.py:scored returned logits of shape [1, 64] for tokens of shape [1, 64]",
        2,
    ),
    (_r("--lora", "4096"), "lora_rank=4096 exceeds", 2),
    (_r("--optimizer", "adamm"), "unknown optimizer", 2),
    (_r_with("--seq", "64", "--batch", "4", "--accum", "3"), "accum=3", 2),
    (_r("--attention", "flash"), "unknown attention 'flash'", 2),
    (_r("--target", "cpu", "--attention", "cudnn"), "needs an NVIDIA target", 2),
    (["report", "--model", "llama3-8b", "--seq", "2047", "--attention", "cudnn"], "even seq", 2),
    (["report", "--model", "tiny-gpt2", "--seq", "4096"], "exceeds tiny-gpt2's", 2),
    (["report", "--model", "llama3-7b"], "unknown model 'llama3-7b'", 2),
    (_r("--target", "h1000"), "unknown target 'h1000'", 2),
    # meshes
    (_r("--gpus", "4", "--shard", "fsdp:8"), "holds 8 devices", 2),
    (_r("--gpus", "8", "--hosts", "3"), "not divisible by hosts=3", 2),
    (_r("--gpus", "16", "--node", "dgx-h1000"), "unknown node 'dgx-h1000'. Did you mean", 2),
    (_r("--gpus", "16", "--node", "dgx-b200"), "node dgx-b200 holds b200 GPUs, not h100", 2),
    (
        _r(
            "--target",
            "b200",
            "--gpus",
            "16",
            "--hosts",
            "2",
            "--node",
            "gb200-nvl72",
            "--shard",
            "fsdp:16",
        ),
        "8 GPUs per host, but a gb200-nvl72 node holds 4: spread 16 GPUs over 4 hosts",
        2,
    ),
    (_r_with("--seq", "64", "--gpus", "2", "--shard", "dp:2", "--batch", "3"), "multiple of 2", 2),
    (
        ["report", "--model", "llama3-8b", "--seq", "511", "--gpus", "7", "--shard", "tp:7"],
        "tp:7",
        2,
    ),
    (["inspect", *TINY, "--gpus", "2", "--shard", "fsdp:2"], "drop --shard", 2),
    (["inspect", *TINY, "--node", "dgx-h100"], "drop --node", 2),
    (["advise", *TINY, "--node", "dgx-h100"], "advise compares GPUs of every kind", 2),
    (["advise", *TINY, "--slices", "2"], "advise plans each TPU generation on one slice", 2),
    (["inspect", *TINY, "--top", "0"], "--top 0 must be positive", 2),
    (["advise", *TINY, "--targets", "h100,,l4"], "--targets 'h100,,l4' has an empty", 2),
    (["advise", *TINY, "--targets", "h1000"], "--targets 'h1000'", 2),
    # a single-valued flag given twice: argparse would keep the last without a word
    (_r("--target", "a100-80gb", "--target", "h100"), "--target given twice ('a100-80gb', then", 2),
    (["compare", *TINY, "--seq", "128"], "--seq given twice ('64', then --seq '128')", 2),
    (_r("--targ", "h100", "--target=l4"), "--target given twice ('h100', then --target 'l4')", 2),
    (["report", "--maxtext", "a=1", "--maxtext", "b=2"], "--maxtext given twice ('a=1', then", 2),
]


@pytest.fixture
def places(tmp_path):
    """The paths the placeholders name, made fresh in the test's directory."""
    return _places(tmp_path)


def _places(tmp_path):
    (tmp_path / "adir").mkdir()
    (tmp_path / "real.json").write_text("keep me\n")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "plain").write_text("a file, not a directory\n")
    (tmp_path / "list.json").write_text("[1, 2]\n")
    (tmp_path / "thin.json").write_text('{"sms": 132}\n')
    (tmp_path / "broken.json").write_text('{"sms": \n')
    return {
        "{list}": str(tmp_path / "list.json"),
        "{thin}": str(tmp_path / "thin.json"),
        "{broken}": str(tmp_path / "broken.json"),
        "{dir}": str(tmp_path / "adir"),
        "{link}": str(tmp_path / "link.json"),
        "{fifo}": str(tmp_path / "fifo.json"),
        "{file}": str(tmp_path / "plain"),
        "{tmp}": str(tmp_path),
        "{data}": str(DATA),
    }


def _snapshot(root):
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            link = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
            size = st.st_size if stat.S_ISREG(st.st_mode) else None
            out[path] = (stat.S_IFMT(st.st_mode), link, size)
    return out


#: Seconds each input of the table took (by its argv), when the table ran in this session.
TIMES: dict[tuple[str, ...], float] = {}


def _case_id(argv):
    return " ".join(a for a in argv if a not in TINY[1::2] and a not in TINY[::2])


@pytest.mark.parametrize(
    ("argv", "message", "code"), CLI_CASES, ids=[_case_id(c[0]) for c in CLI_CASES]
)
def test_bad_cli_input(argv, message, code, places, tmp_path, monkeypatch, capsys, no_compile):
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    full_before = os.stat("/dev/full")
    got = _timed(argv, places)
    out, err = capsys.readouterr()
    assert got == code, err
    assert err.startswith("remat-kit: ") and err.count("\n") == 1, err
    assert message in err
    assert "Traceback" not in err + out
    assert _snapshot(tmp_path) == before  # nothing written, replaced or left half-written
    assert (tmp_path / "real.json").read_text() == "keep me\n"
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    assert os.stat("/dev/full").st_ino == full_before.st_ino


def _timed(argv, places):
    """Runs one bad input, noting its seconds in TIMES; returns the exit code."""
    key = tuple(argv)
    for name, value in places.items():
        argv = [a.replace(name, value) for a in argv]
    start = time.perf_counter()
    try:
        got = main(argv)
    except SystemExit as exc:  # argparse's own errors
        got = exc.code
    TIMES[key] = time.perf_counter() - start
    return got


def test_the_table_is_large_and_fast(tmp_path, monkeypatch, capsys, no_compile):
    """At least 40 inputs; together they take seconds, not minutes (they never compile).

    Inputs the table did not run in this session (a ``-k`` selection, another order) run
    here, so the time is always checked, over the whole table."""
    assert len(CLI_CASES) >= 40
    assert {c[2] for c in CLI_CASES} == {1, 2}
    for i, (argv, _, _) in enumerate(CLI_CASES):
        if tuple(argv) not in TIMES:
            (tmp_path / str(i)).mkdir()
            monkeypatch.chdir(tmp_path / str(i))
            _timed(argv, _places(tmp_path / str(i)))
            capsys.readouterr()
    assert len(TIMES) == len(CLI_CASES)
    total = sum(TIMES.values())
    assert total < 60, f"{total:.1f} s for {len(TIMES)} bad inputs"


# --- the same mistakes through the library ------------------------------------------------------


def _llama(**overrides):
    return models.get_config("llama3-8b", **overrides)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: rk.policy("names", save=[]), BadValue, "at least one tag to save"),
        (lambda: rk.policy("offload", offload=[]), BadValue, "at least one tag to offload"),
        (lambda: rk.policy("minmal"), UnknownName, "Did you mean minimal"),
        (
            lambda: rk.policies.parse_policy("names:save query_proj"),
            ValueError,
            "expected key=value",
        ),
        (lambda: rk.parse_schedule("every:0"), ValueError, r"n=0 must be >= 1"),
        (
            lambda: rk.parse_schedule("every:64").runs(4, "full"),
            BadValue,
            "segments of 64 layers but the model has 4",
        ),
        (lambda: rk.target("h1000"), UnknownName, "unknown target 'h1000'"),
        (lambda: rk.target("h100", devices=8, hosts=3), ValueError, "not divisible by hosts=3"),
        (lambda: rk.search.parse_budget("0GiB"), ValueError, "must be positive"),
        (lambda: rk.search.parse_budget("52GiB", 2**30), ValueError, "larger than the device"),
        (lambda: models.get_config("tiny-llama", vocab=1), ValueError, "vocab_size=1 leaves"),
        (
            lambda: models.get_config("tiny-llama", head_dim=15),
            BadValue,
            "head_dim=15 is odd: the llama family's rotary position embedding rotates pairs of "
            "dimensions; use an even head_dim",
        ),
        (
            lambda: resolve_attention("cudnn", rk.target("h100"), _llama(), seq=2047),
            BadValue,
            r"even sequence length \(got seq=2047\)",
        ),
        (
            lambda: resolve_attention("cudnn", rk.target("h100"), _llama(width=4096 + 8 * 32)),
            BadValue,
            "head size that is a multiple of 8 and at most 128 \\(got 136",
        ),
        (
            lambda: check_sizes(
                rk.TrainConfig(batch=10**9, seq=512),
                models.get_config("gpt2-small"),
                rk.target("h100"),
            ),
            BadValue,
            r"512000000000 tokens per step, more than XLA indexes with 32-bit",
        ),
        (lambda: check_output("/proc/x.json", flag="--json"), BadValue, "cannot create a file"),
        (lambda: write_json("/dev/full", {}), BadValue, "'/dev/full' is a device"),
        (
            lambda: rk.TrainConfig(batch=6, seq=8, accum=4),
            ValueError,
            "batch=6 does not split into accum=4",
        ),
    ],
)
def test_bad_library_call(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_auto_attention_falls_back_where_cudnn_cannot_train():
    """Odd sequence lengths and large heads go to XLA's attention under ``auto``."""
    h100 = rk.target("h100")
    assert resolve_attention("auto", h100, _llama(), seq=2048) == "cudnn"
    assert resolve_attention("auto", h100, _llama(), seq=2047) == "xla"
    assert resolve_attention("auto", h100, _llama(width=4096 + 8 * 32), seq=2048) == "xla"
    # The rules themselves: even lengths pass, head sizes 8..128 in steps of 8 pass.
    assert cudnn_problem(_llama(), 2, h100) is None
    assert cudnn_problem(_llama(), 1, h100) is not None
    assert cudnn_problem(_llama(width=32 * 128), 2048, h100) is None  # head 128: the limit
    assert cudnn_problem(_llama(width=32 * 132), 2048, h100) is not None  # 132: not x8


def test_sizes_just_inside_the_limits_pass():
    """The size checks reject only the absurd: one token under each limit is accepted."""
    h100 = rk.target("h100")
    tiny = models.get_config("tiny-llama")
    check_sizes(rk.TrainConfig(batch=2**24 - 1, seq=128), tiny, h100)
    with pytest.raises(BadValue, match="2147483648 tokens per step"):
        check_sizes(rk.TrainConfig(batch=2**24, seq=128), tiny, h100)
    # logits = batch * seq * vocab * 4 bytes; the limit is 1000x the device's memory.
    vocab = 2**20
    limit_tokens = 1000 * h100.memory_bytes // (vocab * 4)
    wide = tiny.replace(vocab_size=vocab)
    check_sizes(rk.TrainConfig(batch=limit_tokens // 128, seq=128), wide, h100)
    with pytest.raises(BadValue, match="the logits alone"):
        check_sizes(rk.TrainConfig(batch=limit_tokens // 128 + 1, seq=128), wide, h100)


def test_a_refused_write_leaves_nothing(tmp_path):
    """A symlink, a directory and a FIFO are refused, unchanged, with no temporary file."""
    (tmp_path / "real.json").write_text("keep\n")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    (tmp_path / "adir").mkdir()
    os.mkfifo(tmp_path / "fifo.json")
    before = _snapshot(tmp_path)
    for name, kind in (("link.json", "symbolic link"), ("adir", "directory"), ("fifo", "FIFO")):
        with pytest.raises(BadValue, match=kind):
            write_json(tmp_path / (name if name != "fifo" else "fifo.json"), {"a": 1})
    assert _snapshot(tmp_path) == before
    assert (tmp_path / "real.json").read_text() == "keep\n"


# --- budgets far below what any policy can reach ------------------------------------------------


def _budget_workload(target, gib_fixed):
    fixed = int(gib_fixed * 2**30)
    # A scanned step: the compiled `full` holds every gradient, as the shapes say (check_budget
    # reads only its peak).
    return rk.sources.workload(
        rk.sources.Measured(
            lambda *a: types.SimpleNamespace(peak_bytes=fixed),
            lambda *a: 0.0,
            n_layers=1,
            breakdown_fn=lambda b: {
                "weights": fixed // 4,
                "gradients": fixed // 4,
                "optimizer": fixed // 2,
            },
            label="fake",
        ),
        rk.target(target),
        rk.TrainConfig(1, 8),
    )


def test_a_tiny_budget_suggests_a_larger_budget_not_a_smaller_gpu():
    """1 KiB on an H100 for 1 GiB of fixed parts: the device holds them; the budget is the typo."""
    with pytest.raises(DoesNotFit) as err:
        rk.search.check_budget(_budget_workload("h100", 1.0), 1, 1024)
    text = str(err.value)
    assert "a larger budget" in text and "absurdly small" in text
    assert "a100-80gb" not in text and "GPU with more memory" not in text
    assert "+ GPUs" not in text  # not "sharding ... over 1626524+ GPUs"


def test_a_gpu_is_suggested_only_when_its_usable_memory_holds_the_parts():
    """The hint is the breakdown's arithmetic against each GPU's usable memory (issue 45): the
    a100-80gb gives a process 0.06 GiB more than an h100, so fixed parts between the two fit
    it and are named, smallest first; a GPU whose usable memory is below them never is."""
    h100, a100 = rk.target("h100"), rk.target("a100-80gb")
    assert h100.usable_bytes < a100.usable_bytes < h100.memory_bytes
    gib = (h100.usable_bytes + a100.usable_bytes) / 2 / 2**30
    with pytest.raises(DoesNotFit) as err:
        rk.search.check_budget(_budget_workload("h100", gib), 1, h100.usable_bytes)
    text = str(err.value)
    usable = sorted(
        (t.usable_bytes, n)
        for n in rk.target_names("gpu")  # a GPU's step is pointed at another GPU
        if (t := rk.target(n)).usable_bytes >= gib * 2**30
    )
    named = ", ".join(f"{n} ({u / 2**30:.2f} GiB usable)" for u, n in usable[:3])
    assert f"a GPU whose usable memory holds these {gib:.2f} GiB: {named};" in text
    assert named.startswith("a100-80gb") and "a larger budget" not in text
    assert "h100-pcie" not in text  # 59.33 GiB usable: below the parts
    # Sharding: the parts split evenly over two GPUs, under the limit.
    assert "FSDP over 2 GPUs in all (now 1)" in text


# --- exit codes: 1 when a search finds nothing that fits, 2 when XLA refuses the program -------


def _one_line(capsys):
    out, err = capsys.readouterr()
    assert err.startswith("remat-kit: ") and err.count("\n") == 1, err
    assert "Traceback" not in err + out
    return err


def test_an_xla_error_at_compile_is_one_line_exit_2(monkeypatch, capsys):
    def internal(self, *args, **kwargs):
        raise jax.errors.JaxRuntimeError(
            "INTERNAL: Couldn't find output tile sizes that satisfy hlo: %dot.98 = f32[...]\n"
            "  stack frames and HLO follow"
        )

    monkeypatch.setattr(jax.stages.Lowered, "compile", internal)
    assert main(_r("--no-residuals")) == 2
    err = _one_line(capsys)
    assert "jax/XLA could not build this step: INTERNAL: Couldn't find output tile" in err


def test_fit_exits_1_when_no_policy_fits_a_single_batch(monkeypatch, capsys):
    def nothing(w, policy, schedule, **kwargs):
        return rk.search.Fit(
            "batch",
            policy=policy.spec,
            schedule=schedule.spec,
            batch=0,
            seq=16,
            unit=1,
            peak_bytes=10 * 2**30,
            next_peak_bytes=None,
            limit_bytes=2**30,
            recompute_overhead=None,
            compiles=1,
            seconds=0.0,
            note=Note(
                "batch_none_fits",
                {
                    "policy": policy.spec,
                    "batch": 1,
                    "peak_bytes": 10 * 2**30,
                    "limit_bytes": 2**30,
                    "target": "h100-80gb",
                },
            ),
        )

    monkeypatch.setattr("remat_kit.search._fit.max_batch", nothing)
    assert main(["fit", *TINY_FIT, "--policies", "none,full"]) == 1
    out, err = capsys.readouterr()
    # The verdict once: the table's batch-1 peaks, then one line (no line per policy).
    assert err == (
        "remat-kit: nothing fits: even at batch 1 the smallest peak is 10.00 GiB (none), over "
        "the 1.00 GiB limit on h100-80gb; remat-kit plan --batch 1 for a per-tag plan, or "
        "remat-kit advise for a GPU\n"
    )
    assert "does not fit" not in out and "10.00" in out
    # And 0 as soon as one policy fits.
    monkeypatch.setattr(
        "remat_kit.search._fit.max_batch",
        lambda w, p, s, **kw: dataclasses.replace(nothing(w, p, s), batch=2),
    )
    assert main(["fit", *TINY_FIT, "--policies", "none,full"]) == 0


@pytest.mark.parametrize("extra", [[], ["--gpus", "2", "--shard", "fsdp:2"]])
def test_fit_takes_an_accum_that_does_not_divide_the_default_batch(monkeypatch, extra):
    # --batch's default (4) is no batch of fit's: --accum 3 must not be refused for it.
    seen = []

    def record(w, policy, schedule, **kwargs):
        seen.append(w.batch_multiple)
        raise SystemExit(0)  # the search itself is not what is checked here

    monkeypatch.setattr("remat_kit.search._fit.max_batch", record)
    with pytest.raises(SystemExit):
        main(["fit", *TINY_FIT, "--accum", "3", "--policy", "full", *extra])
    assert seen == [3 * (2 if extra else 1)]


def test_fit_refuses_before_any_compile_when_the_fixed_part_is_over(monkeypatch, capsys):
    def no_compile(self, *args, **kwargs):
        raise AssertionError("compiled")

    monkeypatch.setattr(jax.stages.Lowered, "compile", no_compile)
    argv = ["fit", "--model", "llama3-8b", "--seq", "2048", "--target", "rtx4090"]
    assert main(argv) == 1
    err = _one_line(capsys)
    assert "llama3-8b s2048 adamw does not fit 17.99 GiB on rtx4090 whatever the policy" in err
    assert "119.66 GiB before any activation" in err  # 8.03e9 weights x (4 + 4 + 8) bytes


def test_advise_exits_1_when_no_gpu_fits(monkeypatch, capsys):
    def none_fit(workload_for, batch, targets=None, **kwargs):
        return [
            rk.search.Advice(
                target=name,
                memory_bytes=2**30,
                fits=False,
                plan=None,
                peak_bytes=None,
                recompute_overhead=None,
                overhead=None,
                max_batch=0,
                fixed_bytes=2**31,
                note=Note(
                    "fixed_over_budget",
                    {
                        "label": "tiny-llama",
                        "target": name,
                        "limit_bytes": 2**30,
                        "parts": {"weights": 2**31},
                        "fixed_bytes": 2**31,
                        "compiled_bytes": None,
                        "hints": [],
                    },
                ),
                seconds=0.0,
            )
            for name in targets
        ]

    monkeypatch.setattr("remat_kit.cli._advise.advise", none_fit)
    assert main(["advise", *TINY, "--targets", "l4,rtx4090"]) == 1
    assert "nothing fits: no GPU of l4, rtx4090 fits tiny-llama batch 2" in _one_line(capsys)


# --- library errors name parameters, never flags --------------------------------------------------


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda: rk.target("h1000"), "target"),
        (lambda: rk.target("h100", devices=8, hosts=3), "hosts"),
        (lambda: rk.target("h100", devices=0), "devices"),
        (lambda: rk.search.parse_budget("lots"), "budget"),
        (lambda: rk.TrainConfig(batch=6, seq=8, accum=4), "accum"),
        (lambda: rk.TrainConfig(batch=2, seq=0), "seq"),
        (lambda: rk.parse_shard("fsdp:0"), "shard"),
        (lambda: rk.parse_schedule("every:0"), "schedule"),
        (lambda: rk.policy("names", sav=["query_proj"]), "policy"),
        (lambda: models.get_config("tiny-llama", vocab=1), "vocab_size"),
        # the head size is d_model / n_heads: the error names the one the caller changed
        (lambda: models.get_config("tiny-llama", width=4), "d_model"),
        (lambda: models.get_config("tiny-llama", heads=64, kv_heads=1), "n_heads"),
        (lambda: models.get_config("tiny-llama", heads=3), "n_heads"),
        (lambda: models.get_config("tiny-llama", width=65), "d_model"),
        (lambda: rk.sources.load_factory("no_colon.py"), "model"),
    ],
)
def test_a_bad_value_names_its_parameter(call, param):
    with pytest.raises(BadValue) as info:
        call()
    assert info.value.param == param
    assert "--" not in str(info.value)  # a flag is the CLI's word for it, not the library's


def test_a_factory_output_that_is_not_per_token_logits_is_a_typed_error():
    """The traced logits' shape is checked before the loss reads them: BadOutput carries the
    factory, the shape it returned and the tokens' shape (not jax's take_along_axis error)."""
    spec = f"{DATA}/factories.py:pooled"
    source = rk.sources.from_factory(spec)
    config = rk.TrainConfig(batch=2, seq=8, optimizer="sgd")
    built = source.build_step(rk.policy("none"), rk.parse_schedule("none"), config, "cpu")
    with pytest.raises(BadOutput) as err:
        jax.eval_shape(built.step.loss_fn, *built.step.loss_args)
    assert (err.value.model, err.value.shape, err.value.tokens) == (spec, (2, 256), (2, 8))
    assert str(err.value).startswith(f"{spec} returned logits of shape [2, 256] for tokens")
    # A sequence axis that lost a position is refused as well.
    from remat_kit.sources._adapters import check_logits as _check_logits

    with pytest.raises(BadOutput, match=r"shape \[2, 15, 256\] for tokens of shape \[2, 16\]"):
        _check_logits("m", jax.ShapeDtypeStruct((2, 15, 256), "float32"), jnp.zeros((2, 16)))
    _check_logits("m", jax.ShapeDtypeStruct((2, 16, 256), "float32"), jnp.zeros((2, 16)))


def test_host_budget_fractions_are_refused_by_type_not_by_text():
    from remat_kit.cli._values import host_budget_arg
    from remat_kit.errors import UnitlessBudget

    for text in ("0.5", "1.5"):
        with pytest.raises(UnitlessBudget):
            rk.search.parse_budget(text, None)
        with pytest.raises(BadValue, match="give bytes with a unit"):
            host_budget_arg(text)
    with pytest.raises(BadValue, match=r"^--host-budget: cannot read budget 'lots'"):
        host_budget_arg("lots")


def test_library_messages_never_name_a_cli_flag():
    """Every message raised or warned outside remat_kit/cli names parameters, not flags."""
    import ast
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    calls = {"warn", "BadValue", "BadType", "DoesNotFit", "TargetError", "InspectError", "unknown"}
    found = []
    for path in sorted([*root.glob("remat_kit/**/*.py"), *root.glob("models/**/*.py")]):
        if "cli" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            name = getattr(node, "func", None)
            name = getattr(name, "id", getattr(name, "attr", None))
            if not isinstance(node, ast.Raise) and name not in calls:
                continue
            found += [
                f"{path.relative_to(root)}:{sub.lineno}: {sub.value}"
                for sub in ast.walk(node)
                if isinstance(sub, ast.Constant)
                and isinstance(sub.value, str)
                and re.search(r"--[a-z]|remat-kit [a-z]", sub.value)
            ]
    assert found == []


def test_ctrl_c_while_the_command_loads_is_one_line(monkeypatch, capsys):
    # The command module imports jax (seconds): an interrupt then is one line and 130 too.
    import remat_kit.cli as cli

    def loading(command):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_parser", loading)
    assert main(["report", "--model", "tiny-llama"]) == 130
    assert capsys.readouterr().err == "remat-kit: interrupted\n"


@pytest.mark.parametrize(
    ("platforms", "devices", "refused"),
    [
        ("cuda", [], "GPU"),
        ("cuda,cpu", [], "GPU"),
        ("GPU", [], "GPU"),
        ("cpu", [], None),
        ("", [], None),
        ("cuda", ["/dev/nvidia0"], None),  # a GPU box: jax starts its CUDA platform
        # A TPU VM shows its chips as either family of device files, one or the other
        # (seed-100 mutant _platform.py:309, ``or`` made ``and``: no test had only one).
        ("tpu", [], "TPU"),
        ("tpu", ["/dev/accel0"], None),  # v4, v5p
        ("tpu", ["/dev/vfio/0"], None),  # v5e and later
        ("tpu", ["/dev/accel0", "/dev/vfio/0"], None),
        ("tpu", ["/dev/nvidia0", "/dev/vfio/vfio"], "TPU"),  # a GPU box, VFIO's control node
    ],
)
def test_jax_platforms_naming_a_device_the_machine_lacks_is_refused(
    monkeypatch, platforms, devices, refused
):
    import fnmatch

    from remat_kit.errors import TargetError
    from remat_kit.targets import _platform

    monkeypatch.setenv("JAX_PLATFORMS", platforms)
    monkeypatch.setattr(_platform.glob, "glob", lambda pattern: fnmatch.filter(devices, pattern))
    if refused:
        with pytest.raises(
            TargetError, match=rf"^JAX_PLATFORMS={platforms} asks jax for a {refused}"
        ):
            _platform.check_platforms()
    else:
        _platform.check_platforms()


@pytest.mark.slow
@pytest.mark.skipif(bool(__import__("glob").glob("/dev/nvidia[0-9]*")), reason="a GPU is here")
def test_jax_platforms_cuda_without_a_gpu_is_one_line_exit_2():
    import subprocess
    import sys

    env = {**os.environ, "JAX_PLATFORMS": "cuda"}
    argv = ["report", "--model", "tiny-llama", "--target", "h100", "--batch", "1", "--seq", "16"]
    done = subprocess.run(
        [sys.executable, "-m", "remat_kit.cli", *argv], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("remat-kit: JAX_PLATFORMS=cuda asks jax for a GPU")
    assert len(done.stderr.splitlines()) == 1


NO_GPU = pytest.mark.skipif(
    bool(__import__("glob").glob("/dev/nvidia[0-9]*")), reason="a GPU is here"
)


def _cli(argv, **env):
    # A fresh process: JAX_PLATFORMS and the CUDA plugin's probe act when jax starts.
    import subprocess
    import sys

    base = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    return subprocess.run(
        [sys.executable, "-m", "remat_kit.cli", *argv],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


@NO_GPU
@pytest.mark.parametrize("command", ["report", "compare"])
# starts a process: jax's imports and backends, seconds each
@pytest.mark.slow
def test_target_local_without_a_gpu_is_one_line_exit_2(command):
    # No CUDA plugin traceback, no report with a blank limit: the run stops before jax starts.
    done = _cli([command, "--model", "tiny-llama", "--target", "local", "--batch", "1"])
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith("remat-kit: target 'local' measures this machine's GPU, and ")
    assert "e.g. h100" in done.stderr and done.stderr.count("\n") == 1
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("platforms", "argv", "says"),
    [
        pytest.param("gpu", ["targets"], "asks jax for a GPU this machine", marks=NO_GPU),
        pytest.param("cuda,cpu", ["policies"], "asks jax for a GPU this machine", marks=NO_GPU),
        ("tpu", ["targets"], "asks jax for a TPU this machine does not have"),
        ("rocm", ["targets"], "could not start (backend 'rocm': "),
        ("metal", ["targets"], "could not start (backend 'metal': "),
        ("tpu", ["report", *TINY, "--no-residuals"], "asks jax for a TPU this machine"),
    ],
)
# starts a process: jax's imports and backends, seconds each
@pytest.mark.slow
def test_jax_platforms_that_is_not_here_is_one_line_exit_2(platforms, argv, says):
    done = _cli(argv, JAX_PLATFORMS=platforms)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith(f"remat-kit: JAX_PLATFORMS={platforms} "), done.stderr
    assert says in done.stderr and "set JAX_PLATFORMS=cpu" in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize(
    ("error", "refused"),
    [
        (
            RuntimeError("Unable to initialize backend 'tpu': no libtpu (set JAX_PLATFORMS='')"),
            True,
        ),
        (RuntimeError("Unable to initialize backend 'cuda': no driver"), True),
        (RuntimeError("something else entirely"), False),
        (ValueError("Unable to initialize backend 'tpu': a ValueError is not jax's"), False),
    ],
)
def test_platform_error_knows_jaxs_backend_failure(error, refused, monkeypatch):
    from remat_kit.targets._platform import platform_error

    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    got = platform_error(error)
    assert (got is not None) == refused
    if refused:
        assert str(got).startswith("JAX_PLATFORMS=tpu asks jax for a platform it could not ")
        assert "JAX_PLATFORMS=''" not in str(got)  # jax's own hint gives way to ours


def test_target_local_is_refused_only_without_a_gpu(monkeypatch):
    from remat_kit.errors import TargetError
    from remat_kit.targets import _platform

    monkeypatch.setattr(_platform, "_has_nvidia_device", lambda: True)
    _platform.check_local_gpu()
    monkeypatch.setattr(_platform, "_has_nvidia_device", lambda: False)
    with pytest.raises(TargetError, match=r"has none \(no /dev/nvidia"):
        _platform.check_local_gpu()


@pytest.mark.parametrize("value", ["2", "maybe", "tru"])
@pytest.mark.parametrize("name", ["REMAT_KIT_NO_CACHE", "REMAT_KIT_FULL_CODEGEN"])
def test_a_switch_that_is_neither_on_nor_off_is_refused(
    name, value, monkeypatch, capsys, no_compile
):
    # Read as "off", REMAT_KIT_NO_CACHE=2 would leave the cache on without a word.
    monkeypatch.setenv(name, value)
    assert main(_r("--target", "h100")) == 2
    err = _one_line(capsys)
    assert f"{name}={value!r} is neither on (1, true, yes, on) nor off" in err, err


@pytest.mark.parametrize("on", ["1", "YES", " on "])
def test_a_switch_that_is_on_is_read_as_on(on, monkeypatch):
    from remat_kit import cache

    monkeypatch.setenv(cache.ENV_OFF, on)
    assert cache.enabled() is False
    monkeypatch.setenv(cache.ENV_OFF, "off")
    assert cache.enabled() is True


@pytest.mark.parametrize("where", ["under_a_file", "a_file", "read_only"])
def test_an_unusable_cache_directory_is_one_line_and_the_run_goes_without(
    where, tmp_path, monkeypatch, capsys
):
    import remat_kit.cli._report as report
    from remat_kit import cache

    if where == "read_only" and os.geteuid() == 0:
        pytest.skip("root writes into a read-only directory")
    blocker = tmp_path / "file"
    blocker.write_text("")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    given = {"under_a_file": blocker / "sub", "a_file": blocker, "read_only": ro}[where]
    monkeypatch.setenv(cache.ENV_DIR, str(given))
    seen = []
    monkeypatch.setattr(report, "run", lambda args: seen.append(cache.enabled()) or 0)
    assert main(_r()) == 0
    err = capsys.readouterr().err
    assert seen == [False]  # the run went without the cache
    assert err.count("\n") == 1 and err.startswith(f"remat-kit: the cache directory {given} "), err
    assert "neither reads nor writes the cache" in err
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "fine"))
    seen.clear()
    assert main(_r()) == 0
    assert seen == [True] and capsys.readouterr().err == ""


def test_an_allocator_jax_does_not_know_is_refused(monkeypatch, capsys, no_compile):
    # Read as the default, it would judge "fits" against a pool the user's jax never makes.
    monkeypatch.setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "cuda-async")
    assert main(_r("--target", "h100")) == 2
    err = _one_line(capsys)
    assert "XLA_PYTHON_CLIENT_ALLOCATOR='cuda-async' is not an allocator jax knows" in err, err
    monkeypatch.setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
    assert rk.targets.runtime_from_env().mem_fraction is None
