"""Do the tests catch one-line bugs in the code that decides a user's numbers? (issue 27).

A mutation check the team can run: for each core module it makes one-line mutants of the source
with ``ast`` (a comparison boundary, an operator, a constant off by one, ``and``/``or``,
``True``/``False``, a keyword argument left out, ``min``/``max``, a negation dropped, a loop's
``continue``/``break``, a ``return`` of nothing), picks up to ``--cap`` of them per module with a
seeded generator, writes each into the source file, runs the test files that cover that module
(``-x -q -p no:cacheprovider``, with a timeout) and restores the file, checking its hash. A mutant
is *killed* when the tests fail, *survived* when they pass, *timeout* when they hang (counted as
killed: a user would notice).

The mutants are applied to a private copy of the tree (``--in-place`` to use the checkout itself,
only when nobody else runs tests there): mutating a shared checkout breaks everyone else's runs.

Each module's slowest tests (compiles of a small Llama, see ``Group.slow``) are left out unless
``--full``: a surviving mutant costs the whole run of its tests. The unmutated tests run first,
once per set of tests; a module whose tests already fail (someone's work in progress) is skipped
and said so. With ``--tiers`` there is no such first run: a kill counts only when its test passes
on the unmutated tree (a failure that names no test, only when the tier passes unmutated), and a
test that fails unmutated is deselected and the tier run again, so it cannot hide the tests after
it (``-x``); the rows name the deselected tests.

A mutant that nothing can tell from the original is listed in :data:`EQUIVALENT` with its
proof; when every tier lets it live it is counted apart, and the kill rates are the usual
mutation score, killed / (mutants - equivalent). ``--suite`` checks a survivor of its files'
fast tier against the suite's whole fast tier (README's ``-m "not slow"``), the tier issue 58
counts.

Goal (issue 27): 90% or more killed on these modules. Writes results/mutation.json with every
mutant (file:line, the change, the verdict, the failing test) and prints a per-module kill-rate
table; ``--before`` puts an earlier run's rates beside it.

Why not mutmut or cosmic-ray (both install here): mutmut 3 first runs the whole suite (15
minutes on 2 cores) to map tests to functions and forks the test process per mutant, which jax's
threads do not survive; cosmic-ray enumerates every mutant of every operator (thousands on
these 8,000 lines) with no per-module sample. A seeded sample against each module's own tests
keeps a run under about 20 minutes.

Usage::

    python experiments/mutation.py                 # every module, 6 mutants each, seed 0
    python experiments/mutation.py --only tagging,cache --cap 20
    python experiments/mutation.py --list          # the mutants, without running anything
    python experiments/mutation.py --before old.json   # kill rates beside an earlier run's
    # issue 58: 40 mutants shared by the groups' lines, each against its files' fast tier
    # (-m "not slow") and, when it survives, their whole tests; two private trees at once
    python experiments/mutation.py --sample 40 --weighted --seed 58 --tiers --jobs 2 \
        --name mutation_round_58
    # a committed tree, not the shared checkout with others' work in progress in it
    git archive HEAD | tar -x -C /tmp/clean
    python experiments/mutation.py --sample 40 --weighted --seed 61 --tiers --jobs 1 \
        --name mutation_round_61 --source /tmp/clean
    # a run judged again after a survivor was proven equivalent (EQUIVALENT); runs nothing
    python experiments/mutation.py --rejudge results/mutation_round_70.json \
        --source /tmp/clean --name mutation_round_70
    # issue 58's count: a file-tier survivor against the suite's fast tier too
    python experiments/mutation.py --sample 40 --weighted --seed 68 --tiers --suite \
        --jobs 1 --name mutation_round_68 --source /tmp/clean
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import RESULTS, ROOT, table, write_json
from rich.markup import escape


@dataclasses.dataclass(frozen=True)
class Group:
    """A module group: its source files or folders, the test files that cover them, and the
    slowest of those tests, left out unless ``--full`` (each costs a survivor its whole time)."""

    sources: tuple[str, ...]
    tests: tuple[str, ...]
    slow: tuple[str, ...] = ()
    #: file name -> the tests that cover that file alone (instead of ``tests``).
    by_file: tuple[tuple[str, tuple[str, ...]], ...] = ()


#: Module group -> what to mutate and what to run. The tests are the files a developer would
#: run after touching that code.
MODULES: dict[str, Group] = {
    "search": Group(
        ("remat_kit/search",),
        ("tests/test_search.py", "tests/test_advise.py"),
        # The tests on a compiled small Llama (its fixtures compile for a minute).
        (
            "compiled_figures",
            "plan_is_on_the_front",
            "fits_none",
            "max_batch_fits_and_next",
            "infeasible_budget_on_a_real",
            "plan_policy_keeps_gradients",
            "what_the_plan_cli_reports",
            "plan_front_on_the_small",
            "time_overhead_of_a_compiled",
            "cheapest_fitting_point",
            "time_and_flops_disagree",
            "unknown_objective_is_refused",
            "lower_alike_share",
            "verified_by_compiles_made_apart",
        ),
        by_file=(
            ("_throughput.py", ("tests/test_throughput.py", "tests/test_cluster.py")),
            # The sequence search's curves, on fake builders (its compiles are marked slow).
            (
                "_seq.py",
                (
                    "tests/test_seq_search.py",
                    "tests/test_search.py",
                    "tests/test_fit.py",
                    "tests/test_search_oracle.py",  # max_seq against a scan
                ),
            ),
            # The one door to both searches, and the per-policy fan-out over a cluster.
            (
                "_fit.py",
                (
                    "tests/test_fit.py",
                    "tests/test_seq_search.py",
                    "tests/test_cli_seq.py",
                    "tests/test_search.py",
                ),
            ),
            # The front's points are drawn, spread and re-fitted by XLA's own remat there.
            (
                "_front.py",
                (
                    "tests/test_search.py",
                    "tests/test_advise.py",
                    "tests/test_front_spread.py",
                    "tests/test_xla_made_fit.py",
                    "tests/test_render.py",
                ),
            ),
            (
                "_recommend.py",
                (
                    "tests/test_search.py",
                    "tests/test_advise.py",
                    "tests/test_xla_made_fit.py",
                    "tests/test_front_spread.py",
                ),
            ),
            ("_xla_fit.py", ("tests/test_xla_made_fit.py", "tests/test_search.py")),
            (
                "_batch.py",
                (
                    "tests/test_search.py",
                    "tests/test_advise.py",
                    "tests/test_side_by_side.py",
                    "tests/test_depth.py",  # boundaries read off shallow copies
                    "tests/test_fit.py",
                    "tests/test_search_oracle.py",  # against a scan over random steps
                ),
            ),
            ("_costs.py", ("tests/test_search.py", "tests/test_advise.py", "tests/test_ragged.py")),
            # The boundary search's curves: the sequence search's quadratic is pinned there.
            (
                "_boundary.py",
                (
                    "tests/test_search.py",
                    "tests/test_advise.py",
                    "tests/test_seq_search.py",
                    "tests/test_search_oracle.py",  # max_batch bisects with it
                ),
            ),
            (
                "_budget.py",
                ("tests/test_search.py", "tests/test_advise.py", "tests/test_bad_input.py"),
            ),
        ),
    ),
    "cache": Group(
        ("remat_kit/cache",),
        # The oracle: random store/load sequences against a dict, damaged entries among them.
        ("tests/test_cache.py", "tests/test_cache_oracle.py"),
        # The store's files, read and written by the worker processes.
        by_file=(
            (
                "_store.py",
                ("tests/test_cache.py", "tests/test_cache_oracle.py", "tests/test_workers.py"),
            ),
        ),
    ),
    # The step-time model: kernels, speeds, the program's loops and XLA's own schedule.
    "timing": Group(
        ("remat_kit/timing",),
        # The traces and the validation read the model's kernels and speeds too; the oracle
        # prices random steps by hand; test_tpu_timing prices TPU kernels and rates (seed
        # 104's _speed.py:295, a TPU's MXU size lost, died only there).
        (
            "tests/test_timing.py",
            "tests/test_timing_oracle.py",
            "tests/test_trace.py",
            "tests/test_validate.py",
            "tests/test_tpu_timing.py",
        ),
        by_file=(
            ("_xla_schedule.py", ("tests/test_xla_schedule.py", "tests/test_timing.py")),
            # The program's timeline, what step_trace lays its launches on.
            ("_program.py", ("tests/test_trace.py", "tests/test_timing.py")),
            ("_traced.py", ("tests/test_timing.py", "tests/test_search.py")),
        ),
    ),
    "targets": Group(
        ("remat_kit/targets",),
        # test_render: the targets' labels and units in the tables; test_tpu: a TPU slice's
        # target, what target() refuses for one (seed 74's _named.py:155 died only there).
        ("tests/test_targets.py", "tests/test_render.py", "tests/test_tpu.py"),
        by_file=(
            ("_codegen.py", ("tests/test_codegen.py", "tests/test_targets.py")),
            ("_prices.py", ("tests/test_prices.py", "tests/test_targets.py")),
            # TPU slices' names, grids and facts, and the platform's errors.
            ("_slices.py", ("tests/test_tpu.py", "tests/test_targets.py")),
            ("_tpus.py", ("tests/test_tpu.py", "tests/test_targets.py")),
            # JAX_PLATFORMS naming a GPU or TPU the machine lacks: refused there.
            (
                "_platform.py",
                ("tests/test_tpu.py", "tests/test_targets.py", "tests/test_bad_input.py"),
            ),
        ),
    ),
    "analysis": Group(("remat_kit/analysis.py",), ("tests/test_analysis.py",)),
    "train": Group(
        ("remat_kit/train.py",),
        ("tests/test_train.py", "tests/test_precision.py", "tests/test_dropout.py"),
        ("lora_and_accumulation_shrink", "lora_gradients_unchanged"),
    ),
    "breakdown": Group(
        ("remat_kit/breakdown.py",),
        ("tests/test_measured_breakdown.py", "tests/test_analysis.py"),
        # compiles of a tiny Llama; the arithmetic is pinned on fakes beside them.
        ("parts_sum_to_the_compiled_peak", "cli_flag"),
    ),
    "tagging": Group(("remat_kit/tagging.py",), ("tests/test_tagging.py",)),
    "sources": Group(
        ("remat_kit/sources",),
        (
            "tests/test_sources.py",
            "tests/test_pipeline.py",
            "tests/test_kinds.py",
            "tests/test_own_step.py",
            "tests/test_sources_workload.py",  # the Workload's contract on hand-made steps
        ),
        by_file=(
            # The depth extrapolation's fit and report are tested on hand-made sections there.
            # test_depth_sections: by_depth on a source and compiles made by hand (fast).
            (
                "_depth.py",
                (
                    "tests/test_depth.py",
                    "tests/test_depth_sections.py",
                    "tests/test_depth_oracle.py",
                ),
            ),
            # The workload's time objective is what the planner ranks by.
            (
                "_workload.py",
                (
                    "tests/test_sources.py",
                    "tests/test_pipeline.py",
                    "tests/test_search.py",
                    "tests/test_fit.py",  # Workload.at: views and the family by sequence
                    "tests/test_sources_workload.py",
                ),
            ),
            # Foreign models (NNX, wrapped modules) go through the adapters.
            (
                "_adapters.py",
                (
                    "tests/test_sources.py",
                    "tests/test_pipeline.py",
                    "tests/test_external_models.py",
                    "tests/test_wrap.py",
                    "tests/test_bad_input.py",  # a factory's output that is not logits
                ),
            ),
            ("_spread.py", ("tests/test_sources.py", "tests/test_front_spread.py")),
            # measure's depth modes and a workload's fields, on compiles made by hand there.
            (
                "_steps.py",
                (
                    "tests/test_sources.py",
                    "tests/test_pipeline.py",
                    "tests/test_kinds.py",
                    "tests/test_own_step.py",
                    "tests/test_steps.py",
                    "tests/test_sources_workload.py",
                ),
            ),
            ("_tag_checks.py", ("tests/test_sources.py", "tests/test_depth.py")),
            # The kinds' options are the CLI's model and training flags: what each sets and how
            # the CLI names it in front of a refusal is read there.
            (
                "_kinds.py",
                (
                    "tests/test_sources.py",
                    "tests/test_pipeline.py",
                    "tests/test_kinds.py",
                    "tests/test_own_step.py",
                    "tests/test_sources_workload.py",
                    "tests/test_cli.py",
                    "tests/test_bad_input.py",
                ),
            ),
        ),
    ),
}

PYTEST_ARGS = ("-x", "-q", "-p", "no:cacheprovider")


@dataclasses.dataclass(frozen=True)
class Equivalent:
    """A mutant judged equivalent: no input can tell it from the original, and why.

    It is matched by its file, its change and the original line's text (not its number), so an
    edit of that line drops the judgement and the mutant counts again until it is re-judged.
    A judged mutant is still run: it is set aside only when every tier lets it live.
    """

    path: str
    change: str
    line: str  # the original line, stripped
    why: str
    function: str = ""  # the def it is in, where the line's text is not unique in the file


#: Why a constant or sign of the CPU benchmark's programs changes nothing it measures.
_BENCHMARK_ARITHMETIC = (
    "the CPU benchmark's arithmetic: the same elementwise loop over the same bytes (XLA:CPU "
    "compiles one fusion whatever the constant or the sign), and the rate is those bytes "
    "over its time"
)

#: Mutants that survive because nothing can tell them apart, each with its proof. The kill
#: rates leave them out of the count (killed / (mutants - equivalent)), the usual mutation
#: score; the tables show them with their reasons.
EQUIVALENT: tuple[Equivalent, ...] = (
    Equivalent(
        "remat_kit/search/_batch.py",
        ">= -> >",
        "if not workload.shapes_known or first_peak >= UNBUILDABLE:",
        "a first batch that could not be built is over the limit, so it goes to the "
        "not-fits branch, whose _forward_line returns None for a peak at UNBUILDABLE: the "
        "same fallback either way",
    ),
    Equivalent(
        "remat_kit/search/_boundary.py",
        "0 -> 1",
        "xla_remat_bytes=p.report.xla_remat_saved_bytes if p.report is not None else 0,",
        "p is plan()'s Plan, which always carries the report it compiled (the planner's "
        "report=r, r = w.compiled(...)): the else is never taken",
    ),
    Equivalent(
        "remat_kit/search/_boundary.py",
        "1 -> 2",
        "UNBUILDABLE = 1 << 62",
        "a sentinel over every real peak and limit (4 EiB): 2 << 62 is one too, and nothing "
        "reads it but comparisons with peaks and limits (bracket clamps the limit under it)",
    ),
    Equivalent(
        "remat_kit/search/_boundary.py",
        "62 -> 63",
        "UNBUILDABLE = 1 << 62",
        "a sentinel over every real peak and limit (4 EiB): 1 << 63 is one too, and nothing "
        "reads it but comparisons with peaks and limits (bracket clamps the limit under it)",
    ),
    Equivalent(
        "remat_kit/search/_boundary.py",
        "0 -> 1",
        "saved_bytes=self.xla_remat_bytes if self.xla_remat else 0,",
        "xla_made_fit gives no note for saved bytes under XLA_REMAT_MIN_BYTES (1 MiB): 0 and 1 "
        "byte both give none",
    ),
    Equivalent(
        "remat_kit/search/_boundary.py",
        "1 -> 2",
        'self.refused[units] = (type(err), str(err).split("\\n", 1)[0][:200])',
        "only the first piece of the split is read: a second split point changes the pieces "
        "after it, never the first",
    ),
    Equivalent(
        "remat_kit/search/_batch.py",
        "- -> +",
        "return fallback if guess is None else max(1, min(first - 1, guess))",
        "first does not fit, so its peak is over the limit and the forward line from the "
        "inputs through it reaches the limit before first: guess <= first - 1 (or 1 where "
        "first is 1, which max(1, ...) makes 1 either way); min() is guess with either bound",
    ),
    Equivalent(
        "remat_kit/search/_batch.py",
        "* -> /",
        "base = _inputs(workload, over * step)",
        "_inputs sums the weights, optimizer state and accumulator, which have the "
        "parameters' shapes whatever the batch: the batch it is asked at is never felt",
    ),
    Equivalent(
        "remat_kit/search/_boundary.py",
        "min( -> max(",
        "at = min(short, key=lambda u: min(abs(math.log(u / e)) for e in ends))",
        "no known point lies inside the bracket (lo, hi): for u <= lo or u >= hi the log "
        "distances to the two ends differ by the same log(hi / lo), so the farther end orders "
        "the points as the nearer does (and with one end there is one distance)",
    ),
    Equivalent(
        "remat_kit/sources/_own_step.py",
        "1 -> 2",
        "sig.bind(NO_REMAT, TrainConfig(batch=1, seq=1))",
        "bind checks only that the step's signature takes two arguments; which TrainConfig is "
        "bound is never read",
    ),
    Equivalent(
        "remat_kit/sources/_workload.py",
        "True -> False",
        "index = dict(zip(items, missing, strict=True))",
        "items is made from missing one for one the line before: the same length, so strict "
        "never has anything to refuse",
    ),
    Equivalent(
        "remat_kit/analysis.py",
        "True -> False",
        "abstract_args = tuple(abstract(a, s) for a, s in zip(args, in_shardings, strict=True))",
        "the lines before refuse in_shardings of another length than args (BadValue): the "
        "two zipped always have the same length, so strict never has anything to refuse",
    ),
    Equivalent(
        "remat_kit/cache/_entries.py",
        "drop program=program",
        "return dataclasses.replace(",
        "a hit is read under entry_key(text, ...), a key of the program's text, and its record "
        "was stored at the miss with program=fingerprint(text)[:16] (to_dict and from_record "
        "keep it): the record's program is this one",
        function="compiled_memory",
    ),
    Equivalent(
        "remat_kit/sources/_adapters.py",
        "0 -> 1",
        "key = jax.random.key(0)",
        "the seed of the key an NNX model's own rng state is made concrete with: values, never "
        "a shape, a dtype or an operation; no figure and no contract reads which seed it is",
    ),
    Equivalent(
        "remat_kit/search/_solver.py",
        "> -> >=",
        "ks = [0, *range(1, L // 2 + 1)] if splits and L > 1 else [0]",
        "they differ only at L == 1, where range(1, L // 2 + 1) is range(1, 1): empty, [0] "
        "either way",
    ),
    Equivalent(
        "remat_kit/search/_solver.py",
        "1.0 -> 2.0",
        "scale = max(abs(cap), 1.0)",
        "only a cap under 2 bytes gets another scale; every byte row is divided by it on both "
        "sides (the same feasible set), the offload row's k_h * v cancels it, and the tie "
        "term stays a positive multiple of the same device bytes: a tie-break either way",
    ),
    Equivalent(
        "remat_kit/timing/_model.py",
        "break -> continue",
        "break",
        "held only grows: once held >= n every later side hits the same test, so continue "
        "skips them all, adding no axis, as break does",
        function="_torus_axes",
    ),
    Equivalent(
        "remat_kit/targets/_codegen.py",
        "True -> False",
        '"xla_llvm_disable_expensive_passes": True,',
        "LLVM's optimisation of machine code never run: the memory analysis is made from the "
        "buffer assignment before codegen (the same to the byte, test_codegen), only the "
        "compile's time changes, which tests do not time (experiments/compile_speed.py does)",
    ),
    Equivalent(
        "remat_kit/targets/_platform.py",
        "drop platform='tpu'",
        'return topologies.get_topology_desc(platform="tpu", **dict(args))',
        "jax 0.12's get_topology_desc takes platform None as 'tpu' (jax/experimental/"
        "topologies.py: if platform == 'tpu' or platform is None): the same call",
    ),
    Equivalent(
        "remat_kit/search/_next.py",
        "break -> continue",
        "break",
        "changes is a Sequence: once compiles reach max_compiles every later change is skipped "
        "either way; continue only walks the rest of the list, calling nothing",
        function="next_step",
    ),
    Equivalent(
        "remat_kit/search/_boundary.py",
        "False -> True",
        "before = {u: p + xla.get(u, (0, False))[0] for u, p in finite.items()}",
        "only the default's first field is read ([0]); the second is never looked at",
    ),
    Equivalent(
        "remat_kit/cache/_store.py",
        "drop prefix='.probe.'",
        'fd, probe = tempfile.mkstemp(prefix=".probe.", dir=where)',
        "the writability probe is unlinked as soon as it is made; only its name would change",
    ),
    Equivalent(
        "remat_kit/sources/_own_step.py",
        "drop strict=True",
        "for a, sh in zip(own.args, own.in_shardings, strict=True)",
        "_placed's one caller, _checked, refuses in_shardings of another length first",
    ),
    Equivalent(
        "remat_kit/search/_boundary.py",
        "min( -> max(",
        "key=lambda u: min(abs(math.log(u / e)) for e in ends) if ends else -u,",
        "every other known unit lies outside [lo, hi]: its log-distance to the far end is its "
        "distance to the near one plus log(hi / lo), the same for all, so the order is too",
    ),
    Equivalent(
        "remat_kit/search/_planner.py",
        "drop fits=ok",
        "cand = dataclasses.replace(cand, peak_bytes=r.peak_bytes, host_bytes=host, fits=ok)",
        "the plan reads fits=fits and cand.fits, fits is ok, and a candidate reaching here "
        "with fits=True already fits: ok either way",
    ),
    Equivalent(
        "remat_kit/search/_solver.py",
        "False -> True",
        'options={"time_limit": time_limit, "mip_rel_gap": 1e-9, "presolve": False},',
        "HiGHS's presolve rewrites the program, not its optimum: the same objective to the "
        "1e-9 gap on every program the solver builds (the brute-force oracles of "
        "test_search pass under it), and the stray line its solution transform prints goes to "
        "C stdout, which _quiet_c_stdout swallows either way; presolve is off for speed only",
    ),
    Equivalent(
        "remat_kit/search/_solver.py",
        "> -> >=",
        "elif o is not None and x[o] > 0.5:",
        "HiGHS returns the yes/no variables as 0 or 1 (integrality): never 0.5",
    ),
    Equivalent(
        "remat_kit/sources/_source.py",
        "and -> or",
        "if block_spec and block_policies is not None:",
        "block_policies is set (not None) exactly when block_spec, self.block, is given: the "
        "two operands are always both true or both false",
    ),
    Equivalent(
        "remat_kit/sources/_tag_checks.py",
        "drop where=source.spec",
        "checks.check_policy_matches(p, near, strict=True, where=source.spec)",
        "strict: it returns or raises BadValue, never warns, and the BadValue is dropped two "
        "lines below (the whole model is asked): where reaches no user",
    ),
    Equivalent(
        "remat_kit/tagging.py",
        "> -> >=",
        'if name not in known or (name in ("auto", "paths") and len(out) > 1):',
        "both callers return for a spec of auto or paths alone before asking: a name of those "
        "two reaches here only joined to another (len(out) > 1)",
        function="_set_names",
    ),
    Equivalent(
        "remat_kit/timing/_model.py",
        "1 -> 2",
        "n = max(1, k.group)",
        "_ring_bytes_per_s is reached only after _collective_seconds returned 0 for a group "
        "of one: the group is 2 or more here",
        function="_ring_bytes_per_s",
    ),
    Equivalent(
        "remat_kit/timing/_speed.py",
        "drop network_efficiency=_TPU_DCN",
        "return Speed(",
        "Speed's default network_efficiency is 0.8, which is _TPU_DCN",
    ),
    *(
        Equivalent(
            "remat_kit/cache/_keys.py",
            change,
            "blob = json.dumps(parts, sort_keys=True, default=str).encode()",
            why,
        )
        for change, why in (
            ("drop sort_keys=True", "every mapping in parts is built in one fixed order"),
            ("True -> False", "every mapping in parts is built in one fixed order"),
            ("drop default=str", "every value in parts is already JSON's (str, int, list)"),
        )
    ),
    Equivalent(
        "remat_kit/search/_planner.py",
        "break -> continue",
        "break",
        "ranked is sorted by that bound, smallest first: once one extra's recompute is over the "
        "best's overhead every later one's is, so continue skips each of them and compiles "
        "none, as break does",
        function="_best_of",
    ),
    Equivalent(
        "remat_kit/search/_planner.py",
        "0 -> 1",
        "return 0  # nothing traced to bound it with: compile it",
        "plan() compares the bound with a budget from limit_for, which refuses an explicit "
        "budget of 0 bytes or less and gives 0 otherwise only for a target of under 2 usable "
        "bytes: for every budget of 1 byte or more, 1 > budget is false as 0 > budget is",
    ),
    Equivalent(
        "remat_kit/sources/_loading.py",
        "or -> and",
        "if loader is None or loader.loader is None:",
        "load_factory hands _load_file only locations ending in .py, for which "
        "importlib.util.spec_from_file_location always returns a spec with a source loader: "
        "loader is never None there, so the first operand is False either way",
    ),
    Equivalent(
        "remat_kit/search/_solver.py",
        "and -> or",
        "if model.step_seconds and model.link_bandwidth:",
        "the block runs only where host bytes are modelled (some tag offloadable), and "
        "cost_model makes a tag offloadable only when both the step time and the link are "
        "known (can_offload = offload and bool(step) and bool(link)); the planner solves "
        "only cost_model's models: where the branch is reached both are true, and or is and",
    ),
    Equivalent(
        "remat_kit/search/_throughput.py",
        "> -> >=",
        "if ways > 1 and global_batch % ways:",
        "they differ only at ways == 1, where global_batch % 1 is 0: no refusal either way",
    ),
    Equivalent(
        "remat_kit/search/_batch.py",
        "0 -> 1",
        "if slope <= 0 or known[over] >= UNBUILDABLE:",
        "the slope is bytes per unit of batch (step samples) of a compiled step's forward peak "
        "over its inputs, which holds each sample's own token ids (4 bytes a token, seq of "
        "them): at least 4 x seq x step bytes a unit, never in (0, 1]",
    ),
    Equivalent(
        "remat_kit/search/_batch.py",
        "min( -> max(",
        "if min(first, second) == 1 and peak(1) > limit and probes.whole(1) > limit:",
        "they differ only where a first probe over 1 did not fit and the second is 1 (a first "
        "of 1 that does not fit has a second of 1: max(1, first // 2), or the forward line "
        "clipped to first - 1): the lines then bracket (0, 1), the search and the boundary's "
        "check read peaks already known (1 and 2 compiled as the second probe's pair, 1 whole), "
        "and lo == 0 gives the same no-fit answer with no compile more (48 fake cases: the "
        "same Fit and compiles)",
    ),
    Equivalent(
        "remat_kit/sources/_factory.py",
        "0 -> 1",
        "jax.random.key(0),",
        "the key is an argument of jax.eval_shape, which traces with its shape and dtype only: "
        "no value of it reaches the trace that counts the blocks",
        function="_count_blocks",
    ),
    Equivalent(
        "remat_kit/search/_budget.py",
        "0 -> 1",
        "if usable >= need and usable > (here or 0)",
        "they differ only for a GPU that a process may use exactly one byte of (a memory "
        "fraction near 4e-11) while it holds the step's fixed parts (usable >= need): at most "
        "one byte, where a train step's weights, or its compiled peak with the batch's int32 "
        "token ids, are more",
    ),
    Equivalent(
        "remat_kit/timing/_model.py",
        "1 -> 2",
        "(lambda b, u: jax.lax.dynamic_update_index_in_dim(b, u, 1, 0), (2, n, n)),",
        "a dynamic update's start is clamped so that the update fits (lax.dynamic_update_slice): "
        "index 2 of an axis of 2 writes slice 1, as index 1 does: the same one loop, in place, "
        "over the same bytes",
    ),
    Equivalent(
        "remat_kit/cache/_fingerprint.py",
        "return x -> return None",
        'return "None"',
        "a missing callback's words go into a list's repr beside the others': None there reads "
        "None where 'None' reads 'None', in every program alike, and neither is the words of "
        "a function (its name and code): the same fingerprints equal and unequal",
        function="_callable_words",
    ),
    Equivalent(
        "remat_kit/targets/_codegen.py",
        "True -> False",
        '(tmp / "nvvm").symlink_to(real / "nvvm", target_is_directory=True)',
        "Path.symlink_to's target_is_directory is read on Windows only (the pathlib docs: "
        "ignored on other platforms), and the stand-in serves a CUDA compile, which jax "
        "builds for Linux alone",
    ),
    Equivalent(
        "remat_kit/targets/_slices.py",
        "- -> +",
        "if chips & (chips - 1) and (grid := _sold_grid(layout, count)) is not None:",
        "chips & (chips + 1) differs from chips & (chips - 1) only at powers of two (which it "
        "sends to MaxText's table) and at 2^k - 1 chips (which it does not): on maxtext 0.2.5, "
        "the table's grid of every power-of-two count is _grid's (none of its entries "
        "differ) and no entry has 2^k - 1 chips; a name outside the table reaches _grid "
        "either way",
    ),
    Equivalent(
        "remat_kit/targets/_slices.py",
        "1 -> 2",
        "if chips & (chips - 1) and (grid := _sold_grid(layout, count)) is not None:",
        "chips & (chips - 2) is 0 exactly where chips & (chips - 1) is, but for one chip (an "
        "even count is 2m with m a power of two either way; an odd one shares bit 0 with "
        "chips - 2): the mutant asks MaxText's table for one chip, and on maxtext 0.2.5 each "
        "one-chip entry's grid (v5e-1, v6e-1 (1, 1); tpu7x-2 (1, 1, 1)) is _grid's; a name "
        "outside the table reaches _grid either way",
    ),
    # Screen 97 (search/_planner.py, sources/_depth.py, targets/_codegen.py).
    Equivalent(
        "remat_kit/search/_planner.py",
        "0 -> 1",
        "return 0  # nothing traced to bound it with: compile it",
        "the bound is only compared, `bound > budget`, and plan's budget has passed limit_for, "
        "which refuses one of 0 or less: a positive int budget is over 0 and over 1 alike",
    ),
    Equivalent(
        "remat_kit/search/_planner.py",
        "and -> or",
        "fits=fits and cand.fits,",
        "with fits True, cand.fits was just set to it (the whole step's verdict); with fits "
        "False (nothing fits) cand is the smallest of ctx.candidates, none of which fits: a "
        "fitting one is the solver's best, the fallback's answer or the none returned first",
    ),
    Equivalent(
        "remat_kit/search/_planner.py",
        "> -> >=",
        'splits = best is not None and model.n_layers > 1 and w.supports("layers")',
        "at one layer the solver has no split to try (_solver.solve: ks = [0] unless splits "
        "and L > 1)",
    ),
    Equivalent(
        "remat_kit/sources/_depth.py",
        "drop rcond=None",
        "coef, *_ = np.linalg.lstsq(a, y, rcond=None)",
        "rcond=None is lstsq's default since numpy 2.0 (the signature here: (a, b, "
        "rcond=None)), and jax 0.12 needs numpy >= 2.2",
    ),
    Equivalent(
        "remat_kit/sources/_depth.py",
        "drop strict=True",
        "for d, copy in zip(DEPTHS, copies, strict=True):",
        "copies is shallow_copies', one per depth of DEPTHS (a list comprehension over it), "
        "or None, returned before: the lengths always match",
    ),
    Equivalent(
        "remat_kit/sources/_depth.py",
        "True -> False",
        "for d, copy in zip(DEPTHS, copies, strict=True):",
        "copies is shallow_copies', one per depth of DEPTHS (a list comprehension over it), "
        "or None, returned before: the lengths always match",
    ),
    Equivalent(
        "remat_kit/sources/_depth.py",
        "drop strict=True",
        "for d, r in zip(DEPTHS, reports, strict=True)",
        "reports gets one report per copy, in the loop over zip(DEPTHS, copies), or the "
        "function returns first: the lengths always match",
    ),
    Equivalent(
        "remat_kit/sources/_depth.py",
        "True -> False",
        "for d, r in zip(DEPTHS, reports, strict=True)",
        "reports gets one report per copy, in the loop over zip(DEPTHS, copies), or the "
        "function returns first: the lengths always match",
    ),
    Equivalent(
        "remat_kit/sources/_depth.py",
        "drop prefix='remat_kit_depth_'",
        'tempfile.TemporaryDirectory(prefix="remat_kit_depth_") as tmp,',
        "the dump's directory is read through the `tmp` it yields and removed on the way out; "
        "nothing looks for it by name",
    ),
    Equivalent(
        "remat_kit/targets/_codegen.py",
        "0 -> 1",
        "multiprocessing.util.Finalize(None, remove, exitpriority=0)",
        "a worker's exit runs every finalizer of priority 0 or more (multiprocessing.util's "
        "_exit_function: _run_finalizers(0)), in falling priority; remove() reads and "
        "writes nothing another finalizer does",
    ),
    Equivalent(
        "remat_kit/targets/_codegen.py",
        "return x -> return None",
        "return False",
        "_alive is read once, in remove_kernel_dirs' `and`: None and False are both false",
        function="_alive",
    ),
    Equivalent(
        "remat_kit/targets/_codegen.py",
        "1 -> 2",
        'names = {f.split("=", 1)[0] for f in have.split()}',
        "only the first piece is read: a second split leaves it as it was",
    ),
    Equivalent(
        "remat_kit/targets/_codegen.py",
        "1 -> 2",
        'added = tuple(f for f in PROCESS_FLAGS if f.split("=", 1)[0] not in names)',
        "only the first piece is read: a second split leaves it as it was",
    ),
    Equivalent(
        "remat_kit/targets/_codegen.py",
        "16 -> 17",
        'digest = hashlib.sha256(f"{real}\\n{script}".encode()).hexdigest()[:16]',
        "the stand-in's directory name: the same inputs give the same name at either length, "
        "different ones (in 16 hex digits already) different names; nothing reads its length",
    ),
    Equivalent(
        "remat_kit/targets/_codegen.py",
        "drop prefix='.tmp-'",
        'tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))',
        "the building directory is renamed into place or removed; nothing looks for it by "
        "name (the prefix keeps it from reading as a stand-in's digest in a listing)",
    ),
    Equivalent(
        "remat_kit/targets/_codegen.py",
        "drop target_is_directory=True",
        '(tmp / "nvvm").symlink_to(real / "nvvm", target_is_directory=True)',
        "Path.symlink_to's target_is_directory is read on Windows only (the pathlib docs: "
        "ignored on other platforms), and the stand-in serves a CUDA compile, which jax "
        "builds for Linux alone",
    ),
    Equivalent(
        "remat_kit/search/_planner.py",
        "return x -> return None",
        "return False  # two or three levels of segments over under four layers: every:2 again",
        "_fits_depth is read once, in _segment_fallback's `if ... and`: None and False are both "
        "false",
    ),
    Equivalent(
        "remat_kit/search/_planner.py",
        "return x -> return None",
        "return False",
        "_fits_depth is read once, in _segment_fallback's `if ... and`: None and False are both "
        "false",
        function="_fits_depth",
    ),
    Equivalent(
        "remat_kit/search/_solver.py",
        "return x -> return None",
        "return index[(g, t, v)]",
        "var's result is never read: its five calls are statements, and the columns are found "
        "through `index` (seed 97)",
    ),
    Equivalent(
        "remat_kit/timing/_model.py",
        "0.0 -> 1.0",
        "forward = (compute - recomputed) / 3 / compute if compute > 0 else 0.0",
        "forward is read only as free * forward, and step_time's free is max(0, compute - "
        "...): with no compute there is no free compute either, so ahead is 0 whatever the "
        "fraction",
    ),
    Equivalent(
        "remat_kit/timing/_model.py",
        ">= -> >",
        "if run >= domain:",
        "at run == domain the next lines give the same: with no stride, or one of at least the "
        "run (runs of consecutive ids start a run or more apart), min(run, n) is domain (run "
        "<= n); a stride under the run would make runs overlap, which no group has",
    ),
    Equivalent(
        "remat_kit/timing/_model.py",
        ">= -> >",
        "if not k.stride or k.stride >= domain:",
        "at stride == domain the last line's run * (domain // stride) is run: min(n, run) "
        "either way",
    ),
    Equivalent(
        "remat_kit/timing/_model.py",
        "2.0 -> 3.0",
        "fill = jax.jit(lambda x: jnp.full_like(x, 2.0))",
        _BENCHMARK_ARITHMETIC,
    ),
    Equivalent(
        "remat_kit/timing/_model.py",
        "0 -> 1",
        "key = jax.random.key(0)",
        _BENCHMARK_ARITHMETIC,
    ),
    Equivalent(
        "remat_kit/timing/_model.py",
        "+ -> -",
        "overhead = _best(jax.jit(lambda x: x + 1.0), tiny, budget)",
        _BENCHMARK_ARITHMETIC,
    ),
    Equivalent(
        "remat_kit/timing/_model.py",
        "1.0 -> 2.0",
        "overhead = _best(jax.jit(lambda x: x + 1.0), tiny, budget)",
        _BENCHMARK_ARITHMETIC,
    ),
    Equivalent(
        "remat_kit/timing/_model.py",
        "+ -> -",
        "(lambda b, u: b + u.T, (n, n)),",
        _BENCHMARK_ARITHMETIC,
    ),
    Equivalent(
        "remat_kit/timing/_model.py",
        "0 -> 1",
        "if not k.m or not k.n or units <= 0:",
        "with one unit the waves' ratio is ceil(tiles / 1) * 1 / tiles = 1.0, the value the "
        "early return gives",
    ),
    Equivalent(
        "remat_kit/search/_throughput.py",
        "break -> continue",
        "break",
        "once fitted == enough nothing after the check runs, so it stays true and continue "
        "skips every pair left as break does; both callers pass lists (candidates(), rest), "
        "so no lazy iterable is drained (seed 98)",
        function="_rows",
    ),
    Equivalent(
        "remat_kit/search/_boundary.py",
        "> -> >=",
        'elif toward == "up" and hi - lo > 2 * stride:',
        "with hi - lo == 2 * stride the gallop's guess lo + stride is the midpoint (lo + hi) "
        "// 2; the bracket left is at most stride wide, under 2 * (2 * stride), so every "
        "later step bisects whether toward is kept or cleared (seed 99)",
    ),
    Equivalent(
        "remat_kit/search/_boundary.py",
        "> -> >=",
        'elif toward == "down" and hi - lo > 2 * stride:',
        "with hi - lo == 2 * stride the gallop's guess hi - stride is the midpoint (lo + hi) "
        "// 2; the bracket left is at most stride wide, under 2 * (2 * stride), so every "
        "later step bisects whether toward is kept or cleared (seed 99)",
    ),
)

_COMPARE_SWAP = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_BINOP_SWAP = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Mult,
}
_SYMBOL = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.And: "and",
    ast.Or: "or",
}
#: Calls whose arguments only shape a message or a warning's location.
_QUIET_CALLS = frozenset({"warn", "debug", "info", "warning", "error", "exception"})


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One change to one node of one file."""

    module: str
    path: str  # relative to the tree's root
    line: int
    op: str  # the operator's kind: compare, binop, constant, ...
    change: str  # "a < b -> a <= b"
    index: int  # the node's position in ast.walk order
    variant: int  # which change of that node (a Compare with two ops, a Call's keywords)


