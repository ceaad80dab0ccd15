"""Does rk.auto's decision beat the catalogue on models nobody here wrote? (issue 60).

Four models, their blocks marked ``rk.remat(Block, "auto")`` by patching the block class (none
of them has a remat option of ours): flax's lm1b example (linen, dropout on), gemma's NNX model
from flax's examples, Hugging Face's Flax Llama (transformers), and the ``llama3.2-1b`` preset,
each a few layers deep and trained by a step written here (value_and_grad of cross-entropy,
optax adamw, parameters and optimizer state donated) for a deviceless H100. At three budgets
a quarter, half and three quarters of the way from ``full``'s compiled peak to ``none``'s, the
decided plan (``rk.autoplan.decide``, what ``rk.auto`` calls at its first call, with the loss
so that the per-tensor planner competes) against

- (a) the fastest catalogue policy whose compiled peak is under the same budget (every
  catalogue policy that needs no host memory, compiled for the step),
- (b) ``none`` compiled with the budget as the process's limit (XLA's own rematerialization
  pass acting at it: ``Target.with_mem_fraction``),
- (c) ``dots_no_batch``,

in compiled peak and predicted step time (the compiled kernels at the H100's published rates,
``remat_kit.timing``), and the decided plan's peak against a bare compile: ``jax.jit`` of the
same step with the block class rematerialized by flax's own ``nn.remat`` / ``nn.checkpoint`` /
``nnx.remat`` with the decided policy's jax callable, compiled for the H100 (with the options
that skip the machine code, as tests/test_auto.py's bare compiles are).

flax's examples are not on PyPI: ``--flax DIR`` names a checkout (``git clone
https://github.com/google/flax``). The decisions of one model (a first one at ``"fits"``, then
the three budgets) share one workload, its compiles with them, as three ``rk.auto`` steps of
one process would not: ``first_decision_compiles`` is what the first (``"fits"``) took,
``compiles`` what the model took in all, catalogue included; the cold cost of deciding is
``--overhead``'s (each figure from a fresh process). Writes results/auto_models.json and
results/auto_models.png.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

from common import RESULTS, save_png, table, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
#: The catalogue policies (a) chooses from: every one that keeps everything on the device.
CATALOGUE = ("full", "block", "dots", "dots_no_batch", "minimal", "qkv_proj", "context", "megatron")
SHARES = (0.25, 0.5, 0.75)
#: What each argument of every step here holds (``rk.auto(..., roles=)``): a budget under the
#: parts no policy removes is refused before anything is planned.
ROLES = {"params": 0, "optimizer": 1, "batch": 2}
GIB = 2**30
#: The compile option of a plan of XLA's own pass (``AutoPlan.slop_factor``).
SLOP = "xla_gpu_memory_limit_slop_factor"


@dataclasses.dataclass
class Case:
    """One model: where its block class lives, and a builder of its train step.

    ``make(block_cls)`` builds the step with ``block_cls`` patched in for the block and returns
    ``(step, loss_fn, loss_argnums, args)``; ``bare(policy)`` the block rematerialized by
    flax's own transform with ``policy``'s jax callable.
    """

    name: str
    module: Any
    block: str
    make: Callable[[], tuple[Any, Any, tuple[int, ...], tuple[Any, ...]]]
    bare: Callable[[Any], Any]
    what: str


@contextlib.contextmanager
def _patched(module: Any, name: str, cls: Any):
    orig = getattr(module, name)
    setattr(module, name, cls)
    try:
        yield
    finally:
        setattr(module, name, orig)


def _adamw_step(logits_of: Callable[..., Any], extra: int = 0):
    """The step every model is trained by: value_and_grad of cross-entropy and adamw."""
    import jax
    import jax.numpy as jnp
    import optax

    tx = optax.adamw(1e-4)

    def loss_fn(params, batch, *rest):
        out = logits_of(params, batch["tokens"], *rest).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(out, batch["targets"]).mean()

    def train_step(params, opt_state, batch, *rest):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, *rest)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    loss_at = (0, 2, *range(3, 3 + extra))
    return train_step, loss_fn, loss_at, tx


def _tokens(batch: int, seq: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    t = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    return {"tokens": t, "targets": t}


def _linen_bare(orig: Any) -> Callable[[Any], Any]:
    import flax.linen as nn

    return lambda pol: nn.remat(orig, policy=pol.jax_policy) if pol.is_remat else orig


def lm1b_case(layers: int = 4, batch: int = 16, seq: int = 512) -> Case:
    """flax's lm1b TransformerLM at its README's widths, training (dropout 0.1)."""
    import flax_factories as ff
    import jax

    import remat_kit as rk

    def make():
        model = ff.lm1b(None, layers=layers)

        def logits(p, t, key):
            with rk.tagging.tagging("auto"):  # names its Dense outputs for the planner
                rngs = {"dropout": jax.random.fold_in(key, 0)}
                return model.apply({"params": p}, t, rngs=rngs)

        step, loss_fn, loss_at, tx = _adamw_step(logits, extra=1)
        toks = _tokens(batch, seq)
        with rk.marks.auto_as("none"):
            params = jax.eval_shape(model.init, jax.random.key(0), toks["tokens"])["params"]
        key = jax.ShapeDtypeStruct((2,), "uint32")
        return step, loss_fn, loss_at, (params, jax.eval_shape(tx.init, params), toks, key)

    orig = ff.lm1b_models.EncoderDecoder1DBlock
    return Case(
        "lm1b", ff.lm1b_models, "EncoderDecoder1DBlock", make, _linen_bare(orig),
        f"flax examples/lm1b, {layers} layers, b{batch} s{seq}, dropout",
    )  # fmt: skip


def gemma_case(layers: int = 4, batch: int = 2, seq: int = 2048) -> Case:
    """gemma's NNX Transformer (flax's examples) at Gemma 2B's widths."""
    import flax_factories as ff
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import remat_kit as rk

    orig = ff.gemma_modules.Block

    def make():
        abstract = nnx.eval_shape(lambda: ff.gemma(None, layers=layers))
        rk.tagging.tag_nnx(abstract, "auto")
        graphdef, state, rest = nnx.split(abstract, nnx.Param, ...)
        rest = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), rest)

        def logits(p, t):
            filled = jax.tree.map(lambda x: x, state)
            nnx.replace_by_pure_dict(filled, p)
            pos = jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (batch, seq))
            mask = jnp.broadcast_to(jnp.tril(jnp.ones((seq, seq), bool)), (batch, seq, seq))
            return nnx.merge(graphdef, filled, rest)(t, pos, None, mask)[0]

        step, loss_fn, loss_at, tx = _adamw_step(logits)
        params = state.to_pure_dict()
        return (
            step,
            loss_fn,
            loss_at,
            (params, jax.eval_shape(tx.init, params), _tokens(batch, seq)),
        )

    def bare(pol):
        if not pol.is_remat:
            return orig
        call = nnx.remat(lambda m, x, pos, mask: orig.__call__(m, x, pos, None, mask),
                         policy=pol.jax_policy)  # fmt: skip

        class Block(orig):
            def __call__(self, x, segment_pos, cache, attn_mask, rngs=None):
                assert cache is None and rngs is None
                return call(self, x, segment_pos, attn_mask)

        return Block

    return Case(
        "gemma", ff.gemma_modules, "Block", make, bare,
        f"flax examples/gemma (NNX), Gemma 2B widths, {layers} layers, b{batch} s{seq}",
    )  # fmt: skip


