"""The step-time model: kernels read from optimized HLO, priced on a device's rates."""
# ruff: noqa: E501 -- the HLO text below is written as XLA prints it, one instruction a line

from __future__ import annotations

import dataclasses
import math
import tarfile
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import remat_kit as rk
from remat_kit.cache._entries import _from_record
from remat_kit.timing import Kernel, Speed, kernels_of, speed_of, step_time
from remat_kit.xla import compile_memory

ROOT = Path(__file__).resolve().parents[1]
H100_HLO = ROOT / "results" / "gpu_calibration_h100_hlo.tar.gz"

# A hand-written optimized-HLO module: a loop of 16 trips whose body slices a stacked weight,
# runs a cuBLAS product, causal cuDNN attention, an in-place update and a copy to host memory;
# an async all-gather over a mesh axis of 8 and a reduce-scatter over 4 listed devices.
_HLO = """HloModule m

%fused_slice (param_0: bf16[16,64,32], param_1: s32[]) -> bf16[1,64,32] {
  %param_0 = bf16[16,64,32]{2,1,0} parameter(0)
  %param_1 = s32[] parameter(1)
  %c = s32[] constant(0)
  ROOT %ds = bf16[1,64,32]{2,1,0} dynamic-slice(%param_0, %param_1, %c, %c), dynamic_slice_sizes={1,64,32}
}

%fused_update (param_0: bf16[16,128,32], param_1: bf16[1,128,32], param_2: s32[]) -> bf16[16,128,32] {
  %param_0 = bf16[16,128,32]{2,1,0} parameter(0)
  %param_1 = bf16[1,128,32]{2,1,0} parameter(1)
  %param_2 = s32[] parameter(2)
  %c = s32[] constant(0)
  ROOT %dus = bf16[16,128,32]{2,1,0} dynamic-update-slice(%param_0, %param_1, %param_2, %c, %c)
}

%fused_host (param_0: bf16[16,128,32], param_1: bf16[1,128,32], param_2: s32[]) -> bf16[16,128,32] {
  %param_0 = bf16[16,128,32]{2,1,0:S(5)} parameter(0)
  %param_1 = bf16[1,128,32]{2,1,0} parameter(1)
  %param_2 = s32[] parameter(2)
  %c = s32[] constant(0)
  ROOT %dus = bf16[16,128,32]{2,1,0:S(5)} dynamic-update-slice(%param_0, %param_1, %param_2, %c, %c)
}

%fused_rng (param_0: u32[128,64]) -> u32[128,64] {
  %param_0 = u32[128,64]{1,0} parameter(0)
  %x = u32[128,64]{1,0} xor(%param_0, %param_0)
  ROOT %y = u32[128,64]{1,0} add(%x, %param_0)
}

%body (p: (s32[], bf16[16,64,32], bf16[128,64], bf16[16,128,32], bf16[16,128,32])) -> (s32[], bf16[16,64,32], bf16[128,64], bf16[16,128,32], bf16[16,128,32]) {
  %p = (s32[], bf16[16,64,32]{2,1,0}, bf16[128,64]{1,0}, bf16[16,128,32]{2,1,0}, bf16[16,128,32]{2,1,0:S(5)}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %w = bf16[16,64,32]{2,1,0} get-tuple-element(%p), index=1
  %x = bf16[128,64]{1,0} get-tuple-element(%p), index=2
  %stack = bf16[16,128,32]{2,1,0} get-tuple-element(%p), index=3
  %host = bf16[16,128,32]{2,1,0:S(5)} get-tuple-element(%p), index=4
  %wl = bf16[1,64,32]{2,1,0} fusion(%w, %i), kind=kLoop, calls=%fused_slice
  %wb = bf16[64,32]{1,0} bitcast(%wl)
  %mm = (bf16[128,32]{1,0}, s8[4096]{0}) custom-call(%x, %wb), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  %y = bf16[128,32]{1,0} get-tuple-element(%mm), index=0
  %q = bf16[2,64,4,32]{3,2,1,0} bitcast(%y)
  %att = (bf16[2,64,4,32]{3,2,1,0}, f32[2,4,64]{2,1,0}, u8[0]{0}) custom-call(%q, %q, %q), custom_call_target="__cudnn$fmhaSoftmax", backend_config={"cudnn_fmha_backend_config":{"intermediate_tensor_shape":{"dimensions":["2","4","64","64"]},"mask_type":"CAUSAL"}}, metadata={op_name="jit(step)/transpose(jvp(M))/checkpoint/rematted_computation/attn"}
  %yb = bf16[1,128,32]{2,1,0} bitcast(%y)
  %st = bf16[16,128,32]{2,1,0} fusion(%stack, %yb, %i), kind=kLoop, calls=%fused_update
  %ho = bf16[16,128,32]{2,1,0:S(5)} fusion(%host, %yb, %i), kind=kLoop, calls=%fused_host
  ROOT %t = (s32[], bf16[16,64,32]{2,1,0}, bf16[128,64]{1,0}, bf16[16,128,32]{2,1,0}, bf16[16,128,32]{2,1,0:S(5)}) tuple(%i, %w, %x, %st, %ho)
}

%cond (p: (s32[], bf16[16,64,32], bf16[128,64], bf16[16,128,32], bf16[16,128,32])) -> pred[] {
  %p = (s32[], bf16[16,64,32]{2,1,0}, bf16[128,64]{1,0}, bf16[16,128,32]{2,1,0}, bf16[16,128,32]{2,1,0:S(5)}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(16)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (a: bf16[16,64,32], b: bf16[128,64], c: bf16[16,128,32], d: bf16[16,128,32], e: u32[128,64], g: bf16[64,32]) -> bf16[16,128,32] {
  %a = bf16[16,64,32]{2,1,0} parameter(0)
  %b = bf16[128,64]{1,0} parameter(1)
  %c = bf16[16,128,32]{2,1,0} parameter(2)
  %d = bf16[16,128,32]{2,1,0:S(5)} parameter(3)
  %e = u32[128,64]{1,0} parameter(4)
  %g = bf16[64,32]{1,0} parameter(5)
  %zero = s32[] constant(0)
  %alloc = bf16[16,128,32]{2,1,0:S(5)} custom-call(), custom_call_target="AllocateBuffer"
  %init = (s32[], bf16[16,64,32]{2,1,0}, bf16[128,64]{1,0}, bf16[16,128,32]{2,1,0}, bf16[16,128,32]{2,1,0:S(5)}) tuple(%zero, %a, %b, %c, %d)
  %loop = (s32[], bf16[16,64,32]{2,1,0}, bf16[128,64]{1,0}, bf16[16,128,32]{2,1,0}, bf16[16,128,32]{2,1,0:S(5)}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"16"}}
  %rng = u32[128,64]{1,0} fusion(%e), kind=kLoop, calls=%fused_rng
  %ags = (bf16[64,32]{1,0}, bf16[512,32]{1,0}) all-gather-start(%g), replica_groups=mesh['x'=8,'y'=2] {'x'}, dimensions={0}
  %agd = bf16[512,32]{1,0} all-gather-done(%ags)
  %rs = bf16[128,32]{1,0} reduce-scatter(%agd), replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%cond
  ROOT %out = bf16[16,128,32]{2,1,0} get-tuple-element(%loop), index=3
}
"""


@pytest.fixture(scope="module")
def toy() -> dict[str, Kernel]:
    kernels = kernels_of(_HLO)
    by_op = {}
    for k in kernels:
        by_op.setdefault(k.op if k.kind != "memory" else k.name, k)
    return by_op


