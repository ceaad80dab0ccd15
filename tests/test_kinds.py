"""Kinds of model source: requests, the entry-point registry and the one refusal of flags.

A toy kind (tests/data/toy_plugin: one module and one entry point) is installed the way a
package installs one, by a ``.dist-info`` folder on the path, and measured end to end; its
flag (``--toy-tokens``) and its note (``toy_small``) come with it, with no line elsewhere.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

import remat_kit as rk
from remat_kit.cli import _parser, main
from remat_kit.cli._args import kind_options
from remat_kit.cli._model import spec_from_args
from remat_kit.errors import BadType, BadValue
from remat_kit.notes import Note, NoteKind, _note, words
from remat_kit.sources import (
    FactorySpec,
    Option,
    SourceKind,
    StepSpec,
    kind_named,
    kind_of,
    kinds,
)
from remat_kit_models.spec import HFSpec, PresetSpec

TOY = Path(__file__).resolve().parent / "data" / "toy_plugin"


@pytest.fixture
def toy_installed(monkeypatch):
    monkeypatch.syspath_prepend(str(TOY))
    # The toy's note kinds are registered for this test only (every kind of note is listed
    # in rk.notes.KINDS, which tests/test_notes.py checks in the same process).
    monkeypatch.setattr(_note, "_PLUGGED", dict(_note._PLUGGED))
    kinds.cache_clear()
    yield sys.modules.get("toy_source") or __import__("toy_source")
    kinds.cache_clear()  # the path is restored after this: read the kinds again without it
    _note._load_plugins.cache_clear()


def _entry_points(tmp_path, line: str):
    dist = tmp_path / "bad-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: bad\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(f"[remat_kit.sources]\n{line}\n")


def test_the_installed_kinds_are_ours_and_the_presets_plugins():
    assert sorted(kinds()) == ["factory", "hf", "maxtext", "preset", "step"]
    assert kinds()["preset"].spec is PresetSpec and kinds()["hf"].spec is HFSpec


@pytest.mark.parametrize(
    ("field", "name", "kind"),
    [
        ("model", "llama3-8b", "preset"),
        ("model", "no-such-preset", "preset"),  # the preset kind names it, with close matches
        ("model", "tests/data/factories.py:deep", "factory"),
        ("model", "pkg.module:NAME", "factory"),
        ("hf_config", "config.json", "hf"),
        ("step", "own.py:step", "step"),
    ],
)
def test_a_name_is_claimed_by_one_kind(field, name, kind):
    assert kind_named(field, name).name == kind


@pytest.mark.parametrize(
    ("spec", "kind"),
    [
        (PresetSpec("tiny-llama"), "preset"),
        (HFSpec("c.json"), "hf"),
        (FactorySpec("f.py:m"), "factory"),
        (StepSpec("f.py:s"), "step"),
    ],
)
def test_a_spec_is_of_one_kind(spec, kind):
    assert kind_of(spec).name == kind


def test_a_value_that_is_no_spec_is_a_typed_error_naming_the_specs():
    with pytest.raises(BadType, match=r"not a model spec: give one of FactorySpec, HFSpec"):
        rk.sources.resolve("tiny-llama")


def test_a_kind_whose_name_field_has_a_default_or_is_missing_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Spec:
        model: str = "x"

    with pytest.raises(BadValue, match="names_by='model' must be a field of Spec without"):
        SourceKind("x", Spec, lambda s: None, "model")
    with pytest.raises(BadValue, match="names_by='name' must be a field"):
        SourceKind("x", StepSpec, lambda s: None, "name")
    with pytest.raises(BadValue, match=r"trains=\['seq'\] must be among"):
        SourceKind("x", StepSpec, lambda s: None, "step", trains={"seq"})


def test_the_toy_kind_wins_over_the_presets_fallback(toy_installed):
    assert "toy" in kinds()
    assert kind_named("model", "toy-64").name == "toy"
    assert kind_named("model", "tiny-llama").name == "preset"


def test_two_kinds_that_claim_a_name_are_an_error(toy_installed, monkeypatch):
    twin = dataclasses.replace(toy_installed.TOY, name="twin")
    found = {**kinds(), "twin": twin}
    monkeypatch.setattr(rk.sources._kinds, "kinds", lambda: found)
    with pytest.raises(BadValue, match=r"claimed by 2 kinds of source \(toy, twin\)"):
        rk.sources._kinds.kind_named("model", "toy-64")


def test_an_entry_point_that_names_no_kind_is_a_typed_error(tmp_path, monkeypatch):
    _entry_points(tmp_path, "bad = remat_kit.sources:resolve")
    monkeypatch.syspath_prepend(str(tmp_path))
    kinds.cache_clear()
    try:
        with pytest.raises(BadType, match=r"entry point bad = 'remat_kit.sources:resolve'"):
            kinds()
    finally:
        kinds.cache_clear()


@pytest.mark.slow
def test_the_toy_kind_measures_as_a_bare_compile_of_its_model(toy_installed):
    src = rk.sources.resolve(toy_installed.ToySpec("toy-64", layers=3))
    config = rk.TrainConfig(batch=2, seq=32, optimizer="sgd")
    report = rk.sources.measure(src, "full", "h100", config)
    # Independent: the same module, stepped by hand and compiled bare.
    module = toy_installed._Toy(64, 3, rk.policy("full"))
    step = rk.build_train_step(module, config)
    bare = rk.memory_report(step.fn, *step.args, target="h100", donate_argnums=step.donate_argnums)
    assert report.peak_bytes == bare.peak_bytes
    assert src.n_layers() == 3


@pytest.mark.slow
def test_the_cli_measures_the_toy_and_refuses_what_its_spec_lacks(toy_installed, capsys):
    argv = ["report", "--model", "toy-64", "--layers", "3", "--batch", "2", "--seq", "32"]
    assert main([*argv, "--target", "h100", "--optimizer", "sgd"]) == 0
    assert "toy-64" in capsys.readouterr().out
    assert main([*argv, "--lora", "4", "--width", "8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("remat-kit: --lora, --width with --model toy-64: a toy source takes ")
    assert "--layers" in err and err.count("\n") == 1


def _report_args(*argv: str):
    parser, _ = _parser("report")
    args = parser.parse_args(["report", *argv])
    args.given = frozenset(a for a in argv if a.startswith("--"))
    return args


def test_the_toy_kinds_flag_is_declared_and_parsed_into_its_spec(toy_installed):
    # Its option is on the parser (no CLI table names it) and fills its spec's field; the
    # shared --layers fills the toy's own layers.
    args = _report_args("--model", "toy-64", "--toy-tokens", "100", "--layers", "3")
    kind, spec = spec_from_args(args)
    assert kind is toy_installed.TOY
    assert spec == toy_installed.ToySpec("toy-64", layers=3, tokens=100)
    # Not given: the spec's default, not the parser's None.
    assert spec_from_args(_report_args("--model", "toy-64"))[1].tokens == 256
    # A switch takes no value: given, its field is its const (True unless it names another;
    # seed 95's _kinds.py:139 made that False); not given, the spec's default.
    assert toy_installed.NORM.const is True
    assert spec_from_args(_report_args("--model", "toy-64", "--toy-norm"))[1].norm is True
    assert spec_from_args(_report_args("--model", "toy-64"))[1].norm is False
    with pytest.raises(SystemExit):  # read as its type says: a positive int
        _report_args("--model", "toy-64", "--toy-tokens", "0")


def test_the_toy_kinds_flag_is_refused_for_another_kind(toy_installed, capsys):
    assert main(["report", "--model", "tiny-llama", "--toy-tokens", "100"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("remat-kit: --toy-tokens with --model tiny-llama: a preset source ")
    assert err.endswith("; drop it (--toy-tokens is for toy (--model) sources)\n")
    assert "--toy-tokens," not in err  # the preset's own flags do not list it
    # A library error about the field it fills names the flag and its value.
    assert main(["report", "--model", "toy-64", "--toy-tokens", "1", "--target", "h100"]) == 2
    assert capsys.readouterr().err == (
        "remat-kit: --toy-tokens 1: tokens=1: a toy predicts among 2 tokens or more\n"
    )


def test_the_toy_kinds_note_is_worded_by_its_kind(toy_installed):
    note = toy_installed.SMALL(width=64)
    assert note == Note("toy_small", {"width": 64})
    assert words(note) == "toy-64 is a toy: its figures fit no real model"
    assert words(note.to_dict()) == words(note)  # read back from JSON
    assert rk.notes.KINDS["toy_small"] == ("width",)
    with pytest.raises(BadValue, match="a 'toy_small' note holds width; got size"):
        Note("toy_small", {"size": 64})


def test_a_plugins_note_read_back_in_a_fresh_process_finds_its_kind(toy_installed, monkeypatch):
    # As a process that never loaded the kind: its note kinds come from the entry points.
    assert _note.PLUGINS == rk.sources.ENTRY_POINTS  # the group notes reads is the kinds'
    monkeypatch.setattr(_note, "_PLUGGED", {})
    _note._load_plugins.cache_clear()
    try:
        assert words({"kind": "toy_small", "width": 8}) == (
            "toy-8 is a toy: its figures fit no real model"
        )
        assert words({"kind": "maxtext_xla_remat", "disabled": True}).startswith(
            "XLA's own rematerialization pass is off"
        )
    finally:
        _note._load_plugins.cache_clear()


def test_a_kinds_options_must_fill_its_spec_and_train_what_it_trains():
    @dataclasses.dataclass(frozen=True)
    class Spec:
        model: str

    with pytest.raises(BadValue, match=r"option --layers fills 'layers', and the kind has no"):
        SourceKind("x", Spec, lambda s: None, "model", options=(rk.sources.LAYERS,))
    optimizer = rk.sources.TRAIN_OPTIONS[0]
    with pytest.raises(BadValue, match=r"option --optimizer fills 'optimizer', and the kind tra"):
        SourceKind("x", Spec, lambda s: None, "model", trains=(), options=(optimizer,))
    # The train options of what it trains and does not place come after its own.
    kind = SourceKind("x", Spec, lambda s: None, "model", trains={"accum"})
    assert [o.flag for o in kind.options] == ["--accum"]
    with pytest.raises(BadValue, match="two kinds of note are named 'xla_remat'"):
        SourceKind("x", Spec, lambda s: None, "model", notes=(NoteKind("xla_remat", (), str),))


def test_the_flags_of_several_kinds_keep_each_kinds_order():
    # A flag is listed after every flag some kind lists before it (C3), whatever kind first
    # declares it; where two kinds disagree, the first kind's order wins.
    @dataclasses.dataclass(frozen=True)
    class Spec:
        model: str
        a: int = 0
        b: int = 0
        c: int = 0

    a, b, c = (Option(f"--{f}", f, f) for f in "abc")
    one = SourceKind("one", Spec, lambda s: None, "model", trains=(), options=(a, c))
    two = SourceKind("two", Spec, lambda s: None, "model", trains=(), options=(a, b, c))
    three = SourceKind("three", Spec, lambda s: None, "model", trains=(), options=(c, a))
    assert [o.flag for o in kind_options([one, two])] == ["--a", "--b", "--c"]
    assert [o.flag for o in kind_options([one, three])] == ["--a", "--c"]


@dataclasses.dataclass(frozen=True)
class _Named:
    model: str
    other: str


@pytest.mark.parametrize("seed", range(3))
def test_random_kinds_give_a_name_to_the_one_that_claims_it_fallbacks_last(monkeypatch, seed):
    import random

    rng = random.Random(seed)
    names = ["a", "b:c", "toy-1", "x"]
    for _ in range(40):
        # Each kind claims a random set of names; some are fallbacks; one is named by another
        # field.
        claimed = {f"k{i}": set(rng.sample(names, rng.randrange(0, 3))) for i in range(4)}
        fallback = {k: rng.random() < 0.4 for k in claimed}
        found = {
            k: SourceKind(
                k,
                _Named,
                lambda s: None,
                "model" if k != "k3" or rng.random() < 0.5 else "other",
                claims=lambda name, names=frozenset(claimed[k]): name in names,
                fallback=fallback[k],
                trains=(),
            )
            for k in claimed
        }
        monkeypatch.setattr(rk.sources._kinds, "kinds", lambda found=found: found)
        name = rng.choice(names)
        # The oracle: the kinds named by `model` that claim it; fallbacks only where alone.
        mine = [k for k in found if found[k].names_by == "model" and name in claimed[k]]
        winners = mine if len(mine) < 2 else [k for k in mine if not fallback[k]]
        if len(winners) == 1:
            assert kind_named("model", name).name == winners[0]
            continue
        with pytest.raises(BadValue, match=rf"claimed by {len(winners)} kinds of source") as e:
            kind_named("model", name)
        listed = winners or [k for k in found if found[k].names_by == "model"]
        assert f"({', '.join(listed)})" in str(e.value)
        assert ("uninstall one" in str(e.value)) is bool(winners)
    with pytest.raises(rk.errors.UnknownName, match="model field"):
        kind_named("nothing", "a")


def test_a_kind_s_options_are_its_own_then_the_train_options_of_what_it_trains_unplaced():
    accum = rk.sources.TRAIN_OPTIONS[1]
    layers = Option("--other", "other", "another")
    for trains in [(), ("accum",), ("optimizer", "precision"), ("optimizer", "accum", "precision")]:
        if "accum" not in trains:
            with pytest.raises(BadValue, match="option --accum fills 'accum', and the kind trains"):
                SourceKind("x", _Named, lambda s: None, "model", trains=trains, options=(accum,))
            continue
        kind = SourceKind("x", _Named, lambda s: None, "model", trains=trains, options=(accum,))
        want = ["--accum"] + [
            o.flag for o in rk.sources.TRAIN_OPTIONS if o.field in trains and o.field != "accum"
        ]
        assert [o.flag for o in kind.options] == want and kind.trains == frozenset(trains)
    kind = SourceKind("x", _Named, lambda s: None, "model", trains=(), options=[layers])
    assert kind.options == (layers,) and kind.fields == ("model", "other")
    assert Option("--kv-heads", "kv", "k").dest == "kv_heads"
    with pytest.raises(BadValue, match="a flag starts with --"):
        Option("-k", "kv", "k")
    with pytest.raises(BadValue, match="option type"):
        Option("--k", "kv", "k", type="bytes")
    assert Option("--k", "kv", "k", type=int, params=["a"]).params == ("a",)
    with pytest.raises(BadType, match=r"options holds a str, not an rk\.sources\.Option"):
        SourceKind("x", _Named, lambda s: None, "model", trains=(), options=("--other",))


def test_the_training_flags_are_listed_under_training_in_the_help():
    # A kind's option names its --help group: the train config's flags (every source's)
    # read under "training", not among a model's own flags.
    parser, _ = _parser("report")
    (commands,) = parser._subparsers._group_actions  # argparse's one subparsers action
    groups = {
        g.title: {s for a in g._group_actions for s in a.option_strings}
        for g in commands.choices["report"]._action_groups
    }
    # Each of the train config's (seed-91 mutant _kinds.py:232: --dtype's group dropped,
    # listed among the model's flags).
    training = {"--batch", "--seq", "--optimizer", "--lora", "--accum", "--precision"}
    training |= {"--param-dtype", "--dtype", "--dropout"}
    assert training <= groups["training"]
    assert not training & groups["model"]