# --- making mutants ------------------------------------------------------------------------------


def _skipped_nodes(tree: ast.AST) -> set[int]:
    """ids of nodes no mutant touches: docstrings, annotations, decorators, f-strings, raise
    statements and warnings (messages only), ``__all__`` and ``if __name__ == "__main__"``."""
    skip: set[int] = set()

    def drop(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for a in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]:
                drop(a.annotation)
            drop(node.args.vararg and node.args.vararg.annotation)
            drop(node.args.kwarg and node.args.kwarg.annotation)
            drop(node.returns)
            for d in node.decorator_list:
                drop(d)
        elif isinstance(node, ast.ClassDef):
            for d in node.decorator_list:
                drop(d)
        elif isinstance(node, ast.AnnAssign):
            drop(node.annotation)
        elif isinstance(node, (ast.JoinedStr, ast.Raise, ast.Assert)):
            drop(node)
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in _QUIET_CALLS:
                drop(node)
        elif _is_all(node) or (isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)):
            drop(node)
    return skip


def _is_all(node: ast.AST) -> bool:
    return isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
    )


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (
        isinstance(node, ast.Constant) and isinstance(node.value, str)
    )


def _is_none(node: ast.AST | None) -> bool:
    return node is None or (isinstance(node, ast.Constant) and node.value is None)