def test_the_loop_body_runs_its_trip_count_and_a_product_has_its_flops(toy):
    mm = toy["cublas"]
    assert mm.kind == "gemm" and mm.count == 16
    assert (mm.m, mm.n, mm.k) == (128, 32, 64)
    assert mm.flops == 2 * 128 * 32 * 64
    # reads x [128,64] and the slice [64,32], writes [128,32]; the s8 workspace is scratch
    assert mm.bytes == 2 * (128 * 64 + 64 * 32 + 128 * 32)


def test_a_fusion_that_slices_a_stacked_weight_reads_the_slice(toy):
    sliced = toy["wl"]
    assert sliced.count == 16
    assert sliced.bytes == 2 * (64 * 32) * 2 + 4  # slice read + slice written + the s32 index


def test_an_in_place_update_moves_the_update_not_the_buffer(toy):
    upd = toy["st"]
    assert upd.bytes == 2 * (128 * 32) * 2 + 4  # the update read and written, the index


def test_an_update_of_a_buffer_in_host_memory_crosses_the_host_link(toy):
    host = toy["host_transfer" if "host_transfer" in toy else "fusion"]
    assert host.kind == "host_transfer" and host.count == 16
    assert host.host_bytes == 2 * 128 * 32
    assert host.bytes == 2 * 128 * 32 + 4  # the update read from device memory, the index


def test_causal_attention_flops_and_recompute(toy):
    att = toy["attention_fwd"]
    assert att.kind == "attention" and att.recompute and att.count == 16
    assert att.flops == 4 * 2 * 4 * 64 * 64 * 32 / 2
    assert (att.m, att.n, att.k, att.batch) == (64, 64, 32, 8)


def test_arithmetic_of_a_fusion_is_counted_per_element(toy):
    assert toy["rng"].ops == 2 * 128 * 64


def test_collectives_group_size_and_async_output(toy):
    ag = toy["all-gather"]
    assert ag.group == 8 and ag.asynchronous
    assert ag.bytes == 2 * 512 * 32  # the gathered output, not inputs + outputs
    rs = toy["reduce-scatter"]
    assert rs.group == 4 and not rs.asynchronous
    assert rs.bytes == 2 * 512 * 32  # the input it scatters


# The three ways XLA writes a collective's device groups, and a fusion its own remat pass cloned.
_GROUPS_HLO = """HloModule g

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused_neg (param_0: f32[256]) -> f32[256] {
  %param_0 = f32[256]{0} parameter(0)
  ROOT %n = f32[256]{0} negate(%param_0)
}

ENTRY %main (x: f32[256]) -> f32[256] {
  %x = f32[256]{0} parameter(0)
  %iota = f32[256]{0} all-reduce(%x), replica_groups=[2,4]<=[8], to_apply=%sum
  %two = f32[256]{0} all-reduce(%iota), replica_groups=mesh['dp'=2,'tp'=4,'pp'=3] {'dp','tp'}, to_apply=%sum
  %one = f32[256]{0} all-reduce(%two), replica_groups={{0},{1}}, to_apply=%sum
  %neg = f32[256]{0} fusion(%one), kind=kLoop, calls=%fused_neg
  ROOT %neg.remat2 = f32[256]{0} fusion(%neg), kind=kLoop, calls=%fused_neg
}
"""


def test_group_sizes_in_each_of_xlas_forms_and_its_own_clones_are_recompute():
    by_name = {k.name: k for k in kernels_of(_GROUPS_HLO)}
    # [2,4]<=[8]: 2 groups of 4; a mesh's named axes multiply (2 x 4, pp not named); one device.
    assert {n: by_name[n].group for n in ("iota", "two", "one")} == {"iota": 4, "two": 8, "one": 1}
    assert by_name["neg.remat2"].recompute and not by_name["neg"].recompute


def test_buffer_reservations_launch_nothing():
    assert all(k.op != "AllocateBuffer" for k in kernels_of(_HLO))


@pytest.fixture(scope="module")
def h100_llama() -> tuple[Kernel, ...]:
    with tarfile.open(H100_HLO) as tar:
        text = tar.extractfile("llama3.2-1b_minimal.hlo").read().decode()
    return kernels_of(text)


def test_a_real_h100_compile_has_the_models_matmul_flops(h100_llama):
    # llama3.2-1b: per layer q, o 2048x2048, k, v 2048x512, three MLP 2048x8192; 16 layers;
    # tied head 2048x128256. Training: 6 x params x tokens (b4 s2048).
    per_layer = 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192
    params = 16 * per_layer + 2048 * 128256
    expected = 6 * params * 4 * 2048
    got = sum(k.flops * k.count for k in h100_llama if k.kind == "gemm" and not k.recompute)
    assert got == pytest.approx(expected, rel=1e-3)


def test_a_real_h100_compile_has_flash_attention_forward_backward_and_recompute(h100_llama):
    fwd = 16 * 4 * 4 * 32 * 2048 * 2048 * 64 / 2  # 16 layers, causal
    att = [k for k in h100_llama if k.kind == "attention"]
    total = sum(k.flops * k.count for k in att)
    recomputed = sum(k.flops * k.count for k in att if k.recompute)
    assert total == pytest.approx(fwd * (1 + 2.5 + 1))  # forward, backward, minimal recomputes
    assert recomputed == pytest.approx(fwd)


def _speed():
    return speed_of(rk.target("h100"))


def test_a_product_is_priced_by_flops_waves_and_bytes():
    s = _speed()
    k = Kernel("gemm", count=3, flops=2.0 * 8192**3, bytes=0, m=8192, n=8192, k=8192, batch=1,
               dtype="bf16")  # fmt: skip
    t = step_time([k], s)
    tiles = 64 * 64
    waves = math.ceil(tiles / 132) * 132 / tiles
    rate = 989e12 * 0.81
    assert t.matmul_seconds == pytest.approx(3 * 2.0 * 8192**3 / rate * waves)
    assert t.launch_seconds == pytest.approx(3 * 3e-6)
    # a product too thin for its bytes is memory-bound
    thin = Kernel("gemm", count=1, flops=1e6, bytes=10**9, m=8, n=8, k=8, batch=1, dtype="bf16")
    assert step_time([thin], s).matmul_seconds == pytest.approx(1e9 / (3.35232e12 * 0.9))


def test_a_batched_product_spreads_every_batchs_tiles_over_the_sms():
    # 3 x (2 x 2) = 12 output tiles on 132 SMs: one wave, 120 SMs idle; unbatched, the
    # same FLOPs over 4 tiles would take the same one wave.
    s = _speed()
    k = Kernel("gemm", count=1, flops=1e9, bytes=0, m=256, n=256, k=64, batch=3, dtype="bf16")
    assert step_time([k], s).matmul_seconds == pytest.approx(1e9 / (989e12 * 0.81) * 132 / 12)
    wide = dataclasses.replace(k, batch=50)  # 200 tiles: two waves of 132
    assert step_time([wide], s).matmul_seconds == pytest.approx(1e9 / (989e12 * 0.81) * 264 / 200)


