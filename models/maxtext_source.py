"""MaxText configs as a model source: MaxText's own model, train step, optimizer and mesh.

``--maxtext "model_name=llama2-7b ici_fsdp_parallelism=8"`` (or a YAML path first, as
MaxText's own command line takes it: ``"my.yml base_num_decoder_layers=4"``) is read by
MaxText's own ``pyconfig`` and built into MaxText's own ``train_step`` exactly as its AOT
compiler (``maxtext.trainers.pre_train.train_compile``) builds it: the abstract train state
of its NNX model and optimizer, the batch, the shardings of its logical axis rules, over a
mesh of the target's compile-only GPUs laid out by its ``ici_*``/``dcn_*`` parallelism keys.
The programs are the ones MaxText compiles (``tests/test_maxtext.py`` checks it to the byte).

What the command line owns is not taken from the config: the batch (``--batch`` is the global
batch: ``per_device_batch_size`` = batch / GPUs), the sequence (``--seq`` is
``max_target_length``) and the policy (``--policy``): a config that sets them is refused,
naming the flag. A policy reaches MaxText the way a MaxText user sets it (:func:`config_lines`):
MaxText's own ``remat_policy`` values (``maxtext:remat_policy=save_qkv_proj``), ``full``, and
any save/offload-by-name policy whose names are MaxText's per-tensor ``custom`` keys (the
lines ``plan`` prints); anything else (a dot policy) is handed to the decoder's
``get_remat_policy`` while the step is traced, and said so. MaxText wraps every layer in
``jax.checkpoint`` and has no setting without one: ``none`` (the baseline) is its step traced
with that checkpoint left out.

MaxText is an optional dependency (``pip install 'remat-kit[maxtext]'``): this module imports
it only when a MaxText source is built.

Example:
  >>> MaxTextSpec("model_name=llama2-7b base_num_decoder_layers=2").name
  'maxtext model_name=llama2-7b base_num_decoder_layers=2'
  >>> config_lines(rk.policy("offload", offload=["decoder_layer_input"], save=["context"]))
  ('remat_policy: custom', 'decoder_layer_input: offload', 'context: device')
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import io
import math
import os
import tempfile
import unittest.mock
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import remat_kit as rk
from remat_kit.errors import BadValue
from remat_kit.notes import Note
from remat_kit_models.maxtext import (
    _BASE,
    ATTENTION_CHOSEN,
    PIPELINE_OFFLOAD,
    XLA_REMAT,
    MaxTextSpec,
)
from remat_kit_models.maxtext_lines import CUSTOM_TENSORS, config_lines

__all__ = [
    "MaxTextSource",
    "resolve",
]

#: Attention kernels of MaxText that compile only on a GPU present (tokamax's Pallas Triton
#: kernel asks the process's backend, which is the CPU here), and why.
_GPU_ONLY = {
    "autoselected": "MaxText's autoselected kernel on a GPU is tokamax's Pallas Triton flash "
    "attention, which compiles only on a GPU present",
    "flash": "MaxText's flash kernel on a GPU is tokamax's Pallas Triton flash attention, "
    "which compiles only on a GPU present",
}

#: The words that leave a config without a pipeline (MaxText's defaults): a config read for
#: what does not depend on the batch (the layer count) is read with them, since MaxText
#: checks a pipeline's micro-batches against the batch and a probe has none of the user's.
_ONE_STAGE = (
    "ici_pipeline_parallelism=1",
    "dcn_pipeline_parallelism=1",
    "num_pipeline_microbatches=-1",
)

#: The key type MaxText's entry points (``train.py``'s ``initialize``, ``train_compile.py``'s
#: ``main``) set for the process: 16-byte keys (jax's default, threefry, has 8), one per
#: ``nnx.Rngs`` stream in the train state, so every argument and output count depends on it.
PRNG_IMPL = "unsafe_rbg"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # MaxText prints on import and logs through absl while it reads a config (stub notices,
    # tokenizer defaults): none of it is about the measured step.
    import absl.logging

    level = absl.logging.get_verbosity()
    absl.logging.set_verbosity(absl.logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        absl.logging.set_verbosity(level)


@functools.cache
def _maxtext() -> Any:
    """MaxText's modules this source uses, imported once (a namespace)."""
    try:
        with _quiet():
            from maxtext.configs import pyconfig
            from maxtext.layers import nnx_decoders, pipeline
            from maxtext.trainers.pre_train import train, train_compile
            from maxtext.utils import maxtext_utils, sharding
    except ImportError as err:
        raise BadValue(
            f"MaxText is not installed ({err.name or err}): pip install 'remat-kit[maxtext]'",
            param="maxtext",
        ) from None
    return _Modules(pyconfig, nnx_decoders, pipeline, train, train_compile, maxtext_utils, sharding)