def hf_case(layers: int = 4, batch: int = 4, seq: int = 2048) -> Case:
    """Hugging Face's FlaxLlamaForCausalLMModule at Llama 3.2 1B's widths (32k vocabulary)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    from transformers import LlamaConfig
    from transformers.models.llama import modeling_flax_llama as hf

    import remat_kit as rk

    config = LlamaConfig(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=layers, vocab_size=32000,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=seq,
    )  # fmt: skip
    orig = hf.FlaxLlamaDecoderLayer

    def make():
        model = hf.FlaxLlamaForCausalLMModule(config)
        mask = jnp.ones((batch, seq), jnp.int32)
        pos = jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (batch, seq))

        def logits(p, t):
            with rk.tagging.tagging("auto"):  # q_proj ... down_proj -> remat_kit's names
                return model.apply({"params": p}, t, mask, pos)[0]

        step, loss_fn, loss_at, tx = _adamw_step(logits)
        toks = _tokens(batch, seq)
        with rk.marks.auto_as("none"):
            params = jax.eval_shape(model.init, jax.random.key(0), toks["tokens"], mask, pos)
        params = params["params"]
        return step, loss_fn, loss_at, (params, jax.eval_shape(tx.init, params), toks)

    def bare(pol):
        if not pol.is_remat:
            return orig

        class Layer(orig):  # its flags are Python bools: closed over, as jax needs them
            def __call__(
                self,
                hidden_states,
                attention_mask=None,
                position_ids=None,
                deterministic=True,
                init_cache=False,
                output_attentions=False,
            ):
                def f(m, h, a, p):
                    return orig.__call__(m, h, a, p, deterministic, init_cache, output_attentions)

                ckpt = nn.checkpoint(f, policy=pol.jax_policy)
                return ckpt(self, hidden_states, attention_mask, position_ids)

        Layer.__name__ = orig.__name__
        return Layer

    return Case(
        "hf-llama", hf, "FlaxLlamaDecoderLayer", make, bare,
        f"transformers {_version('transformers')} FlaxLlama, 1B widths, {layers} layers, "
        f"b{batch} s{seq}",
    )  # fmt: skip


def preset_case(layers: int = 4, batch: int = 4, seq: int = 2048) -> Case:
    """The llama3.2-1b preset (its own tags), einsum attention, unrolled layers."""
    import jax

    import remat_kit as rk
    import remat_kit_models as models
    from remat_kit_models import llama

    cfg = models.get_config("llama3.2-1b", layers=layers, attention="xla", scan_layers=False)
    orig = llama.LlamaBlock

    def make():
        model = models.build(cfg)

        def logits(p, t):
            return model.apply({"params": p}, t)

        step, loss_fn, loss_at, tx = _adamw_step(logits)
        toks = _tokens(batch, seq)
        with rk.marks.auto_as("none"):
            params = jax.eval_shape(model.init, jax.random.key(0), toks["tokens"])["params"]
        params = rk.strip_boxes(params)
        return step, loss_fn, loss_at, (params, jax.eval_shape(tx.init, params), toks)

    return Case(
        "llama3.2-1b", llama, "LlamaBlock", make, _linen_bare(orig),
        f"preset llama3.2-1b, {layers} layers, b{batch} s{seq}, einsum attention",
    )  # fmt: skip


CASES = {"llama3.2-1b": preset_case, "lm1b": lm1b_case, "gemma": gemma_case, "hf-llama": hf_case}


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def _bare_peak(case: Case, policy: Any, target: Any, extra: dict[str, int] | None = None) -> int:
    """The step with ``case``'s block rematerialized by flax with ``policy``, jitted by jax
    alone and compiled for ``target``: argument + output + temp - alias. Compiled with the
    options that skip machine code no one runs (``analysis_options``: the same buffers, the
    same analysis, ``remat_kit.targets._codegen``), as tests/test_auto.py's bare compiles:
    with XLA's defaults one compile of the 1B preset took over 5 minutes on two cores.
    ``extra``: the compile options of the plan (XLA's slop factor, for a plan of XLA's own
    pass), given by hand as a user gives them to ``jax.jit``."""
    import jax

    from remat_kit.targets import analysis_options

    with _patched(case.module, case.block, case.bare(policy)):
        step, _, _, args = case.make()
        sh = target.sharding()
        placed = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), args)
        lowered = jax.jit(step, donate_argnums=(0, 1)).lower(*placed)
        m = lowered.compile({**analysis_options(target), **(extra or {})}).memory_analysis()
    return (
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        + m.temp_size_in_bytes
        - m.alias_size_in_bytes
    )


def _seconds(report: Any) -> float | None:
    st = getattr(report, "step_time", None)
    return None if st is None else float(st.seconds)


def measure(case: Case, target: Any) -> dict[str, Any]:
    """The decided plan at three budgets against (a), (b), (c) and the bare compile."""
    import remat_kit as rk
    from remat_kit.autoplan import Budget, decide
    from remat_kit.policies import NO_REMAT, as_policy
    from remat_kit.schedules import NO_SCHEDULE

    real = rk.sources.workload
    shared: dict[Any, Any] = {}

    def workload(source, t, config):  # one model's decisions share one workload's compiles
        key = (t.name, t.usable_bytes, t.xla_options.get(SLOP))  # a slop factor: its own
        if key not in shared:
            shared[key] = real(source, t, config)
            shared["source"] = source
        return shared[key]

    marked = rk.remat(getattr(case.module, case.block), "auto")
    t0 = time.perf_counter()
    with (
        _patched(case.module, case.block, marked),
        mock.patch.object(rk.sources, "workload", workload),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        step, loss_fn, loss_at, args = case.make()
        kw = dict(target=target, donate_argnums=(0, 1), loss_fn=loss_fn, loss_argnums=loss_at,
                  roles=ROLES)  # fmt: skip
        probe = decide(step, args, budget=Budget.of("fits"), **kw)  # makes the workload
        w = shared[(target.name, target.usable_bytes, None)]
        reports = {p: w.compiled(as_policy(p), NO_SCHEDULE, 1) for p in ("none", *CATALOGUE)}
        full, none = reports["full"].peak_bytes, reports["none"].peak_bytes
        rows = []
        for share in SHARES:
            limit = int(full + share * (none - full))
            plan = decide(step, args, budget=Budget.of(limit), **kw)
            fitting = [p for p in CATALOGUE if reports[p].peak_bytes <= limit]
            best = min(fitting, key=lambda p: _seconds(reports[p]) or 0.0) if fitting else None
            at = target.with_mem_fraction(limit / target.memory_bytes, "budget")
            xla = real(shared["source"], at, rk.TrainConfig(batch=1, seq=1)).compiled(
                NO_REMAT, NO_SCHEDULE, 1
            )
            dnb = reports["dots_no_batch"]
            rows.append(
                {
                    "model": case.name,
                    "budget_gib": limit / GIB,
                    "share": share,
                    "policy": plan.policy,
                    "source": plan.source,
                    "peak_gib": plan.peak_bytes / GIB,
                    "step_ms": _ms(plan.step_seconds),
                    "under": plan.peak_bytes <= limit,
                    "best_catalogue": best,
                    "best_catalogue_peak_gib": _gib(reports, best),
                    "best_catalogue_ms": None if best is None else _ms(_seconds(reports[best])),
                    "vs_best_catalogue": None
                    if best is None
                    else plan.step_seconds / _seconds(reports[best]) - 1,
                    "xla_none_peak_gib": xla.peak_bytes / GIB,
                    "xla_none_ms": _ms(_seconds(xla)),
                    "xla_none_under": xla.peak_bytes <= limit,
                    "dots_no_batch_peak_gib": dnb.peak_bytes / GIB,
                    "dots_no_batch_ms": _ms(_seconds(dnb)),
                    "dots_no_batch_under": dnb.peak_bytes <= limit,
                    "peak_bytes": plan.peak_bytes,
                    "budget_bytes": limit,
                    "decisions": dict(plan.decisions),
                    "slop_factor": plan.slop_factor,
                }
            )  # fmt: skip
            print({k: v for k, v in rows[-1].items() if k != "decisions"}, flush=True)
    seconds = time.perf_counter() - t0
    bare: dict[tuple[str, int | None], int] = {}
    for row in rows:
        key = (row["policy"], row["slop_factor"])
        if key not in bare:
            extra = {} if row["slop_factor"] is None else {SLOP: row["slop_factor"]}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                bare[key] = _bare_peak(case, as_policy(row["policy"]), target, extra)
        row["bare_peak_bytes"] = bare[key]
        row["equal_to_bare"] = row["bare_peak_bytes"] == row["peak_bytes"]
    return {
        "model": case.name,
        "what": case.what,
        "full_peak_gib": full / GIB,
        "none_peak_gib": none / GIB,
        "catalogue": {
            p: {"peak_gib": r.peak_bytes / GIB, "step_ms": _ms(_seconds(r))}
            for p, r in reports.items()
        },
        "first_decision_compiles": probe.compiles,
        "compiles": w.compiles,
        "seconds": seconds,
        "rows": rows,
    }


def _gib(reports: dict[str, Any], policy: str | None) -> float | None:
    return None if policy is None else reports[policy].peak_bytes / GIB


def _ms(s: float | None) -> float | None:
    return None if s is None else 1e3 * s


def plot(data: dict[str, Any], path: Any) -> None:
    """Predicted step time at each budget: the decision against (a), (b), (c)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = data.get("models", [])
    if not models:
        return
    fig, axes = plt.subplots(1, len(models), figsize=(4 * len(models), 3.5), squeeze=False)
    for ax, m in zip(axes[0], models, strict=True):
        xs = range(len(m["rows"]))
        bars = (
            ("step_ms", "auto"),
            ("best_catalogue_ms", "(a) best catalogue"),
            ("xla_none_ms", "(b) none + XLA"),
            ("dots_no_batch_ms", "(c) dots_no_batch"),
        )
        for i, (key, label) in enumerate(bars):
            ax.bar([x + 0.2 * i - 0.3 for x in xs], [r[key] or 0 for r in m["rows"]], 0.2,
                   label=label)  # fmt: skip
        ax.set_xticks(list(xs), [f"{r['budget_gib']:.1f} GiB" for r in m["rows"]])
        ax.set_title(m["model"])
        ax.set_ylabel("predicted step ms")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path)


