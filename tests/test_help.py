"""``remat-kit CMD --help``: no jax, defaults stated, flags grouped and declared once, two
examples per command; the help's copies of library constants equal the library's."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections import defaultdict

import pytest

from remat_kit.cli import COMMANDS, _parser
from remat_kit.cli._parser import _Formatter

NAMES = [c.name for c in COMMANDS]
MEASURING = [c.name for c in COMMANDS if c.module != "remat_kit.cli._listings"]


def _help(name: str) -> tuple[int, str, bool]:
    # A fresh interpreter: whether jax was imported is only meaningful in one that had none.
    code = (
        "import sys\n"
        "from remat_kit.cli import main\n"
        "try:\n"
        f"    main([{name!r}, '--help'])\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        "print('JAX', 'jax' in sys.modules, code)\n"
    )
    env = {"COLUMNS": "100", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    *text, last = done.stdout.rstrip().splitlines()
    _, jax_loaded, code = last.split()
    return int(code), "\n".join(text), jax_loaded == "True"


@pytest.mark.parametrize("name", NAMES)
def test_help_imports_no_jax(name):
    code, text, jax_loaded = _help(name)
    assert code == 0
    assert text.startswith(f"usage: remat-kit {name}")
    assert not jax_loaded


@pytest.mark.parametrize("name", MEASURING)
def test_help_groups_the_flags(name):
    text = dict(_parsers())[name].format_help()
    heads = [line[:-1] for line in text.splitlines() if line and line.endswith(":")]
    for title in ("model", "training", "target and mesh", "output"):
        assert title in heads, (title, heads)
    # Flags sit under their group: --target after "target and mesh:", --json after "output:".
    assert text.index("target and mesh:") < text.index("  --target") < text.index("output:")
    assert text.index("output:") < text.index("  --json")


def _parsers():
    for name in NAMES:
        parser, _ = _parser(name)
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        yield name, sub.choices[name]


@pytest.mark.parametrize("name", NAMES)
def test_help_states_every_default(name):
    parser = dict(_parsers())[name]
    formatter = _Formatter(prog="remat-kit")
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0:
            continue
        if action.default in (None, argparse.SUPPRESS, [], 0) and not isinstance(
            action.default, float
        ):
            continue  # nothing to state (0: "--lora 0: off" words its own)
        assert "default" in formatter._get_help_string(action), action.option_strings


@pytest.mark.parametrize("name", NAMES)
def test_help_ends_with_two_examples(name):
    parser = dict(_parsers())[name]
    lines = (parser.epilog or "").splitlines()
    assert lines[0] == "examples:"
    examples = lines[1:]
    assert len(examples) == 2 and len(set(examples)) == 2
    assert all(e.startswith(f"  remat-kit {name}") for e in examples)


def test_each_flag_is_declared_once(monkeypatch):
    # Every add_argument call is recorded with the line that made it: a flag two commands
    # share comes from one line (its declaration in _args), whichever command built it.
    sites: dict[str, set[str]] = defaultdict(set)
    original = argparse._ActionsContainer.add_argument

    def recording(self, *flags, **kwargs):
        frame = sys._getframe(1)
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        for flag in flags:
            if flag.startswith("--") and flag != "--help":
                sites[flag].add(where)
        return original(self, *flags, **kwargs)

    monkeypatch.setattr(argparse._ActionsContainer, "add_argument", recording)
    for name in NAMES:
        _parser(name)
    twice = {flag: where for flag, where in sites.items() if len(where) > 1}
    # --debug: once for remat-kit itself, once after the command; both in add_common_args.
    assert set(twice) == {"--debug"}, twice
    assert all("/remat_kit/cli/_args.py:" in w for w in twice["--debug"])
    assert all("/remat_kit/cli/_" in w for where in sites.values() for w in where)


def test_the_helps_copies_equal_the_library():
    from remat_kit import search, sharding, sources, train
    from remat_kit.cli import _args, _flags

    assert _args.DEPTH_MODES == sources.DEPTH_MODES
    assert tuple(train.PRECISIONS) == _args.PRECISION_NAMES
    assert _args.SHARD_EXAMPLES == sharding._plan._EXAMPLES
    assert _args.FRONT_POLICIES == search.FRONT_POLICIES
    assert _flags.SEQ_STEP == search.DEFAULT_GRANULARITY
    assert _flags.SEQ_CAP == search.DEFAULT_SEQ_CAP
    assert _flags.RANKINGS == search.RANKINGS
