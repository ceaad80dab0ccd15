"""rk.inspect: what is live at the peak of a compiled train step, and when.

Each GPU compile costs seconds, so the SMALL model is compiled once per policy
(minimal, none) for the session, plus once each for an offload policy and for unrolled
layers; the parser tests read synthetic dump text.
"""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

import remat_kit as rk
import remat_kit.render
import remat_kit_models as models
from conftest import SMALL, small_request
from remat_kit._jaxpr import open_jaxpr, sub_jaxprs
from remat_kit.cli import _inspect as inspect_cli
from remat_kit.peak import CATEGORIES, InspectError, diff
from remat_kit.peak import _dump as dump
from remat_kit.peak._parsers import parse_buffer_assignment, parse_hlo, parse_live_range
from remat_kit_models.configure import model_config


def _step(policy: str, scan: bool = True):
    spec, config = small_request(scan)
    target = rk.target("h100")
    cfg = model_config(spec, config, rk.as_policy(policy), target)
    return rk.build_train_step(models.build(cfg), config), target


@pytest.fixture(scope="module")
def minimal():
    step, target = _step("minimal")
    report = rk.peak.inspect_step(step, target, meta={"policy": "minimal"})
    plain = rk.memory_report(
        step.fn, *step.args, target=target, donate_argnums=step.donate_argnums, warn=False
    )
    return report, plain


@pytest.fixture(scope="module")
def nothing_saved_but_inputs():
    step, target = _step("none")
    return rk.peak.inspect_step(step, target, meta={"policy": "none"})


@pytest.mark.slow
def test_peak_equals_memory_report(minimal):
    report, plain = minimal
    assert report.peak_bytes == plain.peak_bytes
    assert report.temp_bytes == plain.temp_bytes
    assert report.argument_bytes == plain.argument_bytes


@pytest.mark.slow
def test_categories_add_up_to_the_peak(minimal, nothing_saved_but_inputs):
    for r in (minimal[0], nothing_saved_but_inputs):
        assert set(r.by_category) == set(CATEGORIES)
        assert sum(r.by_category.values()) == r.peak_bytes
        assert sum(r.by_layer.values()) == r.peak_bytes
        assert sum(b.size_bytes for b in r.buffers) == r.live_peak_bytes
        assert r.fragmentation_bytes == r.peak_bytes - r.live_peak_bytes >= 0


@pytest.mark.slow
def test_live_peak_is_the_timeline_maximum_and_matches_xla(minimal):
    r, _ = minimal
    assert len(r.timeline) == r.schedule_length
    assert max(r.timeline) == r.live_peak_bytes == r.timeline[r.peak_position]
    # Every argument is held for the whole step.
    assert min(r.timeline) >= r.argument_bytes
    if r.xla_peak_bytes is not None:  # XLA's heap-simulator peak, when jaxlib reports it
        assert abs(r.xla_peak_bytes - r.live_peak_bytes) <= 1e-3 * r.peak_bytes


@pytest.mark.slow
def test_categories_are_what_the_program_holds(minimal):
    r, _ = minimal
    step, _ = _step("minimal")
    weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(step.args[0]))
    params = [b for b in r.buffers if b.category == "parameter" and b.op == "parameter"]
    assert sum(b.size_bytes for b in params) == weights
    assert r.by_category["input"] == 2 * SMALL["batch"] * SMALL["seq"] * 4  # int32 tokens, targets
    assert r.by_category["optimizer state"] == 0  # sgd keeps none
    # minimal recomputes inside the backward pass: the peak is there and it holds
    # recomputed tensors beside the saved ones.
    assert r.peak_phase == "backward"
    assert r.by_category["recomputation workspace"] > 0
    # Some gradients exist at a backward peak, never more than all of them (bf16, as weights).
    assert 0 < r.by_category["gradient"] <= weights
    by_tag: dict = {}
    for b in r.buffers:
        if b.category == "saved activation":
            by_tag[b.checkpoint_name] = by_tag.get(b.checkpoint_name, 0) + b.size_bytes
    # The saved projections, sized by hand: 4 layers x batch x seq x width (or d_ff) x 2 B.
    layers, tokens = 4, SMALL["batch"] * SMALL["seq"]
    width, d_ff = dict(SMALL["overrides"])["width"], dict(SMALL["overrides"])["ff"]
    for tag, features in (("query_proj", width), ("out_proj", width)):
        assert by_tag.get(tag) == layers * tokens * features * 2, (tag, by_tag)
    # Newer XLA (jax 0.12) merges the sibling matmuls wi_0 and wi_1 into one dot over
    # concatenated weights and slices its output, each slice under wi_0's op_name: the
    # slice's offset says whose it is, so each tag holds its own bytes either way.
    mlp = layers * tokens * d_ff * 2
    assert (by_tag.get("mlpwi_0"), by_tag.get("mlpwi_1")) == (mlp, mlp), by_tag
    assert r.by_category["saved activation"] == sum(by_tag.values())
    recomputed = [b for b in r.buffers if b.category == "recomputation workspace"]
    assert all("rematted_computation" in b.op_name for b in recomputed)
    tagged = [b for b in r.buffers if b.category == "saved activation" and b.checkpoint_name]
    assert tagged and all(b.layer == "scanned layers" for b in tagged)
    assert all(b.shape[0] == 4 for b in tagged)  # stacked over the 4 scanned layers
    sizes = [b.size_bytes for b in r.buffers]
    assert sizes == sorted(sizes, reverse=True)


