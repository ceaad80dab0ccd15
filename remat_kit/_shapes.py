"""Bytes of arrays and abstract values, counted one way everywhere."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def array_bytes(shape: Sequence[int], dtype: Any) -> int:
    """Bytes of an array of ``shape`` and ``dtype`` (int64 product: 70B shapes overflow int32)."""
    return int(np.prod(tuple(shape), dtype=np.int64)) * np.dtype(dtype).itemsize


def path_keys(path: Sequence[Any]) -> tuple[str, ...]:
    """A pytree key path (``jax.tree_util.tree_flatten_with_path``) as strings.

    Example:
      >>> import jax
      >>> path_keys(jax.tree_util.tree_flatten_with_path({"params": [0]})[0][0][0])
      ('params', '0')
    """
    out = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                out.append(str(getattr(k, attr)))
                break
        else:
            out.append(str(k))
    return tuple(out)
