"""Model sources: factories (rk.sources), Hugging Face config.json (models.hf), and the checks
that keep a report honest (remat_kit.checks): no silent no-op policy, no stale trace."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import json
import math
import os
import re
import subprocess
import sys
import types
import warnings
from pathlib import Path

import chex
import flax.linen as nn
import flax.traverse_util
import jax
import jax.numpy as jnp
import pytest

import remat_kit as rk
import remat_kit.sources._kinds
import remat_kit_models as models
import remat_kit_models.hf
from helpers import memory_report, size_words
from remat_kit import checks, sources
from remat_kit.analysis import RematWarning
from remat_kit.breakdown import add_breakdown
from remat_kit.cli import main
from remat_kit.errors import BadType, BadValue, DoesNotFit
from remat_kit.flops import FlopCount
from remat_kit.notes import words
from remat_kit.schedules import NO_SCHEDULE
from remat_kit_models.configure import model_config
from remat_kit_models.spec import HFSpec, PresetSpec

DATA = Path(__file__).parent / "data"
FACTORIES = str(DATA / "factories.py")
SMALL = rk.TrainConfig(batch=2, seq=16)


# --- Hugging Face config.json -> our decoder ---------------------------------------------------


def _published_count(c: dict) -> int:
    """Parameters of a Llama-family config.json, counted by hand from its fields."""
    d, ff, L, V = (
        c["hidden_size"],
        c["intermediate_size"],
        c["num_hidden_layers"],
        c["vocab_size"],
    )
    h = c.get("head_dim") or d // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * h, c["num_key_value_heads"] * h
    attn = d * q + 2 * d * kv + q * d
    if c["architectures"][0] == "Qwen2ForCausalLM":
        attn += q + 2 * kv  # biases on q, k and v
    layer = attn + 3 * d * ff + 2 * d
    tied = c.get("tie_word_embeddings", c["architectures"][0] == "GemmaForCausalLM")
    return V * d * (1 if tied else 2) + L * layer + d


@pytest.mark.parametrize(
    ("name", "published"),
    [("llama3-8b", 8.03e9), ("mistral-7b", 7.24e9), ("qwen2-7b", 7.62e9), ("gemma-7b", 8.54e9)],
)
def test_hf_config_builds_the_published_parameter_count(name, published):
    path = DATA / "hf" / f"{name}.json"
    cfg = models.hf.from_hf_config(path)
    tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
    shapes = jax.eval_shape(models.build(cfg).init, jax.random.key(0), tokens)
    count = sum(math.prod(x.shape) for x in jax.tree.leaves(rk.strip_boxes(shapes)))
    assert round(count / 1e9, 2) == round(published / 1e9, 2)
    assert count == _published_count(json.loads(path.read_text()))


def test_qwen2_has_biases_on_qkv_only_and_gemma_ties_and_scales():
    tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
    small = dict(layers=1, width=64, heads=4, kv_heads=2, ff=128, vocab=256)
    qwen = models.hf.from_hf_config(DATA / "hf" / "qwen2-7b.json")
    qwen = qwen.replace(**{models.OVERRIDES[k]: v for k, v in small.items()})
    shapes = rk.strip_boxes(jax.eval_shape(models.build(qwen).init, jax.random.key(0), tokens))
    flat = flax.traverse_util.flatten_dict(shapes)
    biases = sorted({path[-2] for path in flat if path[-1] == "bias"})
    assert biases == ["key", "query", "value"]
    gemma = models.hf.from_hf_config(DATA / "hf" / "gemma-7b.json")
    assert (gemma.tie_embeddings, gemma.embed_scale, gemma.mlp_activation) == (True, True, "gelu")
    assert gemma.head_dim == 256  # not width / heads = 192


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"final_logit_softcapping": 30.0}, r"field 'final_logit_softcapping' = 30.0 is not"),
        ({"architectures": ["Gemma2ForCausalLM"]}, r"architecture 'Gemma2ForCausalLM' is not"),
        ({"hidden_act": "relu"}, r"hidden_act='relu' is not modelled.*silu, gelu"),
        ({"attention_bias": True}, r"attention_bias=True is not modelled"),
        ({"mlp_bias": True}, r"mlp_bias=True is not modelled"),
        ({"pretraining_tp": 2}, r"pretraining_tp=2 is not modelled"),
        ({"hidden_size": None}, r"lacks hidden_size"),
    ],
)
def test_hf_config_refuses_what_it_cannot_model(change, match):
    fields = {**json.loads((DATA / "hf" / "llama3-8b.json").read_text()), **change}
    with pytest.raises(BadValue, match=match):
        models.hf.from_hf_config(fields)


def test_hf_config_file_errors(tmp_path):
    with pytest.raises(BadValue, match="no such file"):
        models.hf.from_hf_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(BadValue, match="is not JSON"):
        models.hf.from_hf_config(tmp_path / "bad.json")


def test_sliding_window_bounds_the_sequence():
    t = rk.target("cpu")
    spec = HFSpec(str(DATA / "hf" / "mistral-7b.json"), label="mistral")
    config = rk.TrainConfig(1, 4096)
    assert model_config(spec, config, "full", t).n_layers == 32
    with pytest.raises(BadValue, match=r"seq=4097 is longer than mistral attends to \(4096"):
        model_config(spec, dataclasses.replace(config, seq=4097), "full", t)


# --- factories ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("no_colon.py", r"a factory is LOCATION:NAME"),
        (f"{DATA}/missing.py:f", r"no such file"),
        (f"{FACTORIES}:nope", r"has no 'nope'; callables there: .*hf_llama.*untagged"),
        (f"{FACTORIES}:not_callable", r"not_callable is a int, not a callable"),
        ("no_such_package_xyz.mod:f", r"cannot import 'no_such_package_xyz.mod'"),
    ],
)
def test_load_factory_errors_name_what_is_wrong(spec, match):
    with pytest.raises(BadValue, match=match):
        sources.load_factory(spec)


def test_factory_must_take_a_policy():
    with pytest.raises(BadValue, match=r"called as NAME\(policy\)"):
        sources.from_factory(lambda: None)


class _Unreadable:
    """A factory whose signature inspect cannot read (as a C callable's): called with the
    policy alone, as one that takes nothing else."""

    __signature__ = "unreadable"  # inspect.signature raises ValueError

    def __init__(self):
        self.calls = []

    def __call__(self, policy):
        self.calls.append(policy)
        return nn.Dense(8)


def test_a_factory_without_a_readable_signature_is_called_with_the_policy_alone():
    factory = _Unreadable()
    src = sources.from_factory(factory)
    assert (src.schedule_kinds, src.applies_in_code) == ({"none"}, "policy")
    # It takes neither schedule= nor target= (flags, not unknowns: the source's identity).
    assert src.takes_schedule is False and src.takes_target is False
    assert src == dataclasses.replace(src, takes_schedule=False, takes_target=False)
    with pytest.raises(BadValue, match="every"):
        src.check_schedule("every:2")
    src.build("full")  # handed schedule=, it would raise a TypeError
    assert "full" in [p.spec for p in factory.calls]


@pytest.mark.parametrize(
    ("name", "block", "kinds"),
    [
        ("untagged", None, {"none"}),
        ("preset", None, {"none", "every", "sqrt", "nested", "layers"}),
        ("untagged", "tests.data.factories:_Block", {"none", "layers"}),
    ],
)
def test_schedules_are_offered_only_where_the_factory_builds_them(name, block, kinds):
    src = sources.from_factory(f"{FACTORIES}:{name}", block=block)
    assert src.schedule_kinds == kinds
    if "sqrt" not in kinds:
        with pytest.raises(BadValue, match=r"cannot build schedule 'sqrt'"):
            src.build("full", "sqrt")


# --- per-layer plans: which block gets which policy ---------------------------------------------

#: The factory by module name, so that patching its ``_Block`` reaches the model it builds.
UNTAGGED_BY_NAME, BLOCK = "tests.data.factories:untagged", "tests.data.factories:_Block"


def test_a_patched_block_gives_the_nth_block_built_the_nth_policy(monkeypatch):
    """The n-th block constructed in the context is wrapped with the n-th policy; blocks past
    the list take the last one; the class is put back afterwards."""
    mod = types.ModuleType("_rk_blocks")

    class Block:
        def __init__(self, i):
            self.i = i

    mod.Block = Block
    monkeypatch.setitem(sys.modules, "_rk_blocks", mod)
    made = []

    def fake_remat(cls, p):
        made.append(p.spec)
        return type(f"Remat_{p.name}", (cls,), {"spec": p.spec})

    monkeypatch.setattr("remat_kit.sources._loading.remat", fake_remat)
    plan = [rk.policy(n) for n in ("full", "minimal", "full", "dots")]
    counter = [0]
    with sources.patched_block("_rk_blocks:Block", plan, counter=counter):
        built = [mod.Block(i) for i in range(6)]
    assert [b.spec for b in built] == ["full", "minimal", "full", "dots", "dots", "dots"]
    assert [b.i for b in built] == list(range(6))
    assert counter == [6] and sorted(made) == ["dots", "full", "minimal"]  # one class each
    assert mod.Block is Block
    with sources.patched_block("_rk_blocks:Block", rk.policy("minimal")):
        assert [mod.Block(i).spec for i in range(2)] == ["minimal", "minimal"]
    assert mod.Block is Block


@pytest.mark.parametrize("seed", range(3))
def test_a_block_built_again_under_its_name_is_the_same_layer_and_an_unnamed_one_a_new_one(
    monkeypatch, seed
):
    """Random names (some given twice, as a linen ``setup`` run again gives them; some not a
    string): the layer of a block is the order its name first came in, each unnamed block a
    new one; the counter says how many layers there were."""
    import random

    rng = random.Random(seed)
    mod = types.ModuleType("_rk_named_blocks")

    class Block:
        def __init__(self, name=None):
            self.name = name

    mod.Block = Block
    monkeypatch.setitem(sys.modules, "_rk_named_blocks", mod)
    monkeypatch.setattr(
        "remat_kit.sources._loading.remat",
        lambda cls, p: type(f"Remat_{p.name}", (cls,), {"spec": p.spec}),
    )
    specs = ["full", "minimal", "dots", "none", "dots_no_batch"]
    for _ in range(20):
        plan = [rk.policy(rng.choice(specs)) for _ in range(rng.randrange(1, 5))]
        names = [rng.choice(["a", "b", "layer_3", "3", None, 7]) for _ in range(rng.randrange(7))]
        # The oracle: a layer per name in order of first sight, and one per unnamed block.
        keys = [n if isinstance(n, str) else object() for n in names]
        order = list(dict.fromkeys(keys))
        counter = [0]
        single = rng.random() < 0.3
        with sources.patched_block(
            "_rk_named_blocks:Block", plan[0] if single else plan, counter=counter
        ):
            built = [mod.Block(name=n) if n is not None else mod.Block() for n in names]
        for key, b in zip(keys, built, strict=True):
            layer = 0 if single else min(order.index(key), len(plan) - 1)
            assert b.spec == plan[layer].spec
        assert counter == [len(order)]
        assert mod.Block is Block


@pytest.mark.parametrize("spec", ["flax.linen.Dense", "flax.linen:", ":Dense"])
def test_a_block_that_is_not_module_colon_class_says_how_to_name_it(spec):
    with pytest.raises(BadValue, match=r"name the block class as module:Class") as err:
        sources.from_factory(UNTAGGED_BY_NAME, block=spec)
    assert err.value.param == "block"


def test_a_model_that_needs_hugging_face_inputs_gets_them_to_count_and_train(monkeypatch):
    """Counting layers builds the model once: with the mask and positions it requires."""
    mod = types.ModuleType("_rk_hf")

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            return x + nn.Dense(8)(x)

    class Model(nn.Module):
        @nn.compact
        def __call__(self, input_ids, attention_mask, position_ids):  # no defaults, as HF's
            x = nn.Embed(16, 8)(input_ids) * attention_mask[..., None]
            x = x + position_ids[..., None]
            for _ in range(3):
                x = mod.Block()(x)
            return nn.Dense(16)(x)

    mod.Block, mod.build = Block, lambda policy: Model()
    monkeypatch.setitem(sys.modules, "_rk_hf", mod)
    src = sources.from_factory("_rk_hf:build", block="_rk_hf:Block")
    assert src.n_layers() == 3
    # Its train step hands the model those inputs too: it traces.
    step = src.build("full").train_step(rk.TrainConfig(batch=2, seq=8, optimizer="sgd"))
    jax.eval_shape(step.fn, *step.args)


class _InitOnly:
    def init(self, *args):
        return {}


class _ApplyOnly:
    def apply(self, *args):
        return None


@pytest.mark.parametrize("made", [_InitOnly(), _ApplyOnly(), 3])
def test_a_factory_that_returns_no_flax_module_is_refused_naming_what_it_returned(made):
    with pytest.raises(BadValue, match=rf"returned {type(made).__name__}; a factory returns a"):
        sources.from_factory(lambda policy: made).build("full")


@pytest.mark.parametrize(
    ("made", "layers"),
    [
        (types.SimpleNamespace(n_layers=1), 1),
        (types.SimpleNamespace(num_layers=2), 2),
        (types.SimpleNamespace(config=types.SimpleNamespace(num_hidden_layers=3)), 3),
        (types.SimpleNamespace(config=types.SimpleNamespace(n_layer=4)), 4),
        (types.SimpleNamespace(cfg=types.SimpleNamespace(n_layers=1)), 1),
        (types.SimpleNamespace(n_layers=0, cfg=types.SimpleNamespace(n_layers=0)), None),
        (types.SimpleNamespace(n_layers="4"), None),
    ],
)
def test_the_layer_count_is_read_from_the_names_models_give_it(made, layers):
    from remat_kit.sources._factory import _layer_attr

    assert _layer_attr(made) == layers


def test_a_layer_plan_on_a_patched_stack_maps_each_layer_to_its_policy():
    src = sources.from_factory(UNTAGGED_BY_NAME, block=BLOCK)
    got = src._per_layer(rk.policy("dots"), rk.parse_schedule("layers:1=full,3=minimal"))
    assert [p.name for p in got] == ["dots", "full", "dots", "minimal"]
    got = src._per_layer(rk.policy("dots"), rk.parse_schedule("layers:0-1=full,rest=minimal"))
    assert [p.name for p in got] == ["full", "full", "minimal", "minimal"]


def test_a_layer_plan_on_a_patched_stack_keeps_what_each_layer_s_policy_keeps():
    """Traced: layer 1 recomputes everything (full), layer 3 keeps q/k/v only; layers 0 and 2
    run the model's policy, which keeps their own mixer. Which mixer is kept says which block
    got which policy."""
    src = sources.from_factory(UNTAGGED_BY_NAME, block=BLOCK)
    res = sources.residuals(
        src, "names:save=layers_*/mixer", "cpu", SMALL, "layers:1=full,3=qkv_proj"
    )
    saved = {t for t, d in res.tags.items() if d == "saved"}
    assert saved == {"layers_0/mixer", "layers_2/mixer", "query_proj", "key_proj", "value_proj"}


@pytest.mark.slow
def test_untagged_model_is_tagged_and_a_model_with_tags_keeps_its_own():
    untagged = sources.residuals(
        sources.from_factory(f"{FACTORIES}:untagged"), "minimal", "cpu", SMALL
    )
    assert untagged.tags["query_proj"] == "saved"
    assert untagged.tags["layers_0/mixer"] == "recomputed"
    preset = sources.residuals(sources.from_factory(f"{FACTORIES}:preset"), "minimal", "cpu", SMALL)
    # No path tags added; the preset is dense (no expert or router tags).
    assert set(preset.tags) == set(rk.names.VOCABULARY) - {"mlpwi", *rk.names.MOE_NAMES}


def test_nnx_factory_is_built_abstractly_and_tagged():
    src = sources.from_factory(f"{FACTORIES}:nnx_model")
    # flax words its deprecations at its own line (stacklevel 1), where pyproject.toml's
    # filters for MaxText's uses would hide ours too: our NNX path calls none of them.
    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=DeprecationWarning, module=r"flax\.")
        built = src.build("minimal")
    assert built.kind == "nnx"
    report = sources.residuals(src, "minimal", "cpu", SMALL)
    assert report.tags["query_proj"] == "saved" and report.tags["mlpwi_1"] == "saved"
    full = sources.residuals(src, "full", "cpu", SMALL)
    assert full.tags["query_proj"] == "recomputed"


@pytest.mark.parametrize(
    ("name", "policies", "match"),
    [
        ("ignores_policy", ["full"], r"'full' holds no checkpoint with it; it has no checkpoint"),
        (
            "always_full",
            ["full", "minimal"],
            r"'minimal' holds no checkpoint.*other policies \(full",
        ),
        ("always_full", ["none"], r"'none' holds checkpoints with full"),
        ("cached", ["full", "dots"], r"'dots' holds no checkpoint.*other policies \(full"),
    ],
)
def test_stale_or_ignored_traces_fail_loudly(name, policies, match):
    src = sources.from_factory(f"{FACTORIES}:{name}", tags=None)
    *first, last = policies
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RematWarning)
        for p in first:
            checks.check_traced_with(_forward(src, p), p)
        with pytest.raises(BadValue, match=match):
            checks.check_traced_with(_forward(src, last), last)


def test_a_factory_model_that_ignores_its_policy_is_refused_naming_the_step_measured():
    """Measured through a source, the refusal names what was measured, the model and its
    batch and sequence, not "the model" (seed-96 mutant _source.py:349, ``what=what`` left
    out, lived)."""
    src = sources.from_factory(f"{FACTORIES}:ignores_policy", tags=None)
    named = f"{src.spec} (b{SMALL.batch} s{SMALL.seq}) traced for policy 'full' holds no"
    with pytest.raises(BadValue, match=re.escape(named)):
        sources.measure(src, "full", "cpu", SMALL, warn=False)


#: The names MaxText's decoders save under remat_policy="minimal" (``minimal_policy()``).
MAXTEXT_MINIMAL = ("query_proj", "value_proj", "key_proj", "qkv_proj", "out_proj", "mlpwi_0")
MAXTEXT_MINIMAL += ("mlpwi_1", "mlpwi", "mlpwo")


def _mlp_block(x):
    # A block in MaxText's words: its projections tagged with the names MaxText uses.
    from jax.ad_checkpoint import checkpoint_name

    h = checkpoint_name(x @ x, "mlpwi")
    return checkpoint_name(jnp.tanh(h) @ x, "mlpwo").sum()


@pytest.mark.parametrize(
    ("asked", "own"),
    [
        ("full", None),  # MaxText's remat_policy="full": jax.checkpoint with no policy
        ("full", jax.checkpoint_policies.nothing_saveable),
        # MaxText's "minimal" (its decoders' minimal_policy()): the same names as ours
        ("minimal", jax.checkpoint_policies.save_only_these_names(*MAXTEXT_MINIMAL)),
    ],
    ids=["full-no-policy", "full-nothing-saveable", "minimal-maxtext-names"],
)
def test_a_librarys_own_equivalent_remat_is_the_policy_asked_for(asked, own):
    # A library applies its own remat in its own words; where its policy decides alike on
    # every operation of the checkpoint, the program is the one the policy makes.
    closed = jax.make_jaxpr(jax.checkpoint(_mlp_block, policy=own))(jnp.ones((4, 4)))
    assert checks.check_traced_with(closed, asked).policy == asked


def test_a_librarys_own_remat_that_decides_otherwise_is_named_with_the_difference():
    own = jax.checkpoint_policies.save_only_these_names("mlpwi")
    closed = jax.make_jaxpr(jax.checkpoint(_mlp_block, policy=own))(jnp.ones((4, 4)))
    with pytest.raises(BadValue) as caught:
        checks.check_traced_with(closed, "minimal")
    message = str(caught.value)
    assert "'minimal' holds no checkpoint with it" in message
    assert "other policies (save_only_these_names), which decide otherwise" in message
    # the first operation decided otherwise: the value tagged mlpwo, kept by minimal only
    assert "the value tagged 'mlpwo' is recomputed there, saved under 'minimal'" in message
    assert "jit" not in message  # no cache to blame: the model applied its own policy


def test_a_checkpoint_handed_none_itself_is_no_remat():
    # A user's step that wraps its block with whatever policy it gets: under "none" its
    # checkpoint carries the none Policy, which saves everything (no remat at all).
    f = lambda x: jnp.sin(jnp.sin(x)).sum()
    under = {
        p: jax.make_jaxpr(jax.checkpoint(f, policy=rk.policy(p)))(1.0) for p in ("none", "full")
    }
    checks.check_traced_with(under["none"], "none")
    with pytest.raises(BadValue, match=r"'none' holds checkpoints with full"):
        checks.check_traced_with(under["full"], "none")


def test_identical_trace_for_another_policy_fails():
    # One program reported under two policies: the second report would be stale.
    closed = _forward(sources.from_factory(f"{FACTORIES}:preset"), "none")
    first = checks.check_traced_with(closed, "none")
    assert checks.check_traced_with(closed, "none", previous=first) == first  # same policy
    earlier = dataclasses.replace(first, policy="dots_no_batch")
    with pytest.raises(BadValue, match=r"policy 'none' is identical to .* for 'dots_no_batch'"):
        checks.check_traced_with(closed, "none", previous=earlier)


def _forward(src, policy):
    step = src.build(policy).train_step(SMALL)
    return jax.make_jaxpr(step.loss_fn)(*step.loss_args)


def test_fresh_traces_pass_with_their_schedule_policies():
    src = sources.from_factory(f"{FACTORIES}:preset")
    prev = None
    for pol, sch in [("minimal", "none"), ("none", "every:2"), ("dots", "layers:0-1=full")]:
        step = src.build(pol, sch).train_step(SMALL)
        closed = jax.make_jaxpr(step.loss_fn)(*step.loss_args)
        prev = checks.check_traced_with(
            closed,
            pol,
            also=sources._source._schedule_policies(rk.parse_schedule(sch)),
            previous=prev,
        )


# --- policies that match nothing ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "tags", "unmatched"),
    [
        ("minimal", ["context"], True),
        ("minimal", ["mlpwo"], False),
        ("names:save=layers_*/mixer", ["layers_3/mixer"], False),
        ("names:save=layers_*/mixer", ["mixer"], True),
        ("full", [], False),  # not a name-based policy
        ("none", [], False),
        ("offload:offload=context", ["query_proj"], True),
        # Several tags: unmatched only when *none* is kept (one kept is enough to act), so
        # "any tag unkept" and "every tag unkept" answer differently here.
        ("minimal", ["context", "mlpwo", "attn_out"], False),
        ("minimal", ["attn_out", "context"], True),
        ("names:save=layers_*/mixer", ["mixer", "layers_3/mixer"], False),
        ("offload:offload=context", ["query_proj", "context"], False),
        ("minimal", [], True),  # a model with no tags at all: the name policy acts on nothing
        ("full", ["context", "mlpwo"], False),
    ],
)
def test_unmatched_policy(policy, tags, unmatched):
    assert checks.unmatched_policy(policy, tags) is unmatched


def test_check_policy_matches_warns_or_raises_listing_the_tags():
    with pytest.warns(RematWarning, match=r"'context' names context but m tags none.*: a, b$"):
        checks.check_policy_matches("context", ["b", "a"], where="m")
    with pytest.raises(BadValue, match=r"tags there: none \(tag the model"):
        checks.check_policy_matches("context", [], strict=True)


def test_library_residuals_warn_on_a_model_without_tags():
    src = sources.from_factory(f"{FACTORIES}:untagged", tags=None)
    with pytest.warns(RematWarning, match=r"'minimal' names .* tags none of them"):
        sources.residuals(src, "minimal", "cpu", SMALL)


def test_cli_refuses_a_policy_that_matches_no_tag_before_compiling(capsys):
    argv = ["report", "--model", f"{FACTORIES}:untagged", "--tags", "none", "--target", "h100"]
    code = main([*argv, "--policy", "minimal", "--batch", "1", "--seq", "16"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "'minimal' names query_proj" in err[0] and "tags there: none" in err[0]


# --- a model that tags itself with its own names -----------------------------------------------

OWN = f"{FACTORIES}:own_names"  # EasyDeL's names on an NNX model
EASYDEL_MINIMAL = "attn_query+attn_key+attn_value+attn_output+mlp_gate+mlp_up+mlp_down"


@pytest.mark.slow
def test_a_self_tagged_models_names_and_ours_both_reach_the_trace():
    there = sources.tags(sources.from_factory(OWN), SMALL, "h100")
    assert {"attn_query", "query_proj", "mlp_gate", "mlpwi_0", "layer_output", "block_out"} <= set(
        there
    )
    assert "residual" in there and "attn_out" not in there  # no counterpart: its own name only
    assert sources.tags(sources.from_factory(OWN, tags=None), SMALL, "h100") == tuple(
        sorted(set(there) - set(rk.names.VOCABULARY))
    )
    # Asked for by name, the alias set alone: no projection is tagged by path.
    assert sources.tags(sources.from_factory(OWN, tags="easydel"), SMALL, "h100") == there


@pytest.mark.slow
def test_our_catalogue_policy_on_a_models_own_names_is_that_policy_in_its_names():
    t = rk.target("h100")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the model's own names are not ours
        ours = sources.measure(sources.from_factory(OWN), "minimal", t, SMALL)
        theirs = sources.measure(
            sources.from_factory(OWN, tags=None), f"names:save={EASYDEL_MINIMAL}", t, SMALL
        )
        full = sources.measure(sources.from_factory(OWN), "full", t, SMALL)
    assert ours.peak_bytes == theirs.peak_bytes
    assert ours.peak_bytes != full.peak_bytes


@pytest.mark.slow
def test_the_planner_decides_once_per_value_of_a_model_that_names_it_twice(monkeypatch):
    # With ours beside its own names every projection has two tags: the plan (and its cost)
    # must be the one the model gets under its own names alone, not a plan that pays for a
    # value twice or thinks it recomputed while its other name keeps it.
    config = rk.TrainConfig(batch=2, seq=128, optimizer="sgd")
    # Two of its blocks, not four: the planner traces each candidate (a factory's reports
    # are not remembered on disk, so no other test reads these).
    blocks = sources.from_factory(OWN).factory.__globals__["nnx_blocks"]
    monkeypatch.setattr(blocks, "LAYERS", 2)
    plans = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for tags in ("auto", None):
            w = sources.workload(sources.from_factory(OWN, tags=tags), "h100", config)
            none, full = (w.report(p, batch=2).peak_bytes for p in ("none", "full"))
            budget = none - (none - full) // 5
            plans.append(rk.plan(w, 2, budget=budget, host_budget=0, objective="flops"))
    aliased, own = plans
    assert own.fits and own.policy.spec != "full"
    assert aliased.policy.spec == own.policy.spec
    assert aliased.peak_bytes == own.peak_bytes


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "policy", "code", "message"),
    [
        (OWN, "names:save=mlp_gate+mlp_up+mlp_down", 0, None),
        (OWN, "names:save=mlp_gate+mlp_up+mlpwo", 0, None),  # theirs and ours together
        (OWN, "names:save=mlp_gate+mlp_gat", 2, r"names 'mlp_gat' \(did you mean 'mlp_gate'\?\)"),
        (OWN, "names:save=context", 2, r"names context but .* tags none"),
        ("tiny-llama", "names:save=mlp_gate", 2, r"'mlp_gate' .*is not a tag the models use"),
    ],
)
def test_cli_takes_a_models_own_names_and_refuses_a_typo_of_them(
    capsys, model, policy, code, message
):
    argv = ["report", "--model", model, "--target", "h100", "--batch", "1", "--seq", "16"]
    assert main([*argv, "--policy", policy, "--optimizer", "sgd"]) == code
    err = capsys.readouterr().err.strip().splitlines()
    if message is None:
        assert not err
    else:
        assert len(err) == 1 and re.search(message, err[0]), err


# --- what importing the user's code set in the environment -------------------------------------

ENV_FACTORY = f"{DATA / 'env_factories.py'}:tiny"
FRACTION_VARS = ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION")


@pytest.fixture
def clean_env(monkeypatch):
    # The factory's import writes the process environment: monkeypatch puts it back.
    for name in (*FRACTION_VARS, "XLA_PYTHON_CLIENT_PREALLOCATE", "ENVLIB_FRACTION"):
        monkeypatch.setenv(name, "")  # recorded, so that teardown restores it
        monkeypatch.delenv(name)
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))  # restored at teardown
    rk.sources._kinds._loaded.cache_clear()  # a new load imports the library again
    yield monkeypatch
    rk.sources._kinds._loaded.cache_clear()


def test_a_factory_source_records_what_its_import_set_and_who(clean_env):
    src = sources.from_factory(ENV_FACTORY)
    assert [(e.name, e.value, e.by) for e in src.env_at_import] == [
        ("XLA_PYTHON_CLIENT_MEM_FRACTION", "1.0", "envlib"),
        ("XLA_PYTHON_CLIENT_PREALLOCATE", "false", "envlib"),
    ]
    import os

    assert os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "1.0"  # set, as in the user's process
    assert type(os.environ).__name__ == "_Environ"  # the recorder is gone
    assert sources.from_factory(f"{FACTORIES}:untagged").env_at_import == ()


def test_what_an_import_set_is_no_part_of_the_sources_identity(clean_env):
    """The same factory loaded again finds its module imported and records nothing: still the
    same source, equal and of the same hash (seed-67 mutant _source.py:134, compared)."""
    src = sources.from_factory(ENV_FACTORY)
    again = dataclasses.replace(src, env_at_import=())
    assert src.env_at_import and again == src and hash(again) == hash(src)


# What an imported library may read of os.environ while its import is recorded, and the
# same read of the real environment, taken before the recorder went in.
ENV_READS = {
    "len": len,
    "truth": bool,  # `if os.environ:` asks the length (a Mapping has no __bool__)
    "names": sorted,
    "contains": lambda env: ("ENVREAD_SET" in env, "ENVREAD_UNSET" in env),
    "item": lambda env: env["ENVREAD_SET"],
    "get": lambda env: (env.get("ENVREAD_SET"), env.get("ENVREAD_UNSET", "default")),
    "copy": dict,
}


@pytest.mark.parametrize("read", ENV_READS.values(), ids=ENV_READS)
def test_a_library_reads_the_recorded_environment_as_the_real_one(monkeypatch, read):
    # The recorder stands in for os.environ during the import: a library that counts,
    # lists or tests it at import must see what it would see unwatched.
    monkeypatch.setenv("ENVREAD_SET", "1")
    monkeypatch.delenv("ENVREAD_UNSET", raising=False)
    real = dict(os.environ)
    with sources._environ.recording_environ() as sets:
        assert type(os.environ).__name__ == "_Recorder"  # the reads go through the recorder
        got = read(os.environ)
    assert got == read(real)
    assert sets == []  # reading writes nothing


def test_cli_names_the_library_that_set_a_fraction_no_process_can_use(clean_env, capsys):
    argv = ["report", "--model", ENV_FACTORY, "--policy", "none", "--target", "h100", "--seq", "8"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=1.0, set by envlib at import" in err[0]
    assert "use at most 0.99" in err[0] and "--mem-fraction" in err[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("set_by_import", "flag", "fraction", "source"),
    [
        ("0.9", None, 0.9, "XLA_PYTHON_CLIENT_MEM_FRACTION=0.9, set by envlib at import"),
        ("1.0", "0.8", 0.8, "--mem-fraction"),  # the flag wins over what the import set
    ],
)
def test_cli_reports_at_the_fraction_the_import_set_unless_given_one(
    clean_env, tmp_path, capsys, set_by_import, flag, fraction, source
):
    clean_env.setenv("ENVLIB_FRACTION", set_by_import)
    out = tmp_path / "r.json"
    argv = ["report", "--model", ENV_FACTORY, "--policy", "none", "--target", "h100"]
    argv += ["--seq", "8", "--json", str(out)] + (["--mem-fraction", flag] if flag else [])
    assert main(argv) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert f"allocator fraction {fraction:g}, {source}" in shown
    report = json.loads(out.read_text())
    assert report["mem_fraction"] == fraction
    card = rk.target("h100", mem_fraction=0.75).memory_bytes  # the environment says 1.0 now
    assert report["usable_bytes"] == math.floor(fraction * card)


@pytest.mark.slow
def test_cli_says_which_xla_flags_an_import_set(clean_env, capsys, tmp_path):
    clean_env.setenv("ENVLIB_FRACTION", "0.9")
    # the user's own flag, before the import: not the import's
    clean_env.setenv("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true")
    # Flags this XLA knows (an unknown one is fatal as the process's first backend starts,
    # which is after the import when this test runs first) that change no figure and write
    # nothing: the second is XLA's default (and autotuning is off without a card).
    flags = (
        "--xla_gpu_force_compilation_parallelism=1 "
        "--xla_gpu_filter_kernels_spilling_registers_on_autotuning=true"
    )
    clean_env.setenv("ENVLIB_XLA_FLAGS", flags)
    out = tmp_path / "r.json"
    argv = ["report", "--model", ENV_FACTORY, "--policy", "none", "--target", "h100", "--seq", "8"]
    assert main([*argv, "--json", str(out)]) == 0
    shown = "".join(capsys.readouterr().out.split())  # the console wraps long words too
    said = f"note: XLA_FLAGS set by envlib at import (2 flags: {flags}): these programs were "
    assert "".join(said.split()) in shown
    env = {e["name"]: e for e in json.loads(out.read_text())["meta"]["env_at_import"]}
    assert env["XLA_FLAGS"]["by"] == "envlib" and env["XLA_FLAGS"]["added"] == flags.split()
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"]["value"] == "0.9"


@pytest.mark.slow
def test_flags_an_import_sets_reach_the_compiles_of_a_fresh_process(tmp_path):
    # XLA reads XLA_FLAGS once, when it first compiles: the CLI imports the factory before
    # that, so the note above holds (a dump directory the import names fills up).
    dump = tmp_path / "dump"
    env = {**os.environ, "ENVLIB_FRACTION": "0.9", "ENVLIB_XLA_FLAGS": f"--xla_dump_to={dump}"}
    argv = ["report", "--model", ENV_FACTORY, "--policy", "none", "--target", "h100"]
    argv += ["--seq", "8", "--no-cache", "--no-residuals"]
    done = subprocess.run(
        [sys.executable, "-m", "remat_kit.cli", *argv], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert any(p.name.endswith("gpu_after_optimizations.txt") for p in dump.iterdir())


# --- --block on an NNX model, whose blocks are built before any trace ----------------------------

NNX_BLOCK = "nnx_blocks:PlainBlock"


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["none", "full", "dots_no_batch"])
def test_block_patches_an_nnx_model_as_its_own_remat_would(policy):
    patched = sources.from_factory(f"{FACTORIES}:nnx_plain", block=NNX_BLOCK)
    native = sources.from_factory(f"{FACTORIES}:nnx_native")
    config = rk.TrainConfig(batch=2, seq=64)
    got = sources.measure(patched, policy, "h100", config).peak_bytes
    assert got == sources.measure(native, policy, "h100", config).peak_bytes


@pytest.mark.slow
def test_a_per_layer_plan_on_a_patched_nnx_model_counts_its_blocks():
    src = sources.from_factory(f"{FACTORIES}:nnx_plain", block=NNX_BLOCK)
    config = rk.TrainConfig(batch=2, seq=64)
    assert src.n_layers() == 4
    half = sources.measure(src, "full", "h100", config, schedule="layers:0-1=full,rest=none")
    every = sources.measure(src, "full", "h100", config, schedule="layers:0-3=full")
    full, none = (sources.measure(src, p, "h100", config) for p in ("full", "none"))
    # Two of four layers checkpointed: strictly between all four and none.
    assert every.peak_bytes == full.peak_bytes < half.peak_bytes < none.peak_bytes


@pytest.mark.slow
def test_a_patched_stack_built_in_setup_counts_each_named_layer_once():
    # flax runs a setup again per clone (nn.jit's trace, init, apply): gemma's 6 layers were
    # counted 18, and a per-layer plan handed the later builds the plan's last policy.
    src = sources.from_factory(f"{FACTORIES}:jitted_setup", block="jit_blocks:Block")
    assert src.n_layers() == 4
    config = rk.TrainConfig(batch=2, seq=64)
    half = sources.measure(src, "full", "h100", config, schedule="layers:0-1=full,rest=none")
    full, none = (sources.measure(src, p, "h100", config) for p in ("full", "none"))
    assert full.peak_bytes < half.peak_bytes < none.peak_bytes


@pytest.mark.slow
def test_block_patches_a_model_whose_call_is_nn_jitted():
    # gemma's Transformer.__call__ is wrapped in nn.jit, which replays the trace it cached for
    # the module: every policy after the first got the first one's program.
    patched = sources.from_factory(f"{FACTORIES}:jitted_plain", block="jit_blocks:Block")
    native = sources.from_factory(f"{FACTORIES}:jitted_native")
    config = rk.TrainConfig(batch=2, seq=64)
    for policy in ("none", "full"):  # the second policy is where the replay showed
        got = sources.measure(patched, policy, "h100", config).peak_bytes
        assert got == sources.measure(native, policy, "h100", config).peak_bytes, policy


def test_a_block_the_model_does_not_take_from_the_patched_module_is_named():
    src = sources.from_factory(f"{FACTORIES}:nnx_captured", block=NNX_BLOCK)
    with pytest.raises(BadValue, match=r"nnx_blocks:PlainBlock was patched .* takes the class"):
        sources.measure(src, "full", "h100", SMALL)


# --- a factory's step over several GPUs: data parallel, weights split by shape ------------------


@pytest.mark.slow
def test_fsdp_splits_a_factorys_weights_and_batch_over_the_gpus():
    # The parameters carry no axis names: each is split along its largest dimension fsdp
    # divides (every one of this model's does), so a device holds half of each part.
    config = rk.TrainConfig(batch=8, seq=256)
    deep = sources.from_factory(f"{FACTORIES}:deep").factory

    def two_layers(policy):  # deep's layers, two of them: half the compile time of 8
        return deep(policy, layers=2)

    # One GPU's step compiled whole, as the sharded one is.
    one = sources.measure(sources.from_factory(two_layers), "full", "h100", config)
    src = sources.from_factory(two_layers, shard="fsdp:2")
    two = sources.measure(src, "full", rk.target("h100", devices=2), config)
    for part in ("weights", "gradients", "optimizer", "batch"):
        assert two.breakdown[part] * 2 == pytest.approx(one.breakdown[part], abs=8), part
    assert two.peak_bytes < one.peak_bytes
    assert src.label(config, rk.target("h100", devices=2)).endswith("fsdp:2")


@pytest.mark.parametrize(
    ("shard", "code", "message"),
    [
        pytest.param("fsdp:2", 0, None, marks=pytest.mark.slow),  # compiles; the rest refuse
        ("tp:2", 2, r"--shard tp:2: .*: tp:2 splits tensors by what they mean.*dp and fsdp"),
        ("fsdp:1,cp:2", 2, r"cp:2 splits tensors by what they mean"),
    ],
)
def test_cli_shards_a_factory_data_parallel_only(capsys, shard, code, message):
    argv = ["report", "--model", f"{FACTORIES}:untagged", "--target", "h100", "--gpus", "2"]
    assert main([*argv, "--shard", shard, "--batch", "2", "--seq", "16"]) == code
    err = capsys.readouterr().err.strip().splitlines()
    if message is None:
        assert not err
    else:
        assert len(err) == 1 and re.search(message, err[0]), err


def _recording(seen, default):
    deep = sources.from_factory(f"{FACTORIES}:deep").factory

    def needs_target(policy, target, layers=2):
        seen.append(target)
        return deep(policy, layers)

    def target_optional(policy, layers=2, target=None):
        seen.append(target)
        return deep(policy, layers)

    return target_optional if default else needs_target


@pytest.mark.parametrize("default", [False, True])
def test_a_factory_that_takes_target_gets_the_one_compiled_for(default):
    seen = []
    src = sources.from_factory(_recording(seen, default))
    assert src.takes_target
    h100 = rk.target("h100", devices=2)
    src.build_step(rk.as_policy("full"), rk.parse_schedule("none"), rk.TrainConfig(2, 16), h100)
    # The model the step is built from gets it; the traces of its structure (its own tags,
    # its layers) get the default or the host's.
    assert [t for t in seen if t not in (None, rk.target("cpu"))] == [h100]
    seen.clear()
    # A trace of the structure only, with no target compiled for: the factory's default,
    # else the host's.
    src.at_depth(3).n_layers()
    assert seen == ([None] if default else [rk.target("cpu")])


def test_a_factory_that_takes_kwargs_is_not_handed_a_target():
    deep = sources.from_factory(f"{FACTORIES}:deep").factory
    # **kwargs takes a schedule (it is handed one), but it does not say it understands a
    # target: handed one, ``deep`` would fail.
    src = sources.from_factory(
        lambda policy, **kwargs: deep(
            policy, **{k: v for k, v in kwargs.items() if k != "schedule"}
        )
    )
    assert not src.takes_target
    assert src.build_step(
        rk.as_policy("none"), rk.parse_schedule("none"), rk.TrainConfig(1, 8), rk.target("h100")
    )


@pytest.mark.slow
def test_cli_builds_a_factory_on_the_devices_it_compiles_for(capsys):
    # The factory's mesh is the target's (EasyDeL's habit): two H100s, not the host's CPU.
    argv = ["report", "--model", f"{FACTORIES}:meshed", "--target", "h100", "--gpus", "2"]
    assert main([*argv, "--shard", "dp:2", "--batch", "4", "--seq", "16"]) == 0
    assert not capsys.readouterr().err


def test_cli_says_in_one_line_where_a_models_own_code_fails(capsys):
    argv = ["report", "--model", f"{FACTORIES}:fails_past_one_row", "--batch", "2", "--seq", "8"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"remat-kit: {FACTORIES}:fails_past_one_row (b2 s8): the model failed as its train "
        "step was traced: ValueError: Resource axis: dp is not found in mesh: ('fsdp',)."
    ]


@pytest.mark.slow
def test_cli_plan_tells_a_factory_how_to_use_the_plan(capsys):
    # A factory is handed its policy: remat_kit_models.get_config is for presets only.
    argv = ["plan", "--model", f"{FACTORIES}:untagged", "--budget", "20GiB", "--policies"]
    assert main([*argv, "none,full", "--batch", "1", "--seq", "16", "--target", "h100"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert (
        "use it: --policy 'none', or in code: hand your model rk.policy('none') as its policy"
        in shown
    )
    assert "get_config" not in shown


@pytest.mark.slow
def test_cli_layers_builds_a_factory_that_names_layers_at_that_depth(tmp_path):
    def params_and_layers(n):
        out = tmp_path / f"{n}.json"
        argv = ["report", "--model", f"{FACTORIES}:deep", "--layers", str(n), "--batch", "1"]
        assert main([*argv, "--seq", "16", "--no-residuals", "--json", str(out)]) == 0
        meta = json.loads(out.read_text())["meta"]
        return meta["params"], meta["layers"], meta["model"]

    # Two shallow depths of the stack (3 and 5 compiled more for the same check).
    (p2, l2, name), (p3, l3, _) = params_and_layers(2), params_and_layers(3)
    assert (l2, l3) == (2, 3) and name == f"{FACTORIES}:deep"
    # One more block, counted from the block itself.
    block = importlib.import_module("tests.data.factories")._Block()
    shapes = jax.eval_shape(block.init, jax.random.key(0), jnp.zeros((1, 4, 64)))
    assert p3 - p2 == sum(x.size for x in jax.tree.leaves(shapes))


def test_cli_layers_on_a_factory_of_one_depth_says_so(capsys):
    argv = ["report", "--model", f"{FACTORIES}:untagged", "--layers", "3", "--batch", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "remat-kit: --layers 3: the factory" in err and "takes no layers= argument" in err


def test_cli_refuses_options_a_factory_does_not_take(capsys):
    argv = ["report", "--model", f"{FACTORIES}:untagged", "--lora", "8", "--dropout", "0.1"]
    assert main([*argv, "--batch", "1"]) == 2
    # One line names every flag the factory kind's spec has no field for, and those it takes.
    err = capsys.readouterr().err
    assert err.startswith(f"remat-kit: --lora, --dropout with --model {FACTORIES}:untagged: ")
    assert "a factory source takes --block, --tags, --optimizer" in err
    assert err.count("\n") == 1


def test_cli_needs_exactly_one_model(capsys):
    hf = str(DATA / "hf" / "llama3-8b.json")
    assert main(["report", "--model", "tiny-llama", "--hf-config", hf]) == 2
    assert "give the model once" in capsys.readouterr().err


# --- compiled reports --------------------------------------------------------------------------


@pytest.mark.slow
def test_factory_report_equals_the_preset_report():
    # Our preset through the factory door is the same program as through its preset spec.
    t = rk.target("h100")
    spec = PresetSpec("tiny-llama", attention="xla")
    src = sources.from_factory(f"{FACTORIES}:preset")
    config = rk.TrainConfig(batch=2, seq=64, precision="f32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RematWarning)
        via_factory = sources.measure(src, "minimal", t, config)
        via_preset = sources.measure(sources.resolve(spec), "minimal", t, config, warn=False)
    assert via_factory.peak_bytes == via_preset.peak_bytes
    assert via_factory.meta["params"] == model_config(spec, config, "none", t).param_count()
    assert via_factory.meta["precision"]["compute"] == "module's own"


@dataclasses.dataclass(frozen=True)
class _Run:
    """What a table's title reads of a run (``rk.render.RunOptions``)."""

    model: str
    batch: int
    seq: int
    optimizer: str
    lora: int
    accum: int
    record: dict | None
    shard: str | None = None

    def precision_record(self):
        return self.record


@pytest.mark.parametrize(
    ("model", "lora", "compute", "frozen"),
    [
        (f"{FACTORIES}:untagged", 0, "module's own", "-"),
        ("tiny-llama", 0, "bfloat16", "-"),
        ("tiny-llama", 4, "bfloat16", "bfloat16"),
    ],
)
def test_search_titles_name_the_compute_dtype_the_step_really_has(model, lora, compute, frozen):
    """fit, plan and advise titles say what report says: a factory computes in its own dtypes."""
    spec = sources.FactorySpec(model) if ":" in model else PresetSpec(model, lora=lora)
    src = sources.resolve(spec)
    config = rk.TrainConfig(batch=2, seq=16, lora=lora > 0, precision=rk.train.regime())
    record = rk.train.planned_precision(config, own_compute=src.own_model)
    assert record["compute"] == compute and record["frozen"] == frozen
    fit = rk.search.Fit(
        "batch",
        policy="full",
        schedule="none",
        batch=1,
        seq=16,
        unit=1,
        peak_bytes=1,
        next_peak_bytes=2,
        limit_bytes=2**30,
        recompute_overhead=0.0,
        compiles=1,
        seconds=1.0,
    )
    row = rk.render.FitRow("full", fit)
    run = _Run(src.spec, config.batch, config.seq, config.optimizer, lora, config.accum, record)
    table = rk.render.fit_table(
        [row], rk.target("h100"), run, headroom=0.0, compiles=1, seconds=1.0
    )
    words = {"bfloat16": "bf16"}.get(compute, compute)
    assert f"compute {words}" in str(table.title)


def test_workload_leaves_out_schedules_the_factory_cannot_build():
    w = sources.workload(f"{FACTORIES}:untagged", "h100", SMALL)
    assert w.supports("none") and not w.supports("sqrt") and not w.supports("layers:0-1=full")
    assert not w.supports("layers")  # a bare kind, as the planner asks
    assert w.n_layers == 1
    w2 = sources.workload(f"{FACTORIES}:preset", "h100", SMALL)
    assert w2.supports("nested:2") and w2.supports("layers") and w2.n_layers == 4


def test_residuals_of_an_hf_config_match_the_preset_it_equals():
    # llama3-8b.json at tiny overrides is the llama3-8b preset at the same overrides.
    small = dict(layers=2, width=64, heads=4, kv_heads=2, ff=128, vocab=256)
    t = rk.target("cpu")
    hf = HFSpec(str(DATA / "hf" / "llama3-8b.json"), label="x", attention="xla")
    hf = dataclasses.replace(hf, overrides=tuple(small.items()))
    preset = PresetSpec("llama3-8b", attention="xla", overrides=hf.overrides)
    config = rk.TrainConfig(1, 32)
    a, b = (sources.residuals(sources.resolve(s), "minimal", t, config) for s in (hf, preset))
    assert a.tag_bytes == b.tag_bytes and a.tags == b.tags


# --- offload that did not happen, and a breakdown that cannot be negative ------------------------


@functools.cache
def _compiled() -> rk.MemoryReport:
    x = jax.ShapeDtypeStruct((4, 4), jnp.float32)
    return rk.memory_report(lambda a: a * 2, x, target="cpu", warn=False)


def _report(peak: int = 10 * 2**30, host_temp: int = 0) -> rk.MemoryReport:
    # A real report with the figures under test set: the check reads only these fields.
    return _compiled().replace(
        peak_bytes=peak, host_bytes=host_temp, host_temp_bytes=host_temp, notes=()
    )


@pytest.mark.parametrize(
    ("moved_gib", "marked_gib", "warned"),
    [
        (0.3, 10.0, True),
        (0.0, 10.0, True),
        (4.9, 10.0, True),
        (6.0, 10.0, True),
        (10.0, 10.0, False),
        (0, 0, False),
    ],
)
def test_offload_shortfall_reports_both_figures(moved_gib, marked_gib, warned):
    note = checks.offload_shortfall(
        _report(host_temp=int(moved_gib * 2**30)), int(marked_gib * 2**30)
    )
    assert (note is not None) is warned
    if warned:
        note = words(note)
        pct = round(100 * moved_gib / marked_gib)
        moved, marked = int(moved_gib * 2**30), int(marked_gib * 2**30)
        assert f"moved {size_words(moved)} to host of the {size_words(marked)}" in note
        assert f"({pct}%)" in note and "offload needs scanned layers" in note


def test_breakdown_activations_never_negative():
    gib = 2**30
    step = rk.train.TrainStep(
        fn=None,
        args=(),
        donate_argnums=(),
        loss_fn=None,
        loss_args=(),
        breakdown={
            "weights": 4 * gib,
            "trainable": 4 * gib,
            "gradients": 4 * gib,
            "optimizer": 8 * gib,
            "batch": 0,
            "grad_accumulator": 0,
        },
    )
    under = add_breakdown(_report(peak=13 * gib), step)  # 16 GiB known > 13 GiB peak
    assert under.breakdown["activations"] == 0
    assert "below weights + gradients + optimizer state + batch (16.00 GiB)" in under.warnings[-1]
    over = add_breakdown(_report(peak=20 * gib), step)
    assert over.breakdown["activations"] == 4 * gib and over.warnings == ()


def test_hf_config_refuses_sliding_layers():
    fields = json.loads((DATA / "hf" / "qwen2-7b.json").read_text())
    fields["layer_types"] = ["full_attention", "sliding_attention"]
    with pytest.raises(BadValue, match=r"layer_types=\['full_attention', 'sliding_attention'\]"):
        models.hf.from_hf_config(fields)
    fields["layer_types"] = ["full_attention"] * 28
    assert models.hf.from_hf_config(fields).n_layers == 28


@pytest.mark.slow
def test_cli_report_from_an_hf_config(capsys, tmp_path):
    out = tmp_path / "r.json"
    small = ["--layers", "1", "--width", "64", "--heads", "4", "--kv-heads", "2", "--ff", "128"]
    argv = ["report", "--hf-config", str(DATA / "hf" / "qwen2-7b.json"), *small, "--vocab", "256"]
    argv += ["--seq", "32", "--batch", "1", "--target", "h100", "--no-residuals"]
    assert main([*argv, "--json", str(out)]) == 0
    # the title names the sizes the flags changed, as the JSON's model does
    named = "qwen2-7b (layers=1 width=64 heads=4 kv_heads=2 ff=128 vocab=256)"
    assert f"{named} b1 s32" in capsys.readouterr().out
    meta = json.loads(out.read_text())["meta"]
    assert meta["model"] == named
    # embed + head (2 x 256 x 64) + one layer with q/k/v biases + final norm, by hand:
    layer = 64 * 64 * 2 + 2 * 64 * 32 + (64 + 2 * 32) + 3 * 64 * 128 + 2 * 64
    assert meta["params"] == 2 * 256 * 64 + layer + 64


def test_a_source_made_by_hand_builds_only_what_its_factory_takes():
    """``ModelSource(spec, factory)`` with nothing else said: the factory is called with the
    policy alone, so a layer schedule is refused in one line before any trace."""

    def mine(policy):
        return nn.Dense(4)

    src = sources.ModelSource("mine", mine)
    assert src.schedule_kinds == frozenset({"none"})
    with pytest.raises(BadValue, match="every:2"):
        src.check_schedule("every:2")


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["full"])
def test_a_model_that_trains_with_dropout_is_given_its_stream(policy):
    # flax's lm1b habit: a linen model whose apply asks for a "dropout" stream (without one,
    # flax's InvalidRngError). Its step is given one, as a training loop gives it, and
    # draws its masks from it. Under full, where the stream must also reach the block's
    # recomputation (a case under none passed the same way and was dropped).
    trained = sources.from_factory(f"{FACTORIES}:dropout_trained", tags=None)
    off = sources.from_factory(f"{FACTORIES}:dropout_off", tags=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RematWarning)
        on = sources.measure(trained, policy, "h100", SMALL, warn=False)
        plain = sources.measure(off, policy, "h100", SMALL, warn=False)
    assert on.meta["rng_streams"] == ["dropout"] and "rng_streams" not in plain.meta
    drawn = {}
    for name, src in (("on", trained), ("off", off)):
        step = src.build_step(
            rk.policy(policy), rk.schedules.NO_SCHEDULE, SMALL, rk.target("h100")
        ).step
        drawn[name] = "random_bits" in str(jax.make_jaxpr(step.loss_fn)(*step.loss_args))
    assert drawn == {"on": True, "off": False}


