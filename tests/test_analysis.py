"""memory_report: fields, agreement with a direct compile, policy effects, warnings, FLOPs."""

import json

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import topologies
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import remat_kit as rk
import remat_kit_models as models
from conftest import SMALL, small_request
from helpers import memory_report
from remat_kit_models.spec import PresetSpec

# Written out here from ../shared/gpu_targets.md, independently of remat_kit.targets.
H100_TEXT = """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: 3352320000000 l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: 85018542080 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 minor: 0 }
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 1 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""


def _mlp(x, w1, w2):
    return jnp.tanh(x @ w1) @ w2


def _mlp_args(dtype=jnp.bfloat16):
    return (
        jax.ShapeDtypeStruct((4096, 2048), dtype),
        jax.ShapeDtypeStruct((2048, 8192), dtype),
        jax.ShapeDtypeStruct((8192, 2048), dtype),
    )


def _expected_flops():
    """FLOPs of SMALL's train step counted by hand: (forward of the blocks, of the head)."""
    cfg = models.get_config("tiny-llama", **dict(SMALL["overrides"]))
    d, layers, vocab = cfg.d_model, cfg.n_layers, cfg.vocab_size
    b, s = SMALL["batch"], SMALL["seq"]
    # Matmul weights of the blocks: every parameter but the embedding, head and norm scales.
    blocks = cfg.param_count() - 2 * vocab * d - (2 * layers + 1) * d
    # 2 FLOPs per weight per token, and q.k^T and probs.v: 2 x b s^2 d each per layer.
    fwd_blocks = 2 * b * s * blocks + 4 * b * s * s * d * layers
    return fwd_blocks, 2 * b * s * vocab * d, 2 * b * s * (d * d + cfg.d_ff * d) * layers


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["none", "full"])
def test_fields_present_and_consistent(small, policy):
    r = small(policy)
    assert r.peak_bytes == r.argument_bytes + r.output_bytes + r.temp_bytes - r.alias_bytes
    assert r.target == "h100-80gb" and r.target_memory_bytes == 85018542080
    assert r.fits is True and r.over_by_bytes < 0
    assert r.compile_seconds > 0
    assert r.policy == policy and r.attention == "xla"
    # FLOPs: forward + backward (twice the forward) = 3x the forward, and "full" adds the
    # blocks' forward again, less the output projections whose results no gradient reads.
    fwd_blocks, head, out_projections = _expected_flops()
    none = 3 * (fwd_blocks + head)
    if policy == "none":
        assert r.flops == pytest.approx(none, rel=0.02)
    else:
        assert none + fwd_blocks - out_projections <= r.flops * 1.02
        assert r.flops <= (none + fwd_blocks) * 1.02
    # Every part of the breakdown from an independent count, so "activations = the rest"
    # cannot absorb a wrong entry: bf16 weights and gradients (2 bytes per parameter), no
    # SGD state, no accumulator, int32 tokens and targets.
    n = models.get_config("tiny-llama", **dict(SMALL["overrides"])).param_count()
    b = r.breakdown
    assert b["weights"] == b["gradients"] == b["trainable"] == 2 * n
    assert b["optimizer"] == 0 and b["grad_accumulator"] == 0
    assert b["batch"] == 2 * SMALL["batch"] * SMALL["seq"] * 4
    assert b["activations"] == r.peak_bytes - 4 * n - b["batch"] > 0
    d = json.loads(json.dumps(r.to_dict()))
    for key in (
        "peak_bytes",
        "argument_bytes",
        "output_bytes",
        "temp_bytes",
        "alias_bytes",
        "host_bytes",
        "xla_peak_bytes",
        "flops",
        "fits",
        "policy",
        "compile_seconds",
    ):
        assert d[key] == getattr(r, key), key
    assert d["breakdown"] == dict(b)