# --- what deciding costs: each figure from its own process -------------------------------------

#: The budget each model is decided for: between full's and none's compiled peaks (the
#: preset's the middle one of the figures), so that a plan with remat is chosen.
BUDGET = {"tiny": "1200KiB", "llama3.2-1b": "12.28GiB"}

#: Calls timed for the dispatch medians (interleaved in rounds, the two steps alike).
CALLS, ROUNDS = 40, 10


def _own():
    import importlib.util

    path = os.path.join(os.path.dirname(HERE), "tests", "data", "own_steps.py")
    spec = importlib.util.spec_from_file_location("own_steps", path)
    mod = sys.modules.setdefault("own_steps", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(mod)
    return mod


def tiny_case() -> Case:
    """The tiny own-step Llama of tests/data/own_steps.py (2 layers, width 64, b2 s32), the
    model small enough to run here: its later calls are timed on the CPU."""
    import flax.linen as nn
    import jax

    import remat_kit as rk

    own = _own()

    def make():
        class Llama(nn.Module):
            @nn.compact
            def __call__(self, tokens):
                dt = own.DTYPE
                x = nn.Embed(own.VOCAB, own.WIDTH, dtype=dt, param_dtype=dt)(tokens)
                for i in range(own.LAYERS):  # own.Block read at the trace: the patched one
                    x = own.Block(name=f"layers_{i}")(x)
                x = nn.RMSNorm(dtype=dt, param_dtype=dt)(x)
                return nn.Dense(own.VOCAB, False, dtype=dt, param_dtype=dt, name="head")(x)

        net = Llama()
        step, loss_fn, loss_at, tx = _adamw_step(lambda p, t: net.apply({"params": p}, t))
        tokens = jax.random.randint(jax.random.key(1), (2, 32), 0, own.VOCAB)
        with rk.marks.auto_as("none"):
            params = net.init(jax.random.key(0), tokens)["params"]
        batch = {"tokens": tokens, "targets": jax.numpy.roll(tokens, -1, 1)}
        return step, loss_fn, loss_at, (params, tx.init(params), batch)

    return Case("tiny", own, "Block", make, _linen_bare(own.Block), "own-step Llama, b2 s32")


def _warm(target: Any) -> float:
    """One unrelated compile for ``target``: the process's compiler started."""
    import jax
    import jax.numpy as jnp

    from remat_kit.targets import analysis_options

    t0 = time.perf_counter()
    x = jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=target.sharding())
    jax.jit(lambda a: jnp.tanh(a) @ a.T).lower(x).compile(analysis_options(target))
    return time.perf_counter() - t0