@pytest.mark.parametrize(
    ("op", "head_dim", "efficiency"),
    [
        ("attention_fwd", 128, 0.50),
        ("attention_bwd", 128, 0.40),
        ("attention_bwd", 64, 0.40 * 0.8),  # a head under 128 wide fills the tiles less
    ],
)
def test_flash_attention_is_priced_at_its_direction_and_head_width(op, head_dim, efficiency):
    s = _speed()
    k = Kernel("attention", count=2, flops=4e12, bytes=10**6, k=head_dim, op=op)
    assert step_time([k], s).attention_seconds == pytest.approx(2 * 4e12 / (989e12 * efficiency))
    # Too few FLOPs for its bytes: the memory side is the time.
    light = dataclasses.replace(k, count=1, flops=1.0, bytes=10**10)
    assert step_time([light], s).attention_seconds == pytest.approx(1e10 / (3.35232e12 * 0.9))


def test_a_permute_sends_its_bytes_once_and_a_group_of_one_sends_nothing():
    s = _speed()
    permute = Kernel("collective", count=1, flops=0.0, bytes=10**9, group=4,
                     op="collective-permute")  # fmt: skip
    assert step_time([permute], s).collective_seconds == pytest.approx(1e9 / 370e9)
    alone = dataclasses.replace(permute, group=1, op="all-reduce")
    assert step_time([alone], s).collective_seconds == 0.0


def test_a_host_transfer_also_moves_its_device_bytes():
    s = _speed()
    k = Kernel("host_transfer", count=1, flops=0.0, bytes=10**9, host_bytes=10**9)
    assert step_time([k], s).transfer_seconds == pytest.approx(
        1e9 / (64e9 * 0.86) + 1e9 / (3.35232e12 * 0.9)
    )


def test_recomputed_kernels_carry_their_launches_and_no_model_flops():
    s = _speed()
    again = Kernel("attention", count=3, flops=1e9, bytes=0, k=128, op="attention_fwd",
                   recompute=True)  # fmt: skip
    t = step_time([again], s)
    assert t.recompute_seconds == pytest.approx(3 * (1e9 / (989e12 * 0.5) + 3e-6))
    assert (t.model_flops, t.flops) == (0.0, 3e9)


def test_f32_products_run_at_half_the_bf16_rate():
    s = _speed()
    bf = Kernel("gemm", count=1, flops=1e12, bytes=0, dtype="bf16")
    f32 = dataclasses.replace(bf, dtype="f32")
    assert step_time([f32], s).matmul_seconds == pytest.approx(
        2 * step_time([bf], s).matmul_seconds
    )


def test_host_transfers_are_added_at_the_links_efficiency():
    s = _speed()
    k = Kernel("host_transfer", count=2, flops=0.0, bytes=0, host_bytes=10**9)
    t = step_time([k], s)
    assert t.transfer_seconds == pytest.approx(2 * 1e9 / (64e9 * 0.86))
    assert t.seconds == pytest.approx(t.transfer_seconds + t.launch_seconds)


@pytest.mark.parametrize(
    ("op", "factor"), [("all-gather", 7 / 8), ("reduce-scatter", 7 / 8), ("all-reduce", 14 / 8)]
)
def test_ring_collectives_and_hiding_behind_compute(op, factor):
    s = _speed()
    coll = Kernel("collective", count=1, flops=0.0, bytes=8 * 10**9, group=8, op=op)
    alone = step_time([coll], s)
    # NCCL's ring over NVLink: 370 of the H100's 450 GB/s; an all-reduce, NVLink SHARP's 480
    # (NVIDIA/nccl-tests#212)
    bus = 480e9 if op == "all-reduce" else 370e9
    assert alone.collective_seconds == pytest.approx(8e9 * factor / bus)
    # the A100's NVSwitch does not reduce: its ring at the same share of 300 GB/s
    a100 = step_time([coll], speed_of(rk.target("a100-80gb"))).collective_seconds
    assert a100 == pytest.approx(8e9 * factor / (300e9 * 370 / 450))
    # an async one with no window read hides behind compute, up to the compute's length
    compute = Kernel("memory", count=1, flops=0.0, bytes=int(3.35232e12 * 0.9 * 0.01))
    hidden = step_time([dataclasses.replace(coll, asynchronous=True), compute], s)
    assert hidden.collective_hidden_seconds == pytest.approx(0.01)
    assert hidden.collective_seconds == pytest.approx(alone.collective_seconds - 0.01)


# (devices in the group, its run of consecutive ids, the stride between runs, devices per host,
# of them in one host): the ring's rate is min(NVLink ring, members in one host x NIC rate)
@pytest.mark.parametrize(
    ("group", "run", "stride", "per_host", "together"),
    [
        (8, 8, 0, 8, 8),  # fsdp inside a node: NVLink alone
        (16, 16, 0, 8, 8),  # fsdp over two nodes: each node's 8 NICs
        (4, 1, 8, 8, 1),  # data parallel over four nodes: one GPU's NIC
        (16, 4, 8, 8, 4),  # four of each node's GPUs in the group: four NICs
        # runs closer than a node: every other GPU of four nodes (0, 2, 4, 6 in the first)
        # and pairs four apart over two (0, 1, 4, 5): four of each node's NICs, not NVLink
        (16, 1, 2, 8, 4),
        (8, 2, 4, 8, 4),
        (8, 0, 0, 4, 4),  # runs not read: one block of ids, cut at the host's edge
    ],
)
def test_a_ring_across_hosts_runs_at_its_members_share_of_the_nics(
    group, run, stride, per_host, together
):
    s = _speed()
    k = Kernel("collective", count=1, flops=0.0, bytes=10**9, group=group, run=run,
               stride=stride, op="all-gather")  # fmt: skip
    nvlink = 450e9 * 370 / 450
    rate = nvlink if together == group else min(nvlink, together * 50e9 * 0.92)
    t = step_time([k], s, devices_per_host=per_host)
    assert t.collective_seconds == pytest.approx(1e9 * (group - 1) / group / rate)


@pytest.mark.parametrize(
    ("node", "rate"),
    [
        # a3-high: 4 x 200 Gbps for 8 GPUs at TCPX's 0.9; dp over nodes gets one GPU's share
        ("a3-high", 4 * 200e9 / 8 / 8 * 0.9),
        ("dgx-h100", 8 * 400e9 / 8 / 8 * 0.92),
        # a GB200 NVL72 rack is one NVLink domain: devices 0 and 8 (trays 1 and 3) use NVLink
        ("gb200-nvl72", None),
    ],
)
def test_a_node_prices_the_network_its_nics_give_each_gpu(node, rate):
    gpu = rk.targets.node(node).gpu
    t = rk.target(gpu, devices=16, node=node)
    s = speed_of(t)
    # devices 0 and 8: a data axis of 2 over 16 GPUs, one per 8-GPU node
    dp = Kernel("collective", count=1, flops=0.0, bytes=10**9, group=2, run=1, stride=8,
                op="all-gather")  # fmt: skip
    seconds = step_time([dp], s, devices_per_host=t.devices_per_host).collective_seconds
    expected = s.device_link * 370 / 450 if rate is None else rate
    assert seconds == pytest.approx(1e9 / 2 / expected)


def _window(kind, w, seconds, s, **more):
    if kind == "collective":  # an all-gather of 8 taking ``seconds`` on NVLink
        nbytes = int(seconds * 370e9 * 8 / 7)
        return Kernel("collective", count=1, flops=0.0, bytes=nbytes, group=8, run=8,
                      op="all-gather", asynchronous=True, window=w, **more)  # fmt: skip
    return Kernel("memory", count=1, flops=0.0, bytes=int(seconds * s.bytes_per_s()),
                  window=w, name=f"m{w}-{seconds}")  # fmt: skip


