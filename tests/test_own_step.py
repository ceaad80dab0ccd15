"""A user's own train step as a model source: ``rk.sources.from_step`` and ``--step``.

The figures are checked against bare compiles of the user's step done here with jax alone
(``jax.jit(fn, donate_argnums=...).lower(...).compile().memory_analysis()`` for a deviceless
H100), not against remat_kit's own pipeline. They compile with analysis-only codegen (a
stand-in ptxas: the same memory analysis, test_codegen checks it, without the machine code).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import warnings
from pathlib import Path

import jax
import pytest

import remat_kit as rk
from remat_kit import sources
from remat_kit.analysis import nbytes
from remat_kit.cli import main
from remat_kit.errors import BadValue
from remat_kit.targets import analysis_options

DATA = Path(__file__).parent / "data"
STEPS = str(DATA / "own_steps.py")
SMALL = rk.TrainConfig(batch=2, seq=32)
TAGS = {"context", "key_proj", "mlpwi_0", "mlpwi_1", "mlpwo", "out_proj", "query_proj"}
TAGS |= {"value_proj"}


def _src(name: str) -> sources.OwnStepSource:
    return sources.from_step(f"{STEPS}:{name}")


@functools.cache
def _bare(name: str, policy: str, batch: int, donate: tuple[int, ...]) -> int:
    """The bare peak of step function ``name``'s step (compiled once per session)."""
    own = _src(name).step(rk.policy(policy), rk.TrainConfig(batch=batch, seq=SMALL.seq))
    return _bare_peak(getattr(own.fn, "__wrapped__", own.fn), own.args, donate)


def _bare_peak(fn, args, donate, target="h100"):
    """The peak of ``fn`` compiled by jax alone for the deviceless ``target``."""
    t = rk.target(target)
    sharding = t.sharding()  # the deviceless GPU's one device
    placed = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lowered = jax.jit(fn, donate_argnums=donate).lower(*placed)
        m = lowered.compile(compiler_options=analysis_options(t)).memory_analysis()
    return (
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        + m.temp_size_in_bytes
        - m.alias_size_in_bytes
    )


@pytest.fixture(scope="module")
def measured():
    """Reports of the fully described step (roles, loss) under none and full."""
    src = _src("linen_step")
    return {p: sources.measure(src, p, "h100", SMALL, warn=False) for p in ("none", "full")}


# --- the peak is the user's step's --------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["none", "full"])
def test_the_peak_is_a_bare_compile_of_the_users_step(policy, measured):
    assert _src("linen_step").step(rk.policy(policy), SMALL).donate_argnums == (0, 1)
    assert measured[policy].peak_bytes == _bare("linen_step", policy, 2, (0, 1))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["jitted_step", "tuple_step"])
def test_a_jitted_or_tuple_step_is_compiled_with_its_own_donation(name):
    """``jitted_step`` donates in its ``jax.jit``, ``tuple_step`` in its third item: either
    way the params are donated, and the figures are those of a bare compile."""
    report = sources.measure(_src(name), "full", "h100", SMALL, warn=False)
    # Both steps run _plain's function: one bare compile of it serves both.
    assert report.peak_bytes == _bare("tuple_step", "full", 2, (0,))
    # donation is what makes it: without it the step holds one more copy of the weights
    assert report.peak_bytes < _bare("tuple_step", "full", 2, ())


@pytest.mark.slow
def test_remat_changes_the_users_step_and_the_flops_are_its_own(measured):
    none, full = measured["none"], measured["full"]
    assert full.peak_bytes < none.peak_bytes
    own = _src("linen_step").step(rk.policy("none"), SMALL)
    assert none.flops == pytest.approx(rk.count_flops(own.fn, *own.args).total)
    assert full.flops > none.flops  # the recomputed forward


