"""README's two commands are the ones CI runs."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _commands():
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_opens_with_two_commands():
    first, second = _commands()[:2]
    assert "pip install" in first and "remat-kit compare" in first
    assert "pip install" in second and "pytest" in second


def test_ci_runs_exactly_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _commands()[1] in ci


@pytest.mark.slow
def test_library_example_runs_as_written_without_a_gpu(tmp_path):
    """README's library example, in a fresh process with JAX_PLATFORMS unset, as a user runs it."""
    import os
    import subprocess
    import sys

    text = (ROOT / "README.md").read_text()
    section = text[text.index("## As a library") :]
    code = re.search(r"```python\n(.+?)\n```", section, re.S).group(1)
    script = tmp_path / "example.py"
    script.write_text(code + "\nprint('TAGS', rk.saved_residuals(loss_fn, params, x).tags)\n")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "TAGS {'mlpwi': 'saved'}" in done.stdout
    # it says what it found: the catalogue, the peak and the tags, without a line added
    assert "'minimal'" in done.stdout and re.search(r"peak \d+\.\d\d GiB .*fits: True", done.stdout)
    assert done.stdout.count("{'mlpwi': 'saved'}") == 2


def _console_commands():
    """Every ``$ remat-kit ...`` line of README's console blocks, continuation lines joined,
    ``a | b`` split and trailing ``# comments`` dropped."""
    text = (ROOT / "README.md").read_text()
    lines = []
    for block in re.findall(r"```console\n(.+?)\n```", text, re.S):
        for cmd in re.findall(r"^\$ (.+?)(?<!\\)$", block.replace("\\\n", " "), re.M):
            lines += [part.strip() for part in re.sub(r"\s+#.*$", "", cmd).split(" | ")]
    return lines


class _ReachedCompile(BaseException):
    """Raised where the command would hand its first program to XLA (not an Exception, so
    no handler on the way mistakes it for a failure of the command)."""


def test_readme_shows_console_commands_to_check():
    commands = _console_commands()
    assert len(commands) >= 12 and all(c.startswith("remat-kit ") for c in commands)
    assert {"remat-kit targets", "remat-kit policies", "remat-kit models"} <= set(commands)


@pytest.mark.slow
@pytest.mark.parametrize("command", _console_commands(), ids=lambda c: "_".join(c.split()[1:4]))
def test_readme_console_command_runs_up_to_its_first_compile(command, tmp_path, monkeypatch):
    """Each command of README, as written, gets past every check of its flags, model, budget
    and outputs to its first compile (or finishes, for the listings): a stale example, a
    renamed flag or a budget the default precision no longer meets fails here. A compile that
    a budget check asks for (plan's, when only the gradients put the fixed part over the
    budget, compiles ``full``) is the check itself, so it runs for real."""
    import shlex
    import shutil
    import sys

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

    # README names them by their path in the repository, from its root.
    (tmp_path / "tests" / "data").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "data" / "hf_llama.py", tmp_path / "tests" / "data")
    shutil.copy(ROOT / "tests" / "data" / "own_steps.py", tmp_path / "tests" / "data")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("REMAT_KIT_CACHE_DIR", str(tmp_path / "cache"))  # nothing remembered
    monkeypatch.setattr(jax.stages.Lowered, "compile", budget_checks_only)
    monkeypatch.setattr(_workers, "default_jobs", lambda: 1)  # compiles in this process
    compiles = shlex.split(command)[1] not in ("targets", "policies", "models")
    try:
        code = main(shlex.split(command)[1:])
    except _ReachedCompile:
        code = "compile"
    assert code == ("compile" if compiles else 0), command
