"""Doctest setup: the docstring examples in ``remat_kit/`` and ``models/`` run with the suite.

``pytest`` collects them (``--doctest-modules``, see pyproject.toml) on a CPU-only machine, so
jax is pinned to the CPU before it initializes, as in ``tests/conftest.py``. Every example sees
``rk``, ``jax``, ``jnp``, ``nn`` and ``np`` without importing them, and the search examples a
workload small enough to compile in about a second:

- ``tiny_model``: a factory ``tiny_model(policy)`` of a one-block linen model with Hugging
  Face's projection names (vocabulary 64, width 16), remat applied with ``rk.remat``;
- ``w``: ``rk.sources.workload(tiny_model, "h100", rk.TrainConfig(batch=2, seq=16,
  optimizer="sgd"))``, one for the session: like a user's, it remembers what it compiled and
  traced, so the search examples share their compiles. An example must therefore not print
  what depends on the order they run in (``compiles``, ``seconds``).
"""

import functools
import os
import re

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Tables fit $COLUMNS (remat_kit.render._format): the tests read output written to a file, as in
# CI, unless a test sets a width itself. pytest-xdist's workers start with COLUMNS=80.
os.environ.pop("COLUMNS", None)
# The suite's CPU runs compare numbers, not speed: LLVM's optimisation of the CPU code is
# about a third of each CPU compile (tests/test_schedules: 172 s -> 107 s without it) and
# comes after the buffer assignment every figure is read from. Set before jax starts, so the
# subprocess tests inherit it too.
# A compile's machine code is made on one thread: its LLVM modules split over threads cost
# more CPU on two cores shared by two test workers, and come after the buffer assignment too.
# GPU: compare on tiny-llama for an H100, the eleven rows' JSON the same but for the seconds,
# 7.7 s of CPU against 8.3 (median of 4 paired runs). CPU: test_dropout's and
# test_schedules' gradient cases, 71.4 s of CPU against 75.2 (median of 2 paired runs).
os.environ["XLA_FLAGS"] = " ".join(
    [
        os.environ.get("XLA_FLAGS", ""),
        "--xla_backend_optimization_level=0",
        "--xla_gpu_force_compilation_parallelism=1",
        "--xla_cpu_parallel_codegen_split_count=1",
    ]
).strip()

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_kit as rk

# The flags the CLI sets for its deviceless compiles (remat_kit.targets._codegen), read by XLA
# when jax's first backend starts (importing jax starts none): the tests compile as the CLI.
rk.targets.set_process_flags()

# Scripts and factory files the tests load by path or run in a subprocess: no doctests, and
# importing them at collection would need what they need (transformers, 8 fake devices).
collect_ignore_glob = ["tests/data/*", "tests/sharded_step.py"]


class TinyBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.relu(nn.Dense(32, name="up_proj")(x))
        return x + nn.Dense(16, name="down_proj")(h)


class TinyModel(nn.Module):
    policy: rk.Policy

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(64, 16)(tokens)
        x = rk.remat(TinyBlock, self.policy)(name="layers_0")(x)
        return nn.Dense(64, name="lm_head")(x)


def tiny_model(policy):
    """A factory: one remat'd block between an embedding and the head."""
    return TinyModel(policy)


#: Docstring examples that compile for a GPU target, search by compiling, time a step, draw a
#: figure or import MaxText's model code (a second or more each, measured): marked ``slow``
#: like such tests, so the fast tier (``-m "not slow"``) leaves them out.
SLOW_EXAMPLES = frozenset(
    {
        "models.attention.flash_attention",
        "models.maxtext_source._source.MaxTextSource.batch_ways",
        "models.maxtext_source._source.MaxTextSource.refuses",
        "models.maxtext_source._source.MaxTextSource.sequences_per_step",
        "models.moe.balancing_loss",
        "remat_kit.breakdown.add_measured_breakdown",
        "remat_kit.breakdown.measured_breakdown",
        "remat_kit.comparison.compare_rows",
        "remat_kit.peak._api.inspect_step",
        "remat_kit.peak._compare.diff",
        "remat_kit.render._files.save_figure",
        "remat_kit.render._plan_tables.decision_table",
        "remat_kit.render._tables.report_table",
        "remat_kit.render._tables.residual_table",
        "remat_kit.render._timeline",
        "remat_kit.search",
        "remat_kit.search._advise",
        "remat_kit.search._advise.advise",
        "remat_kit.search._advise.gpus_needed",
        "remat_kit.search._batch",
        "remat_kit.search._batch.max_batch",
        "remat_kit.search._costs.CostModel.evaluate",
        "remat_kit.search._costs.cost_model",
        "remat_kit.search._fit",
        "remat_kit.search._fit.fit_each",
        "remat_kit.search._front",
        "remat_kit.search._front.front",
        "remat_kit.search._front.plan_label",
        "remat_kit.search._next",
        "remat_kit.search._planner",
        "remat_kit.search._seq",
        "remat_kit.search._seq.max_seq",
        "remat_kit.search._seq.max_seq_plan",
        "remat_kit.search._throughput",
        "remat_kit.search._throughput.fastest",
        "remat_kit.sharding._plan.MeshPlan.activation_context",
        "remat_kit.sources",
        "remat_kit.sources._depth.settled",
        "remat_kit.sources._own_step",
        "remat_kit.sources._source.ModelSource.layer_kinds",
        "remat_kit.sources._steps",
        "remat_kit.sources._steps.measure",
        "remat_kit.sources._door",
        "remat_kit.sources._door.workload",
        "remat_kit.sources._workload",
        "remat_kit.sources._measured.Measured",
        "remat_kit.sources._workload.Workload",
        "remat_kit.sources._workload.Workload.at",
        "remat_kit.sources._workload.Workload.compile_all",
        "remat_kit.timing._model.measure_cpu_speed",
    }
)


def pytest_collection_modifyitems(items):
    for item in items:
        if isinstance(item, pytest.DoctestItem) and item.name in SLOW_EXAMPLES:
            item.add_marker(pytest.mark.slow)


@functools.cache
def _tiny_workload():
    return rk.sources.workload(tiny_model, "h100", rk.TrainConfig(batch=2, seq=16, optimizer="sgd"))


@pytest.fixture(autouse=True, scope="session")
def _private_compile_cache(tmp_path_factory):
    """Compiled analyses are remembered on disk (remat_kit.cache): the tests and the examples
    use a cache of the session's own, never the user's ~/.cache/remat_kit. Under
    pytest-xdist each worker has its own: one shared by both measured no faster (1,208 s
    against 1,167 s for the suite) and made a test's cold compile depend on the other's order.
    """
    before = os.environ.get("REMAT_KIT_CACHE_DIR")
    os.environ["REMAT_KIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("compile_cache"))
    yield
    if before is None:
        os.environ.pop("REMAT_KIT_CACHE_DIR", None)
    else:
        os.environ["REMAT_KIT_CACHE_DIR"] = before


@pytest.fixture(autouse=True)
def _doctest_names(request):
    """Names every docstring example may use without importing them."""
    if not isinstance(request.node, pytest.DoctestItem):
        return
    doctest_namespace = request.getfixturevalue("doctest_namespace")
    doctest_namespace.update(rk=rk, jax=jax, jnp=jnp, nn=nn, np=np, tiny_model=tiny_model)
    doctest_namespace.pop("w", None)  # built only where an example names it
    if any(re.search(r"\bw\b", ex.source) for ex in request.node.dtest.examples):
        doctest_namespace["w"] = _tiny_workload()
