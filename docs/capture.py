"""Runs every documented example and stores what it printed: the pages' and README's output.

Each example of ``EXAMPLES`` runs as a user runs it (``remat-kit ...`` in a fresh process, from
the repository's root, ``COLUMNS=100``, an empty cache directory, so the figures and the times
are a first run's); its output goes to ``docs/_output/NAME.txt``, first line ``$ COMMAND``, and
the pages include that file. README's copies sit between ``<!-- capture:NAME -->`` and
``<!-- /capture -->`` and are rewritten from the same file. ``library`` is README's library
example (the ``## As a library`` section's Python), run with ``python``.

Compiles take seconds to minutes each: the examples run one at a time. The conditions of each
run (date, cores, the machine's load before and after, its wall time) go to
``docs/_output/captured.json``, and README states them under each block that shows a time:
the times are a loaded 2-core machine's unless that line says otherwise.

    python docs/capture.py            # every example
    python docs/capture.py fit plan   # only these
    python docs/capture.py --readme   # README's blocks from the stored files, nothing run
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "_output"
README = ROOT / "README.md"

#: name -> the command, as the pages show it, and the exit code it must end with.
EXAMPLES: dict[str, tuple[str, int]] = {
    # a step that does not fit one way (none) made to fit another (every policy)
    "compare": (
        "remat-kit compare --model llama3-8b --target h100 --gpus 8 --shard fsdp:8"
        " --batch 32 --seq 2048",
        0,
    ),
    "report": (
        "remat-kit report --model llama3-8b --target h100 --gpus 8 --shard fsdp:8"
        " --batch 32 --seq 2048 --policy minimal",
        0,
    ),
    "fit": (
        "remat-kit fit --model gpt2-medium --target rtx4090 --seq 512 --policies none,full,minimal",
        0,
    ),
    "plan": (
        "remat-kit plan --model llama3-8b --target h100 --batch 4 --seq 2048 --optimizer sgd"
        " --precision bf16 --budget 52GiB",
        0,
    ),
    "advise": ("remat-kit advise --model llama3-8b --batch 8 --seq 2048", 0),
    "inspect": (
        "remat-kit inspect --model llama3-8b --target h100 --batch 4 --seq 2048 --optimizer sgd"
        " --precision bf16 --policy minimal",
        0,
    ),
    "targets": ("remat-kit targets", 0),
    "policies": ("remat-kit policies", 0),
    "models": ("remat-kit models", 0),
    "library": ("python example.py", 0),
}

_BLOCK = re.compile(r"(<!-- capture:(\w+) -->\n)(.*?)(<!-- /capture -->)", re.S)

#: The conditions each example was captured under (see the module docstring).
CONDITIONS = OUTPUT / "captured.json"

#: A printed time (``103.2 s``, ``1.5 min``): blocks that show one state their conditions.
_TIME = re.compile(r"\b\d+(?:\.\d+)? (?:s|min)\b")


def conditions_line(entry: dict[str, object]) -> str:
    """README's line under a block with times: how they were taken.

    Example:
      >>> conditions_line({"date": "2026-11-29", "cores": 2, "load_before": 1.52,
      ...                  "load_after": 2.9, "seconds": 103.2})
      'Captured 2026-11-29 from an empty cache on 2 cores at load 1.5-2.9 (1-minute average).'
    """
    lo, hi = sorted((float(entry["load_before"]), float(entry["load_after"])))
    return (
        f"Captured {entry['date']} from an empty cache on {entry['cores']} cores at load "
        f"{lo:.1f}-{hi:.1f} (1-minute average)."
    )


def library_code(readme: str) -> str:
    """README's library example: the first Python block of its ``## As a library`` section.

    Args:
      readme: README's text.

    Returns:
      The example's code.
    """
    section = readme[readme.index("## As a library") :]
    return re.search(r"```python\n(.+?)\n```", section, re.S).group(1)


def _run(name: str, cache: Path) -> str:
    command, expected = EXAMPLES[name]
    env = {**os.environ, "COLUMNS": "100", "REMAT_KIT_CACHE_DIR": str(cache)}
    if name == "library":
        env.pop("JAX_PLATFORMS", None)  # as a user runs it: the example says what it needs
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "example.py"
            script.write_text(library_code(README.read_text()) + "\n")
            argv = [sys.executable, str(script)]
            done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    else:
        argv = [sys.executable, "-m", "remat_kit.cli", *shlex.split(command)[1:]]
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != expected:
        raise RuntimeError(f"exit {done.returncode}, expected {expected}\n{done.stderr[-2000:]}")
    # stderr holds the notes and the progress a terminal would show beside the tables
    return f"$ {command}\n{done.stdout}{done.stderr}".rstrip() + "\n"


def refresh_readme() -> None:
    """Rewrites README's captured blocks from ``docs/_output``."""

    def block(match: re.Match[str]) -> str:
        path = OUTPUT / f"{match.group(2)}.txt"
        if not path.exists():  # not captured yet: the block stays as it is
            return match.group(0)
        text = path.read_text()
        lang = "text" if match.group(2) == "library" else "console"
        if lang == "text":  # the example's code is above it: only what it printed
            text = text.split("\n", 1)[1]
        note = ""
        entry = conditions.get(match.group(2))
        if entry is not None and _TIME.search(text):
            note = f"\n{conditions_line(entry)}\n"
        return f"{match.group(1)}```{lang}\n{text}```\n{note}{match.group(4)}"

    conditions = json.loads(CONDITIONS.read_text()) if CONDITIONS.exists() else {}
    README.write_text(_BLOCK.sub(block, README.read_text()))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "names", nargs="*", help=f"examples to run (default: all: {list(EXAMPLES)})"
    )
    parser.add_argument("--readme", action="store_true", help="only rewrite README's blocks")
    args = parser.parse_args(argv)
    unknown = set(args.names) - set(EXAMPLES)
    if unknown:
        parser.error(f"unknown examples {sorted(unknown)}; known: {list(EXAMPLES)}")
    failed = []
    if not args.readme:
        OUTPUT.mkdir(exist_ok=True)
        conditions = json.loads(CONDITIONS.read_text()) if CONDITIONS.exists() else {}
        with tempfile.TemporaryDirectory() as cache:
            for name in args.names or EXAMPLES:
                start, load_before = time.perf_counter(), os.getloadavg()[0]
                try:  # a failed example keeps its last output; the others still run
                    text = _run(name, Path(cache) / name)
                except RuntimeError as err:
                    failed.append(name)
                    print(f"{name}: {err}", file=sys.stderr)
                    continue
                seconds = time.perf_counter() - start
                (OUTPUT / f"{name}.txt").write_text(text)
                conditions[name] = {
                    "date": datetime.date.today().isoformat(),
                    "cores": os.cpu_count(),
                    "load_before": round(load_before, 2),
                    "load_after": round(os.getloadavg()[0], 2),
                    "seconds": round(seconds, 1),
                }
                CONDITIONS.write_text(json.dumps(conditions, indent=1, sort_keys=True) + "\n")
                print(f"{name}: {seconds:.1f} s", file=sys.stderr)
    refresh_readme()
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)} (their files were left as they were)")


if __name__ == "__main__":
    main()