def _variants(node: ast.AST) -> list[tuple[str, str, Any]]:
    """(kind, description, how) of every change this node allows."""
    out: list[tuple[str, str, Any]] = []
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            new = _COMPARE_SWAP.get(type(op))
            if new:
                out.append(("compare", f"{_SYMBOL[type(op)]} -> {_SYMBOL[new]}", ("op", i, new)))
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAP:
        strings = _is_text(node.left) or _is_text(node.right)
        if not strings:
            new = _BINOP_SWAP[type(node.op)]
            out.append(("binop", f"{_SYMBOL[type(node.op)]} -> {_SYMBOL[new]}", ("binop", new)))
    elif isinstance(node, ast.AugAssign) and type(node.op) in _BINOP_SWAP:
        if not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            new = _BINOP_SWAP[type(node.op)]
            sym = _SYMBOL[type(node.op)]
            out.append(("binop", f"{sym}= -> {_SYMBOL[new]}=", ("binop", new)))
    elif isinstance(node, ast.BoolOp):
        new = ast.Or if isinstance(node.op, ast.And) else ast.And
        out.append(("boolop", f"{_SYMBOL[type(node.op)]} -> {_SYMBOL[new]}", ("boolop", new)))
    elif isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool):
            out.append(("bool", f"{v} -> {not v}", ("const", not v)))
        elif isinstance(v, int):
            out.append(("constant", f"{v!r} -> {v + 1!r}", ("const", v + 1)))
        elif isinstance(v, float):
            # n -> n + 1, except where one is lost in the number (1e15 FLOP/s): twice it.
            new = v + 1 if abs(v) < 1e3 else 2 * v
            out.append(("constant", f"{v!r} -> {new!r}", ("const", new)))
    elif isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
            new = "max" if node.func.id == "min" else "min"
            out.append(("minmax", f"{node.func.id}( -> {new}(", ("minmax", new)))
        for i, kw in enumerate(node.keywords):
            if kw.arg is not None:
                out.append(("kwarg", f"drop {kw.arg}={ast.unparse(kw.value)}", ("kwarg", i)))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        out.append(("not", "not x -> x", ("not",)))
    elif isinstance(node, ast.Continue):
        out.append(("loop", "continue -> break", ("stmt", ast.Break)))
    elif isinstance(node, ast.Break):
        out.append(("loop", "break -> continue", ("stmt", ast.Continue)))
    elif isinstance(node, ast.Return) and not _is_none(node.value):
        out.append(("return", "return x -> return None", ("return",)))
    return out


