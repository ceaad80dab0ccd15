"""What does rk.auto decide at three budgets, and what does deciding cost? (issue 60).

On the tiny own-step Llama of tests/data/own_steps.py (2 layers, width 64, batch 2 x 32), its
blocks marked "auto", compiled for a deviceless H100: the decided plan's compiled peak and
predicted step time at three budgets between full and none, against the best catalogue policy
and none; the cold first call (deciding) against one plain compile of the step; a warm first
call (the decision read back from the disk cache). Writes results/auto_budget.json.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import time
from collections.abc import Sequence

from common import ROOT, parse, table, write_json

import remat_kit as rk
from remat_kit.autoplan import Budget, decide


def _own():
    spec = importlib.util.spec_from_file_location("own_steps", ROOT / "tests/data/own_steps.py")
    mod = sys.modules.setdefault("own_steps", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(mod)
    return mod


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv)
    import os

    os.environ["REMAT_KIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="auto_budget_")  # cold
    import jax

    own = _own()
    cfg = rk.TrainConfig(batch=2, seq=32)
    t = rk.target("h100")
    # own_steps' model, its blocks marked "auto", its loss and SGD step (tests/test_auto.py's)
    _, loss_fn, train_step, _ = own.auto_train()
    by_hand = own.linen_step(rk.policy("none"), cfg)  # the same step, no mark: a plain compile
    args_ = by_hand.args

    rows = []
    start = time.perf_counter()
    plain = by_hand
    sharding = t.sharding()
    placed = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), args_
    )
    jax.jit(plain.fn, donate_argnums=(0, 1)).lower(*placed).compile(
        compiler_options=rk.targets.analysis_options(t)
    )
    plain_s = time.perf_counter() - start
    for given in ("fits", "900KiB", {"activations": 0.6}):
        budget = Budget.of(**given) if isinstance(given, dict) else Budget.of(given)
        kw = dict(target=t, budget=budget, donate_argnums=(0, 1), roles=by_hand.roles,
                  loss_fn=loss_fn, loss_argnums=(0, 2))  # fmt: skip
        cold = decide(train_step, args_, **kw)
        warm = decide(train_step, args_, **kw)
        rows.append({
            "budget": budget.text, "policy": cold.policy, "source": cold.source,
            "peak_kib": cold.peak_bytes / 2**10, "limit_kib": cold.budget_bytes / 2**10,
            "step_us": None if cold.step_seconds is None else cold.step_seconds * 1e6,
            "vs_none": cold.vs_none, "catalogue": cold.catalogue_policy,
            "vs_catalogue": cold.vs_catalogue, "compiles": cold.compiles,
            "decide_s": cold.seconds, "warm_s": warm.seconds, "warm_cached": warm.cached,
            "plain_compile_s": plain_s, "overhead_x": cold.seconds / plain_s,
        })  # fmt: skip
        print(rows[-1], flush=True)
    write_json(args.out / "auto_budget.json", {"rows": rows, "target": t.name})
    print(table(rows, ("budget", "policy", "peak_kib", "limit_kib", "vs_catalogue",
                       "decide_s", "warm_s", "overhead_x")))  # fmt: skip


if __name__ == "__main__":
    main()
