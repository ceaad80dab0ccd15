"""Notes as data: every kind's words, the records' validation, and their JSON round trip.

The library returns :class:`remat_kit.notes.Note` records; :func:`remat_kit.notes.words`
makes the sentences. Each expected sentence below is written out by hand (not computed by the
code under test), so a changed figure, unit or word fails here.
"""

from __future__ import annotations

import dataclasses
import json
import warnings

import jax
import jax.numpy as jnp
import pytest

import remat_kit as rk
from remat_kit.errors import BadType, BadValue
from remat_kit.notes import KINDS, Note, words

GIB = 2**30

_SOLVER = {
    "decisions": {"a": "save", "b": "recompute", "c": "offload"},
    "layer_decisions": {"a": "recompute"},
    "layers": 2,
    "optimal": False,
    "status": "time limit",
    "gap": 0.0123,
    "solver": "highs",
    "programs": 3,
}
_PLAN_NONE = {
    "kind": "plan_fits",
    "policy": "none",
    "schedule": "none",
    "budget_bytes": 2 * GIB,
    "peak_bytes": GIB,
    "recompute_overhead": 0.0,
    "source": "none",
    "solver": None,
}

#: (kind, data, the sentence), at least one case per kind.
CASES = [
    (
        "no_tag_matched",
        {"policy": "names:save=foo", "names": ["foo"], "tags": ["a", "b"]},
        "policy 'names:save=foo' names foo but the program tags none of them (it has: a, b); "
        "it behaves like 'full'",
    ),
    (
        "no_tag_matched",
        {"policy": "context", "names": ["context"], "tags": []},
        "policy 'context' names context but the program tags none of them (it has: no tags); "
        "it behaves like 'full'",
    ),
    (
        "flash_recomputes_scores",
        {"policy": "minimal", "kept": ["context", "query_proj"]},
        "'minimal' recomputes attention scores/probabilities, which do not exist under flash "
        "attention (the kernel recomputes them itself): here it is equivalent to "
        "names:save=context+query_proj",
    ),
    (
        "ragged_dots_recomputed",
        {
            "policy": "dots_no_batch",
            "per_layer_bytes": 3 * 2**20,
            "layers": 32,
            "suggest": "dots_no_batch_and_ragged",
        },
        "policy 'dots_no_batch' keeps matmul outputs but recomputes the grouped expert GEMMs "
        "(ragged_dot_general): 3.00 MiB per layer, 32 layers; policy "
        "'dots_no_batch_and_ragged' keeps them",
    ),
    (
        "ragged_dots_recomputed",
        {"policy": "my_policy", "per_layer_bytes": 2**19, "layers": 1, "suggest": None},
        "policy 'my_policy' keeps matmul outputs but recomputes the grouped expert GEMMs "
        "(ragged_dot_general): 512.00 KiB per layer, 1 layer; "
        "rk.policy('either', a=<this policy>, b='ragged_dots') keeps them",
    ),
    (
        "expert_dots_recomputed",
        {"policy": "dots_no_batch", "per_layer_bytes": 5 * 2**20, "layers": 48},
        "policy 'dots_no_batch' keeps weight matmuls but recomputes batched matmuls against "
        "weights (expert GEMMs with the expert as a batch dimension, maxtext#2207): 5.00 MiB per "
        "layer, 48 layers; save them by their tags (minimal does on the presets) or with "
        "'dots', which keeps every batched product too",
    ),
    (
        "offload_on_cpu",
        {"policy": "offload_dots"},
        "policy 'offload_dots' offloads to host, but a cpu compile does not measure host memory "
        "(XLA reports 0 host bytes on cpu): compile for a GPU target to see them",
    ),
    (
        "offload_moved_nothing",
        {"policy": "offload_dots"},
        "policy 'offload_dots' offloads to host but XLA moved 0 bytes there: nothing it names "
        "is a residual of this program",
    ),
    (
        "xla_remat",
        {"target": "h100-80gb", "saved_bytes": 3 * 2**29},
        "XLA's own rematerialization pass took 1.50 GiB off the peak to fit h100-80gb: these "
        "figures include XLA's choices on top of the policy",
    ),
    (
        "xla_remat_made_fit",
        {
            "policy": "none",
            "schedule": "none",
            "axis": "batch",
            "value": 297,
            "saved_bytes": 3 * 2**30,
            "peak_bytes": 59 * 2**30,
            "limit_bytes": 60 * 2**30,
        },
        "none: batch 297 fits only because XLA's own rematerialization pass took 3.00 GiB off "
        "its peak (62.00 GiB without it, 2.00 GiB over the 60.00 GiB limit): XLA recomputes "
        "what the policy keeps, so the step does more work than its recompute figure says (traced "
        "before XLA's pass) and runs slower than 'none' suggests",
    ),
    (
        "does_not_fit",
        {
            "target": "rtx4090",
            "runtime": "XLA_PYTHON_CLIENT_MEM_FRACTION=0.75",
            "usable_bytes": 18 * GIB,
            "memory_bytes": 24 * GIB,
            "peak_bytes": 20 * GIB,
            "over_bytes": 2 * GIB,
            "fits_with_fraction": 0.85,
            "reserved_by": None,
        },
        "does not fit rtx4090 at XLA_PYTHON_CLIENT_MEM_FRACTION=0.75 (18.00 GiB usable of "
        "24.00 GiB): peak 20.00 GiB is 2.00 GiB over; it fits with "
        "XLA_PYTHON_CLIENT_MEM_FRACTION=0.85",
    ),
    (
        "does_not_fit",
        {
            "target": "l4",
            "runtime": None,
            "usable_bytes": 16 * GIB,
            "memory_bytes": 24 * GIB,
            "peak_bytes": 40 * GIB,
            "over_bytes": 24 * GIB,
            "fits_with_fraction": None,
            "reserved_by": None,
        },
        "does not fit l4 at the runtime (16.00 GiB usable of 24.00 GiB): peak 40.00 GiB is "
        "24.00 GiB over; no allocator fraction makes it fit",
    ),
    (
        # a TPU: no allocator, no fraction to offer
        "does_not_fit",
        {
            "target": "v5e-4",
            "runtime": None,
            "usable_bytes": 16 * GIB - 258 * 2**20,
            "memory_bytes": 16 * GIB,
            "peak_bytes": 20 * GIB,
            "over_bytes": 4 * GIB + 258 * 2**20,
            "fits_with_fraction": None,
            "reserved_by": "libtpu",
        },
        "does not fit v5e-4 (15.75 GiB usable of 16.00 GiB: libtpu keeps the rest): peak "
        "20.00 GiB is 4.25 GiB over",
    ),
    ("xla_log", {"line": "XLA (foo.cc:12): a line"}, "XLA (foo.cc:12): a line"),
    (
        "attention_chose_xla",
        {"problem": "its training kernel needs an even sequence length (got seq=63)"},
        "attention=auto measured xla: cuDNN flash attention its training kernel needs an even "
        "sequence length (got seq=63)",
    ),
    (
        "maxtext_attention",
        {"chosen": "cudnn_flash_jax"},
        "attention=cudnn_flash_jax: the config names no kernel, and MaxText's default on a GPU "
        "(tokamax's Pallas Triton flash attention) compiles only on a GPU present; set "
        "attention= in --maxtext to choose",
    ),
    (
        "maxtext_xla_remat",
        {"disabled": True},
        "XLA's own rematerialization pass is off (XLA_FLAGS "
        "--xla_disable_hlo_passes=rematerialization, as MaxText's GPU configs set it)",
    ),
    (
        "maxtext_pipeline_offload",
        {"policy": "offload:offload=block_out", "offloaded": ["block_out"]},
        "offload:offload=block_out: MaxText's pipeline checkpoints each iteration with the "
        "decoder's policy and its own saved inputs (jax's save_from_both_policies), which "
        "takes no offload (block_out); a pipeline offloads only through MaxText's remat_policy: "
        "custom lines (a policy naming its tensors: minimal_offloaded, offload:offload=...)",
    ),
    (
        "whole_model_probes",
        {"model": "f.py:deep", "layers": 32},
        "f.py:deep takes no layers=: its 32 identical layers are compiled whole in every "
        "program (a search compiles several); a factory that takes layers=N is answered from "
        "compiles of 2 and 3 layers (docs/unrolled.md)",
    ),
    (
        "breakdown_upper_bound",
        {"peak_bytes": 13 * GIB, "known_bytes": 16 * GIB},
        "the peak (13.00 GiB) is below weights + gradients + optimizer state + batch (16.00 GiB): "
        "XLA never holds every gradient at once here, so this split is only an upper bound per "
        "part (activations shown as 0); a measured breakdown reads what is live at the peak",
    ),
    (
        "offload_shortfall",
        {"moved_bytes": GIB // 10, "marked_bytes": GIB},
        "offload moved 102.40 MiB to host of the 1.00 GiB jax marked for offload (10%): XLA kept "
        "the rest on the device, so the peak is not what the policy promises; offload needs "
        "scanned layers",
    ),
    (
        "offload_link_bound",
        {
            "target": "h100-80gb",
            "host_bytes": 3 * GIB,
            "transfer_seconds": 0.25,
            "step_compute_seconds": 0.1,
        },
        "offloading 3.00 GiB per step needs an estimated 250 ms on h100-80gb's host link, more "
        "than the step's 100 ms of compute: it cannot hide behind compute",
    ),
    (
        "no_tag_matched_in",
        {"policy": "context", "names": ["context"], "where": "m", "tags": ["a", "b"]},
        "policy 'context' names context but m tags none of them, so it behaves like 'full'; "
        "tags there: a, b",
    ),
    (
        "no_tag_matched_in",
        {"policy": "context", "names": ["context"], "where": "m", "tags": []},
        "policy 'context' names context but m tags none of them, so it behaves like 'full'; "
        "tags there: none (tag the model: remat_kit.tagging, or checkpoint_name in its code)",
    ),
    (
        "no_tag_matched_in",
        {"policy": "p", "names": ["x"], "where": "m", "tags": [f"t{i:02d}" for i in range(14)]},
        "policy 'p' names x but m tags none of them, so it behaves like 'full'; tags there: "
        "t00, t01, t02, t03, t04, t05, t06, t07, t08, t09, t10, t11 ... (2 more)",
    ),
    (
        "stray_tag_names",
        {
            "policy": "names:save=mlp_gat",
            "names": {"mlp_gat": "mlp_gate"},
            "where": "m",
            "tags": ["mlp_gate"],
        },
        "policy 'names:save=mlp_gat' names 'mlp_gat' (did you mean 'mlp_gate'?), which is no tag "
        "of m; tags there: mlp_gate",
    ),
    (
        "stray_tag_names",
        {"policy": "p", "names": {"a": None, "b": "bb"}, "where": "m", "tags": []},
        "policy 'p' names 'a', 'b' (did you mean 'bb'?), which is no tag of m; tags there: none "
        "(tag the model: remat_kit.tagging, or checkpoint_name in its code)",
    ),
    (
        "batch_fits",
        {
            "policy": "full",
            "schedule": "none",
            "batch": 8,
            "peak_bytes": GIB,
            "limit_bytes": 2 * GIB,
            "next_batch": 9,
            "next_peak_bytes": 5 * 2**29,
            "unbuildable": None,
            "cap": 16384,
        },
        "full: batch 8 fits (1.00 GiB of 2.00 GiB), batch 9 does not (2.50 GiB)",
    ),
    (
        "batch_fits",
        {
            "policy": "full",
            "schedule": "sqrt",
            "batch": 16,
            "peak_bytes": GIB,
            "limit_bytes": 2 * GIB,
            "next_batch": None,
            "next_peak_bytes": None,
            "unbuildable": None,
            "cap": 16,
        },
        "full @ sqrt: batch 16 fits (1.00 GiB of 2.00 GiB); stopped at the cap 16",
    ),
    (
        "batch_fits",
        {
            "policy": "none",
            "schedule": "none",
            "batch": 30,
            "peak_bytes": GIB,
            "limit_bytes": 2 * GIB,
            "next_batch": 31,
            "next_peak_bytes": None,
            "unbuildable": "INTERNAL: RET_CHECK failure",
            "cap": 16384,
        },
        "none: batch 30 fits (1.00 GiB of 2.00 GiB), batch 31 cannot be built by XLA "
        "(INTERNAL: RET_CHECK failure)",
    ),
    (
        "batch_none_fits",
        {
            "policy": "full",
            "batch": 1,
            "peak_bytes": 10 * GIB,
            "limit_bytes": GIB,
            "target": "h100-80gb",
        },
        "full: even batch 1 does not fit: 10.00 GiB > 1.00 GiB on h100-80gb",
    ),
    (
        "plan_at_max_batch",
        {"max_batch": 12, "plan": _PLAN_NONE},
        "plan at the max batch of full (12): none fits 2.00 GiB: peak 1.00 GiB, recompute 0.0% "
        "(no remat needed)",
    ),
    (
        "seq_fits",
        {
            "policy": "full",
            "schedule": "none",
            "batch": 1,
            "seq": 8192,
            "peak_bytes": GIB,
            "limit_bytes": 2 * GIB,
            "next_seq": 9216,
            "next_peak_bytes": 3 * GIB,
            "refused": None,
            "cap": 2**20,
        },
        "full: seq 8192 fits at batch 1 (1.00 GiB of 2.00 GiB), seq 9216 does not (3.00 GiB)",
    ),
    (
        "seq_fits",
        {
            "policy": "full",
            "schedule": "sqrt",
            "batch": 2,
            "seq": 1024,
            "peak_bytes": GIB,
            "limit_bytes": 2 * GIB,
            "next_seq": 2048,
            "next_peak_bytes": None,
            "refused": "the model: seq=2048 exceeds gpt2-small's learned positions (1024)",
            "cap": 2**20,
        },
        "full @ sqrt: seq 1024 fits at batch 2 (1.00 GiB of 2.00 GiB), seq 2048 cannot be built "
        "(the model: seq=2048 exceeds gpt2-small's learned positions (1024))",
    ),
    (
        "seq_fits",
        {
            "policy": "none",
            "schedule": "none",
            "batch": 1,
            "seq": 4096,
            "peak_bytes": GIB,
            "limit_bytes": 2 * GIB,
            "next_seq": None,
            "next_peak_bytes": None,
            "refused": None,
            "cap": 4096,
        },
        "none: seq 4096 fits at batch 1 (1.00 GiB of 2.00 GiB); stopped at the cap 4096",
    ),
    (
        "seq_none_fits",
        {
            "policy": "none",
            "batch": 1,
            "seq": 1024,
            "peak_bytes": 3 * GIB,
            "limit_bytes": 2 * GIB,
            "target": "h100-80gb",
        },
        "none: even seq 1024 at batch 1 does not fit: 3.00 GiB > 2.00 GiB on h100-80gb",
    ),
    (
        "plan_at_max_seq",
        {"max_seq": 16384, "plan": _PLAN_NONE},
        "plan at the longest sequence of full (16384): none fits 2.00 GiB: peak 1.00 GiB, "
        "recompute 0.0% (no remat needed)",
    ),
    (
        "plan_fits",
        {k: v for k, v in _PLAN_NONE.items() if k != "kind"},
        "none fits 2.00 GiB: peak 1.00 GiB, recompute 0.0% (no remat needed)",
    ),
    (
        "plan_fits",
        {**{k: v for k, v in _PLAN_NONE.items() if k != "kind"}, "policy": "dots"},
        "dots fits 2.00 GiB: peak 1.00 GiB, recompute 0.0% (no remat needed)",
    ),
    (
        "plan_fits",
        {
            "policy": "dots",
            "schedule": "none",
            "budget_bytes": 2 * GIB,
            "peak_bytes": GIB,
            "recompute_overhead": 0.25,
            "source": "catalogue",
            "solver": None,
        },
        "dots fits 2.00 GiB: peak 1.00 GiB, recompute 25.0% (a policy given to compare is at "
        "least as good as the solver's plan)",
    ),
    (
        "plan_fits",
        {
            "policy": "full",
            "schedule": "sqrt",
            "budget_bytes": 2 * GIB,
            "peak_bytes": GIB,
            "recompute_overhead": 0.5,
            "source": "schedule",
            "solver": None,
        },
        "full @ sqrt fits 2.00 GiB: peak 1.00 GiB, recompute 50.0% (segment checkpointing)",
    ),
    (
        "plan_fits",
        {
            "policy": "names:save=a",
            "schedule": "none",
            "budget_bytes": 2 * GIB,
            "peak_bytes": 3 * 2**29,
            "recompute_overhead": 0.125,
            "source": "solver",
            "solver": _SOLVER,
        },
        "names:save=a fits 2.00 GiB: peak 1.50 GiB, recompute 12.5% (recompute b; offload c; "
        "layers 0-1: recompute a; time limit, gap 1.23% (highs, 3 programs))",
    ),
    (
        "plan_fits",
        {
            "policy": "none",
            "schedule": "none",
            "budget_bytes": 2 * GIB,
            "peak_bytes": GIB,
            "recompute_overhead": 0.0,
            "source": "solver",
            "solver": {
                **_SOLVER,
                "decisions": {"a": "save"},
                "layer_decisions": {},
                "layers": 0,
                "optimal": True,
                "status": "optimal",
                "gap": 0.0,
                "programs": 1,
            },
        },
        "none fits 2.00 GiB: peak 1.00 GiB, recompute 0.0% (save every tagged tensor; optimal "
        "on the cost model (highs, 1 programs))",
    ),
    (
        "plan_nothing_fits",
        {
            "target": "h100-80gb",
            "batch": 4,
            "budget_bytes": GIB,
            "peak_bytes": 3 * 2**29,
            "policy": "full",
            "schedule": "sqrt",
        },
        "nothing fits 1.00 GiB on h100-80gb at batch 4: the smallest peak reached is 1.50 GiB, "
        "with full @ sqrt (512.00 MiB over); try a smaller batch (remat-kit fit), gradient "
        "accumulation or a larger budget",
    ),
    (
        "fixed_over_budget",
        {
            "label": "tiny-llama b2 s16",
            "target": "l4",
            "limit_bytes": GIB,
            "parts": {"weights": 2 * GIB, "batch": 0},
            "fixed_bytes": 2 * GIB,
            "compiled_bytes": 3 * 2**29,
            "hints": [
                {
                    "kind": "shard",
                    "gpus": 3,
                    "each_bytes": 2 * GIB / 3,
                    "devices": 1,
                    "limit_bytes": GIB,
                }
            ],
        },
        "tiny-llama b2 s16 does not fit 1.00 GiB on l4 whatever the policy: weights 2.00 GiB = "
        "2.00 GiB before any activation (compiled with every layer recomputed, `full`, and with "
        "none, `none`, the step needs 1.50 GiB). Where these parts alone would fit (a compile "
        "decides the rest): FSDP over 3 GPUs in all (now 1): these parts split evenly are "
        "682.67 MiB per GPU, under the 1.00 GiB limit.",
    ),
    (
        "rows_none_fit",
        {
            "policy": "full",
            "batch": 4,
            "peak_bytes": 3 * 2**29,
            "limit_bytes": GIB,
            "target": "l4",
        },
        "at batch 4 the smallest peak is 1.50 GiB (full), over the 1.00 GiB a JAX process may "
        "use on l4, though weights, gradients and optimizer state fit",
    ),
    (
        "next_step_fits",
        {
            "change": {"kind": "bigger_gpu", "target": "b200"},
            "target": "b200",
            "policy": "full",
            "peak_bytes": 3 * 2**29,
            "limit_bytes": GIB * 2,
            "compiles": 1,
        },
        "one b200: compiled with full, the peak is 1.50 GiB, under the 2.00 GiB a JAX process "
        "may use on b200 (1 extra compile)",
    ),
    (
        "next_step_none",
        {
            "tried": [
                {
                    "kind": "shard",
                    "target": "l4",
                    "devices": 4,
                    "batch": 8,
                    "peak_bytes": 3 * 2**29,
                },
                {"kind": "lora", "rank": 16, "peak_bytes": None},
            ],
            "compiles": 1,
        },
        "none of the changes tried fits: fsdp over 4 x l4 at global batch 8 (full peaks at 1.50 "
        "GiB); LoRA rank 16 (adapters trained, base weights frozen) (inputs over its limit) (1 "
        "extra compile)",
    ),
    (
        "scale_out_fits",
        {
            "target": "h100-80gb",
            "devices": 4,
            "device": "GPU",
            "peak_bytes": 30 * GIB,
            "policy": "full",
            "batch": 8,
        },
        "4 x h100-80gb: 30.00 GiB per GPU with full at global batch 8",
    ),
    (
        "scale_out_fits",  # a TPU's devices are its chips
        {
            "target": "v5p",
            "devices": 4,
            "device": "chip",
            "peak_bytes": 30 * GIB,
            "policy": "full",
            "batch": 8,
        },
        "4 x v5p: 30.00 GiB per chip with full at global batch 8",
    ),
    (
        "scale_out_none",
        {"target": "l4", "devices": 64, "device": "GPU", "peak_bytes": 25 * GIB, "policy": "full"},
        "does not fit 64 x l4 with full: 25.00 GiB per GPU",
    ),
]


@pytest.mark.parametrize(("kind", "data", "sentence"), CASES, ids=[c[0] for c in CASES])
def test_each_note_kind_has_its_sentence(kind, data, sentence):
    note = Note(kind, data)
    assert words(note) == sentence
    # The dict form words the same, and reads back as the same note, through JSON too.
    assert words(note.to_dict()) == sentence
    again = Note.from_dict(json.loads(json.dumps(note.to_dict())))
    assert again == note and words(again) == sentence


def test_every_kind_is_worded_above():
    assert {c[0] for c in CASES} == set(KINDS)


@pytest.mark.parametrize(
    ("kind", "data", "error", "match"),
    [
        ("no_such_kind", {}, BadValue, "unknown note kind 'no_such_kind'"),
        ("offload_on_cpu", {}, BadValue, "holds policy; got $"),
        ("offload_on_cpu", {"policy": "p", "extra": 1}, BadValue, "got extra, policy"),
        ("offload_on_cpu", ["policy"], BadType, "must be a mapping"),
        ("offload_on_cpu", {"policy": object()}, BadType, "JSON values"),
    ],
)
def test_a_note_is_refused_when_made_wrong(kind, data, error, match):
    with pytest.raises(error, match=match):
        Note(kind, data)


def test_note_data_are_json_values():
    note = Note("no_tag_matched", {"policy": "p", "names": ("a",), "tags": ("x", "y")})
    assert note.data == {"policy": "p", "names": ["a"], "tags": ["x", "y"]}
    nested = Note(
        "plan_at_max_batch",
        {
            "max_batch": 2,
            "plan": Note("plan_fits", {k: v for k, v in _PLAN_NONE.items() if k != "kind"}),
        },
    )
    assert nested.data["plan"] == _PLAN_NONE
    with pytest.raises(BadValue, match="no 'kind'"):
        Note.from_dict({"policy": "p"})


def _report() -> rk.MemoryReport:
    x = jax.ShapeDtypeStruct((4, 4), jnp.float32)
    return rk.memory_report(lambda a: a * 2, x, target="cpu", warn=False)


def test_memory_report_notes_round_trip_through_json():
    notes = tuple(Note(kind, data) for kind, data, _ in CASES)
    r = _report().replace(notes=notes)
    d = json.loads(json.dumps(r.to_dict()))
    # Readable: the words beside the records; derived, like fits, so not read back.
    assert d["warnings"] == [sentence for _, _, sentence in CASES]
    assert d["notes"][0] == {"kind": CASES[0][0], **CASES[0][1]}
    back = rk.MemoryReport.from_dict(d)
    assert back == r and back.notes == notes
    assert back.warnings == r.warnings == tuple(sentence for _, _, sentence in CASES)
    # As the on-disk cache stores it (rk.cache.remember's encode/decode).
    assert rk.MemoryReport.from_dict(r.to_dict()) == r


def test_a_report_that_does_not_fit_says_so_as_data_and_in_words():
    x = jax.ShapeDtypeStruct((2**15, 2**15), jnp.float32)  # 4 GiB in, 5 x 4 GiB out
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = rk.memory_report(lambda a: (a * 2, a + 1, a - 1, a / 3, a * a), x, target="l4")
    note = next(n for n in r.notes if n.kind == "does_not_fit")
    assert note.data["peak_bytes"] == r.peak_bytes and note.data["target"] == "l4"
    assert note.data["over_bytes"] == r.over_by_bytes > 0
    assert note.data["usable_bytes"] == r.usable_bytes
    assert words(note).startswith("does not fit l4 at XLA_PYTHON_CLIENT_MEM_FRACTION=0.75 (")
    # The RematWarning carries the words.
    issued = [str(w.message) for w in caught if w.category is rk.RematWarning]
    assert words(note) in issued and issued == list(r.warnings)


def test_offload_notes_from_a_cpu_compile():
    x = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = rk.memory_report(
            lambda a: a @ a, x, target="cpu", policy=rk.policy("offload", offload=["context"])
        )
    kinds = [n.kind for n in r.notes]
    assert "offload_on_cpu" in kinds
    note = r.notes[kinds.index("offload_on_cpu")]
    assert note.data == {"policy": r.policy}


def test_shortfall_note_and_its_words():
    r = _report().replace(host_temp_bytes=GIB // 10)
    note = rk.checks.offload_shortfall(r, GIB)
    assert note == Note("offload_shortfall", {"moved_bytes": GIB // 10, "marked_bytes": GIB})
    assert words(note).startswith("offload moved 102.40 MiB to host of the 1.00 GiB")
    assert rk.checks.offload_shortfall(r, GIB // 10) is None  # all moved: carried out


@pytest.mark.parametrize(
    ("moved", "marked", "said"),
    [
        # Issue 26: llama3-8b, 4 unrolled layers, minimal_offloaded moved 1.42 GiB of the
        # 4 x (64 + 16 + 16 + 64 + 224 + 224) MiB its q, k, v, out, wi_0, wi_1 tags hold.
        (
            1_526_726_656,
            2_550_136_832,
            "offload moved 1.42 GiB to host of the 2.38 GiB jax marked for offload (60%)",
        ),
        (
            GIB // 2,
            GIB,
            "offload moved 512.00 MiB to host of the 1.00 GiB jax marked for offload (50%)",
        ),
        (98 * GIB // 100, GIB, "offload moved 1003.52 MiB to host of the 1.00 GiB"),
        (GIB, GIB, None),  # a scanned stack moves exactly what jax marked
        (GIB - 2**20, GIB, None),  # within 1%: rounding, not a shortfall
        (2 * GIB, GIB, None),  # more than marked
        (0, 0, None),  # nothing marked
    ],
)
def test_any_real_offload_shortfall_is_said(moved, marked, said):
    note = rk.checks.offload_shortfall(_report().replace(host_temp_bytes=moved), marked)
    if said is None:
        assert note is None
    else:
        assert note == Note("offload_shortfall", {"moved_bytes": moved, "marked_bytes": marked})
        assert words(note).startswith(said)


def test_check_policy_matches_returns_the_note_it_warns_with():
    with pytest.warns(rk.RematWarning) as caught:
        note = rk.checks.check_policy_matches("context", ["b", "a"], where="m")
    assert note == Note(
        "no_tag_matched_in",
        {"policy": "context", "names": ["context"], "where": "m", "tags": ["a", "b"]},
    )
    assert str(caught[0].message) == words(note)
    assert rk.checks.check_policy_matches("context", ["context"]) is None


def test_search_records_hold_notes_and_word_them():
    fit = rk.search.Fit(
        "batch",
        policy="full",
        schedule="none",
        batch=0,
        seq=16,
        unit=1,
        peak_bytes=10 * GIB,
        next_peak_bytes=None,
        limit_bytes=GIB,
        recompute_overhead=None,
        compiles=1,
        seconds=0.0,
        note=Note(
            "batch_none_fits",
            {
                "policy": "full",
                "batch": 1,
                "peak_bytes": 10 * GIB,
                "limit_bytes": GIB,
                "target": "h100-80gb",
            },
        ),
    )
    assert fit.message == "full: even batch 1 does not fit: 10.00 GiB > 1.00 GiB on h100-80gb"
    d = json.loads(json.dumps(fit.to_dict()))
    assert d["message"] == fit.message and Note.from_dict(d["note"]) == fit.note
    assert d["fits"] is False
    assert dataclasses.replace(fit, note=None).message == ""


# --- hints name the limit they are judged against (issue 45) ---------------------------------

_LIMIT = {"limit_bytes": 59 * GIB}


@pytest.mark.parametrize(
    ("hint", "said"),
    [
        (
            {"kind": "sgd", "fixed_bytes": 40 * GIB, "from_bytes": 80 * GIB, **_LIMIT},
            "SGD (--optimizer sgd): no optimizer state, so these parts are 40.00 GiB (from "
            "80.00 GiB), under the 59.00 GiB limit",
        ),
        (
            {"kind": "lora", "fixed_bytes": 15 * GIB, **_LIMIT},
            "LoRA (--lora 16): frozen base weights, adapters and their gradients and optimizer "
            "state are 15.00 GiB, under the 59.00 GiB limit",
        ),
        (
            {"kind": "bigger_gpu", "gpus": [["b200", 133 * GIB]], "fixed_bytes": 120 * GIB},
            "a GPU whose usable memory holds these 120.00 GiB: b200 (133.00 GiB usable)",
        ),
        (
            {"kind": "shard", "gpus": 33, "each_bytes": 32 * GIB, "devices": 16, **_LIMIT},
            "FSDP over 33 GPUs in all (now 16): these parts split evenly are 32.00 GiB per GPU, "
            "under the 59.00 GiB limit",
        ),
    ],
    ids=["sgd", "lora", "bigger_gpu", "shard"],
)
def test_a_hint_names_its_figure_and_the_limit(hint, said):
    from remat_kit.notes import hint_words

    assert hint_words(hint) == said


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            {"kind": "accum", "accum": 2, "micro_batch": 2},
            "gradient accumulation over 2 (micro-batch 2, the same global batch)",
        ),
        ({"kind": "smaller_batch", "batch": 2}, "batch 2"),
        ({"kind": "bigger_gpu", "target": "b200"}, "one b200"),
        (
            {"kind": "shard", "target": "h100-80gb", "devices": 32, "batch": 32},
            "fsdp over 32 x h100-80gb at global batch 32",
        ),
        ({"kind": "lora", "rank": 16}, "LoRA rank 16 (adapters trained, base weights frozen)"),
    ],
)
def test_each_change_has_its_words(change, said):
    from remat_kit.notes import change_words

    assert change_words(change) == said


def test_a_change_without_words_is_refused():
    from remat_kit.notes import change_words

    with pytest.raises(BadValue, match="no words for change"):
        change_words({"kind": "pray"})


@pytest.mark.parametrize(
    ("limits", "scheduler", "said"),
    [
        ([], False, None),
        (
            [int(57.91 * GIB)] * 3,
            False,
            "only 59.38 GiB decides fits; XLA's own limits in the lines below (57.91 GiB: its "
            "rematerialization pass's goal) steer what XLA does while it compiles, not whether "
            "the step fits",
        ),
        (
            [int(89.75 * GIB), int(57.91 * GIB)],
            True,
            "only 59.38 GiB decides fits; XLA's own limits in the lines below (57.91 GiB, 89.75 "
            "GiB: its rematerialization pass's goals, one per program; the memory its scheduler "
            "plans for) steer what XLA does while it compiles, not whether the step fits",
        ),
    ],
)
def test_the_caption_says_which_limit_decides_fits(limits, scheduler, said):
    from remat_kit.render import xla_limits_words

    assert xla_limits_words(rk.target("h100"), limits, scheduler) == said


def test_the_fits_rule_says_it_decides():
    from remat_kit.render._captions import fits_rule

    line = fits_rule(rk.target("h100"))
    assert line.startswith("fits = peak <= 59.38 GiB, ")
    assert line.endswith("the one limit that decides fits")


def test_the_scheduler_words_the_caption_looks_for_are_xlas_line():
    from remat_kit.render import SCHEDULER_WORDS
    from remat_kit.xla import parse_xla_log

    (line,) = parse_xla_log(
        [
            "W1124 02:20:01.1 7 gpu_hlo_schedule.cc:968] The byte size of input/output arguments "
            "(96363200824) exceeds the base limit (63707234304). This indicates an error in the "
            "calculation!"
        ]
    )
    assert SCHEDULER_WORDS in line