_MLP = ("Llama", "layers", "mlp")


def _merged_index(sizes):
    """A tag index of sibling matmuls under one parent, in program order, ``name: elements``."""
    from remat_kit.peak._tags import Tag

    return {(*_MLP, n, "dot_general"): [Tag(f"mlp{n}", e, "bf16")] for n, e in sizes.items()}


@pytest.mark.parametrize(
    "sizes,window,expect",
    [
        # A gated MLP's wi_0 and wi_1 (4 x 8 tokens, d_ff 16 each) merged into one 32-wide dot.
        ({"wi_0": 512, "wi_1": 512}, ((0, 4), (0, 8), (16, 32)), "wi_1"),
        ({"wi_0": 512, "wi_1": 512}, ((0, 4), (0, 8), (0, 16)), None),  # the first: its own
        # q (width 32) beside k and v (width 8 each, GQA): unequal widths.
        ({"q": 64, "k": 16, "v": 16}, ((0, 2), (32, 40)), "k"),
        ({"q": 64, "k": 16, "v": 16}, ((0, 2), (40, 48)), "v"),
        ({"q": 64, "k": 16, "v": 16}, ((0, 2), (36, 44)), None),  # no sibling starts there
        ({"q": 64, "k": 16, "v": 16}, ((0, 2), (32, 48)), None),  # k and v together: no one's
        ({"wi_0": 512, "wi_1": 512}, ((1, 4), (0, 8), (16, 32)), None),  # cut twice
    ],
)
def test_a_slice_of_merged_siblings_is_the_sibling_at_its_offset(sizes, window, expect):
    from remat_kit.peak._tags import sliced_sibling

    first = next(iter(sizes))
    elements = 1
    for a, b in window:
        elements *= b - a
    got = sliced_sibling(_merged_index(sizes), (*_MLP, first, "dot_general"), window, elements)
    assert got == (None if expect is None else (*_MLP, expect, "dot_general"))


# compiles the small model for an H100 (the module's fixture)
@pytest.mark.slow
def test_phases_cover_the_schedule_in_order(minimal):
    r, _ = minimal
    assert [p.name for p in r.phases] == ["forward", "backward", "optimizer"]
    assert r.phases[0].start == 0 and r.phases[-1].end == r.schedule_length - 1
    for a, b in zip(r.phases, r.phases[1:], strict=False):
        assert b.start == a.end + 1
    # Saved activations are made by forward ops and still held in the backward pass.
    bwd = r.phases[1]
    saved = [b for b in r.buffers if b.category == "saved activation"]
    assert saved
    for b in saved:
        assert b.live[1] >= bwd.start and "transpose(" not in b.op_name