@pytest.mark.slow
def test_report_equals_independent_direct_compile():
    topo = topologies.get_topology_desc(platform="cuda", target_config=H100_TEXT, topology="1x1x1")
    mesh = topologies.make_mesh(topo, (1,), ("x",))
    args = [
        jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, P()))
        for a in _mlp_args()
    ]
    direct = jax.jit(_mlp).lower(*args).compile().memory_analysis()
    r = rk.memory_report(_mlp, *_mlp_args(), target="h100")
    assert r.argument_bytes == direct.argument_size_in_bytes == 2 * (4096 * 2048 + 2 * 2048 * 8192)
    assert r.output_bytes == direct.output_size_in_bytes
    assert r.temp_bytes == direct.temp_size_in_bytes
    assert r.alias_bytes == direct.alias_size_in_bytes


def test_arrays_and_shape_structs_give_the_same_report():
    small_args = [
        jax.ShapeDtypeStruct((64, 32), jnp.float32),
        jax.ShapeDtypeStruct((32, 128), jnp.float32),
        jax.ShapeDtypeStruct((128, 32), jnp.float32),
    ]
    arrays = [jnp.zeros(a.shape, a.dtype) for a in small_args]
    a = rk.memory_report(_mlp, *small_args, target="rtx4090")
    b = rk.memory_report(_mlp, *arrays, target="rtx4090")
    assert (a.peak_bytes, a.temp_bytes, a.flops) == (b.peak_bytes, b.temp_bytes, b.flops)
    assert a.flops == 2 * 64 * 32 * 128 * 2 + 64 * 128  # two matmuls and a tanh


@pytest.mark.slow
def test_remat_lowers_gpu_peak_and_costs_flops(small):
    none, full, minimal = small("none"), small("full"), small("minimal")
    assert full.peak_bytes < minimal.peak_bytes < none.peak_bytes
    assert full.breakdown["activations"] < none.breakdown["activations"] / 2
    assert none.meta["recompute_overhead"] == pytest.approx(0.0, abs=1e-9)
    # One more forward of the blocks, less the output projections no gradient reads again.
    fwd_blocks, head, out_projections = _expected_flops()
    base = 3 * (fwd_blocks + head)
    low, high = (fwd_blocks - out_projections) / base, fwd_blocks / base
    assert low - 0.02 <= full.meta["recompute_overhead"] <= high + 0.02
    assert 0 < minimal.meta["recompute_overhead"] < full.meta["recompute_overhead"]


@pytest.mark.slow
def test_offload_moves_bytes_to_host(small):
    off, full = small("offload_dots_no_batch"), small("full")
    assert off.host_bytes > 0 and full.host_bytes == 0
    assert not [w for w in off.warnings if "moved 0 bytes" in w or "tags none" in w]
    est = off.meta["offload_estimate"]
    assert est["host_bytes"] == off.host_temp_bytes
    # Out in the forward pass and back in the backward, each over the H100's PCIe Gen5 x16
    # link at 64e9 B/s per direction (../shared/gpu_targets.md).
    assert est["transfer_seconds"] == pytest.approx(2 * off.host_temp_bytes / 64e9, rel=1e-9)


@pytest.mark.slow
def test_a_reduction_over_hosts_is_priced_at_the_network_not_nvlink():
    """16 H100s on 4 hosts: an all-reduce over all of them leaves each host through its 4
    GPUs' NICs (seed-100 mutant analysis.py:472: the report priced it as one NVLink domain
    when the target's hosts were not handed to the step-time model)."""
    t = rk.target("h100", devices=16, hosts=4)
    x = jax.ShapeDtypeStruct((16, 2**20), jnp.float32)
    sharded = NamedSharding(t.mesh(("d",), (16,)), P("d"))
    r = rk.memory_report(lambda x: x.sum(0), x, target=t, in_shardings=sharded, warn=False)
    # One all-reduce of the f32 sum (4 MiB) over 16, each GPU sending 2 x 15/16 of it at
    # 4 GPUs x one 400 Gb/s NIC each x RDMA's 0.92 (remat_kit/timing/_speed.py cites both).
    assert r.meta["collectives"]["all-reduce"]["bytes"] == 4 * 2**20
    want = 2 * 4 * 2**20 * 15 / 16 / (4 * 50e9 * 0.92)
    assert r.step_time.collective_seconds == pytest.approx(want, rel=1e-9)