@pytest.mark.slow
def test_the_breakdown_comes_from_the_roles_and_is_unknown_without_them(measured):
    own = _src("linen_step").step(rk.policy("full"), SMALL)
    params, _, batch = own.args
    r = measured["full"]
    assert r.breakdown["weights"] == r.breakdown["gradients"] == nbytes(params)
    assert r.breakdown["optimizer"] == 0  # optax.sgd keeps no state
    assert r.breakdown["batch"] == nbytes(batch) == 2 * 2 * 32 * 4
    known = sum(r.breakdown[k] for k in ("weights", "gradients", "optimizer", "batch"))
    assert r.breakdown["activations"] == r.peak_bytes - known
    assert r.meta["roles"] == {
        "params": "argument 0",
        "optimizer": "argument 1",
        "batch": "argument 2",
    }
    assert r.meta["precision"]["params"] == "bfloat16"
    bare = sources.measure(_src("tuple_step"), "full", "h100", SMALL, warn=False)
    assert bare.breakdown == {} and bare.meta["roles"] == "not given"


@pytest.mark.slow
def test_a_part_whose_role_is_not_given_is_unknown_not_zero():
    """Only ``params`` named: the gradients are known, the weights are not (argument 2 might
    hold frozen ones), nor the rest; the table says unknown."""
    from remat_kit.render import report_table

    def params_only(policy, config):
        own = _src("linen_step").step(policy, config)
        return dataclasses.replace(own, roles={"params": 0})

    r = sources.measure(sources.from_step(params_only), "full", "h100", SMALL, warn=False)
    n = nbytes(_src("linen_step").step(rk.policy("full"), SMALL).args[0])
    assert r.breakdown == {"trainable": n, "gradients": n}
    what, size = (list(c.cells) for c in report_table(r, rk.target("h100")).columns)
    cells = dict(zip(what, size, strict=True))
    assert cells["  weights"] == cells["  activations and temporaries"] == "unknown"
    assert 2**10 <= n < 2**20  # a small model's gradients: in KiB, each figure in its unit
    assert cells["  gradients"] == f"{n / 2**10:.2f} KiB"


@pytest.mark.slow
def test_the_measured_breakdown_reads_the_roles():
    """XLA's buffers at the peak, by role, are those of our own step around the same model
    (the factory ``model``, the same bf16 weights and SGD)."""
    own = sources.measure(
        _src("linen_step"), "full", "h100", SMALL, warn=False, measured_breakdown=True
    )
    config = rk.TrainConfig(2, 32, optimizer="sgd", precision="bf16")
    ours = sources.measure(
        sources.resolve(sources.FactorySpec(f"{STEPS}:model")),
        "full",
        "h100",
        config,
        warn=False,
        measured_breakdown=True,
    )
    for part in ("weights", "gradients", "optimizer", "batch"):
        assert own.breakdown[part] == ours.breakdown[part], part
    assert own.breakdown["weights"] > 0 and own.breakdown["batch"] == 2 * 2 * 32 * 4
    with pytest.raises(BadValue, match="no known roles"):
        sources.measure(
            _src("tuple_step"), "full", "h100", SMALL, warn=False, measured_breakdown=True
        )


# --- tags and name-based policies ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["linen_step", "tuple_step"])
def test_tags_come_from_the_users_step(name):
    """With the loss (linen_step) or without it (tuple_step: the whole step is traced)."""
    assert set(sources.tags(_src(name), SMALL, "h100")) == TAGS


@pytest.mark.slow
def test_a_name_based_policy_acts_on_the_users_tags():
    src = _src("linen_step")
    res = sources.residuals(src, "minimal", "h100", SMALL)
    assert res.tags["query_proj"] == "saved" and res.tags["context"] == "recomputed"
    sources.check_policies(src, SMALL, "h100", ["names:save=context"])
    with pytest.raises(BadValue, match="names router_logits"):
        sources.check_policies(src, SMALL, "h100", ["names:save=router_logits"])
    saved = sources.measure(src, "names:save=mlpwi_0+mlpwi_1", "h100", SMALL, warn=False)
    full = sources.measure(src, "full", "h100", SMALL, warn=False)
    assert saved.peak_bytes > full.peak_bytes  # the saved MLP inputs are held


