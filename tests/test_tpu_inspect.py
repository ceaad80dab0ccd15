"""inspect on a TPU slice: refused in one line before any compile, and the reason it gives is
libtpu's own (issue 62).

inspect names what is live at the peak from XLA's buffer assignment. libtpu's dump has its
HBM arguments and outputs to the byte, but its temp is not the dump's HBM temp block. The
expected side is built here with jax alone: libtpu's devices from ``get_topology_desc`` with
MaxText's arguments, ``jax.jit(...).lower(...).compile(compiler_options={"xla_dump_to": ...})``
and the allocation headers read with a regex of this file, not remat_kit's parser.
"""

from __future__ import annotations

import glob
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import remat_kit as rk
from helpers import maxtext_tpu_devices
from remat_kit.errors import BadValue
from remat_kit.peak import check_target

pytest.importorskip("maxtext.utils.accelerator_to_spec_map")

#: An allocation header of the buffer assignment: its size and what follows.
HEADER = re.compile(r"^allocation \d+: size (\d+), (.*):$", re.M)


@pytest.mark.parametrize("name", ["v5e-4", "v5p-8", "v6e-1", "v4-8"])
def test_inspect_refuses_every_tpu_generation_in_one_line(name, no_compile):
    x = jax.ShapeDtypeStruct((8,), jnp.float32)
    with pytest.raises(BadValue) as err:
        rk.inspect(jnp.sin, x, target=name)
    message = str(err.value)
    assert err.value.param == "target" and "\n" not in message
    assert f"for {name}, report gives the peak" in message
    assert "its temp is not the HBM temp block" in message


@pytest.mark.parametrize("name", ["h100", "a100-40gb", "cpu"])
def test_gpu_and_cpu_targets_pass_the_check(name):
    assert check_target(rk.target(name)) is None


def _mlp_dump(name: str, tmp_path) -> tuple[object, list[tuple[int, str]]]:
    """A two-layer 512-wide MLP's gradient compiled by jax alone for one device of libtpu's
    ``name``: its memory analysis and its allocation headers (size, attributes)."""
    one = NamedSharding(Mesh(np.array(maxtext_tpu_devices(name)[:1]), ("x",)), PartitionSpec())
    p = [jax.ShapeDtypeStruct((512, 512), jnp.float32, sharding=one) for _ in range(2)]
    x = jax.ShapeDtypeStruct((8, 512), jnp.float32, sharding=one)

    def loss(p, x):
        return jnp.tanh(jnp.tanh(x @ p[0]) @ p[1]).sum()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lowered = jax.jit(jax.grad(loss)).lower(p, x)
        compiled = lowered.compile(compiler_options={"xla_dump_to": str(tmp_path)})
    (path,) = glob.glob(str(tmp_path / "*after_optimizations-buffer-assignment.txt"))
    with open(path) as f:
        headers = [(int(size), attrs) for size, attrs in HEADER.findall(f.read())]
    return compiled.memory_analysis(), headers


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "temp", "block"), [("v5e-4", 0, 16_896), ("v5p-8", 171_904, 90_112)]
)
def test_the_refusal_states_what_libtpu_gives(name, temp, block, tmp_path):
    # Arguments and outputs add up to the HBM (color 0) allocations; temp does not add up to
    # the HBM temp block: the figures the refusal quotes are this compile's.
    stats, headers = _mlp_dump(name, tmp_path)
    hbm = [(size, attrs) for size, attrs in headers if "color " not in attrs]
    assert stats.argument_size_in_bytes == sum(s for s, a in hbm if "parameter " in a)
    assert stats.output_size_in_bytes == sum(s for s, a in hbm if "maybe-live-out" in a)
    assert sum(s for s, a in hbm if "preallocated-temp" in a) == block
    assert stats.temp_size_in_bytes == temp != block
    with pytest.raises(BadValue) as err:
        check_target(rk.target(name))
    generation = name.split("-")[0]
    assert f"{temp:,} B of temp against a {block:,} B block on {generation}" in str(
        err.value
    ) or f"{temp:,} B against {block:,} B on {generation}" in str(err.value)
