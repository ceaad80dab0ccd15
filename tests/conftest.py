"""Shared fixtures. The suite runs on a CPU-only machine; GPU figures come from
deviceless compiles, which need JAX_PLATFORMS=cpu before jax initializes."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