def test_a_collective_hides_only_behind_what_xla_scheduled_beside_it():
    s = dataclasses.replace(_speed(), kernel_seconds=0.0)
    kernels = [_window("collective", 1, 0.010, s), _window("memory", 1, 0.004, s),
               _window("memory", 0, 0.020, s)]  # fmt: skip
    t = step_time(kernels, s)
    # 4 ms beside it hide 4 of its 10 ms; the 20 ms after its done hide nothing
    assert t.collective_hidden_seconds == pytest.approx(0.004)
    assert t.collective_seconds == pytest.approx(0.006)
    # NCCL's 16 of the 132 SMs: the 4 ms overlapped run 132/116 as long
    assert t.contention_seconds == pytest.approx(0.004 * (132 / 116 - 1))
    assert t.seconds == pytest.approx(0.024 + 0.006 + t.contention_seconds)
    assert sum(t.split().values()) == pytest.approx(t.seconds)
    # the same collective with no window read: hidden behind the compute no window holds
    pooled = step_time([dataclasses.replace(kernels[0], window=0), *kernels[1:]], s)
    assert pooled.collective_hidden_seconds == pytest.approx(0.010)


@pytest.mark.parametrize(("name", "sms", "nccl"), [("h100", 132, 16), ("l4", 58, 2)])
def test_nccl_holds_sixteen_sms_over_nvlink_and_two_over_pcie(name, sms, nccl):
    # NVIDIA/nccl#689: "on DGX with 8 NICs ... 16 SMs"; "a PCI system with a single NIC ... 2"
    assert speed_of(rk.target(name)).contention == pytest.approx(sms / (sms - nccl) - 1)


@pytest.mark.parametrize(("sms", "contention"), [(1, 0.0), (2, 0.0), (3, 2.0), (4, 1.0)])
def test_a_gpu_with_no_more_sms_than_nccl_holds_has_no_contention(sms, contention):
    # An L4 is on PCIe (NCCL holds 2 SMs); a custom card of that many SMs or fewer leaves no
    # compute to slow down; with 3 SMs the compute beside a collective runs on 1: 3x as long.
    l4 = rk.target("l4")
    card = dataclasses.replace(
        l4, target_config=l4.target_config.replace("core_count: 58", f"core_count: {sms}")
    )
    assert speed_of(card).contention == pytest.approx(contention)


@pytest.mark.parametrize(("name", "nccl"), [("h100", 16), ("l4", 2)])
def test_a_gpu_whose_file_names_no_sm_count_is_taken_as_100_sms_throughout(name, nccl):
    """A custom GPU file with no ``core_count``: 100 SMs, in its units and in what NCCL's
    share of them costs the compute beside a collective (seed-96 mutant _speed.py:231,
    ``or 100`` -> ``or 101`` in the contention's own copy of the rule, lived)."""
    gpu = rk.target(name)
    card = dataclasses.replace(
        gpu,
        target_config="\n".join(
            line for line in gpu.target_config.splitlines() if "core_count" not in line
        ),
    )
    speed = speed_of(card)
    assert speed.units == 100
    assert speed.contention == pytest.approx(100 / (100 - nccl) - 1)


# Async pairs as XLA schedules them: a start, what runs before its done, and after; one
# wrapped in async-start/async-done; two in flight at once.
_WINDOWS_HLO = """HloModule w

%fused_neg (param_0: f32[256]) -> f32[256] {
  %param_0 = f32[256]{0} parameter(0)
  ROOT %n = f32[256]{0} negate(%param_0)
}

%wrapped (p: f32[32]) -> f32[256] {
  %p = f32[32]{0} parameter(0)
  ROOT %ag = f32[256]{0} all-gather(%p), replica_groups=mesh['dp'=4,'fsdp'=8] {'dp'}, dimensions={0}
}

ENTRY %main (x: f32[256], y: f32[32]) -> f32[256] {
  %x = f32[256]{0} parameter(0)
  %y = f32[32]{0} parameter(1)
  %ags = (f32[32]{0}, f32[256]{0}) all-gather-start(%y), replica_groups=[4,8]<=[32], dimensions={0}
  %f1 = f32[256]{0} fusion(%x), kind=kLoop, calls=%fused_neg
  %agd = f32[256]{0} all-gather-done(%ags)
  %f2 = f32[256]{0} fusion(%f1), kind=kLoop, calls=%fused_neg
  %as = ((f32[32]{0}), f32[256]{0}, s32[]) async-start(%y), calls=%wrapped
  %f3 = f32[256]{0} fusion(%f2), kind=kLoop, calls=%fused_neg
  %ad = f32[256]{0} async-done(%as)
  %f4 = f32[256]{0} fusion(%f3), kind=kLoop, calls=%fused_neg
  %s1 = (f32[32]{0}, f32[256]{0}) all-gather-start(%y), replica_groups={{0,8,16,24}}, dimensions={0}
  %s2 = (f32[32]{0}, f32[256]{0}) all-gather-start(%y), replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  %f5 = f32[256]{0} fusion(%f4), kind=kLoop, calls=%fused_neg
  %d1 = f32[256]{0} all-gather-done(%s1)
  %f6 = f32[256]{0} fusion(%f5), kind=kLoop, calls=%fused_neg
  %d2 = f32[256]{0} all-gather-done(%s2)
  ROOT %f7 = f32[256]{0} fusion(%f6), kind=kLoop, calls=%fused_neg
}
"""


def test_each_kernel_carries_the_collective_in_flight_where_xla_scheduled_it():
    by_name = {k.name: k for k in kernels_of(_WINDOWS_HLO)}
    ags, wrapped, s1, s2 = by_name["ags"], by_name["ag"], by_name["s1"], by_name["s2"]
    assert all(k.asynchronous for k in (ags, wrapped, s1, s2))
    assert len({ags.window, wrapped.window, s1.window, s2.window} - {0}) == 4
    launches: dict[int, int] = {}
    for k in kernels_of(_WINDOWS_HLO):
        if k.kind == "memory":
            launches[k.window] = launches.get(k.window, 0) + k.count
    # f1 beside ags, f3 beside the wrapped one, f5 beside s1 (the earliest of two in
    # flight), f6 beside s2 once s1 is done; f2, f4 and f7 beside nothing
    assert launches == {ags.window: 1, wrapped.window: 1, s1.window: 1, s2.window: 1, 0: 3}
    assert by_name["f1"].window == ags.window and by_name["f2"].window == 0


@pytest.mark.parametrize(
    ("name", "group", "run", "stride"),
    [
        ("ags", 8, 8, 0),  # [4,8]<=[32]: groups of 8 consecutive ids
        ("ag", 4, 1, 8),  # the dp axis of a (dp 4, fsdp 8) mesh: ids 0, 8, 16, 24
        ("s1", 4, 1, 8),  # the same group listed
        ("s2", 8, 8, 0),
    ],
)
def test_a_replica_group_states_its_runs_of_consecutive_devices(name, group, run, stride):
    k = {k.name: k for k in kernels_of(_WINDOWS_HLO)}[name]
    assert (k.group, k.run, k.stride) == (group, run, stride)


def test_more_replica_group_layouts():
    text = _GROUPS_HLO.replace("[2,4]<=[8]", "[4,2]<=[2,4]T(1,0)").replace(
        "mesh['dp'=2,'tp'=4,'pp'=3] {'dp','tp'}", "mesh['a'=4,'b'=2,'c'=4] {'a','c'}"
    )
    by_name = {k.name: k for k in kernels_of(text)}
    # [2,4] transposed: ids 0,4 | 1,5 | ...: the first group is (0, 4)
    assert (by_name["iota"].group, by_name["iota"].run, by_name["iota"].stride) == (2, 1, 4)
    # axes a (stride 8) and c (stride 1) of a 4x2x4 mesh: 0-3, 8-11, 16-19, 24-27
    assert (by_name["two"].group, by_name["two"].run, by_name["two"].stride) == (16, 4, 8)


