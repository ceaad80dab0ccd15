"""The shallow copies' arithmetic against exact oracles over random inputs.

``fit_sections`` (the full-depth peak from each section's line through the copies) and
``line_at`` (the line through two copies' figures, kept in type) are checked here against
computations written apart from them: least squares in exact fractions by the closed form
of a simple regression, sections grouped by hand. Hundreds of random stacks (seeded: the
same every run) reach the combinations the worked examples of tests/test_depth.py do not:
three phases at once, stretches that run some layers only, two to four copies at uneven
depths, lines that fall with depth.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from fractions import Fraction

import pytest

from remat_kit.peak import Section
from remat_kit.sources import _depth as depth

PHASES = ("forward", "backward", "optimizer")
DEPTH_SETS = ((2, 3), (2, 3, 4), (1, 2), (2, 4), (2, 3, 5), (3, 5, 6, 8))


def _regression(points: dict[int, int], at: int) -> tuple[Fraction, Fraction]:
    """The least-squares line through ``points`` (depth -> bytes), exactly: its value at
    ``at`` and its largest residual."""
    xs = [Fraction(x) for x in points]
    ys = [Fraction(points[x]) for x in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    intercept = my - slope * mx
    residual = max(abs(intercept + slope * x - y) for x, y in zip(xs, ys, strict=True))
    return intercept + slope * at, residual


def _oracle(by_depth: dict[int, dict[Section, int]], layers: int):
    """The fit, written from the contract: None, or (every line's (value, residual, label))."""
    depths = sorted(by_depth)
    if len(depths) < 2:
        return None
    layer_ids = {
        (d, p): {s.layer for s in by_depth[d] if s.role == "layer" and s.phase == p}
        for d in depths
        for p in PHASES
    }
    spans = {p for (d, p), ks in layer_ids.items() if ks and ks != set(range(d))}
    series: dict[str, dict[int, int]] = {}
    for d in depths:
        for p in PHASES:
            for role in ("before", "after"):
                if Section(p, role) in by_depth[d]:
                    series.setdefault(f"{p}, {role} the layers", {})[d] = by_depth[d][
                        Section(p, role)
                    ]
            values = (
                [by_depth[d][Section(p, "layer", k)] for k in range(d)]
                if (layer_ids[(d, p)] == set(range(d)))
                else None
            )
            if p in spans:
                if layer_ids[(d, p)]:
                    held = max(by_depth[d][Section(p, "layer", k)] for k in layer_ids[(d, p)])
                    series.setdefault(f"{p}, spans some layers", {})[d] = held
            elif values:
                if any(v > max(values[0], values[-1]) for v in values[1:-1]):
                    return None
                series.setdefault(f"{p}, layer 0", {})[d] = values[0]
                series.setdefault(f"{p}, layer {layers - 1}", {})[d] = values[-1]
    if not series or any(sorted(pts) != depths for pts in series.values()):
        return None
    return [(*_regression(pts, layers), label) for label, pts in series.items()]


def _stack(rng: random.Random) -> tuple[dict[int, dict[Section, int]], int]:
    """A random set of copies: phases, stretches, lines that rise or fall, noise, and now
    and then a copy that breaks the premise (an inner layer peaking, a section missing)."""
    depths = rng.choice(DEPTH_SETS)
    layers = rng.randrange(8, 97)
    noisy = len(depths) > 2 and rng.random() < 0.5

    def line() -> Callable[[int], int]:
        a, b = rng.randrange(0, 10**6), rng.randrange(-(10**4), 10**5)
        return lambda d: a + b * d + (rng.randrange(-300, 301) if noisy else 0)

    out: dict[int, dict[Section, int]] = {d: {} for d in depths}
    for p in rng.sample(PHASES, rng.randrange(1, 4)):
        for role in ("before", "after"):
            if rng.random() < 0.7:
                f = line()
                for d in depths:
                    out[d][Section(p, role)] = f(d)
        if rng.random() < 0.2:
            continue  # no layers in this phase
        first, last = line(), line()
        some = rng.random() < 0.15  # a stretch that runs some layers only
        for d in depths:
            ends = (first(d), last(d))
            ks = list(range(d))
            if some and d > 1:
                ks = sorted(rng.sample(ks, rng.randrange(1, d)))
            for k in ks:
                if k == 0 or k == d - 1:
                    value = ends[0] if k == 0 else ends[1]
                else:  # inner layers hold less than the larger end, now and then as much or more
                    value = max(ends) + rng.choice([-rng.randrange(1, 5000)] * 12 + [7, 0])
                out[d][Section(p, "layer", k)] = value
    if rng.random() < 0.05 and any(out.values()):
        d = rng.choice([d for d in depths if out[d]])
        del out[d][rng.choice(sorted(out[d], key=repr))]  # a section one copy lacks
    return out, layers


@pytest.mark.parametrize("seed", range(12))
def test_the_fit_of_random_copies_is_the_exact_fit(seed):
    rng = random.Random(seed)
    refused = 0
    for _ in range(40):
        stack, layers = _stack(rng)
        want = _oracle(stack, layers)
        got = depth.fit_sections(stack, layers)
        if want is None:
            assert got is None, (stack, layers)
            refused += 1
            continue
        assert got is not None, (stack, layers)
        peak = max(v for v, _, _ in want)
        assert abs(got.peak_live_bytes - peak) <= Fraction(1, 2) + Fraction(1, 10**6)
        top = {label for v, _, label in want if abs(v - peak) < Fraction(1, 10**6)}
        assert got.section in top
        # The residual of the lines that could hold the peak: within a millionth of a byte
        # of the line, on either side of the peak, for float's sake.
        eps = Fraction(1, 10**6)
        low = max((r for v, r, _ in want if v + r >= peak + eps), default=Fraction(0))
        high = max(r for v, r, _ in want if v + r >= peak - eps)
        assert low - Fraction(1, 2) - eps <= got.residual_bytes <= high + Fraction(1, 2) + eps
        assert got.depths == tuple(sorted(stack)) and got.layers == layers
        assert got.sections == sum(len(s) for s in stack.values())
    assert refused < 40  # the random stacks are mostly fits


def _exact_line(a, b, da, db, at):
    """The line through (da, a) and (db, b) at ``at``, from its contract."""
    if isinstance(a, bool) or isinstance(b, bool):
        return b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        value = Fraction(b) + (Fraction(b) - Fraction(a)) * (at - db) / (db - da)
        if isinstance(a, int) and isinstance(b, int):
            return round(value)
        return float(value)
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _exact_line(a[k], v, da, db, at) if k in a else v for k, v in b.items()}
    return b