@dataclasses.dataclass(frozen=True)
class _Modules:
    pyconfig: Any
    nnx_decoders: Any
    pipeline: Any
    train: Any
    train_compile: Any
    maxtext_utils: Any
    sharding: Any


@dataclasses.dataclass(frozen=True)
class _Built:
    """One MaxText step as its AOT compiler builds it, with what the tables read."""

    cfg: Any
    mesh: jax.sharding.Mesh
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    in_shardings: tuple[Any, ...]
    out_shardings: Any
    donate_argnums: tuple[int, ...]
    loss_fn: Callable[..., Any]
    loss_args: tuple[Any, ...]


def _settings(
    spec: MaxTextSpec,
    config: rk.TrainConfig,
    devices: int,
    lines: tuple[str, ...],
    hosts: int = 1,
    tpu: Any = None,
):
    """The ``key=value`` words MaxText's ``pyconfig`` reads: the user's, the policy's lines,
    and what the command line owns. ``tpu`` is a TPU target's slice (its ``tpu_slice``):
    MaxText's TPU path; None for a GPU."""
    words = dict(spec.overrides)
    if tpu is None:
        # MaxText's default kernel on a GPU (tokamax's Pallas Triton flash attention) compiles
        # only on a GPU; cuDNN's flash attention through jax compiles for one here (a note).
        words.setdefault("attention", "cudnn_flash_jax")
    # A user who names a model's sizes means them; MaxText refuses the pair without this.
    words.setdefault("override_model_config", "True")
    words.update(line.split(": ", 1) for line in lines)
    if hosts > 1 and tpu is None:
        # What MaxText finds on a cluster, a slice per host (OnHost), unless the words say.
        words.setdefault("num_slices", str(hosts))
    per_device = config.batch / devices
    words.update(
        per_device_batch_size=str(int(per_device) if per_device.is_integer() else per_device),
        max_target_length=str(config.seq),
    )
    if tpu is None:
        words.update(
            hardware="gpu",
            # The device count of the compile-only mesh (MaxText's own AOT path reads it from
            # a TPU topology name; for a GPU it needs the GPUs present).
            internal_compile="True",
            internal_compile_num_devices=str(devices),
        )
    else:
        # MaxText's own TPU path (train_compile): the slice by the name its
        # accelerator_to_spec_map reads (the device count, and num_slices from the slices);
        # every other default (the attention kernel among them) is MaxText's for a TPU.
        words.update(
            hardware="tpu",
            compile_topology=tpu.name,
            compile_topology_num_slices=str(tpu.slices),
        )
    words.update(
        enable_checkpointing="False",
        skip_jax_distributed_system="True",
        dataset_type="synthetic",
        base_output_directory=str(Path(tempfile.gettempdir()) / "remat_kit_maxtext"),
        # MaxText's config would point jax's persistent compilation cache at ~/jax_cache for
        # the whole process: ours keeps what we compile.
        jax_cache_dir="",
    )
    return tuple(f"{k}={v}" for k, v in words.items())


@functools.cache
def _config(spec: MaxTextSpec, words: tuple[str, ...]) -> Any:
    """MaxText's config for ``words`` (its ``pyconfig.initialize``), or BadValue."""
    mt = _maxtext()
    yaml = Path(mt.pyconfig.__file__).parent / _BASE if spec.yaml == _BASE else Path(spec.yaml)
    if not yaml.is_file():
        raise BadValue(
            f"MaxText config {spec.yaml}: no such file; give a MaxText YAML, or only "
            "key=value words (MaxText's base.yml)",
            param="maxtext",
        )
    try:
        with _quiet():
            return mt.pyconfig.initialize(["remat-kit", str(yaml), *words])
    except Exception as err:  # MaxText's ValueError, pydantic's ValidationError, asserts
        raise BadValue(f"MaxText refused the config: {_refusal(err)}", param="maxtext") from None