@pytest.mark.parametrize("rate", [0.0, 2.5e9])
def test_fresh_memory_is_priced_only_where_the_device_pays_for_it(rate):
    s = dataclasses.replace(_speed(), fresh_bytes_per_s=rate)
    k = Kernel("memory", count=1, flops=0.0, bytes=10**9)
    base = step_time([k], s)
    t = step_time([k], s, fresh_bytes=5 * 10**9)
    extra = 5e9 / rate if rate else 0.0
    assert t.memory_seconds == pytest.approx(1e9 / (3.35232e12 * 0.9) + extra)
    assert t.seconds == pytest.approx(base.seconds + extra)
    assert speed_of(rk.target("h100")).fresh_bytes_per_s == 0.0  # GPUs: BFC reuses memory


def test_fresh_bytes_are_the_temporaries_and_the_outputs_no_input_donates():
    x = jax.ShapeDtypeStruct((256, 256), jnp.float32)

    def f(a, b):
        return jnp.tanh(a @ b) @ b + a

    kept = jax.jit(f).lower(x, x).compile().memory_analysis()
    donated = jax.jit(f, donate_argnums=0).lower(x, x).compile().memory_analysis()
    assert kept.temp_size_in_bytes > 0
    # independently: one f32[256,256] output, new unless the donated input takes it in place
    assert rk.timing.fresh_bytes_of(kept) == kept.temp_size_in_bytes + 256 * 256 * 4
    assert rk.timing.fresh_bytes_of(donated) == donated.temp_size_in_bytes


_CPU_LOOPS = """HloModule cpu

%plain (p0: f32[1024,512]) -> f32[1024,512] {
  %p0 = f32[1024,512]{1,0} parameter(0)
  ROOT %n = f32[1024,512]{1,0} negate(%p0)
}

%turned (p0: f32[512,1024]) -> f32[1024,512] {
  %p0 = f32[512,1024]{1,0} parameter(0)
  %t = f32[1024,512]{0,1} transpose(%p0), dimensions={1,0}
  ROOT %c = f32[1024,512]{1,0} copy(%t)
}

%relabelled (p0: f32[512,1024]) -> f32[1024,512] {
  %p0 = f32[512,1024]{1,0} parameter(0)
  %t = f32[1024,512]{0,1} transpose(%p0), dimensions={1,0}
  ROOT %n = f32[1024,512]{0,1} negate(%t)
}

ENTRY %main (a: f32[1024,512], b: f32[512,1024]) -> (f32[1024,512], f32[1024,512], f32[1024,512], f32[1024,512]) {
  %a = f32[1024,512]{1,0} parameter(0)
  %b = f32[512,1024]{1,0} parameter(1)
  %threaded = f32[1024,512]{1,0} fusion(%a), kind=kLoop, calls=%plain, backend_config={"outer_dimension_partitions":["2"]}
  %single = f32[1024,512]{1,0} fusion(%b), kind=kLoop, calls=%turned
  %bitcast_like = f32[1024,512]{0,1} fusion(%b), kind=kLoop, calls=%relabelled, backend_config={"outer_dimension_partitions":["2","2"]}
  %copied = f32[1024,512]{0,1} copy(%a)
  ROOT %out = (f32[1024,512]{1,0}, f32[1024,512]{1,0}, f32[1024,512]{0,1}, f32[1024,512]{0,1}) tuple(%threaded, %single, %bitcast_like, %copied)
}
"""


def test_cpu_loops_carry_their_threads_and_whether_they_transpose():
    got = {k.name: (k.parts, k.strided) for k in kernels_of(_CPU_LOOPS)}
    assert got == {
        "threaded": (2, False),
        "single": (1, True),  # the copy into the other layout moves the data
        "bitcast_like": (4, False),  # the transpose only relabels the operand's layout
        "copied": (1, True),
    }


def test_loops_are_priced_at_their_kinds_rate_where_the_device_has_one():
    gpu = _speed()
    cpu = dataclasses.replace(
        gpu, loop_rates=((True, True, 5e9), (False, True, 1e9), (True, False, 4e10))
    )
    strided_only = dataclasses.replace(gpu, loop_rates=((False, True, 1e9),))
    kernels = {k.name: k for k in kernels_of(_CPU_LOOPS)}
    nbytes = 2 * 1024 * 512 * 4
    assert len(kernels) == 4 and all(k.bytes == nbytes for k in kernels.values())
    bandwidth = gpu.bytes_per_s()
    rates = {  # name: (on cpu, on strided_only)
        "single": (1e9, 1e9),
        "copied": (1e9, 1e9),
        "threaded": (4e10, bandwidth),  # a kind not listed runs at the bandwidth
        "bitcast_like": (4e10, bandwidth),
    }
    for name, (on_cpu, on_strided_only) in rates.items():
        for speed, rate in ((cpu, on_cpu), (strided_only, on_strided_only), (gpu, bandwidth)):
            got = step_time([kernels[name]], speed).memory_seconds
            assert got == pytest.approx(nbytes / rate), (name, speed.loop_rates)


@pytest.mark.parametrize(("transposed", "strided"), [(False, False), (True, True)])
def test_a_cpu_compile_of_an_update_says_whether_it_transposes(transposed, strided):
    def update(buf, u):
        return jax.lax.dynamic_update_index_in_dim(buf, u.T if transposed else u, 1, 0)

    buf = jax.ShapeDtypeStruct((2, 256, 256), jnp.float32)
    u = jax.ShapeDtypeStruct((256, 256), jnp.float32)
    text = jax.jit(update, donate_argnums=0).lower(buf, u).compile().as_text()
    loops = [k for k in kernels_of(text) if k.kind == "memory"]
    assert loops and max(loops, key=lambda k: k.bytes).strided is strided


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="page faults counted on Linux")
def test_fresh_bytes_are_the_pages_a_cpu_run_faults_in():
    import resource

    x = jnp.ones((1024,), jnp.float32)
    big = jax.jit(lambda a: jnp.broadcast_to(a, (32 * 1024, 1024)) * 2.0)  # 128 MiB out
    compiled = big.lower(x).compile()
    jax.block_until_ready(compiled(x))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    out = jax.block_until_ready(compiled(x))
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del out
    pages = rk.timing.fresh_bytes_of(compiled.memory_analysis()) / 4096
    assert pages == 32 * 1024 * 1024 * 4 / 4096
    assert 0.8 * pages < faults < 1.3 * pages


def test_recompute_seconds_and_mfu():
    s = _speed()
    fwd = Kernel("gemm", count=1, flops=1e12, bytes=0, dtype="bf16")
    again = dataclasses.replace(fwd, recompute=True)
    t = step_time([fwd, again], s)
    assert t.recompute_seconds == pytest.approx(t.seconds / 2)
    assert t.model_flops == 1e12 and t.flops == 2e12
    assert t.mfu == pytest.approx(1e12 / t.seconds / 989e12)


# A toy TPU with round rates (1 TFLOP/s at full efficiency, 1 GB/s of memory and of host
# link, no launch cost) so that every kernel below takes a whole number of seconds.
_TOY_TPU = Speed(
    name="toy-tpu", peak_flops=1e12, matmul_efficiency=1.0, attention_efficiency=(1.0, 1.0),
    memory_bandwidth=1e9, memory_efficiency=1.0, kernel_seconds=0.0, units=1, host_link=1e9,
    host_link_efficiency=1.0, device_link=1e9, network=1e9, torus=(2, 2),
)  # fmt: skip