@pytest.mark.slow
def test_no_remat_saves_more_and_recomputes_nothing(minimal, nothing_saved_but_inputs):
    low, high = minimal[0], nothing_saved_but_inputs
    assert high.by_category["recomputation workspace"] == 0
    assert high.by_category["saved activation"] > low.by_category["saved activation"]
    d = diff(low, high)
    assert d.peak_delta == high.peak_bytes - low.peak_bytes > 0
    for category in CATEGORIES:
        assert d.by_category[category] == high.by_category[category] - low.by_category[category]
    assert d.by_category["saved activation"] > 0 > d.by_category["recomputation workspace"]
    assert d.kept and all(y > x for _, _, x, y in d.kept)
    assert all(x > y for _, _, x, y in d.dropped)
    assert any(c == "saved activation" for c, *_ in d.kept)
    # The diff's rows add up to the difference of the peaks.
    net = sum(y - x for _, _, x, y in d.kept) + sum(y - x for _, _, x, y in d.dropped)
    assert net == d.peak_delta
    assert diff(low, low).kept == () and diff(low, low).peak_delta == 0


# compiles the small model for an H100 (the module's fixture)
@pytest.mark.slow
def test_to_dict_is_json_ready(minimal, tmp_path):
    r, _ = minimal
    back = json.loads(json.dumps(r.to_dict()))
    assert back["peak_bytes"] == r.peak_bytes
    assert sum(back["by_category"].values()) == r.peak_bytes
    assert len(back["buffers"]) == len(r.buffers)
    assert back["meta"]["policy"] == "minimal"
    png = rk.render.plot_timeline(
        r, tmp_path / "t.png", memory_bytes=rk.target("h100").memory_bytes
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_arguments_by_category_and_dump_cleaned_up(monkeypatch):
    made = []
    real = dump.tempfile.TemporaryDirectory

    def recording(*args, **kwargs):
        d = real(*args, **kwargs)
        made.append(d.name)
        return d

    monkeypatch.setattr(dump.tempfile, "TemporaryDirectory", recording)
    w = jax.ShapeDtypeStruct((512, 512), jnp.float32)
    m = jax.ShapeDtypeStruct((512, 512), jnp.float32)
    x = jax.ShapeDtypeStruct((256, 512), jnp.float32)

    def f(w, m, x):
        return jnp.tanh(x @ w).sum() + m.sum()

    r = rk.inspect(f, w, m, x, target="h100", categories={0: "parameter", 1: "optimizer state"})
    assert made and not any(os.path.exists(d) for d in made)
    assert r.by_category["parameter"] == 512 * 512 * 4
    assert r.by_category["optimizer state"] == 512 * 512 * 4
    assert r.by_category["input"] == 256 * 512 * 4  # arguments not named are inputs
    assert r.phases == ()  # no backward pass: nothing to tell apart
    assert sum(r.by_category.values()) == r.peak_bytes
    with pytest.raises(ValueError, match="gradient"):
        rk.inspect(f, w, m, x, target="h100", categories={0: "gradient"})


def test_live_ranges_written_inside_the_buffer_assignment_are_read_there(tmp_path):
    # jax 0.9 writes no *-live-range.txt: its buffer assignment ends with the same section.
    stem = tmp_path / "module_0001.jit_f.cpu_after_optimizations"
    assignment = [
        "BufferAssignment:",
        "allocation 0: size 256, output shape is |f32[8,8]|, maybe-live-out:",
        " value: <1 dot.1 @0> (size=256,offset=0): f32[8,8]{1,0}",
        "allocation 1: size 256, parameter 0, shape |f32[8,8]| at ShapeIndex {}:",
        " value: <0 a.1 @0> (size=256,offset=0): f32[8,8]{1,0}",
        "",
    ]
    live = [
        "HloLiveRange (max 2):",
        "  InstructionSequence:",
        "    0:a.1",
        "    1:dot.1",
        "  BufferLiveRange:",
        "    a.1{}:0-2",
        "    dot.1{}:1-2",
    ]
    (tmp_path / f"{stem.name}-buffer-assignment.txt").write_text("\n".join(assignment + live))
    (tmp_path / f"{stem.name}.txt").write_text("HloModule jit_f\n")
    files = dump.DumpFiles.find(str(tmp_path), "jit_f")
    texts = files.read()
    assert texts[files.live_range] == live
    assert texts[files.buffer_assignment] == assignment
    assert parse_live_range(files.live_range, texts[files.live_range]).sequence == ("a.1", "dot.1")
    allocs, _ = parse_buffer_assignment(files.buffer_assignment, texts[files.buffer_assignment])
    assert sorted(a.size for a in allocs.values()) == [256, 256]
    # Neither file nor section: the error names what is missing.
    (tmp_path / f"{stem.name}-buffer-assignment.txt").write_text("\n".join(assignment))
    with pytest.raises(InspectError, match=r"but not .*-live-range\.txt"):
        dump.DumpFiles.find(str(tmp_path), "jit_f")


def test_unreadable_lines_name_file_and_line(tmp_path):
    good = [
        "BufferAssignment:",
        "allocation 0: size 16, page 0, parameter 0, shape |f32[4]| at ShapeIndex {}:",
        " value: <0 p.1 @0> (size=16,offset=0): f32[4]{0}",
        "allocation 1: size 64, preallocated-temp:",
        " value: <3 fusion.2{} @0> (size=64,offset=0): f32[16]{0}",
    ]
    allocs, values = parse_buffer_assignment("x-buffer-assignment.txt", good)
    assert allocs[0].parameter == 0 and "preallocated-temp" in allocs[1].kinds
    assert [v.name for v in values] == ["p.1{}", "fusion.2{}"]
    bad = [*good[:3], "allocation one: size 16:", *good[3:]]
    with pytest.raises(InspectError, match=r"x-buffer-assignment\.txt:4: cannot read"):
        parse_buffer_assignment("x-buffer-assignment.txt", bad)
    bad_value = [*good[:2], " value: <0 p.1 @0> (size=sixteen,offset=0): f32[4]{0}"]
    with pytest.raises(InspectError, match=r":3: cannot read a value line"):
        parse_buffer_assignment("x-buffer-assignment.txt", bad_value)

    live = [
        "HloLiveRange (max 2):",
        "  InstructionSequence:",
        "    0:p.1",
        "    1:fusion.2",
        "  BufferLiveRange:",
        "    p.1{}:0-2",
        "    fusion.2{}:1-2",
    ]
    parsed = parse_live_range("x-live-range.txt", live)
    assert parsed.sequence == ("p.1", "fusion.2") and parsed.ranges["fusion.2{}"] == (1, 2)
    with pytest.raises(InspectError, match=r"x-live-range\.txt:7: cannot read a BufferLiveRange"):
        parse_live_range("x-live-range.txt", [*live[:6], "    fusion.2{}:one-2"])
    with pytest.raises(InspectError, match=r":4: cannot read an InstructionSequence"):
        parse_live_range("x-live-range.txt", [*live[:3], "    5:fusion.2", *live[4:]])

    hlo = [
        "HloModule jit_f, is_scheduled=true",
        "",
        "ENTRY %main.3 (p.1: f32[4]) -> f32[16] {",
        '  %p.1 = f32[4]{0} parameter(0), metadata={op_name="w"}',
        "  ROOT %fusion.2 = f32[16]{0} fusion(%p.1), kind=kLoop, calls=%c, "
        'metadata={op_name="jit(f)/jvp(M)/dense/dot_general"}',
        "}",
    ]
    h = parse_hlo("x.txt", hlo)
    assert h.instructions["fusion.2"].operands == ("p.1",)
    assert h.instructions["fusion.2"].op_name == "jit(f)/jvp(M)/dense/dot_general"
    assert h.instructions["p.1"].index == 0 and h.entry == "main.3"
    with pytest.raises(InspectError, match=r"x\.txt:5: cannot read an HLO instruction"):
        parse_hlo("x.txt", [*hlo[:4], "  ROOT garbage without equals", hlo[5]])


@pytest.mark.slow
def test_cli_functions_print_and_write(tmp_path, capsys):
    from remat_kit.cli import _parser

    parser, _ = _parser("inspect")  # the CLI's own parser: the common flags (--wide) too
    args = parser.parse_args(
        [
            "inspect",
            "--model",
            "tiny-llama",
            "--target",
            "h100",
            "--batch",
            "2",
            "--seq",
            "128",
            "--optimizer",
            "sgd",
            "--attention",
            "xla",
            "--layers",
            "2",
            "--diff",
            "full",
            "none",
            "--json",
            str(tmp_path / "i.json"),
            "--plot",
            str(tmp_path / "i.png"),
        ]
    )
    assert inspect_cli.run(args) == 0
    out = json.loads((tmp_path / "i.json").read_text())
    assert [r["meta"]["policy"] for r in out["reports"]] == ["full", "none"]
    a, b = out["reports"]
    assert out["diff"]["peak_delta"] == b["peak_bytes"] - a["peak_bytes"]
    assert (tmp_path / "i.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "top 10 buffers live at the peak" in printed and "keeps at its peak" in printed


def _stacked_weight_shapes():
    """SMALL's scanned weights, written out from its config: ``[layers, ...]`` each."""
    o = dict(SMALL["overrides"])
    layers, width, heads, kv, ff = o["layers"], o["width"], o["heads"], o["kv_heads"], o["ff"]
    head = width // heads
    return {
        (layers, width, heads, head),  # query
        (layers, width, kv, head),  # key, value
        (layers, heads, head, width),  # out
        (layers, width, ff),  # wi_0, wi_1
        (layers, ff, width),  # wo
        (layers, width),  # the two norms' scales
    }


# compiles the small model for an H100 (the module's fixture)
@pytest.mark.slow
def test_stacked_gradient_carries_belong_to_the_scanned_layers(minimal):
    # The backward scan accumulates each stacked weight's gradient in a [layers, ...] carry
    # that XLA zero-fills before the loop (issue 26: it showed as "non-layer", and the carries
    # with no op_name as "other temporaries"): every layer's gradient at once.
    r, _ = minimal
    # SMALL's residual stream [batch, seq, width] is shaped like the stacked wo [layers, ff,
    # width]: its gradient is an activation's, so that shape says nothing here.
    width = dict(SMALL["overrides"])["width"]
    stacked = _stacked_weight_shapes() - {(SMALL["batch"], SMALL["seq"], width)}
    made_outside = [
        b
        for b in r.buffers
        if b.shape in stacked and b.op != "parameter" and "/while" not in b.op_name
    ]
    assert made_outside, [(b.shape, b.op_name) for b in r.buffers]
    assert {(b.category, b.layer) for b in made_outside} == {("gradient", "scanned layers")}
    assert sum(r.by_layer.values()) == sum(r.by_category.values()) == r.peak_bytes


#: A toy stack (no Flax): LAYERS square weights, scanned (``layers``, one [LAYERS, W, W] leaf)
#: or unrolled (``layers_0`` ...), between an embedding [V, W] and a head [W, 8]; no
#: activation ([TOKENS, W]) is shaped like a weight.
LAYERS, W, V, TOKENS = 4, 256, 16, 8


def _toy_params(scan: bool) -> dict:
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    stack = (
        {"layers": f32(LAYERS, W, W)} if scan else {f"layers_{i}": f32(W, W) for i in range(LAYERS)}
    )
    return {"embed": f32(V, W), **stack, "head": f32(W, 8)}


def _toy_loss(p, x):
    h = x @ p["embed"]
    if "layers" in p:
        h, _ = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), h, p["layers"])
    else:
        for i in range(LAYERS):
            h = jnp.tanh(h @ p[f"layers_{i}"])
    return (h @ p["head"]).sum()