def _mutated(node: ast.AST, how: Any) -> ast.AST:
    new = copy.deepcopy(node)
    kind = how[0]
    if kind == "op":
        new.ops[how[1]] = how[2]()
    elif kind in ("binop", "boolop"):
        new.op = how[1]()
    elif kind == "const":
        new.value = how[1]
    elif kind == "minmax":
        new.func.id = how[1]
    elif kind == "kwarg":
        del new.keywords[how[1]]
    elif kind == "not":
        new = new.operand
    elif kind == "stmt":
        new = how[1]()
    elif kind == "return":
        new.value = None
    return new


def _replace(tree: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, field, new)
                return
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if item is old:
                        value[i] = new
                        return
    raise AssertionError("node not found")


def _offsets(source: str) -> list[int]:
    starts, pos = [0], 0
    for line in source.splitlines(keepends=True):
        pos += len(line.encode())
        starts.append(pos)
    return starts


def mutant_source(source: str, index: int, how: Any) -> str | None:
    """``source`` with the node at ``index`` (ast.walk order) changed as ``how`` says, written
    over that node's own text only; None when the text cannot carry the change exactly (the
    result must parse to the mutated tree)."""
    tree = ast.parse(source)
    node = list(ast.walk(tree))[index]
    new = _mutated(node, how)
    # An expression is written in parentheses, so it binds as the node did.
    text = ast.unparse(new) if isinstance(node, ast.stmt) else f"({ast.unparse(new)})"
    starts = _offsets(source)
    raw = source.encode()
    a = starts[node.lineno - 1] + node.col_offset
    b = starts[node.end_lineno - 1] + node.end_col_offset
    out = (raw[:a] + text.encode() + raw[b:]).decode()
    _replace(tree, node, new)
    try:
        if ast.dump(ast.parse(out)) != ast.dump(tree):
            return None
    except SyntaxError:
        return None
    return out