def probe(kind: str, model: str) -> dict[str, Any]:
    """One overhead figure, in this (fresh) process after one unrelated compile."""
    import jax

    import remat_kit as rk
    from remat_kit.autoplan import Budget, decide
    from remat_kit.autoplan._decide import bound
    from remat_kit.targets import analysis_options

    target = rk.target("h100")
    case = tiny_case() if model == "tiny" else CASES[model]()
    out: dict[str, Any] = {"warm_s": _warm(target)}
    marked = rk.remat(getattr(case.module, case.block), "auto")
    with _patched(case.module, case.block, marked), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step, loss_fn, loss_at, args = case.make()
        kw = dict(target=target, donate_argnums=(0, 1), loss_fn=loss_fn, loss_argnums=loss_at,
                  roles=ROLES)  # fmt: skip
        if kind in ("plain", "plain_analysis"):  # the step as the user would jit it
            sh = target.sharding()
            placed = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), args
            )
            options = analysis_options(target) if kind == "plain_analysis" else None
            t0 = time.perf_counter()
            with rk.marks.auto_as("none"):
                jax.jit(step, donate_argnums=(0, 1)).lower(*placed).compile(options)
            out["seconds"] = time.perf_counter() - t0
            return out
        if model != "tiny":  # too big to run here: the decision alone
            plan = decide(step, args, budget=Budget.of(BUDGET[model]), **kw)
            out.update(seconds=plan.seconds, compiles=plan.compiles, cached=plan.cached)
            out["policy"] = plan.policy
            return out
        wrapped = rk.auto(step, BUDGET[model], **kw)
        t0 = time.perf_counter()
        res = wrapped(*args)
        jax.block_until_ready(res)
        out["first_call_s"] = time.perf_counter() - t0
        plan = wrapped.plan
        out.update(seconds=plan.seconds, compiles=plan.compiles, cached=plan.cached)
        out["policy"] = plan.policy
        same = jax.jit(bound(step, rk.as_policy(plan.policy)), donate_argnums=(0, 1))
        copied = jax.tree.map(lambda x: x.copy(), (res[0], res[1], args[2]))
        t0 = time.perf_counter()
        jax.block_until_ready(same(*copied))
        out["jit_first_call_s"] = time.perf_counter() - t0
        if kind == "cold":
            out.update(_dispatch(wrapped, same, (res[0], res[1], args[2])))
            out["micro"] = _micro(target)
        return out


