"""TPU memory to the byte: remat-kit's report of a factory and of a sharded preset against a
bare ``jax.jit`` deviceless TPU compile of the same step (experiments/tpu_memory.py runs the
whole grid: three models, v5e/v5p/v6e, every catalogue policy).

The expected side is built here with jax alone: libtpu's devices from ``get_topology_desc``
with MaxText's own ``accelerator_to_spec_map`` arguments, a ``Mesh`` ordered by jax's
``create_device_mesh``, each argument's PartitionSpec and memory kind put on it, and
``jax.jit(fn, donate_argnums, in_shardings, out_shardings).lower(...).compile()``'s memory
analysis. All five byte counts, the host bytes and the peak are compared.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

import remat_kit as rk
from helpers import maxtext_tpu_devices
from remat_kit.schedules import NO_SCHEDULE
from remat_kit_models.spec import PresetSpec

spec_map = pytest.importorskip("maxtext.utils.accelerator_to_spec_map")

FACTORY = str(Path(__file__).parent / "data" / "factories.py") + ":hf_llama"
HF_BLOCK = "transformers.models.llama.modeling_flax_llama:FlaxLlamaDecoderLayer"
CONFIG = rk.TrainConfig(batch=4, seq=64)
FIELDS = {
    "argument_bytes": "argument_size_in_bytes",
    "output_bytes": "output_size_in_bytes",
    "alias_bytes": "alias_size_in_bytes",
    "temp_bytes": "temp_size_in_bytes",
    "generated_code_bytes": "generated_code_size_in_bytes",
}
#: (case, slice, policies): a factory on one chip, a preset fsdp over a 4-chip slice. The
#: factory's path is the same under any policy: one is compiled, and that the policy reached
#: its block is read off the lowered programs (no compile).
CASES = {
    "factory": ("v6e-1", ("full",)),
    "sharded": ("v5e-4", ("none", "full", "minimal_offloaded")),
}


def _source(case: str):
    if case == "factory":
        return rk.sources.from_factory(FACTORY, block=HF_BLOCK)
    return rk.sources.resolve(PresetSpec("tiny-llama", shard="fsdp:4"))


def _where(d):
    return (d.id, tuple(d.coords), d.core_on_chip, d.device_kind)


def _bare(step, name: str) -> dict[str, int]:
    """The step compiled by jax alone on a mesh of libtpu's devices for ``name``."""
    from jax.experimental import mesh_utils

    def is_leaf(x):
        return x is None or isinstance(x, Sharding)

    leaves = [s for s in jax.tree.leaves(step.in_shardings, is_leaf=is_leaf) if s is not None]
    args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), step.args)
    kwargs = {"donate_argnums": step.donate_argnums}
    if leaves:
        # The step constrains its activations to its own mesh inside the function, and jax
        # compiles for one set of device objects: the mesh takes the step's own devices, once
        # they are shown to be libtpu's for MaxText's arguments.
        theirs = leaves[0].mesh
        own = sorted(theirs.devices.flat, key=lambda d: d.id)
        assert [_where(d) for d in own] == [_where(d) for d in maxtext_tpu_devices(name)]
        shape = tuple(theirs.shape.values())
        mesh = Mesh(mesh_utils.create_device_mesh(shape, own), tuple(theirs.shape))

        def placed(s):
            return None if s is None else NamedSharding(mesh, s.spec, memory_kind=s.memory_kind)

        kwargs["in_shardings"] = jax.tree.map(placed, step.in_shardings, is_leaf=is_leaf)
        kwargs["out_shardings"] = jax.tree.map(placed, step.out_shardings, is_leaf=is_leaf)
    else:
        one = NamedSharding(Mesh(np.array(maxtext_tpu_devices(name)[:1]), ("x",)), PartitionSpec())
        args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one), args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = jax.jit(step.fn, **kwargs).lower(*args).compile().memory_analysis()
    out = {ours: int(getattr(m, theirs)) for ours, theirs in FIELDS.items()}
    out["peak_bytes"] = (
        out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"] - out["alias_bytes"]
    )
    host = ("argument", "output", "temp")
    out["host_bytes"] = sum(int(getattr(m, f"host_{h}_size_in_bytes")) for h in host) - int(
        m.host_alias_size_in_bytes
    )
    return out


@pytest.fixture(scope="module")
def compiled():
    """Both sides of every (case, policy), compiled once for the module."""
    out = {}
    for case, (name, policies) in CASES.items():
        src, t = _source(case), rk.target(name)
        for policy in policies:
            report = rk.sources.measure(src, policy, t, CONFIG, warn=False)
            step = src.build_step(rk.policy(policy), NO_SCHEDULE, CONFIG, t).step
            ours = {k: getattr(report, k) for k in (*FIELDS, "peak_bytes", "host_bytes")}
            out[case, policy] = (ours, _bare(step, name), report, step)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "policy"), [(c, p) for c, (_, policies) in CASES.items() for p in policies]
)
def test_the_report_is_a_bare_tpu_compile_of_the_step_to_the_byte(compiled, case, policy):
    ours, bare, _, _ = compiled[case, policy]
    assert ours == bare


@pytest.mark.slow
def test_the_cases_are_a_sharded_step_an_offload_and_a_policy_that_reached_the_factory(compiled):
    # The comparisons above are of what they claim: a step split four ways over v5e-4, whose
    # policies differ, and an offload policy that put its residuals in the host's memory.
    _, _, report, step = compiled["sharded", "none"]
    assert report.devices == 4 and report.meta["mesh"] == "fsdp:4"
    assert {len(s.mesh.devices.flat) for s in jax.tree.leaves(step.in_shardings)} == {4}
    peaks = {p: compiled["sharded", p][0]["peak_bytes"] for p in CASES["sharded"][1]}
    assert peaks["full"] < peaks["none"]
    assert compiled["sharded", "minimal_offloaded"][0]["host_bytes"] > 0
    # and a factory whose block the policy reached (at these widths the weights outweigh the
    # activations, so full remat is not the smaller: it is another program)
    none = _source("factory").build_step(
        rk.policy("none"), NO_SCHEDULE, CONFIG, rk.target(CASES["factory"][0])
    )
    assert _lowered_text(compiled["factory", "full"][3]) != _lowered_text(none.step)


def _lowered_text(step) -> str:
    args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), step.args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return jax.jit(step.fn, donate_argnums=step.donate_argnums).lower(*args).as_text()