def test_transfer_estimate_counts_both_directions():
    """32e9 B offloaded on an H100 (64e9 B/s each way): 0.5 s out, 0.5 s back."""
    h100 = rk.target("h100")
    report = rk.MemoryReport(
        target="h100-80gb",
        target_memory_bytes=h100.memory_bytes,
        usable_bytes=h100.usable_bytes,
        mem_fraction=h100.mem_fraction,
        fits_with_fraction=None,
        devices=1,
        peak_bytes=0,
        argument_bytes=0,
        output_bytes=0,
        temp_bytes=0,
        alias_bytes=0,
        host_bytes=32 * 10**9,
        host_temp_bytes=32 * 10**9,
        generated_code_bytes=0,
        xla_peak_bytes=None,
        flops=989e12 * 0.25,  # a quarter of a second at the H100's dense bf16 peak
        flops_detail={},
        tags=(),
        xla_remat=False,
        xla_remat_saved_bytes=0,
        xla_remat_limit_bytes=None,
        policy="offload_dots_no_batch",
        schedule="none",
        attention=None,
        compile_seconds=0.0,
    )
    est = rk.analysis.transfer_estimate(report, h100, recompute_flops=989e12 * 0.1)
    assert est.host_bytes == 32 * 10**9
    assert est.transfer_seconds == pytest.approx(1.0, rel=1e-12)
    assert est.recompute_seconds == pytest.approx(0.1, rel=1e-9)
    assert est.step_compute_seconds == pytest.approx(0.25, rel=1e-9)
    assert est.link_bound  # 1 s of transfers cannot hide behind 0.25 s of compute


@pytest.mark.slow
def test_scanned_and_unrolled_flops_agree():
    target = rk.target("h100")
    spec, config = small_request()
    for policy in ("none", "full", "minimal"):
        scanned = (
            rk.sources.step_flops(rk.sources.resolve(spec), "none", target, config)
            if policy == "none"
            else None
        )
        flops = {}
        for scan in (True, False):
            cfg = models.get_config(
                "tiny-llama", policy=policy, scan_layers=scan, **dict(SMALL["overrides"])
            )
            step = rk.build_train_step(models.build(cfg), rk.TrainConfig(batch=4, seq=1024))
            flops[scan] = rk.count_flops(step.fn, *step.args).total
        assert flops[True] == pytest.approx(flops[False], rel=0.02)
        if scanned is not None:
            assert scanned == pytest.approx(flops[True], rel=0.02)


def test_warning_when_names_match_no_tag_and_offload_moves_nothing():
    with pytest.warns(UserWarning, match=r"not in remat_kit's tag vocabulary"):
        pol = rk.policy("offload", offload=["my_tensor"])
    f = rk.remat(lambda x, w: jnp.tanh(x @ w).sum(), pol)
    args = (jax.ShapeDtypeStruct((256, 256), jnp.float32),) * 2
    # Both notes are issued as warnings: the name that matches nothing, and the offload that
    # moved nothing (each asserted here, so neither reaches the suite's warnings summary).
    with pytest.warns(rk.analysis.RematWarning) as said:
        r = rk.memory_report(jax.grad(f), *args, target="h100", policy=pol)
    said = [str(w.message) for w in said if issubclass(w.category, rk.analysis.RematWarning)]
    assert [w for w in said if "tags none of them" in w]
    assert [w for w in said if "moved 0 bytes" in w]
    assert any("moved 0 bytes" in w for w in r.warnings)