def _toy_adam(p, m, x):
    # No donation: the updated weights and both moments are new buffers, so the peak is in
    # the optimizer, where they all live at once.
    g = jax.grad(_toy_loss)(p, x)
    m = jax.tree.map(lambda a, b: 0.9 * a + b, m, g)
    v = jax.tree.map(lambda b: b * b, g)
    new = jax.tree.map(lambda w, a, c: w - 0.1 * a / (jnp.sqrt(c) + 1.0), p, m, v)
    return new, m, v


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scan", "weight_shape", "layer"),
    [(True, (LAYERS, W, W), "scanned layers"), (False, (W, W), "non-layer")],
)
def test_updates_of_a_stack_belong_to_it(scan, weight_shape, layer):
    # Scanned: the stack's updated weights and moments (jit(step)/sub, outside any layer op)
    # are the layers'. Unrolled: a [W, W] update could be any layer's, so the shape says
    # nothing and it stays where its op puts it.
    p = _toy_params(scan)
    x = jax.ShapeDtypeStruct((TOKENS, V), jnp.float32)
    r = rk.inspect(
        _toy_adam, p, p, x, target="h100", categories={0: "parameter", 1: "optimizer state"}
    )
    assert r.peak_phase == "optimizer"
    updates = [b for b in r.buffers if b.shape == weight_shape and b.op != "parameter"]
    assert len(updates) >= 3, [(b.shape, b.name) for b in r.buffers]  # weights, m and v
    assert {b.layer for b in updates} == {layer}
    assert sum(r.by_layer.values()) == r.peak_bytes


