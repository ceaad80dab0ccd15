"""The house's floors: data flows one way, the policy layer at the ground, render and cli on top.

Read from the code's own imports (``ast``), deferred ones inside functions included and those
under ``if TYPE_CHECKING:`` left out (they run nowhere).
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "remat_kit"


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def imports_of(path: Path) -> set[str]:
    """The remat_kit modules ``path`` imports at run time (``from a import b`` names ``a.b``
    too, which is the module where ``b`` is one)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_nodes(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in out if m.split(".")[0] == "remat_kit"}


LIBRARY = sorted(
    p
    for p in PACKAGE.rglob("*.py")
    if not _module(p).startswith(("remat_kit.render", "remat_kit.cli")) and p.name != "__init__.py"
)


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_library_module_reaches_up_into_render_or_cli(path):
    up = {m for m in imports_of(path) if m.startswith(("remat_kit.render", "remat_kit.cli"))}
    assert not up, f"{path.relative_to(ROOT)} imports {sorted(up)}: words belong to the notes"


def test_the_reader_sees_a_deferred_import_and_skips_a_type_only_one(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from remat_kit.analysis import MemoryReport\n"
        "def g():\n    from remat_kit.render import format\n"
    )
    assert imports_of(f) == {"remat_kit.render", "remat_kit.render.format"}