def test_a_sharded_step_of_a_model_that_trains_with_dropout_is_given_its_stream_too():
    # Traced, not compiled: over two GPUs (fsdp:2) the step is built through the mesh, and
    # the dropout stream reaches it there as on one GPU (its masks drawn in the loss).
    src = sources.from_factory(f"{FACTORIES}:dropout_trained", tags=None, shard="fsdp:2")
    built = src.build_step(
        rk.policy("full"), rk.schedules.NO_SCHEDULE, SMALL, rk.target("h100", devices=2)
    )
    assert built.step.mesh is not None
    assert "random_bits" in str(jax.make_jaxpr(built.step.loss_fn)(*built.step.loss_args))


def test_a_source_made_by_hand_hands_its_factory_no_target_unless_told():
    # ModelSource(spec, factory) as a user writes it: a factory of one parameter is called
    # with the policy alone; takes_target=True hands it the target the step is built for.
    h100 = rk.target("h100")
    seen = {}
    for takes in (False, True):

        def mine(policy, target="not given", takes=takes):
            seen.setdefault(takes, set()).add(getattr(target, "name", target))
            return nn.Dense(4)

        src = sources.ModelSource("mine", mine, **({"takes_target": True} if takes else {}))
        src.build(rk.policy("full"), rk.schedules.NO_SCHEDULE, h100)
    # (A trace of the structure alone leaves a factory's own default: "not given" there too.)
    assert seen[False] == {"not given"} and h100.name in seen[True]


