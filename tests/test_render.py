"""Output that reads at 100 columns (issue 45), from values made by hand: nothing compiles.

The column that is the answer is never cut, a name breaks between its tokens (never ``qu`` /
``ery_proj``), units follow the figures (a tiny model does not read 0.00 GiB and 0.000 s), and
titles name every setting that changed the figures.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
from types import SimpleNamespace as NS

import pytest
from rich.console import Console

import remat_kit as rk
from remat_kit._units import byte_unit, second_unit, seconds, size
from remat_kit.peak import PeakBuffer, PeakReport, Phase
from remat_kit.render import (
    ADVISE_DROP,
    advise_table,
    buffer_table,
    compare_table,
    console,
    fitted,
    peak_table,
    plan_table,
    report_table,
)
from remat_kit.render._wrap import BREAK_AFTER, wrap
from remat_kit.search import Advice, FrontPoint, ScaleOut
from remat_kit.xla import captured_stderr
from tests.helpers import memory_report

WIDTH = 100
KIB, MIB, GIB = 2**10, 2**20, 2**30
TAGS = "attn_out+block_out+context+decoder_layer_input+key_proj+mlpwi_0+mlpwi_1+mlpwo+out_proj"
LONG_POLICY = f"names:save={TAGS}+query_proj+value_proj"
#: A note as compare printed it, its 110-character policy spec last (``qu`` / ``ery_proj``).
NOTE = (
    "megatron: 'megatron' recomputes attention scores/probabilities, which do not exist under "
    f"flash attention (the kernel recomputes them itself): here it is equivalent to {LONG_POLICY}"
)
STEP = "step time (est.): 1.1 ms, 115,819 tok/s, MFU 0%: launch 98%; recomputation 0.3 ms"
GPUS = ["rtx4090", "l40s", "rtx-a6000", "a100-80gb", "a100-40gb", "h100-pcie", "h100-80gb"]
GPUS += ["h200", "b200", "h20", "l4"]
_JOINTS = "".join(BREAK_AFTER)


def _lines(renderable, width: int = WIDTH) -> list[str]:
    out = Console(width=width)
    with out.capture() as captured:
        out.print(renderable)
    return captured.get().splitlines()


def _table_lines(table, width: int = WIDTH) -> list[str]:
    return _lines(fitted(table, width), width)


def _body(lines: list[str]) -> list[str]:
    """The table's body rows (between the header rule and the bottom rule)."""
    start = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    end = next(i for i, line in enumerate(lines) if line.startswith("└"))
    return lines[start + 1 : end]


def _header(lines: list[str]) -> str:
    """The header's words, its lines joined."""
    start = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    end = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    return " ".join(" ".join(lines[start + 1 : end]).split())


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.split("│")[1:-1]]


def _column(lines: list[str], index: int) -> str:
    """A column's text, its rows' lines joined: a name broken over lines reads whole."""
    return "".join(_cells(line)[index] for line in _body(lines))


# --- breaking between tokens --------------------------------------------------------------------


@pytest.mark.parametrize("text", [NOTE, STEP, f"use it: --policy '{LONG_POLICY}'"])
@pytest.mark.parametrize("width", [30, 47, 64, 80, 100])
def test_prose_breaks_between_tokens_and_keeps_a_figure_with_its_unit(text, width):
    lines = wrap(text, width).plain.split("\n")
    assert all(len(line) <= width for line in lines)
    assert "".join(lines).replace(" ", "") == text.replace(" ", "")  # nothing lost
    for before, after in itertools.pairwise(lines):
        # A break inside a word comes after a joint; never in a name's letters or a figure.
        broke_word = text.find(before + after) >= 0 or text.find(before + " " + after) < 0
        if broke_word:
            assert before[-1] in _JOINTS, (before, after)
        assert not (re.search(r"[\d.]$", before) and re.match(r"(ms|s|GiB|MiB)\b", after))
    words = set(re.findall(r"[a-z]+(?:_[a-z0-9]+)+", text))  # query_proj, mlpwi_0 ...
    broken = [w for w in words if all(w not in line for line in lines)]
    assert broken == [] or width < 64, broken  # only a narrow line splits at ``_``


def test_a_token_longer_than_the_line_is_folded_only_then():
    assert wrap("a" * 25, 10).plain.split("\n") == ["a" * 10, "a" * 10, "a" * 5]
    assert wrap("aaaa_bbbb_cccc", 10).plain.split("\n") == ["aaaa_bbbb_", "cccc"]
    assert wrap("long words = name", 12).plain.split("\n") == ["long words", "= name"]


