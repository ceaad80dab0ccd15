"""Names on the command line are read without regard to case, for every flag that takes one
(``--target H100`` and ``--optimizer AdamW`` alike), and a name that is none of the valid
ones is refused in one line that lists them."""

from __future__ import annotations

import pytest

from remat_kit.cli import _parser, main
from remat_kit.cli._values import policy_arg, schedule_arg

TINY = ["--model", "tiny-llama", "--batch", "1", "--seq", "64"]


def _parse(command, *argv):
    parser, _ = _parser(command)
    return parser.parse_args([command, *TINY, *argv])


@pytest.mark.parametrize(
    ("command", "flag", "typed", "dest", "read"),
    [
        ("report", "--optimizer", "AdamW", "optimizer", "adamw"),
        ("report", "--precision", "BF16-F32-Moments", "precision", "bf16-f32-moments"),
        ("report", "--attention", "XLA", "attention", "xla"),
        ("report", "--dtype", "BF16", "dtype", "bf16"),
        ("report", "--param-dtype", "F32", "param_dtype", "f32"),
        ("report", "--depth", "Full", "depth", "full"),
        ("report", "--moe-impl", "Ragged", "moe_impl", "ragged"),
        ("report", "--tags", "HF+GPT2", "tags", "hf+gpt2"),
        ("fit", "--over", "SEQ", "over", "seq"),
        ("fit", "--objective", "Throughput", "objective", "throughput"),
        ("plan", "--objective", "FLOPS", "objective", "flops"),
        ("advise", "--rank", "Speed", "rank", "speed"),
    ],
)
def test_a_flags_names_are_read_in_any_case(command, flag, typed, dest, read):
    if command == "fit":
        argv = [a for a in TINY if a not in ("--batch", "1")]
        parser, _ = _parser(command)
        args = parser.parse_args([command, *argv, flag, typed])
    else:
        args = _parse(command, flag, typed)
    assert getattr(args, dest) == read


@pytest.mark.parametrize(
    ("typed", "name"),
    [("FULL", "full"), ("Minimal", "minimal"), ("NAMES:save=context", "names:save=context")],
)
def test_a_policys_family_is_read_in_any_case(typed, name):
    assert policy_arg(typed, "--policy") == policy_arg(name, "--policy")


def test_a_policys_tag_names_keep_their_case():
    # A factory's own tags may have capitals: only the family is a name of ours.
    pol = policy_arg("NAMES:save=Attn_Q", "--policy", own_names=True)
    assert pol.params["save"] == ("Attn_Q",)


@pytest.mark.parametrize(("typed", "name"), [("EVERY:2", "every:2"), ("Sqrt", "sqrt")])
def test_a_schedules_family_is_read_in_any_case(typed, name):
    assert schedule_arg(typed, "--schedule", 4) == schedule_arg(name, "--schedule", 4)


def test_a_preset_is_named_in_any_case():
    from remat_kit.cli._model import spec_from_args

    parser, _ = _parser("report")
    args = parser.parse_args(["report", "--model", "TINY-LLAMA", *TINY[2:]])
    _, spec = spec_from_args(args)
    assert spec.model == "tiny-llama"


@pytest.mark.parametrize(
    ("command", "argv", "lists"),
    [
        ("report", ["--optimizer", "adamx"], "Known: adafactor, adam, adamw"),
        ("report", ["--attention", "flash"], "xla, cudnn, auto"),
        ("report", ["--precision", "half"], "mixed, bf16, bf16-f32-moments, f32"),
        ("report", ["--depth", "deep"], "'auto', 'full', 'check', 'estimate'"),
        ("report", ["--moe-impl", "dense"], "'ragged', 'capacity'"),
        ("report", ["--policy", "fulll"], "Known: block, context"),
        ("report", ["--schedule", "evry:2"], "Known: every, layers, nested, none, sqrt"),
        ("report", ["--target", "h1000"], "Known: a100-40gb"),
        ("report", ["--model", "tiny-lama"], "Known: bert-base"),
        ("fit", ["--over", "tokens"], "'batch', 'seq'"),
        ("advise", ["--rank", "price"], "'cost', 'speed', 'name'"),
    ],
)
def test_a_name_that_is_not_one_is_refused_with_the_valid_ones(command, argv, lists, capsys):
    base = [a for a in TINY if command != "fit" or a not in ("--batch", "1")]
    if argv[0] == "--model":
        base = base[2:]
    try:
        code = main([command, *base, *argv, "--no-cache"])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert lists in err, err