def test_flax_own_module_names_are_our_tags():
    # flax's examples build on MultiHeadDotProductAttention (query/key/value/out) and an
    # MlpBlock of two unnamed Dense: the "flax" rule set names them, so "minimal" applies.
    src = sources.from_factory(f"{FACTORIES}:flax_named")
    names = {"query_proj", "key_proj", "value_proj", "out_proj", "mlpwi", "mlpwo"}
    assert names <= set(sources.tags(src, SMALL, "cpu"))
    plain = sources.from_factory(f"{FACTORIES}:flax_named", tags="hf")  # not flax's names
    assert not names & set(sources.tags(plain, SMALL, "cpu"))


@pytest.mark.slow
def test_compare_runs_the_policies_it_can_and_names_the_one_that_matches_no_tag(capsys, tmp_path):
    # flax's lm1b through compare with "minimal" named beside others: the model (tagged by
    # path only here) has none of minimal's tensors; the rest are compared, minimal is named.
    out = tmp_path / "rows.json"
    argv = ["compare", "--model", f"{FACTORIES}:untagged", "--tags", "none", "--target", "h100"]
    argv += ["--policies", "none,full,minimal", "--batch", "1", "--seq", "16", "--json", str(out)]
    assert main(argv) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert (
        "not compared (the model tags none of their tensors): minimal; the model's tags: none"
        in (printed)
    )
    assert [row["policy"] for row in json.loads(out.read_text())] == ["none", "full"]
    # named alone, it is still the one-line error
    assert main([*argv[:-8], "--policies", "minimal", "--batch", "1", "--seq", "16"]) == 2