def test_the_console_breaks_a_note_between_tokens(monkeypatch):
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    out = console()
    with out.capture() as captured:
        out.print(f"[yellow]note:[/yellow] {NOTE}")
    lines = captured.get().splitlines()
    assert max(map(len, lines)) <= WIDTH and any("query_proj" in line for line in lines)
    assert not any(line.endswith("qu") for line in lines)


def test_a_tables_title_and_caption_break_between_tokens():
    from rich.table import Table

    table = Table(title=f"plan: {LONG_POLICY}", caption=NOTE)
    table.add_column("policy")
    table.add_row("full")
    lines = _table_lines(table, 60)
    assert max(map(len, lines)) <= 60
    for name in LONG_POLICY.split("=")[1].split("+"):  # the title's and the caption's, whole
        assert sum(bool(re.search(rf"\b{name}\b", line)) for line in lines) == 2, name


# --- units --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (4.2 * MIB, "4.20 MiB"),
        (12 * KIB, "12.00 KiB"),
        (80 * GIB, "80.00 GiB"),
        (3 * 2**40, "3072.00 GiB"),  # GPU memory reads in GiB, however large
        (0, "0 B"),
        (300, "300 B"),  # whole bytes below 1 KiB, not 0.29 KiB
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (None, "-"),
    ],
)
def test_size_is_in_the_unit_of_the_figure(value, words):
    assert size(value) == words


@pytest.mark.parametrize(
    ("value", "words"),
    [(0.0011, "1.1 ms"), (4.2e-5, "42 us"), (2.5, "2.50 s"), (312.4, "312.40 s")],
)
def test_seconds_are_in_the_unit_of_the_figure(value, words):
    assert seconds(value) == words


def test_a_column_shares_the_unit_of_its_largest_figure():
    assert byte_unit([3 * KIB, 2 * MIB, None]).name == "MiB"
    assert byte_unit([3 * KIB, 90 * GIB]).cell(3 * KIB) == "0.00"  # comparable, not rescaled
    assert second_unit([4e-5, 9e-4]).name == "us" and second_unit([4e-5, 0.1]).name == "ms"


def _compare_row(policy: str, peak: int, step: float) -> dict:
    return {
        "policy": policy,
        "schedule": "none",
        "attention": "cudnn",
        "peak_bytes": peak,
        "activation_bytes": peak // 2,
        "host_bytes": 0,
        "saved_vs_none": 0.0,
        "recompute_overhead": 0.2,
        "step_seconds": step,
        "time_vs_none": 0.0,
        "tokens_per_second": 115_819.0,
        "offload_transfer_seconds_est": None,
        "offload_recompute_seconds_est": None,
        "fits": True,
        "fits_with_fraction": None,
        "xla_remat": False,
        "xla_remat_saved_bytes": 0,
        "compile_seconds": 1.0,
    }


OPTS = NS(model="tiny-llama", batch=2, seq=64, optimizer="adamw", lora=0, accum=1, shard=None)
OPTS.precision_record = lambda: None


