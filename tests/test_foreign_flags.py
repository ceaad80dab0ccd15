"""A flag the chosen kind of model does not take is refused, in one line that names it and
the kinds it is for, whichever kind and flag (before anything is resolved or traced); a flag
the kind takes is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from remat_kit.cli import _parser
from remat_kit.cli._model import _DEPTH, _takes, _unrolls, model_options, spec_from_args
from remat_kit.errors import BadValue
from remat_kit.sources import kinds

DATA = Path(__file__).resolve().parent / "data"

#: A model of each built-in kind, named as the command line names it.
MODELS = {
    "preset": ["--model", "tiny-llama"],
    "factory": ["--model", f"{DATA / 'factories.py'}:untagged"],
    "hf": ["--hf-config", str(DATA / "hf" / "llama3-8b.json")],
    "step": ["--step", f"{DATA / 'own_steps.py'}:linen_step"],
    "maxtext": ["--maxtext", "model_name=llama2-7b"],
}

#: A value each flag takes (None: a switch).
VALUES = {
    "--block": "pkg.mod:Block",
    "--tags": "hf",
    "--optimizer": "sgd",
    "--lora": "4",
    "--accum": "2",
    "--precision": "bf16",
    "--param-dtype": "bf16",
    "--dtype": "bf16",
    "--dropout": "0.1",
    "--attention": "xla",
    "--no-scan": None,
    "--shard": "fsdp:2",
    "--moe-impl": "ragged",
    "--capacity-factor": "1.5",
    "--depth": "full",
}
FLAGS = [*model_options(), _DEPTH]


def _takes_flag(kind, flag) -> bool:
    return _unrolls(kind) if flag is _DEPTH else _takes(kind, flag)


def _args(kind: str, flag: str):
    value = VALUES.get(flag, "2")  # the shape overrides take a size
    argv = ["report", *MODELS[kind], flag, *([] if value is None else [value])]
    parser, _ = _parser("report")
    args = parser.parse_args(argv)
    args.given = frozenset(a for a in argv if a.startswith("--"))
    return args


PAIRS = [(k, f) for k in MODELS for f in FLAGS]


def test_every_kind_and_flag_is_covered():
    assert set(MODELS) <= set(kinds()), set(kinds())
    assert all(f.flag in VALUES or f.type == "positive_int" for f in FLAGS)  # a size: "2"


@pytest.mark.parametrize(("kind", "flag"), PAIRS, ids=[f"{k}{f.flag}" for k, f in PAIRS])
def test_a_flag_is_refused_exactly_where_its_kind_does_not_take_it(kind, flag):
    args = _args(kind, flag.flag)
    source_kind = kinds()[kind]
    if _takes_flag(source_kind, flag):
        got, _ = spec_from_args(args)
        assert got.name == kind
        return
    with pytest.raises(BadValue) as err:
        spec_from_args(args)
    text = str(err.value)
    assert text.startswith(f"{flag.flag} with {MODELS[kind][0]} "), text
    assert "\n" not in text
    # It names the kinds the flag is for, and only those.
    takers = [k for k in MODELS if _takes_flag(kinds()[k], flag)]
    assert takers, flag.flag
    said = text[text.index(f"({flag.flag} is for ") :]
    for k in MODELS:
        assert (f"{k} (" in said) == (k in takers), (k, said)