def _refusal(err: BaseException) -> str:
    """Why MaxText refused a config, whole and on one line: for pydantic's ValidationError
    each field it names and what it said of it (``remat_policy: Input should be ...``), joined
    by ``; ``; for any other error (MaxText's ValueError, an assert) its whole message.

    Example:
      >>> _refusal(ValueError("per_device_batch_size must be\\n   positive"))
      'ValueError: per_device_batch_size must be positive'
    """
    errors = getattr(err, "errors", None)
    if callable(errors) and hasattr(err, "title"):  # pydantic's ValidationError
        fields = "; ".join(_field_words(e) for e in errors())
        return f"{err.title}: {fields}"
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _field_words(e: Mapping[str, Any]) -> str:
    """One of pydantic's errors: ``field: what it said (got VALUE)``; the value where it is
    one word or number (a model validator's input is the whole config)."""
    where = ".".join(map(str, e.get("loc") or ()))
    said = " ".join(str(e.get("msg", "")).split())
    got = e.get("input")
    if isinstance(got, str | int | float | bool) and len(repr(got)) <= 60:
        said += f" (got {got!r})"
    return f"{where}: {said}" if where else said


def _first(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:300]


@dataclasses.dataclass(frozen=True)
class OnHost:
    """A compile-only GPU as MaxText sees it on a cluster: its slice is its host.

    jax's compile-only GPUs all carry slice 0; on a GPU cluster each host's GPUs are one
    slice (MaxText's ``a3``: "the slice topology of A3 fixed to a single host"), which its
    ``create_device_mesh`` reads to lay the ``dcn_*`` axes across hosts. Everything else is
    the device's own.

    Attributes:
      device: the compile-only device.
    """

    device: Any

    @property
    def slice_index(self) -> int:
        """The device's host (its ``process_index``)."""
        return int(self.device.process_index)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.device, name)


def cluster_mesh(make: Callable[[list[Any]], Any], devices: list[Any]) -> np.ndarray:
    """``make(devices)`` (a device grid, MaxText's ``create_device_mesh``) given each device
    as a cluster shows it (:class:`OnHost`); the grid in the devices themselves.

    Example:
      >>> import numpy as np
      >>> cpu = jax.devices("cpu")[0]
      >>> seen = []
      >>> grid = cluster_mesh(lambda ds: seen.extend(d.slice_index for d in ds) or [ds], [cpu])
      >>> seen, grid[0, 0] is cpu
      ([0], True)
    """
    grid = make([OnHost(d) for d in devices])
    out = np.empty(np.shape(grid), dtype=object)
    for index, d in np.ndenumerate(grid):
        out[index] = d.device if isinstance(d, OnHost) else d
    return out


def _mesh(cfg: Any, target: rk.Target) -> jax.sharding.Mesh:
    """MaxText's mesh of ``cfg``'s parallelism keys over ``target``'s compile-only devices:
    a TPU slice's as libtpu lists them (MaxText's ``get_topology_mesh``), a GPU's with each
    host a slice as on a cluster (:class:`OnHost`)."""
    mt = _maxtext()
    devices = list(target.mesh().devices.reshape(-1))
    make = functools.partial(mt.maxtext_utils.create_device_mesh, cfg)
    try:
        with _quiet():
            if target.tpu_slice is not None:
                # libtpu's own devices in its own order (get_topology_desc lists them by id;
                # the target's mesh has them in torus order), which MaxText's TPU path hands
                # to create_device_mesh: its grid is then the one MaxText lays out.
                grid = make(sorted(devices, key=lambda d: d.id))
            else:
                grid = cluster_mesh(make, devices)
    except Exception as err:
        where = (
            target.label
            if target.tpu_slice is not None
            else f"{target.devices} GPU(s)"
            + (f" on {target.hosts} hosts" if target.hosts > 1 else "")
        )
        raise BadValue(
            f"MaxText's mesh for {where} (num_slices={cfg.num_slices}): {_refusal(err)}",
            param="maxtext",
        ) from None
    explicit = str(cfg.shard_mode).lower().endswith("explicit")
    kind = jax.sharding.AxisType.Explicit if explicit else jax.sharding.AxisType.Auto
    return jax.sharding.Mesh(grid, cfg.mesh_axes, axis_types=(kind,) * len(cfg.mesh_axes))