@pytest.mark.slow
def test_a_deep_factory_without_layers_is_told_what_copies_would_save():
    # 8 identical unrolled layers and no layers= parameter: every compile is at full depth.
    fixed = sources.from_factory(f"{FACTORIES}:deep_fixed")
    (note,) = fixed.notes(SMALL, rk.target("h100"))
    assert (note.kind, dict(note.data)) == (
        "whole_model_probes",
        {"model": f"{FACTORIES}:deep_fixed", "layers": 8},
    )
    assert "takes no layers=: its 8 identical layers are compiled whole" in rk.notes.words(note)
    # the same model from a factory that takes layers= builds copies: nothing to say
    assert sources.from_factory(f"{FACTORIES}:deep").notes(SMALL, rk.target("h100")) == ()


@pytest.mark.parametrize(
    ("signature", "made"),
    [
        # gemma's NNX Transformer: positions, a cache and a [B, L, L'] mask, none defaulted.
        ("last_tokens, positions, cache, attention_mask", {"positions", "cache", "attention_mask"}),
        # MaxText's decoder call.
        (
            "tokens, decoder_positions, decoder_segment_ids",
            {"decoder_positions", "decoder_segment_ids"},
        ),
        # Hugging Face's keywords, defaulted: both made.
        ("input_ids, attention_mask=None, position_ids=None", {"attention_mask", "position_ids"}),
        # Hugging Face's pair required, as some of its modules have it: still its [B, L] mask.
        ("input_ids, attention_mask, position_ids", {"attention_mask", "position_ids"}),
        # Defaults for everything else: the tokens alone.
        ("tokens, deterministic=True", None),
    ],
)
def test_auto_inputs_make_what_the_call_requires(signature, made):
    from remat_kit.sources._adapters import auto_inputs

    namespace = {}
    exec(f"def call(self, {signature}): ...", namespace)
    inputs = auto_inputs(namespace["call"])
    if made is None:
        assert inputs is None
        return
    tokens = jnp.zeros((2, 5), jnp.int32)
    got = inputs(tokens)
    assert set(got) == made
    for name, value in got.items():
        if "position" in name:
            assert value.tolist() == [[0, 1, 2, 3, 4]] * 2
        elif name == "cache":
            assert value is None
        elif "segment" in name:
            assert value.tolist() == [[1] * 5] * 2
        elif signature.startswith("last_tokens"):  # gemma's mask: causal, [B, L, L']
            assert (
                value.shape == (2, 5, 5)
                and value[0].tolist() == jnp.tril(jnp.ones((5, 5), bool)).tolist()
            )
        else:  # Hugging Face's: [B, L] ones
            assert value.tolist() == [[1] * 5] * 2