@pytest.mark.parametrize(
    "again",
    [
        Kernel("gemm", count=1, flops=2e12, bytes=0, dtype="bf16", recompute=True),
        Kernel("attention", count=1, flops=2e12, bytes=0, op="attention_fwd", recompute=True),
        Kernel("memory", count=1, flops=0.0, bytes=2 * 10**9, op="fusion", recompute=True),
    ],
    ids=["gemm", "attention", "memory"],
)
def test_offloads_hide_behind_the_forward_and_read_backs_behind_the_backward_and_recompute(
    again,
):
    # A step of 2 s forward, 4 s backward (twice the forward's products) and 2 s that
    # re-runs the forward inside the backward (a product, an attention or a fusion alike).
    # It writes 3 s of residuals to the host in the forward and reads 5 s back in the
    # backward, each way over its own side of the full-duplex link: the writes hide behind
    # the 2 s forward only (1 s exposed), the reads behind the 4 + 2 s of backward (none).
    # Counted as forward, the recomputation would hide more of the writes than there is.
    fresh = [
        Kernel("gemm", count=1, flops=2e12, bytes=0, dtype="bf16"),
        Kernel("gemm", count=1, flops=4e12, bytes=0, dtype="bf16"),
    ]
    write = Kernel("host_transfer", count=1, flops=0.0, bytes=0, host_bytes=3 * 10**9,
                   op="dynamic-update-slice-start", asynchronous=True)  # fmt: skip
    read = Kernel("host_transfer", count=1, flops=0.0, bytes=0, host_bytes=5 * 10**9,
                  op="dynamic-slice-start", asynchronous=True)  # fmt: skip
    t = step_time([*fresh, again, write, read], _TOY_TPU)
    assert t.recompute_seconds == pytest.approx(2.0)
    assert t.transfer_seconds == pytest.approx(1.0)
    assert t.seconds == pytest.approx(2.0 + 4.0 + 2.0 + 1.0)


def test_speed_of_names_its_fractions_by_generation():
    h100, a100 = speed_of(rk.target("h100")), speed_of(rk.target("a100-80gb"))
    assert (h100.matmul_efficiency, h100.memory_efficiency) == (0.81, 0.90)
    assert (a100.matmul_efficiency, a100.memory_efficiency) == (0.80, 0.85)
    assert h100.units == 132 and a100.units == 108
    # Half the FP32 lanes' rate, from the target config's SMs x lanes x clock (the H100's 132
    # x 128 at 1.98 GHz, the A100's 108 x 64 at 1.41, as ../shared/gpu_targets.md states them;
    # seed-86 mutant _speed.py:207, the lanes read from an empty config).
    assert h100.alu_ops == pytest.approx(0.5 * 132 * 128 * 1.98e9)
    assert a100.alu_ops == pytest.approx(0.5 * 108 * 64 * 1.41e9)
    assert h100.device_link == 450e9 and speed_of(rk.target("rtx4090")).device_link == 32e9
    assert speed_of(rk.target("cpu")) is None


@pytest.mark.parametrize(
    "missing",
    [
        {"hbm_bandwidth": None},
        {"peak_bf16_flops": None},
        {"hbm_bandwidth": None, "peak_bf16_flops": None},
    ],
    ids=["no-hbm-rate", "no-peak", "neither"],
)
def test_a_gpu_without_its_peak_or_its_memory_rate_has_no_speed(missing):
    # A custom GPU given its memory but not both rates: no step is priced, nothing guessed
    # (seed-86 mutant _speed.py:207, `or -> and`: a Speed built with a rate of None).
    t = dataclasses.replace(rk.target("h100"), **missing)
    assert speed_of(t) is None
    assert speed_of(rk.target("h100")) is not None  # the card as catalogued has both


@pytest.mark.parametrize(
    ("name", "link"),
    # NVLink per direction from the datasheets (B200: NVLink 5, 1.8 TB/s both ways; H20:
    # 900 GB/s both ways); PCIe Gen4 x16 for the cards without NVLink between all GPUs.
    [("b200", 900e9), ("h20", 450e9), ("l40s", 32e9), ("rtx-a6000", 32e9)],
)
def test_speed_of_the_2026_cards_links_them_as_their_datasheets_say(name, link):
    s = speed_of(rk.target(name))
    assert s.device_link == link
    assert s.peak_flops == rk.target(name).peak_bf16_flops


def test_kernels_survive_the_compile_cache_record():
    low = jax.jit(lambda a: jnp.tanh(a @ a)).lower(jax.ShapeDtypeStruct((64, 64), jnp.float32))
    mem = compile_memory(low)
    assert any(k.kind == "gemm" for k in mem.kernels)
    assert _from_record(mem.to_dict()) == mem
    damaged = mem.to_dict()
    damaged["kernels"][0][1] = "three"  # count must be an int
    assert _from_record(damaged) is None


def test_a_gpu_report_carries_its_step_time_and_reads_back():
    x = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16)
    r = rk.memory_report(lambda a: jnp.tanh(a @ a), x, target="h100")
    assert r.step_time is not None and r.step_time.matmul_seconds > 0
    assert r.step_time.model_flops == 2 * 1024**3
    assert rk.MemoryReport.from_dict(r.to_dict()) == r
    assert rk.memory_report(lambda a: a @ a, x, target="cpu").step_time is None


def test_compare_rows_carry_step_time_and_the_overhead_against_none():
    from remat_kit.comparison import compare_rows

    x = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16)
    meta = {"batch": 2, "seq": 256}
    none = rk.memory_report(
        lambda a: a @ a, x, target="h100", policy="none", schedule="none", meta=meta
    )
    more = rk.memory_report(
        lambda a: jnp.tanh(a @ a) @ a, x, target="h100", policy="full", schedule="none", meta=meta
    )
    rows = compare_rows([none, more])
    assert rows[0]["step_seconds"] == none.step_time.seconds
    assert rows[0]["time_vs_none"] == 0.0
    assert rows[1]["time_vs_none"] == pytest.approx(
        more.step_time.seconds / none.step_time.seconds - 1
    )
    assert rows[1]["tokens_per_second"] == pytest.approx(512 / more.step_time.seconds)
    assert rows[1]["time_vs_none"] > 0  # a second product costs time


def test_the_measured_cpu_speed_is_the_work_over_the_best_time(monkeypatch):
    # Every timed run takes 0.25 s here (nothing is timed): the rates are the work over it,
    # by hand: a 1024^3 product's 2 * 1024^3 FLOP in both dtypes (a ratio of 1), an in-place
    # update reading and writing 256 MiB, and a fill of the same 256 MiB whose page faults
    # take what the update's bandwidth leaves of 0.25 s.
    from remat_kit.timing import _model

    monkeypatch.setattr(_model, "_best", lambda fn, x, budget: 0.25)
    monkeypatch.setattr(_model, "_loop_rates", lambda budget: ())
    s = _model.measure_cpu_speed(0.2)
    size = 256 * 2**20
    assert s.peak_flops == pytest.approx(2 * 1024**3 / 0.25)
    assert s.f32_matmul_ratio == pytest.approx(1.0)
    assert s.memory_bandwidth == pytest.approx(2 * size / 0.25)
    assert s.fresh_bytes_per_s == pytest.approx(size / (0.25 - 0.125))
    # the tiny program's 0.25 s is a loaded machine's, not a launch cost: capped at 20 us
    assert s.kernel_seconds == pytest.approx(2e-5)
    # "A Speed whose efficiencies are 1 (the measured rates are the rates)"
    efficiencies = (s.matmul_efficiency, s.attention_efficiency, s.memory_efficiency)
    assert efficiencies == (1.0, (1.0, 1.0), 1.0) and s.host_link_efficiency == 1.0