def _files(spec: Sequence[str], root: Path) -> list[Path]:
    out: list[Path] = []
    for s in spec:
        p = root / s
        out.extend(sorted(p.glob("*.py")) if p.is_dir() else [p])
    return out


def candidates(module: str, root: Path) -> list[Mutant]:
    """Every mutant of a module group, in file and line order."""
    out: list[Mutant] = []
    for path in _files(MODULES[module].sources, root):
        tree = ast.parse(path.read_text())
        skip = _skipped_nodes(tree)
        for index, node in enumerate(ast.walk(tree)):
            if id(node) in skip:
                continue
            for variant, (op, change, _) in enumerate(_variants(node)):
                rel = str(path.relative_to(root))
                out.append(Mutant(module, rel, node.lineno, op, change, index, variant))
    return sorted(out, key=lambda m: (m.path, m.line, m.index, m.variant))


def sample(module: str, root: Path, cap: int, seed: int) -> list[Mutant]:
    """Up to ``cap`` mutants of the module that apply cleanly, chosen by ``seed``: one kind of
    change after another (so that ``return`` statements, the commonest node, do not crowd out
    the boundaries), each kind's mutants in a seeded random order."""
    rng = random.Random(f"{seed}:{module}")
    by_kind: dict[str, list[Mutant]] = {}
    for m in candidates(module, root):
        by_kind.setdefault(m.op, []).append(m)
    kinds = sorted(by_kind)
    rng.shuffle(kinds)
    for pool in by_kind.values():
        rng.shuffle(pool)
    out: list[Mutant] = []
    while len(out) < cap and any(by_kind.values()):
        for kind in kinds:
            pool = by_kind[kind]
            while pool and len(out) < cap:
                m = pool.pop()
                if _apply_text(m, root) is not None:
                    out.append(m)
                    break
    return sorted(out, key=lambda m: (m.path, m.line, m.index, m.variant))