def test_does_not_fit_and_xla_remat_are_reported():
    # 16 layers keep a 2 GiB activation each for the backward pass: > 24 GiB.
    def f(x, w):
        for _ in range(16):
            x = jnp.tanh(x @ w)
        return x.sum()

    x = jax.ShapeDtypeStruct((64 * 1024, 8192), jnp.float32)
    w = jax.ShapeDtypeStruct((8192, 8192), jnp.float32)
    r = rk.memory_report(jax.grad(f, argnums=1), x, w, target="rtx4090", warn=False)
    assert r.fits is False and r.over_by_bytes == r.peak_bytes - r.usable_bytes > 0
    assert r.usable_bytes == 25757220864 * 3 // 4  # JAX's default allocator share of the card
    assert any(w.startswith("does not fit rtx4090") for w in r.warnings)
    # XLA's pass ran and fell short without saving a byte: a warning with its figures, no mark.
    assert not r.xla_remat and r.xla_remat_saved_bytes == 0
    assert any("could not bring the program under its limit" in w for w in r.warnings)
    # The limit it worked to is the real process's: (bytes_limit - params - outputs) * 0.95.
    io = r.argument_bytes + r.output_bytes
    assert r.xla_remat_limit_bytes == int((r.usable_bytes - io) * 0.95) + r.output_bytes


def test_the_compile_seconds_are_the_time_the_report_took_to_compile():
    """A report's compile_seconds lie inside the wall time of the call that made it (issue 58
    mutant analysis.py:417 of seed 104, the start added to the end instead of taken off)."""
    import time

    x = jax.ShapeDtypeStruct((48, 40), jnp.float32)
    start = time.perf_counter()
    r = rk.memory_report(lambda a: jnp.tanh(a @ a.T).sum(), x, target="cpu", warn=False)
    wall = time.perf_counter() - start
    assert 0 < r.compile_seconds <= wall


def test_cpu_target_has_no_fit():
    r = rk.memory_report(
        _mlp,
        *[
            jax.ShapeDtypeStruct(a.shape, jnp.float32)
            for a in (jnp.zeros((8, 4)), jnp.zeros((4, 16)), jnp.zeros((16, 4)))
        ],
        target="cpu",
    )
    assert r.fits is None and r.target_memory_bytes is None and r.peak_bytes > 0


def test_bad_arguments():
    with pytest.raises(TypeError, match=r"arrays or jax\.ShapeDtypeStruct"):
        rk.memory_report(lambda s: s, "text", target="h100")
    with pytest.raises(ValueError, match="unknown target"):
        rk.memory_report(_mlp, *_mlp_args(), target="h1000")


class _ShapeOnly:
    shape = (4,)


class _DtypeOnly:
    dtype = jnp.float32


@pytest.mark.parametrize("leaf", [_ShapeOnly(), _DtypeOnly()], ids=["shape-only", "dtype-only"])
def test_an_argument_needs_both_a_shape_and_a_dtype(leaf):
    # abstract's docstring: arrays, ShapeDtypeStructs "or anything with shape and dtype";
    # one of the two is not enough, said in words before anything is traced.
    with pytest.raises(TypeError, match=r"arrays or jax\.ShapeDtypeStruct, got _"):
        rk.analysis.abstract({"w": leaf})


def test_one_sharding_places_every_leaf_and_a_tree_of_them_each_leaf_its_own():
    # abstract's sharding: a Sharding for every leaf, or a pytree prefix of Shardings.
    cpu = rk.target("cpu")
    one, other = cpu.sharding(), cpu.sharding(P(None))
    x, y = jax.ShapeDtypeStruct((4,), jnp.float32), jnp.zeros((2, 2), jnp.bfloat16)
    got = rk.analysis.abstract((x, {"y": y}), one)
    assert [a.sharding for a in jax.tree.leaves(got)] == [one, one]
    got = rk.analysis.abstract((x, {"y": y}), (other, {"y": one}))
    assert [a.sharding for a in jax.tree.leaves(got)] == [other, one]
    assert [(a.shape, a.dtype) for a in jax.tree.leaves(got)] == [
        ((4,), jnp.float32),
        ((2, 2), jnp.bfloat16),
    ]


def test_a_report_asked_to_dump_leaves_xlas_dump_there(tmp_path):
    # memory_report's dump_to: "a directory where XLA dumps this compile" (a one-op program).
    x = jax.ShapeDtypeStruct((8,), jnp.float32)
    rk.memory_report(lambda a: a * 2, x, target="cpu", dump_to=str(tmp_path), warn=False)
    assert any(p.name.endswith(".txt") for p in tmp_path.iterdir())