def _micro(target: Any) -> dict[str, Any]:
    """The later calls of a step that does almost nothing (one marked function on 8 numbers):
    what is left is dispatch, the wrapper's and jax's."""
    import jax
    import jax.numpy as jnp

    import remat_kit as rk
    from remat_kit.autoplan._decide import bound

    block = rk.remat(lambda w, x: jnp.tanh(w * x), "auto")

    def step(w, o, x):
        loss, g = jax.value_and_grad(lambda w: block(w, x).sum())(w)
        return w - 1e-3 * g, o + 1, loss

    args = (jnp.ones(8), jnp.zeros((), jnp.int32), jnp.linspace(0, 1, 8))
    wrapped = rk.auto(step, "fits", target=target, catalogue=("full",))
    jax.block_until_ready(wrapped(*args))
    same = jax.jit(bound(step, rk.as_policy(wrapped.plan.policy)))
    return _dispatch(wrapped, same, args, calls=200)


def _dispatch(wrapped: Any, same: Any, args: tuple[Any, ...], calls: int = 0) -> dict[str, Any]:
    """Median seconds of a later call: the wrapped step against jax.jit of the same program
    (the decided policy bound), each fed its own outputs, interleaved in rounds."""
    import jax
    import numpy as np

    times: dict[str, list[float]] = {"auto": [], "jit": []}
    state = {"auto": args[:2], "jit": jax.tree.map(lambda x: x.copy(), args[:2])}
    for _ in range(ROUNDS):
        for name, fn in (("auto", wrapped), ("jit", same)):
            p, o = state[name]
            for _ in range(calls or CALLS):
                t0 = time.perf_counter()
                p, o, loss = fn(p, o, args[2])
                loss.block_until_ready()
                times[name].append(time.perf_counter() - t0)
            state[name] = (p, o)
    auto, jit = float(np.median(times["auto"])), float(np.median(times["jit"]))
    return {"call_auto_s": auto, "call_jit_s": jit, "call_overhead_s": auto - jit,
            "calls": ROUNDS * (calls or CALLS)}  # fmt: skip