def lines_of(module: str, root: Path) -> int:
    """The source lines of a module group, the weight of ``--weighted``."""
    return sum(len(f.read_text().splitlines()) for f in _files(MODULES[module].sources, root))


def weighted_caps(modules: Sequence[str], root: Path, total: int) -> dict[str, int]:
    """``total`` mutants shared among ``modules`` in proportion to their lines (largest
    remainder, ties to the larger module)."""
    lines = {m: lines_of(m, root) for m in modules}
    whole = sum(lines.values())
    exact = {m: total * n / whole for m, n in lines.items()}
    caps = {m: int(x) for m, x in exact.items()}
    rest = sorted(modules, key=lambda m: (caps[m] - exact[m], -lines[m]))
    for m in rest[: total - sum(caps.values())]:
        caps[m] += 1
    return caps


def _apply_text(m: Mutant, root: Path) -> str | None:
    source = (root / m.path).read_text()
    node = list(ast.walk(ast.parse(source)))[m.index]
    return mutant_source(source, m.index, _variants(node)[m.variant][2])


# --- running them --------------------------------------------------------------------------------


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _copy_tree(dest: Path, source: Path = ROOT) -> Path:
    # results/: test_timing reads a real H100 compile's HLO from there; docs/ and experiments/:
    # tests read the documented factory and run an experiment (else they fail unmutated).
    keep = (
        *("remat_kit", "models", "tests", "results", "docs", "experiments"),
        *("conftest.py", "pyproject.toml", "README.md"),
    )
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in keep:
        src = source / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, dest / name)
    return dest


def _pytest(root: Path, targets: Sequence[str], timeout: float) -> tuple[str, float, str]:
    """(passed | failed | timeout, seconds, the last lines of output) of one pytest run."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", *targets, *PYTEST_ARGS]
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        # 5: no test was selected (a module whose doctests are all slow, in the fast tier).
        verdict = "passed" if proc.returncode in (0, 5) else "failed"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        verdict = "timeout"
    except BaseException:  # interrupted: stop the tests before the caller restores the file
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    tail = "\n".join(out.strip().splitlines()[-3:])
    if verdict == "failed" and failing_test(out):
        tail = f"{failing_test(out)}\n{tail}"
    return verdict, time.perf_counter() - start, tail


def _targets(module: str, full: bool = False, path: str = "") -> tuple[str, ...]:
    """The pytest arguments for a mutant of ``path`` in ``module``."""
    g = MODULES[module]
    tests = dict(g.by_file).get(Path(path).name, g.tests)
    skip = () if full else g.slow
    return (*tests, *(["-k", " and ".join(f"not {s}" for s in skip)] if skip else []))


def _tier_targets(module: str, path: str, tier: str) -> tuple[str, ...]:
    """``--tiers``: the files that cover ``path``, the fast tier's (``-m "not slow"``, as the
    suite's own fast tier) or all their tests (``whole``)."""
    tests = dict(MODULES[module].by_file).get(Path(path).name, MODULES[module].tests)
    # The module's own doctests are tests of the suite too (--doctest-modules).
    return (*tests, path, *(["-m", "not slow"] if tier == "fast" else []))


#: ``--suite``: the suite's own fast tier, as README runs it (every test path, two workers).
SUITE_FAST: tuple[str, ...] = ("-m", "not slow", "-n", "2")