@pytest.mark.parametrize("given", [2, 0], ids=["longer", "shorter"])
def test_a_sharding_per_argument_must_be_one_for_each(given):
    # One argument, two shardings (or none): not one sharding left over or an argument
    # placed nowhere, but an error before anything is traced.
    x = jax.ShapeDtypeStruct((4,), jnp.float32)
    shardings = [rk.target("cpu").sharding()] * given
    with pytest.raises(rk.BadValue, match=f"in_shardings has {given} shardings for 1 arg") as e:
        rk.memory_report(lambda a: a * 2, x, target="cpu", in_shardings=shardings, warn=False)
    assert e.value.param == "in_shardings"


@pytest.mark.slow
def test_measure_warns_with_the_public_remat_warning():
    """measure(..., warn=True) issues rk.RematWarning (a name-based policy that saves nothing:
    cuDNN's attention never makes the scores it names)."""
    src = rk.sources.resolve(PresetSpec("tiny-llama"))
    config = rk.TrainConfig(2, 32, optimizer="sgd")
    with pytest.warns(rk.RematWarning, match="attn_scores but the program tags none of them"):
        r = rk.sources.measure(src, "names:save=attn_scores", "h100", config, warn=True)
    assert r.attention == "cudnn" and r.warnings
    assert rk.RematWarning is rk.analysis.RematWarning and "RematWarning" in rk.__all__


# --- boundaries: the limit itself, and the largest batch where the peak is not monotone ---------


@pytest.mark.slow
def test_a_report_fits_at_its_limit_and_not_one_byte_over(small):
    r = small("full")
    at = r.replace(peak_bytes=r.usable_bytes)
    over = r.replace(peak_bytes=r.usable_bytes + 1)
    assert (at.fits, at.over_by_bytes) == (True, 0)
    assert (over.fits, over.over_by_bytes) == (False, 1)
    assert rk.MemoryReport.from_dict(over.to_dict()).fits is False


def _zigzag(batch: int) -> int:
    """A peak that is not monotone in the batch: odd batches carry 150 bytes more, so an odd
    batch can need more than the even one above it (7 -> 850, 8 -> 800)."""
    return 100 * batch + (150 if batch % 2 else 0)


class _FakeWorkload:
    """What max_batch asks of a Workload, with _zigzag as the compiled peak (no compile)."""

    batch_multiple, seq, spread = 1, 8, None
    shapes_known = plannable = estimates = False
    target = rk.target("h100")

    def __init__(self):
        self.compiles, self.asked = 0, []

    def compiled(self, policy, schedule, batch):
        self.compiles += 1
        self.asked.append(batch)

        class Compiled:
            peak_bytes, xla_remat, attention = _zigzag(batch), False, None
            xla_remat_saved_bytes = 0

        return Compiled

    def recompute_of(self, policy, schedule, batch):
        return 0.0


# (Below 250 the answer is 0 by definition, "even the smallest batch does not fit", though
# batch 2 would: a search cannot prove a batch fits past one that does not.)
# With start=8 the line through batches 8 and 16 lands on 8 itself, at the limit to the byte.
@pytest.mark.parametrize(
    ("limit", "start"),
    [(800, None), (799, None), (801, None), (1000, None), (1049, None), (250, None), (800, 8)],
)
def test_max_batch_lands_on_the_boundary_of_a_peak_that_is_not_monotone(limit, start):
    fit = rk.max_batch(_FakeWorkload(), "full", limit_bytes=limit, start=start, cap=64)
    # The largest batch within the limit, by brute force: every larger one is over it.
    want = max((b for b in range(1, 65) if _zigzag(b) <= limit), default=0)
    assert fit.batch == want
    if want:
        assert fit.peak_bytes == _zigzag(want) <= limit
        assert fit.next_peak_bytes == _zigzag(want + 1) > limit
    else:
        assert fit.peak_bytes == _zigzag(1) > limit