def test_a_scanned_gradient_carry_is_a_gradient_of_the_layers():
    p = _toy_params(scan=True)
    x = jax.ShapeDtypeStruct((TOKENS, V), jnp.float32)
    r = rk.inspect(jax.grad(_toy_loss), p, x, target="h100", categories={0: "parameter"})
    assert r.peak_phase == "backward"
    carries = [b for b in r.buffers if b.shape == (LAYERS, W, W) and b.op != "parameter"]
    assert carries, [(b.shape, b.name) for b in r.buffers]
    assert {(b.category, b.layer) for b in carries} == {("gradient", "scanned layers")}
    # The head's gradient stays outside the layers.
    head = [b for b in r.buffers if b.category == "gradient" and b.shape == (W, 8)]
    assert head and {b.layer for b in head} == {"non-layer"}


class _NormedHead(nn.Module):
    """proj [W, W] -> norm -> head [W, 8]: on W tokens of width W, the gradient of the
    head's input is [W, W] f32, shaped like proj's kernel, and made by the head."""

    @nn.compact
    def __call__(self, x):
        h = nn.RMSNorm(name="norm")(nn.Dense(W, use_bias=False, name="proj")(x))
        return nn.Dense(8, use_bias=False, name="head")(h).sum()


def test_an_activation_gradient_shaped_like_a_weight_is_not_a_gradient():
    # A weight's gradient is made under its module's name; the head holds no [W, W] leaf, so
    # what its backward makes at that shape is an activation's gradient (issue 27: on jax
    # 0.12 the residual stream's gradient, [batch, seq, width], took the stacked wo's place).
    net = _NormedHead()
    x = jax.ShapeDtypeStruct((W, W), jnp.float32)
    p = jax.eval_shape(net.init, jax.random.key(0), x)
    grad = jax.grad(lambda p, x: net.apply(p, x))
    r = rk.inspect(grad, p, x, target="h100", categories={0: "parameter"})
    head = "_NormedHead/head/dot_general"
    made = [b for b in r.buffers if b.shape == (W, W) and b.module_path == head]
    assert made, [(b.shape, b.module_path) for b in r.buffers]
    assert {b.category for b in made} == {"other temporaries"}
    assert r.by_category["gradient"] == 0