@pytest.mark.slow
def test_the_policy_layer_loads_nothing_of_the_compile_layer():
    # rk.remat on a user's model must not pull XLA's analysis, the cache or the targets in.
    code = (
        "import sys, remat_kit.wrap, remat_kit.schedules\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('remat_kit')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "remat_kit.wrap" in out and "remat_kit.policies" in out
    loaded = {m.split(".")[1] for m in out if m.count(".")}
    assert not loaded & {"analysis", "xla", "cache", "targets", "timing", "render", "cli"}, out


@functools.cache  # read once for the session: three tests walk it (about 2 s each)
def _graph() -> dict[str, set[str]]:
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: {m for m in imports_of(path) if m in modules and m != name}
        for name, path in modules.items()
        # The package's face imports every public name; nothing below imports it back.
        if name != "remat_kit"
    }


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (a list of modules, the first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


#: The floors of the house, ground first (../shared/design.md): a module imports from its own
#: floor or below, never above. Each name is a top-level module or package of remat_kit.
_GROUND = (
    "errors",
    "_switches",
    "_lazy",
    "names",
    "_shapes",
    "_trips",
    "_jaxpr",
    "optimizers",
    "precision",
)
FLOORS = (
    (*_GROUND, "_units"),  # _units: how a figure reads, for the notes and render alike
    ("notes", "policies", "checks"),  # what a policy keeps, its words, no silent no-ops
    ("wrap", "schedules", "tagging", "marks"),  # applying a policy to a model
    ("targets", "xla", "cache"),  # where memory is measured; the compile and its records
    ("timing", "sharding", "flops", "residuals"),
    ("train", "analysis", "peak", "breakdown", "validate", "comparison"),
    ("sources", "_workers"),  # a model source, its Workload; compiles in worker processes
    ("search",),
    ("autoplan",),  # remat decided in the run: the step wrapper over the planner
    ("render",),
    ("cli",),
)


def _floor_of(module: str) -> int:
    top = module.split(".")[1]
    return next(i for i, names in enumerate(FLOORS) if top in names)


def _arrows_up(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from a module to one on a higher floor (the package's face left out: it
    re-exports every floor's public names)."""
    return sorted(
        (a, b)
        for a, targets in graph.items()
        for b in targets
        if b != "remat_kit" and _floor_of(b) > _floor_of(a)
    )


def test_every_module_stands_on_a_floor():
    tops = {m.split(".")[1] for m in _graph() if m.count(".")}
    placed = {name for names in FLOORS for name in names}
    assert tops <= placed, f"place {sorted(tops - placed)} on a floor of FLOORS"


def test_no_import_runs_back_up_a_floor():
    assert _arrows_up(_graph()) == []


def test_an_arrow_up_is_found_where_there_is_one():
    graph = {"remat_kit.wrap": {"remat_kit.analysis", "remat_kit.policies", "remat_kit"}}
    assert _arrows_up(graph) == [("remat_kit.wrap", "remat_kit.analysis")]


def test_no_import_circle():
    assert _circle(_graph()) is None, " -> ".join(_circle(_graph()) or [])


def test_a_circle_is_found_where_there_is_one():
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


# --- docs/architecture.md, checked against the code ---------------------------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _doc_paths(text: str) -> set[str]:
    """Every file or folder the doc names in backticks: ``remat_kit/...``, ``tests/...``, and
    ``notes/_note.py`` style paths inside the package."""
    tops = ("remat_kit", "tests", "experiments", "docs", "models")
    found = set(re.findall(rf"`((?:{'|'.join(tops)})/[\w/.]*)`", text))
    inside = re.findall(r"`((?:[a-z_]+/)+_?\w+\.py)`", text)
    return found | {f"remat_kit/{p}" for p in inside if p.split("/")[0] not in tops}


def test_every_path_the_architecture_names_exists():
    paths = _doc_paths(ARCHITECTURE.read_text())
    assert len(paths) >= 15, sorted(paths)  # the reader found them
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names {missing}, which do not exist"


def _doc_floors(text: str) -> tuple[tuple[str, ...], ...]:
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", text, re.M)
    assert [int(n) for n, _ in rows] == list(range(len(rows))), rows
    return tuple(tuple(re.findall(r"`(\w+)`", names)) for _, names in rows)


def test_the_architectures_floor_table_is_floors():
    assert _doc_floors(ARCHITECTURE.read_text()) == FLOORS


def _package_block(text: str) -> dict[str, set[str]]:
    """The doc's ``The package`` listing: each ``remat_kit`` folder and the private modules
    its line names (``_report``, ``_parser`` ...)."""
    block = text.split("## The package", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    named: dict[str, set[str]] = {}
    folder = None
    for line in block.splitlines():
        head = re.match(r"^  (\w+)/ ", line)
        if head:
            folder = head.group(1)
            named.setdefault(folder, set())
        elif re.match(r"^\S", line):
            folder = None  # models/, experiments/, docs/: outside the package
        if folder is not None:
            body = line[head.end() :] if head else line
            named[folder] |= set(re.findall(r"(?<![\w.])(_[a-z][a-z_]*)\b", body))
    return named


def test_every_module_the_package_listing_names_exists():
    named = _package_block(ARCHITECTURE.read_text())
    assert {"cli", "render", "search", "sources", "policies"} <= set(named)
    assert "_report" in named["cli"] and "_families" in named["policies"]
    missing = sorted(
        f"remat_kit/{folder}/{m}"
        for folder, modules in named.items()
        for m in modules
        if not (PACKAGE / folder / f"{m}.py").exists() and not (PACKAGE / folder / m).is_dir()
    )
    missing += [f"remat_kit/{folder}/" for folder in named if not (PACKAGE / folder).is_dir()]
    block = ARCHITECTURE.read_text().split("## The package", 1)[1]
    files = re.findall(r"^  (\w+\.py) ", block, re.M)  # a top-level module (_units.py)
    assert "_units.py" in files
    missing += [f"remat_kit/{f}" for f in files if not (PACKAGE / f).exists()]
    assert not missing, f"docs/architecture.md's package listing names {missing}"


def test_every_table_the_architecture_names_is_defined_where_it_says():
    # "`GPU_FACTS` in `remat_kit/targets/_catalogue.py`", "`KINDS` (`notes/_note.py`".
    text = ARCHITECTURE.read_text()
    pairs = re.findall(r"`(_?[A-Z][A-Z0-9_]+)`(?: in| of)? \(?`([\w/.]+\.py)`", text)
    assert len(pairs) >= 6, pairs
    for name, where in pairs:
        path = ROOT / where if (ROOT / where).exists() else PACKAGE / where
        source = path.read_text()
        assert re.search(rf"^{name}\b[^=\n]*=", source, re.M), f"no {name} in {where}"


# --- figures read through remat_kit/_units.py -----------------------------------------------------

_UNIT_WORDS = ("TiB", "GiB", "MiB", "KiB")

#: Modules that still turn bytes into a unit by hand (a ratchet: a new one fails the test
#: below). The budgets' errors (autoplan/_budget.py, search/_budget.py) and the memory
#: fraction's (targets/_core.py) give a budget or a limit in the GiB a user types it in;
#: xla/_compile.py restates libtpu's own out-of-memory figures, which it gives to 0.01 GiB.
HAND_FORMATTED = {
    "remat_kit/autoplan/_budget.py",
    "remat_kit/search/_budget.py",
    "remat_kit/targets/_core.py",
    "remat_kit/xla/_compile.py",
}


def hand_formatted(path: Path) -> list[int]:
    """Lines of ``path`` where an f-string divides a figure and names a byte unit after it
    (``f"{n / 2**30:.2f} GiB"``): a size worded outside :mod:`remat_kit._units`."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.JoinedStr):
            continue
        for value, after in zip(node.values, node.values[1:], strict=False):
            divides = isinstance(value, ast.FormattedValue) and (
                isinstance(value.value, ast.BinOp) and isinstance(value.value.op, ast.Div)
            )
            unit = isinstance(after, ast.Constant) and str(after.value).lstrip().startswith(
                _UNIT_WORDS
            )
            if divides and unit:
                lines.append(node.lineno)
    return lines


def test_sizes_are_worded_by_units_alone():
    found = {
        str(p.relative_to(ROOT))
        for p in PACKAGE.rglob("*.py")
        if p.name != "_units.py" and hand_formatted(p)
    }
    new = sorted(found - HAND_FORMATTED)
    assert not new, f"word sizes with remat_kit._units (size, gib): {new}"


def test_a_size_worded_by_hand_is_found(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('a = f"{n / 2**20:.1f} MiB"\nb = f"{n:.1f} MiB"\nc = f"{n / 2} items"\n')
    assert hand_formatted(f) == [1]


# --- the docstring examples the root conftest.py marks slow ----------------------------------


def _slow_examples() -> frozenset[str]:
    """``SLOW_EXAMPLES`` of the root conftest.py, read from its text (the tests' own conftest
    is the module named ``conftest`` here)."""
    tree = ast.parse((ROOT / "conftest.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "SLOW_EXAMPLES":
            return frozenset(ast.literal_eval(node.value.args[0]))
    raise AssertionError("conftest.py sets no SLOW_EXAMPLES")


def _example_docstring(name: str) -> str | None:
    """The docstring pytest's doctest item ``name`` runs (``pkg.module.Class.method``), or
    None where no file or definition of that name is."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                node: ast.AST = ast.parse(path.read_text())
                for attr in parts[cut:]:
                    node = next(
                        (
                            n
                            for n in getattr(node, "body", [])
                            if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == attr
                        ),
                        None,
                    )
                    if node is None:
                        return None
                return ast.get_docstring(node)
    return None


def test_every_slow_example_names_an_example_there_is():
    # A renamed function or a moved module leaves its name here marking nothing: its
    # example, compiles and all, would be back in the fast tier unseen.
    assert "remat_kit.search._fit.fit_each" in _slow_examples()
    stale = sorted(n for n in _slow_examples() if ">>>" not in (_example_docstring(n) or ""))
    assert stale == [], f"SLOW_EXAMPLES names no docstring example: {stale}"


@pytest.mark.parametrize(
    ("name", "found"),
    [
        ("remat_kit.search._fit.fit_each", True),
        ("remat_kit.search._fit", True),  # a module's own docstring
        ("remat_kit.search._fit.no_such_function", False),
        ("remat_kit.render._tables.compare_rows", False),  # moved to remat_kit.comparison
        ("models.measure", False),
    ],
)
def test_an_example_is_found_by_the_name_pytest_gives_it(name, found):
    assert (">>>" in (_example_docstring(name) or "")) is found
