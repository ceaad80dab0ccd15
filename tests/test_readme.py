"""README's two commands are the ones CI runs, and its library example runs as written. (Its
console commands are run with the pages', in test_docs.py.)"""

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
    assert "offload - " in done.stdout  # the policy it built, named and described