def _per_layer_saved_by_hand() -> int:
    """Bytes of q, k, v, out, wi_0 and wi_1 that one SMALL layer keeps under ``minimal`` (and
    offloads under ``minimal_offloaded``): tokens x their widths x 2 B (bf16)."""
    o = dict(SMALL["overrides"])
    kv_width = o["kv_heads"] * (o["width"] // o["heads"])
    features = o["width"] + 2 * kv_width + o["width"] + 2 * o["ff"]
    return SMALL["batch"] * SMALL["seq"] * features * 2


_PROJECTIONS = {"query_proj", "key_proj", "value_proj", "out_proj", "mlpwi_0", "mlpwi_1"}


@pytest.mark.slow
def test_offloaded_residuals_are_host_memory_not_part_of_the_peak(small):
    # Issue 26: the offloaded residuals get a temp block of their own in host memory (an
    # allocation of another color), which the memory analysis counts as host temp; read as
    # device memory, inspect refused the dump ("the preallocated temp block is ... bytes").
    step, target = _step("minimal_offloaded")
    r = rk.peak.inspect_step(step, target)
    plain = small("minimal_offloaded")
    assert r.peak_bytes == plain.peak_bytes and r.temp_bytes == plain.temp_bytes
    assert sum(r.by_category.values()) == sum(r.by_layer.values()) == r.peak_bytes
    assert sum(b.size_bytes for b in r.buffers) == r.live_peak_bytes <= r.peak_bytes
    assert r.xla_peak_bytes is None or abs(r.xla_peak_bytes - r.live_peak_bytes) <= 1e-3 * (
        r.peak_bytes
    )
    # Every layer's projections are on the host at once (a scanned stack offloads them all).
    layers = dict(SMALL["overrides"])["layers"]
    assert r.host_temp_bytes == plain.host_temp_bytes == layers * _per_layer_saved_by_hand()
    assert not _PROJECTIONS & {b.checkpoint_name for b in r.buffers}


def test_an_allocation_in_another_memory_space_keeps_its_color():
    allocs, _ = parse_buffer_assignment(
        "x-buffer-assignment.txt",
        [
            "BufferAssignment:",
            "allocation 0: size 16, parameter 0, shape |f32[4]| at ShapeIndex {}:",
            "allocation 1: size 64, color 5, preallocated-temp:",
            "allocation 2: size 32, preallocated-temp:",
        ],
    )
    assert [(a.color, a.kinds) for a in allocs.values()] == [
        (0, frozenset()),
        (5, frozenset({"preallocated-temp"})),
        (0, frozenset({"preallocated-temp"})),
    ]


@pytest.mark.slow
def test_unrolled_layers_own_their_saved_activations():
    # Issue 26: unrolled (--no-scan), every layer's ops were named after the block class alone
    # (LlamaBlock/...), so what the layers save showed as "non-layer".
    step, target = _step("minimal", scan=False)
    r = rk.peak.inspect_step(step, target)
    assert r.peak_phase == "backward"
    named = [b for b in r.buffers if b.category == "saved activation" and b.checkpoint_name]
    assert named and "non-layer" not in {b.layer for b in named}
    saved: dict = {}
    for b in named:
        if b.checkpoint_name in _PROJECTIONS:
            saved[b.layer] = saved.get(b.layer, 0) + b.size_bytes
    # The peak is in the last layer's backward pass: the three before it hold all they saved.
    for layer in ("layers_0", "layers_1", "layers_2"):
        assert saved.get(layer) == _per_layer_saved_by_hand(), saved
    assert sum(r.by_layer.values()) == r.peak_bytes


@pytest.mark.parametrize("schedule", ["none", "every:2", "nested:2"])
def test_each_unrolled_layer_runs_in_a_scope_named_by_its_index(schedule):
    def layer(p, h, k):
        return jnp.tanh(h @ p)

    w = [jax.ShapeDtypeStruct((4, 4), jnp.float32)] * 6
    x = jax.ShapeDtypeStruct((2, 4), jnp.float32)
    run = lambda w, x: rk.apply_layers(
        layer, w, x, n_layers=6, schedule=schedule, policy="full", scan=False
    ).sum()
    scopes = []

    def walk(jaxpr, prefix):
        for eqn in jaxpr.eqns:
            stack = f"{prefix}/{eqn.source_info.name_stack}"
            if eqn.primitive.name == "tanh":
                scopes.append([s for s in stack.split("/") if s.startswith("layers_")])
            for sub in sub_jaxprs(eqn):
                walk(open_jaxpr(sub), stack)

    walk(jax.make_jaxpr(run)(w, x).jaxpr, "")
    assert scopes == [[f"layers_{i}"] for i in range(6)]


@pytest.mark.slow
def test_a_hugging_face_stack_names_its_layers_by_index():
    # Issue 28: Hugging Face's Flax GPT-2 names its blocks h/0 ... h/3 (a stack, then an
    # index), not h_0: they showed as "non-layer" and a "scanned layers" row.
    from pathlib import Path

    factory = f"{Path(__file__).parent / 'data' / 'factories.py'}:hf_gpt2"
    block = "transformers.models.gpt2.modeling_flax_gpt2:FlaxGPT2Block"
    src = rk.sources.from_factory(factory, block=block)
    target = rk.target("h100")
    config = rk.TrainConfig(batch=2, seq=64, optimizer="sgd")
    built = src.build_step(rk.as_policy("full"), rk.parse_schedule("none"), config, target)
    r = rk.peak.inspect_step(built.step, target)
    layers = {b.layer for b in r.buffers if b.category in ("parameter", "optimizer state")}
    assert {"h_0", "h_1", "h_2", "h_3"} <= layers
    assert "scanned layers" not in r.by_layer
    assert set(r.by_layer) <= {"h_0", "h_1", "h_2", "h_3", "non-layer", "fragmentation"}


# --- inspect --xprof (issue 46): XProf's own converter reads what we wrote ---------------------

_TINY_CLI = ["inspect", "--model", "tiny-llama", "--batch", "2", "--seq", "64"]


def _memory_viewer(directory, module):
    from pathlib import Path

    raw = pytest.importorskip("xprof.convert.raw_to_tool_data")
    planes = [str(p) for p in Path(directory).glob("plugins/profile/*/*.xplane.pb")]
    assert len(planes) == 1, planes
    assert "memory_viewer" in raw.xspace_to_tool_names(planes)
    data, _ = raw.xspace_to_tool_data(planes, "memory_viewer", {"module_name": module})
    assert data, f"xprof read no module {module}"
    return json.loads(data)


@pytest.mark.slow
def test_xprof_memory_viewer_reads_the_program_and_its_peak(tmp_path, capsys):
    from remat_kit.cli import main

    where, report = tmp_path / "prof", tmp_path / "r.json"
    args = [*_TINY_CLI, "--diff", "full", "none", "--xprof", str(where), "--json", str(report)]
    assert main(args) == 0
    assert "module jit_step(1) (full), jit_step(2) (none)" in " ".join(
        capsys.readouterr().out.split()
    )
    reports = json.loads(report.read_text())["reports"]
    for i, r in enumerate(reports, 1):
        view = _memory_viewer(where, f"{r['module']}({i})")
        assert view["moduleName"] == r["module"]
        peak = view["peakHeapMib"] * 2**20
        # The Memory Viewer's peak is XLA's heap simulation of the program: XLA's own
        # peak_memory_in_bytes, which the report keeps as xla_peak_bytes. Our live-range
        # peak counts the same buffers by their live ranges: a few hundred bytes apart
        # (constants, scratch, where a value dies), either way.
        assert r["xla_peak_bytes"] is not None and peak == r["xla_peak_bytes"]
        assert abs(peak - r["live_peak_bytes"]) <= 1024
        # Its allocations are the report's peak (argument + output + temp - alias) plus
        # constants: a few bytes.
        total = view["totalBufferAllocationMib"] * 2**20
        assert 0 <= total - r["peak_bytes"] <= 1024
    assert reports[0]["peak_bytes"] != reports[1]["peak_bytes"]  # two programs, both read


@pytest.mark.parametrize(
    "make, message",
    [
        ("file", "--xprof '{p}' is not a directory: give a new or empty directory"),
        ("full", "--xprof '{p}' is not empty: give a new or empty directory"),
        ("orphan", "--xprof '{p}': directory '{d}/missing' does not exist"),
    ],
)
def test_bad_xprof_dirs_are_one_line_before_any_compile(
    make, message, tmp_path, capsys, no_compile
):
    from remat_kit.cli import main

    p = tmp_path / "prof"
    if make == "file":
        p.write_text("")
    elif make == "full":
        p.mkdir()
        (p / "other_run").mkdir()
    else:
        p = tmp_path / "missing" / "prof"
    assert main([*_TINY_CLI, "--xprof", str(p)]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"remat-kit: {message.format(p=p, d=tmp_path)}") and err.count("\n") == 1
    assert "Traceback" not in out + err


def test_an_unwritable_place_for_xprof_is_refused(capsys, no_compile):
    from remat_kit.cli import main

    assert main([*_TINY_CLI, "--xprof", "/proc/remat_kit_prof"]) == 2
    assert "cannot create a directory in '/proc'" in capsys.readouterr().err


def test_write_profile_replaces_only_an_empty_directory(tmp_path):
    p = tmp_path / "prof"
    p.mkdir()
    remat_kit.render.write_profile(p, {"plugins/profile/r/h.xplane.pb": b"x"}, flag="--xprof")
    assert (p / "plugins/profile/r/h.xplane.pb").read_bytes() == b"x"
    with pytest.raises(rk.BadValue, match="is not empty"):
        remat_kit.render.write_profile(p, {"a": b"y"}, flag="--xprof")
    assert sorted(os.listdir(tmp_path)) == ["prof"]  # nothing half-written beside it
