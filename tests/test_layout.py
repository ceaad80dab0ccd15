"""Tables laid out for the terminal: columns dropped in order, titles wrapped at words."""

import pytest
from rich.console import Console
from rich.table import Table

from remat_kit.render import DROP_FIRST, console, fitted

TITLE = "llama3-8b b4 s2048 adamw on h100-80gb (79.18 GiB), attention=cudnn, precision mixed"
HEADERS = ["policy", "peak\nGiB", "activations\nGiB", "fits", "compile\ns", "tok/s"]
ROW = ["offload_dots_no_batch", "145.19", "85.36", "no (0.83), XLA -1.0", "12.5", "8,783"]


def _table():
    t = Table(title=TITLE, caption="fits = peak <= 59.38 GiB of the 79.18 GiB of h100-80gb")
    for h in HEADERS:
        t.add_column(h)
    t.add_row(*ROW)
    return t


def _print(renderable, width):
    out = Console(width=width, record=True)
    with out.capture() as captured:
        out.print(renderable)
    return captured.get()


def _header_line(text):
    """The header's words (a header may take several lines)."""
    return " ".join(line for line in text.splitlines() if line.startswith("┃"))


# The natural widths, counted by hand: each column is its widest cell or header line plus 3
# (two spaces of padding and a rule), plus the closing rule.
WIDTHS = {"policy": 24, "peak": 9, "activations": 14, "fits": 22, "compile": 10, "tok/s": 8}
FULL = sum(WIDTHS.values()) + 1


@pytest.mark.parametrize(
    "width, gone",
    [
        (FULL, []),
        (FULL - 1, ["compile s"]),
        (FULL - WIDTHS["compile"], ["compile s"]),
        (FULL - WIDTHS["compile"] - 1, ["compile s", "activations GiB"]),
        (
            FULL - WIDTHS["compile"] - WIDTHS["activations"] - 1,
            ["compile s", "activations GiB", "tok/s"],
        ),
    ],
)
def test_columns_go_in_the_order_named_until_the_table_fits(width, gone):
    text = _print(fitted(_table(), width), width)
    header = _header_line(text)
    for h in HEADERS:
        name = h.split("\n")[0]
        assert (name in header) == (" ".join(h.split()) not in gone), (name, header)
    if gone:
        said = f"not shown at {width} columns: {', '.join(gone)} (--wide shows all)"
        assert said in " ".join(text.split())
    else:
        assert "not shown" not in text
    assert max(len(line) for line in text.splitlines()) <= width


def test_columns_not_named_are_kept_even_when_the_table_is_too_wide():
    text = _print(fitted(_table(), 40), 40)
    header = _header_line(text)
    assert all(name in header for name in ("policy", "peak", "fits"))
    assert "145.19" in text and "no (0.83)," in text


@pytest.mark.parametrize("width", [50, 70, 100])
def test_title_and_caption_wrap_at_the_terminal_width_between_words(width):
    text = _print(fitted(_table(), width), width)
    lines = text.splitlines()
    title_lines = lines[: lines.index(next(line for line in lines if line.startswith("┏")))]
    assert " ".join(" ".join(title_lines).split()) == TITLE  # no word cut in two
    assert all(len(line) <= width for line in lines)
    assert " ".join(text.split()).count("fits = peak <= 59.38 GiB") == 1


def test_the_table_given_is_not_changed():
    t = _table()
    _print(fitted(t, 40), 40)
    assert [c.header for c in t.columns] == HEADERS
    assert t.title == TITLE and t.caption is not None


def test_drop_order_names_no_column_that_is_the_answer():
    for answer in ("policy", "peak GiB", "fits", "step s (est.)", "max batch", "plan"):
        assert answer not in DROP_FIRST


@pytest.mark.parametrize(
    "env, wide, expected", [({"COLUMNS": "100"}, False, 100), ({}, False, 150), ({}, True, 1000)]
)
def test_console_width_follows_columns_then_the_terminal(monkeypatch, env, wide, expected):
    monkeypatch.delenv("COLUMNS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert console(wide).width == expected  # pytest's stdout is not a terminal


@pytest.mark.slow
def test_compare_prints_within_a_100_column_terminal(monkeypatch, capsys):
    from remat_kit.cli import main

    monkeypatch.setenv("COLUMNS", "100")
    argv = ["compare", "--model", "tiny-llama", "--layers", "2", "--batch", "2", "--seq", "64"]
    argv += ["--jobs", "1", "--policies", "none,full,offload_dots_no_batch"]
    assert main(argv) == 0
    narrow = capsys.readouterr().out
    assert max(len(line) for line in narrow.splitlines()) <= 100
    assert "not shown at 100 columns: compile s" in narrow
    assert main([*argv, "--wide"]) == 0
    wide = capsys.readouterr().out
    assert "compile" in _header_line(wide) and "not shown" not in wide