class _WithoutCheckpoint:
    """``jax`` as MaxText's decoder sees it while a step without remat is traced: its
    ``jax.checkpoint`` hands the layer back (MaxText has no setting without a checkpoint)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(jax, name)

    @staticmethod
    def checkpoint(fn: Callable[..., Any], **kwargs: Any) -> Callable[..., Any]:
        del kwargs
        return fn

    remat = checkpoint  # MaxText's pipeline calls it by jax's other name


@contextlib.contextmanager
def _as_maxtext_sets_jax(cfg: Any) -> Iterator[None]:
    """jax's settings as MaxText's entry points set them, for what runs inside only.

    ``train_compile.main`` and ``train.initialize`` set the key type (:data:`PRNG_IMPL`) and
    ``jax_remove_size_one_mesh_axis_from_type`` (from the config) with ``jax.config.update``,
    for the whole process; here they hold while MaxText's state is built and its step traced,
    and the caller's process keeps its own (a user's keys, other sources' steps).
    """
    from jax._src import config as jax_config  # the setting's scoped form has no public name

    size_one = bool(cfg.remove_size_one_mesh_axis_from_type)
    with (
        jax.default_prng_impl(PRNG_IMPL),
        jax_config.remove_size_one_mesh_axis_from_type(size_one),
    ):
        yield


def _in_booleans(policy: Callable[..., Any]) -> Callable[..., Any]:
    """``policy`` answering save or recompute as ``True``/``False`` (an offload as it is):
    what jax's ``save_from_both_policies`` takes, with which MaxText's pipeline combines the
    decoder's policy and its own saved inputs (jax's own policies answer so; a policy made
    with ``save_and_offload_only_these_names`` answers ``Recompute``, which it refuses)."""
    from jax._src.interpreters import partial_eval as pe  # the answers' types are not public

    @functools.wraps(policy)
    def decide(*args: Any, **kwargs: Any) -> Any:
        answer = policy(*args, **kwargs)
        if isinstance(answer, pe.RecomputeType):
            return False
        return True if isinstance(answer, pe.SaveableType) else answer

    return decide


@contextlib.contextmanager
def _patched(patch: rk.Policy | None, pipelined: bool = False) -> Iterator[None]:
    """MaxText's code with ``patch`` (a policy no config line sets) handed to its decoder's
    ``get_remat_policy`` (in booleans where a pipeline combines it, :func:`_in_booleans`),
    or for ``none`` its decoder's and pipeline's ``jax.checkpoint`` left out; as it is for
    None. Held while the model is built too: a pipeline keeps the decoder's policy it was
    made with."""
    mt = _maxtext()
    with contextlib.ExitStack() as stack:
        if patch is not None and not patch.is_remat:
            for module in (mt.nnx_decoders, mt.pipeline):
                stack.enter_context(unittest.mock.patch.object(module, "jax", _WithoutCheckpoint()))
        elif patch is not None:
            policy = _in_booleans(patch.jax_policy) if pipelined else patch.jax_policy
            stack.enter_context(
                unittest.mock.patch.object(
                    mt.nnx_decoders.NNXDecoder, "get_remat_policy", lambda self: policy
                )
            )
        yield


def _in_context(
    fn: Callable[..., Any], spec: MaxTextSpec, cfg: Any, mesh: Any, patch: rk.Policy | None
) -> Callable[..., Any]:
    """``fn`` traced as MaxText traces it: under its mesh and logical axis rules; with
    ``patch`` (a policy no config line sets) handed to the decoder's ``get_remat_policy``,
    or for ``none`` its ``jax.checkpoint`` left out. An error in MaxText's code is a
    BadValue naming the config (its first line)."""
    from flax.core.spmd import logical_axis_rules

    @functools.wraps(fn)
    def traced(*args: Any) -> Any:
        with contextlib.ExitStack() as stack:
            # The abstract mesh (MaxText enters jax.set_mesh, which a trace may not).
            stack.enter_context(_as_maxtext_sets_jax(cfg))
            stack.enter_context(jax.sharding.use_abstract_mesh(mesh.abstract_mesh))
            stack.enter_context(logical_axis_rules(cfg.logical_axis_rules))
            stack.enter_context(_patched(patch, cfg.using_pipeline_parallelism))
            try:
                return fn(*args)
            except BadValue:
                raise
            except Exception as err:
                raise BadValue(
                    f"MaxText's step for {spec.maxtext!r} failed: {_first(err)}"
                ) from err

    return traced


@functools.cache
def _built(spec: MaxTextSpec, words: tuple[str, ...], target: rk.Target, patch: Any) -> _Built:
    """The step ``train_compile`` compiles for ``words`` on ``target``'s GPUs."""
    from flax import nnx

    mt = _maxtext()
    cfg = _config(spec, words)
    mesh = _mesh(cfg, target)
    with _quiet(), _as_maxtext_sets_jax(cfg), _patched(patch, cfg.using_pipeline_parallelism):
        args, kwargs, state_sh, _, graphdef = mt.train_compile.get_shaped_inputs(mesh, cfg)
        params_sh, state_sh = mt.sharding.maybe_update_params_sharding_with_opt(cfg, state_sh)
        in_state = mt.sharding.build_zero1_input_state_mesh_shardings(cfg, state_sh, params_sh)
        data_sh = mt.sharding.get_input_data_sharding(cfg, mesh)
        fn, in_sh, out_sh, static, donate = mt.maxtext_utils.get_functional_train_with_signature(
            mt.train.train_step, data_sh, in_state, graphdef, cfg, params_sh
        )
    if static or kwargs:
        raise BadValue(
            f"{spec.maxtext!r}: MaxText's step takes static or keyword arguments here "
            "(DiLoCo, pipeline stages ...), which this source does not build",
            param="maxtext",
        )
    # One micro-batch's loss of the model's parameters: what the residual tables read.
    model = nnx.merge(graphdef, args[0]).model
    model_def, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params: Any, rest: Any, batch: Any) -> Any:
        merged = nnx.merge(model_def, params, rest)
        return mt.train.loss_fn(merged, cfg, batch, None, None, is_train=True)[0]

    return _Built(
        cfg=cfg,
        mesh=mesh,
        fn=_in_context(fn, spec, cfg, mesh, patch),
        args=tuple(args),
        in_shardings=tuple(in_sh),
        out_shardings=out_sh,
        donate_argnums=(donate,) if isinstance(donate, int) else tuple(donate),
        loss_fn=_in_context(loss, spec, cfg, mesh, patch),
        loss_args=(params, rest, args[1]),
    )