def test_without_its_loss_a_step_has_no_residual_table():
    with pytest.raises(BadValue, match="without its loss"):
        sources.residuals(_src("tuple_step"), "minimal", "h100", SMALL)


@pytest.mark.parametrize(
    ("policy", "match"),
    [
        ("minimal", r"'minimal' holds no checkpoint with it.*other policies \(full"),
        ("none", r"'none' holds checkpoints with full"),
    ],
)
def test_a_step_that_ignores_its_policy_is_refused(policy, match):
    with pytest.raises(BadValue, match=match):
        sources.measure(_src("ignores_policy"), policy, "h100", SMALL, warn=False)


# --- what a step function must return -----------------------------------------------------------


def _returning(out):
    def step_fn(policy, config):
        return out

    return step_fn


_S = jax.ShapeDtypeStruct((2,), "float32")


@pytest.mark.parametrize(
    ("out", "match"),
    [
        ("model", r"returned str; a step function returns \(fn, args\)"),
        ((abs, (_S,), (), None), r"returned a tuple of 4; a step function returns"),
        ((3, (_S,)), r"returned a int as the step"),
        ((abs, _S), r"returned args of type ShapeDtypeStruct; the arguments are a tuple"),
        ((abs, (_S,), (1,)), r"donates argument 1, but the step has 1 arguments"),
        (
            sources.OwnStep(abs, (_S,), roles={"weights": 0}),
            r"returned an unknown role 'weights'; roles",
        ),
        (
            sources.OwnStep(abs, (_S,), roles={"params": 2}),
            r"returned role 'params' naming argument 2",
        ),
        (sources.OwnStep(abs, (_S,), loss_fn=abs), r"returned loss_fn without the other"),
        (sources.OwnStep(abs, (_S, _S), roles={"params": 0, "batch": (0, 1)}), r"returned two"),
    ],
)
def test_a_bad_return_value_is_one_line_naming_the_function(out, match):
    with pytest.raises(BadValue, match=rf"^step_fn {match}") as err:
        sources.measure(sources.from_step(_returning(out)), "none", "cpu", SMALL, warn=False)
    assert "\n" not in str(err.value)


def test_a_step_function_must_take_policy_and_config():
    with pytest.raises(BadValue, match=r"called as NAME\(policy, config\)"):
        sources.from_step(lambda policy: None)


def test_a_step_function_that_fails_says_so_in_one_line():
    def broken(policy, config):
        raise KeyError("params")

    with pytest.raises(BadValue, match=r"broken\('none', batch=2, seq=32\) failed: KeyError"):
        sources.measure(sources.from_step(broken), "none", "cpu", SMALL, warn=False)


@pytest.mark.parametrize(
    ("field", "value"),
    [("optimizer", "sgd"), ("accum", 2), ("precision", "bf16")],
)
@pytest.mark.parametrize("door", ["measure", "workload"])
def test_a_train_setting_the_step_decides_itself_is_refused_before_it_runs(field, value, door):
    # The step has its own optimizer, accumulation and precision: a config asking for
    # others would be ignored, so both library doors refuse it before calling the step.
    def never(policy, config):
        raise AssertionError("the step ran")

    config = dataclasses.replace(SMALL, **{field: value})
    src = sources.from_step(never)
    with pytest.raises(BadValue, match=rf"^{field}={value!r} with the step .*own {field}"):
        if door == "measure":
            sources.measure(src, "none", "cpu", config, warn=False)
        else:
            sources.workload(src, "cpu", config)


# --- the batch search: the step is rebuilt for every batch --------------------------------------


@pytest.mark.slow
def test_fit_finds_the_largest_batch_of_the_users_step():
    """Under a 1.2 MiB limit: the step function is called at each batch the search tries.
    (The answer is batch 3, found in four compiles; 1.5 MiB took six, for batch 6.)"""
    src, limit = _src("linen_step"), int(1.2 * 2**20)
    w = sources.workload(src, "h100", SMALL)
    fit = rk.max_batch(w, "full", headroom=0.0, limit_bytes=limit)

    # The search's answer and its proof are the step at those batches (whose peak is a bare
    # compile's: test_the_peak_is_a_bare_compile_of_the_users_step).
    at = lambda b: sources.measure(src, "full", "h100", rk.TrainConfig(b, SMALL.seq), warn=False)
    assert fit.fits and fit.batch > 2
    assert at(fit.batch).peak_bytes == fit.peak_bytes <= limit
    assert at(fit.batch + 1).peak_bytes == fit.next_peak_bytes > limit


