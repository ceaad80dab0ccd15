"""The live Flax libraries through remat-kit's CLI, against a bare compile of the library's own
remat: DeepMind's gemma 3.3 (Gemma 3 4B's widths) and EasyDeL 0.3 (Llama 3 8B's widths).

Each library pins its own jax, so each runs in its own venv (the commands are in
``experiments/gemma_model.py`` and ``experiments/easydel_llama.py``); this script measures
the libraries importable in the interpreter that runs it and merges its rows into
results/library_models.json (a PNG beside it):

    /tmp/gemvenv/bin/python experiments/library_models.py --only gemma
    /tmp/edvenv/bin/python experiments/library_models.py --only easydel

Per library and policy:

- **ours**: ``remat-kit compare --model FACTORY --block BLOCK --depth full`` (one CLI run for
  every policy: its exit code and wall time are recorded), the peak it reports;
- **bare**: the library's model with its own remat (EasyDeL's ``gradient_checkpointing``
  option; gemma has none, so ``flax.linen.remat`` of its ``Block`` by hand) in the step a
  user writes with jax alone: ``value_and_grad`` of cross-entropy on f32 logits, SGD,
  parameters donated, ``jax.jit(...).lower(...).compile().memory_analysis()`` for the
  deviceless GPU. Each bare compile runs in a process of its own (EasyDeL wraps its layer
  class for good with the first policy it is given).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

from common import GIB, ROOT, parse, save_png, table, write_json

HERE = Path(__file__).resolve().parent
POLICIES = ("none", "full", "dots_no_batch")
#: name -> (factory, block, the bare model's factory, its layers, batch, seq, CLI flags)
LIBRARIES = {
    "gemma": dict(
        module="gemma",
        factory=f"{HERE / 'gemma_model.py'}:gemma",
        block="gemma.gm.nn._modules:Block",
        layers=6,
        batch=1,
        seq=2048,
        flags=["--precision", "bf16"],  # its weights are bf16, as the bare step keeps them
        policies=POLICIES,
    ),
    "easydel": dict(
        module="easydel",
        factory=f"{HERE / 'easydel_llama.py'}:llama8b",
        block="easydel.modules.llama.modeling_llama:LlamaDecoderLayer",
        layers=4,
        batch=1,
        seq=2048,
        # bf16 weights as built; EasyDeL sets the fraction 1.0 at import (docs/your-model.md)
        flags=["--precision", "bf16", "--mem-fraction", "0.75"],
        policies=(*POLICIES, "minimal"),
    ),
}


def _ours(lib: dict, target: str) -> dict:
    """One ``compare`` run through the CLI: exit code, wall time, peaks by policy."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "compare.json"
        argv = [sys.executable, "-m", "remat_kit.cli", "compare", "--model", lib["factory"]]
        argv += ["--block", lib["block"], "--target", target, "--optimizer", "sgd"]
        argv += ["--batch", str(lib["batch"]), "--seq", str(lib["seq"]), "--depth", "full"]
        argv += ["--policies", ",".join(lib["policies"]), "--json", str(out), *lib["flags"]]
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, cwd=HERE)
        seconds = time.perf_counter() - start
        rows = json.loads(out.read_text()) if out.exists() else []
    return {
        "command": " ".join(["remat-kit", *argv[3:]]),
        "exit_code": done.returncode,
        "seconds": seconds,
        "stderr_tail": done.stderr.strip().splitlines()[-1:] if done.returncode else [],
        "peaks": {r["policy"]: r["peak_bytes"] for r in rows},
    }


def _bare(name: str, policy: str, target: str) -> dict:
    """The bare peak of ``name``'s model with its own remat, in a process of its own."""
    argv = [sys.executable, __file__, "--bare", name, "--policy", policy, "--target", target]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=HERE)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1], "seconds": None}
    return {
        **json.loads(done.stdout.strip().splitlines()[-1]),
        "seconds": time.perf_counter() - start,
    }