def _pipeline(cfg: Any) -> dict[str, Any] | None:
    """MaxText's pipeline of ``cfg`` (None without one): stages, micro-batches, repeats,
    whether it checkpoints each iteration, and the config's ``remat_policy`` its
    per-iteration checkpoint reads."""
    if not cfg.using_pipeline_parallelism:
        return None
    return {
        "stages": int(cfg.ici_pipeline_parallelism * cfg.dcn_pipeline_parallelism),
        "microbatches": int(cfg.num_pipeline_microbatches),
        "repeats": int(cfg.num_pipeline_repeats),
        "layers_per_stage": int(cfg.num_layers_per_pipeline_stage),
        "iteration_checkpoint": bool(cfg.set_remat_policy_on_pipeline_iterations),
        "remat_policy": str(cfg.remat_policy),
    }


@functools.cache
def _microbatches(spec: MaxTextSpec) -> int:
    """The pipeline's micro-batches the config asks for (1 without a pipeline), read from its
    keys as MaxText's YAML loader merges them (its base configs, then the words), before
    MaxText checks them against a batch: the batch a search may try depends on it."""
    mt = _maxtext()
    base = Path(mt.pyconfig.__file__).parent / _BASE
    yaml = base if spec.yaml == _BASE else Path(spec.yaml)
    if not yaml.is_file():
        return 1  # _config names the missing file
    keys = {**mt.pyconfig._load_config(str(yaml)), **dict(spec.overrides)}
    stages = int(keys.get("ici_pipeline_parallelism", 1)) * int(
        keys.get("dcn_pipeline_parallelism", 1)
    )
    if stages <= 1:
        return 1
    micro = int(keys.get("num_pipeline_microbatches", -1))
    return stages if micro == -1 else micro  # MaxText's default: one per stage