def test_a_required_input_that_cannot_be_made_is_named():
    from remat_kit.sources._adapters import auto_inputs

    def call(self, tokens, positions, temperature): ...

    with pytest.raises(BadValue, match=r"m requires temperature beside the tokens"):
        auto_inputs(call, "m")


@pytest.mark.slow
def test_a_model_called_as_gemmas_is_measured_without_a_wrapper():
    # Equal to the same model behind a wrapper that makes its inputs itself (a bare step).
    from flax import nnx

    src = sources.from_factory("tests/data/factories.py:gemma_like")
    config = rk.TrainConfig(2, 64)
    ours = sources.measure(src, "minimal", "h100", config, warn=False)
    factories = importlib.import_module("tests.data.factories")

    class Wrapped(nnx.Module):
        def __init__(self):
            self.inner = factories.gemma_like(rk.policy("minimal"))

        def __call__(self, tokens):
            b, s = tokens.shape
            pos = jnp.broadcast_to(jnp.arange(s), (b, s))
            mask = jnp.broadcast_to(jnp.tril(jnp.ones((s, s), bool)), (b, s, s))
            return self.inner(tokens, pos, None, mask)[0]

    bare = sources.measure(
        sources.from_factory(lambda policy: Wrapped()), "minimal", "h100", config, warn=False
    )
    assert ours.peak_bytes == bare.peak_bytes and ours.temp_bytes == bare.temp_bytes


def _counted_workload(flops_fn, verify_fn=None):
    """A Workload of hand-made reports (batch 2's read off shallow copies), no compile."""

    def measure_fn(pol, sch, batch):
        mode = "extrapolated" if batch == 2 else "full"
        return memory_report(policy=pol.spec, meta={"depth": {"mode": mode}})

    measured = sources.Measured(measure_fn, flops_fn, verify_fn=verify_fn)
    return sources.workload(measured, rk.target("h100"), rk.TrainConfig(1, 1))


@pytest.mark.parametrize("verify", [False, True])
def test_a_workload_has_a_report_once_compiled_and_whole_once_final(verify):
    whole = lambda pol, sch, batch, report, limit: memory_report(policy=pol.spec)
    w = _counted_workload(lambda p, s, b: 1.0, whole if verify else None)
    full = rk.policy("full")
    assert not w.has(full, NO_SCHEDULE, 2) and not w.has(full, NO_SCHEDULE, 2, whole=True)
    w.compiled(full, NO_SCHEDULE, 1)
    w.compiled(full, NO_SCHEDULE, 2)
    assert w.has(full, NO_SCHEDULE, 1) and w.has(full, NO_SCHEDULE, 1, whole=True)
    # Read off copies: compiled either way; the full step's only where nothing would verify it.
    assert w.has(full, NO_SCHEDULE, 2)
    assert w.has(full, NO_SCHEDULE, 2, whole=True) is (not verify)
    w.verified(full, NO_SCHEDULE, 2)
    assert w.has(full, NO_SCHEDULE, 2) and w.has(full, NO_SCHEDULE, 2, whole=True)


@pytest.mark.parametrize(
    "counted, expected",
    [
        (6.0, FlopCount(total=6.0, matmul=6.0, attention_kernel=0.0, other=0.0)),
        (FlopCount(7.0, 4.0, 2.0, 1.0), FlopCount(7.0, 4.0, 2.0, 1.0)),
    ],
)
def test_a_bare_flop_count_is_priced_as_products_a_split_one_kept(counted, expected):
    w = _counted_workload(lambda p, s, b: counted)
    assert w.traced_count(rk.policy("full"), NO_SCHEDULE, 1) == expected


PARTS = {"weights": 400, "gradients": 400, "optimizer": 800}


@pytest.mark.parametrize("batch", [1, 4])
def test_a_measured_step_s_fixed_bytes_come_from_its_breakdown_without_a_compile(batch):
    # A step measured by hand gives its breakdown (shapes, no compile): the workload made of
    # it sizes what no policy removes from it, and refuses a budget below that at once.
    compiled = []

    def measure_fn(pol, sch, b):
        compiled.append((pol.spec, b))
        return memory_report(policy=pol.spec)

    parts = lambda b: {**PARTS, "batch": 16 * b, "activations": 999}
    measured = sources.Measured(measure_fn, lambda p, s, b: 1.0, breakdown_fn=parts)
    w = sources.workload(measured, rk.target("h100"), rk.TrainConfig(1, 8))
    # 400 + 400 + 800 bytes and 16 a sequence; activations are not fixed.
    fixed = 1600 + 16 * batch
    assert w.breakdown(batch) == {**PARTS, "batch": 16 * batch}
    assert w.fixed_bytes(batch) == fixed
    rk.search.check_budget(w, batch, fixed)  # exactly fits
    # Under the parts without the gradients too: refused on the shapes alone.
    with pytest.raises(DoesNotFit, match="whatever the policy") as err:
        rk.search.check_budget(w, batch, fixed - 401)
    assert err.value.parts == {**PARTS, "batch": 16 * batch} and err.value.fixed_bytes == fixed
    assert compiled == [] and w.compiles == 0


def _one_tag_residuals(pol, sch, batch):
    """One tag, 300 bytes a sequence, kept unless the policy recomputes it."""
    kept = not pol.is_remat or rk.decide(pol, "mlp") == "save"
    res = (rk.residuals.Residual("mlp", (), "int8", 300 * batch, "saved", 1, ""),) if kept else ()
    return rk.residuals.ResidualReport(
        residuals=res,
        tags={"mlp": "saved" if kept else "recomputed"},
        tag_bytes={"mlp": 300},
        tag_count={"mlp": 1},
    )


@pytest.mark.parametrize(("declared", "built"), [(None, 1), (2, 2)])
def test_a_measured_step_without_a_depth_is_planned_as_one_layer(declared, built):
    # A step measured by hand that names no depth is one layer: a plan that nothing fits
    # answers so, never asking its measure_fn for every:2 (segments of two layers, which a
    # one-layer step cannot build: it raises, as a real model of that depth does).
    def measure_fn(pol, sch, batch):
        sch.runs(built, pol)  # as a model of `built` layers builds it
        return memory_report(
            peak_bytes=1000 + 500 * batch,
            policy=pol.spec,
            schedule=sch.spec,
            flops=float(batch),
            tags=("mlp",),
        )

    depth = {} if declared is None else {"n_layers": declared}
    measured = sources.Measured(
        measure_fn,
        lambda p, s, b: float(b),
        residuals_fn=_one_tag_residuals,
        breakdown_fn=lambda b: {"weights": 400, "gradients": 400, "optimizer": 0},
        **depth,
    )
    w = sources.workload(measured, rk.target("h100"), rk.TrainConfig(1, 8))
    assert w.n_layers == built
    p = rk.plan(w, 1, 999, offload=False)  # over the 800 fixed bytes, under any program
    assert not p.fits
    tried = {c.schedule for c in p.candidates}
    assert ("every:2" in tried) is (built >= 2)


def test_a_factory_loaded_twice_is_one_source_for_the_process_caches():
    # Each load makes a new function; the source is its spec and options (a memo keyed by
    # it, such as the traced tags, is shared), and another factory is another source.
    a, b = (sources.from_factory("tests/data/factories.py:deep") for _ in range(2))
    other = sources.from_factory("tests/data/factories.py:untagged")
    assert a.factory is not b.factory
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != other and len({a, b, other}) == 2


@pytest.mark.parametrize(
    ("factory", "kinds", "noted"),
    [("deep_fixed", 1, True), ("deep", 1, False), ("deep_fixed", 2, False)],
)
def test_only_a_stack_of_identical_layers_without_layers_is_told_of_copies(
    monkeypatch, factory, kinds, noted
):
    # The note's own logic, on the model's counts (traced in the slow test beside it).
    from remat_kit.sources._source import ModelSource

    monkeypatch.setattr(ModelSource, "n_layers", lambda self: 8)
    monkeypatch.setattr(ModelSource, "layer_kinds", lambda self, target: kinds)
    src = sources.from_factory(f"{FACTORIES}:{factory}")
    expected = (("whole_model_probes", {"model": src.spec, "layers": 8}),) if noted else ()
    got = src.notes(SMALL, rk.target("h100"))
    assert tuple((n.kind, dict(n.data)) for n in got) == expected


def test_a_sharded_factory_step_carries_its_plan_and_splits_each_weight_over_fsdp():
    # Traced, not compiled: the step's plan and its weights' shardings (the compile in the
    # slow test above reads the bytes that follow from them).
    from remat_kit.policies import FULL

    src = sources.from_factory(f"{FACTORIES}:deep", shard="fsdp:2").at_depth(2)
    two = rk.target("h100", devices=2)
    step = src.build_step(FULL, NO_SCHEDULE, rk.TrainConfig(2, 16), two).step
    assert step.plan == src.mesh_plan(two) and step.mesh.shape == {"fsdp": 2}
    weights = jax.tree.leaves(step.in_shardings[0])
    assert weights and all("fsdp" in jax.tree.leaves(tuple(w.spec)) for w in weights)


def test_an_nnx_model_s_patched_blocks_are_counted_as_the_factory_builds_them():
    # nnx_plain builds 4 blocks in the factory (no layer count on the model to read instead).
    assert sources.from_factory(f"{FACTORIES}:nnx_plain", block=NNX_BLOCK).n_layers() == 4


