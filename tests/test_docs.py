"""The documentation site (docs/) and README: the site builds with warnings as errors, every
console command they show runs up to its first compile, every file a command names is where
the command finds it, and the generated tables read what their sources hold."""

import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS))

#: Where console commands are shown: README and every page (the examples' captured output,
#: docs/_output/*.txt, opens with its command and is included by the pages).
SOURCES = (
    ROOT / "README.md",
    *sorted(DOCS.rglob("*.md")),
    *sorted((DOCS / "_output").glob("*.txt")),
)
#: The flags whose value may be a file the command reads (not one it writes).
INPUT_FLAGS = ("--model", "--step", "--hf-config", "--target", "--price-file", "--block")


def _console_lines(path: Path) -> list[str]:
    """The ``$ ...`` lines of a file's console blocks (a captured output file is one block),
    continuation lines joined, trailing ``# comments`` dropped, ``a | b`` split."""
    text = path.read_text()
    blocks = [text] if path.suffix == ".txt" else re.findall(r"```console\n(.+?)\n```", text, re.S)
    lines = []
    for block in blocks:
        for cmd in re.findall(r"^\$ (.+?)(?<!\\)$", block.replace("\\\n", " "), re.M):
            lines += [part.strip() for part in re.sub(r"\s+#.*$", "", cmd).split(" | ")]
    return lines


def console_commands() -> dict[str, str]:
    """Every ``remat-kit`` command shown in README and the docs, each once, with the file
    that first shows it."""
    found: dict[str, str] = {}
    for path in SOURCES:
        for line in _console_lines(path):
            if line.startswith("remat-kit "):
                found.setdefault(line, str(path.relative_to(ROOT)))
    return found


COMMANDS = console_commands()


def input_files(command: str) -> list[str]:
    """The files a command reads, by their path from the repository's root (a factory's
    ``file.py:NAME`` is its file; ``package.module:NAME`` and catalogue names are none)."""
    words = shlex.split(command)
    paths = []
    for flag, value in itertools.pairwise(words):
        if flag in INPUT_FLAGS:
            path = value.split(":")[0]
            if "/" in path or path.endswith((".py", ".json", ".txt", ".yml")):
                paths.append(path)
    return paths


def test_console_commands_are_found_in_readme_and_the_pages():
    sources = set(COMMANDS.values())
    assert "README.md" in sources and any(s.startswith("docs/commands/") for s in sources)
    assert len(COMMANDS) >= 25 and all(c.startswith("remat-kit ") for c in COMMANDS)
    # every command but validate (which needs a GPU) has a page that shows it run
    shown = {shlex.split(c)[1] for c in COMMANDS}
    assert {"compare", "report", "fit", "plan", "advise", "inspect"} <= shown
    assert {"targets", "policies", "models"} <= shown


@pytest.mark.parametrize(
    "command", [c for c in COMMANDS if input_files(c)], ids=lambda c: input_files(c)[0]
)
def test_every_file_a_documented_command_names_exists(command):
    for path in input_files(command):
        assert (ROOT / path).is_file(), f"{COMMANDS[command]}: {command} names {path}"


def test_input_files_finds_factories_steps_and_configs():
    got = input_files(
        "remat-kit compare --model tests/data/hf_llama.py:llama --block a.b:C"
        " --target my-gpu.json --json out.json --step x/own.py:f"
    )
    assert got == ["tests/data/hf_llama.py", "my-gpu.json", "x/own.py"]
    assert input_files("remat-kit report --model llama3-8b --target h100") == []


class _ReachedCompile(BaseException):
    """Raised where the command would hand its first program to XLA (not an Exception, so
    no handler on the way mistakes it for a failure of the command)."""


@pytest.mark.slow
@pytest.mark.parametrize("command", list(COMMANDS), ids=lambda c: "_".join(c.split()[1:4]))
def test_console_command_runs_up_to_its_first_compile(command, tmp_path, monkeypatch):
    """Each command of README and the pages, as written, gets past every check of its flags,
    model, budget and outputs to its first compile (or finishes, for the listings): a stale
    example, a renamed flag or a budget the default precision no longer meets fails here. A
    compile that a budget check asks for (plan's, when only the gradients put the fixed part
    over the budget, compiles ``full``) is the check itself, so it runs for real."""
    import jax

    from remat_kit import _workers
    from remat_kit.cli import main

    real = jax.stages.Lowered.compile

    def budget_checks_only(self, *args, **kwargs):
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_name != "check_budget":
            frame = frame.f_back
        if frame is None:
            raise _ReachedCompile
        return real(self, *args, **kwargs)

    # The pages name files by their path from the repository's root, and run from there;
    # here in a copy, so that what a command writes (--json, --plot) lands in tmp_path.
    for path in input_files(command):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("REMAT_KIT_CACHE_DIR", str(tmp_path / "cache"))  # nothing remembered
    monkeypatch.setattr(jax.stages.Lowered, "compile", budget_checks_only)
    monkeypatch.setattr(_workers, "default_jobs", lambda: 1)  # compiles in this process
    compiles = shlex.split(command)[1] not in ("targets", "policies", "models")
    try:
        code = main(shlex.split(command)[1:])
    except _ReachedCompile:
        code = "compile"
    assert code == ("compile" if compiles else 0), f"{COMMANDS[command]}: {command}"