def _own_model(name: str, policy: str, target):
    """The library's model with the library's own remat for ``policy``."""
    import remat_kit as rk

    lib = LIBRARIES[name]
    sys.path.insert(0, str(HERE))
    if name == "easydel":
        import easydel_llama

        return easydel_llama.llama8b_own(rk.policy(policy), target, layers=lib["layers"])
    import flax.linen as nn
    import gemma_model
    import jax
    from gemma.gm.nn import _modules

    # gemma has no remat option: flax's own remat of its Block, looked up as the model builds.
    jax_policy = {
        "full": jax.checkpoint_policies.nothing_saveable,
        "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    }
    if policy != "none":
        _modules.Block = nn.remat(_modules.Block, policy=jax_policy[policy])
    return gemma_model.gemma(rk.policy("none"), layers=lib["layers"])


def bare_peak(model, batch: int, seq: int, target) -> int:
    """The step a user writes, compiled by jax alone for ``target``: its peak in bytes."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    if isinstance(model, nnx.Module):
        graphdef, params, abstract_rest = nnx.split(model, nnx.Param, ...)

        def logits_of(p, t):
            # The rest (RNG keys and counts): constants made inside the trace, whose
            # variables a remat'd layer may advance (made outside, they belong to another
            # trace level, and EasyDeL's own remat fails with flax's TraceContextError).
            rest = jax.tree.map(
                lambda x: (
                    jax.random.key(0)
                    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
                    else jnp.zeros(x.shape, x.dtype)
                ),
                abstract_rest,
            )
            return nnx.merge(graphdef, p, rest)(t)

    else:
        params = jax.eval_shape(model.init, jax.random.key(0), tokens)["params"]

        def logits_of(p, t):
            out = model.apply({"params": p}, t)
            return getattr(out, "logits", out)

    def step(p, tokens, targets):
        def loss(p):
            logits = logits_of(p, tokens).astype(jnp.float32)
            return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

        value, grads = jax.value_and_grad(loss)(p)
        return jax.tree.map(lambda w, g: w - (1e-4 * g).astype(w.dtype), p, grads), value

    sharding = target.sharding()
    placed = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
        (params, tokens, tokens),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = jax.jit(step, donate_argnums=0).lower(*placed).compile().memory_analysis()
    return (
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        + m.temp_size_in_bytes
        - m.alias_size_in_bytes
    )


def _bare_main(argv: Sequence[str]) -> None:
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--bare")
    p.add_argument("--policy")
    p.add_argument("--target")
    args = p.parse_args(argv)
    from flax import nnx

    import remat_kit as rk

    lib = LIBRARIES[args.bare]
    target = rk.target(args.target, mem_fraction=0.75)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if args.bare == "easydel":  # NNX: built abstractly, no weights allocated
            model = nnx.eval_shape(lambda: _own_model(args.bare, args.policy, target))
        else:
            model = _own_model(args.bare, args.policy, target)
    peak = bare_peak(model, lib["batch"], lib["seq"], target)
    print(json.dumps({"peak_bytes": peak}))


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__, argv)
    import importlib.util

    names = [n for n in (args.only.split(",") if args.only else LIBRARIES) if n]
    names = [n for n in names if importlib.util.find_spec(LIBRARIES[n]["module"])]
    path = args.out / "library_models.json"
    data = json.loads(path.read_text()) if path.exists() else {"libraries": {}}
    import jax

    for name in names:
        lib = LIBRARIES[name]
        ours = _ours(lib, args.target)
        print(f"{name}: {ours['command']}: exit {ours['exit_code']} in {ours['seconds']:.1f} s")
        rows = []
        for policy in lib["policies"]:
            bare = _bare(name, policy, args.target)
            row = {"policy": policy, "ours_gib": None, "bare_gib": None, "diff_pct": None}
            if policy in ours["peaks"]:
                row["ours_gib"] = ours["peaks"][policy] / GIB
            if "peak_bytes" in bare:
                row["bare_gib"] = bare["peak_bytes"] / GIB
            if row["ours_gib"] is not None and row["bare_gib"] is not None:
                row["diff_pct"] = 100 * (row["ours_gib"] / row["bare_gib"] - 1)
            row["bare_seconds"] = bare["seconds"]
            row["bare_error"] = bare.get("error")
            rows.append(row)
            print(f"  {policy}: {row}", flush=True)
        data["libraries"][name] = {
            "library": f"{lib['module']} {_version(lib['module'])}",
            "jax": jax.__version__,
            "shape": {k: lib[k] for k in ("layers", "batch", "seq")},
            "target": args.target,
            "ours": ours,
            "rows": rows,
        }
        print(table(rows, ["policy", "ours_gib", "bare_gib", "diff_pct"], title=name))
    write_json(path, data)
    _plot(data, args.out / "library_models.png")


def _version(module: str) -> str:
    from importlib import metadata

    return metadata.version(module)


def _plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    libs = data["libraries"]
    fig, axes = plt.subplots(1, len(libs), figsize=(5 * len(libs), 3.6), squeeze=False)
    for ax, lib in zip(axes[0], libs.values(), strict=True):
        rows = [r for r in lib["rows"] if r["ours_gib"] is not None and r["bare_gib"] is not None]
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [r["ours_gib"] for r in rows], 0.4, label="remat-kit")
        ax.bar([x + 0.2 for x in xs], [r["bare_gib"] for r in rows], 0.4, label="bare compile")
        ax.set_xticks(list(xs), [r["policy"] for r in rows])
        ax.set_title(f"{lib['library']} ({lib['shape']['layers']} layers)")
        ax.set_ylabel("peak GiB (h100)")
        ax.legend()
    save_png(fig, path)


if __name__ == "__main__":
    if "--bare" in sys.argv:
        sys.path.insert(0, str(ROOT))
        _bare_main(sys.argv[1:])
    else:
        main()