def _figure(rng: random.Random, deep: int = 0):
    kind = rng.choice(["int", "int", "float", "bool", "str", "none"] + ["dict"] * (deep < 2))
    if kind == "int":
        return rng.randrange(-(10**9), 10**12)
    if kind == "float":
        return rng.uniform(-1e6, 1e9)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "str":
        return rng.choice(["attention", "layers_3", ""])
    if kind == "none":
        return None
    return {f"k{i}": _figure(rng, deep + 1) for i in range(rng.randrange(0, 4))}


def _pair(rng: random.Random, deep: int = 0):
    """Two copies' figures: mostly of one type, keys shared, now and then not."""
    a = _figure(rng, deep)
    if isinstance(a, dict):
        b = {}
        for k in a:
            if rng.random() < 0.85:
                a[k], b[k] = _pair(rng, deep + 1)
        if rng.random() < 0.3:
            b["only_deeper"] = _figure(rng, deep + 1)
        return a, b
    if rng.random() < 0.8 and not isinstance(a, bool):
        return a, _figure_like(rng, a)
    return a, _figure(rng, deep)


def _figure_like(rng: random.Random, a):
    if isinstance(a, int):
        return a + rng.randrange(-(10**6), 10**8)
    if isinstance(a, float):
        return a + rng.uniform(-1e5, 1e7)
    return a


@pytest.mark.parametrize("seed", range(6))
def test_the_line_through_two_random_copies_is_the_exact_line(seed):
    rng = random.Random(100 + seed)
    for _ in range(60):
        da = rng.randrange(1, 6)
        db = da + rng.randrange(1, 4)
        at = rng.randrange(db, 129)
        a, b = _pair(rng)
        got = depth.line_at([a, b], (da, db), at)
        want = _exact_line(a, b, da, db, at)
        if isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-9, abs=1e-6), (a, b, da, db, at)
        elif isinstance(want, int) and not isinstance(want, bool):
            # Rounding a float whose exact value lies half way may go either way.
            assert type(got) is int and abs(got - want) <= 1, (a, b, da, db, at)
        elif isinstance(want, dict):
            _assert_close(got, want)
        else:
            assert got == want and type(got) is type(want), (a, b, got, want)


def _assert_close(got, want):
    assert type(got) is type(want) and (not isinstance(want, dict) or got.keys() == want.keys())
    if isinstance(want, dict):
        for k in want:
            _assert_close(got[k], want[k])
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-6)
    elif isinstance(want, int) and not isinstance(want, bool):
        assert abs(got - want) <= 1
    else:
        assert got == want


