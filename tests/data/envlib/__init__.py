"""A library that configures the JAX process it is imported into, as EasyDeL 0.3 does."""

import os

os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = os.environ.get("ENVLIB_FRACTION", "1.0")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
if os.environ.get("ENVLIB_XLA_FLAGS"):  # EasyDeL appends 17 flags to XLA_FLAGS
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " " + os.environ["ENVLIB_XLA_FLAGS"]
