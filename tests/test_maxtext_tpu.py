"""MaxText configs on TPU slices (``--maxtext ... --target v5e-4``): MaxText's own TPU path.

The figure is checked against MaxText's own ``train_compile.main`` with
``compile_topology=v5e-4`` in a fresh process (``experiments/maxtext_own.py``: libtpu's slice,
deviceless, no stand-in); results/maxtext_tpu.json holds three families x three generations
(``experiments/maxtext_tpu.py``). The words MaxText's config reads and its mesh are checked
without a compile. The words are written out here, not taken from the source under test.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import remat_kit as rk
from helpers import IMPORTS_MAXTEXT
from remat_kit.errors import BadValue
from remat_kit_models.maxtext import MaxTextSpec
from remat_kit_models.maxtext_source import _config, _mesh

pytest.importorskip("maxtext")
pytest.importorskip("libtpu")

ROOT = Path(__file__).resolve().parent.parent

#: A small Qwen 3 (two layers, width 128), no attention key: MaxText's TPU default.
QWEN3 = (
    "model_name=qwen3-0.6b base_num_decoder_layers=2 base_emb_dim=128 base_mlp_dim=256 "
    "base_num_query_heads=4 base_num_kv_heads=2 head_dim=64 vocab_size=256"
)
FIVE = ("argument", "output", "alias", "temp", "generated_code")


def _own() -> object:
    spec = importlib.util.spec_from_file_location(
        "maxtext_own", ROOT / "experiments" / "maxtext_own.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _words(target: rk.Target, words: str = QWEN3) -> dict[str, str]:
    src = rk.sources.resolve(MaxTextSpec(words))
    return dict(
        w.split("=", 1)
        for w in _config._settings(
            src.request, rk.TrainConfig(8, 256), target.devices, (), target.hosts, target.tpu_slice
        )
    )


@pytest.mark.slow
def test_a_tpu_figure_equals_maxtexts_own_tpu_path():
    # A custom offload line (MaxText offloads to the TPU host's pinned memory) on a v6e slice:
    # both sides under MaxText's TPU defaults, its autoselected attention among them.
    target = rk.target("v6e-4")
    remat = ["remat_policy=custom", "decoder_layer_input=offload", "out_proj=device"]
    words = [
        *QWEN3.split(),
        *remat,
        "override_model_config=True",
        "per_device_batch_size=2",
        "max_target_length=256",
        "jax_cache_dir=",
    ]
    own = _own().own_path([{"words": words, "target": "v6e-4"}])[0]
    assert "error" not in own, own["error"]
    assert own["prng_impl"] == "unsafe_rbg" and own["sequences"] == 8
    src = rk.sources.resolve(MaxTextSpec(QWEN3))
    got = rk.sources.measure(
        src,
        "offload:offload=decoder_layer_input,save=out_proj",
        target,
        rk.TrainConfig(8, 256),
        warn=False,
    )
    assert got.meta["maxtext"]["policy_lines"][0] == "remat_policy: custom"
    assert got.attention == own["attention"] == "autoselected"  # MaxText's TPU default
    assert {f: getattr(got, f"{f}_bytes") for f in FIVE} == {f: own[f] for f in FIVE}


@pytest.mark.parametrize(
    ("name", "slices", "topology"), [("v5e-4", 1, "v5e-4"), ("v5p-8", 2, "v5p-8")]
)
@IMPORTS_MAXTEXT
def test_a_tpu_target_is_maxtexts_tpu_path(name, slices, topology):
    # hardware=tpu and the slice by MaxText's compile_topology name (v5p counts TensorCores),
    # the slices as compile_topology_num_slices; MaxText's own attention default, and none of
    # the GPU path's words.
    words = _words(rk.target(name, slices=slices))
    assert words["hardware"] == "tpu"
    assert (words["compile_topology"], words["compile_topology_num_slices"]) == (
        topology,
        str(slices),
    )
    assert not {
        "attention",
        "internal_compile",
        "internal_compile_num_devices",
        "num_slices",
    } & set(words)


@IMPORTS_MAXTEXT
def test_a_gpu_target_keeps_the_gpu_path():
    words = _words(rk.target("h100", devices=4))
    assert (words["hardware"], words["attention"]) == ("gpu", "cudnn_flash_jax")
    assert words["internal_compile_num_devices"] == "4" and "compile_topology" not in words


@pytest.mark.parametrize(
    ("name", "slices", "keys"),
    [
        ("v5e-4", 1, ""),
        ("v5p-8", 1, " ici_fsdp_parallelism=2 ici_tensor_parallelism=2"),
        ("v5e-4", 2, " dcn_data_parallelism=2"),
    ],
)
@IMPORTS_MAXTEXT
def test_the_mesh_is_maxtexts_get_topology_mesh(name, slices, keys):
    # Built, not compiled: MaxText's own get_topology_mesh (libtpu's devices from its
    # accelerator_to_spec_map, its create_device_mesh) for the same config, device by device.
    import jax

    target = rk.target(name, slices=slices)
    src = rk.sources.resolve(MaxTextSpec(QWEN3 + keys))
    cfg = src._cfg(rk.TrainConfig(8 * slices, 256), target, ())
    ours = _mesh._mesh(cfg, target)
    from maxtext.trainers.pre_train import train_compile

    before = jax.config.jax_remove_size_one_mesh_axis_from_type
    try:
        theirs = train_compile.get_topology_mesh(cfg)  # sets that option for the process
    finally:
        jax.config.update("jax_remove_size_one_mesh_axis_from_type", before)
    assert [d.id for d in ours.devices.flat] == [d.id for d in theirs.devices.flat]
    assert dict(ours.shape) == dict(theirs.shape)


@pytest.mark.parametrize("kernel", ["cudnn_flash_jax", "cudnn_flash_te"])
@IMPORTS_MAXTEXT
def test_a_cudnn_kernel_on_a_tpu_is_one_line(kernel):
    src = rk.sources.resolve(MaxTextSpec(f"{QWEN3} attention={kernel}"))
    with pytest.raises(BadValue, match=rf"attention={kernel} on v5e-4: cuDNN's kernels"):
        src.check(rk.TrainConfig(8, 256), rk.target("v5e-4"))


def test_compile_topology_is_the_targets():
    with pytest.raises(BadValue, match=r"compile_topology_num_slices is set by the target's TPU"):
        MaxTextSpec("model_name=llama2-7b compile_topology_num_slices=2").overrides  # noqa: B018


@IMPORTS_MAXTEXT
def test_no_gpu_notes_on_a_tpu():
    src = rk.sources.resolve(MaxTextSpec(QWEN3))
    assert src.notes(rk.TrainConfig(8, 256), rk.target("v5e-4")) == ()
    kinds = [n.kind for n in src.notes(rk.TrainConfig(8, 256), rk.target("h100"))]
    assert kinds == ["maxtext_attention", "maxtext_xla_remat"]