def _per_device(tree: Any) -> int:
    """Bytes one device holds of ``tree``'s abstract, sharded leaves."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
        total += int(leaf.dtype.itemsize) * math.prod(shape)  # a key's dtype has one too
    return total


def _dtypes(tree: Any) -> str:
    leaves = jax.tree.leaves(tree)
    found = {jnp.dtype(x.dtype).name for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)}
    return "+".join(sorted(found)) or "-"


@dataclasses.dataclass(frozen=True)
class MaxTextSource(rk.sources.StepSource):
    """A MaxText config as an ``rk.sources.StepSource`` (see the module docstring).

    Attributes:
      request: the config words.
    """

    request: MaxTextSpec

    #: MaxText's model: its own tensor names (ours follow them) and dtypes.
    own_model = True
    #: A MaxText user sets the policy in the config (``policy_lines``).
    applies_in_code = "lines"
    #: MaxText checkpoints every layer: ``none`` is the baseline, never a plan.
    remat_always = True

    @property
    def spec(self) -> str:
        """``maxtext`` and the config words."""
        return self.request.name

    @property
    def schedule_kinds(self) -> frozenset[str]:
        """``none``: MaxText places its checkpoints itself (one per layer)."""
        return frozenset({"none"})

    def _cfg(self, config: rk.TrainConfig, target: rk.Target, lines: tuple[str, ...]) -> Any:
        words = _settings(
            self.request, config, target.devices, lines, target.hosts, target.tpu_slice
        )
        return _config(self.request, words)

    def n_layers(self) -> int:
        """The decoder's layers (``num_decoder_layers``, overrides included), read from the
        config at one sequence on one device of one host without a pipeline
        (:data:`_ONE_STAGE`): the count does not depend on them, and MaxText takes neither a
        pipeline's micro-batches nor ``dcn_*`` axes there."""
        words = dict(
            w.split("=", 1) for w in _settings(self.request, rk.TrainConfig(1, 128), 1, ())
        )
        words.update(w.split("=", 1) for w in _ONE_STAGE)
        # One device, one slice: the user's cross-host keys want the hosts a probe has not.
        words.update((k, "1") for k in list(words) if k.startswith("dcn_") or k == "num_slices")
        cfg = _config(self.request, tuple(f"{k}={v}" for k, v in words.items()))
        return int(cfg.num_decoder_layers)

    def at_depth(self, layers: int) -> None:
        """None: every compile is of MaxText's whole step."""
        del layers

    def check(self, config: rk.TrainConfig, target: rk.Target) -> None:
        """MaxText's config and mesh for ``config`` on ``target``, and the train config's
        fields the command line would set in vain (MaxText's config sets the optimizer,
        accumulation and precision).

        Raises:
          BadValue: the first bad value, MaxText's own message for its config.
        """
        default = rk.TrainConfig(config.batch, config.seq)
        for field in ("optimizer", "accum", "precision", "lora"):
            if getattr(config, field) != getattr(default, field):
                raise BadValue(
                    f"{field}={getattr(config, field)!r} with {self.spec}: a MaxText config "
                    f"sets its own {field} (opt_type, gradient_accumulation_steps, dtype, "
                    "weight_dtype, lora ...); set it in the config words",
                    param=field,
                )
        attention = dict(self.request.overrides).get("attention")
        if target.tpu_slice is not None:
            if attention is not None and attention.startswith("cudnn"):
                raise BadValue(
                    f"attention={attention} on {target.label}: cuDNN's kernels are NVIDIA's; "
                    "a TPU takes MaxText's autoselected (its default), flash (splash "
                    "attention) or dot_product",
                    param="maxtext",
                )
        elif attention in _GPU_ONLY:
            raise BadValue(
                f"attention={attention}: {_GPU_ONLY[attention]}; give "
                "attention=cudnn_flash_jax (cuDNN's flash attention, the default here) or "
                "dot_product",
                param="maxtext",
            )
        elif (
            attention == "cudnn_flash_te" and importlib.util.find_spec("transformer_engine") is None
        ):
            raise BadValue(
                "attention=cudnn_flash_te needs NVIDIA's TransformerEngine "
                "(pip install transformer_engine[jax]); attention=cudnn_flash_jax is cuDNN's "
                "flash attention without it",
                param="maxtext",
            )
        _mesh(self._cfg(config, target, ()), target)

    def notes(self, config: rk.TrainConfig, target: rk.Target) -> tuple[Note, ...]:
        """On a GPU, the attention kernel chosen where the config names none, and whether
        XLA's own rematerialization pass runs (MaxText's GPU configs switch it off in
        ``XLA_FLAGS``); none on a TPU, where both are MaxText's own defaults."""
        del config
        if target.tpu_slice is not None:
            return ()
        found = []
        if "attention" not in dict(self.request.overrides):
            found.append(ATTENTION_CHOSEN(chosen="cudnn_flash_jax"))
        off = "--xla_disable_hlo_passes=rematerialization" in os.environ.get("XLA_FLAGS", "")
        found.append(XLA_REMAT(disabled=off))
        return tuple(found)

    def build_step(
        self,
        policy: rk.Policy,
        schedule: rk.Schedule,
        config: rk.TrainConfig,
        target: rk.Target,
        *,
        sharded: bool = True,
    ) -> rk.sources.SourceStep:
        """MaxText's step under ``policy`` (its config lines, else handed to its decoder).

        ``sharded`` is not read: MaxText's step is built on its mesh whatever the caller
        traces it for (the traced program is the same).
        """
        del sharded
        pol = rk.as_policy(policy)
        if schedule.name != "none":
            raise BadValue(
                f"{self.spec} cannot build schedule {schedule.spec!r}: MaxText checkpoints "
                "every layer itself; schedules it takes: none",
                param="schedule",
            )
        lines = self._lines(pol, config, target)
        patch = None if lines is not None else pol
        words = _settings(
            self.request, config, target.devices, lines or (), target.hosts, target.tpu_slice
        )
        refused = self.refuses(pol, config, target)
        if refused is not None:
            raise BadValue(f"{self.spec}: {rk.notes.words(refused)}", param="policy")
        b = _built(self.request, words, target, patch)
        model_state, batch = b.args[0]["model"], b.args[1]
        weights = _per_device(model_state)
        opt = _per_device(b.args[0]["optimizer"])
        mesh = {k: int(v) for k, v in b.mesh.shape.items() if v > 1}
        meta = {
            "optimizer": str(b.cfg.opt_type),
            "layers": int(b.cfg.num_decoder_layers),
            # MaxText's micro-batches per step: the report's batch counts them all.
            "accum": int(b.cfg.gradient_accumulation_steps),
            "params": int(sum(x.size for x in jax.tree.leaves(b.loss_args[0]))),
            # The devices of MaxText's own mesh: figures are per device where it spans several.
            "devices": int(b.mesh.devices.size),
            "maxtext": {
                "config": self.request.maxtext,
                "policy_lines": list(lines) if lines is not None else None,
                "policy_applied": "config"
                if lines is not None
                else ("decoder's get_remat_policy" if pol.is_remat else "no jax.checkpoint"),
                "mesh": mesh or {"none": 1},
                "per_device_batch_size": float(b.cfg.per_device_batch_size),
                "pipeline": _pipeline(b.cfg),
            },
        }
        step = rk.train.TrainStep(
            fn=b.fn,
            args=b.args,
            donate_argnums=b.donate_argnums,
            loss_fn=b.loss_fn,
            loss_args=b.loss_args,
            breakdown={
                "weights": weights,
                "trainable": weights,
                "gradients": weights,
                "optimizer": opt,
                "batch": _per_device(batch),
            },
            in_shardings=b.in_shardings,
            out_shardings=b.out_shardings,
            mesh=b.mesh,
            precision={
                "name": "MaxText's own",
                "params": _dtypes(b.loss_args[0]),
                "frozen": "-",
                "grads": _dtypes(b.loss_args[0]),
                "optimizer_state": _dtypes(b.args[0]["optimizer"]),
                "compute": jnp.dtype(b.cfg.dtype).name,
                # MaxText's quantized matmuls (fp8, int8 ...), from the config whoever set it
                # (the words or a YAML): "-" where it computes in `compute` throughout.
                "quantization": str(getattr(b.cfg.quantization, "value", b.cfg.quantization))
                or "-",
            },
            categories={1: "input"},
        )
        return rk.sources.SourceStep(step, pol, schedule, str(b.cfg.attention), meta)

    def sequences_per_step(self, config: rk.TrainConfig, target: rk.Target) -> int:
        """The batch times the config's ``gradient_accumulation_steps``: MaxText's batch
        (``per_device_batch_size`` x GPUs) is one micro-batch, and a step trains that many
        (its ``global_batch_size_to_train_on``).

        Example:
          >>> src = MaxTextSource(MaxTextSpec("model_name=llama2-7b gradient_accumulation_steps=2"))
          >>> src.sequences_per_step(rk.TrainConfig(batch=4, seq=128), rk.target("h100"))
          8
        """
        return int(self._cfg(config, target, ()).global_batch_size_to_train_on)

    def smallest_batch(self, config: rk.TrainConfig, target: rk.Target) -> int:
        """One sequence per pipeline micro-batch (one without a pipeline): MaxText refuses a
        batch its micro-batches do not divide."""
        del config, target
        return _microbatches(self.request)

    def batch_ways(self, target: rk.Target) -> int:
        """Every GPU, and with a pipeline its micro-batches: a search steps the global batch
        by whole ``per_device_batch_size``s that MaxText splits into the pipeline's
        micro-batches (it refuses a batch they do not divide).

        Example:
          >>> pipe = "model_name=llama2-7b ici_pipeline_parallelism=2 num_pipeline_microbatches=6"
          >>> MaxTextSource(MaxTextSpec(pipe)).batch_ways(rk.target("h100", devices=4))
          12
        """
        return math.lcm(target.devices, _microbatches(self.request))

    def policy_lines(
        self, policy: rk.Policy, config: rk.TrainConfig, target: rk.Target
    ) -> tuple[str, ...] | None:
        """The MaxText config lines that set ``policy`` for ``config`` on ``target``
        (:func:`config_lines`, of the names the config's step carries where the policy names
        others): what the step is built with, so the lines are the program measured."""
        return self._lines(rk.as_policy(policy), config, target)

    def _lines(
        self, pol: rk.Policy, config: rk.TrainConfig, target: rk.Target
    ) -> tuple[str, ...] | None:
        lines = config_lines(pol)
        if lines is None and any(n not in CUSTOM_TENSORS for n in pol.tags):
            # A name no line takes (megatron's block_out): none where the step carries
            # none of them, or only recomputes them. The tags are traced once under none
            # (whose lines are none: no recursion) and remembered.
            lines = config_lines(pol, rk.sources.tags(self, config, target))
        return lines

    def refuses(self, policy: rk.Policy, config: rk.TrainConfig, target: rk.Target) -> Note | None:
        """A note (:data:`~remat_kit_models.maxtext.PIPELINE_OFFLOAD`) for a policy that
        offloads, on a pipeline, where no config line sets it: handed to the decoder, it
        meets the pipeline's per-iteration checkpoint, which combines it with its own saved
        inputs through jax's ``save_from_both_policies`` (save or recompute only: MaxText's
        own step would raise). None for any other.

        Example:
          >>> pipe = "model_name=llama2-7b ici_pipeline_parallelism=2 num_pipeline_microbatches=2"
          >>> src = MaxTextSource(MaxTextSpec(pipe))
          >>> t, config = rk.target("h100", devices=2), rk.TrainConfig(2, 128)
          >>> src.refuses(rk.policy("offload_dots_no_batch"), config, t).kind
          'maxtext_pipeline_offload'
          >>> src.refuses(rk.policy("minimal_offloaded"), config, t) is None  # its lines
          True
        """
        pol = rk.as_policy(policy)
        if not pol.offloads or self._lines(pol, config, target) is not None:
            return None
        if not self._cfg(config, target, ()).using_pipeline_parallelism:
            return None
        offloaded = tuple(n for n in pol.tags if rk.decide(pol, n) == "offload")
        return PIPELINE_OFFLOAD(policy=pol.spec, offloaded=offloaded)

    def check_step(self, built: rk.sources.SourceStep, what: str) -> None:
        """The traced loss must checkpoint as the policy says (an equivalent program is
        accepted: MaxText's own policy for ours).

        Raises:
          BadValue: the program checkpoints otherwise.
        """
        step = built.step
        closed = jax.make_jaxpr(step.loss_fn)(*step.loss_args)
        pipe = built.meta["maxtext"]["pipeline"]
        also = ()
        if pipe is not None and pipe["iteration_checkpoint"] and built.policy.is_remat:
            # MaxText's pipeline checkpoints each iteration itself, with the decoder's policy
            # and its own saved inputs (its get_pipeline_remat_policy, which reads only the
            # config's remat_policy): the policy acts inside that checkpoint.
            inner = built.policy.jax_policy
            stand_in = SimpleNamespace(
                config=SimpleNamespace(remat_policy=pipe["remat_policy"]),
                remat_policy=None if inner is None else _in_booleans(inner),
            )
            also = (_maxtext().pipeline.PipelineBase.get_pipeline_remat_policy(stand_in),)
        try:
            for composed in also:  # a dot offload, which no name says: its answer on a dot
                rk.checks.keeps_dots(composed)
            rk.checks.check_traced_with(closed, built.policy, also=also, previous=None, what=what)
        except ValueError as err:  # jax's save_from_both_policies, as MaxText's step would
            raise BadValue(
                f"{what} under {built.policy.spec!r}: MaxText's pipeline checkpoints each "
                "iteration with the decoder's policy and its own saved inputs (jax's "
                "save_from_both_policies), which takes only policies that save or recompute, "
                f"and this one offloads ({' '.join(str(err).split())[:120]}); a pipeline "
                "takes an offload as MaxText's remat_policy: custom lines (a policy naming "
                "its tensors)",
                param="policy",
            ) from None

    def mesh_plan(self, target: rk.Target) -> None:
        """None: MaxText lays out its own mesh (``meta["maxtext"]["mesh"]``)."""
        del target

    def cache_parts(self) -> Mapping[str, Any]:
        """The words, a YAML of the user's by its contents, MaxText's version and ours."""
        parts: dict[str, Any] = {
            "request": self.request.maxtext,
            "maxtext": importlib.metadata.version("maxtext"),
            "code_models": rk.cache.code_fingerprint("remat_kit_models"),
        }
        if self.request.yaml != _BASE:
            parts["yaml"] = hashlib.sha256(Path(self.request.yaml).read_bytes()).hexdigest()
        return parts

    def label(self, config: rk.TrainConfig, target: rk.Target) -> str:
        """``maxtext <words> s<seq>``."""
        del target
        return f"{self.spec} s{config.seq}"


def resolve(spec: MaxTextSpec) -> MaxTextSource:
    """The source of a MaxText config (the MaxText kind's ``resolve``).

    Raises:
      BadValue: MaxText is not installed, or bad config words, before anything is built.
    """
    _maxtext()  # not installed: one line naming the extra, before anything else
    spec.overrides  # noqa: B018 (bad words are named before anything is built)
    return MaxTextSource(spec)