def test_a_sharded_stack_is_compiled_whole_and_says_so():
    """A source sharded over a mesh builds no copies: full depth, reason ``sharded``, before
    any copy is built (seed-67 mutant _depth.py:422, the reason dropped)."""
    import types

    import remat_kit as rk

    built = []
    source = types.SimpleNamespace(
        n_layers=lambda: 16,
        at_depth=lambda d: built.append(d) or object(),
        mesh_plan=lambda t: ("fsdp", 2),
    )
    got = depth.by_depth(
        source, rk.policy("full"), rk.parse_schedule("none"), rk.target("h100"), None, None
    )
    assert got == (None, {"mode": "full", "reason": "sharded"})
    assert built == [depth.DEPTHS[0]]  # asked whether it can build one, and no more


# --- by_depth's decisions and its report, on sources and compiles made by hand -------------


class _Source:
    """A stack whose copies build their depth as their step (see ``_by_depth_case``)."""

    def __init__(self, layers, copies_at, plan, kinds):
        self.layers, self.copies_at, self.plan, self.kinds = layers, copies_at, plan, kinds

    def n_layers(self):
        return self.layers

    def at_depth(self, d):
        return _Copy(d) if d in self.copies_at else None

    def mesh_plan(self, t):
        return self.plan

    def layer_kinds(self, t):
        return self.kinds


class _Copy:
    def __init__(self, d):
        self.d = d

    def build_step(self, pol, sch, config, t):
        return self.d


def _by_depth_case(rng):
    """A random source, policy, schedule, copies' figures, and the record by_depth owes it,
    from the contract (FULL_DEPTH_REASONS, in the order the docstring's checks run)."""
    import remat_kit as rk

    depths = rng.choice([(2, 3), (2, 3, 4), (3, 5)])
    layers = rng.choice([None, 4, 7, 8, 9, 17, 32, 32])
    copies_at = set(depths) if rng.random() < 0.8 else set(rng.sample(depths, len(depths) - 1))
    plan = "fsdp:2" if rng.random() < 0.15 else None
    kinds = rng.choice([None, 1, 1, 1, 2])
    pol = rk.policy(rng.choice(["full"] * 6 + ["offload_dots_no_batch"]))
    sch = rk.parse_schedule(rng.choice(["none"] * 8 + ["every:2"]))
    remat_at = rng.choice([None] * 8 + list(depths))
    stack, _ = _stack(rng)
    stack = {d: sec for d, sec in zip(depths, stack.values(), strict=False)}
    while len(stack) < len(depths):  # a copy the random stack did not make: as the last one
        stack[depths[len(stack)]] = dict(stack[max(stack)])
    if rng.random() < 0.5:  # the figures of a clean stack: one line, no inner peak
        a, b = rng.randrange(10**6), rng.randrange(10**5)
        stack = {
            d: {Section("backward", "layer", k): a + b * d - k for k in range(d)} for d in depths
        }
    if sch.name != "none" or layers is None or layers < 8 or depths[0] not in copies_at:
        want = {}
    elif plan is not None:
        want = {"mode": "full", "reason": "sharded"}
    elif pol.offloads:
        want = {"mode": "full", "reason": "offload"}
    elif (kinds or 1) > 1:
        want = {"mode": "full", "reason": "layers_differ", "kinds": kinds, "layers": layers}
    elif copies_at != set(depths):
        want = {"mode": "full", "reason": "no_copies"}
    elif remat_at is not None:
        want = {"mode": "full", "reason": "xla_remat", "at_layers": remat_at}
    else:
        fit = _oracle(stack, layers)
        if fit is None:
            want = {"mode": "full", "reason": "misaligned"}
        else:
            peak = max(v for v, _, _ in fit)
            residual = max(r for v, r, _ in fit if v + r >= peak)
            if residual > Fraction(5, 1000) * peak + 1:
                want = {"mode": "full", "reason": "not_affine"}
            elif residual < Fraction(5, 1000) * peak - 1:
                want = {"mode": "extrapolated", "peak": peak}
            else:
                want = None  # too close to the tolerance to call by hand: skipped
    return (_Source(layers, copies_at, plan, kinds), pol, sch, depths, stack, remat_at), want


