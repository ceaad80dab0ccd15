"""Bytes of arrays and abstract values, counted one way everywhere."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def array_bytes(shape: Sequence[int], dtype: Any) -> int:
    """Bytes of an array of ``shape`` and ``dtype`` (int64 product: 70B shapes overflow int32)."""
    return int(np.prod(tuple(shape), dtype=np.int64)) * np.dtype(dtype).itemsize
