"""MaxText configs as a model source (``remat_kit_models.maxtext``, ``--maxtext``).

The figures are checked against MaxText's own AOT path as a user runs it: its entry point
``train_compile.main`` in a fresh process (``experiments/maxtext_own.py``), with its own
settings (its ``unsafe_rbg`` keys, its ``a3`` GPU host, ``create_device_mesh``) and its remat
set by its own config keys. The words are written out here, not taken from the source under
test.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import re
from pathlib import Path
from types import SimpleNamespace

import jax
import pytest

import remat_kit as rk
from helpers import IMPORTS_MAXTEXT
from remat_kit.errors import BadValue
from remat_kit_models.maxtext import CUSTOM_TENSORS, MaxTextSpec, config_lines

ROOT = Path(__file__).resolve().parent.parent

#: The small Llama's width (its model dimension, base_emb_dim).
WIDTH = 128

#: A small Llama (two layers, width 128): MaxText's llama2-7b config made small. Its
#: projections, heads and layers are a Llama's; its sizes are small, for its compiles' sake.
LLAMA = (
    f"model_name=llama2-7b base_num_decoder_layers=2 base_emb_dim={WIDTH} base_mlp_dim=256 "
    "base_num_query_heads=4 base_num_kv_heads=4 head_dim=64 vocab_size=256 "
    "attention=dot_product"
)

GPUS, BATCH, SEQ = 4, 8, 64

#: MaxText's pipeline: 2 stages, 4 micro-batches (on the Llama made 4 layers deep, 2 repeats).
PIPELINE = (
    LLAMA.replace("base_num_decoder_layers=2", "base_num_decoder_layers=4")
    + " ici_pipeline_parallelism=2 num_pipeline_microbatches=4"
)

#: The five byte counts of XLA's memory analysis, as the report names them.
FIVE = ("argument", "output", "alias", "temp", "generated_code")


def _own() -> object:
    """``experiments/maxtext_own.py``: MaxText's own ``train_compile.main``, in a process."""
    spec = importlib.util.spec_from_file_location(
        "maxtext_own", ROOT / "experiments" / "maxtext_own.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclasses.dataclass(frozen=True)
class Case:
    """A config compiled both ways: ours (words, policy) and MaxText's own (words, keys)."""

    words: str
    policy: object
    remat: tuple[tuple[str, str], ...]
    gpus: int = GPUS
    batch: int = BATCH
    seq: int = SEQ
    hosts: int = 1

    def theirs(self) -> dict:
        """MaxText's command line for the same config, written out: its own keys for what
        remat-kit's flags own."""
        per_device = self.batch // self.gpus
        words = [
            *self.words.split(),
            *(f"{k}={v}" for k, v in self.remat),
            "override_model_config=True",
            f"per_device_batch_size={per_device}",
            f"max_target_length={self.seq}",
            "jax_cache_dir=",  # else MaxText's process writes jax's cache to ~/jax_cache
        ]
        return {"words": words, "target": "h100", "gpus": self.gpus, "hosts": self.hosts}

    def target(self) -> rk.Target:
        return rk.target("h100", devices=self.gpus, hosts=self.hosts)


@functools.cache
def _ours(case: Case) -> rk.MemoryReport:
    src = rk.sources.resolve(MaxTextSpec(case.words))
    config = rk.TrainConfig(case.batch, case.seq)
    return rk.sources.measure(src, case.policy, case.target(), config, warn=False)


@functools.cache
def _all_theirs() -> dict[str, dict]:
    """MaxText's own path for every case, in one fresh process: its start, jax's and
    MaxText's imports are paid once, not once a case."""
    got = _own().own_path([case.theirs() for case in CASES.values()])
    return dict(zip(CASES, got, strict=True))


def _theirs(case: Case) -> dict:
    return _all_theirs()[next(name for name, c in CASES.items() if c == case)]


@pytest.fixture(scope="session")
def ours():
    """Our report of a case, compiled once per session."""
    return _ours


@pytest.fixture(scope="session")
def theirs():
    """MaxText's own path's answer for a case, compiled once per session."""
    return _theirs


#: MaxText's `minimal` as a raw jax policy: no config line names a callable, so the source
#: hands it to MaxText's decoder as its step is traced.
RAW_MINIMAL = rk.as_policy(
    jax.checkpoint_policies.save_only_these_names(
        "query_proj", "value_proj", "key_proj", "kv_proj", "qkv_proj", "out_proj",
        "mlpwi_0", "mlpwi_1", "mlpwi", "mlpwo",
    )
)  # fmt: skip

# A custom offload written as MaxText's per-tensor lines and a raw jax policy (handed to the
# decoder), each on the small Llama: the two ways a policy reaches MaxText's step. MaxText's
# own policy by name ("maxtext:remat_policy=...") takes the first way, a config line
# (test_config_lines checks its line), so it is not compiled again here. Other families,
# meshes and keys are compiled against MaxText's own path by experiments/maxtext_scale.py
# (results/maxtext_scale.json); here their compiles cost the suite minutes and test no other
# path of the source.
CASES = {
    # A custom offload set by MaxText's per-tensor lines, on two hosts of 4 GPUs: data
    # parallel across them (dcn_data_parallelism) and fsdp within. One compile for two paths
    # of the source (the custom lines; a mesh across hosts), each side.
    "custom-offload-two-hosts": Case(
        f"{LLAMA} dcn_data_parallelism=2 ici_fsdp_parallelism=4",
        "offload:offload=decoder_layer_input,save=out_proj",
        (("remat_policy", "custom"), ("decoder_layer_input", "offload"), ("out_proj", "device")),
        gpus=8,
        hosts=2,
    ),
    # On one GPU whose step accumulates over two micro-batches: MaxText's batch
    # (per_device_batch_size x GPUs) is one of the step's micro-batches.
    "raw-callable-accumulation": Case(
        f"{LLAMA} gradient_accumulation_steps=2",
        RAW_MINIMAL,
        (("remat_policy", "minimal"),),
        gpus=1,
    ),
    # MaxText checkpoints each pipeline iteration itself; the policy acts inside, set by a
    # config line or handed to the decoder (which the pipeline is built with).
    "pipeline": Case(PIPELINE, "full", (("remat_policy", "full"),), gpus=2, batch=4),
    "pipeline-raw-callable": Case(
        PIPELINE, RAW_MINIMAL, (("remat_policy", "minimal"),), gpus=2, batch=4
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_figures_equal_maxtexts_own_path(case, ours, theirs):
    pytest.importorskip("maxtext")
    got, own = ours(case), theirs(case)
    assert "error" not in own, own["error"]
    assert own["prng_impl"] == "unsafe_rbg"  # MaxText's entry point's key type
    applied = "decoder's get_remat_policy" if case.policy is RAW_MINIMAL else "config"
    if "ici_pipeline_parallelism" in case.words:
        assert got.meta["maxtext"]["pipeline"]["microbatches"] == 4
    assert got.meta["maxtext"]["policy_applied"] == applied
    assert {f: getattr(got, f"{f}_bytes") for f in FIVE} == {f: own[f] for f in FIVE}
    assert got.peak_bytes == own["argument"] + own["output"] + own["temp"] - own["alias"]


@pytest.mark.slow
def test_accumulation_counts_every_micro_batch(ours, theirs):
    # --batch 8 with gradient_accumulation_steps=2 trains 16 sequences a step (MaxText's own
    # step takes a batch of 16): the report's batch, tokens and title count them all, and so
    # does a search's tokens/s (the workload's tokens).
    from remat_kit.render import report_table

    case = CASES["raw-callable-accumulation"]
    got, own = ours(case), theirs(case)
    assert own["sequences"] == 2 * case.batch
    assert (got.meta["batch"], got.meta["accum"]) == (own["sequences"], 2)
    assert got.tokens_per_step == own["sequences"] * case.seq
    title = report_table(got, rk.target("h100", devices=case.gpus)).title
    assert f"b{own['sequences']} s{case.seq} " in title and " accum2 " in title
    src = rk.sources.resolve(MaxTextSpec(case.words))
    target = rk.target("h100", devices=case.gpus)
    work = rk.sources.workload(src, target, rk.TrainConfig(case.batch, case.seq))
    assert work.tokens(case.batch) == own["sequences"] * case.seq
    assert work.tokens(2 * case.batch) == 2 * own["sequences"] * case.seq


@pytest.mark.parametrize(
    ("words", "quantized"), [("", None), ("quantization=fp8", "fp8"), ("quantization=int8", "int8")]
)
@IMPORTS_MAXTEXT
def test_quantization_is_named_in_the_precision_line(words, quantized):
    # Traced, not compiled: MaxText's quantized matmuls are named beside the compute dtype
    # in the precision line every title carries (its config's, whoever set it).
    pytest.importorskip("maxtext")
    from remat_kit.render import precision_words

    src = rk.sources.resolve(MaxTextSpec(f"{LLAMA} {words}"))
    built = src.build_step(
        rk.policies.FULL, rk.parse_schedule("none"), rk.TrainConfig(BATCH, SEQ), rk.target("h100")
    )
    line = precision_words(built.step.precision)
    assert line.endswith(f"compute bf16 quantized {quantized}" if quantized else "compute bf16")


@pytest.mark.slow
def test_a_multi_host_mesh_is_maxtexts_across_hosts(theirs):
    # MaxText's create_device_mesh lays the dcn axis across the slices it finds: a host each
    # on a GPU cluster. Ours (built, not compiled) holds the devices in MaxText's own order,
    # and each index of the data axis is one host's GPUs.
    case = CASES["custom-offload-two-hosts"]
    src = rk.sources.resolve(MaxTextSpec(case.words))
    config = rk.TrainConfig(case.batch, case.seq)
    built = src.build_step(rk.policies.FULL, rk.parse_schedule("none"), config, case.target())
    mesh = built.step.mesh
    own = theirs(case)["mesh"]
    assert [int(d.id) for d in mesh.devices.reshape(-1)] == own["ids"]
    assert {k: int(v) for k, v in mesh.shape.items()} == own["shape"]
    hosts = [{int(d.process_index) for d in mesh.devices[0, i].reshape(-1)} for i in range(2)]
    assert mesh.axis_names[:2] == ("diloco", "data") and hosts == [{0}, {1}]


@IMPORTS_MAXTEXT
def test_an_offload_maxtexts_pipeline_cannot_combine_is_refused_before_a_trace():
    # MaxText's pipeline combines a decoder policy with its saved inputs through jax's
    # save_from_both_policies, which takes no offload: one line naming the way that works.
    pytest.importorskip("maxtext")
    src = rk.sources.resolve(MaxTextSpec(PIPELINE))
    config, target = rk.TrainConfig(4, SEQ), rk.target("h100", devices=2)
    policy = rk.as_policy("offload:offload=block_out")
    with pytest.raises(BadValue, match=r"takes no offload \(block_out\).*remat_policy: custom"):
        src.build_step(policy, rk.parse_schedule("none"), config, target)


@IMPORTS_MAXTEXT
def test_plan_leaves_out_an_offload_a_pipeline_cannot_take_and_says_why(
    monkeypatch, capsys, no_compile
):
    # plan's default catalogue on a pipeline: offload_dots_no_batch (a dot offload, handed to
    # the decoder) meets the pipeline's save_from_both_policies, which MaxText's own step
    # would raise on. It is left out and named with MaxText's reason (traced, not compiled:
    # the search is stubbed); minimal_offloaded, set by custom lines, stays.
    pytest.importorskip("maxtext")
    from remat_kit.cli import _plan, main
    from remat_kit.search import FRONT_POLICIES

    seen = {}

    def search(args, run, w, budget, catalogue, host_budget):
        seen["catalogue"] = [p.spec for p in catalogue]

    monkeypatch.setattr(_plan, "_search", search)
    monkeypatch.setattr(_plan, "_print_plan", lambda *a: 0)
    argv = ["plan", "--maxtext", PIPELINE, "--gpus", "2", "--batch", "4", "--seq", str(SEQ)]
    assert main([*argv, "--budget", "100MiB"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "offload_dots_no_batch" not in seen["catalogue"]
    assert {"full", "dots", "minimal", "minimal_offloaded"} <= set(seen["catalogue"])
    assert (
        "not on the front: offload_dots_no_batch: MaxText's pipeline checkpoints each "
        "iteration with the decoder's policy and its own saved inputs (jax's "
        "save_from_both_policies), which takes no offload (of matmul outputs)" in out
    )
    # Named by the user, it is refused in one line as its step is built, not left out.
    src = rk.sources.resolve(MaxTextSpec(PIPELINE))
    kept, notes = rk.sources.buildable_policies(
        src, rk.TrainConfig(4, SEQ), rk.target("h100", devices=2), FRONT_POLICIES
    )
    assert [n.data["policy"] for n in notes] == ["offload_dots_no_batch"]
    assert len(kept) == len(FRONT_POLICIES) - 1
    assert rk.sources.buildable_policies(
        rk.sources.resolve(MaxTextSpec(LLAMA)), rk.TrainConfig(4, SEQ), rk.target("h100"),
        FRONT_POLICIES,
    )[1] == []  # fmt: skip


@IMPORTS_MAXTEXT
def test_a_dot_policys_expert_check_traces_a_batch_the_pipeline_takes():
    # The check for recomputed expert GEMMs under a dot policy traces one GPU's micro-batch:
    # on a pipeline never below its micro-batches (4), which MaxText refuses a batch of 1 for.
    pytest.importorskip("maxtext")
    from remat_kit.sources._steps import _expert_notes

    src = rk.sources.resolve(MaxTextSpec(PIPELINE))
    target = rk.target("h100", devices=2)
    got = _expert_notes(
        src, rk.policy("dots"), rk.parse_schedule("none"), rk.TrainConfig(4, SEQ), target,
        src.batch_ways(target), bool(jax.config.jax_remat3),
    )  # fmt: skip
    assert got == ()  # a dense Llama: no expert GEMMs


@IMPORTS_MAXTEXT
def test_a_pipelines_iteration_inputs_are_in_the_residual_table_as_jax_keeps_them():
    # Traced, not compiled: under `full` MaxText's pipeline checkpoints each iteration saving
    # its iteration_input and decoder_layer_input (its get_pipeline_remat_policy); a stage's
    # decoder_layer_input is its iteration_input constrained, one value, which jax keeps once
    # per iteration: bf16[iterations, stages, micro-batch, seq, width] out of the scan.
    import contextlib
    import io

    pytest.importorskip("maxtext")
    src = rk.sources.resolve(MaxTextSpec(PIPELINE))
    config, target = rk.TrainConfig(4, SEQ), rk.target("h100", devices=2)
    res = rk.sources.residuals(src, "full", target, config)
    built = src.build_step(rk.policies.FULL, rk.parse_schedule("none"), config, target)
    step = built.step
    # its figures are per device of MaxText's own mesh, which the source labels for render
    assert built.meta["devices"] == 2 == math.prod(built.meta["maxtext"]["mesh"].values())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        jax.ad_checkpoint.print_saved_residuals(step.loss_fn, *step.loss_args)
    stacked = [
        line
        for line in out.getvalue().splitlines()
        if re.match(rf"bf16\[\d+,2,1,{SEQ},{WIDTH}\] output of scan ", line)
    ]
    assert len(stacked) == 1, out.getvalue()
    iterations = int(re.match(r"bf16\[(\d+),", stacked[0]).group(1))
    assert iterations == 4 * 2 + 2 - 1  # micro-batches x repeats + stages - 1: MaxText's loop
    kept = iterations * 2 * 1 * SEQ * WIDTH * 2
    assert {t: res.tags[t] for t in ("iteration_input", "decoder_layer_input")} == {
        "iteration_input": "saved",
        "decoder_layer_input": "saved",
    }
    assert res.kept_bytes("iteration_input") == res.kept_bytes("decoder_layer_input") == kept


@pytest.mark.parametrize(
    ("words", "layers"),
    [(PIPELINE, 4), (f"{LLAMA} dcn_data_parallelism=2 num_slices=2", 2)],
    ids=["pipeline", "two-slices"],
)
@IMPORTS_MAXTEXT
def test_layers_are_counted_without_a_probe_maxtext_refuses(words, layers):
    # Read without a compile: the probe is neither a batch-of-one config with 4 micro-batches
    # nor one device with a cross-host axis, which MaxText refuses.
    pytest.importorskip("maxtext")
    assert rk.sources.resolve(MaxTextSpec(words)).n_layers() == layers


@IMPORTS_MAXTEXT
def test_maxtexts_key_type_holds_for_its_build_only():
    # Traced, not compiled: the train state's keys are MaxText's (unsafe_rbg, 16 bytes), and
    # the process's own key type is what it was before and after the build and trace.
    pytest.importorskip("maxtext")
    before = jax.config.jax_default_prng_impl
    src = rk.sources.resolve(MaxTextSpec(LLAMA))
    built = src.build_step(
        rk.policies.FULL, rk.parse_schedule("none"), rk.TrainConfig(BATCH, SEQ), rk.target("h100")
    )
    keys = [
        x
        for x in jax.tree.leaves(built.step.args)
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
    ]
    assert keys and {str(k.dtype) for k in keys} == {"key<urbg>"}
    jax.make_jaxpr(built.step.loss_fn)(*built.step.loss_args)
    assert jax.config.jax_default_prng_impl == before == "threefry2x32"
    assert str(jax.random.key(0).dtype) == "key<fry>"


@IMPORTS_MAXTEXT
def test_none_is_the_step_without_a_checkpoint_and_full_a_config_line():
    # Traced, not compiled: under `none` MaxText's step holds no checkpoint at all (its
    # decoder's jax.checkpoint left out); under `full` the config line sets it.
    pytest.importorskip("maxtext")
    src = rk.sources.resolve(MaxTextSpec(LLAMA))
    target, config = rk.target("h100"), rk.TrainConfig(BATCH, SEQ)
    none = src.build_step(rk.policies.NO_REMAT, rk.parse_schedule("none"), config, target)
    assert none.meta["maxtext"]["policy_applied"] == "no jax.checkpoint"
    closed = jax.make_jaxpr(none.step.loss_fn)(*none.step.loss_args)
    assert rk.checks.checkpoint_policies(closed) == []
    full = src.build_step(rk.policies.FULL, rk.parse_schedule("none"), config, target)
    assert full.meta["maxtext"]["policy_lines"] == ["remat_policy: full"]
    closed = jax.make_jaxpr(full.step.loss_fn)(*full.step.loss_args)
    assert rk.checks.checkpoint_policies(closed)


@pytest.mark.parametrize(
    ("policy", "lines"),
    [
        ("full", ("remat_policy: full",)),
        ("maxtext:remat_policy=minimal_offloaded", ("remat_policy: minimal_offloaded",)),
        (
            "names:save=query_proj+mlpwo",
            (
                "remat_policy: custom",
                "decoder_layer_input: remat",
                "query_proj: device",
                "mlpwo: device",
            ),
        ),
        (
            "offload:offload=decoder_layer_input+context,save=mlpwi_0",
            (
                "remat_policy: custom",
                "decoder_layer_input: offload",
                "context: offload",
                "mlpwi_0: device",
            ),
        ),
        (
            "qkv_proj",  # a catalogue policy by name: its names as lines
            (
                "remat_policy: custom",
                "decoder_layer_input: remat",
                "query_proj: device",
                "key_proj: device",
                "value_proj: device",
            ),
        ),
        ("dots", None),  # a dot policy: no config line sets it
        ("megatron", None),  # block_out, router_logits ...: names MaxText has no line for
        ("none", None),
        ("names:save=attn_norm", None),  # a name MaxText's custom keys do not take
        ("offload:offload=context,dst=unpinned_host", None),  # MaxText offloads to pinned host
    ],
)
def test_config_lines(policy, lines):
    if "attn_norm" in policy:  # a name outside remat_kit's vocabulary: said as the policy is made
        with pytest.warns(UserWarning, match="'attn_norm' .*not in remat_kit's tag vocabulary"):
            assert config_lines(policy) == lines
    else:
        assert config_lines(policy) == lines


@IMPORTS_MAXTEXT
def test_custom_tensors_are_those_maxtexts_custom_policy_reads():
    pytest.importorskip("maxtext")
    from maxtext.configs import pyconfig

    # Every tensor MaxText's config takes a line for, set to `device`: MaxText's own
    # `tensors_on_device` lists those `custom` reads.
    base = Path(pyconfig.__file__).parent / "base.yml"
    keys = [
        line.split(":")[0]
        for line in base.read_text().splitlines()
        if line.split("#")[0].strip().endswith(("'remat'", "'device'", "'offload'"))
    ]
    # The sparse-attention indexer's line is valid only with the indexer on (MaxText says so).
    keys = [k for k in keys if k != "indexer_cutoff_threshold"]
    config = pyconfig.initialize(
        # jax_cache_dir=: else MaxText points jax's persistent cache at ~/jax_cache for the
        # rest of this worker's tests.
        ["test", str(base), "jax_cache_dir=", "remat_policy=custom", *(f"{k}=device" for k in keys)]
    )
    assert {*config.tensors_on_device, "indexer_cutoff_threshold"} == set(CUSTOM_TENSORS)


@pytest.mark.parametrize(
    ("words", "match"),
    [
        (
            "model_name=llama2-7b per_device_batch_size=4",
            r"per_device_batch_size is set by the batch",
        ),
        (
            "model_name=llama2-7b max_target_length=4096",
            r"max_target_length is set by the sequence length",
        ),
        ("model_name=llama2-7b remat_policy=full", r"remat_policy is set by the policy"),
        ("model_name=llama2-7b context=offload", r"context is set by the policy"),
        ("model_name=llama2-7b oops", r"word 'oops'.*key=value"),
        ("model_name=a model_name=b", r"give model_name twice"),
    ],
)
def test_words_the_command_line_owns_are_refused(words, match):
    with pytest.raises(BadValue, match=match):
        MaxTextSpec(words).overrides  # noqa: B018


def test_yaml_path_first_then_words():
    spec = MaxTextSpec("my.yml base_num_decoder_layers=2")
    assert (spec.yaml, spec.overrides) == ("my.yml", (("base_num_decoder_layers", "2"),))
    assert MaxTextSpec("model_name=llama2-7b").yaml == "base.yml"


@IMPORTS_MAXTEXT
def test_a_config_read_from_one_read_before_is_maxtexts_own(monkeypatch):
    # A search reads a config per policy and batch; one that differs from a config read
    # before only in the batch, sequence, device count or remat lines is made from that
    # one's merged YAML (MaxText's merge is 0.3 s): each is the config MaxText's own
    # pyconfig.initialize makes of the same words, refusals included.
    pytest.importorskip("maxtext")
    from remat_kit_models.maxtext_source import _config as source

    monkeypatch.setenv("JOBSET_NAME", "same-run")  # else the run's name carries the minute
    mt = source._maxtext()
    spec = MaxTextSpec(PIPELINE)
    yaml = Path(mt.pyconfig.__file__).parent / "base.yml"

    def words(batch, seq, gpus, lines):
        return source._settings(spec, rk.TrainConfig(batch, seq), gpus, lines)

    custom = ("remat_policy: custom", "decoder_layer_input: offload", "out_proj: device")
    source._initialize(mt, yaml, words(8, 128, 2, ()))  # the one read in full, no remat lines
    for batch, seq, gpus, lines in [
        (8, 256, 4, ("remat_policy: custom", "decoder_layer_input: remat", "out_proj: offload")),
        (16, 64, 2, custom),
        (16, 64, 2, ()),
        (2, 256, 4, custom),  # a batch the pipeline's micro-batches refuse
    ]:
        w = words(batch, seq, gpus, lines)
        got = source._from_merged(mt, yaml, w)
        try:
            own = mt.pyconfig.initialize(["remat-kit", str(yaml), *w])
        except Exception:
            assert got is None
            continue
        assert got is not None and got.get_keys() == own.get_keys()
        assert got._pydantic_config == own._pydantic_config
        fields = got._pydantic_config.__pydantic_fields_set__
        assert fields == own._pydantic_config.__pydantic_fields_set__


def test_maxtexts_reason_for_refusing_a_config_is_kept_whole(tmp_path, monkeypatch):
    # pydantic's ValidationError as MaxText's MaxTextConfig raises it (two fields, one of them
    # a model validator's multi-line ValueError): each field and what pydantic said of it on
    # one line, not "ValidationError: 2 validation errors for MaxTextConfig" (issue 59).
    pydantic = pytest.importorskip("pydantic")
    from typing import Literal

    from remat_kit_models.maxtext_source import _config as source

    class MaxTextConfig(pydantic.BaseModel):
        remat_policy: Literal["full", "minimal"] = "full"
        base_emb_dim: int = 256

        @pydantic.field_validator("base_emb_dim")
        @classmethod
        def _positive(cls, v: int) -> int:
            if v <= 0:
                raise ValueError("base_emb_dim must be\n    positive")
            return v

    with pytest.raises(pydantic.ValidationError) as refused:
        MaxTextConfig(remat_policy="fulll", base_emb_dim=-1)
    assert str(refused.value).splitlines()[0] == "2 validation errors for MaxTextConfig"
    assert source._refusal(refused.value) == (
        "MaxTextConfig: remat_policy: Input should be 'full' or 'minimal' (got 'fulll'); "
        "base_emb_dim: Value error, base_emb_dim must be positive (got -1)"
    )
    # Any other error (MaxText's ValueError, an assert): its whole message on one line.
    assert source._refusal(ValueError("a\n  b\n\nc")) == "ValueError: a b c"
    assert source._refusal(AssertionError()) == "AssertionError"
    # The library's message carries it, so the CLI's one line does (no MaxText needed).
    yml = tmp_path / "my.yml"
    yml.write_text("")

    def initialize(argv):
        MaxTextConfig(remat_policy="fulll")

    fake = SimpleNamespace(pyconfig=SimpleNamespace(initialize=initialize, __file__=str(yml)))
    monkeypatch.setattr(source, "_maxtext", lambda: fake)
    with pytest.raises(BadValue) as err:
        source._config(MaxTextSpec(f"{yml} base_num_decoder_layers=2"), ("a=1",))
    assert str(err.value) == (
        "MaxText refused the config: MaxTextConfig: remat_policy: Input should be 'full' or "
        "'minimal' (got 'fulll')"
    )


def _after_maxtext(argv: tuple[str, ...], match: str) -> object:
    """A refusal MaxText makes itself (its config, its mesh): its model code is imported first."""
    return pytest.param(argv, match, marks=IMPORTS_MAXTEXT)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        _after_maxtext(
            ("--maxtext", "model_name=no-such-model"),
            # MaxText's own reason whole: the field, what it said and the value (issue 59)
            r"^remat-kit: --maxtext model_name=no-such-model: MaxText refused the config: "
            r"MaxTextConfig: model_name: Input should be .*'llama2-7b'.* \(got 'no-such-model'\)$",
        ),
        _after_maxtext(
            ("--maxtext", "model_name=llama2-7b", "ici_fsdp_parallelism=3", "--gpus", "4"),
            r"^remat-kit: --maxtext .*: MaxText's mesh for 4 GPU\(s\)",
        ),
        _after_maxtext(
            ("--maxtext", PIPELINE, "--gpus", "2", "--batch", "2"),
            # The reason is MaxText's own at the user's batch, whole (not a probe's).
            r"^remat-kit: --maxtext .*: MaxText refused the config: MaxTextConfig: Assertion "
            r"failed, The batch size for a single forward pass \(2\) must be divisible by the "
            r"number of microbatches \(4\)$",
        ),
        _after_maxtext(("--maxtext", "model_name=llama2-7b", "--optimizer", "sgd"), r"--optimizer"),
        # A YAML that is not there is refused before MaxText is imported.
        (("--maxtext", "missing.yml", "a=1"), r"missing.yml: no such file"),
        _after_maxtext(("--maxtext", "model_name=llama2-7b", "attention=flash"), r"Pallas Triton"),
        _after_maxtext(("--maxtext", "model_name=llama2-7b", "--shard", "fsdp:4"), r"--shard"),
    ],
)
def test_cli_bad_maxtext_input_is_one_line_exit_2(argv, match, capsys, no_compile):
    pytest.importorskip("maxtext")
    from remat_kit.cli import main

    assert main(["report", *argv]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in err + out, err
    assert re.search(match, err), err


@pytest.mark.slow
def test_a_policy_naming_tensors_maxtext_never_carries_is_set_by_lines_of_those_it_does(
    monkeypatch, tmp_path
):
    # megatron names block_out, attn_out and router_logits beside MaxText's projections: no
    # custom line takes those, but this Llama's step carries none of them, so its lines
    # (the projections and the layer input on the device) set megatron, as plan prints.
    import warnings

    from remat_kit import cache, sources
    from remat_kit_models import maxtext_source

    src = sources.resolve(MaxTextSpec(LLAMA))
    config, target = rk.TrainConfig(BATCH, SEQ), rk.target("h100", devices=GPUS)
    pol = rk.policy("megatron")
    saved = ("query_proj", "key_proj", "value_proj", "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo")
    want = ("remat_policy: custom", "decoder_layer_input: device", *(f"{n}: device" for n in saved))
    assert src.policy_lines(pol, config, target) == want

    def measured(where):
        monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / where))  # the two paths apart
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return sources.measure(src, pol, target, config)

    lines = measured("lines")
    assert lines.meta["maxtext"]["policy_lines"] == list(want)
    # The path before: MaxText's decoder handed jax's megatron policy itself, no line.
    monkeypatch.setattr(maxtext_source.MaxTextSource, "_lines", lambda *a: None)
    handed = measured("handed")
    assert handed.meta["maxtext"]["policy_applied"] == "decoder's get_remat_policy"
    assert [getattr(lines, f"{k}_bytes") for k in FIVE] == [
        getattr(handed, f"{k}_bytes") for k in FIVE
    ]


def test_plan_prints_a_maxtext_plan_as_config_lines():
    # What plan prints after its answer for a MaxText model (the whole run is in
    # docs/your-model.md: its cost model traces MaxText's step ~20 times, more than the
    # suite's budget allows).
    import types

    from remat_kit.cli._plan import _config_lines, config_words
    from remat_kit_models.maxtext import MaxTextSource

    source = MaxTextSource(MaxTextSpec(LLAMA))  # its lines need no MaxText
    config, target = rk.TrainConfig(BATCH, SEQ), rk.target("h100", devices=GPUS)
    run = types.SimpleNamespace(source=source, config=config, target=target)
    plan = types.SimpleNamespace(policy=rk.policy("qkv_proj"), schedule=rk.parse_schedule("none"))
    lines = _config_lines(run, plan)
    assert lines == (
        "remat_policy: custom",
        "decoder_layer_input: remat",
        "query_proj: device",
        "key_proj: device",
        "value_proj: device",
    )
    assert config_words(lines).splitlines()[1:] == [f"  {x}" for x in lines]
    other = types.SimpleNamespace(policy=rk.policy("dots"), schedule=plan.schedule)
    assert _config_lines(run, other) is None


@pytest.mark.parametrize("resolve_or_config", ["resolve", "config"])
def test_a_yaml_that_is_not_there_is_refused_before_maxtext_is_imported(
    resolve_or_config, monkeypatch, tmp_path
):
    # MaxText's model code takes about 9 s to import: a typo in the YAML's path is one line
    # before it, by either door (the source's resolve, and the config it builds later).
    from remat_kit_models.maxtext_source import _config, _source

    def no_import():
        pytest.fail("MaxText was imported before the YAML was looked for")

    monkeypatch.setattr(_config, "_maxtext", no_import)
    monkeypatch.setattr(_source, "_maxtext", no_import)
    spec = MaxTextSpec(f"{tmp_path / 'missing.yml'} a=1")
    with pytest.raises(BadValue, match=r"missing\.yml: no such file; give a MaxText YAML"):
        if resolve_or_config == "resolve":
            _source.resolve(spec)
        else:
            _config._config.__wrapped__(spec, ("a=1",))