def overhead(models: Sequence[str]) -> dict[str, Any]:
    """Each probe in a fresh process: the plain compiles, the cold decision (its own empty
    cache directory), and the decision remembered (that directory again)."""
    import json
    import subprocess
    import tempfile

    out: dict[str, Any] = {}
    for model in models:
        cache = tempfile.mkdtemp(prefix="auto_overhead_")
        got: dict[str, Any] = {}
        for kind in ("plain", "plain_analysis", "cold", "remembered"):
            env = {**os.environ, "REMAT_KIT_CACHE_DIR": cache}
            cmd = [sys.executable, __file__, "--probe", kind, "--only", model]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if done.returncode:
                raise SystemExit(f"probe {kind} {model} failed:\n{done.stderr[-3000:]}")
            got[kind] = json.loads(done.stdout.strip().splitlines()[-1])
            print(model, kind, got[kind], flush=True)
        got["decide_x_plain"] = got["cold"]["seconds"] / got["plain"]["seconds"]
        got["decide_x_plain_analysis"] = got["cold"]["seconds"] / got["plain_analysis"]["seconds"]
        out[model] = got
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flax", default="", help="a checkout of github.com/google/flax")
    p.add_argument("--only", default="", help="comma-separated models (default: all)")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--overhead", action="store_true", help="time deciding instead (--only: "
                   "models, default tiny and llama3.2-1b)")  # fmt: skip
    p.add_argument("--probe", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    os.environ["REMAT_KIT_FLAX_EXAMPLES"] = os.path.join(args.flax or "flax", "examples")
    sys.path.insert(0, HERE)
    import json
    from pathlib import Path

    import remat_kit as rk

    if args.probe:
        print(json.dumps(probe(args.probe, args.only)), flush=True)
        return
    out = Path(args.out) / "auto_models.json"
    if args.overhead:
        data = json.loads(out.read_text()) if out.exists() else {}
        data["overhead"] = overhead(
            [n for n in args.only.split(",") if n] or ["tiny", "llama3.2-1b"]
        )
        data["overhead_command"] = "python experiments/auto_models.py --overhead"
        write_json(out, data)
        return

    data = json.loads(out.read_text()) if out.exists() else {}
    target = rk.target("h100")
    names = [n for n in args.only.split(",") if n] or list(CASES)
    done = {m["model"]: m for m in data.get("models", [])}
    for name in names:
        if name in ("lm1b", "gemma") and not args.flax:
            raise SystemExit(f"{name} needs --flax DIR (a checkout of github.com/google/flax)")
        done[name] = measure(CASES[name](), target)
        data["models"] = [done[n] for n in CASES if n in done]  # written as each is done
        data["target"] = target.name
        data["command"] = "python experiments/auto_models.py --flax DIR"
        write_json(out, data)
    plot(data, out.with_suffix(".png"))
    rows = [r for m in data["models"] for r in m["rows"]]
    print(table(rows, ("model", "budget_gib", "policy", "peak_gib", "step_ms",
                       "best_catalogue", "best_catalogue_ms", "xla_none_ms",
                       "dots_no_batch_ms", "equal_to_bare")))  # fmt: skip


if __name__ == "__main__":
    main()
