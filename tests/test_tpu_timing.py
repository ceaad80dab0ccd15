"""Step-time pricing of what only a TPU program holds: Pallas kernels (MaxText's splash
attention, a kernel's own CostEstimate) and the collective-permutes libtpu decomposes
collectives into. Each expected figure is computed here independently of the pricing code: the
causal block count from a materialized mask, the link rate from the Cloud TPU page's figure."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import remat_kit as rk
from remat_kit.timing import Kernel, kernels_of, speed_of, step_time

pytest.importorskip("libtpu")

B, H, S, D = 2, 4, 2048, 128
QKV = f"bf16[{B},{H},{S},{D}]"


def _splash(name: str, out: str, grid: tuple[int, int] = (4, 4), extra: str = "") -> str:
    """A one-kernel program: a tpu_custom_call as MaxText's splash attention writes it (block
    masks first, then q, k, v)."""
    mask = f"s8[1,{grid[0]},{grid[1]}]"
    return "\n".join(
        [
            f"ENTRY %e (m: {mask}, q: {QKV}, k: {QKV}, v: {QKV}) -> {out} {{",
            f"  %m = {mask}{{2,1,0}} parameter(0)",
            f"  %q = {QKV}{{3,2,1,0}} parameter(1)",
            f"  %k = {QKV}{{3,2,1,0}} parameter(2)",
            f"  %v = {QKV}{{3,2,1,0}} parameter(3)",
            f"  ROOT %{name}.1 = {out} custom-call(%m, %m, %q, %k, %v), "
            f'custom_call_target="tpu_custom_call"{extra}',
            "}",
        ]
    )


def _causal_share(grid: tuple[int, int]) -> float:
    # The mask itself, cut into the kernel's blocks: a block runs if any element is visible.
    mask = np.tril(np.ones((S, S), bool))
    blocks = mask.reshape(grid[0], S // grid[0], grid[1], S // grid[1]).any(axis=(1, 3))
    return blocks.sum() / blocks.size


@pytest.mark.parametrize(
    ("name", "out", "products", "grid"),
    [
        ("splash_mha_fwd_segmented_residuals", QKV, 2, (4, 4)),
        ("splash_mha_fwd_segmented_residuals", QKV, 2, (4, 2)),
        ("splash_mha_dq_segmented_no_residuals", QKV, 3, (4, 4)),
        ("splash_mha_dkv_segmented_no_residuals", f"({QKV}, {QKV})", 4, (4, 4)),
        ("splash_mha_dkv_segmented_no_residuals", f"({QKV}, {QKV}, {QKV})", 5, (4, 4)),
    ],
)
def test_splash_attention_is_priced_from_its_shapes(name, out, products, grid):
    (k,) = kernels_of(_splash(name, out, grid))
    assert k.kind == "attention"
    assert k.flops == pytest.approx(2 * products * B * H * S * S * D * _causal_share(grid))


def test_a_pallas_kernels_own_cost_estimate_is_used():
    cfg = (
        ', backend_config={"custom_call_config":{"body":"x","cost_estimate":'
        '{"flops":1e12,"transcendentals":0,"bytes_accessed":2e9}}}'
    )
    (k,) = kernels_of(_splash("my_kernel", QKV, extra=cfg))
    assert (k.kind, k.flops, k.bytes) == ("gemm", 1e12, 2_000_000_000)


def test_a_pallas_kernel_whose_metadata_breaks_its_line_keeps_its_cost_estimate():
    # MaxText's megablox gmm passes xprof metadata (JSON) that libtpu's text prints over
    # three lines, before the backend_config that holds the kernel's CostEstimate: the
    # instruction is read to its closing brace, not to the end of its first line.
    cfg = (
        ', frontend_attributes={kernel_metadata={\n"xprof_metadata":"{\\"tiling\\": '
        '{\\"tile_m\\": 128}}"\n}}, metadata={op_name="jit(f)/pallas_call"}, '
        'backend_config={"custom_call_config":{"body":"x","cost_estimate":'
        '{"flops":"100663296","transcendentals":"0","bytes_accessed":"3211264"}}}'
    )
    (k,) = kernels_of(_splash("gmm", QKV, extra=cfg))
    assert (k.kind, k.flops, k.bytes) == ("gemm", 2 * 512 * 256 * 384, 3_211_264)


@pytest.mark.slow
def test_maxtexts_megablox_kernels_are_priced_from_their_cost_estimates():
    # MaxText's own gmm and tgmm (the kernels of a megablox MoE layer), compiled by libtpu
    # for one v5p chip: each runs 2 m k n FLOPs, as its source's CostEstimate says.
    ops = pytest.importorskip("maxtext.kernels.megablox.ops")
    import jax
    import jax.numpy as jnp
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    topology = topologies.get_topology_desc(topology_name="v5p:2x2x1", platform="tpu")
    one = NamedSharding(Mesh(np.array(topology.devices[:1]), ("x",)), PartitionSpec())
    m, k, n, groups = 512, 256, 384, 4

    def loss(lhs, rhs, sizes):
        out = ops.gmm(lhs, rhs, sizes, preferred_element_type=jnp.bfloat16)
        return out.astype(jnp.float32).sum()

    args = (
        jax.ShapeDtypeStruct((m, k), jnp.bfloat16, sharding=one),
        jax.ShapeDtypeStruct((groups, k, n), jnp.bfloat16, sharding=one),
        jax.ShapeDtypeStruct((groups,), jnp.int32, sharding=one),
    )
    text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args).compile().as_text()
    assert "kernel_metadata={\n" in text  # the line break this reads past
    pallas = [x for x in kernels_of(text) if "gmm" in x.name]
    assert sorted(x.name.split("___")[0] for x in pallas) == [
        "transpose_jvp_jit_gmm", "transpose_jvp_jit_tgmm"
    ]  # fmt: skip
    assert [(x.kind, x.flops) for x in pallas] == [("gemm", 2.0 * m * k * n)] * 2


def test_an_unknown_pallas_kernel_stays_memory_bound():
    (k,) = kernels_of(_splash("my_kernel", QKV))
    assert (k.kind, k.flops) == ("memory", 0.0)


def test_a_tpu_permute_sends_its_buffer_over_one_link_one_way():
    nbytes = 8 * 2**20
    text = "\n".join(
        [
            "ENTRY %e (p: bf16[2048,2048]) -> bf16[2048,2048] {",
            "  %p = bf16[2048,2048]{1,0} parameter(0)",
            "  %s = (bf16[2048,2048]{1,0}, bf16[2048,2048]{1,0}, u32[], u32[]) "
            "collective-permute-start(%p), channel_id=1, "
            "source_target_pairs={{0,1},{1,2},{2,3},{3,0}}",
            "  ROOT %d = bf16[2048,2048]{1,0} collective-permute-done(%s)",
            "}",
        ]
    )
    t = step_time(kernels_of(text), speed_of(rk.target("v5e-4")))
    # Cloud TPU v5e page: 400 GB/s ICI per chip, both ways, over 4 ports: 50 GB/s a link a
    # way; the stated 0.90 share of it.
    assert t.collective_seconds == pytest.approx(nbytes / (400e9 / 8 * 0.90))


_ADD = [
    "%add (a: bf16[], b: bf16[]) -> bf16[] {",
    "  %a = bf16[] parameter(0)",
    "  %b = bf16[] parameter(1)",
    "  ROOT %r = bf16[] add(%a, %b)",
    "}",
]
_GROUP = "replica_groups={{0,1,2,3}}, use_global_device_ids=true"
#: A 2048 x 2048 bf16 buffer over v5e-4's 2 x 2 torus: a ring over both axes, both ways, on
#: the chip's 4 ports at 50 GB/s a way (Cloud TPU v5e: 400 GB/s a chip both ways), 0.90 of it;
#: a gather or scatter moves 3/4 of the buffer.
_RING_S = 2048 * 2048 * 2 * 3 / 4 / (4 * 50e9 * 0.90)


def test_libtpus_all_reduce_scatter_fusion_is_one_reduce_scatter():
    text = "\n".join(
        [
            *_ADD,
            "%all-reduce-scatter.1 (i: bf16[2048,2048]) -> bf16[512,2048] {",
            "  %i = bf16[2048,2048]{1,0} parameter(0)",
            f"  %ar = bf16[2048,2048]{{1,0}} all-reduce(%i), channel_id=1, {_GROUP}, to_apply=%add",
            "  ROOT %s = bf16[512,2048]{1,0} slice(%ar), slice={[0:512], [0:2048]}",
            "}",
            "ENTRY %e (p: bf16[2048,2048]) -> bf16[512,2048] {",
            "  %p = bf16[2048,2048]{1,0} parameter(0)",
            "  ROOT %f = bf16[512,2048]{1,0} fusion(%p), kind=kCustom, calls=%all-reduce-scatter.1",
            "}",
        ]
    )
    (k,) = kernels_of(text)
    assert (k.kind, k.op, k.group) == ("collective", "reduce-scatter", 4)
    t = step_time([k], speed_of(rk.target("v5e-4")))
    assert t.collective_seconds == pytest.approx(_RING_S)


def test_a_continuation_fusions_all_gather_hides_behind_the_compute_it_spans():
    # v5e's default (libtpu's continuation fusion): a custom fusion starts the all-gather, a
    # product runs, another custom fusion (holding the same all-gather) finishes it.
    pair = "(bf16[512,2048]{1,0}, bf16[2048,2048]{1,0})"
    ag = f"all-gather(%X), channel_id=1, {_GROUP}, dimensions={{0}}"
    text = "\n".join(
        [
            f"%start (s0: bf16[512,2048]) -> {pair} {{",
            "  %s0 = bf16[512,2048]{1,0} parameter(0)",
            "  %ag = bf16[2048,2048]{1,0} " + ag.replace("X", "s0"),
            f'  ROOT %c = {pair} custom-call(%ag), custom_call_target="AsyncCollectiveStart"',
            "}",
            "%done (d0: bf16[512,2048], d1: bf16[2048,2048]) -> bf16[2048,2048] {",
            "  %d0 = bf16[512,2048]{1,0} parameter(0)",
            "  %d1 = bf16[2048,2048]{1,0} parameter(1)",
            "  %ag2 = bf16[2048,2048]{1,0} " + ag.replace("X", "d0"),
            "  ROOT %c2 = bf16[2048,2048]{1,0} custom-call(%d1, %ag2), "
            'custom_call_target="AsyncCollectiveDone"',
            "}",
            "ENTRY %e (p: bf16[512,2048], x: bf16[4096,4096]) -> bf16[4096,4096] {",
            "  %p = bf16[512,2048]{1,0} parameter(0)",
            "  %x = bf16[4096,4096]{1,0} parameter(1)",
            f"  %st = {pair} fusion(%p), kind=kCustom, calls=%start",
            "  %g0 = bf16[512,2048]{1,0} get-tuple-element(%st), index=0",
            "  %g1 = bf16[2048,2048]{1,0} get-tuple-element(%st), index=1",
            "  %mm = bf16[4096,4096]{1,0} dot(%x, %x), lhs_contracting_dims={1}, "
            "rhs_contracting_dims={0}",
            "  %dn = bf16[2048,2048]{1,0} fusion(%g0, %g1), kind=kCustom, calls=%done",
            "  ROOT %t = (bf16[4096,4096]{1,0}, bf16[2048,2048]{1,0}) tuple(%mm, %dn)",
            "}",
        ]
    )
    t = step_time(kernels_of(text), speed_of(rk.target("v5e-4")))
    # One transfer (the done's copy is the same one), all of it under the product.
    assert t.collective_seconds == 0.0
    assert t.collective_hidden_seconds == pytest.approx(_RING_S)


def test_a_host_offloaded_slice_moves_the_slice_beside_the_compute():
    # One layer's residual written into a stack in pinned host memory (S(5)), as libtpu
    # offloads it: the transfer is the 4 MiB slice, not the 32 MiB stack, and on a TPU it
    # runs beside the product scheduled around it.
    stack = "bf16[8,2,1024,1024]{3,2,1,0:S(5)}"
    piece = "bf16[1,2,1024,1024]{3,2,1,0}"
    text = "\n".join(
        [
            f"ENTRY %e (b: {stack}, u: {piece}, i: s32[], x: bf16[4096,4096]) -> {stack} {{",
            f"  %b = {stack} parameter(0)",
            f"  %u = {piece} parameter(1)",
            "  %i = s32[] parameter(2)",
            "  %x = bf16[4096,4096]{1,0} parameter(3)",
            f"  %s = (({stack}, {piece}, s32[], s32[], s32[], s32[]), {stack}, u32[]) "
            "dynamic-update-slice-start(%b, %u, %i, %i, %i, %i)",
            "  %mm = bf16[4096,4096]{1,0} dot(%x, %x), lhs_contracting_dims={1}, "
            "rhs_contracting_dims={0}",
            f"  ROOT %d = {stack} dynamic-update-slice-done(%s)",
            "}",
        ]
    )
    (k,) = [k for k in kernels_of(text) if k.kind == "host_transfer"]
    assert k.host_bytes == 2 * 1024 * 1024 * 2
    t = step_time(kernels_of(text), speed_of(rk.target("v6e-4")))
    assert t.transfer_seconds == 0.0  # 4 MiB over the host link hides behind 137 GFLOP


def test_a_slice_read_back_from_the_host_moves_the_slice():
    stack = "bf16[8,2,1024,1024]{3,2,1,0:S(5)}"
    text = "\n".join(
        [
            f"ENTRY %e (b: {stack}, i: s32[]) -> bf16[1,2,1024,1024] {{",
            f"  %b = {stack} parameter(0)",
            "  %i = s32[] parameter(1)",
            "  ROOT %s = bf16[1,2,1024,1024]{3,2,1,0} dynamic-slice(%b, %i, %i, %i, %i), "
            "dynamic_slice_sizes={1,2,1024,1024}",
            "}",
        ]
    )
    (k,) = kernels_of(text)
    assert (k.kind, k.host_bytes) == ("host_transfer", 2 * 1024 * 1024 * 2)


# --- issue 62: what the Llama3.1-8B v6e rows priced too fast -----------------------------------


@pytest.mark.parametrize(
    ("slice_", "peak", "mxu"), [("v6e-4", 918e12, 256), ("v5e-4", 197e12, 128)]
)
def test_splash_attentions_head_dim_fills_the_mxu_it_has(slice_, peak, mxu):
    # Every product of jax's splash kernels holds an operand with the head dim (128 here) as
    # one side in the systolic array: half of v6e's 256 x 256 (Cloud's v6e page), all of a
    # 128 x 128 one. The Cloud pages' peaks at the stated 0.90 share, the fill by hand.
    (k,) = kernels_of(_splash("splash_mha_fwd_segmented_residuals", QKV))
    fill = {256: 0.5, 128: 1.0}[mxu]
    t = step_time([k], speed_of(rk.target(slice_)))
    assert t.attention_seconds == pytest.approx(k.flops / (peak * 0.90 * fill))


def _transfer(op: str, nbytes: int) -> Kernel:
    return Kernel("host_transfer", count=1, flops=0.0, bytes=0, host_bytes=nbytes, op=op,
                  asynchronous=True)  # fmt: skip


def test_an_offload_hides_behind_the_forward_and_its_read_back_behind_the_backward():
    # A step of 3 ms of products (none recomputed): its forward is 1 ms, its backward 2 ms.
    # v6e's host link: 32 GB/s a way (scaling book) at the 0.86 share. 1.5 ms each way: the
    # offload waits 0.5 ms past the forward; the read-back hides in the backward.
    s = speed_of(rk.target("v6e-4"))
    product = 3e-3 * 918e12 * 0.90
    gemm = Kernel("gemm", count=1, flops=product, bytes=0, m=4096, n=4096, k=4096, dtype="bf16")
    each_way = int(1.5e-3 * 32e9 * 0.86)
    t = step_time(
        [gemm, _transfer("dynamic-update-slice-start", each_way),
         _transfer("dynamic-slice-start", each_way)], s,
    )  # fmt: skip
    assert t.matmul_seconds == pytest.approx(3e-3)
    assert t.transfer_seconds == pytest.approx(0.5e-3, rel=1e-6)
    # An offload alone (nothing read back) still hides behind all the compute.
    alone = step_time([gemm, _transfer("dynamic-update-slice-start", 2 * each_way)], s)
    assert alone.transfer_seconds == 0.0


def test_a_recomputed_product_is_backward_work_for_the_offloads_window():
    # 3 ms of products, 1.5 ms of them recomputed: the forward is (3 - 1.5) / 3 = 0.5 ms, so
    # a 1 ms offload waits 0.5 ms.
    s = speed_of(rk.target("v6e-4"))
    half = 1.5e-3 * 918e12 * 0.90
    fwd = Kernel("gemm", count=1, flops=half, bytes=0, m=4096, n=4096, k=4096, dtype="bf16")
    again = dataclasses.replace(fwd, recompute=True, m=2048)
    each_way = int(1e-3 * 32e9 * 0.86)
    t = step_time(
        [fwd, again, _transfer("dynamic-update-slice-start", each_way),
         _transfer("dynamic-slice-start", each_way)], s,
    )  # fmt: skip
    assert t.transfer_seconds == pytest.approx(0.5e-3, rel=1e-6)


@pytest.mark.parametrize(("slice_", "link"), [("v6e-4", 32e9), ("v5p-8", 1.5e10), ("v4-8", 16e9)])
def test_a_tpus_host_link_is_the_scaling_books_per_chip_figure(slice_, link):
    assert speed_of(rk.target(slice_)).host_link == link


def _counted_loop(start: int, limit: int, step: int) -> str:
    """A loop as libtpu writes one (no ``known_trip_count``): the counter, element 1 of its
    tuple, starts at ``start`` and the body adds ``step`` while it is under ``limit``; the
    body holds one 64x64x64 product."""
    tup = "(bf16[64,64], u32[])"
    return f"""HloModule m

