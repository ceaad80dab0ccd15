"""Shared fixtures. The suite runs on a CPU-only machine; GPU figures come from
deviceless compiles, which need JAX_PLATFORMS=cpu before jax initializes.

GPU compiles cost seconds each, so reports are built once per session and shared. The
session's private compile cache is the root conftest.py's (the doctests share it).
"""

import functools
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest

#: A small bf16 Llama whose train step shows remat effects on a GPU target.
SMALL = dict(
    model="tiny-llama",
    batch=4,
    seq=1024,
    optimizer="sgd",
    param_dtype="bf16",
    dtype="bf16",
    attention="xla",
    overrides=(
        ("layers", 4),
        ("width", 512),
        ("heads", 8),
        ("kv_heads", 4),
        ("ff", 1024),
        ("vocab", 1024),
        ("max_seq", 1024),
    ),
)


@functools.cache
def small_report(
    policy: str, target: str = "h100-80gb", scan: bool = True, schedule: str = "none", **changes
):
    """The compiled report of SMALL under ``policy`` (cached for the session)."""
    from remat_kit_models.measure import Options, baseline_flops, measure

    opts = Options(**{**SMALL, "scan_layers": scan, **changes})
    return measure(opts, policy, target, schedule=schedule, baseline=baseline_flops(opts, target))


@pytest.fixture(scope="session")
def small():
    return small_report