# A budget of 0 leaves the 3 runs alone; one of 14 s ends with the third run to the second
# (the warm-up ends at 9 s, the runs at 14, 16 and 23): spent, not a fourth run (screen 97:
# _model.py:520's `<` read as `<=` ran the 1 s fourth).
@pytest.mark.parametrize("budget", [0.0, 14.0])
def test_a_best_time_is_the_fastest_of_at_least_three_runs_after_a_warm_up(monkeypatch, budget):
    # measure_cpu_speed's timer: one untimed call (the compile), then runs until both 3 runs
    # and the budget are done; the answer is the fastest run. The clock is faked: each run
    # of fn takes the next of the given times.
    from remat_kit.timing import _model

    took = iter([9.0, 5.0, 2.0, 7.0, 1.0])  # the warm-up's 9 s is not a run
    now = [0.0]
    calls = []

    def fn(x):
        calls.append(x)
        if len(calls) > 5:
            raise AssertionError("ran past its three runs")
        now[0] += next(took)
        return x

    monkeypatch.setattr(_model.time, "perf_counter", lambda: now[0])
    assert _model._best(fn, 3, budget) == 2.0
    assert calls == [3, 3, 3, 3]


def test_the_measured_alu_rate_counts_every_launch_of_the_random_bits(monkeypatch):
    # The arithmetic rate is the random-bits program's operations over its best time, the
    # operations counted as kernels_of counts them: each kernel's ops per launch times its
    # launches. Kernels by hand (3 launches of 1000 ops and one of 500: 3500 by hand) and
    # 0.25 s for every timed run (nothing is timed).
    import remat_kit.xla
    from remat_kit.timing import _model

    kernels = [
        Kernel("memory", 3, 0.0, 64, ops=1000, op="fusion"),
        Kernel("memory", 1, 0.0, 64, ops=500, op="fusion"),
    ]
    monkeypatch.setattr(remat_kit.xla, "kernels_of", lambda text: kernels)
    monkeypatch.setattr(_model, "_best", lambda fn, x, budget: 0.25)
    monkeypatch.setattr(_model, "_loop_rates", lambda budget: ())
    s = _model.measure_cpu_speed(0.2)
    assert s.alu_ops == pytest.approx(3500 / 0.25)


def test_the_measured_update_runs_in_place(monkeypatch):
    # The bandwidth is timed on an update that donates its input: each call writes the
    # buffer it read, not a fresh 256 MiB (whose page faults the fill measures apart).
    from remat_kit.timing import _model

    where = []

    def best(fn, x, budget):
        if x is None:  # the update's step: two calls, the first's output kept alive
            first = fn(None)
            where.extend([first.unsafe_buffer_pointer(), fn(None).unsafe_buffer_pointer()])
        return 0.25

    monkeypatch.setattr(_model, "_best", best)
    monkeypatch.setattr(_model, "_loop_rates", lambda budget: ())
    _model.measure_cpu_speed(0.2)
    assert len(where) == 2 and where[0] == where[1]


def test_a_loop_program_without_a_memory_loop_leaves_the_others_their_rates(monkeypatch):
    # The first of the three loop programs compiles to no memory-bound loop here (a product
    # only): it gives no rate, and the two after it still do. Every timed run takes 0.5 s; the
    # kernels are made by hand, so each rate is its program's memory bytes over 0.5 s, keyed by
    # the kind of the loop moving the most (launches times bytes: 2 x 1000 over 1 x 1500; by
    # bytes a launch it would be the other, screen 97: _model.py:502 `*` read as `/`):
    # 2 x 1000 + 1500 bytes (one thread, strided) and 4000 (two
    # threads: threaded from two up; screen 97: _model.py:509's `parts > 1` read as `> 2`).
    import remat_kit.xla
    from remat_kit.timing import _model

    def loop(nbytes, count, parts, strided):
        return Kernel("memory", count, 0.0, nbytes, parts=parts, strided=strided)

    kernels = iter(
        [
            [Kernel("gemm", 1, 2.0, 64)],
            [loop(1000, 2, 1, True), loop(1500, 1, 1, False)],
            [loop(4000, 1, 2, True)],
        ]
    )
    monkeypatch.setattr(remat_kit.xla, "kernels_of", lambda text: next(kernels))
    monkeypatch.setattr(_model, "_best", lambda fn, x, budget: 0.5)

    def small(make):  # 8 x 8 buffers, not 4096 x 4096: nothing is timed
        return lambda shape, dtype: make(tuple(min(n, 8) for n in shape), dtype)

    for name in ("ones", "zeros"):
        monkeypatch.setattr(jnp, name, small(getattr(jnp, name)))
    got = _model._loop_rates(0.3)
    assert got == ((False, True, 3500 / 0.5), (True, True, 4000 / 0.5))


# (slice, its grid of chips, the group, the torus axes its ring spans): a group fills the
# slice's longest axes first, so 4 chips of a 2 x 4 v5e-8 ring along its 4-long axis alone
# (2 links a chip, both ways), not over the 2-long axis as well; all 8 need both axes.
@pytest.mark.parametrize(
    ("name", "grid", "group", "axes"),
    [
        ("v5e-8", (2, 4), 2, 1),
        ("v5e-8", (2, 4), 4, 1),
        ("v5e-8", (2, 4), 8, 2),
        ("v5e-16", (4, 4), 4, 1),
        ("v5e-16", (4, 4), 16, 2),
        # v5p-32: 16 chips in 2 x 2 x 4; 4 fill the long axis, 8 take one 2-long axis more
        ("v5p-32", (2, 2, 4), 4, 1),
        ("v5p-32", (2, 2, 4), 8, 2),
        ("v5p-32", (2, 2, 4), 16, 3),
    ],
)
def test_a_tpu_gathers_ring_runs_over_the_longest_torus_axes_its_group_fills(
    name, grid, group, axes
):
    t = rk.target(name)
    assert tuple(sorted(t.tpu_slice.grid)) == grid
    k = Kernel("collective", count=1, flops=0.0, bytes=10**9, group=group, op="all-gather")
    # one link a way: v5e's page gives 400 GB/s a chip both ways over 4 ports (50 GB/s), v5p's
    # 1200 GB/s over 6 (100 GB/s); a ring along an axis sends both ways, at the 0.90 share
    link = {"v5e": 50e9, "v5p": 100e9}[name.split("-")[0]]
    rate = 2 * link * 0.90 * axes
    seconds = step_time([k], speed_of(t)).collective_seconds
    assert seconds == pytest.approx(1e9 * (group - 1) / group / rate)