def judged(m: Mutant, root: Path) -> Equivalent | None:
    """The :data:`EQUIVALENT` judgement that names this mutant's file, change and line text
    (and the def it is in, where the judgement names one)."""
    source = (root / m.path).read_text()
    text = source.splitlines()[m.line - 1].strip()
    defs = [
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        and n.lineno <= m.line <= (n.end_lineno or n.lineno)
    ]
    inner = max(defs, key=lambda n: n.lineno).name if defs else ""
    return next(
        (
            e
            for e in EQUIVALENT
            if (e.path, e.change, e.line) == (m.path, m.change, text) and e.function in ("", inner)
        ),
        None,
    )


def failing_test(out: str) -> str:
    """The first test pytest's summary names as failed (or erroring), "" when none."""
    for line in out.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" ", 1)[1].split(" - ", 1)[0]
    return ""


def run_mutant(
    m: Mutant,
    root: Path,
    timeout: float,
    full: bool = False,
    targets: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Writes the mutant, runs its tests, restores the file (verified by hash) whatever happens."""
    path = root / m.path
    original = path.read_bytes()
    digest = hashlib.sha256(original).hexdigest()
    text = _apply_text(m, root)
    assert text is not None
    targets = targets or _targets(m.module, full, m.path)
    try:
        path.write_text(text)
        verdict, seconds, tail = _pytest(root, targets, timeout)
    finally:
        path.write_bytes(original)
        if _sha(path) != digest:
            path.write_bytes(original)
            raise RuntimeError(f"{m.path} was not restored: compare it with the checkout")
    status = {"failed": "killed", "passed": "survived", "timeout": "timeout"}[verdict]
    test = tail.splitlines()[0] if verdict == "failed" and "::" in tail.splitlines()[0] else ""
    return {
        **dataclasses.asdict(m),
        "status": status,
        "test": test,
        "seconds": round(seconds, 1),
        "tail": tail,
    }


def _diff_line(m: Mutant, root: Path) -> str:
    text = _apply_text(m, root)
    old = (root / m.path).read_text().splitlines()
    new = (text or "").splitlines()
    return next((b.strip() for a, b in zip(old, new, strict=False) if a != b), "")


def _rates(module: str, rs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    dead = sum(r["status"] in ("killed", "timeout") for r in rs)
    same = sum(r["status"] == "equivalent" for r in rs)
    scored = len(rs) - same
    return {
        "module": module,
        "mutants": len(rs),
        "killed": sum(r["status"] == "killed" for r in rs),
        "timeout": sum(r["status"] == "timeout" for r in rs),
        "survived": sum(r["status"] == "survived" for r in rs),
        "equivalent": same,
        # killed / (mutants - equivalent): the usual mutation score.
        "kill_rate": round(dead / scored, 3) if scored else None,
        "seconds": round(sum(r["seconds"] for r in rs), 1),
    }


def summary(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each module group's counts and kill rate, then all of them together."""
    groups = dict.fromkeys(r["module"] for r in rows)
    return [
        *(_rates(g, [r for r in rows if r["module"] == g]) for g in groups),
        _rates("all", rows),
    ]


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--only", default="", help="comma-separated module groups (default: all)")
    p.add_argument("--cap", type=int, default=6, help="mutants per module group")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="3 mutants per module, for a smoke run")
    p.add_argument("--timeout", type=float, default=0, help="seconds per mutant (0: 3x baseline)")
    p.add_argument("--list", action="store_true", help="print the mutants and stop")
    p.add_argument("--full", action="store_true", help="run the slow tests too (see Group.slow)")
    p.add_argument("--in-place", action="store_true", help="mutate this checkout, not a copy")
    p.add_argument(
        "--name", default=None, help="results/<name>.json (default: mutation; --rejudge: its file)"
    )
    p.add_argument("--at", default="", help="only these sampled mutants: path:line,...")
    p.add_argument("--jobs", type=int, default=1, help="private trees run side by side")
    p.add_argument("--sample", type=int, default=0, help="N mutants in all (instead of --cap)")
    p.add_argument("--weighted", action="store_true", help="--sample shared by the groups' lines")
    p.add_argument(
        "--tiers",
        action="store_true",
        help='fast tier (-m "not slow") first, the covering files whole for its survivors',
    )
    p.add_argument(
        "--whole-timeout", type=float, default=900, help="seconds per whole run (--tiers)"
    )
    p.add_argument(
        "--suite",
        action="store_true",
        help="--tiers: a survivor of its files' fast tier runs the suite's fast tier too",
    )
    p.add_argument(
        "--before", type=Path, help="an earlier results JSON: its kill rates beside these"
    )
    p.add_argument(
        "--rejudge",
        type=Path,
        help="a --tiers results JSON judged again with EQUIVALENT against --source; runs nothing",
    )
    p.add_argument(
        "--source", type=Path, default=ROOT, help="the tree to copy (default: this checkout)"
    )
    return p.parse_args(argv)


def _checked_sources(root: Path, modules: Sequence[str]) -> dict[Path, str]:
    return {f: _sha(f) for m in modules for f in _files(MODULES[m].sources, root)}


@dataclasses.dataclass
class _Run:
    root: Path
    modules: list[str]
    mutants: list[Mutant]
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    broken: dict[str, str] = dataclasses.field(default_factory=dict)
    #: --tiers: tests that failed on the unmutated tree, deselected from then on.
    failing: set[str] = dataclasses.field(default_factory=set)


