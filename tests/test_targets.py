"""Tests for remat_kit.targets: named deviceless GPUs, cpu and local targets."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

import remat_kit as rk
from remat_kit import targets as rkt

REPO = Path(__file__).resolve().parents[1]

# Independent copy of the table in shared/gpu_targets.md, but for the memory CUDA reports on a
# real H100 80GB HBM3 (81080 MiB, jax's allocator on a lent card) and H200 (what its
# allocator's limit, 112583507968 B at 0.75, says on a lent card):
# name -> (description, device_memory_size, cc, HBM bytes/s, host link bytes/s, peak bf16 FLOP/s)
TABLE = {
    "h100-80gb": ("NVIDIA H100 80GB HBM3", 81080 * 2**20, (9, 0), 3352320000000, 64e9, 989e12),
    "h100-pcie": ("NVIDIA H100 PCIe", 84942979072, (9, 0), 2039040000000, 64e9, 756e12),
    "h200": ("NVIDIA H200", 150111343958, (9, 0), 4800000000000, 64e9, 989e12),
    "a100-80gb": ("NVIDIA A100-SXM4-80GB", 85100068864, (8, 0), 2039040000000, 32e9, 312e12),
    "a100-40gb": ("NVIDIA A100-SXM4-40GB", 42331013120, (8, 0), 1555200000000, 32e9, 312e12),
    "rtx4090": ("NVIDIA GeForce RTX 4090", 25757220864, (8, 9), 1008000000000, 32e9, 165e12),
    "l4": ("NVIDIA L4", 24152899584, (8, 9), 300000000000, 32e9, 121e12),
    "b200": ("NVIDIA B200", 182631 * 2**20, (10, 0), 7672320000000, 64e9, 2.25e15),
    "h20": ("NVIDIA H20", 97285 * 2**20, (9, 0), 4000000000000, 64e9, 148e12),
    "l40s": ("NVIDIA L40S", 45589 * 2**20, (8, 9), 864000000000, 32e9, 362.05e12),
    "rtx-a6000": ("NVIDIA RTX A6000", 48676 * 2**20, (8, 6), 768000000000, 32e9, 154.8e12),
}

# The cards of issue 26, every figure written down from its source (not read from the
# catalogue): CUDA's device properties of the card where they have been published
# (torch.cuda.get_device_properties, pytorch/ao#4002 for the B200), else the datasheet,
# the H20's spec sheet, or the CUDA programming guide's table for the compute capability.
# name -> (SMs, FP32 lanes/SM, shared memory/SM, opt-in/block, threads/SM, L2 bytes, GHz)
NEW_CARDS = {
    "b200": (148, 128, 228 * 1024, 227 * 1024, 2048, int(126.5 * 2**20), 1.965),
    "h20": (78, 128, 228 * 1024, 227 * 1024, 2048, 60 * 2**20, 1.98),
    "l40s": (142, 128, 100 * 1024, 99 * 1024, 1536, 48 * 2**20, 2.52),
    "rtx-a6000": (84, 128, 100 * 1024, 99 * 1024, 1536, 6 * 2**20, 1.8),
}

# The seven cards of shared/gpu_targets.md, in the units their specifications give: NVIDIA's
# datasheets and architecture whitepapers (SMs, L2, boost clock), the CUDA programming guide's
# table per compute capability (shared memory, opt-in per block, threads per SM: 8.0 164/163
# KiB and 2048; 8.9 100/99 KiB and 1536; 9.0 228/227 KiB and 2048), FP32 lanes from the CUDA
# core counts (A100 6912 = 108 x 64; H100 SXM 16896 = 132 x 128; RTX 4090 16384 = 128 x 128;
# L4 7424 = 58 x 128). Same layout as NEW_CARDS.
ORIGINAL_CARDS = {
    "h100-80gb": (132, 128, 228 * 1024, 227 * 1024, 2048, 50 * 2**20, 1.98),
    "h100-pcie": (114, 128, 228 * 1024, 227 * 1024, 2048, 50 * 2**20, 1.755),
    "h200": (132, 128, 228 * 1024, 227 * 1024, 2048, 50 * 2**20, 1.98),
    "a100-80gb": (108, 64, 164 * 1024, 163 * 1024, 2048, 40 * 2**20, 1.41),
    "a100-40gb": (108, 64, 164 * 1024, 163 * 1024, 2048, 40 * 2**20, 1.41),
    "rtx4090": (128, 128, 100 * 1024, 99 * 1024, 1536, 72 * 2**20, 2.52),
    "l4": (58, 128, 100 * 1024, 99 * 1024, 1536, 48 * 2**20, 2.04),
}
ALL_CARDS = {**ORIGINAL_CARDS, **NEW_CARDS}

H100_FACTS = {
    "sms": 132,
    "fp32_per_sm": 128,
    "smem_per_sm": 233472,
    "smem_optin": 232448,
    "threads_per_sm": 2048,
    "hbm_bandwidth": 3352320000000,
    "l2_bytes": 52428800,
    "clock_ghz": 1.98,
    "memory_bytes": 81080 * 2**20,
    "compute_capability": (9, 0),
    "host_link_bandwidth": 64e9,
    "peak_bf16_flops": 989e12,
    "description": "NVIDIA H100 80GB HBM3",
}


def _compile_square(t: rkt.Target, spec: PartitionSpec | None = None):
    x = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16, sharding=t.sharding(spec))
    return jax.jit(lambda a: a @ a).lower(x).compile()


def test_target_names_are_sorted_canonical_and_complete():
    names = rkt.target_names()
    assert names == sorted(names)
    # the TPU generations as Cloud TPU names their slices (v5p-64, v6e-8, tpu7x-16), read
    # from the names MaxText's compile_topology takes
    maxtext = pytest.importorskip("maxtext.utils.accelerator_to_spec_map")
    tpus = {
        n.rsplit("-", 1)[0]
        for n, spec in maxtext.UserFacingNameToSystemCharacteristics.items()
        if spec.platform == "tpu" and not n.startswith("v5litepod")
    }
    assert set(names) == {*TABLE, *tpus, "cpu", "local"}
    assert not {"h100", "h100-sxm", "a100"} & set(names)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_gpu_facts_match_table(name):
    desc, memory, cc, hbm, link, peak = TABLE[name]
    t = rkt.target(name)
    assert (t.name, t.kind, t.description) == (name, "gpu", desc)
    assert t.memory_bytes == memory
    assert t.compute_capability == cc
    assert t.hbm_bandwidth == hbm
    assert t.host_link_bandwidth == link
    assert t.peak_bf16_flops == peak
    assert f"device_memory_size: {memory}" in t.target_config
    assert f"cuda_compute_capability {{ major: {cc[0]} minor: {cc[1]} }}" in t.target_config


@pytest.mark.parametrize("name", sorted(TABLE))
def test_gpu_mesh_is_one_device_of_that_kind(name):
    mesh = rkt.target(name).mesh()
    assert mesh.devices.size == 1
    assert mesh.axis_names == ("x",)
    dev = mesh.devices.flat[0]
    assert dev.device_kind == TABLE[name][0]
    assert dev.platform == "gpu"


@pytest.mark.parametrize("name", ["h100-80gb", "rtx4090"])
def test_compile_goes_to_that_gpu(name):
    compiled = _compile_square(rkt.target(name))
    assert compiled.memory_analysis().argument_size_in_bytes == 256 * 256 * 2
    sharding = compiled.input_shardings[0][0]
    assert sharding.mesh.devices.flat[0].device_kind == TABLE[name][0]
    # A GPU backend emits gemm fusions / library calls that the CPU compiler never does.
    text = compiled.as_text()
    assert any(k in text for k in ("triton", "cublas", "gemm_fusion"))


@pytest.mark.parametrize("name", sorted(ALL_CARDS))
def test_every_card_has_the_facts_of_its_sources(name):
    sms, lanes, smem, optin, threads, l2, ghz = ALL_CARDS[name]
    desc, memory, cc, hbm, link, peak = TABLE[name]
    expected = {
        "description": desc,
        "compute_capability": cc,
        "sms": sms,
        "fp32_per_sm": lanes,
        "smem_per_sm": smem,
        "smem_optin": optin,
        "threads_per_sm": threads,
        "hbm_bandwidth": hbm,
        "l2_bytes": l2,
        "clock_ghz": ghz,
        "memory_bytes": memory,
        "host_link_bandwidth": link,
        "peak_bf16_flops": peak,
    }
    assert dict(rkt.GPU_FACTS[name]) == expected
    assert set(rkt.GPU_FACTS) == set(ALL_CARDS) == set(TABLE)


def test_the_h100_and_h200_are_sized_as_cuda_reports_them():
    # H100 80GB HBM3: 81080 MiB, what jax's allocator saw on a lent card (nvidia-smi: 81559).
    # H200: jax's allocator on a lent card, bytes_limit 112583507968 (107368 MiB) at 0.75
    # (nvidia-smi: 143771 MiB).
    assert rkt.target("h100").memory_bytes == 85_018_542_080
    assert rkt.target("h200").usable_bytes == 107368 * 2**20
    assert round(rkt.target("h200").memory_bytes / 2**30, 2) == 139.80 < 143771 / 1024
    assert rkt.target("h100").usable_bytes == 63_763_906_560  # 0.75 of it: 59.38 GiB


@pytest.mark.parametrize("name", sorted(ALL_CARDS))
def test_every_card_hands_xla_its_figures(name):
    sms, lanes, smem, optin, threads, l2, ghz = ALL_CARDS[name]
    desc, memory, cc, hbm, _, _ = TABLE[name]
    config = rkt.target(name).target_config
    fields = {
        "core_count": sms,
        "fpus_per_core": lanes,
        "shared_memory_per_core": smem,
        "shared_memory_per_block_optin": optin,
        "threads_per_core_limit": threads,
        "l2_cache_size": l2,
        "memory_bandwidth": hbm,
        "device_memory_size": memory,
    }
    for key, value in fields.items():
        assert re.search(rf"\b{key}: {value}\n", config), (key, value)
    assert float(re.search(r"clock_rate_ghz: ([0-9.]+)", config).group(1)) == ghz
    assert f'device_description_str: "{desc}"' in config
    assert f"cuda_compute_capability {{ major: {cc[0]} minor: {cc[1]} }}" in config


def test_b200_is_the_180gb_card_as_cuda_reports_it():
    # DGX/HGX B200: "180 GB" per GPU; CUDA reports 178.35 GiB (pytorch/ao#4002), not the
    # 192 GB (the HBM3e stacks) some lists give.
    t = rkt.target("b200")
    assert round(t.memory_bytes / 2**30, 2) == 178.35
    assert t.memory_bytes < 192e9


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NEW_CARDS))
def test_new_cards_compile_a_train_step(name):
    # The tiny Llama train step test_precision uses; attention as the CLI picks it (cuDNN
    # flash attention where the cuDNN wheel is installed: sm_86, sm_89, sm_90, sm_100).
    from remat_kit_models.spec import PresetSpec

    src = rk.sources.resolve(PresetSpec("tiny-llama"))
    config = rk.TrainConfig(2, 32, optimizer="sgd")
    got = rk.sources.measure(src, "full", name, config, warn=False)
    ref = rk.sources.measure(src, "full", "h100", config, warn=False)
    assert got.target == name
    assert got.target_memory_bytes == TABLE[name][1]
    # The arguments (weights, batch) do not depend on the card; the program was compiled.
    assert got.argument_bytes == ref.argument_bytes > 0
    assert 0 < got.peak_bytes < 2**30
    assert got.fits is True


# The attention output projection of `report --width 6144 --heads 64 --shard tp:8 --batch 4
# --seq 2048` on one GPU: 8 heads x 96, transposed into the contraction of one bf16 dot
# (XLA fuses the transpose into the Triton GEMM). Deviceless, XLA's default tiling for it
# (block_k 128 on sm_80; on sm_90 at larger shapes) does not fit 96 and the compile failed
# with "Couldn't find output tile sizes that satisfy" (issue 22; targets/codegen.py).
@pytest.mark.parametrize(
    ("name", "batch", "seq", "out"),
    [("a100-80gb", 4, 2048, 6144), ("a100-40gb", 4, 2048, 6144), ("h100-80gb", 8, 4096, 8192)],
)
def test_gemm_with_heads_transposed_into_its_contraction_compiles(name, batch, seq, out):
    heads, head_dim = 8, 96
    x = jax.ShapeDtypeStruct((batch, heads, head_dim, seq), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((heads * head_dim, out), jnp.bfloat16)

    def project(x, w):
        return jnp.transpose(x, (0, 3, 1, 2)).reshape(batch * seq, heads * head_dim) @ w

    report = rk.memory_report(project, x, w, target=name, count_flops=False, warn=False)
    assert report.output_bytes == batch * seq * out * 2
    assert report.argument_bytes == (x.size + w.size) * 2


def test_eight_devices_mesh_and_sharded_compile():
    t = rkt.target("h100", devices=8)
    mesh = t.mesh()
    assert mesh.devices.size == 8
    assert len({d.id for d in mesh.devices.flat}) == 8
    assert {d.device_kind for d in mesh.devices.flat} == {TABLE["h100-80gb"][0]}
    compiled = _compile_square(t, PartitionSpec("x"))
    assert compiled.memory_analysis().argument_size_in_bytes == 256 * 256 * 2 // 8


def test_multi_host_topology():
    t = rkt.target("h100", devices=16, hosts=2)
    assert t.topology == "1x2x8"
    assert t.devices_per_host == 8
    mesh = t.mesh(("data", "model"), (8, 2))
    assert dict(mesh.shape) == {"data": 8, "model": 2}
    assert {d.process_index for d in mesh.devices.flat} == {0, 1}


def test_mesh_default_shape_with_several_axes():
    mesh = rkt.target("a100", devices=4).mesh(("data", "model"))
    assert dict(mesh.shape) == {"data": 4, "model": 1}


@pytest.mark.parametrize(
    ("shape", "slices"),
    [
        # Two v5e-4 slices: the first axis the 2 slices divide spans them (its outer half on
        # slice 0, inner half on slice 1); the other axes stay within a slice.
        ((4, 2), [[0, 0], [0, 0], [1, 1], [1, 1]]),
        ((1, 8), [[0, 0, 0, 0, 1, 1, 1, 1]]),  # 1 is not divided: the second axis spans them
        ((2, 2, 2), [[[0, 0], [0, 0]], [[1, 1], [1, 1]]]),
    ],
    ids=["rows", "one row", "cube"],
)
def test_a_mesh_over_two_tpu_slices_puts_each_slice_on_its_part_of_one_axis(shape, slices):
    names = ("a", "b", "c")[: len(shape)]
    mesh = rkt.target("v5e-4", slices=2).mesh(names, shape)
    assert mesh.devices.shape == shape and len({d.id for d in mesh.devices.flat}) == 8
    assert np.vectorize(lambda d: d.slice_index)(mesh.devices).tolist() == slices


@pytest.mark.parametrize(
    ("names", "shape", "match"),
    [(("x",), (3,), "holds 3 devices"), (("x",), (2, 2), "2 axes"), ((), None, "at least one")],
)
def test_mesh_rejects_bad_shape(names, shape, match):
    with pytest.raises(ValueError, match=match):
        rkt.target("h100", devices=4).mesh(names, shape)


@pytest.mark.parametrize("name", ["h100", "b200", "l4"])
def test_a_gpu_targets_repr_leaves_out_its_config_proto(name):
    # A printed target (a REPL, a log, a failed assert) reads as its facts, not as the
    # GpuTargetConfigProto text it compiles with (hundreds of characters).
    t = rkt.target(name)
    shown = repr(t)
    assert t.target_config and t.target_config not in shown and "target_config" not in shown
    assert shown.startswith(f"Target(name={t.name!r}, kind='gpu', ")


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("h100", "h100-80gb"),
        ("h100-sxm", "h100-80gb"),
        ("a100", "a100-80gb"),
        ("H100", "h100-80gb"),
        ("a6000", "rtx-a6000"),
        ("rtxa6000", "rtx-a6000"),
        ("L40S", "l40s"),
        ("h20-96gb", "h20"),
        ("b200-180gb", "b200"),
        ("B200", "b200"),
    ],
)
def test_aliases_resolve(alias, canonical):
    assert rkt.target(alias) == rkt.target(canonical)
    assert rkt.target(alias).name == canonical


def test_unknown_name_lists_close_matches_and_all_names():
    with pytest.raises(ValueError, match="unknown target 'h10'") as info:
        rkt.target("h10")
    msg = str(info.value)
    assert "Did you mean" in msg and "h100-80gb" in msg.split("Known:")[0]
    for name in rkt.target_names():
        assert name in msg.split("Known:")[1]
    with pytest.raises(ValueError) as info:
        rkt.target("zzzzzz")
    assert "Did you mean" not in str(info.value)


def test_the_close_matches_are_three_targets_where_aliases_of_one_come_near():
    # difflib's ratios to "h100-80gx": h100-80gb .889, a100-80gb .778, h100-sxm (an alias of
    # h100-80gb) .706, a100-40gb .667, b200-180gb .632, h100 .615. An alias names the target
    # it stands for, once: three targets, not two (seed-83 mutant _named.py:171, only
    # difflib's first three names looked at).
    with pytest.raises(rk.errors.UnknownName) as info:
        rkt.target("h100-80gx")
    assert tuple(info.value.close) == ("h100-80gb", "a100-80gb", "a100-40gb")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"devices": 0}, ValueError, "devices must be a positive int, got 0"),
        ({"devices": -2}, ValueError, "got -2"),
        ({"devices": 3, "hosts": 2}, ValueError, "devices=3 is not divisible by hosts=2"),
        ({"hosts": 0}, ValueError, "hosts must be a positive int, got 0"),
        ({"devices": "8"}, TypeError, "devices must be an int, got str: '8'"),
        ({"devices": 2.0}, TypeError, "got float"),
        ({"devices": True}, TypeError, "got bool"),
    ],
)
def test_bad_device_counts_raise(kwargs, error, match):
    with pytest.raises(error, match=match):
        rkt.target("h100", **kwargs)


@pytest.mark.parametrize(
    ("name", "gpu", "devices", "hosts", "domain"),
    [
        ("dgx-h100", "h100", 64, 8, 8),  # the GPUs fill whole 8-GPU nodes
        ("a3-ultra", "h200", 8, 1, 8),
        ("gb200-nvl72", "b200", 16, 4, 72),  # 4-GPU trays, one 72-GPU NVLink domain
        ("DGX-B200", "b200", 16, 2, 8),  # names without regard to case
    ],
)
def test_a_node_places_the_gpus_and_names_its_nvlink_domain(name, gpu, devices, hosts, domain):
    t = rkt.target(gpu, devices=devices, node=name)
    assert (t.hosts, t.nvlink_domain, t.node) == (hosts, domain, name.lower())
    assert t.to_dict()["node"] == name.lower()


# A node's GPU network per GPU from the figures its source states (targets/_nodes.py), as the
# GPU NICs' Gb/s in all over the node's GPUs: 8 bits a byte.
@pytest.mark.parametrize(
    ("name", "gbps", "gpus"),
    [
        ("dgx-h100", 8 * 400, 8),  # 8x single-port ConnectX-7, 400 Gb/s
        ("dgx-b200", 8 * 400, 8),
        ("gb200-nvl72", 4 * 400, 4),  # a 4-GPU tray's 4 x 400 Gbps
        ("a3-high", 1000 - 200, 8),  # 1,000 Gbps in all, less the host NIC's 200
        ("a3-mega", 1800 - 200, 8),  # 1,800 Gbps in all: 8 GPU NICs of 200 and the host's
        ("a3-ultra", 3200, 8),  # eight ConnectX-7, 3,200 Gbps in all
    ],
)
def test_a_nodes_gpu_network_is_its_published_line_rate_per_gpu(name, gbps, gpus):
    assert rkt.node(name).network_per_gpu == pytest.approx(gbps * 1e9 / 8 / gpus)


@pytest.mark.parametrize(
    ("gpu", "kwargs", "error", "match"),
    [
        ("h100", {"node": "dgx-b200"}, ValueError,
         r"node dgx-b200 holds b200 GPUs, not h100-80gb.*a3-high, a3-mega, dgx-h100"),
        ("h100", {"node": "dgx-h1000"}, ValueError, "Did you mean dgx-h100"),
        ("h100", {"node": 8}, TypeError, "node must be a str, got int"),
        ("h100", {"node": "dgx-h100", "devices": 16, "hosts": 1, "mem_fraction": None}, None, ""),
        ("gb200", {"node": "gb200-nvl72", "devices": 8, "hosts": 1}, ValueError, "unknown target"),
        ("cpu", {"node": "dgx-h100"}, ValueError, "node='dgx-h100' is for GPU targets"),
    ],
)  # fmt: skip
def test_a_node_that_does_not_hold_the_gpu_is_refused(gpu, kwargs, error, match):
    if error is None:  # hosts=1 with 16 GPUs: filled into two nodes, not refused
        assert rkt.target(gpu, **kwargs).hosts == 2
        return
    with pytest.raises(error, match=match):
        rkt.target(gpu, **kwargs)


def test_more_gpus_per_host_than_the_node_holds_are_refused():
    with pytest.raises(ValueError, match="16 GPUs per host, but a dgx-h100 node holds 8"):
        rkt.Target(**{**_fields(rkt.target("h100", devices=16)), "node": "dgx-h100"})


def _fields(t):
    return {f.name: getattr(t, f.name) for f in dataclasses.fields(t)}


def test_cpu_and_local_reject_hosts():
    with pytest.raises(ValueError, match="hosts=2"):
        rkt.target("cpu", devices=2, hosts=2)


def test_custom_target_equals_builtin_and_compiles():
    t = rkt.custom_target("my-h100", H100_FACTS)
    ref = rkt.target("h100")
    assert t.memory_bytes == ref.memory_bytes
    assert t.target_config == ref.target_config
    assert t == dataclasses.replace(ref, name="my-h100")
    compiled = _compile_square(t)
    assert compiled.memory_analysis().argument_size_in_bytes == 131072
    assert (
        compiled.input_shardings[0][0].mesh.devices.flat[0].device_kind == H100_FACTS["description"]
    )


def test_custom_target_changed_memory_reaches_the_proto():
    facts = {k: v for k, v in H100_FACTS.items() if k != "description"}
    facts["memory_bytes"] = 96 * 2**30
    t = rkt.custom_target("h100-96gb", facts, devices=2)
    assert t.description == "h100-96gb"
    assert t.devices == 2
    assert rkt.target_from_config(t.target_config).memory_bytes == 96 * 2**30
    assert t.mesh().devices.size == 2


def test_custom_target_missing_and_unknown_keys():
    facts = {k: v for k, v in H100_FACTS.items() if k not in ("sms", "l2_bytes")}
    with pytest.raises(ValueError, match="missing sms, l2_bytes") as info:
        rkt.custom_target("x", facts)
    assert "Keys: sms, fp32_per_sm" in str(info.value)
    assert "peak_bf16_flops" in str(info.value)
    with pytest.raises(ValueError, match="unknown smz"):
        rkt.custom_target("x", {**H100_FACTS, "smz": 1})
    with pytest.raises(ValueError, match="memory_bytes must be a positive number"):
        rkt.custom_target("x", {**H100_FACTS, "memory_bytes": 0})


@pytest.mark.parametrize("name", sorted(TABLE))
def test_target_from_config_round_trip(name):
    ref = rkt.target(name)
    got = rkt.target_from_config(
        ref.target_config,
        name,
        host_link_bandwidth=ref.host_link_bandwidth,
        peak_bf16_flops=ref.peak_bf16_flops,
    )
    assert got == ref


def test_target_from_config_file(tmp_path):
    path = tmp_path / "my-rtx.txtpb"
    path.write_text(rkt.target("rtx4090").target_config)
    t = rkt.target_from_config(path)
    assert t.name == "my-rtx"
    assert (t.memory_bytes, t.compute_capability) == (25757220864, (8, 9))
    assert t.description == "NVIDIA GeForce RTX 4090"
    assert t.host_link_bandwidth is None
    assert t.mesh().devices.flat[0].device_kind == "NVIDIA GeForce RTX 4090"
    assert rkt.target_from_config(str(path), "other").name == "other"


@pytest.mark.parametrize(
    ("description", "want"),
    [
        ('device_description_str: "NVIDIA GeForce RTX 4090"\n', "nvidia-geforce-rtx-4090"),
        ("", "custom-gpu"),
    ],
)
def test_a_config_given_as_text_is_named_by_its_card(description, want):
    """Text has no file name to lend the target: the card's description names it, else
    ``custom-gpu`` (seed-102 mutant _custom.py:121, an ``or`` of the fallbacks made ``and``:
    every named config came from a file or with a name)."""
    text = "gpu_device_info {\n  core_count: 128\n}\ndevice_memory_size: 25757220864\n"
    got = rkt.target_from_config(text + description)
    assert (got.name, got.memory_bytes) == (want, 25757220864)


def test_target_from_config_errors(tmp_path):
    bad = tmp_path / "bad.txtpb"
    bad.write_text('gpu_device_info {\n  core_count: 132\n}\ndevice_description_str: "X"\n')
    with pytest.raises(ValueError, match=r"bad\.txtpb.*device_memory_size"):
        rkt.target_from_config(bad)
    with pytest.raises(ValueError, match="does not exist"):
        rkt.target_from_config(tmp_path / "missing.txtpb")


H100_TOTAL = 85018542080  # what CUDA reported on a lent H100 80GB HBM3 (81080 MiB)


def test_fits_is_judged_against_the_allocators_share(monkeypatch):
    for var in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        monkeypatch.delenv(var, raising=False)
    t = rkt.target("h100")
    usable = H100_TOTAL * 3 // 4  # JAX's BFC allocator: floor(total * 0.75)
    assert (t.mem_fraction, t.usable_bytes) == (0.75, usable)
    assert t.fits(usable) is True and t.fits(usable + 1) is False
    assert t.fits(H100_TOTAL) is False  # the whole card is not what a process gets
    assert rkt.target("cpu").fits(1) is None and rkt.target("cpu").usable_bytes is None


@pytest.mark.parametrize(
    ("env", "fraction", "source", "setting"),
    [
        ({}, 0.75, "default", "XLA_PYTHON_CLIENT_MEM_FRACTION=0.75"),
        ({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".9"}, 0.9, "XLA_PYTHON_CLIENT_MEM_FRACTION", None),
        ({"XLA_CLIENT_MEM_FRACTION": "0.5"}, 0.5, "XLA_CLIENT_MEM_FRACTION", None),
        (
            {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"},
            None,
            "platform allocator",
            "XLA_PYTHON_CLIENT_ALLOCATOR=platform",
        ),
    ],
)
def test_runtime_follows_the_environment_jax_reads(monkeypatch, env, fraction, source, setting):
    """A target's runtime is the one jax starts with in this environment, and says the
    setting that selects it, as a does-not-fit note words it (a fraction by the variable
    jaxlib reads under either name); issue 58 mutant runtime.py:124 of seed 104, ``is None``
    read as ``is not None``."""
    for var in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_ALLOCATOR", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    t = rkt.target("h100")
    assert (t.mem_fraction, t.runtime.source) == (fraction, source)
    expected = H100_TOTAL - 512 * 2**20 if fraction is None else math.floor(H100_TOTAL * fraction)
    assert t.usable_bytes == expected
    assert t.to_dict()["usable_bytes"] == expected
    assert t.runtime.setting() == (setting or f"XLA_PYTHON_CLIENT_MEM_FRACTION={fraction}")


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"XLA_PYTHON_CLIENT_MEM_FRACTION": "lots"}, "'lots' is not a number"),
        ({"XLA_PYTHON_CLIENT_MEM_FRACTION": "1.5"}, r"must be in \(0, 1\]"),
        ({"XLA_CLIENT_MEM_FRACTION": ".5", "XLA_PYTHON_CLIENT_MEM_FRACTION": ".6"}, "both"),
    ],
)
def test_bad_runtime_environment_is_one_clear_error(monkeypatch, env, match):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(rk.errors.BadValue, match=match):
        rkt.target("h100")


@pytest.mark.parametrize("fraction", [True, False, "0.9", [0.9]])
def test_a_memory_fraction_that_is_no_number_is_refused_naming_it(fraction):
    """A bool is no fraction (True would read as 1.0), nor is text (issue 58 mutant
    runtime.py:105 of seed 77, ``or`` read as ``and``)."""
    with pytest.raises(rk.errors.BadValue, match=rf"memory fraction {re.escape(repr(fraction))} "):
        rkt.target("h100", mem_fraction=fraction)


def test_a_fraction_that_starves_the_cuda_context_is_refused():
    # 0.995 of 79.18 GiB leaves 0.40 GiB, less than the 0.5 GiB kept for the CUDA context.
    with pytest.raises(rk.errors.BadValue, match=r"at most 0\.99"):
        rkt.target("h100", mem_fraction=0.995)
    assert rkt.target("h100", mem_fraction=0.99).usable_bytes == math.floor(H100_TOTAL * 0.99)


@pytest.mark.parametrize(
    ("card", "kept", "most"),
    [(80 * 2**30, 512 * 2**20, 0.99), (8 * 2**30, 512 * 2**20, 0.93), (2**30, 64 * 2**20, 0.93)],
)
def test_what_is_kept_outside_xlas_pool_is_half_a_gib_or_a_sixteenth_of_a_toy_card(
    card, kept, most
):
    """0.5 GiB for the CUDA context, a sixteenth of a card under 8 GiB (a test model's toy
    target), by hand: 1 GiB keeps 64 MiB, leaving 0.9375 (issue 58 mutant runtime.py:148 of
    seed 76, the sixteenth multiplied)."""
    from remat_kit.targets import runtime

    assert runtime.outside_heap_bytes(card) == kept
    assert runtime.max_mem_fraction(card) == most
    assert runtime.Runtime(None, "platform").usable_bytes(card) == card - kept


@pytest.mark.parametrize(("gib", "needed"), [(60, 0.76), (70, 0.89), (78.3, 0.99), (78.9, None)])
def test_fraction_to_fit_is_the_smallest_that_holds_the_peak(gib, needed):
    nbytes = int(gib * 2**30)
    got = rkt.target("h100").fraction_to_fit(nbytes)
    assert got == needed
    if needed is not None:  # it fits at that fraction and not one step below
        assert math.floor(H100_TOTAL * needed) >= nbytes
        assert math.floor(H100_TOTAL * (needed - 0.01)) < nbytes


@pytest.mark.parametrize("fraction", [0.75, 0.5, 0.95])
def test_compile_config_hands_xla_the_runtime_limit(fraction):
    # Deviceless, XLA bases its remat limit on floor(0.8 * device_memory_size); a real process
    # hands it the allocator's bytes_limit. The compile config must make the two equal.
    t = rkt.target("h100", mem_fraction=fraction)
    size = int(re.search(r"device_memory_size: (\d+)", t.compile_config).group(1))
    assert size * 80 // 100 == math.floor(H100_TOTAL * fraction)
    assert f"device_memory_size: {H100_TOTAL}" in t.target_config  # the card itself unchanged


@pytest.mark.parametrize("name", ["v5e", "cpu"])
def test_a_target_without_a_gpu_config_has_none_to_hand_xla(name):
    # A TPU knows its memory (16 GiB a v5e chip) but has no GPU target config and no
    # allocator fraction to rewrite it by; the CPU has neither. Nothing is rewritten
    # (seed-84 mutant _core.py:346, `or -> and`: the TPU's None rewritten by a runtime it lacks).
    t = rkt.target(name)
    assert t.target_config is None and t.compile_config is None


def test_to_dict_is_json_ready():
    d = rkt.target("a100-40gb", devices=8, hosts=2).to_dict()
    assert "target_config" not in d
    assert json.loads(json.dumps(d)) == d
    assert d["memory_bytes"] == 42331013120
    assert d["compute_capability"] == [8, 0]
    assert (d["topology"], d["devices_per_host"], d["devices"]) == ("1x2x4", 4, 8)


def test_cpu_target():
    t = rkt.target("cpu")
    assert (t.kind, t.memory_bytes, t.target_config) == ("cpu", None, None)
    mesh = t.mesh()
    assert mesh.devices.size == 1 and mesh.devices.flat[0].platform == "cpu"
    n = len(jax.devices("cpu"))
    too_many = rkt.target("cpu", devices=n + 1)
    with pytest.raises(ValueError, match="xla_force_host_platform_device_count"):
        too_many.mesh()


def test_a_cpu_target_on_a_gpu_machine_meshes_the_cpu(monkeypatch):
    """Where jax's default platform is a GPU (a stand-in here), ``cpu`` still means the host's
    devices: its mesh asks jax for the CPU platform by name (seed-99 mutant _core.py:223)."""
    t = rkt.target("cpu")
    cpus, gpu = jax.devices("cpu"), types.SimpleNamespace(platform="gpu", id=0)
    monkeypatch.setattr(jax, "devices", lambda backend=None: cpus if backend == "cpu" else [gpu])
    assert t.mesh().devices.flat[0] == cpus[0]


def test_local_target_is_jax_default_device():
    t = rkt.target("local")
    dev = jax.devices()[0]
    assert t.kind == "local"
    assert t.description == dev.device_kind
    assert t.mesh().devices.flat[0] == dev
    if dev.platform == "cpu":
        assert t.memory_bytes is None
    with pytest.raises(ValueError, match="local"):
        rkt.target("local", devices=len(jax.devices()) + 1)


@pytest.mark.parametrize("devices", [2, 8])
def test_a_local_target_spans_the_devices_asked_for(devices, monkeypatch):
    # This process has one CPU device: the local platform is shown eight of it.
    one = jax.devices()[0]
    monkeypatch.setattr(jax, "devices", lambda *args, **kwargs: [one] * 8)
    t = rkt.target("local", devices=devices)
    assert (t.kind, t.devices, t.hosts) == ("local", devices, 1)


@pytest.mark.parametrize("cc", ["9.0", (9, 0), "9.x"])
def test_a_local_gpu_is_what_its_device_says_and_the_table_knows(cc, monkeypatch):
    """On a GPU (a stand-in device here: CI has none), ``local`` is the device's kind, its
    allocator's bytes_limit and compute capability, and the table's speeds for that kind; a
    capability it cannot read is left unknown (issue 58 mutant _named.py:287 of seed 77, the
    GPU's branch taken for the CPU)."""
    facts = rkt.GPU_FACTS["h100-80gb"]
    gpu = types.SimpleNamespace(
        platform="gpu",
        device_kind=facts["description"],
        compute_capability=cc,
        memory_stats=lambda: {"bytes_limit": 75 * 2**30, "bytes_in_use": 0},
    )
    monkeypatch.setattr(jax, "devices", lambda *args, **kwargs: [gpu])
    t = rkt.target("local")
    assert (t.kind, t.description, t.memory_bytes) == ("local", facts["description"], 75 * 2**30)
    assert t.compute_capability == (None if cc == "9.x" else (9, 0))
    assert (t.hbm_bandwidth, t.peak_bf16_flops) == (
        facts["hbm_bandwidth"],
        facts["peak_bf16_flops"],
    )


def test_check_deviceless_passes_here():
    rkt.check_deviceless(rkt.target("l4"))  # must not raise under JAX_PLATFORMS=cpu
    rkt.check_deviceless(rkt.target("cpu"))


_NO_TOPOLOGY = NotImplementedError("topology not implemented for cuda")


@pytest.mark.parametrize(
    ("error", "installed", "match"),
    [
        (_NO_TOPOLOGY, False, r"pip install 'jax\[cuda12\]'"),
        (_NO_TOPOLOGY, True, "JAX_PLATFORMS=cpu"),
        # Either sign alone is the probe's: the type, or the words in the runtime's error
        # (issue 58 mutant _platform.py:207 of seed 104, ``or`` read as ``and``).
        (NotImplementedError("no topology for this client"), True, "JAX_PLATFORMS=cpu"),
        (RuntimeError("UNIMPLEMENTED: Not Implemented for this backend"), True, "JAX_PLATFORMS"),
        (
            RuntimeError("INVALID_ARGUMENT: bad core_count\nmore"),
            True,
            r"^XLA rejected the target config of 'h200': INVALID_ARGUMENT: bad core_count$",
        ),
    ],
)
def test_failures_become_actionable_target_errors(monkeypatch, error, installed, match):
    def broken(config, topology):
        raise error

    monkeypatch.setattr(rkt._platform, "_cached_topology", broken)
    monkeypatch.setattr(rkt._platform, "_cuda_plugin_installed", lambda: installed)
    with pytest.raises(rkt.TargetError, match=match) as info:
        rkt.target("h200").mesh()
    assert isinstance(info.value, RuntimeError)
    assert "h200" in str(info.value)
    assert "\n" not in str(info.value)


def _run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a real GPU driver is present")
def test_without_jax_platforms_a_gpu_target_configures_itself():
    # README's library example: no JAX_PLATFORMS, no configure call, no NVIDIA device here.
    proc = _run(
        "from remat_kit import targets as rkt\n"
        "try:\n    rkt.target('h100').mesh(); print('NO ERROR')\n"
        "except rkt.TargetError as e:\n    print('TargetError:', e)\n"
    )
    assert proc.stdout.strip() == "NO ERROR", proc.stdout + proc.stderr


@pytest.mark.slow
def test_after_jax_started_probing_the_error_says_what_to_set():
    proc = _run(
        "import jax; jax.devices()\n"
        "from remat_kit import targets as rkt\n"
        "try:\n    rkt.target('h100').mesh(); print('NO ERROR')\n"
        "except rkt.TargetError as e:\n    print('TargetError:', e)\n"
    )
    assert "TargetError:" in proc.stdout, proc.stdout + proc.stderr
    assert "JAX_PLATFORMS=cpu" in proc.stdout


@pytest.mark.slow
def test_configure_for_deviceless_in_a_fresh_process():
    proc = _run(
        "import os, jax\n"
        "from remat_kit import targets as rkt\n"
        "rkt.configure_for_deviceless()\n"
        "print(os.environ.get('JAX_PLATFORMS'))\n"
        "print(rkt.target('h100').mesh().devices.flat[0].device_kind)\n"
    )
    assert proc.stdout.split("\n")[:2] == ["cpu", "NVIDIA H100 80GB HBM3"], proc.stderr


@pytest.mark.slow
def test_configure_for_deviceless_leaves_initialized_backends_alone():
    proc = _run(
        "import os, jax\n"
        "jax.devices()\n"
        "from remat_kit import targets as rkt\n"
        "rkt.configure_for_deviceless()\n"
        "print(os.environ.get('JAX_PLATFORMS'))\n"
    )
    assert proc.stdout.strip() == "None", proc.stderr


def test_configure_for_deviceless_stays_hands_off_where_jax_cannot_say(monkeypatch):
    """jax's private backends_are_initialized failing (a jax that changed it): assume the
    backends are up and change nothing, neither the platforms nor the process flags (issue
    58 mutant _platform.py:240 of seed 79, assumed not)."""
    from jax._src import xla_bridge

    from remat_kit.targets import _platform

    def broken():
        raise RuntimeError("a private API that changed")

    touched = []
    monkeypatch.setattr(xla_bridge, "backends_are_initialized", broken)
    monkeypatch.setattr(_platform, "check_platforms", lambda: touched.append("platforms"))
    monkeypatch.setattr(_platform, "set_process_flags", lambda: touched.append("flags"))
    rkt.configure_for_deviceless()
    assert touched == []


@pytest.mark.parametrize(
    ("env", "platforms"),
    [
        ({"JAX_PLATFORMS": "cuda"}, "cuda"),  # the user's choice, kept
        ({"JAX_SKIP_CUDA_CONSTRAINTS_CHECK": "1"}, None),  # jax told not to probe: left alone
        ({}, "cpu"),  # nothing chose: the CPU platform
    ],
)
def test_configure_for_deviceless_keeps_what_either_variable_chose(monkeypatch, env, platforms):
    """Either variable set before jax starts is a choice made: neither is overwritten (issue
    58 mutant _platform.py:66 `or` -> `and` of seed 106)."""
    from remat_kit.targets import _platform

    for name in ("JAX_PLATFORMS", "JAX_SKIP_CUDA_CONSTRAINTS_CHECK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # A process whose jax has not started (nor been imported): the steps before the choice
    # are tested above and in a fresh process.
    monkeypatch.setattr(_platform, "_backends_initialized", lambda: False)
    monkeypatch.setattr(_platform, "check_platforms", lambda: None)
    monkeypatch.setattr(_platform, "set_process_flags", lambda: None)
    monkeypatch.delitem(sys.modules, "jax")
    rkt.configure_for_deviceless()
    assert os.environ.get("JAX_PLATFORMS") == platforms


@pytest.mark.slow
def test_a_target_is_a_value_and_a_report_sets_jax_up_when_it_compiles():
    """rk.target() has no side effect; memory_report chooses the platform before it compiles."""
    proc = _run(
        "import os, jax, jax.numpy as jnp\n"
        "import remat_kit as rk\n"
        "h100 = rk.target('h100')\n"
        "print(os.environ.get('JAX_PLATFORMS'))\n"
        "x = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16)\n"
        "r = rk.memory_report(lambda a: a @ a, x, target=h100)\n"
        "print(r.argument_bytes, r.fits)\n"
    )
    assert proc.stdout.split("\n")[:2] == ["None", "2097152 True"], proc.stderr[-2000:]


@pytest.mark.parametrize(
    ("installed", "found"),
    [
        ({"jax_plugins.xla_cuda12"}, True),
        ({"jax_plugins.xla_cuda13"}, True),  # jax[cuda13]: only the second is there
        (set(), False),
    ],
)
def test_either_cuda_plugin_compiles_for_the_catalogue(installed, found, monkeypatch):
    from remat_kit.targets import _platform as platform

    def import_module(name):
        if name not in installed:
            raise ImportError(name)
        return object()

    monkeypatch.setattr(platform.importlib, "import_module", import_module)
    assert platform._cuda_plugin_installed() is found


@pytest.mark.parametrize(
    "text",
    [
        "gpu_device_info { core_count: 132 }",  # one line: text, not a file name
        "gpu_device_info:\n",  # several lines without a brace
    ],
)
def test_config_text_is_read_as_text_and_a_path_as_a_file(text, tmp_path):
    from remat_kit.targets._proto import read_config

    assert read_config(text) == (text, "target config text", None)
    path = tmp_path / "my-gpu.txt"
    path.write_text(text)
    assert read_config(str(path)) == (text, f"target config file {str(path)!r}", "my-gpu")


@pytest.mark.parametrize(
    ("name", "configures"), [("h100", True), ("v5e-4", True), ("cpu", False), ("local", False)]
)
def test_only_a_deviceless_target_sets_up_a_deviceless_compile(monkeypatch, name, configures):
    from remat_kit.targets import _named as named

    calls = []
    monkeypatch.setattr(named, "configure_if_no_gpu", lambda: calls.append(name))
    assert named.as_target(name).name == rk.target(name).name
    made = rk.target(name)
    assert named.as_target(made) is made  # a Target is taken as it is (mutant _named.py:89)
    assert calls == ([name, name] if configures else [])


# Every compute capability the CUDA C++ Programming Guide's table lists (as
# remat_kit/targets/_named.py cites it): Maxwell to Blackwell, Thor's 10.1 and 11.0, GB10's 12.1.
_NVIDIA_MADE = [(5, 0), (5, 2), (5, 3), (6, 0), (6, 1), (6, 2), (7, 0), (7, 2), (7, 5), (8, 0),
                (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (10, 1), (10, 3), (11, 0), (12, 0),
                (12, 1)]  # fmt: skip


@pytest.mark.parametrize(
    ("cc", "refused"),
    [
        ("12.7", True),
        ((9, 5), True),
        *((cc, False) for cc in _NVIDIA_MADE),
        *((cc, True) for cc in [(6, 3), (7, 1), (8, 1), (10, 2), (11, 1)]),
        ("4.0", True),
        ("9.0", False),
        ((8, 9), False),
        ("12.1", False),
        (12.7, True),  # a number, as a JSON file gives it
        (8.9, False),
        (10.0, False),
    ],
)
def test_a_custom_gpu_has_a_compute_capability_nvidia_made(cc, refused):
    # XLA picks kernels by it: a capability no GPU has would compile and say "fits" for a
    # card that cannot exist.
    facts = {**H100_FACTS, "compute_capability": cc}
    if refused:
        with pytest.raises(rk.errors.BadValue, match=r"is no NVIDIA GPU's; those there are: 5\.0"):
            rkt.custom_target("x", facts)
    else:
        text = cc if isinstance(cc, str) else repr(cc)
        wanted = tuple(int(v) for v in text.split(".")) if not isinstance(cc, tuple) else cc
        assert rkt.custom_target("x", facts).compute_capability == wanted


@pytest.mark.parametrize(
    ("major", "minor", "refused"), [(12, 7, True), (9, 5, True), (8, 9, False), (10, 3, False)]
)
def test_a_target_config_file_has_a_compute_capability_nvidia_made(major, minor, refused):
    # The GpuTargetConfigProto door of a custom GPU is checked as the facts' door is.
    text = rk.target("l4").target_config.replace(
        "cuda_compute_capability { major: 8 minor: 9 }",
        f"cuda_compute_capability {{ major: {major} minor: {minor} }}",
    )
    assert f"major: {major} minor: {minor} }}" in text
    if refused:
        with pytest.raises(rk.errors.BadValue, match=rf"{major}\.{minor} of 'my-gpu' is no NVIDIA"):
            rkt.target_from_config(text, name="my-gpu")
    else:
        assert rkt.target_from_config(text, name="my-gpu").compute_capability == (major, minor)


@pytest.mark.parametrize(
    ("description", "like"), [("cpu", "cpu"), ("NVIDIA H100 80GB HBM3", "h100")]
)
def test_cudnn_attention_on_the_local_devices_follows_what_they_are(description, like):
    # A Target made by hand may claim a compute capability for the local CPU host: it is
    # still a CPU (no cuDNN), where the same claim for a local H100 is a GPU's answer.
    local = dataclasses.replace(
        rk.target("local"), description=description, compute_capability=(9, 0)
    )
    expected = rkt.cudnn_attention_available(rk.target(like))
    assert rkt.cudnn_attention_available(local) is expected


@pytest.mark.parametrize(
    ("major", "minor", "available"),
    [(7, 0, False), (7, 5, False), (8, 0, True), (8, 9, True), (9, 0, True), (10, 0, True)],
)
def test_cudnn_attention_needs_an_ampere_or_newer_card_even_with_cudnn_installed(
    monkeypatch, major, minor, available
):
    # cuDNN's fused flash attention runs on sm_80 and later: a V100 (7.0) or a T4 (7.5) has
    # none, whatever wheels are installed. With the cuDNN wheel made present either way, the
    # compute capability alone decides.
    real = importlib.util.find_spec
    present = {"nvidia", "nvidia.cudnn"}
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: object() if name in present else real(name, *a),
    )
    text = rk.target("l4").target_config.replace(
        "cuda_compute_capability { major: 8 minor: 9 }",
        f"cuda_compute_capability {{ major: {major} minor: {minor} }}",
    )
    card = rkt.target_from_config(text, name="card")
    assert card.compute_capability == (major, minor)
    assert rkt.cudnn_attention_available(card) is available


# The scaling book's chip table (jax-ml/scaling-book tpus.md, "Here are some specific numbers
# for our chips"): FLOPs/s/chip bf16 and int8, a source apart from the Cloud TPU pages most
# facts cite. Its takeaway: int8 runs "roughly 2x faster than bfloat16 for generations that
# support it"; v4's Cloud page gives one figure, "275 teraflops (bf16 or int8)".
@pytest.mark.parametrize(
    ("generation", "book_bf16", "book_int8", "ratio"),
    [
        ("v4", 2.75e14, 2.75e14, 1.0),
        ("v5e", 1.97e14, 3.94e14, 2.0),  # Cloud: 197 TFLOPs bf16, 393 TOPs int8
        ("v5p", 4.59e14, 9.18e14, 2.0),
        ("v6e", 9.20e14, 1.84e15, 2.0),  # Cloud: 918 TFLOPs bf16, 1836 TOPs int8
    ],
)
def test_each_tpus_int8_rate_is_the_books_and_its_stated_multiple_of_bf16(
    generation, book_bf16, book_int8, ratio
):
    facts = rkt.TPU_FACTS[generation]
    # the Cloud pages round differently from the book (393 vs 3.94e14): within 1%
    assert facts["peak_bf16_flops"] == pytest.approx(book_bf16, rel=0.01)
    assert facts["peak_int8_ops"] == pytest.approx(book_int8, rel=0.01)
    assert facts["peak_int8_ops"] / facts["peak_bf16_flops"] == pytest.approx(ratio, rel=0.01)


# The scaling book's worked Question 4: int8[B, 4096] @ int8[4096, 16384] on one chip is
# FLOPs bound once 2*4096*16384*B / int8 rate exceeds (16384*4096 + (4096 + 16384)*B) / HBM
# bandwidth. By hand from the Cloud pages: v5e (819 GB/s, 393 TOPs) above B = 258.9 (the book,
# with its rounder 8.1e11 and 3.94e14, says 271); v6e (1638 GB/s, 1836 TOPs) above B = 676.1.
@pytest.mark.parametrize(("generation", "batch"), [("v5e", 258.88), ("v6e", 676.07)])
def test_an_int8_product_turns_compute_bound_at_the_books_batch(generation, batch):
    facts = rkt.TPU_FACTS[generation]
    ops_per_row = 2 * 4096 * 16384 / facts["peak_int8_ops"]
    bytes_per_row = (4096 + 16384) / facts["hbm_bandwidth"]
    weight = 16384 * 4096 / facts["hbm_bandwidth"]
    assert weight / (ops_per_row - bytes_per_row) == pytest.approx(batch, rel=1e-4)


@pytest.mark.parametrize("before", [None, "0"])
def test_libtpus_start_keeps_its_chatter_back_and_restores_the_environment(
    before, capfd, monkeypatch
):
    # libtpu's start off a TPU VM logs that the VM's metadata is missing, which says nothing
    # about a compile: kept back. Its multi-process switch is set for the start only.
    from remat_kit.targets import _platform

    if before is None:
        monkeypatch.delenv("ALLOW_MULTIPLE_LIBTPU_LOAD", raising=False)
    else:
        monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", before)
    with _platform._libtpu_start():
        assert os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
        os.write(2, b"Failed to get TPU metadata (tpu-env) from instance metadata\n")
    assert capfd.readouterr().err == ""
    assert os.environ.get("ALLOW_MULTIPLE_LIBTPU_LOAD") == before


@pytest.mark.parametrize("bad", [0, 96, 2.5, True])
def test_a_slop_factor_outside_whole_percents_1_to_95_is_refused(bad):
    with pytest.raises(rk.errors.BadValue, match=r"whole percent in \[1, 95\]"):
        rk.target("h100").with_slop_factor(bad)


@pytest.mark.parametrize("name", ["cpu", "v5e-4", "local"])
def test_a_slop_factor_on_a_device_that_is_not_a_gpu_is_refused(name):
    # XLA's memory-limit slop factor is a GPU compile's option. A device in this process that
    # is not a GPU (this CPU: no compute capability) is refused as the named CPU and TPU are
    # (seed-82 and seed-88 mutants _core.py:386, the local test's `and -> or`).
    t = rk.target(name)
    assert t.compute_capability is None
    with pytest.raises(rk.errors.BadValue, match=f"GPU targets, not '{t.name}'"):
        t.with_slop_factor(50)


@pytest.mark.parametrize("name", ["cpu", "v5e", "v6e"])
def test_cudnn_attention_is_never_offered_where_no_nvidia_gpu_is(name):
    """A CPU, and a TPU, which names no compute capability: no cuDNN (seed-98 mutant
    _named.py:186 ``or`` read as ``and`` read a TPU's missing capability as a tuple)."""
    assert rk.cudnn_attention_available(rk.target(name)) is False


@pytest.mark.parametrize(
    ("name", "env", "fraction", "source"),
    [
        ("h100", {}, 0.75, "default"),
        ("h100", {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".9"}, 0.9, "XLA_PYTHON_CLIENT_MEM_FRACTION"),
        ("cpu", {}, None, None),
    ],
)
def test_a_targets_record_says_its_allocators_share_and_where_it_came_from(
    monkeypatch, name, env, fraction, source
):
    """A GPU's record carries its runtime's fraction and the variable (or default) it came
    from; a target without a preallocating allocator says none (seed-110 mutant
    _core.py:373, ``is None`` read as ``is not``)."""
    for var in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    d = rkt.target(name).to_dict()
    assert (d["mem_fraction"], d["mem_fraction_source"]) == (fraction, source)