%body (p: {tup}) -> {tup} {{
  %p = {tup} parameter(0)
  %x = bf16[64,64]{{1,0}} get-tuple-element(%p), index=0
  %i = u32[] get-tuple-element(%p), index=1
  %y = bf16[64,64]{{1,0}} dot(%x, %x), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  %s = u32[] constant({step})
  %j = u32[] add(%i, %s)
  ROOT %t = {tup} tuple(%y, %j)
}}

%cond (p: {tup}) -> pred[] {{
  %p = {tup} parameter(0)
  %i = u32[] get-tuple-element(%p), index=1
  %n = u32[] constant({limit})
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}}

ENTRY %e (a: bf16[64,64]) -> {tup} {{
  %a = bf16[64,64]{{1,0}} parameter(0)
  %c = u32[] constant({start})
  %z = u32[] copy(%c)
  %init = {tup} tuple(%a, %z)
  ROOT %loop = {tup} while(%init), condition=%cond, body=%body
}}
"""


@pytest.mark.parametrize(
    ("start", "limit", "step", "trips"),
    [
        (0, 16, 1, 16),  # a jax scan's counter
        (0, 8, 2, 4),  # libtpu's windowed einsum: two windows a trip
        (2, 8, 1, 6),
        (0, 7, 2, 4),  # 0, 2, 4, 6
    ],
)
def test_a_tpu_loop_runs_as_often_as_its_counter_says(start, limit, step, trips):
    # Row 13 of experiments/tpu_published.py: libtpu's windowed einsum loops count to 8 by 2;
    # read as one a trip, their products were priced twice.
    (dot,) = [k for k in kernels_of(_counted_loop(start, limit, step)) if k.kind == "gemm"]
    assert dot.count == trips
    assert dot.flops == 2 * 64 * 64 * 64


@pytest.mark.parametrize(("slice_", "peak"), [("v5e-4", 197e12), ("v5p-8", 459e12)])
def test_an_f32_product_runs_as_one_bf16_pass_on_a_tpu(slice_, peak):
    """jax's default precision runs an f32 product on the MXU as one bf16 pass: the same rate
    as bf16, 0.90 of the chip's published bf16 peak (assumed), where an H100's TF32 tensor
    cores run f32 at half its bf16 rate (issue 58 mutant _speed.py:293 of seed 103, the
    ratio doubled)."""
    tpu, h100 = speed_of(rk.target(slice_)), speed_of(rk.target("h100"))
    assert tpu.matmul_flops_per_s("f32") == tpu.matmul_flops_per_s("bf16") == 0.90 * peak
    assert h100.matmul_flops_per_s("f32") == h100.matmul_flops_per_s("bf16") / 2
