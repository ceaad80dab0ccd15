"""Our step time beside XLA's own: the latency-hiding scheduler's estimate of the same program.

For the published MaxText Llama2-7B runs on 8x H100 (FSDP; experiments/step_time.py has them)
and smaller sharded steps, the program is compiled as ``report`` compiles it and once more with
XLA's schedule dumped (``remat_kit.timing._xla_schedule``: XLA's GPU performance model prices each
instruction; the entry's loops are replaced by their bodies times the trip count). Both are
printed beside the published figure where there is one, with our split (products, memory-bound,
collectives exposed and hidden, launches) and the time XLA's schedule waits on each kind of
collective. Writes results/xla_schedule.json. ``--quick``: the small steps only.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from common import parse, table, write_json
from step_time import PUBLISHED, _predict

import remat_kit as rk
from remat_kit.policies import parse_policy
from remat_kit.schedules import parse_schedule
from remat_kit.timing import xla_estimate
from remat_kit_models.spec import PresetSpec

#: Small sharded steps: (label, model request (fsdp over the devices), train config, policy,
#: devices).
SMALL = (
    (
        "llama3.2-1b b8 s2048 fsdp:2",
        PresetSpec("llama3.2-1b", shard="fsdp:2"),
        rk.TrainConfig(8, 2048, optimizer="sgd", precision=rk.train.regime("bf16")),
        "minimal",
        2,
    ),
    (
        "llama3-8b b8 s2048 fsdp:8 (4 layers)",
        PresetSpec("llama3-8b", overrides=(("layers", 4),), shard="fsdp:8"),
        rk.TrainConfig(8, 2048),
        "full",
        8,
    ),
)


def _lowered(spec: PresetSpec, config: rk.TrainConfig, policy: str, t: rk.Target) -> Any:
    """The step lowered for ``t`` as ``report`` lowers it (sharded over ``t``'s devices)."""
    import jax

    from remat_kit.analysis import abstract

    built = rk.sources.resolve(spec).build_step(
        parse_policy(policy), parse_schedule("none"), config, t, sharded=True
    )
    step = built.step
    args = tuple(abstract(a, s) for a, s in zip(step.args, step.in_shardings, strict=True))
    return jax.jit(step.fn, donate_argnums=step.donate_argnums).lower(*args)


def _row(
    label: str,
    spec: PresetSpec,
    config: rk.TrainConfig,
    policy: str,
    devices: int,
    published: Any,
) -> dict:
    t = rk.target("h100", devices=devices)
    start = time.perf_counter()
    _, ours = _predict(spec, config, policy, t)
    xla = xla_estimate(_lowered(spec, config, policy, t), t)
    split = ours.split()
    return {
        "run": label,
        "policy": policy,
        "published s": published,
        "ours s": ours.seconds,
        "XLA LHS s": xla.seconds if xla else None,
        "ours / XLA": ours.seconds / xla.seconds if xla else None,
        "ours without launches s": ours.seconds - ours.launch_seconds,
        "ours split": {k: round(v, 4) for k, v in split.items()},
        "ours collectives hidden s": ours.collective_hidden_seconds,
        "XLA waits on": {k: round(v, 5) for k, v in (xla.wasted_seconds if xla else {}).items()},
        "XLA per computation": {
            k: {"seconds": s, "runs": n} for k, (s, n) in (xla.computations if xla else {}).items()
        },
        "wall s": time.perf_counter() - start,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(__doc__, argv)
    rows = []
    for label, spec, config, policy, devices in SMALL:
        rows.append(_row(label, spec, config, policy, devices, None))
        print(rows[-1]["run"], rows[-1]["ours s"], rows[-1]["XLA LHS s"], flush=True)
    if not args.quick:
        for label, spec, config, policy, seconds, _tflops in PUBLISHED:  # fsdp:8
            rows.append(_row(label, spec, config, policy, 8, seconds))
            print(rows[-1]["run"], rows[-1]["ours s"], rows[-1]["XLA LHS s"], flush=True)
    columns = ("run", "policy", "published s", "ours s", "ours without launches s", "XLA LHS s")
    print(table(rows, columns, "step time: ours vs XLA's latency-hiding scheduler (h100)"))
    write_json(args.out / "xla_schedule.json", {"rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