# --- the command line ---------------------------------------------------------------------------


@pytest.mark.slow
def test_report_with_step_is_the_users_step(tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = ["report", "--step", f"{STEPS}:linen_step", "--policy", "full", "--target", "h100"]
    assert main([*argv, "--batch", "2", "--seq", "32", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "linen_step b2 s32 own step policy=full" in printed
    data = json.loads(out.read_text())
    assert data["peak_bytes"] == _bare("linen_step", "full", 2, (0, 1))
    assert data["meta"]["optimizer"] == "own step" and data["residuals"]["tags"]["context"]


@pytest.mark.slow
def test_compare_with_step_has_a_row_per_policy(tmp_path, capsys):
    out = tmp_path / "c.json"
    argv = ["compare", "--step", f"{STEPS}:tuple_step", "--policies", "full,minimal"]
    argv += ["--target", "h100", "--batch", "2", "--seq", "32", "--jobs", "1", "--json", str(out)]
    assert main(argv) == 0
    rows = {r["policy"]: r for r in json.loads(out.read_text())}
    assert rows["full"]["peak_bytes"] == _bare("tuple_step", "full", 2, (0,))
    assert rows["full"]["peak_bytes"] < rows["minimal"]["peak_bytes"]
    assert "own step" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--model", "tiny-llama"], "give the model once (--model and --step given)"),
        (
            ["--hf-config", str(DATA / "hf" / "llama3-8b.json")],
            "give the model once (--hf-config and --step",
        ),
        (["--lora", "4"], "--lora with --step"),
        (["--layers", "3", "--optimizer", "adamw"], "--optimizer, --layers with --step"),
        (["--shard", "fsdp:2", "--gpus", "2"], "--shard with --step"),
    ],
)
def test_step_with_a_model_or_a_model_flag_is_refused_before_anything_runs(
    flags, line, monkeypatch, capsys
):
    def never(*args, **kwargs):
        raise AssertionError("the step function ran")

    monkeypatch.setattr(sources.OwnStepSource, "step", never)
    for command in ("report", "compare", "fit"):
        assert main([command, "--step", f"{STEPS}:linen_step", *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"remat-kit: {line}"), err
        assert err.count("\n") == 1


def test_a_users_step_names_its_own_tags_checked_against_its_trace(capsys):
    """A user's step may tag tensors with names of its own (``own_model``): a name outside
    remat_kit's vocabulary is not refused as a typo of ours but checked against the step's
    traced program, whose tags the refusal lists (issue 58 mutant _own_step.py:136 of seed
    75, the vocabulary's refusal instead)."""
    argv = ["report", "--step", f"{STEPS}:linen_step", "--policy", "names:save=query_proj+ctx"]
    assert main([*argv, "--batch", "2", "--seq", "32"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("remat-kit: policy 'names:save=query_proj+ctx' names 'ctx'"), err
    assert f"tags there: {', '.join(sorted(TAGS))}" in err and err.count("\n") == 1


def test_fit_for_throughput_varies_the_accumulation_a_users_step_does_not_take(capsys):
    argv = ["fit", "--step", f"{STEPS}:linen_step", "--objective", "throughput"]
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("remat-kit: --objective throughput with --step")


def test_a_step_that_does_not_load_names_the_flag(capsys):
    assert main(["report", "--step", f"{DATA}/nowhere.py:f"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"remat-kit: --step {DATA}/nowhere.py:f: step '"), err


@pytest.mark.parametrize(("ways", "per_device"), [(1, 8 * 16 * 4), (4, 2 * 16 * 4)])
def test_a_sharded_argument_counts_its_shard_in_the_breakdown(ways, per_device):
    # Roles by hand (no compile): the weights [8, 16] f32 sharded over `ways` devices along
    # their first axis, the batch [8] int32 whole on each; bytes per device, by hand.
    from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

    from remat_kit.sources._own_step import _breakdown

    mesh = AbstractMesh((ways,), ("data",))
    sharded = NamedSharding(mesh, PartitionSpec("data"))
    params = {"w": jax.ShapeDtypeStruct((8, 16), "float32", sharding=sharded)}
    batch = jax.ShapeDtypeStruct((8,), "int32")
    got = _breakdown((params, batch), {"params": (0,), "batch": (1,)})
    want = {"trainable": per_device, "gradients": per_device, "weights": per_device}
    assert got == {**want, "optimizer": 0, "batch": 8 * 4}


@pytest.mark.parametrize(
    ("roles", "want"),
    [
        ({}, {}),  # no roles: nothing to say, the tables leave it out
        (
            {"params": (0,), "optimizer": (1,), "batch": (2,)},  # every argument has a role
            {
                "params": "bfloat16",
                "frozen": "-",
                "grads": "bfloat16",
                "optimizer_state": "float32",
            },
        ),
        (
            {"params": (0,)},  # the others might hold anything
            {"params": "bfloat16", "frozen": "unknown", "grads": "bfloat16"}
            | {"optimizer_state": "unknown"},
        ),
    ],
)
def test_the_precision_of_each_role_is_its_arguments_floating_dtypes(roles, want):
    """Read from the shapes, no compile (seed-67 mutant _own_step.py:488, roles read as none:
    killed only by a compiling test before)."""
    import jax.numpy as jnp

    from remat_kit.sources import _own_step

    args = (
        {"w": jax.ShapeDtypeStruct((4, 4), jnp.bfloat16)},
        {"mu": jax.ShapeDtypeStruct((4, 4), jnp.float32)},
        jax.ShapeDtypeStruct((2, 8), jnp.int32),
    )
    got = _own_step._precision(args, roles)
    if want:
        want = {"name": "step's own", **want, "compute": "step's own"}
    assert got == want


# --- what a step function returns, against oracles over random returns ---------------------

_ROLE_NAMES = ("params", "frozen", "optimizer", "batch")
_CATEGORY = {"params": "parameter", "frozen": "parameter", "optimizer": "optimizer state"}
_CATEGORY["batch"] = "input"
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4, "int8": 1}


def _leaf(rng, ways):
    """A random abstract array: (ShapeDtypeStruct, its elements, its bytes on one device)."""
    from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

    shape = tuple(rng.randrange(1, 5) for _ in range(rng.randrange(1, 3)))
    dtype = rng.choice(sorted(_ITEMSIZE))
    elements = 1
    for d in shape:
        elements *= d
    local = elements
    sharding = None
    if ways > 1 and rng.random() < 0.5:
        shape = (ways * shape[0], *shape[1:])  # split along its first axis
        mesh = AbstractMesh((ways,), ("data",))
        sharding = NamedSharding(mesh, PartitionSpec("data"))
        elements *= ways
    leaf = jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
    return leaf, elements, local * _ITEMSIZE[dtype]


def _random_args(rng):
    """Random step arguments and, per argument, (elements, bytes per device, dtypes)."""
    ways = rng.choice([1, 1, 2, 4])
    args, facts = [], []
    for _ in range(rng.randrange(1, 6)):
        leaves = [_leaf(rng, ways) for _ in range(rng.randrange(0, 4))]
        arg = {f"x{i}": leaf for i, (leaf, _, _) in enumerate(leaves)}
        if len(leaves) == 1 and rng.random() < 0.5:
            arg = leaves[0][0]  # a bare array, not a pytree of them
        args.append(arg)
        facts.append(
            (
                sum(e for _, e, _ in leaves),
                sum(b for _, _, b in leaves),
                {str(leaf.dtype) for leaf, _, _ in leaves},
            )
        )
    return tuple(args), facts


def _random_roles(rng, n):
    """Random roles: None, or some roles each naming some arguments (an int or a tuple)."""
    if rng.random() < 0.15:
        return None
    free = list(range(n))
    rng.shuffle(free)
    roles = {}
    for role in rng.sample(_ROLE_NAMES, rng.randrange(0, 5)):
        take = [free.pop() for _ in range(min(len(free), rng.randrange(1, 3)))]
        if not take:
            break
        roles[role] = take[0] if len(take) == 1 and rng.random() < 0.5 else tuple(take)
    return roles


def _expected(facts, roles):
    """Breakdown, precision, categories and labels of a step, from the contract of
    OwnStep.roles (a role not given is unknown, unless every argument has one)."""
    named = {r: ((i,) if isinstance(i, int) else tuple(i)) for r, i in (roles or {}).items()}
    if not named:
        return {}, {}, {}, "not given", None
    covered = sorted(i for idx in named.values() for i in idx) == list(range(len(facts)))
    known = {r for r in _ROLE_NAMES if r in named or covered}
    size = {r: sum(facts[i][1] for i in named.get(r, ())) for r in _ROLE_NAMES}
    parts = {}
    if "params" in known:
        parts.update(trainable=size["params"], gradients=size["params"])
        if "frozen" in known:
            parts["weights"] = size["params"] + size["frozen"]
    parts.update({r: size[r] for r in ("optimizer", "batch") if r in known})

    def dtypes(role):
        if role not in known:
            return "unknown"
        found = sorted({d for i in named.get(role, ()) for d in facts[i][2]} - {"int32", "int8"})
        return "+".join(found) or "-"

    precision = {
        "name": "step's own",
        "params": dtypes("params"),
        "frozen": dtypes("frozen"),
        "grads": dtypes("params"),
        "optimizer_state": dtypes("optimizer"),
        "compute": "step's own",
    }
    categories = {i: _CATEGORY[r] for r, idx in named.items() for i in idx}
    where = {
        r: ("argument " if len(idx) == 1 else "arguments ") + ", ".join(map(str, idx))
        for r, idx in named.items()
    }
    count = sum(facts[i][0] for i in named["params"]) if "params" in named else None
    return parts, precision, categories, where, count


@pytest.mark.parametrize("seed", range(4))
def test_a_random_step_s_breakdown_precision_and_labels_follow_its_roles(seed):
    import random

    from remat_kit.schedules import NO_SCHEDULE

    rng = random.Random(seed)
    for case in range(40):
        args, facts = _random_args(rng)
        roles = _random_roles(rng, len(args))
        donate = tuple(sorted(rng.sample(range(len(args)), rng.randrange(0, len(args) + 1))))
        loss = rng.random() < 0.5
        own = sources.OwnStep(
            abs,
            list(args) if rng.random() < 0.3 else args,
            donate_argnums=donate[0] if len(donate) == 1 and rng.random() < 0.5 else donate,
            loss_fn=(lambda *a: 0.0) if loss else None,
            loss_args=args[:1] if loss else None,
            roles=roles,
        )
        src = sources.from_step(
            _returning(own if case % 3 else tuple(dataclasses.astuple(own)[:3]))
        )
        if case % 3 == 0:  # (fn, args, donate_argnums): no roles, no loss
            roles, loss = None, False
        built = src.build_step(rk.policy("full"), NO_SCHEDULE, SMALL, rk.target("h100"))
        parts, precision, categories, where, count = _expected(facts, roles)
        step = built.step
        assert step.breakdown == parts, (roles, facts)
        assert step.precision == (precision if roles else {}), (roles, facts)
        assert step.categories == categories
        assert step.args == args and step.donate_argnums == donate
        assert step.loss_given is loss
        assert step.loss_args == (args[:1] if loss else args)
        assert step.in_shardings is None and step.out_shardings is None
        assert built.meta["roles"] == where and built.meta["loss_given"] is loss
        assert built.meta.get("params") == count
        assert built.meta["optimizer"] == "own step" and built.attention == "step's own"


def test_a_step_file_loaded_twice_is_the_same_source():
    # A source is its spec: each load imports the file again (another function object, as in
    # a worker process), and the two are equal and hash alike (seed-86 mutant
    # _own_step.py:132, the function compared: two loads of one step were two sources).
    a, b = _src("linen_step"), _src("linen_step")
    assert a.step_fn is not b.step_fn
    assert a == b and len({a, b}) == 1
    assert a != _src("tuple_step")


def test_a_steps_in_shardings_ride_on_its_arguments_as_the_trace_sees_them():
    # A step that names in_shardings is traced with each argument's leaves carrying theirs
    # (a trace sees the mesh), the shapes and dtypes as the step gave them (issue 58, seed-81
    # mutant _own_step.py:370). One CPU device: a mesh of one, the batch axis over it.
    import numpy as np

    from remat_kit.schedules import NO_SCHEDULE

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    x = jax.ShapeDtypeStruct((4, 8), "float32")
    out = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    own = sources.OwnStep(lambda a: a * 2, [x], in_shardings=(sh,), out_shardings=out)
    src = sources.from_step(_returning(own))
    built = src.build_step(rk.policy("full"), NO_SCHEDULE, SMALL, rk.target("h100"))
    assert isinstance(built.step.args, tuple) and len(built.step.args) == 1
    (arg,) = built.step.args
    assert (arg.shape, arg.dtype, arg.sharding) == ((4, 8), np.float32, sh)
    assert x.sharding is None  # the step's own argument is left as it was
    # The compile is the step's jax.jit: its in_shardings and out_shardings as given (seed-86
    # mutant _own_step.py:234, out_shardings dropped); the trace alone takes neither.
    assert (built.step.in_shardings, built.step.out_shardings) == ((sh,), out)
    traced = src.build_step(rk.policy("full"), NO_SCHEDULE, SMALL, rk.target("h100"), sharded=False)
    assert (traced.step.in_shardings, traced.step.out_shardings) == (None, None)


def _first_error(out, n):
    """The fragment of the one-line error a step function's ``out`` earns, or None: the
    checks in the order the contract lists them (shape, step, args, donation, loss, shardings,
    roles)."""
    if isinstance(out, sources.OwnStep):
        own = out
    elif isinstance(out, tuple) and len(out) in (2, 3):
        own = sources.OwnStep(*out)
    else:
        return f"returned a tuple of {len(out)}" if isinstance(out, tuple) else "returned"
    donate = (own.donate_argnums,) if isinstance(own.donate_argnums, int) else own.donate_argnums
    for i in donate:
        if isinstance(i, bool) or not isinstance(i, int) or i < 0 or i >= n:
            return f"donates argument {i!r}, but the step has {n} arguments (0 to {n - 1})"
    if (own.loss_fn is None) is not (own.loss_args is None):
        return "without the other"
    if own.in_shardings is not None and len(own.in_shardings) != n:
        return f"returned {len(own.in_shardings)} in_shardings for {n} arguments"
    seen = set()
    for role, idx in (own.roles or {}).items():
        if role not in _ROLE_NAMES:
            return f"returned an unknown role {role!r}"
        for i in (idx,) if isinstance(idx, int) else idx:
            if isinstance(i, bool) or not isinstance(i, int) or i < 0 or i >= n:
                return f"returned role {role!r} naming argument {i!r}, but the step has {n}"
            if i in seen:
                return f"returned two roles for argument {i}"
            seen.add(i)
    return None


@pytest.mark.parametrize("seed", range(3))
def test_random_returns_are_taken_or_refused_with_the_first_thing_wrong(seed):
    import random

    from remat_kit.schedules import NO_SCHEDULE

    rng = random.Random(1000 + seed)
    odd = lambda n: rng.choice([-1, 0, n - 1, n, n + 1, True, False, 1.0])
    refused = 0
    for _ in range(80):
        n = rng.randrange(1, 4)
        args = (_S,) * n
        donate = tuple(odd(n) for _ in range(rng.randrange(0, 3)))
        roles = {
            # A bare index is an int (a bare float is no sequence of indices either).
            rng.choice([*_ROLE_NAMES, "weights"]): (
                rng.choice([-1, 0, n - 1, n, True])
                if rng.random() < 0.5
                else tuple(odd(n) for _ in range(rng.randrange(1, 3)))
            )
            for _ in range(rng.randrange(0, 3))
        }
        shape = rng.randrange(5)
        if shape == 0:
            out = (abs, args, donate, None, None)[: rng.choice([1, 2, 3, 4, 5])]
        else:
            out = sources.OwnStep(
                abs,
                args,
                donate_argnums=donate,
                loss_fn=rng.choice([None, abs]),
                loss_args=rng.choice([None, args]),
                roles=roles or None,
                in_shardings=rng.choice([None, (None,) * n, (None,) * (n + 1)]),
            )
        want = _first_error(out, n)
        src = sources.from_step(_returning(out))
        if want is None:
            src.build_step(rk.policy("none"), NO_SCHEDULE, SMALL, rk.target("h100"))
            continue
        refused += 1
        with pytest.raises(BadValue, match=r"^step_fn ") as err:
            src.build_step(rk.policy("none"), NO_SCHEDULE, SMALL, rk.target("h100"))
        assert want in str(err.value), (out, want)
    assert 10 < refused < 80


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _Batch:
    """A batch as a pytree of its own that, like an array, says its shape."""

    tokens: jax.Array
    mask: jax.Array

    @property
    def shape(self):
        return self.tokens.shape


def test_a_jitted_steps_batch_with_a_shape_of_its_own_is_read_leaf_by_leaf():
    """The jit's donation is read off its ArgInfo leaves; a pytree node that has a ``shape``
    (a user's batch class) is a node, not a leaf (seed-102 mutant _own_step.py:443, the
    leaf test's ``and`` made ``or``: it took the batch for a leaf and asked it ``donated``)."""
    from remat_kit.schedules import NO_SCHEDULE

    def step(params, batch):
        return params + 1.0, (batch.tokens * batch.mask).sum()

    batch = _Batch(*(jax.ShapeDtypeStruct((2, 4), "float32"),) * 2)
    src = sources.from_step(_returning((jax.jit(step, donate_argnums=0), (_S, batch))))
    built = src.build_step(rk.policy("none"), NO_SCHEDULE, SMALL, rk.target("h100"))
    assert built.step.fn is step and tuple(built.step.donate_argnums) == (0,)


@pytest.mark.parametrize(
    ("jit_donates", "given", "want"),
    [
        ((), (), ()),
        ((0,), (), (0,)),
        ((0, 2), (), (0, 2)),
        ((1,), (1,), (1,)),  # given twice, alike: taken
        ((), (2,), (2,)),  # a jit that donates nothing: the step's donation, as the error says
        ((0,), (1,), None),  # given twice, differently: refused
    ],
)
def test_a_jitted_step_is_compiled_unjitted_with_the_jit_s_own_donation(jit_donates, given, want):
    from remat_kit.schedules import NO_SCHEDULE

    def step(params, opt, batch):
        return params + 1.0, opt * 2.0, batch.sum()

    args = (_S, _S, jax.ShapeDtypeStruct((2, 4), "float32"))
    jitted = jax.jit(step, donate_argnums=jit_donates)
    src = sources.from_step(_returning((jitted, args, given)))
    if want is None:
        with pytest.raises(BadValue, match=r"a jax\.jit that donates arguments \(0,\) and donate"):
            src.build_step(rk.policy("none"), NO_SCHEDULE, SMALL, rk.target("h100"))
        return
    built = src.build_step(rk.policy("none"), NO_SCHEDULE, SMALL, rk.target("h100"))
    assert built.step.fn is step and tuple(built.step.donate_argnums) == want
    plain = sources.from_step(_returning((step, args, given)))
    assert (
        plain.build_step(rk.policy("none"), NO_SCHEDULE, SMALL, rk.target("h100")).step.fn is step
    )