def test_captured_outputs_are_the_examples_and_readme_shows_them():
    """docs/capture.py's examples, their stored outputs and README's copies agree: a README
    block edited by hand, or an example whose output was never captured, fails here."""
    import capture

    stored = {p.stem for p in (DOCS / "_output").glob("*.txt")}
    assert stored == set(capture.EXAMPLES)
    for name, (command, _) in capture.EXAMPLES.items():
        assert (DOCS / "_output" / f"{name}.txt").read_text().splitlines()[0] == f"$ {command}"
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(
        r"<!-- capture:(\w+) -->\n```\w+\n(.*?)```\n(.*?)<!-- /capture -->", readme, re.S
    )
    assert {name for name, _, _ in blocks} >= {"compare", "library"}
    conditions = json.loads(capture.CONDITIONS.read_text())
    for name, text, note in blocks:
        stored_text = (DOCS / "_output" / f"{name}.txt").read_text()
        assert stored_text.endswith(text), name  # library's drops its "$ python" line
        # a block that shows a time says what load it was taken at
        timed = re.search(r"\b\d+(?:\.\d+)? (?:s|min)\b", text)
        if timed:
            assert note.strip() == capture.conditions_line(conditions[name]), name
            assert "load" in note, name
        else:
            assert not note.strip(), name


def test_flag_tables_hold_every_flag_of_the_commands_help():
    """The generated flag tables against the command's own ``--help`` text (argparse's
    formatter, another reader of the same parser): no flag left out."""
    from cli_flags import flag_rows

    for command in ("compare", "plan", "targets"):
        done = subprocess.run(
            [sys.executable, "-m", "remat_kit.cli", command, "--help"],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        assert done.returncode == 0, done.stderr
        # the options column: each flag where its line starts, as argparse lists them
        names = re.findall(r"^  (-.*?)(?:\s{2,}|$)", done.stdout, re.M)  # aliases too
        in_help = {f for column in names for f in re.findall(r"--[\w-]+", column)} - {"--help"}
        in_tables = {
            flag
            for _, rows in flag_rows(command)
            for cell, _, _ in rows
            for flag in re.findall(r"`(--[\w-]+)`", cell)
        }
        assert in_help == in_tables, command


def test_flag_tables_state_defaults():
    from cli_flags import flag_rows

    rows = {
        cell.split("`")[1]: default
        for _, group in flag_rows("compare")
        for cell, default, _ in group
    }
    assert rows["--batch"] == "4" and rows["--seq"] == "2048"
    assert rows["--no-scan"] == ""  # a switch has no default to state


def test_generated_tables_copy_flags_and_commands_as_shown():
    """Sphinx's smart quotes turned a help text's ``--maxtext`` into "–maxtext" and
    ``'remat-kit[maxtext]'`` into curly quotes (issue 59): the generated tables opt out, as
    Sphinx's own SmartQuotes transform asks of each text node (``is_smartquotable``)."""
    from _tables import table
    from cli_flags import flag_rows
    from docutils import nodes
    from sphinx.util.nodes import is_smartquotable

    texts = [
        text
        for command in ("compare", "report", "fit", "plan", "advise", "inspect", "validate")
        for _, rows in flag_rows(command)
        for text in table(("flag", "default", "what it sets"), rows).findall(nodes.Text)
        if "--" in text or "'" in text
    ]
    assert any("--maxtext " in t for t in texts) and any("'remat-kit[" in t for t in texts)
    assert [t for t in texts if is_smartquotable(t)] == []


def test_results_tables_read_the_results():
    from results_tables import TABLES

    data = json.loads((ROOT / "results" / "gpu_validation.json").read_text())
    header, rows, _ = TABLES["gpu-validation-h100"]()
    assert len(rows) == len(data["rows"]) and len(header) == len(rows[0])
    first = data["rows"][0]
    assert rows[0][2] == f"{first['predicted_peak_bytes'] / 2**30:.2f}"
    assert [r[3] for r in rows].count("out of memory") == sum(r["oom"] for r in data["rows"])
    scale = json.loads((ROOT / "results" / "maxtext_scale.json").read_text())
    _, rows, _ = TABLES["maxtext-scale"]()
    assert [r[0] for r in rows] == [r["name"] for r in scale["rows"]]
    assert [r[-1] for r in rows].count("yes") == sum(r["equal"] for r in scale["rows"])


@pytest.mark.slow
# Sphinx's and MyST's own deprecations of each other's APIs, not the site's: Sphinx's -W below
# is what fails on the site's warnings.
@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_site_builds_with_warnings_as_errors(tmp_path):
    """Every page, the generated flag, results and API tables, every literalinclude and
    cross-reference: a warning fails the build (-W)."""
    from sphinx.cmd.build import build_main

    out = tmp_path / "html"
    code = build_main(["-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)])
    assert code == 0
    pages = {p.relative_to(out).as_posix() for p in out.rglob("*.html")}
    assert {"index.html", "commands/compare.html", "library.html", "claims.html"} <= pages
    # Every flag and command copies as shown (issue 59): no en dash for "--" on any page,
    # and no curly quote in a flag table (help texts name values to type); prose keeps its
    # typography.
    flag_tables = 0
    for page in sorted(pages):
        html = (out / page).read_text()
        assert not re.search(r"\u2013-?[a-z]", html), page
        for t in re.findall(r"<table.*?</table>", html, re.S):
            if "<p>what it sets</p>" in t:
                flag_tables += 1
                assert not re.findall(r".{40}[\u2018\u2019\u201c\u201d].{20}", t), page
    assert flag_tables >= 10  # at least one on each of the ten command pages
    api = (out / "library.html").read_text()
    import remat_kit

    for name in remat_kit.__all__:
        assert f'id="remat_kit.{name}"' in api or f'id="module-remat_kit.{name}"' in api, name