@pytest.mark.parametrize(
    ("peak", "step", "mem", "time", "cell"),
    [
        (int(3.99 * MIB), 0.0011, "MiB", "ms", "3.99"),  # tiny-llama: not 0.00 GiB, 0.001 s
        (int(145.19 * GIB), 1.85, "GiB", "s", "145.19"),  # llama3-8b at 4 x 2048
    ],
)
def test_compare_columns_are_in_the_unit_of_their_figures(peak, step, mem, time, cell):
    rows = [_compare_row("none", peak, step), _compare_row("full", peak // 2, step / 2)]
    lines = _table_lines(compare_table(rows, rk.target("h100"), OPTS, 1.0))
    assert max(map(len, lines)) <= WIDTH
    header = _header(lines)
    assert f"{mem} ┃" in header and f"step {time}" in header
    first = _cells(_body(lines)[0])
    assert first[0] == "none" and first[1] == cell


def test_compare_offload_estimates_read_in_their_unit_and_still_give_way_first():
    row = _compare_row("offload_dots_no_batch", int(3.89 * MIB), 0.0012)
    row |= {"offload_transfer_seconds_est": 4e-5, "offload_recompute_seconds_est": 1.2e-4}
    table = compare_table([row], rk.target("h100"), OPTS, 1.0)
    wide = _table_lines(table, 300)
    assert "┃ us (est.) ┃" in _header(wide) and "40 / 120" in _cells(_body(wide)[0])
    assert "offload / recompute us (est.)" in " ".join(_lines(fitted(table, WIDTH), WIDTH))


def test_compare_legend_quotes_the_figures_of_its_own_rows():
    # As a 70B compare on an h100 printed it (issue 59): a row that fits at fraction 0.8 and
    # one where XLA's remat pass took 31.2 GiB off; the legend explains them with those figures.
    short = _compare_row("full", 70 * GIB, 1.0) | {"fits": False, "fits_with_fraction": 0.8}
    cut = _compare_row("none", 90 * GIB, 1.0) | {
        "fits": False,
        "xla_remat": True,
        "xla_remat_saved_bytes": int(31.2 * GIB),
    }
    table = compare_table([cut, short], rk.target("h100"), OPTS, 1.0)
    fits = list(table.columns[-2].cells)
    assert fits == ["[red]no[/red], XLA -31.2 GiB", "[red]no[/red] (0.8)"]
    assert "; no (0.8): fits with XLA_PYTHON_CLIENT_MEM_FRACTION=0.8" in table.caption
    assert "; XLA -31.2 GiB: XLA's own rematerialization pass" in table.caption
    assert "0.92" not in table.caption and "1.2 GiB:" not in table.caption.replace("31.2", "")
    # A fraction on a row that fits is no mark in its cell: nothing to explain.
    quiet = compare_table(
        [_compare_row("full", GIB, 1.0) | {"fits_with_fraction": 0.8}], rk.target("h100"), OPTS, 1.0
    )
    assert list(quiet.columns[-2].cells) == ["[green]yes[/green]"]
    assert "MEM_FRACTION=" not in quiet.caption and "XLA -" not in quiet.caption


def test_plan_legend_explains_only_the_marks_its_rows_carry():
    p = NS(budget_bytes=GIB, host_budget_bytes=None, report=None, compiles=2, solver=None,
           source="catalogue", objective="time", label="full", host_bytes=0)  # fmt: skip
    main = f"plan:{GIB}"
    alike = [_point(main, MIB, budget=GIB), _point("dots", MIB, same_as="minimal")]
    caption = plan_table(p, alike, rk.target("h100"), OPTS, plan_seconds=1, seconds=1,
                         compiles=2).caption  # fmt: skip
    assert "* = on the Pareto front; = minimal: the same program as minimal" in caption
    apart = [_point(main, MIB, budget=GIB), _point("none", 2 * MIB, dominated_by=main)]
    caption = plan_table(p, apart, rk.target("h100"), OPTS, plan_seconds=1, seconds=1,
                         compiles=2).caption  # fmt: skip
    assert "* = on the Pareto front" in caption and "the same program" not in caption


# --- the answer column ----------------------------------------------------------------------------


def _over(name: str) -> Advice:
    """llama3-8b, AdamW, mixed precision on one GPU: 120 GiB fixed, over every GPU."""
    parts = {"weights": 30 * GIB, "gradients": 30 * GIB, "optimizer": 60 * GIB}
    t = rk.target(name)
    usable = t.usable_bytes
    hints = [
        {"kind": "sgd", "fixed_bytes": 60 * GIB, "from_bytes": 120 * GIB, "limit_bytes": usable},
        {"kind": "lora", "fixed_bytes": 17 * GIB, "limit_bytes": usable},
        {"kind": "shard", "gpus": 3, "each_bytes": 40 * GIB, "devices": 1, "limit_bytes": usable},
    ]
    return Advice(
        target=name,
        memory_bytes=t.memory_bytes,
        fits=False,
        plan=None,
        peak_bytes=None,
        recompute_overhead=None,
        overhead=None,
        max_batch=0,
        fixed_bytes=sum(parts.values()),
        note=rk.notes.Note(
            "fixed_over_budget",
            {
                "label": name,
                "target": name,
                "limit_bytes": t.usable_bytes,
                "parts": parts,
                "fixed_bytes": sum(parts.values()),
                "compiled_bytes": None,
                "hints": hints,
            },
        ),
        seconds=0.0,
    )


def _fits(name: str) -> Advice:
    """b200, where llama3-8b fits with a plan whose name is long."""
    return Advice(
        target=name,
        memory_bytes=rk.target(name).memory_bytes,
        fits=True,
        plan=LONG_POLICY,
        peak_bytes=int(125.7 * GIB),
        recompute_overhead=0.21,
        overhead=0.05,
        max_batch=6,
        fixed_bytes=120 * GIB,
        note=rk.notes.Note(
            "plan_fits",
            {
                "policy": LONG_POLICY,
                "schedule": "none",
                "budget_bytes": int(133.76 * GIB),
                "peak_bytes": int(125.7 * GIB),
                "recompute_overhead": 0.21,
                "source": "solver",
                "solver": None,
            },
        ),
        seconds=0.0,
    )


@pytest.mark.parametrize("width", [WIDTH, 72])
@pytest.mark.parametrize("scale", [False, True])
def test_advise_keeps_every_gpu_name_whole_and_each_row_on_one_line(scale, width):
    rows = [_over(name) for name in GPUS]
    peak = int(18.7 * GIB)
    fits = {
        "target": "",
        "devices": 8,
        "device": "GPU",
        "peak_bytes": peak,
        "policy": "full",
        "batch": 16,
    }
    scale_out = (
        {
            name: ScaleOut(
                name,
                8,
                16,
                "full",
                peak,
                ((8, peak),),
                rk.notes.Note("scale_out_fits", {**fits, "target": name}),
            )
            for name in GPUS
        }
        if scale
        else None
    )
    lines = _table_lines(
        advise_table(rows, OPTS, headroom=0.0, seconds=9.0, scale_out=scale_out), width
    )
    assert max(map(len, lines)) <= width
    body = _body(lines)
    assert [_cells(line)[0] for line in body] == GPUS  # whole, one line a GPU
    if width == WIDTH:  # at 100 columns what would do instead is whole too, on one line
        instead = [_cells(line)[-1] for line in body]
        assert len(set(instead)) == 1 and "…" not in instead[0] and len(instead[0]) > 10
    assert all("…" not in line for line in body) or width < WIDTH  # narrower: figures give way


def test_advise_explains_the_scale_out_cells_only_where_a_row_shows_a_count():
    peak = int(18.7 * GIB)
    none = {
        "target": "h100-80gb",
        "devices": [8],
        "device": "GPU",
        "peak_bytes": [2 * peak],
        "policy": "full",
    }
    lost = ScaleOut("h100-80gb", None, 8, "full", None, ((8, 2 * peak),),
                    rk.notes.Note("scale_out_none", none))  # fmt: skip
    caption = advise_table([_over("h100-80gb")], OPTS, headroom=0.0, seconds=1.0,
                           scale_out={"h100-80gb": lost}).caption  # fmt: skip
    assert "N x P GiB" not in caption  # the cell reads "none up to 8 GPUs"
    found = dataclasses.replace(lost, devices=8, peak_bytes=peak)
    caption = advise_table([_over("h100-80gb")], OPTS, headroom=0.0, seconds=1.0,
                           scale_out={"h100-80gb": found}).caption  # fmt: skip
    assert "N x P GiB: the fewest GPUs" in caption


def test_advise_with_prices_keeps_its_answer_columns_whole_at_100_columns():
    # As docs/_output/advise.txt: llama3-8b on every GPU, b200 the one that fits, priced;
    # the others' 'instead' is its longest (a bigger GPU among the hints).
    from remat_kit.search import Cost
    from remat_kit.targets import Price

    bigger = {"kind": "bigger_gpu", "gpus": [("b200", int(133.76 * GIB))], "fixed_bytes": 120 * GIB}
    over = []
    for name in GPUS:
        if name != "b200":
            a = _over(name)
            hints = [*a.note.data["hints"][:2], bigger, a.note.data["hints"][2]]
            over.append(dataclasses.replace(
                a, note=rk.notes.Note(a.note.kind, {**a.note.data, "hints": hints})
            ))  # fmt: skip
    rows = [_fits("b200"), *over]
    price = Price(6.79, "RunPod (Secure Cloud)", "https://www.runpod.io/pricing", "2026-10-07")
    costs = {a.target: Cost(a.target, 1, None, None, None) for a in over}
    costs["b200"] = Cost("b200", 1, 60080.0, price, 0.0314)
    table = advise_table(rows, OPTS, headroom=0.0, seconds=9.0, costs=costs)
    lines = _lines(fitted(table, WIDTH, ADVISE_DROP))  # as advise prints it
    assert max(map(len, lines)) <= WIDTH and all("…" not in line for line in _body(lines))
    head = _header(lines)
    for col in ("target", "fits", "plan / why not", "instead", "$/Mtok"):
        assert f" {col} " in head, col  # the answer: shown, and whole
    b200 = _cells(_body(lines)[0])
    assert b200[0] == "b200" and "yes" in b200 and b200[-1] == "0.031"
    assert "SGD, LoRA, bigger GPU, ~3+ GPUs" in _cells(_body(lines)[-1])


def _point(label, peak, same_as=None, dominated_by=None, budget=None):
    # A plan's point is keyed by its budget in bytes (search's data: "plan:<bytes>").
    kind = "catalogue" if budget is None else "plan"
    return FrontPoint(label, kind, peak, 0.1, 0.05, same_as=same_as,
                      dominated=dominated_by is not None, dominated_by=dominated_by,
                      step_seconds=0.0011, budget_bytes=budget)  # fmt: skip


def test_the_plan_row_is_found_by_its_budget_and_each_plan_key_is_worded():
    # Search keys a plan's point by its budget in bytes; the table finds its plan by that
    # budget (not by words two budgets may share) and words every key where it stands.
    p = NS(budget_bytes=GIB, host_budget_bytes=None, report=None, compiles=2, solver=None,
           source="catalogue", objective="time", label="full", host_bytes=0)  # fmt: skip
    points = [
        _point(f"plan:{GIB - 1}", MIB, budget=GIB - 1),  # a swept plan, 1 byte under
        _point(f"plan:{GIB}", 2 * MIB, budget=GIB),
        _point("none", 3 * MIB, dominated_by=f"plan:{GIB}"),
    ]
    table = plan_table(p, points, rk.target("h100"), OPTS, plan_seconds=1, seconds=1,
                       compiles=2)  # fmt: skip
    what, front = list(table.columns[0].cells), list(table.columns[-1].cells)
    assert what == ["PLAN: full", "none", "plan (budget 1024.00 MiB)"]  # catalogue, then plans
    assert " ".join(front[1].split()) == "dominated by plan (budget 1.00 GiB)"


def test_plans_whose_budgets_read_alike_keep_apart():
    from remat_kit.render._front import named_points

    a, b = f"plan:{GIB}", f"plan:{GIB + 1}"
    pts = named_points([_point(a, MIB, budget=GIB), _point(b, MIB, budget=GIB + 1),
                        _point("full", MIB, same_as=b)])  # fmt: skip
    assert [(q.label, q.same_as) for q in pts] == [
        ("plan (budget 1.00 GiB)", None),
        ("plan (budget 1.00 GiB) #2", None),
        ("full", "plan (budget 1.00 GiB) #2"),
    ]


def test_plan_keeps_its_policy_and_the_front_whole_between_tokens():
    p = NS(
        budget_bytes=int(59.38 * GIB),
        host_budget_bytes=None,
        report=None,
        compiles=11,
        solver=None,
        source="catalogue",
        objective="time",
        label=LONG_POLICY,
        host_bytes=0,
    )
    main = f"plan:{p.budget_bytes}"
    points = [
        _point(main, 3 * MIB, budget=p.budget_bytes),
        _point("offload_dots_no_batch", 3 * MIB),
        _point("minimal_offloaded", 3 * MIB, same_as="offload_dots_no_batch"),
        _point("megatron", 4 * MIB, dominated_by=main),
    ]
    lines = _table_lines(
        plan_table(p, points, rk.target("h100"), OPTS, plan_seconds=1, seconds=1, compiles=11)
    )
    assert max(map(len, lines)) <= WIDTH
    assert _column(lines, 0).startswith(f"PLAN: {LONG_POLICY}")  # whole, in order
    assert all("…" not in line for line in _body(lines))
    assert "= offload_dots_no_batch" in [_cells(x)[-1] for x in _body(lines)]  # one line
    assert "3.00" in _cells(_body(lines)[0])  # MiB, not 0.00 GiB
    for line in _body(lines):  # every row's name starts on the line of its mark
        if _cells(line)[-1] == "*":
            assert _cells(line)[0]


def test_inspect_keeps_shapes_whole_and_says_what_it_ran_and_whether_it_fits():
    shape = (4, 2048, 14336)
    buf = PeakBuffer("fusion.12", 2 * 4 * 2048 * 14336, shape, "bf16", "saved activation",
                     "fusion", "jit(step)/mlp", "Llama/decoder/layers/mlp/wi_0/dot_general",
                     "mlpwi_0", "scanned layers", (10, 40), "backward")  # fmt: skip
    r = PeakReport(
        target="h100-80gb", peak_bytes=70 * GIB, live_peak_bytes=69 * GIB,
        fragmentation_bytes=GIB, peak_position=20, peak_instruction="fusion.12",
        peak_op_name="jit(step)/mlp", peak_phase="backward", schedule_length=50,
        argument_bytes=0, output_bytes=0, temp_bytes=0, alias_bytes=0, xla_peak_bytes=None,
        xla_live_peak_bytes=None, buffers=(buf,) * 3, by_category={"saved activation": 69 * GIB},
        by_layer={"scanned layers": 69 * GIB}, timeline=(), phases=(Phase("forward", 0, 19),),
        module="step", jax_version="0", compile_seconds=0.0, parse_seconds=0.0,
        meta={"model": "llama3-8b", "policy": "full", "batch": 4, "seq": 2048,
              "optimizer": "adamw", "lora": 16, "accum": 2, "usable_bytes": int(59.38 * GIB)},
    )  # fmt: skip
    title = peak_table(r).title
    assert title.startswith("peak of llama3-8b b4 s2048 adamw lora16 accum2 / full on h100-80gb")
    rows = dict(zip(peak_table(r).columns[0].cells, peak_table(r).columns[1].cells, strict=True))
    assert rows["fits"] == "NO: 10.62 GiB over the 59.38 GiB usable"
    lines = _table_lines(buffer_table(r, 3))
    assert max(map(len, lines)) <= WIDTH
    assert sum("bf16[4,2048,14336]" in line for line in _body(lines)) == 3
    assert _cells(_body(lines)[0])[0] == "224.0"  # MiB, the column's unit
    assert "┃ MiB ┃" in _header(lines)


def test_report_title_names_every_setting_that_changed_the_figures():
    meta = {"model": "llama3-8b (layers=64)", "batch": 8, "seq": 4096, "optimizer": "sgd",
            "lora": 16, "accum": 4, "mesh": "fsdp:8", "devices": 8}  # fmt: skip
    r = memory_report("h100", peak_bytes=int(4.2 * MIB), meta=meta)
    table = report_table(r, rk.target("h100"))
    assert table.title.startswith(
        "llama3-8b (layers=64) b8 s4096 sgd lora16 accum4 fsdp:8 over 8 GPUs, per GPU policy=full"
    )
    lines = _table_lines(table)
    assert max(map(len, lines)) <= WIDTH
    rows = {c[0]: c[1] for c in map(_cells, _body(lines)) if len(c) == 2}
    assert rows["peak (argument + output + temp - alias)"] == "4.20 MiB"
    assert rows["target memory"] == "79.18 GiB"


# --- no raw XLA line ------------------------------------------------------------------------------


def test_an_xla_message_continued_over_lines_stays_captured(capfd):
    xla = "W1124 02:20:01.1 7 gpu_hlo_schedule.cc:968] first line\n" + " " * 8 + "x" * 136 + "\n"
    warning = "/m.py:3: UserWarning: careful\n  warnings.warn('careful')\n"
    with captured_stderr() as log:
        os.write(2, (xla + warning).encode())
    assert capfd.readouterr().err == warning  # a Python warning is not XLA's: it is shown
    assert len(log.lines) == 4  # XLA's two lines kept for the report's notes


def test_advise_keeps_a_fitting_gpus_long_plan_whole_between_tokens():
    rows = [_over("h100-80gb"), _fits("b200")]
    lines = _table_lines(advise_table(rows, OPTS, headroom=0.0, seconds=9.0))
    assert max(map(len, lines)) <= WIDTH and all("…" not in line for line in _body(lines))
    assert _cells(_body(lines)[0])[0] == "h100-80gb"
    b200 = next(_cells(line) for line in _body(lines) if _cells(line)[0] == "b200")
    plan = next(i for i, c in enumerate(b200) if c.startswith("names:save="))
    assert _column(lines, plan).endswith(LONG_POLICY)  # the b200 plan, whole, in order
    rest = _body(lines)[2:]  # b200's further lines: the plan's, no other cell in fragments
    assert rest and all(c == "" for line in rest for i, c in enumerate(_cells(line)) if i != plan)


def test_the_depth_line_says_its_figures_in_their_units():
    from remat_kit.render import depth_words

    verified = {"mode": "verified", "extrapolated_peak_bytes": 300 * MIB, "peak_error": 0.0123}
    assert depth_words(verified).endswith("extrapolation was 300.00 MiB (+1.23%)")
    copies = {"mode": "extrapolated", "layers": 32, "depths": [2, 3, 4], "section": "layer 1",
              "residual_bytes": 3000}  # fmt: skip
    assert ", largest fit residual 2.93 KiB;" in depth_words(copies)  # 3000 / 1024, not 0.0 MiB