def _measured(flops_fn, verify_fn=None, report=None):
    """A Measured workload of hand-made reports (``report(pol, sch, batch)``), no compile."""

    def measure(pol, sch, batch):
        if report is not None:
            return report(pol, sch, batch)
        return memory_report(policy=pol.spec, flops=float("nan"))

    return rk.sources.workload(
        rk.sources.Measured(measure, flops_fn, verify_fn=verify_fn),
        rk.target("h100"),
        rk.TrainConfig(2, 16),
    )


def test_recompute_overhead_is_the_traced_flops_over_the_baseline_s():
    # full traces 1.25x none's FLOPs: 25% recomputed (issue 58 mutant _workload.py:231).
    w = _measured(lambda p, s, b: 100.0 * b * (1.25 if p.spec == "full" else 1.0))
    assert w.recompute_overhead("full", batch=2) == pytest.approx(0.25)
    assert w.recompute_overhead("none", batch=2) == 0.0
    assert w.compiles == 0


def test_the_flops_of_a_compiled_step_are_its_report_s_and_else_traced():
    # The report counts 7e9 FLOPs, the trace 5e9: before the compile the trace answers, after
    # it the report (issue 58 mutant _workload.py:511 of the seed-59 sample).
    w = _measured(
        lambda p, s, b: 5e9, report=lambda p, s, b: memory_report(policy=p.spec, flops=7e9)
    )
    assert w.flops("full", batch=2) == 5e9
    other = _measured(
        lambda p, s, b: 5e9, report=lambda p, s, b: memory_report(policy=p.spec, flops=7e9)
    )
    other.report("full", batch=2)
    assert other.flops("full", batch=2) == 7e9


@pytest.mark.parametrize("whole", [True, False])
def test_a_worker_s_report_replaces_an_extrapolated_one_only_when_it_is_the_whole_step(whole):
    """Held: a report read off shallow copies. A worker's whole-step compile replaces it (and
    counts as a second program); a worker's report that is not the whole step leaves it
    (issue 58 mutant _workload.py:496 of the seed-59 sample)."""
    shallow = memory_report(peak_bytes=3 * 2**30, meta={"depth": {"mode": "extrapolated"}})
    worker = memory_report(peak_bytes=5 * 2**30)
    w = _measured(lambda p, s, b: 1.0, verify_fn=lambda *a: worker, report=lambda p, s, b: shallow)
    pol = rk.policies.as_policy("full")
    assert w.compiled(pol, NO_SCHEDULE, 2) is shallow
    w._adopt(pol, NO_SCHEDULE, 2, worker, whole=whole)
    assert w.compiled(pol, NO_SCHEDULE, 2) is (worker if whole else shallow)
    assert w.compiles == (2 if whole else 1)


def _fake_compile(monkeypatch, host_temp_bytes=0):
    """``_steps.memory_report`` made by hand from what it is given (no compile): the figures
    of the target it is told, the default's when told none. Returns the targets it was told."""
    from remat_kit.sources import _steps

    told = []

    def compile_(fn, *args, target="h100-80gb", policy=None, meta=None, **kw):
        told.append(rk.target(target) if isinstance(target, str) else target)
        return memory_report(
            target=told[-1].name,
            policy=getattr(policy, "spec", policy),
            host_bytes=host_temp_bytes,
            host_temp_bytes=host_temp_bytes,
            meta=dict(meta or {}),
        )

    monkeypatch.setattr(_steps, "memory_report", compile_)
    return told


def test_a_source_s_step_is_reported_for_the_target_it_is_measured_for(monkeypatch):
    # An A100's 40 GB, not the default H100's (issue 58 mutant _steps.py:200 of the seed-59
    # sample). meta= keeps the hand-made report out of the session's compile cache.
    told = _fake_compile(monkeypatch)
    src = sources.from_factory(f"{FACTORIES}:preset")
    r = sources.measure(
        src, "full", "a100-40gb", rk.TrainConfig(1, 8), warn=False, meta={"fake": 1}, depth="full"
    )
    assert [t.name for t in told] == ["a100-40gb"]
    assert r.target == "a100-40gb" and r.usable_bytes == rk.target("a100-40gb").usable_bytes


def test_an_offload_xla_carries_out_in_part_on_one_device_is_said(monkeypatch):
    # 1 byte moved of what minimal_offloaded marks in the tiny Llama (f32): q, k, v, out, wi_0
    # and wi_1 of 4 layers, 8 tokens: said, on one device (issue 58 mutant _steps.py:234 of
    # the seed-59 sample).
    _fake_compile(monkeypatch, host_temp_bytes=1)
    src = sources.from_factory(f"{FACTORIES}:preset")
    config = rk.TrainConfig(1, 8)
    marked = 4 * 8 * (64 + 2 * 32 + 64 + 2 * 128) * 4
    r = sources.measure(
        src, "minimal_offloaded", "h100", config, warn=False, meta={"fake": 1}, depth="full"
    )
    assert [n.data for n in r.notes if n.kind == "offload_shortfall"] == [
        {"moved_bytes": 1, "marked_bytes": marked}
    ]


@pytest.mark.parametrize(
    ("abstract", "want"),
    [(False, [[4.0, 7.0, 10.0]]), (True, [[1.0, 1.0, 1.0]])],
    ids=["concrete", "abstract"],
)
def test_an_nnx_model_s_other_state_is_kept_or_made_zero_where_abstract(abstract, want):
    # The rest of an NNX model's state (not nnx.Param) is a constant of the step: kept as
    # built, or zeros where the model was built abstractly (nnx.eval_shape). By hand:
    # [1, 2] @ ones(2, 3) = [3, 3, 3]; times the scale [1, 2, 3] (or 0), plus 1.
    from flax import nnx

    from remat_kit.sources._adapters import NNXModel

    class Scaled(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.zeros((2, 3)))
            self.scale = nnx.Variable(jnp.array([1.0, 2.0, 3.0]))

        def __call__(self, x):
            return (x @ self.w[...]) * self.scale[...] + 1.0

    model = nnx.eval_shape(Scaled) if abstract else Scaled()
    got = NNXModel(model).apply({"w": jnp.ones((2, 3))}, jnp.array([[1.0, 2.0]]))
    assert got.tolist() == want


def test_an_abstract_nnx_models_random_key_is_the_key_of_seed_0():
    # An NNX model built abstractly holds an abstract PRNG key in its other state; the step
    # runs it with jax.random.key(0) (its count 0): what the same model built with
    # nnx.Rngs(0) and called directly draws (issue 58, seed-80 mutant _adapters.py:213).
    from flax import nnx

    from remat_kit.sources._adapters import NNXModel

    class Noisy(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.ones((2, 3)))
            self.rngs = nnx.Rngs(noise=0)

        def __call__(self, x):
            return x @ self.w[...] + jax.random.uniform(self.rngs.noise(), (1, 3))

    x = jnp.array([[1.0, 2.0]])
    got = NNXModel(nnx.eval_shape(Noisy)).apply({"w": jnp.ones((2, 3))}, x)
    chex.assert_trees_all_close(got, Noisy()(x))


@pytest.mark.parametrize("strict", [None, False, True])
def test_measure_refuses_an_unmatched_policy_only_when_strict(strict, monkeypatch):
    # The library warns by default (the CLI asks for strict): an untagged model under
    # "minimal" keeps nothing it names. Nothing is compiled: the measurement is stubbed.
    from remat_kit.sources import _steps

    monkeypatch.setattr(_steps, "_measure", lambda *args: memory_report(policy="minimal"))
    src = sources.from_factory(f"{FACTORIES}:untagged", tags=None)
    kwargs = {} if strict is None else {"strict": strict}
    if strict:
        with pytest.raises(BadValue, match=r"'minimal' names .* tags none"):
            sources.measure(src, "minimal", "cpu", SMALL, meta={"stub": True}, **kwargs)
    else:
        r = sources.measure(src, "minimal", "cpu", SMALL, meta={"stub": True}, **kwargs)
        assert r.policy == "minimal"


@pytest.mark.parametrize("given", [True, False], ids=["named", "catalogue"])
def test_the_policies_that_match_no_tag_are_set_aside_and_the_rest_kept_in_order(given):
    # compare --policies none,full,minimal on a model with no tags (traced, not compiled):
    # none and full name no tensor, so they act whatever the tags; minimal names tensors the
    # model lacks. Named or from the catalogue, it is set aside and the other two still run.
    src = sources.from_factory(f"{FACTORIES}:untagged", tags=None)
    kept, skipped = sources.usable_policies(
        src, SMALL, "cpu", ["none", "full", "minimal"], given=given
    )
    assert ([p.spec for p in kept], skipped) == (["none", "full"], ["minimal"])


@pytest.mark.parametrize(
    ("model", "layers"),
    [("tiny-llama", models.get_config("tiny-llama").n_layers), ("untagged", 1)],
)
def test_a_workload_has_the_layers_its_schedules_split(model, layers):
    # A preset's layers as its config states them; a factory's model, whose layers no
    # schedule splits, is one layer to the planner. Nothing is compiled.
    if model == "untagged":
        src = sources.from_factory(f"{FACTORIES}:untagged", tags=None)
    else:
        src = sources.resolve(PresetSpec(model))
    assert sources.workload(src, "h100", SMALL).n_layers == layers


class _Noisy(nn.Module):
    """A model that draws from ``streams`` (in that order) as it runs: tokens to logits."""

    streams: tuple[str, ...]

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(32, 8)(tokens)
        for name in self.streams:
            x = x + jax.random.normal(self.make_rng(name), x.shape)
        return nn.Dense(32)(x)


@pytest.mark.parametrize(
    "streams", [(), ("dropout",), ("dropout", "noise")], ids=["none", "one", "two"]
)
def test_the_streams_a_model_asks_for_are_found_one_after_the_other(streams):
    from remat_kit.sources._streams import streams_asked

    assert streams_asked(_Noisy(streams), None, batch=2, seq=4) == streams


class _Nesting(nn.Module):
    """A model that applies a second model inside its own call, giving it ``inner_rngs``
    (None: no streams) whatever streams it was given itself."""

    inner_rngs: object

    @nn.compact
    def __call__(self, tokens):
        x = _Noisy(("noise",))
        first = _Noisy(("dropout",))
        h = first(tokens)  # asks for "dropout" once, as a model that drops out does
        if self.is_initializing():
            return h
        p = x.init({"params": jax.random.key(1), "noise": jax.random.key(2)}, tokens)
        return h + x.apply(p, tokens, rngs=self.inner_rngs)


@pytest.mark.parametrize(
    "inner_rngs",
    [None, jnp.zeros(3)],
    ids=["asks-again-for-a-stream-given", "names-no-stream"],
)
def test_a_refusal_the_streams_given_do_not_answer_ends_the_search_with_those_found(inner_rngs):
    # The inner model never sees the outer's streams: flax asks again for "noise" after it
    # was given (or refuses a key, naming no stream). The streams found so far are the
    # answer, and the step's own trace reports the rest.
    from remat_kit.sources._streams import streams_asked

    expected = ("dropout", "noise") if inner_rngs is None else ("dropout",)
    assert streams_asked(_Nesting(inner_rngs), None, batch=2, seq=4) == expected


# --- a factory's model: its layer count, its errors, its target ------------------------------


_LAYER_PATHS = ("n_layers", "num_layers", "layers", "config.num_hidden_layers", "config.n_layer")


@pytest.mark.parametrize("seed", range(3))
def test_the_layer_count_is_the_first_positive_int_of_the_names_models_give_it(seed):
    import random

    from remat_kit.sources._factory import _layer_attr

    rng = random.Random(seed)
    for _ in range(60):
        values = {p: rng.choice([None, None, 0, -2, 3, 12, "4", 2.0]) for p in _LAYER_PATHS}
        values["cfg.n_layers"] = rng.choice([None, 0, 5, "5"])
        made, config, cfg = types.SimpleNamespace(), types.SimpleNamespace(), None
        for path, v in values.items():
            if v is None:
                continue
            if path.startswith("config."):
                setattr(config, path.split(".")[1], v)
                made.config = config
            elif path.startswith("cfg."):
                cfg = types.SimpleNamespace(n_layers=v)
                made.cfg = cfg
            else:
                setattr(made, path, v)
        ok = [v for v in values.values() if type(v) is int and v > 0]
        assert _layer_attr(made) == (ok[0] if ok else None), values


@pytest.mark.parametrize(
    ("raised", "said"),
    [
        (
            ValueError("shapes (2, 3) and (4,)\nin dot_general"),
            "ValueError: shapes (2, 3) and (4,)",
        ),
        (KeyError("params"), "KeyError: 'params'"),
        (RuntimeError("\n  first line\nsecond"), "RuntimeError: first line"),
        (TypeError(""), "TypeError: "),
    ],
)
def test_a_model_s_own_error_is_one_line_and_ours_pass_as_they_are(raised, said):
    from remat_kit.sources._factory import model_errors

    with pytest.raises(BadValue) as err, model_errors("m.py:f (b2 s16)"):
        raise raised
    assert str(err.value) == f"m.py:f (b2 s16): {said}" and err.value.__cause__ is raised
    ours = BadType("ours")  # remat_kit's own: not the model's
    with pytest.raises(BadType) as err, model_errors("m.py:f"):
        raise ours
    assert err.value is ours


def test_a_factory_that_names_a_target_gets_the_one_compiled_for_else_its_default_or_the_host():
    from remat_kit.sources._factory import target_kwargs

    h100 = rk.target("h100")
    given = lambda policy, target: None
    default = lambda policy, target=None: None
    src = lambda f, takes: types.SimpleNamespace(factory=f, takes_target=takes)
    assert target_kwargs(src(given, True), h100) == {"target": h100}
    assert target_kwargs(src(default, True), None) == {}
    assert target_kwargs(src(given, True), None) == {"target": rk.target("cpu")}
    assert target_kwargs(src(given, False), h100) == {}