@pytest.mark.parametrize("seed", range(6))
def test_random_stacks_are_read_off_copies_exactly_where_the_contract_allows(monkeypatch, seed):
    import remat_kit as rk
    from helpers import memory_report

    rng = random.Random(500 + seed)
    t = rk.target("h100")
    seen = set()
    for _ in range(60):
        (source, pol, sch, depths, stack, remat_at), want = _by_depth_case(rng)
        if want is None:
            continue
        monkeypatch.setattr(depth, "DEPTHS", depths)
        compiled = []
        figures = {}
        for d in depths:  # each copy's figures: lines in d, a little noise in the peak
            live = max(stack[d].values()) if stack[d] else 0
            figures[d] = memory_report(
                peak_bytes=live + rng.randrange(-50, 5000),
                argument_bytes=1000 + 10 * d,
                output_bytes=20 * d,
                alias_bytes=5 * d,
                host_bytes=0,
                flops=1.5e9 * d,
                compile_seconds=float(d),
                xla_remat=d == remat_at,
                policy=pol.spec,
            )

        def compile_step(built, dump_to=None, compiled=compiled, figures=figures):
            compiled.append(built)
            return figures[built]

        def rows(directory, stack=stack, compiled=compiled):
            return [[s.phase, s.role, s.layer, b] for s, b in stack[compiled[-1]].items()]

        monkeypatch.setattr(depth, "_section_rows", rows)
        got, record = depth.by_depth(source, pol, sch, t, None, compile_step)
        seen.add(want.get("reason", want.get("mode", "none")))
        if want.get("mode") != "extrapolated":
            assert got is None and record == {**want, **record} and record.keys() >= want.keys()
            if want.get("reason") == "not_affine":
                assert record["residual_bytes"] > 0
            else:
                assert record == want, (record, want)
            if want.get("reason") == "xla_remat":
                assert compiled == [d for d in depths if d <= remat_at]
            elif want.get("reason") not in ("misaligned", "not_affine"):
                assert compiled == []
            continue
        # Read off the copies: the figures of the line through the first and last copies,
        # the peak the fit's plus the reserved bytes' line through the last two copies.
        assert compiled == list(depths) and record["mode"] == "extrapolated"
        da, db = depths[0], depths[-1]
        frags = [max(0, figures[d].peak_bytes - max(stack[d].values())) for d in depths]
        frag = max(
            0, round(_exact_line(frags[-2], frags[-1], depths[-2], depths[-1], source.layers))
        )
        assert record["fragmentation_bytes"] == frag
        assert abs(got.peak_bytes - frag - want["peak"]) <= 1
        assert got.peak_bytes == record["peak_live_bytes"] + frag
        for f in ("argument_bytes", "output_bytes", "alias_bytes"):
            line = _exact_line(
                getattr(figures[da], f), getattr(figures[db], f), da, db, source.layers
            )
            assert getattr(got, f) == line
        assert (
            got.temp_bytes
            == got.peak_bytes - got.argument_bytes - got.output_bytes + got.alias_bytes
        )
        assert got.flops == pytest.approx(1.5e9 * source.layers)
        assert got.compile_seconds == da + db and got.xla_peak_bytes is None
        fraction = (
            None if t.fits(got.peak_bytes) is not False else t.fraction_to_fit(got.peak_bytes)
        )
        assert got.fits_with_fraction == fraction
        assert got.meta.depth["layers"] == source.layers and got.meta.depth["depths"] == depths
    assert {"none", "sharded", "extrapolated"} <= seen


@pytest.mark.parametrize("seed", range(3))
def test_a_verdict_is_settled_only_with_the_margin_and_residual_to_spare(seed):
    """``settled``, ``verify`` and ``verify_search`` against their docstrings over random
    peaks, limits and residuals."""
    import remat_kit as rk
    from helpers import memory_report

    rng = random.Random(900 + seed)
    for _ in range(200):
        limit = rng.choice([None, rng.randrange(10**6, 10**9)])
        usable = rng.choice([None, rng.randrange(10**6, 10**9)])
        residual = rng.choice([0, rng.randrange(1, 10**6)])
        peak = rng.randrange(10**5, 10**9)
        mode = rng.choice(["extrapolated", "full", None])
        meta = {} if mode is None else {"depth": {"mode": mode, "residual_bytes": residual}}
        report = memory_report(peak_bytes=peak, meta=meta, usable_bytes=usable, compile_seconds=2.0)
        bound = usable if limit is None else limit
        margin = residual if mode is not None else 0
        calm = bound is None or Fraction(peak) + Fraction(2, 100) * bound + margin < bound
        assert depth.settled(report, limit) is calm
        full = memory_report(peak_bytes=rng.randrange(10**5, 10**9), meta={"x": 1})
        for always in (False, True):
            got = depth.verify(report, functools.partial(lambda r: r, full), limit, always=always)
            if mode != "extrapolated" or (calm and not always):
                assert got is report
                continue
            assert got.peak_bytes == full.peak_bytes and got.meta["x"] == 1
            assert got.meta.depth == {
                "mode": "verified",
                "residual_bytes": residual,
                "extrapolated_peak_bytes": peak,
                "peak_error": pytest.approx(peak / full.peak_bytes - 1),
                "extrapolated_compile_seconds": 2.0,
            }
        searched = depth.verify_search(report, functools.partial(lambda r: r, full), limit)
        assert (searched is report) is (mode != "extrapolated" or (limit is not None and calm))
        assert depth.verify_search(None, functools.partial(lambda r: r, full), limit) is full
        assert depth.extrapolated(report) is (mode == "extrapolated")
    del rk