@pytest.mark.parametrize(
    ("tags", "noted"),
    [
        (("query_proj", "context", "mlpwo"), True),  # flash: no score tensors in the program
        (("query_proj", "context", "attn_scores", "attn_probs", "mlpwo"), False),  # XLA's
        (("query_proj", "mlpwo"), False),  # no attention output tagged: nothing to say
    ],
)
def test_a_policy_that_recomputes_scores_is_noted_only_under_flash_attention(tags, noted):
    """The note says the scores a policy recomputes do not exist: true only where the program
    tags the attention output and no score tensor (a fused kernel's)."""
    from helpers import memory_report
    from remat_kit.analysis import report_notes

    r = memory_report("h100", tags=tags)
    keeps_context = rk.as_policy("names:save=context+query_proj")
    kinds = [n.kind for n in report_notes(r, keeps_context, rk.target("h100"))]
    assert ("flash_recomputes_scores" in kinds) == noted


@pytest.mark.parametrize(
    ("meta", "tokens"),
    [
        ({"batch": 4, "seq": 2048}, 8192),
        ({"batch": 4}, None),
        ({}, None),
        ({"batch": 2.0, "seq": 8}, None),
    ],
)
def test_tokens_per_step_come_from_the_labels(meta, tokens):
    assert memory_report(meta=meta).tokens_per_step == tokens


@pytest.mark.parametrize(
    ("host_bytes", "link", "flops"),
    [(0, 64e9, 989e12), (2**30, None, 989e12), (2**30, 64e9, None)],
    ids=["nothing moved", "no host link", "no bf16 peak"],
)
def test_no_transfer_estimate_without_bytes_or_the_targets_rates(host_bytes, link, flops):
    import dataclasses

    t = dataclasses.replace(rk.target("h100"), host_link_bandwidth=link, peak_bf16_flops=flops)
    report = memory_report(host_bytes=host_bytes, host_temp_bytes=host_bytes, flops=1e12)
    assert rk.analysis.transfer_estimate(report, t) is None


def test_a_gpu_report_prices_its_kernels_and_a_program_without_any_has_no_step_time():
    from remat_kit.analysis import _step_time

    x = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16)
    r = rk.memory_report(lambda a: jnp.tanh(a @ a), x, target="h100", warn=False)
    assert r.step_time is not None and r.step_time.seconds > 0 and r.step_time.flops > 0
    assert _step_time([], rk.target("h100")) is None


@pytest.mark.parametrize(
    ("temp", "host", "moved"),
    [(3 * 2**30, 2**30, 3 * 2**30), (0, 2**30, 2**30)],
    ids=["offloaded residuals", "host arguments only"],
)
def test_the_transfer_estimate_prices_what_went_to_host_memory(temp, host, moved):
    # XLA's host temporaries are the offloaded residuals; without any, the host bytes.
    t = rk.target("h100")
    report = memory_report(host_bytes=host, host_temp_bytes=temp, flops=1e12)
    est = rk.analysis.transfer_estimate(report, t)
    assert est.host_bytes == moved
    assert est.transfer_seconds == pytest.approx(2 * moved / t.host_link_bandwidth)


def test_a_reports_labels_are_typed_and_its_json_keeps_every_one():
    # Writers give plain dicts ({**r.meta, "depth": d} among them): the report types the
    # labels code reads and keeps the rest, and its JSON lists each label as it was given.
    labels = {"model": "tiny-llama", "batch": 2, "seq": 16, "program": "f00d", "scan": True}
    r = memory_report(meta=labels)
    r = r.replace(meta={**r.meta, "depth": {"mode": "extrapolated"}})
    assert (r.meta.batch, r.meta.program, r.meta.depth) == (2, "f00d", {"mode": "extrapolated"})
    assert r.meta.extra == {"scan": True} and r.meta.layers is None
    assert json.loads(json.dumps(r.to_dict()))["meta"] == {
        **labels,
        "depth": {"mode": "extrapolated"},
    }
    assert rk.MemoryReport.from_dict(r.to_dict()) == r
    for bad in ([("batch", 2)], {2: "batch"}):  # not a mapping; a key that is not a str
        with pytest.raises(rk.errors.BadType, match="mapping of str"):
            memory_report(meta=bad)