_WRITER = """
def write(how, key, value):
    if how == "set":
        os.environ[key] = value
    elif how == "default":
        os.environ.setdefault(key, value)
    elif how == "update":
        os.environ.update({key: value})
    elif how == "del":
        del os.environ[key]
"""


def _writer(module: str):
    """A function that writes ``os.environ`` from code of module ``module``."""
    space = {"__name__": module, "os": os}
    exec(_WRITER, space)
    return space["write"]


@pytest.mark.parametrize("seed", range(3))
def test_random_writes_at_import_are_recorded_last_value_first_before_and_who(monkeypatch, seed):
    import random

    from remat_kit.sources._environ import WATCHED, recording_environ

    rng = random.Random(seed)
    names = [*WATCHED, "RK_TEST_UNWATCHED"]
    who = {"easydel.core.init": "easydel", "_remat_kit_factory_9": "f.py", "__main__": "f.py"}
    who["maxtext"] = "maxtext"
    for _ in range(15):
        start = {}
        for name in names:
            monkeypatch.setenv(name, "")  # restored at teardown, whatever the import did
            if rng.random() < 0.5:
                start[name] = rng.choice(["--a=1 --b", "0.5", "x"])
                monkeypatch.setenv(name, start[name])
            else:
                monkeypatch.delenv(name)
        env = dict(start)  # the oracle: the environment, and what each write left recorded
        found: dict[str, tuple[str, str, str]] = {}
        with recording_environ("f.py") as out:
            for _ in range(rng.randrange(0, 8)):
                how = rng.choice(["set", "default", "update", "del"])
                key = rng.choice(names[-4:]) if rng.random() < 0.7 else rng.choice(names)
                module = rng.choice(sorted(who))
                value = rng.choice(["1.0", "--a=1 --c=2", "platform", ""])
                if how == "del" and key not in env:
                    continue
                _writer(module)(how, key, value)
                if how == "del":
                    del env[key]
                    found.pop(key, None)
                    continue
                if how == "default" and key in env:
                    continue
                if key in WATCHED:
                    before = found[key][2] if key in found else env.get(key, "")
                    found[key] = (value, who[module], before)
                env[key] = value
                # Reads go through to the real environment (get, copy ... of its own).
                assert os.environ.get(key) == env.get(key) and os.environ.copy() == dict(os.environ)
            assert out == []  # filled on exit
        assert [(e.name, e.value, e.by, e.before) for e in out] == [
            (n, *found[n]) for n in WATCHED if n in found
        ]
        assert type(os.environ).__name__ == "_Environ"
        assert {n: os.environ[n] for n in names if n in os.environ} == env


# --- what a model takes beside the tokens, and what it must return ---------------------------


@pytest.mark.parametrize("seed", range(2))
def test_random_signatures_get_the_inputs_their_names_ask_for(seed):
    import inspect
    import random

    import numpy as np

    from remat_kit.sources import _adapters

    rng = random.Random(seed)
    known = {
        "positions": "positions",
        "position_ids": "positions",
        "decoder_positions": "positions",
        "segment_pos": "positions",
        "segment_ids": "segments",
        "inputs_segmentation": "segments",
        "cache": "none",
        "past_key_values": "none",
        "attention_mask": "causal",
        "mask": "causal",
        "input_mask": "padding",
        "padding_mask": "padding",
    }
    kinds = [inspect.Parameter.POSITIONAL_OR_KEYWORD] * 3 + [inspect.Parameter.KEYWORD_ONLY]
    tokens = jnp.zeros((2, 5), jnp.int32)
    b, s = tokens.shape
    want_of = {
        "positions": np.broadcast_to(np.arange(s, dtype=np.int32), (b, s)),
        "segments": np.ones((b, s), np.int32),
        "causal": np.broadcast_to(np.tril(np.ones((s, s), bool)), (b, s, s)),
        "padding": np.ones((b, s), bool),
    }
    for _ in range(60):
        names = rng.sample([*known, "rope", "deterministic", "train"], rng.randrange(0, 5))
        params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in "st"]
        for n in names:
            kind = rng.choice(kinds)
            default = inspect.Parameter.empty if rng.random() < 0.6 else None
            if kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and any(
                p.default is not p.empty for p in params
            ):
                kind = inspect.Parameter.KEYWORD_ONLY  # no required one after a default
            params.append(inspect.Parameter(n, kind, default=default))
        params.sort(key=lambda p: p.kind)
        var_kw = rng.random() < 0.2
        if var_kw:
            params.append(inspect.Parameter("kw", inspect.Parameter.VAR_KEYWORD))

        def call(*args, **kwargs):
            return None

        call.__signature__ = inspect.Signature(params)
        required = [p.name for p in params[2:] if p.default is p.empty and p.kind in kinds]
        hf = var_kw or {"attention_mask", "position_ids"} <= set(names)
        if hf:
            required = [n for n in required if n not in ("attention_mask", "position_ids")]
        unknown = [n for n in required if n not in known]
        if unknown:
            with pytest.raises(BadValue, match=f"m.py:f requires {', '.join(unknown)} beside"):
                _adapters.auto_inputs(call, "m.py:f")
            continue
        got = _adapters.auto_inputs(call, "m.py:f")
        if not required:
            assert got is (_adapters.hf_inputs if hf else None)
            continue
        made = got(tokens)
        want = {n: want_of.get(known[n]) for n in required}
        if hf:
            want = {
                "attention_mask": np.ones((b, s), np.int32),
                "position_ids": want_of["positions"],
                **want,
            }
        assert made.keys() == want.keys()
        for n, v in want.items():
            if v is None:
                assert made[n] is None
            else:
                assert made[n].dtype == v.dtype and np.array_equal(made[n], v), n


@pytest.mark.parametrize(
    "shape",
    [(2, 16, 256), (2, 16), (2, 256), (16, 2, 256), (2, 16, 4, 8), (), (2, 15, 256), (1, 16, 256)],
)
def test_logits_are_batch_by_seq_by_vocab_or_refused_naming_both_shapes(shape):
    from remat_kit.errors import BadOutput
    from remat_kit.sources._adapters import Applied, check_logits

    tokens = jnp.zeros((2, 16), jnp.int32)
    logits = jnp.zeros(shape)
    ok = len(shape) == 3 and shape[:2] == (2, 16)
    module = types.SimpleNamespace(init=lambda *a, **k: "v", apply=lambda *a, **k: logits)
    applied = Applied(module, contextlib.nullcontext, "m.py:f")
    if ok:
        check_logits("m.py:f", logits, tokens)
        assert applied.apply("v", tokens) is logits
        return
    got = f"[{', '.join(map(str, shape))}]"
    with pytest.raises(BadOutput, match=re.escape(f"m.py:f returned logits of shape {got} for")):
        check_logits("m.py:f", logits, tokens)
    with pytest.raises(BadOutput, match=re.escape("tokens of shape [2, 16]")):
        applied.apply("v", tokens)
    # Not the forward pass: another method, or no tokens.
    assert applied.apply("v", tokens, method="encode") is logits
    assert applied.apply("v") is logits and applied.init("k", tokens) == "v"


# --- which policies can act on a model: the copies' tags stand in for the model's ------------


class _Tagged:
    """A source whose tags are given by hand (the traces stand-in below reads them)."""

    spec = "tagged.py:m"

    def __init__(self, tags):
        self.tags = tags

    def smallest_batch(self, config, t):
        return 3


def _strict_fails(pol, tags) -> bool:
    try:
        checks.check_policy_matches(pol, tags, strict=True)
    except BadValue:
        return True
    return False


@pytest.mark.filterwarnings("ignore:save.*not in remat_kit's tag vocabulary")
@pytest.mark.parametrize("seed", range(2))
def test_random_policies_are_checked_as_on_the_whole_model_and_copies_only_save_traces(
    monkeypatch, seed
):
    import random

    from remat_kit.policies import as_policy
    from remat_kit.sources import _tag_checks

    rng = random.Random(seed)
    ours = ["mlpwo", "query_proj", "context", "mlpwi_0"]
    own = ["mlp_gate", "mlp_up", "mlp_gat"]
    traced = []

    def fake_tags(source, config, t, remat3):
        traced.append((source, config.batch))
        return tuple(sorted(source.tags))

    monkeypatch.setattr(_tag_checks, "_tags", fake_tags)
    config, h100 = rk.TrainConfig(batch=6, seq=8, accum=3), rk.target("h100")
    for _ in range(40):
        whole = _Tagged(set(rng.sample(ours + own[:2], rng.randrange(0, 6))))
        copy = _Tagged(set(rng.sample(sorted(whole.tags), rng.randrange(0, len(whole.tags) + 1))))
        copies = None if rng.random() < 0.3 else [_Tagged(set()), copy]
        monkeypatch.setattr(_tag_checks, "shallow_copies", lambda s, sch, t, c=copies: c)
        specs = [
            rng.choice(["full", "none"])
            if rng.random() < 0.3
            else "names:save=" + "+".join(rng.sample(ours + own, rng.randrange(1, 3)))
            for _ in range(rng.randrange(1, 4))
        ]
        pols = [as_policy(s) for s in specs]
        named = any(p.tags for p in pols)
        fails = [p for p in pols if _strict_fails(p, whole.tags)]
        traced.clear()
        if fails and named:
            with pytest.raises(BadValue):
                _tag_checks.check_policies(whole, config, h100, specs)
        else:
            _tag_checks.check_policies(whole, config, h100, specs)
        # Traced at the smallest batch; the whole model only where a copy could not answer.
        assert all(batch == 3 for _, batch in traced)
        spared = not named or (
            copies is not None and not any(_strict_fails(p, copy.tags) for p in pols)
        )
        assert (whole in [s for s, _ in traced]) is (not spared)
        # Those that can act on it: named ones that keep some tag of the whole model.
        unmatched = [p.spec for p in pols if checks.unmatched_policy(p, whole.tags)]
        kept, skipped = _tag_checks.usable_policies(whole, config, h100, specs, given=False)
        assert ([p.spec for p in kept], skipped) == (
            [p.spec for p in pols if p.spec not in unmatched] if named else specs,
            unmatched if named else [],
        )
        # Named by the user: skipped only beside others that act, and never a typo.
        if not named or not fails:
            want = (specs, [])
        elif not unmatched or len(unmatched) == len(pols):
            want = None
        else:
            rest = [p for p in pols if p.spec not in unmatched]
            want = (
                None
                if any(_strict_fails(p, whole.tags) for p in rest)
                else (
                    [p.spec for p in rest],
                    unmatched,
                )
            )
        if want is None:
            with pytest.raises(BadValue):
                _tag_checks.usable_policies(whole, config, h100, specs, given=True)
        else:
            kept, skipped = _tag_checks.usable_policies(whole, config, h100, specs, given=True)
            assert ([p.spec for p in kept], skipped) == want


def test_a_copy_at_a_depth_names_it_builds_it_and_keeps_nothing_of_the_model_s_traces():
    def factory(policy, layers=4):
        return nn.Dense(layers)

    src = sources.from_factory(factory)
    src._cache["n_layers"] = 4  # what a trace of the whole model left
    copy = src.at_depth(3)
    assert copy.spec == "factory [3 layers]" and copy.factory.keywords == {"layers": 3}
    assert copy._cache == {} and src._cache == {"n_layers": 4}
    assert src.at_depth(2, label=False).spec == "factory"
    assert sources.from_factory(lambda policy: nn.Dense(4)).at_depth(2) is None


@pytest.mark.parametrize(
    ("shard", "devices", "label"),
    [(None, 1, "f s16 sgd"), ("fsdp:2", 2, "f s16 sgd fsdp:2"), ("dp:2,fsdp:2", 4, None)],
)
def test_a_factory_s_label_and_mesh_are_its_shard_on_the_target_s_devices(shard, devices, label):
    def f(policy):
        return nn.Dense(4)

    src = sources.from_factory(f, shard=shard)
    t = rk.target("h100", devices=devices)
    plan = src.mesh_plan(t)
    assert (plan is None) is (shard is None)
    if plan is not None:
        assert plan.data_size == devices and src.batch_ways(t) == devices
    want = label or f"f s16 sgd {plan.spec}"
    assert src.label(rk.TrainConfig(2, 16, optimizer="sgd"), t) == want


@pytest.mark.parametrize("kind", ["report", "flop_count", "tags"])
def test_an_answer_is_remembered_under_the_source_s_parts_config_code_and_request(
    monkeypatch, kind
):
    from remat_kit import cache
    from remat_kit.sources._remember import _remembered

    asked = []

    def remember(kind_, key, t, compute, *, encode, decode):
        asked.append((kind_, key, t))
        return decode(encode(compute()))

    monkeypatch.setattr(cache, "remember", remember)
    config = rk.TrainConfig(batch=2, seq=16)
    made = memory_report(compile_seconds=7.5) if kind == "report" else {"total": 3.0}

    class Named:
        def cache_parts(self):
            return {"model": "m", "config": "shadowed"}

        def train_config(self, c):
            return dataclasses.replace(c, optimizer="sgd")  # as the source trains it

    h100 = rk.target("h100")
    got = _remembered(kind, Named(), h100, config, lambda: made, policy="full", seq=16)
    ((k, key, t),) = asked
    assert (k, t) == (kind, h100)
    assert key == {
        "model": "m",
        "config": dataclasses.asdict(dataclasses.replace(config, optimizer="sgd")),
        "code_remat_kit": cache.code_fingerprint("remat_kit"),
        "policy": "full",
        "seq": 16,
    }
    if kind == "report":  # read back, a report says it took no compile
        assert got == made.replace(compile_seconds=0.0)
    else:
        assert got == made
    # A source that names no parts: computed each time, nothing remembered.
    unnamed = types.SimpleNamespace(cache_parts=lambda: None)
    assert _remembered(kind, unnamed, h100, config, lambda: made) is made and len(asked) == 1


