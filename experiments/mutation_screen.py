"""Every one-line mutant of some files, each against only the fast tests that run its line.

``experiments/mutation.py`` draws a seeded sample of the whole library and runs each mutant
against the test files a developer would run after touching it (a hand-written map, 20-30 s
a mutant): it measures the suite. This screen finds *where* the suite is weak: it takes
every mutant of the files named (``mutation.candidates``, the same operators), asks
coverage.py which fast-tier tests ran the mutated line (``pytest --cov-context=test``,
recorded once beforehand) and runs only those, by node id (5-15 s a mutant). A mutant no
test runs the line of (a module-level line, run at import) gets its files' fast tier, as
``mutation.py --tiers`` gives it. Mutants a round already drew (``results/mutation_round_*``)
and those :data:`mutation.EQUIVALENT` proves equivalent are left out.

A survivor here is a candidate, not a verdict: the slow tier or a test that reaches the line
through a fixture's setup may still kill it (the issue-58 count is ``mutation.py``'s).

Usage::

    pip install -e '.[mutation]'   # pytest-cov (coverage.py)
    # once: which fast test runs which line (about 5 minutes on 2 cores)
    COVERAGE_CORE=ctrace python -m pytest -q -n 2 -m "not slow" --cov=remat_kit \\
        --cov-context=test --cov-report= -p no:randomly
    python experiments/mutation_screen.py remat_kit/search/_batch.py \\
        remat_kit/search/_boundary.py --jobs 2 --name mutation_screen_96
    # again, only the last screen's survivors (after tests were added for them)
    python experiments/mutation_screen.py --again results/mutation_screen_96.json \\
        --name mutation_screen_96_after

Writes results/<name>.json: every mutant with its verdict, the tests it ran and the one that
failed; prints each as it ends and a count by operator at the end. (``sys.monitoring``'s
core records no per-test context: ``COVERAGE_CORE=ctrace``.)
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import sys
import tempfile
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import mutation as mu

ROOT = mu.ROOT

#: The operators that survived most in rounds 76-95 first, so that a screen cut short has
#: looked where survivors are likeliest.
FIRST = ("constant", "bool", "boolop", "kwarg", "compare", "return")


def _contexts(data_file: Path) -> Any:
    try:
        import coverage
    except ImportError:
        sys.exit("mutation_screen: coverage.py is missing: pip install -e '.[mutation]'")
    if not data_file.exists():
        sys.exit(f"mutation_screen: no {data_file}: record the contexts first (see --help)")
    data = coverage.CoverageData(str(data_file))
    data.read()
    if len(data.measured_contexts()) < 2:
        sys.exit(f"mutation_screen: {data_file} has no per-test contexts (--cov-context=test)")
    return data


def _drawn() -> set[tuple[str, int, str]]:
    """(path, line, change) of every mutant a sampled round already ran."""
    out = set()
    for p in glob.glob(str(ROOT / "results/mutation_round_*.json")):
        for r in json.loads(Path(p).read_text()).get("mutants", []):
            out.add((r["path"], r["line"], r["change"]))
    return out


def _mutants(files: list[str], again: Path | None) -> list[mu.Mutant]:
    if again is not None:
        # A survivor is found again by its mutated line's text, not its number: a test or a
        # fix that adds lines above it must not drop it from the rerun.
        rows = json.loads(again.read_text())["mutants"]
        keep = {(r["path"], r["change"], r["diff"]) for r in rows if r["status"] == "survived"}
        files = sorted({p for p, _, _ in keep})
    else:
        keep = None
    drawn = _drawn()
    out = []
    for group in mu.MODULES:
        for m in mu.candidates(group, ROOT):
            if m.path not in files or (keep is None and (m.path, m.line, m.change) in drawn):
                continue
            if keep is not None and (m.path, m.change, mu._diff_line(m, ROOT)) not in keep:
                continue
            if mu.judged(m, ROOT) is None and mu._apply_text(m, ROOT) is not None:
                out.append(m)
    rank = {op: i for i, op in enumerate(FIRST)}
    return sorted(out, key=lambda m: (rank.get(m.op, len(FIRST)), m.path, m.line, m.index))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", help="source files, as remat_kit/search/_batch.py")
    ap.add_argument("--again", type=Path, help="a screen's JSON: only its survivors")
    ap.add_argument("--coverage", type=Path, default=ROOT / ".coverage")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant")
    ap.add_argument("--name", default="mutation_screen")
    args = ap.parse_args(argv)
    known = {
        str(p.relative_to(ROOT)) for g in mu.MODULES.values() for p in mu._files(g.sources, ROOT)
    }
    bad = [f for f in args.files if f not in known]
    if bad or not (args.files or args.again):
        sys.exit(f"mutation_screen: name files that mutation.MODULES mutates (not {bad or 'none'})")
    data = _contexts(args.coverage)
    mutants = _mutants(args.files, args.again)
    print(f"{len(mutants)} mutants", flush=True)

    by_file: dict[str, dict[int, list[str]]] = {}
    lock = threading.Lock()

    def tests_of(m: mu.Mutant) -> tuple[str, ...]:
        with lock:  # two jobs may meet a file first at once; coverage's reader is not shared
            if m.path not in by_file:
                by_file[m.path] = data.contexts_by_lineno(str(ROOT / m.path))
        ids = sorted(
            {
                re.sub(r"\|(run|setup|teardown)$", "", c)
                for c in by_file[m.path].get(m.line, [])
                if c
            }
        )
        return (*ids, "-m", "not slow") if ids else mu._tier_targets(m.module, m.path, "fast")

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mutation_screen_") as tmp:
        free = []
        for j in range(args.jobs):
            (Path(tmp) / str(j)).mkdir()
            free.append(mu._copy_tree(Path(tmp) / str(j)))

        def one(m: mu.Mutant) -> None:
            with lock:
                tree = free.pop()
            try:
                targets = tests_of(m)
                r = mu.run_mutant(m, tree, args.timeout, targets=targets)
                r["diff"] = mu._diff_line(m, tree)
                r["tests"] = [t for t in targets if "::" in t] or list(targets)
                if r["status"] != "survived":
                    del r["tail"]  # a survivor's says how many tests passed; the rest, no more
                with lock:
                    rows.append(r)
                    n = len(r["tests"])
                    print(
                        f"[{len(rows)}/{len(mutants)}] {r['status']:8} {m.path}:{m.line}"
                        f" {m.change} ({n} tests, {r['seconds']:.0f} s) {r['test']}",
                        flush=True,
                    )
            finally:
                with lock:
                    free.append(tree)

        with ThreadPoolExecutor(args.jobs) as ex:
            list(ex.map(one, mutants))
    rows.sort(key=lambda r: (r["path"], r["line"], r["index"], r["variant"]))
    ops, alive = (
        Counter(r["op"] for r in rows),
        Counter(r["op"] for r in rows if r["status"] == "survived"),
    )
    out = {
        "files": sorted({r["path"] for r in rows}),
        "mutants": rows,
        "survived": sum(alive.values()),
        "by_op": {k: [alive[k], n] for k, n in ops.items()},
    }
    path = ROOT / "results" / f"{args.name}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    for op, n in ops.most_common():
        print(f"{op:9} {alive[op]:3} of {n:3} lived")
    print(f"{out['survived']} of {len(rows)} lived; {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
