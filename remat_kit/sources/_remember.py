"""The measuring pipeline's answers remembered on disk, keyed by the request that asked for them
(:func:`remat_kit.cache.remember`): a report, a FLOP count or a tag list."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from remat_kit import cache
from remat_kit.analysis import MemoryReport
from remat_kit.sources._protocol import StepSource
from remat_kit.targets import Target
from remat_kit.train import TrainConfig


def _remembered(
    kind: str,
    source: StepSource,
    t: Target,
    config: TrainConfig,
    compute: Callable[[], Any],
    **request: Any,
) -> Any:
    """``compute()`` remembered on disk (``rk.cache.remember``) under the source's parts,
    the train config, remat_kit's code and ``request``; computed each time for a source
    that names no parts. A warm run answers without tracing; reports read back say 0 s
    compiling."""
    parts = source.cache_parts()
    if parts is None:
        return compute()
    key = {
        **parts,
        "config": dataclasses.asdict(source.train_config(config)),
        "code_remat_kit": cache.code_fingerprint("remat_kit"),
        **request,
    }
    if kind == "report":
        encode = MemoryReport.to_dict

        def decode(d: Any) -> MemoryReport:
            return MemoryReport.from_dict({**d, "compile_seconds": 0.0})

    else:
        encode = decode = lambda value: value  # JSON-ready already
    return cache.remember(kind, key, t, compute, encode=encode, decode=decode)
