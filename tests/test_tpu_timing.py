"""Step-time pricing of what only a TPU program holds: Pallas kernels (MaxText's splash
attention, a kernel's own CostEstimate) and the collective-permutes libtpu decomposes
collectives into. Each expected figure is computed here independently of the pricing code: the
causal block count from a materialized mask, the link rate from the Cloud TPU page's figure."""

from __future__ import annotations

import numpy as np
import pytest

import remat_kit as rk
from remat_kit.timing import kernels_of, speed_of, step_time

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
