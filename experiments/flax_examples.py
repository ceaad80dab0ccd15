"""flax's own examples through remat-kit, against bare compiles: lm1b (linen, dropout on) and
gemma (NNX, called as ``(tokens, positions, cache, attention_mask) -> (logits, cache)``).

Neither is on PyPI: give a flax checkout (``git clone https://github.com/google/flax``) with
``--flax DIR``. Each model is a factory of ``experiments/flax_factories.py`` measured with its
block patched (``--block``: neither has a remat option), gemma with no wrapper (remat-kit makes
its positions, cache and causal mask). For every policy, and for ``plan``'s answer at a budget
between ``full`` and ``minimal``, the report's peak against a bare step written here: jax.jit
of value_and_grad and optax's adamw, the block class rematerialized with ``rk.remat`` (tagged by
``rk.tagging`` for name policies), compiled for the H100 with XLA's defaults.
Writes results/flax_examples.json and a PNG.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence

from common import ROOT, plot_pairs, table, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
POLICIES = ("none", "full", "minimal", "dots_no_batch")
#: (factory, block, batch, seq, budget between full and minimal in GiB)
MODELS = {
    "lm1b": ("lm1b", "models:EncoderDecoder1DBlock", 8, 512, 3.3),
    "gemma": ("gemma", "modules:Block", 2, 1024, 15.3),
}


def _bare(name: str, policy: str, batch: int, seq: int) -> int:
    """The bare step's compiled peak (argument + output + temp - alias) for the H100."""
    import flax.linen as nn
    import flax_factories as ff
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    import remat_kit as rk

    pol = rk.as_policy(policy)
    module = ff.lm1b_models if name == "lm1b" else ff.gemma_modules
    cls = "EncoderDecoder1DBlock" if name == "lm1b" else "Block"
    orig = getattr(module, cls)
    remat = nn.remat(orig, policy=pol.jax_policy) if name == "lm1b" else rk.remat(orig, pol)
    setattr(module, cls, remat if pol.is_remat else orig)
    tagged = rk.tagging.tagging("auto") if pol.tags else contextlib.nullcontext()
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    tx = optax.adamw(1e-4)
    try:
        if name == "lm1b":
            model = ff.lm1b(pol)
            with tagged:
                params = jax.eval_shape(model.init, jax.random.key(0), tokens)["params"]

            def logits(p, t, key):
                with rk.tagging.tagging("auto") if pol.tags else contextlib.nullcontext():
                    rngs = {"dropout": jax.random.fold_in(key, 0)}
                    return model.apply({"params": p}, t, rngs=rngs)
        else:
            abstract = nnx.eval_shape(lambda: ff.gemma(pol))
            if pol.tags:
                rk.tagging.tag_nnx(abstract, "auto")
            graphdef, state, rest = nnx.split(abstract, nnx.Param, ...)
            rest = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), rest)
            params = state.to_pure_dict()

            def logits(p, t, key):
                del key
                filled = jax.tree.map(lambda x: x, state)
                nnx.replace_by_pure_dict(filled, p)
                pos = jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (batch, seq))
                mask = jnp.broadcast_to(jnp.tril(jnp.ones((seq, seq), bool)), (batch, seq, seq))
                return nnx.merge(graphdef, filled, rest)(t, pos, None, mask)[0]

        def step(p, o, b, key):
            def loss(p):
                out = logits(p, b["tokens"], key).astype(jnp.float32)
                return optax.softmax_cross_entropy_with_integer_labels(out, b["targets"]).mean()

            value, grads = jax.value_and_grad(loss)(p)
            updates, o = tx.update(grads, o, p)
            return optax.apply_updates(p, updates), o, value

        sh = rk.target("h100").sharding()
        placed = lambda t: jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), t
        )
        key = jax.ShapeDtypeStruct((2,), jnp.uint32)
        args = (params, jax.eval_shape(tx.init, params), {"tokens": tokens, "targets": tokens}, key)
        m = jax.jit(step, donate_argnums=(0, 1)).lower(*map(placed, args)).compile()
        m = m.memory_analysis()
        return (
            m.argument_size_in_bytes
            + m.output_size_in_bytes
            + m.temp_size_in_bytes
            - m.alias_size_in_bytes
        )
    finally:
        setattr(module, cls, orig)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flax", required=True, help="a checkout of github.com/google/flax")
    p.add_argument("--only", default="", help="lm1b and/or gemma (default: both)")
    args = p.parse_args(argv)
    os.environ["REMAT_KIT_FLAX_EXAMPLES"] = os.path.join(args.flax, "examples")
    sys.path.insert(0, HERE)
    import remat_kit as rk

    rows = []
    for name, (factory, block, batch, seq, budget_gib) in MODELS.items():
        if args.only and name not in args.only.split(","):
            continue
        spec = rk.sources.FactorySpec(f"{HERE}/flax_factories.py:{factory}", block=block)
        source = rk.sources.resolve(spec)
        config = rk.TrainConfig(batch, seq)
        for policy in POLICIES:
            r = rk.sources.measure(source, policy, "h100", config, warn=False)
            rows.append(
                {
                    "model": name,
                    "policy": policy,
                    "ours": r.peak_bytes,
                    "bare": _bare(name, policy, batch, seq),
                }
            )
            print(rows[-1], flush=True)
        w = rk.sources.workload(source, "h100", config)
        plan = rk.plan(w, batch, int(budget_gib * 2**30))
        rows.append(
            {
                "model": name,
                "policy": f"plan at {budget_gib} GiB: {plan.policy.spec}",
                "ours": plan.peak_bytes,
                "bare": _bare(name, plan.policy.spec, batch, seq),
            }
        )
        print(rows[-1], flush=True)
    for row in rows:
        row["equal"] = row["ours"] == row["bare"]
    print(table(rows, ("model", "policy", "ours", "bare", "equal"), title="flax's examples"))
    write_json(ROOT / "results" / "flax_examples.json", rows)
    plot_pairs(rows, "ours", "bare", ROOT / "results" / "flax_examples.png", "flax's examples")


if __name__ == "__main__":
    main()