@pytest.mark.parametrize(
    ("jobs", "executor", "side_by_side"),
    [(1, None, False), (2, None, True), (1, "pool", True), (3, "pool", True)],
)
def test_a_spread_compiles_beside_this_process_with_workers_or_an_executor(
    jobs, executor, side_by_side
):
    from remat_kit.sources._spread import SLOW_SECONDS, Spread, compile_in_worker

    s = Spread(lambda: None, jobs=jobs, executor=executor)
    assert s.side_by_side is side_by_side and s.slow_seconds == SLOW_SECONDS == 8.0
    for bad in (0, -1, True, 2.0, "2"):
        with pytest.raises(
            BadType, match=rf"jobs must be a positive int, got {re.escape(repr(bad))}"
        ):
            Spread(lambda: None, jobs=bad)
    with pytest.raises(BadType, match="workload_for must be callable, got 3"):
        Spread(3)
    # A worker builds the workload and compiles the item: whole, or as the search asked.
    asked = []
    fake = types.SimpleNamespace(
        whole=lambda p, s, b: asked.append(("whole", p.spec, s.spec, b)) or "W",
        compiled=lambda p, s, b: asked.append(("compiled", p.spec, s.spec, b)) or "C",
    )
    assert compile_in_worker(lambda: fake, True, ("full", "every:2", 4)) == "W"
    assert compile_in_worker(lambda: fake, False, ("none", "none", 2)) == "C"
    assert asked == [("whole", "full", "every:2", 4), ("compiled", "none", "none", 2)]


class _Scored(nn.Module):
    """A model that returns its logits under a key of its own: only an output adapter
    reads them."""

    @nn.compact
    def __call__(self, tokens):
        return {"scores": nn.Dense(64)(nn.Embed(64, 16)(tokens))}


def test_a_sources_train_step_reads_the_logits_with_the_output_it_was_given():
    """The source's ``output`` reaches the step it builds (seed 94's _source.py:91 dropped
    it: the step read the dict as logits and was refused)."""
    config = rk.TrainConfig(batch=2, seq=16, optimizer="sgd")
    given = sources.from_factory(lambda policy: _Scored(), output=lambda o: o["scores"], tags=None)
    step = given.build("full").train_step(config)
    assert jax.eval_shape(step.loss_fn, *step.loss_args).shape == ()
    bare = sources.from_factory(lambda policy: _Scored(), tags=None)
    unread = bare.build("full").train_step(config)
    with pytest.raises(BadValue, match="returned dict, not logits"):
        jax.eval_shape(unread.loss_fn, *unread.loss_args)


def test_a_patched_model_is_built_as_a_class_of_its_own_and_a_plain_one_as_it_was_made():
    # nn.jit caches a model's trace under its class and fields: with a patched block, each
    # build is a fresh subclass, so a policy never replays another's trace. Built, not traced.
    made = []

    def factory(policy):
        made.append(nn.Dense(4))
        return made[-1]

    out = lambda o: o
    plain = sources.from_factory(factory, output=out, tags=None)  # tags=None: no trace
    assert plain.output is out and plain.inputs == "auto"
    built = plain.build("full").module.module
    assert built is made[-1] and type(built) is nn.Dense
    patched = sources.from_factory(factory, block="flax.linen:Dense", tags=None)
    one, two = (patched.build(p).module.module for p in ("full", "minimal"))
    assert isinstance(one, nn.Dense) and type(one) is not nn.Dense
    assert type(one) is not type(two) and one.features == two.features == 4


@pytest.mark.parametrize(
    ("tags", "own", "rules", "aliases"),
    [
        (None, (), None, {}),  # the model's own tags alone
        ("auto", (), "auto", {}),  # a model with no tags of its own gets ours
        ("auto", ("mlp_gate", "attn_qkv"), None, "own"),  # its own names, with ours beside
        ("hf", (), "hf", "hf"),
        ("easydel", (), None, "easydel"),  # only a library's own names: nothing to tag
        ("easydel+maxtext", (), None, "easydel+maxtext"),
        ("hf+easydel", (), "hf+easydel", "hf+easydel"),
    ],
)
def test_a_factory_s_tags_are_rules_and_aliases_as_its_tags_option_says(tags, own, rules, aliases):
    from remat_kit import tagging

    src = sources.from_factory(lambda policy: nn.Dense(4), tags=tags)
    src._cache["own_tags"] = own  # what a trace of the model found (none here)
    got_rules, got_aliases = src._tagging()
    assert got_rules == (None if rules is None else tagging.rules(rules))
    if aliases == "own":
        assert got_aliases == tagging.aliases_for(own) and got_aliases
    else:
        assert got_aliases == ({} if not aliases else tagging.aliases(aliases))


@pytest.mark.parametrize(
    ("spec", "layers", "want"),
    [
        ("layers:0-1=full,rest=minimal", 4, ["full", "full", "minimal", "minimal"]),
        ("layers:2-3=dots", 5, ["none", "none", "dots", "dots", "none"]),
        ("layers:0-0=full", 1, ["full"]),
    ],
)
def test_a_patched_stack_takes_one_policy_per_layer_from_a_layers_plan(spec, layers, want):
    src = sources.from_factory(lambda policy: nn.Dense(4), block="flax.linen:Dense", tags=None)
    src._cache["n_layers"] = layers  # what counting its blocks found
    got = src._per_layer(rk.policy("none"), rk.parse_schedule(spec))
    assert [p.spec for p in got] == want
    with pytest.raises(BadValue, match=r"segments \(every:\d\) need a factory that takes sche"):
        src._per_layer(rk.policy("full"), rk.parse_schedule(f"every:{min(2, layers)}"))
    src._cache["n_layers"] = None
    with pytest.raises(BadValue, match=r"cannot count the layers built from flax\.linen:Dense"):
        src._per_layer(rk.policy("none"), rk.parse_schedule(spec))


def test_a_source_s_defaults_train_its_batch_at_one_sequence_per_micro_batch_on_one_device():
    class Bare(sources.StepSource):
        spec = "bare"
        plan = None

        def mesh_plan(self, target):
            return self.plan

    src, h100 = Bare(), rk.target("h100")
    assert (src.own_model, src.env_at_import, src.applies_in_code, src.remat_always) == (
        False,
        (),
        "policy",
        False,
    )
    for batch, accum in [(1, 1), (4, 2), (6, 3), (8, 8)]:
        config = rk.TrainConfig(batch=batch, seq=16, accum=accum)
        assert src.sequences_per_step(config, h100) == batch
        assert src.smallest_batch(config, h100) == accum
        assert src.train_config(config) is config
    assert src.batch_ways(h100) == 1 and src.layer_kinds(h100) is None
    src.plan = types.SimpleNamespace(data_size=4)
    assert src.batch_ways(h100) == 4
    full = rk.policies.as_policy("full")
    assert src.policy_lines(full, SMALL, h100) is None and src.refuses(full, SMALL, h100) is None
    assert src.notes(SMALL, h100) == ()


def test_cli_names_the_block_flag_in_front_of_a_block_it_cannot_import(capsys):
    # Refused as the source is made, before anything is traced.
    argv = ["report", "--model", f"{FACTORIES}:untagged", "--block", "flax.linen.Dense"]
    assert main([*argv, "--target", "h100"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("remat-kit: --block flax.linen.Dense: block 'flax.linen.Dense': name")


@pytest.mark.parametrize(
    ("layers", "shard", "noted"),
    [(None, None, False), (7, None, False), (8, None, True), (40, "fsdp:2", False)],
)
def test_a_model_too_shallow_uncounted_or_sharded_is_told_nothing_of_copies(
    monkeypatch, layers, shard, noted
):
    from remat_kit.sources._source import ModelSource

    monkeypatch.setattr(ModelSource, "n_layers", lambda self: layers)
    monkeypatch.setattr(ModelSource, "layer_kinds", lambda self, target: 1)
    src = sources.from_factory(f"{FACTORIES}:deep_fixed", shard=shard)
    got = src.notes(SMALL, rk.target("h100", devices=2 if shard else 1))
    assert [n.kind for n in got] == (["whole_model_probes"] if noted else [])


def test_a_factory_step_is_labelled_with_its_layers_where_they_are_counted(monkeypatch):
    # The model built and its step made by hand: the labels only are read here.
    from remat_kit.policies import FULL
    from remat_kit.sources._source import ModelSource

    params = {"w": jax.ShapeDtypeStruct((4, 8), "float32")}
    step = types.SimpleNamespace(
        args=(params, {"b": jax.ShapeDtypeStruct((3,), "float32")}, "opt"), precision={"p": "f32"}
    )
    built = types.SimpleNamespace(
        kind="nnx", train_step=lambda config, rng_streams: step, policy=FULL, schedule=NO_SCHEDULE
    )
    monkeypatch.setattr(ModelSource, "build", lambda self, *a: built)
    src = sources.from_factory(f"{FACTORIES}:untagged", tags=None)
    for layers in (None, 3):
        monkeypatch.setattr(ModelSource, "n_layers", lambda self, n=layers: n)
        meta = src.build_step(FULL, NO_SCHEDULE, SMALL, rk.target("h100")).meta
        assert meta.get("layers") == layers and meta["params"] == 4 * 8 + 3
        assert meta["precision"] == {"p": "f32", "compute": "module's own"}
        assert "rng_streams" not in meta and "env_at_import" not in meta


def test_measure_says_a_report_s_warnings_unless_told_not_to(monkeypatch):
    from remat_kit.sources import _steps

    note = rk.notes.Note(
        "offload_link_bound",
        {
            "target": "h100-80gb",
            "host_bytes": 64,
            "transfer_seconds": 2.0,
            "step_compute_seconds": 1.0,
        },
    )
    made = memory_report(notes=(note,))
    monkeypatch.setattr(_steps, "_measure", lambda *a: made)
    src = sources.from_factory(f"{FACTORIES}:untagged", tags=None)
    with pytest.warns(RematWarning, match="h100"):
        got = sources.measure(src, "full", "h100", SMALL, meta={"t": 1})
    assert got is made
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sources.measure(src, "full", "h100", SMALL, meta={"t": 1}, warn=False)


def test_the_layer_kinds_are_traced_once_at_one_sequence_of_32_unsharded(monkeypatch):
    from remat_kit.sources._source import ModelSource

    asked = []

    def build_step(self, policy, schedule, config, target, *, sharded=True):
        asked.append((policy.spec, schedule.spec, config, sharded))
        if config.seq != 32:
            raise ValueError("this model's positions stop at 32")
        step = types.SimpleNamespace(loss_fn=lambda x: x * 2.0, loss_args=(1.0,))
        return types.SimpleNamespace(step=step)

    monkeypatch.setattr(ModelSource, "build_step", build_step)
    src = sources.from_factory(f"{FACTORIES}:untagged", tags=None)
    assert src.layer_kinds(rk.target("h100")) is None  # no checkpoint in the trace: unknown
    assert src.layer_kinds(rk.target("h100")) is None  # remembered: traced once
    assert asked == [("full", "none", rk.TrainConfig(batch=1, seq=32, optimizer="sgd"), False)]


def test_cli_asks_for_one_model_saying_what_each_model_flag_takes(capsys):
    assert main(["report", "--target", "h100"]) == 2
    err = capsys.readouterr().err
    assert (
        "give the model once: a preset, path/file.py:NAME or package.module:NAME (--model)" in err
    )
    assert "a train step of your own, file.py:NAME (--step)" in err


def test_a_factory_name_missing_from_its_file_lists_only_the_files_own_public_callables(
    tmp_path,
):
    # What the user could have meant: the file's own public callables, not its constants,
    # its private helpers or what it imported.
    path = tmp_path / "models_here.py"
    path.write_text(
        "from os.path import join\n"
        "WIDTH = 64\n"
        "def _helper():\n    pass\n"
        "def build_llama():\n    pass\n"
        "def build_gpt():\n    pass\n"
    )
    offered = r"has no 'missing'; callables there: build_gpt, build_llama$"
    with pytest.raises(BadValue, match=offered):
        rk.sources.from_factory(f"{path}:missing")


def test_a_factory_file_imports_its_own_folder_s_modules_first(tmp_path, monkeypatch):
    """A factory file runs as ``python file.py`` would: a module beside it wins over one of
    the same name earlier on sys.path (issue 58 mutant _loading.py:119 of seed 107, the
    folder put second)."""
    mine, other = tmp_path / "mine", tmp_path / "other"
    for folder, width in ((mine, 16), (other, 99)):
        folder.mkdir()
        (folder / "rk_widths_here.py").write_text(f"WIDTH = {width}\n")
    (mine / "model.py").write_text(
        "import rk_widths_here\ndef build(policy):\n    return rk_widths_here.WIDTH\n"
    )
    monkeypatch.syspath_prepend(str(other))  # the process's first folder holds another one
    monkeypatch.delitem(sys.modules, "rk_widths_here", raising=False)
    try:
        factory = rk.sources.load_factory(f"{mine / 'model.py'}:build")
        assert factory(None) == 16
        assert sys.path[0] == str(other)  # the factory's folder is gone from sys.path again
    finally:
        sys.modules.pop("rk_widths_here", None)


def test_a_sources_tags_are_traced_on_its_unsharded_step(monkeypatch):
    """Tags name what the model computes, not how it is laid out: they are traced on the step
    built unsharded, which needs none of a mesh's devices (seed-109 mutant
    _tag_checks.py:65, ``sharded=False`` read as ``True``)."""
    from remat_kit.sources import _tag_checks

    src = rk.sources.from_factory("tests/data/factories.py:untagged")
    built = []
    real = type(src).build_step

    def build_step(self, *args, sharded=True, **kw):
        built.append(sharded)
        return real(self, *args, sharded=sharded, **kw)

    monkeypatch.setattr(type(src), "build_step", build_step)
    # Traced here, not read back from an earlier session's answer on disk.
    monkeypatch.setattr(_tag_checks, "_remembered", lambda kind, s, t, c, compute: compute())
    rk.sources.tags(src, rk.TrainConfig(batch=2, seq=16), "h100")
    assert built == [False]