def _iterate(run: _Run, args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    # The unmutated tests first, once per set of tests: they must pass (else every mutant
    # would read as killed), and their time sets each mutant's timeout.
    baseline: dict[tuple[str, ...], float] = {}
    for m in run.mutants:
        targets = _targets(m.module, args.full, m.path)
        if targets in baseline or m.module in run.broken:
            continue
        verdict, seconds, tail = _pytest(run.root, targets, timeout=1800)
        if verdict != "passed":
            # Someone's work in progress: its mutants would all read as killed. Say so, go on.
            print(f"SKIPPED {m.module}: its tests fail unmutated:\n{tail}", flush=True)
            run.broken[m.module] = tail
            continue
        baseline[targets] = seconds
        files = " ".join(t for t in targets if t.endswith(".py"))
        print(f"unmutated {m.module} ({files}): {seconds:.0f} s", flush=True)
    for i, m in enumerate(run.mutants, 1):
        targets = _targets(m.module, args.full, m.path)
        if m.module in run.broken:
            continue
        timeout = args.timeout or 3 * baseline[targets] + 30
        row = run_mutant(m, run.root, timeout, args.full)
        row["diff"] = _diff_line(m, run.root)
        row["tests"] = list(targets)
        row["baseline_seconds"] = round(baseline[targets], 1)
        print(
            f"[{i}/{len(run.mutants)}] {row['status']:8} {m.path}:{m.line} {m.change}"
            f" ({row['seconds']:.0f} s)",
            flush=True,
        )
        yield row


def _confirmed(run: _Run, row: dict[str, Any], timeout: float) -> tuple[str, str]:
    """(verdict, test) of a run, a kill counting only when its test passes unmutated."""
    if row["status"] != "killed" or not row["test"]:
        return row["status"], row["test"]
    again, _, _ = _pytest(run.root, [row["test"]], timeout)
    if again == "passed":
        return "killed", row["test"]
    return "survived", f"(fails unmutated: {row['test']})"  # no evidence against the mutant


def _tier(
    run: _Run, m: Mutant, targets: Sequence[str], timeout: float
) -> tuple[dict[str, Any], str, str]:
    """(the run's row, verdict, killing test) of one tier. A test that fails on the unmutated
    tree too (someone's work in progress) would stop the tier there (``-x``) and hide what the
    tests after it say: it is deselected from then on (``run.failing``) and the tier run
    again, up to 3 times per mutant. A failure that names no test counts only when the tier
    passes unmutated."""
    seconds = 0.0
    for _ in range(4):
        skip = [a for t in sorted(run.failing) for a in ("--deselect", t)]
        row = run_mutant(m, run.root, timeout, targets=[*targets, *skip])
        seconds += row["seconds"]
        verdict, test = _confirmed(run, row, timeout)
        if verdict == "killed" and not test:
            # Failed with no test named (a collection or import error): no evidence against
            # the mutant unless the same tests pass unmutated.
            again, took, tail = _pytest(run.root, [*targets, *skip], timeout)
            seconds += took
            if again != "passed":
                last = (tail.splitlines() or [""])[-1]
                verdict, test = "survived", f"(the tier fails unmutated: {last})"
            break
        if not test.startswith("(fails unmutated"):
            break
        run.failing.add(row["test"])
    return {**row, "seconds": round(seconds, 1)}, verdict, test


def _iterate_tiers(run: _Run, args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """``--tiers``: each mutant against its files' fast tier; a survivor against their whole
    tests too. No unmutated run of each set first (a set's whole tests take minutes): instead
    each kill is confirmed by its test passing on the unmutated tree."""
    fast_timeout = args.timeout or 600
    for i, m in enumerate(run.mutants, 1):
        fast = _tier_targets(m.module, m.path, "fast")
        row, verdict, test = _tier(run, m, fast, fast_timeout)
        row = {**row, "diff": _diff_line(m, run.root), "tests": list(fast)}
        if verdict == "survived" and args.suite:
            # Its files' fast tier let it live: the suite's fast tier (what the issue counts)
            # may still catch it in a test file that covers it from elsewhere.
            again, verdict, test = _tier(run, m, SUITE_FAST, args.whole_timeout)
            row["seconds"] = round(row["seconds"] + again["seconds"], 1)
        row["fast"], row["fast_test"] = verdict, test
        row["whole"], row["whole_test"] = row["fast"], row["fast_test"]
        if row["fast"] == "survived":
            whole = _tier_targets(m.module, m.path, "whole")
            again, row["whole"], row["whole_test"] = _tier(run, m, whole, args.whole_timeout)
            row["seconds"] = round(row["seconds"] + again["seconds"], 1)
        same = judged(m, run.root)
        row["equivalent"] = same.why if same and row["whole"] == "survived" else ""
        row["status"] = "equivalent" if row["equivalent"] else row["whole"]
        row["deselected"] = sorted(run.failing)
        print(
            f"[{i}/{len(run.mutants)}] fast {row['fast']:8} whole {row['whole']:8}"
            f" {m.path}:{m.line} {m.change} ({row['seconds']:.0f} s)"
            f" {row['whole_test'] or row['fast_test']}",
            flush=True,
        )
        yield row


def tier_rates(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Kill rates of ``--tiers`` (a timeout counts as killed), of the mutants not judged
    equivalent (:data:`EQUIVALENT`), and of all of them (``raw``)."""
    n = len(rows)
    same = sum(bool(r.get("equivalent")) for r in rows)
    fast = sum(r["fast"] in ("killed", "timeout") for r in rows)
    whole = sum(r["whole"] in ("killed", "timeout") for r in rows)
    scored = n - same
    return {
        "mutants": n,
        "equivalent": same,
        "fast_killed": fast,
        "whole_killed": whole,
        "fast_kill_rate": round(fast / scored, 3) if scored else None,
        "whole_kill_rate": round(whole / scored, 3) if scored else None,
        "raw_fast_kill_rate": round(fast / n, 3) if n else None,
        "raw_whole_kill_rate": round(whole / n, 3) if n else None,
    }


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse(argv)
    if args.rejudge:
        data = rejudge(args.rejudge, args.source)
        # Judged again in place: the run's own file, unless another name is given.
        write_json(args.out / f"{args.name}.json" if args.name else args.rejudge, data)
        _show(data, before=False)
        return
    cap = 3 if args.quick else args.cap
    modules = [m for m in (args.only.split(",") if args.only else MODULES) if m]
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        raise SystemExit(f"unknown module group {unknown}; known: {', '.join(MODULES)}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="remat_kit_mutation_") as tmp:
        root = ROOT if args.in_place else _copy_tree(Path(tmp), args.source)
        before = _checked_sources(root, modules)
        if args.sample:
            n = args.sample
            caps = (
                weighted_caps(modules, root, n)
                if args.weighted
                else {m: n // len(modules) + (i < n % len(modules)) for i, m in enumerate(modules)}
            )
        else:
            caps = dict.fromkeys(modules, cap)
        mutants = [m for mod in modules for m in sample(mod, root, caps[mod], args.seed)]
        if args.at:
            mutants = [m for m in mutants if f"{m.path}:{m.line}" in args.at.split(",")]
        if args.list:
            for m in mutants:
                print(f"{m.module:10} {m.path}:{m.line:<5} {m.op:9} {m.change}")
            return
        # --jobs: the mutants dealt round-robin to that many private trees, run side by side.
        roots = [root] + [
            _copy_tree(Path(tmp) / f"job{j}", args.source) for j in range(1, args.jobs)
        ]
        runs = [_Run(r, modules, mutants[j :: args.jobs]) for j, r in enumerate(roots)]
        iterate = _iterate_tiers if args.tiers else _iterate

        def drain(run: _Run) -> None:
            for row in iterate(run, args):
                run.rows.append(row)

        try:
            with ThreadPoolExecutor(len(runs)) as pool:
                list(pool.map(drain, runs))
        finally:
            changed = [
                str(r / f.relative_to(root))
                for r in roots
                for f, h in before.items()
                if _sha(r / f.relative_to(root)) != h
            ]
            if changed:
                print(f"NOT RESTORED: {changed}", file=sys.stderr)
    wall = time.perf_counter() - start
    order = {m: i for i, m in enumerate(mutants)}
    fields = [f.name for f in dataclasses.fields(Mutant)]
    rows = [row for r in runs for row in r.rows]
    rows.sort(key=lambda row: order[Mutant(**{k: row[k] for k in fields})])
    run = dataclasses.replace(runs[0], broken={k: v for r in runs for k, v in r.broken.items()})
    data = {
        "seed": args.seed,
        "cap": cap,
        "caps": caps,
        "tiers": tier_rates(rows) if args.tiers else None,
        "wall_seconds": round(wall, 1),
        "pytest_args": list(PYTEST_ARGS),
        "source": str(args.source),
        "modules": {m: {**dataclasses.asdict(MODULES[m]), "full": args.full} for m in modules},
        "summary": summary(rows),
        "skipped": run.broken,
        "mutants": rows,
    }
    if args.before:
        before = {r["module"]: r for r in json.loads(args.before.read_text())["summary"]}
        data["before"] = {"file": str(args.before), "summary": list(before.values())}
        for row in data["summary"]:
            old = before.get(row["module"])
            row["kill_rate_before"] = old["kill_rate"] if old else None
    write_json(args.out / f"{args.name or 'mutation'}.json", data)
    _show(data, bool(args.before))


def _show(data: dict[str, Any], before: bool) -> None:
    """Prints a run's tables: the kill rates, each mutant's tiers, survivors, equivalents."""
    rows = data["mutants"]
    cols = ["module", "mutants", "killed", "timeout", "survived", "equivalent"]
    cols += [*(["kill_rate_before"] if before else []), "kill_rate", "seconds"]
    print(table(data["summary"], cols, "mutation kill rate"))
    if data["tiers"]:
        cols = ["module", "path", "line", "change", "fast", "fast_test", "whole", "whole_test"]
        # A test's id may hold brackets (a parametrized path): printed as text, not markup.
        shown = [{c: escape(r[c]) if isinstance(r[c], str) else r[c] for c in cols} for r in rows]
        print(table(shown, cols, "mutants, fast tier then whole"))
        print(table([data["tiers"]], list(data["tiers"]), "kill rates"))
    for r in rows:
        if r["status"] == "survived":
            print(f"survived  {r['path']}:{r['line']}  {r['change']}  | {r['diff']}")
    for r in rows:
        if r.get("equivalent"):
            print(f"equivalent  {r['path']}:{r['line']}  {r['change']}  | {r['equivalent']}")
    print(f"wall time {data['wall_seconds']:.0f} s ({len(rows)} mutants)")


def rejudge(path: Path, source: Path) -> dict[str, Any]:
    """A ``--tiers`` run's results judged again with today's :data:`EQUIVALENT`, against
    ``source``, the tree it ran on (its line numbers): a judgement made after the run, from a
    proof, sets a survivor apart; nothing is run again."""
    data = json.loads(path.read_text())
    fields = [f.name for f in dataclasses.fields(Mutant)]
    for row in data["mutants"]:
        same = judged(Mutant(**{k: row[k] for k in fields}), source)
        row["equivalent"] = same.why if same and row["whole"] == "survived" else ""
        row["status"] = "equivalent" if row["equivalent"] else row["whole"]
    data["summary"] = summary(data["mutants"])
    data["tiers"] = tier_rates(data["mutants"])
    return data


if __name__ == "__main__":
    main()
