"""The full-depth report ``by_depth`` reads off shallow copies (remat_kit.sources._depth), on a
source and compiles made by hand: no model is traced and nothing is compiled."""

from __future__ import annotations

import pytest

import remat_kit as rk
from helpers import memory_report
from remat_kit.notes import Note
from remat_kit.sources import _depth as depth

CONFIG = rk.TrainConfig(batch=2, seq=32, optimizer="sgd")
LAYERS = 8


class _Copies:
    """A stack of ``LAYERS`` alike layers whose copies build the depth they hold as their step."""

    def __init__(self, layers=LAYERS):
        self.layers = layers

    def n_layers(self):
        return self.layers

    def at_depth(self, layers):
        return _Copies(layers)

    def mesh_plan(self, t):
        return None

    def layer_kinds(self, t):
        return None

    def build_step(self, pol, sch, config, t):
        return self.layers


def _by_hand(monkeypatch, live, peak, others=(), notes=lambda d: (), t=None):
    """``by_depth`` over ``_Copies`` on compiles made by hand: at ``d`` layers the backward
    pass's start holds ``live(d)`` bytes (beside the ``others`` rows), the compiled peak is
    ``peak(d)`` with ``notes(d)``. Returns (report, record, the depths compiled)."""
    compiled = []

    def rows(directory):
        return [["backward", "before", -1, live(compiled[-1])], *others]

    def compile_step(built, dump_to=None):
        compiled.append(built)
        return memory_report(peak_bytes=peak(built), argument_bytes=0, notes=notes(built))

    monkeypatch.setattr(depth, "_section_rows", rows)
    pol, sch = rk.policy("full"), rk.parse_schedule("none")
    got, record = depth.by_depth(_Copies(), pol, sch, t or rk.target("h100"), CONFIG, compile_step)
    return got, record, compiled


@pytest.mark.parametrize(
    ("over", "frag"),
    [
        ({2: 60, 3: 70}, 70 + 5 * 10),  # the line through 60 and 70, 5 layers past 3
        ({2: -30, 3: 10}, 10 + 5 * 10),  # a peak under its section is 0 over it: 0 and 10
    ],
    ids=["over", "under at 2"],
)
# A copy's other sections hold less than the backward pass's start: the bytes over the peak
# are measured from the largest section, never from a smaller one (the forward pass's start
# here, 400 bytes at every depth: measured from it, the line would run 600 + 100 d higher).
@pytest.mark.parametrize("others", [[], [["forward", "before", -1, 400]]], ids=["one", "two"])
def test_the_peak_adds_the_line_of_the_copies_bytes_over_their_largest_section(
    monkeypatch, over, frag, others
):
    # At d layers the largest section holds 1000 + 100 d bytes live and the compiled peak is
    # over[d] bytes above it (reserved but free): 1800 live at 8 layers, and ``frag`` more.
    got, record, compiled = _by_hand(
        monkeypatch, lambda d: 1000 + 100 * d, lambda d: 1000 + 100 * d + over[d], others
    )
    assert compiled == list(depth.DEPTHS) == [2, 3]
    assert record["mode"] == "extrapolated" and record["fragmentation_bytes"] == frag
    assert got.peak_bytes == 1000 + 100 * LAYERS + frag


def test_the_full_depth_report_words_its_own_notes_and_keeps_the_deepest_copy_s_xla_log(
    monkeypatch,
):
    """A copy's notes are about the copy: the report's own are worded from its figures, and
    of the copies' only the lines XLA's log printed for the deepest copy are kept (screen 97:
    _depth.py:463 ``reports[-1]`` read as ``[-2]``, 479 ``==`` as ``!=``, 480's ``notes=``
    left out)."""

    def notes(d):
        return (
            Note("xla_log", {"line": f"XLA's line at {d} layers"}),
            Note("xla_remat", {"target": "h100-80gb", "saved_bytes": d}),
        )

    line = lambda d: 1000 + 100 * d
    got, record, _ = _by_hand(monkeypatch, line, line, notes=notes)
    assert record["mode"] == "extrapolated" and not got.xla_remat
    assert [n for n in got.notes if n.kind in ("xla_log", "xla_remat")] == [
        Note("xla_log", {"line": "XLA's line at 3 layers"})
    ]


@pytest.mark.parametrize(
    ("layers", "schedule", "copies"),
    [
        (depth.MIN_LAYERS, "none", True),
        (depth.MIN_LAYERS, "every:2", False),
        (None, "none", False),
        (depth.MIN_LAYERS - 1, "none", False),
    ],
)
def test_copies_are_made_only_for_an_unscheduled_stack_of_known_depth(layers, schedule, copies):
    """A segment schedule changes what a layer holds by its place; an unknown depth or one
    under MIN_LAYERS has no line to read (screen 97: _depth.py:356, either ``or`` read as
    ``and``)."""
    got = depth.shallow_copies(_Copies(layers), rk.parse_schedule(schedule), rk.target("h100"))
    assert (got is not None) is copies
    if copies:
        assert [c.layers for c in got] == list(depth.DEPTHS)


@pytest.mark.parametrize(("live_under", "fits"), [(50, False), (150, True)])
def test_the_verdict_counts_the_copies_bytes_over_their_sections(monkeypatch, live_under, fits):
    """At 8 layers the sections' line is ``live_under`` bytes under the H100's usable memory
    and every copy peaks 100 bytes over its largest section: 50 under does not fit, and the
    report says the fraction that would, read at the whole peak (screen 97: _depth.py:473's
    ``+ frag`` read as ``- frag``)."""
    t = rk.target("h100")
    base = t.usable_bytes - live_under - 100 * LAYERS
    got, record, _ = _by_hand(
        monkeypatch, lambda d: base + 100 * d, lambda d: base + 100 * d + 100, t=t
    )
    assert record["fragmentation_bytes"] == 100
    assert got.peak_bytes == t.usable_bytes - live_under + 100
    assert got.fits_with_fraction == (None if fits else t.fraction_to_fit(got.peak_bytes))
    assert got.fits_with_fraction is None or got.fits_with_fraction > t.mem_fraction


def test_the_copies_sections_kept_in_the_cache_are_keyed_by_the_code_that_read_them(
    monkeypatch,
):
    """Sections read by another version of the peak package are not read back: the key's code
    part moves with that package's code (screen 97: _depth.py:493's key read as None, one key
    for every version)."""
    here = depth._sections_code()
    real = depth.cache.code_fingerprint
    monkeypatch.setattr(
        depth.cache,
        "code_fingerprint",
        lambda package: "another version" if package == "remat_kit.peak" else real(package),
    )
    assert isinstance(here, str) and depth._sections_code() not in (here, None)


def test_a_dump_s_sections_are_kept_as_rows_that_read_back_as_they_were(monkeypatch):
    """What the cache keeps of a copy's dump: ``[phase, role, layer, bytes]`` rows, in the
    sections' order, JSON as they are (issue 58 mutant _depth.py:489 of seed 107, killed by
    a compile only)."""
    import json

    from remat_kit.peak import Section

    sections = {
        Section("forward", "layer", 1): 30,
        Section("backward", "before", -1): 70,
        Section("forward", "before", -1): 10,
    }
    monkeypatch.setattr(depth, "live_sections", lambda d: sections if d == "the-dump" else {})
    rows = depth._section_rows("the-dump")
    assert rows == [
        ["backward", "before", -1, 70],
        ["forward", "before", -1, 10],
        ["forward", "layer", 1, 30],
    ]
    assert json.loads(json.dumps(rows)) == rows
