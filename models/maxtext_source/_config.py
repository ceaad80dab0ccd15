"""MaxText's config as this source reads it: its modules imported once, the ``key=value`` words
its ``pyconfig`` reads, and its refusals worded on one line.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import io
import os
import tempfile
import threading
import unittest.mock
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import remat_kit as rk
from remat_kit.errors import BadValue
from remat_kit_models.maxtext import (
    _BASE,
    CUSTOM_TENSORS,
    MaxTextSpec,
)

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


def check_yaml(yaml: Path, spec: MaxTextSpec) -> None:
    """Raise BadValue unless ``yaml`` (``spec``'s config file) is a file."""
    if not yaml.is_file():
        raise BadValue(
            f"MaxText config {spec.yaml}: no such file; give a MaxText YAML, or only "
            "key=value words (MaxText's base.yml)",
            param="maxtext",
        )


@functools.cache
def _config(spec: MaxTextSpec, words: tuple[str, ...]) -> Any:
    """MaxText's config for ``words`` (its ``pyconfig.initialize``), or BadValue."""
    # A user's YAML is looked for before MaxText's model code is imported (seconds).
    yaml = Path(spec.yaml)
    if spec.yaml == _BASE:
        yaml = Path(_maxtext().pyconfig.__file__).parent / _BASE
    check_yaml(yaml, spec)
    mt = _maxtext()
    try:
        with _quiet():
            cfg = _from_merged(mt, yaml, words)
            return cfg if cfg is not None else _initialize(mt, yaml, words)
    except Exception as err:  # MaxText's ValueError, pydantic's ValidationError, asserts
        raise BadValue(f"MaxText refused the config: {_refusal(err)}", param="maxtext") from None


#: The keys whose value reaches MaxText's merged YAML as that key's value alone (no other key
#: reads it while the YAML files and the words are merged): the batch, the sequence, the
#: device count and the remat lines, which a search varies from one config to the next.
_VARIED = frozenset(
    {
        "per_device_batch_size",
        "max_target_length",
        "internal_compile_num_devices",
        "remat_policy",
        "ici_pipeline_parallelism",
        "dcn_pipeline_parallelism",
        "num_pipeline_microbatches",
        *CUSTOM_TENSORS,
    }
)

#: For each config read in full, by :func:`_family`: the varied keys its words set, its
#: merged keys (what ``pyconfig`` hands pydantic) and the keys set explicitly (a whole
#: ``pyconfig.initialize`` is mostly its YAML merge, 0.3 s; a search reads a config per
#: policy and batch).
_MERGED: dict[tuple[Any, ...], list[tuple[frozenset[str], dict[str, Any], set[str]]]] = {}
_LOCK = threading.Lock()


def _family(yaml: Path, words: tuple[str, ...]) -> tuple[Any, ...] | None:
    """What a config's merged YAML depends on but :data:`_VARIED`'s words: the file, every
    other word, and MaxText's ``M_`` environment overrides; None for words this does not
    read (a key twice, an interpolation in a varied value)."""
    pairs = [w.split("=", 1) for w in words]
    if any(len(p) != 2 for p in pairs) or len({k for k, _ in pairs}) != len(pairs):
        return None
    if any(k in _VARIED and "$" in v for k, v in pairs):
        return None
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("M_")))
    kept = tuple(sorted((k, v) for k, v in pairs if k not in _VARIED))
    return (str(yaml), kept, env)


def _initialize(mt: Any, yaml: Path, words: tuple[str, ...]) -> Any:
    """MaxText's ``pyconfig.initialize`` for ``words``, its merged keys kept for the
    configs of its :func:`_family`."""
    family = _family(yaml, words)
    prepare = getattr(mt.pyconfig, "_prepare_for_pydantic", None)
    if family is None or prepare is None:  # a MaxText without the step: read it whole
        return mt.pyconfig.initialize(["remat-kit", str(yaml), *words])
    seen: list[dict[str, Any]] = []

    def keep(raw: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        seen.append(copy.deepcopy(raw))
        return prepare(raw, **kwargs)

    with _LOCK, unittest.mock.patch.object(mt.pyconfig, "_prepare_for_pydantic", keep):
        cfg = mt.pyconfig.initialize(["remat-kit", str(yaml), *words])
    held = getattr(cfg, "_pydantic_config", None)  # a MaxText that keeps it elsewhere: no reuse
    if len(seen) == 1 and held is not None:
        explicit = set(held.__pydantic_fields_set__)
        _MERGED.setdefault(family, []).append((_varied(words), seen[0], explicit))
    return cfg


def _varied(words: tuple[str, ...]) -> frozenset[str]:
    return frozenset(k for k in (w.split("=", 1)[0] for w in words) if k in _VARIED)


def _from_merged(mt: Any, yaml: Path, words: tuple[str, ...]) -> Any:
    """The config MaxText's ``pyconfig.initialize`` makes of ``words``, from the merged
    keys of one of its :func:`_family` read before whose words set no varied key these do
    not, the varied values set as MaxText's command line reads them, then validated as
    ``pyconfig`` does; None where none was read (or where pydantic refuses: MaxText's own
    path words the refusal).

    A key these words add to that one's is theirs over the YAML's, as MaxText merges it
    when ``override_model_config`` is on (else MaxText checks the pair), and is explicit."""
    import omegaconf

    family = _family(yaml, words)
    keys = _varied(words)
    pyconfig = mt.pyconfig
    for held, merged, explicit in _MERGED.get(family, []) if family is not None else []:
        added = keys - held
        if held <= keys and (
            not added
            or (
                merged.get("override_model_config") is True
                and not any(f"M_{k.upper()}" in os.environ for k in added)
            )
        ):
            explicit = explicit | (added & set(pyconfig.types.MaxTextConfig.model_fields))
            break
    else:
        return None
    raw = copy.deepcopy(merged)
    varied = [w for w in words if w.split("=", 1)[0] in _VARIED]
    try:
        raw.update(omegaconf.OmegaConf.to_container(omegaconf.OmegaConf.from_cli(varied)))
        kwargs = pyconfig._prepare_for_pydantic(raw, config_class=pyconfig.types.MaxTextConfig)
        made = pyconfig.types.MaxTextConfig(**kwargs)
    except Exception:  # refused: MaxText's own path raises it, worded as MaxText words it
        return None
    object.__setattr__(made, "__pydantic_fields_set__", set(explicit))
    return pyconfig.HyperParameters(made)


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