def _fake_compile(saved: int):
    """A stand-in for ``compiled_memory``: 64 B of each kind, XLA's remat pass saving
    ``saved`` bytes; no compile."""
    from remat_kit.xla import CompiledMemory

    def fake_compiled_memory(lowered, t, options=None, dump_to=None):
        return CompiledMemory(
            **dict.fromkeys(("argument_bytes", "output_bytes", "temp_bytes"), 64),
            alias_bytes=0,
            generated_code_bytes=0,
            host_bytes=0,
            host_temp_bytes=0,
            xla_peak_bytes=None,
            xla_remat_limit_bytes=None,
            xla_remat_saved_bytes=saved,
            xla_remat_fell_short=False,
            xla_messages=(),
            compile_seconds=0.0,
        )

    return fake_compiled_memory


@pytest.mark.parametrize(
    ("saved", "marked"),
    [(0, False), (2**20 - 1, False), (2**20, True), (2**20 + 1, True), (3 * 2**29, True)],
    ids=["nothing", "a byte under 1 MiB", "1 MiB", "a byte over 1 MiB", "1.5 GiB"],
)
def test_xla_remat_is_marked_from_one_mib_saved(monkeypatch, saved, marked):
    # XLA's pass clones instructions even where it saves next to nothing: a report marks it
    # (xla_remat, and a note a user reads) from 1 MiB (2**20 B) taken off the peak, not below.
    # The compile is a fake whose remat pass saved `saved` bytes: no compile, the real report.
    monkeypatch.setattr(rk.analysis, "compiled_memory", _fake_compile(saved))
    x = jax.ShapeDtypeStruct((16,), jnp.float32)
    r = rk.memory_report(lambda a: a * 2, x, target="h100", warn=False)
    assert r.xla_remat is marked and r.xla_remat_saved_bytes == saved
    said = [w for w in r.warnings if "XLA's own rematerialization pass took" in w]
    assert len(said) == int(marked)
    assert [n.data["saved_bytes"] for n in r.notes if n.kind == "xla_remat"] == [saved] * marked


@pytest.mark.parametrize(("devices", "summary"), [(1, None), (2, {}), (8, {})])
def test_a_report_over_two_devices_or_more_says_what_they_exchange(monkeypatch, devices, summary):
    # From two devices on a step may exchange data: its report carries the collectives'
    # summary (empty: this program has none). The compile is a fake; the report is real.
    monkeypatch.setattr(rk.analysis, "compiled_memory", _fake_compile(0))
    x = jax.ShapeDtypeStruct((16,), jnp.float32)
    t = rk.target("h100", devices=devices)
    r = rk.memory_report(lambda a: a * 2, x, target=t, warn=False)
    assert r.meta.get("collectives") == summary


def _tagged(x, w):
    from jax.ad_checkpoint import checkpoint_name

    h = checkpoint_name(jnp.tanh(x @ w), "mlpwi")
    return checkpoint_name(h @ w.T, "mlpwo").sum()


@pytest.mark.parametrize(
    ("count_flops", "policy", "tags"),
    [
        (True, None, ("mlpwi", "mlpwo")),
        (False, "full", ("mlpwi", "mlpwo")),
        (False, None, ()),  # nothing asked the jaxpr: no trace is read for tags
    ],
)
def test_a_report_names_the_tags_its_program_carries(count_flops, policy, tags):
    # The tags are read off the jaxpr the compile was traced from, where one is read (FLOPs
    # counted, or a policy to check against): sorted, each once (seed-86 mutant
    # analysis.py:421, `is not -> is`: no tags where a jaxpr was read).
    x, w = jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 16), jnp.float32)
    r = rk.memory_report(
        jax.grad(_tagged, argnums=1), x, w, target="cpu", policy=policy,
        count_flops=count_flops, warn=False,
    )  # fmt: skip
    assert r.tags == tags
