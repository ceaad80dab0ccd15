"""TPU slices as targets: names as Cloud TPU and MaxText write them, libtpu's own topology,
memory equal to a bare compile, and the one-line refusals.

Expected values come from elsewhere: MaxText's ``accelerator_to_spec_map`` (its
``compile_topology`` names) and libtpu's topology built here by ``get_topology_desc`` directly.
Memory against a bare compile on libtpu's devices: tests/test_tpu_memory.py.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_kit as rk
from helpers import maxtext_tpu_devices
from remat_kit.cli import main
from remat_kit.errors import BadValue, TargetError, UnknownName
from remat_kit.targets import _platform, parse_slice

spec_map = pytest.importorskip("maxtext.utils.accelerator_to_spec_map")
MAXTEXT = {
    name: spec
    for name, spec in spec_map.UserFacingNameToSystemCharacteristics.items()
    if spec.platform == "tpu"
}


# --- names --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MAXTEXT))
def test_every_maxtext_compile_topology_name_is_the_slice_maxtext_builds(name):
    spec, s = MAXTEXT[name], parse_slice(name)
    assert s.topology == spec.topology_name
    assert s.layout.chip_config == spec.chip_config_name
    assert s.chips_per_host_bounds == tuple(spec.chips_per_host_bounds)
    assert s.wrap == tuple(spec.wrap)
    assert s.devices == spec.devices_per_slice
    assert s.name == name


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # Cloud TPU's accelerator types and product names
        ("v5litepod-16", ("v5e", (4, 4), 16)),
        ("trillium-8", ("v6e", (2, 4), 8)),
        ("v6e:8x16", ("v6e", (8, 16), 128)),
        ("v5p:4x4x8", ("v5p", (4, 4, 8), 128)),  # libtpu's own spelling of v5p's topology
        ("V5P-8", ("v5p", (2, 2, 1), 4)),
        ("tpu7x-8", ("tpu7x", (2, 2, 1), 8)),  # two devices a chip
        # Under a host's 2x2x1: one chip, and two in a row (docs/guides/tpu.md's v5p:1x2x1;
        # issue 58 mutant _slices.py:357 of seed 79).
        ("v4-2", ("v4", (1, 1, 1), 1)),
        ("v5p-4", ("v5p", (1, 2, 1), 2)),
    ],
)
def test_a_slice_is_named_as_users_name_it(name, expected):
    s = parse_slice(name)
    assert (s.generation, s.grid, s.devices) == expected


@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        ("v5p-7", {}, "counts TensorCores, 2 to a chip: use an even count"),
        ("v5p-24", {}, r"12 chips have no default 3D grid .* v5p:AxBxC"),
        ("v5e-512", {}, "v5e slices hold at most 256 chips"),
        ("v6e:4x4x4", {}, "a v6e slice is a 2D grid of chips, got 4x4x4"),
        # a side of no chips: no slice at all, though the other sides are whole
        ("v6e:0x4", {}, "a v6e slice is a 2D grid of chips, got 0x4"),
        ("v5p:2x0x2", {}, "a v5p slice is a 3D grid of chips, got 2x0x2"),
        ("v5e", {}, r"names a TPU generation, not a slice: name one as v5e-N \(N chips\)"),
        ("v5p-8", {"devices": 8}, "v5p-8 holds 4 devices, not devices=8"),
        ("v5p-8", {"mem_fraction": 0.9}, "mem_fraction is for GPU targets"),
        ("v5p-8", {"node": "a3-mega"}, "node is for GPU targets"),
        ("h100", {"slices": 2}, "slices are for TPU targets, not .h100."),
    ],
)
def test_a_slice_that_cannot_be_is_refused_naming_what_can(name, kwargs, match):
    if name == "v5e" and not kwargs:
        with pytest.raises(BadValue, match=match):
            parse_slice(name)
        return
    with pytest.raises(BadValue, match=match):
        rk.target(name, **kwargs)


def test_an_unknown_generation_lists_those_there_are():
    with pytest.raises(UnknownName, match="tpu7x"):
        parse_slice("v9-8")


def test_a_bare_generation_takes_its_devices():
    t = rk.target("v5e", devices=16)
    assert (t.tpu_slice.name, t.topology, t.hosts) == ("v5e-16", "v5e:4x4", 4)


# (generation, devices, slices, chips in each slice): the chips by hand, the devices over the
# devices a chip (2 on TPU7x, whose two cores are two JAX devices) over the slices
@pytest.mark.parametrize(
    ("generation", "devices", "slices", "chips"),
    [
        ("tpu7x", 8, 1, 4),  # 8 devices: 4 chips of 2
        ("v5e", 16, 2, 8),  # two slices of 8 chips
        ("tpu7x", 16, 2, 4),  # two slices of 4 chips of 2
    ],
)
def test_a_bare_generation_s_devices_are_shared_over_chips_and_slices(
    generation, devices, slices, chips
):
    t = rk.target(generation, devices=devices, slices=slices)
    s = t.tpu_slice
    assert (math.prod(s.grid), s.slices) == (chips, slices)
    assert s.devices == t.devices == devices  # the devices asked for, every one


@pytest.mark.parametrize(
    ("name", "hbm", "limit"),
    [
        # the Cloud TPU pages' HBM per chip, and libtpu's limit as its compiler states it
        # (15.75G for v5e: the OOM message below)
        ("v5e-4", 16 * 2**30, 16 * 2**30 - 258 * 2**20),
        ("v5p-8", 96 * 2**30, 96 * 2**30 - 279 * 2**20),
        ("tpu7x-8", 95 * 2**30, 95 * 2**30 - 268 * 2**20),  # a core: libtpu models 95 GiB
    ],
)
def test_a_tpu_device_may_use_its_hbm_less_the_runtimes_reserve(name, hbm, limit):
    t = rk.target(name)
    assert (t.memory_bytes, t.usable_bytes, t.runtime) == (hbm, limit, None)


@pytest.mark.parametrize(
    ("generation", "limit"),
    [
        # libtpu's bytes limit per device, as measured deviceless (its OOM reports; the
        # module docstring of remat_kit/targets/_tpus.py says how)
        ("v4", 33_014_414_336),
        ("v5e", 16_909_336_576),
        ("v5p", 102_786_662_400),
        ("v6e", 33_546_043_392),
        ("tpu7x", 101_724_454_912),
    ],
)
def test_every_generations_stated_limit_is_its_hbm_less_the_reserve_and_what_a_target_uses(
    generation, limit
):
    from remat_kit.targets._tpus import TPU_FACTS

    facts = TPU_FACTS[generation]
    assert facts["bytes_limit_per_device"] == limit
    assert facts["hbm_bytes_per_device"] - facts["hbm_reserved_bytes_per_device"] == limit
    assert rk.target(generation).usable_bytes == limit


# --- libtpu -------------------------------------------------------------------------------------


_JAX_REQUIRES = [  # jax 0.12.0.1's own lines, as importlib.metadata.requires("jax") gives them
    "jaxlib<=0.12.0.1,>=0.12.0.1",
    'jaxlib<=0.12.0.1,>=0.12.0.1; extra == "tpu"',
    'libtpu==0.0.50.*; extra == "tpu"',
    'requests; extra == "tpu"',
    'jax-cuda12-plugin[with-cuda]<=0.12.0.1,>=0.12.0.1; extra == "cuda12"',
]


@pytest.mark.parametrize(
    ("requires", "installed", "pin"),
    [
        (_JAX_REQUIRES, "0.0.50.1", ("0.0.50.1", "==0.0.50.*")),
        # libtpu named only under another extra, or not at all: no pin to hold it to
        ([r.replace('libtpu==0.0.50.*; extra == "tpu"', 'libtpu==0.0.9; extra == "tpu-old"')
          for r in _JAX_REQUIRES], "0.0.50.1", ("0.0.50.1", None)),
        ([r for r in _JAX_REQUIRES if not r.startswith("libtpu")], None, (None, None)),
    ],
    ids=["jax-0.12", "another-extra", "none"],
)  # fmt: skip
def test_the_libtpu_pin_is_the_one_jaxs_tpu_extra_names(monkeypatch, requires, installed, pin):
    import importlib.metadata

    def version(name):
        if name != "libtpu" or installed is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed

    monkeypatch.setattr(importlib.metadata, "requires", lambda name: requires)
    monkeypatch.setattr(importlib.metadata, "version", version)
    _platform._libtpu_pin.cache_clear()
    try:
        assert _platform._libtpu_pin() == pin
    finally:
        _platform._libtpu_pin.cache_clear()


def test_a_missing_libtpu_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setattr(_platform, "_libtpu_pin", lambda: (None, "==0.0.50.*"))
    with pytest.raises(TargetError, match=r"needs libtpu.*pip install 'remat-kit\[tpu\]'"):
        rk.target("v5e-4").mesh()


def test_a_libtpu_that_is_not_jaxs_is_one_line_naming_the_fix(monkeypatch):
    monkeypatch.setattr(_platform, "_libtpu_pin", lambda: ("0.0.40", "==0.0.50.*"))
    with pytest.raises(TargetError, match=r"libtpu 0\.0\.40 is installed: pip install 'jax\[tpu\]"):
        rk.target("v5e-4").mesh()


def test_the_cli_says_a_missing_libtpu_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(_platform, "_libtpu_pin", lambda: (None, "==0.0.50.*"))
    argv = ["report", "--model", "tiny-llama", "--target", "v5e-4", "--shard", "fsdp:4"]
    code = main([*argv, "--batch", "4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("remat-kit: compiling for v5e-4")


def test_a_slice_without_a_mesh_is_one_line_naming_both_ways_out(capsys):
    code = main(["report", "--model", "tiny-llama", "--target", "v5p-8", "--batch", "4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "v5p-8 holds 4 chips and no --shard" in err[0] and "--target v5p-2" in err[0]


@pytest.mark.parametrize(("on_a_tpu_vm", "deviceless"), [(False, 1), (True, 0)])
def test_a_topology_is_built_deviceless_only_off_a_tpu_vm(monkeypatch, on_a_tpu_vm, deviceless):
    # Off a TPU VM the process is pinned to the CPU before libtpu builds the topology (no
    # driver probing a device that is absent); on a TPU VM its chips stay jax's to use, so
    # the platform is left alone. Either way the topology is libtpu's.
    calls = []
    topology = object()
    monkeypatch.setattr(_platform, "_check_libtpu", lambda name: None)
    monkeypatch.setattr(_platform, "_has_tpu_device", lambda: on_a_tpu_vm)
    monkeypatch.setattr(_platform, "configure_for_deviceless", lambda: calls.append(1))
    monkeypatch.setattr(_platform, "_cached_tpu_topology", lambda args: topology)
    args = (("topology_name", "v5e:2x2"),)
    assert _platform.tpu_topology(args, "v5e-4") is topology
    assert len(calls) == deviceless


# --- libtpu's own topology, compiled ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["v5e-4", "v5p-8", "v6e-4", "v4-8"])
def test_the_mesh_is_libtpus_devices_in_jaxs_order(name):
    from jax.experimental import mesh_utils

    mesh = rk.target(name).mesh(("data", "model"), (2, 2))
    want = mesh_utils.create_device_mesh((2, 2), maxtext_tpu_devices(name))
    assert [d.id for d in mesh.devices.flat] == [d.id for d in want.flat]
    assert {d.device_kind for d in mesh.devices.flat} == {maxtext_tpu_devices(name)[0].device_kind}


@pytest.mark.slow
def test_a_program_over_a_tpus_memory_is_reported_over_it_with_libtpus_figure():
    big = jax.ShapeDtypeStruct((5 * 2**30,), jnp.float32)  # 20 GiB in, 20 out: over a v5e
    t = rk.target("v5e-1")
    low = jax.jit(lambda a: a * 2).lower(
        jax.ShapeDtypeStruct(big.shape, big.dtype, sharding=t.sharding())
    )
    m = rk.xla.compile_memory(low)
    assert m.over_device and m.peak_bytes == 40 * 2**30  # libtpu: "(40.00G)"
    assert m.peak_bytes > t.usable_bytes


@pytest.mark.slow
def test_slices_are_joined_on_the_mesh_axis_they_divide():
    """Two v5e-4 slices: libtpu gives each device its slice; the data axis spans the slices
    (DCN, the outer part), the model axis stays within one (ICI)."""
    mesh = rk.target("v5e-4", slices=2).mesh(("data", "model"), (2, 4))
    slices = np.vectorize(lambda d: d.slice_index)(mesh.devices)
    assert slices.tolist() == [[0, 0, 0, 0], [1, 1, 1, 1]]
    # four one-chip slices over a 2 x 2 mesh: no axis spans all four
    with pytest.raises(BadValue, match="no axis that 4 slices divide"):
        rk.target("v5e-1", slices=4).mesh(("a", "b"), (2, 2))


@pytest.mark.parametrize(
    ("name", "word"), [("v5e-4", "chip"), ("v5p-8", "chip"), ("h100", "GPU"), ("cpu", "device")]
)
def test_figures_per_device_name_the_device_they_are_per(name, word):
    """A sharded report's collectives line and the per-tag table's unsharded caveat say per
    chip on a TPU slice (per TensorCore where a chip is two devices), per GPU on a GPU."""
    from remat_kit.render import residual_table
    from remat_kit.render._captions import collective_words

    target = rk.target(name)
    assert target.device_word == word
    row = {"launches": 2, "bytes": 2**30, "groups": [4]}
    assert collective_words({"all-gather": row}, target.device_word).startswith(
        f"collectives per step, per {word}: all-gather 2x"
    )
    res = rk.residuals.ResidualReport(
        residuals=(rk.residuals.Residual("argument", (), "float32", 2**30, "saved", 1, ""),),
        tags={"mlpwo": "recomputed"},
        tag_bytes={},
        tag_count={},
    )
    report = SimpleNamespace(meta=rk.analysis.ReportMeta.of({"layers": 2, "devices": 4}))
    table = residual_table(res, report, target.device_word)
    assert table.title.endswith(f"the step unsharded: not per {word})")
    assert f"(the unsharded step, not per {word})" in table.caption


# --- the generations' figures -------------------------------------------------------------------

GiB, MiB = 2**30, 2**20

# Every figure of remat_kit/targets/_tpus.py's TPU_FACTS, written down here from the source
# that file cites for it (the Cloud TPU pages, the scaling book's tables, libtpu's limits as
# measured deviceless), in the sources' own units: GBps as 1e9 B/s, Gbps as 1e9 bit/s.
# (tensorcores, devices per chip, torus dims, pod chips, HBM per chip, HBM per device,
#  reserved per device, HBM B/s, bf16, int8, fp8, ICI links, ICI bidir B/s, ICI link one way,
#  DCN B/s per chip, host link B/s per chip, MXU side, chips per host, chips per VM)
SOURCES = {
    # cloud.google.com/tpu/docs/v4: two TensorCores, 4096-chip pods, 32 GiB at 1200 GBps,
    # 275 TFLOPs bf16 or int8; the book: 6 links, 4.5e10 a link a way, PCIe 16 GB/s each way
    "v4": (2, 1, 3, 4096, 32 * GiB, 32 * GiB, 32 * GiB - 33_014_414_336, 1200e9, 275e12,
           275e12, None, 6, None, 4.5e10, None, 16e9, 128, 4, 4),
    # docs/v5e: one TensorCore, 2D torus, 256 chips, 16 GB at 819 GBps, 197 / 393 T, 4 ports,
    # 400 GBps bidir, 8 chips a host; the book: 3.125e9 DCN, 1.5e10 PCIe per chip
    "v5e": (1, 1, 2, 256, 16 * GiB, 16 * GiB, 258 * MiB, 819e9, 197e12, 393e12, None, 4,
            400e9, 4.5e10, 3.125e9, 1.5e10, 128, 8, 4),
    # docs/v5p: 2 TensorCores, 3D torus, 8960 chips, 96 GiB at 2765 GBps, 459 T bf16 and fp8,
    # 1200 GBps bidir ICI, 50 Gbps DCN; the book: int8 9.18e14, 6 links at 9e10 a way
    "v5p": (2, 1, 3, 8960, 96 * GiB, 96 * GiB, 279 * MiB, 2765e9, 459e12, 918e12, 459e12, 6,
            1200e9, 9e10, 50e9 / 8, 1.5e10, 128, 4, 4),
    # docs/v6e: 1 TensorCore, 2D torus, 256 chips, 32 GB (31.5 GiB a device in libtpu) at
    # 1638 GBps, 918 / 1836 T, 4 ports at 800 GBps bidir, two 256x256 MXUs, 8 chips a host;
    # docs/tpu7x's table: v6e fp8 918 T, DCN 100 Gb/s; the book: PCIe 32 GB/s
    "v6e": (1, 1, 2, 256, 32 * GiB, 31 * GiB + 512 * MiB, 264 * MiB, 1638e9, 918e12,
            1836e12, 918e12, 4, 800e9, 9e10, 100e9 / 8, 32e9, 256, 8, 4),
    # docs/tpu7x: 2 TensorCores, two devices a chip, 9216 chips, 192 GiB (95 GiB a device in
    # libtpu) at 7380 GB/s, 2307 T bf16, 4614 T fp8, 1200 GB/s bidir ICI, 100 Gb/s DCN
    "tpu7x": (2, 2, 3, 9216, 192 * GiB, 95 * GiB, 268 * MiB, 7380e9, 2307e12, None, 4614e12,
              None, 1200e9, None, 100e9 / 8, None, None, 4, 4),
}  # fmt: skip
_FIGURES = (
    "tensorcores_per_chip", "devices_per_chip", "torus_dims", "pod_chips", "hbm_bytes_per_chip",
    "hbm_bytes_per_device", "hbm_reserved_bytes_per_device", "hbm_bandwidth", "peak_bf16_flops",
    "peak_int8_ops", "peak_fp8_flops", "ici_links_per_chip", "ici_bandwidth_per_chip_bidir",
    "ici_link_bandwidth_one_way", "dcn_bandwidth_per_chip", "host_link_bandwidth_per_chip",
    "mxu_size", "chips_per_host", "chips_per_vm",
)  # fmt: skip


@pytest.mark.parametrize("generation", sorted(SOURCES))
def test_every_figure_of_a_generation_is_the_one_its_source_states(generation):
    from remat_kit.targets import TPU_FACTS

    facts = TPU_FACTS[generation]
    got = {name: facts[name] for name in _FIGURES}
    assert got == dict(zip(_FIGURES, SOURCES[generation], strict=True))
    # the limit libtpu's compiler enforces: a device's HBM less the runtime's reserve
    hbm, reserved = SOURCES[generation][5], SOURCES[generation][6]
    assert facts["bytes_limit_per_device"] == hbm - reserved


@pytest.mark.parametrize(
    ("name", "generation"),
    [("v4-8", "v4"), ("v5e-4", "v5e"), ("v5p-8", "v5p"), ("v6e-1", "v6e"), ("tpu7x-8", "tpu7x")],
)
def test_a_slice_s_target_prices_one_device_of_its_chip(name, generation):
    """A target's HBM bandwidth and bf16 peak are a JAX device's: a chip's as the source states
    them over its devices per chip (two TensorCores, two devices on TPU7x; one under megacore)
    (issue 58 mutant _named.py:268 of seed 103, the bf16 peak multiplied by the count)."""
    per_chip = SOURCES[generation][1]
    t = rk.target(name)
    assert t.hbm_bandwidth == SOURCES[generation][7] / per_chip
    assert t.peak_bf16_flops == SOURCES[generation][8] / per_chip


@pytest.mark.parametrize("slices", [0, -1, True, "2", 1.0])
def test_a_slice_made_directly_checks_its_count(slices):
    """``Slice`` keeps its own rule, not only ``target()``'s (issue 58 mutant _slices.py:152
    of seed 75, ``or`` read as ``and``): a count is a positive int, a bool is not one."""
    with pytest.raises(rk.errors.BadValue, match=rf"slices must be a positive int, got {slices!r}"):
        rk.targets.Slice("v5e", (2, 2), slices)
    assert rk.targets.Slice("v5e", (2, 2), 3).slices == 3