def test_the_best_of_a_timed_run_keeps_running_for_its_budget(monkeypatch):
    # A clock that reads 0, 1, 2 ...: _best warms up once, sets its end at 0 + 20, then runs
    # at least 3 times and on while the clock (read once more after each run from the
    # third) is under 20: runs over 1-2, 3-4, 5-6, then 8-9, 11-12, 14-15, 17-18, 20-21 (the
    # reads 7, 10, 13, 16 and 19 are under 20; 22 is not): 8 runs and the warm-up, each 1 s
    # (issue 58, seed-82 mutant _model.py:518).
    from types import SimpleNamespace

    from remat_kit.timing import _model

    ticks = iter(range(1000))
    monkeypatch.setattr(_model, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    calls = []

    def fn(x):
        calls.append(x)
        return x

    assert _model._best(fn, jnp.zeros(2), 20.0) == 1.0
    assert len(calls) == 9


def test_a_machine_whose_counts_show_nothing_has_no_alu_or_fresh_page_rate(monkeypatch):
    """Random bits whose kernels count no operations, and a fill of new pages no slower than
    the write in place: no rate is measured, 0, which step_time reads as "not priced" (not as
    1 op or 1 byte a second). (Seed-97 mutant _model.py:440 ``else 0.0 -> 1.0``; its twin at
    the fresh-page rate, 433.)"""
    import remat_kit.xla
    from remat_kit.timing import _model

    monkeypatch.setattr(remat_kit.xla, "kernels_of", lambda text: [])
    # The update (its argument None) 0.25 s; every other timed run, the fill's included,
    # 0.125 s: what the update's bandwidth takes to write 256 MiB, to the last bit.
    monkeypatch.setattr(_model, "_best", lambda fn, x, budget: 0.25 if x is None else 0.125)
    monkeypatch.setattr(_model, "_loop_rates", lambda budget: ())
    s = _model.measure_cpu_speed(0.2)
    assert (s.alu_ops, s.fresh_bytes_per_s) == (0.0, 0.0)
    assert s.sources[0].endswith("fresh pages 0.0 GB/s, random bits 0.0 Gop/s")


def _timed(seconds=2.0, model_flops=1e15, peak_flops=1e15):
    """A StepTime by hand: ``seconds`` all in matmuls."""
    from helpers import step_time as made

    return made(seconds, model_flops=model_flops, flops=model_flops, peak_flops=peak_flops)


@pytest.mark.parametrize(
    ("seconds", "model_flops", "peak_flops", "mfu"),
    [
        (2.0, 1e15, 1e15, 0.5),
        (0.5, 2.5e14, 1e15, 0.5),  # under a second: still model FLOPs a second over the peak
        (0.5, 0.25, 1.0, 0.5),  # a peak of one FLOP a second is a peak
        (0.0, 1e15, 1e15, 0.0),  # no time, no rate: 0, not a division by zero
        (2.0, 1e15, 0.0, 0.0),
    ],
)
def test_mfu_is_model_flops_a_second_over_the_peak(seconds, model_flops, peak_flops, mfu):
    """By hand; 0 where a rate cannot be read (screen 97: _model.py:106, `<= 0` read as
    `<= 1`)."""
    assert _timed(seconds, model_flops, peak_flops).mfu == pytest.approx(mfu)


def test_a_step_time_saved_before_contention_was_counted_reads_back_with_none():
    """A step time written before ``contention_seconds`` existed (an older cache entry or
    results file) reads back with none, and its split still adds up to its seconds (screen
    97: _model.py:97's default 0.0 read as 1.0)."""
    from remat_kit.timing import StepTime

    old = _timed().to_dict()
    del old["contention_seconds"]
    back = StepTime.from_dict(old)
    assert back.contention_seconds == 0.0
    assert sum(back.split().values()) == pytest.approx(back.seconds)


@pytest.mark.parametrize(
    ("group", "run", "stride", "domain", "members"),
    [
        (1, 0, 0, 8, 1),  # a collective over one device has one member in its domain
        (0, 0, 0, 8, 1),  # a group read as none is one device
        (16, 0, 0, 8, 8),  # one block of 16 ids: the domain's 8
        (4, 0, 0, 8, 4),
        (8, 2, 4, 8, 4),  # runs of 2, every 4th id: 2 runs of 2 in ids 0-7
    ],
)
def test_the_members_of_a_group_in_one_nvlink_domain_by_hand(group, run, stride, domain, members):
    """(Screen 97: _model.py:350's ``max(1, k.group)`` read as ``max(2, ...)`` counted a
    one-device group as two.)"""
    from remat_kit.timing import _model

    k = Kernel("collective", 1, 0.0, 64, group=group, run=run, stride=stride)
    assert _model._in_one_domain(k, domain) == members


def test_a_cpu_whose_count_is_unknown_is_measured_as_one_unit(monkeypatch):
    """``os.cpu_count()`` may answer None: one unit (screen 97: _model.py:452's ``or 1`` read
    as ``or 2``)."""
    from remat_kit.timing import _model

    monkeypatch.setattr(_model, "_best", lambda fn, x, budget: 0.25)
    monkeypatch.setattr(_model, "_loop_rates", lambda budget: ())
    monkeypatch.setattr(_model.os, "cpu_count", lambda: None)
    assert _model.measure_cpu_speed(0.2).units == 1


def test_the_memory_rates_divide_the_bytes_their_programs_move(monkeypatch):
    """The in-place update reads and writes the buffer the fill then writes afresh: both rates
    are over that buffer's bytes, as big as it is (every timed run 0.25 s; the update's
    argument is None, the fill's the buffer)."""
    from remat_kit.timing import _model

    filled = []

    def best(fn, x, budget):
        if x is not None and getattr(x, "ndim", 0) == 1 and x.size > 8:
            filled.append(x.nbytes)
        return 0.25

    monkeypatch.setattr(_model, "_best", best)
    loops = ((False, True, 3e9), (True, False, 9e9))
    monkeypatch.setattr(_model, "_loop_rates", lambda budget: loops)
    s = _model.measure_cpu_speed(0.2)
    assert s.loop_rates == loops  # screen 97: _model.py:444's `loop_rates=` left out
    (nbytes,) = filled
    assert s.memory_bandwidth == pytest.approx(2 * nbytes / 0.25)
    assert s.fresh_bytes_per_s == pytest.approx(nbytes / (0.25 - nbytes / s.memory_bandwidth))


@pytest.mark.parametrize(
    ("to_host", "from_host", "free", "compute", "recomputed", "exposed"),
    [
        (3.0, 0.0, 1.0, 4.0, 0.0, 2.0),  # one way: behind all the free compute
        (0.0, 0.0, 1.0, 4.0, 0.0, 0.0),
        # Both ways: writes behind the forward's share of the free compute (a third of the
        # compute that is not recomputed: 3 of 9 s, so 2 of the 6 free), reads the rest.
        (3.0, 5.0, 6.0, 9.0, 0.0, 1.0 + 1.0),
        # 3 s recomputed: the forward is a third of the other 9, 3 of the 12 s: 1.5 free s
        # for the writes, 4.5 for the reads.
        (3.0, 5.0, 6.0, 12.0, 3.0, 1.5 + 0.5),
        (3.0, 5.0, 0.0, 0.0, 0.0, 8.0),  # no compute at all: nothing hides (not 0 / 0)
    ],
)
def test_tpu_host_transfers_hide_behind_their_own_pass_by_hand(
    to_host, from_host, free, compute, recomputed, exposed
):
    """(Screen 97: _model.py:257's ``compute > 0`` read as ``>= 0`` divided by zero.)"""
    from remat_kit.timing import _model

    got = _model._host_exposed(to_host, from_host, free, compute, recomputed)
    assert got == pytest.approx(exposed)


def test_a_step_time_says_where_its_rates_come_from():
    """(Screen 97: _model.py:223's ``assumptions=`` left out.)"""
    speed = speed_of(rk.target("h100"))
    got = step_time([Kernel("gemm", 1, 2e12, 64, dtype="bf16")], speed)
    assert got.assumptions == speed.sources and got.assumptions
