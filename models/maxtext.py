"""MaxText configs as a kind of model source: the request, its flag and its notes.

``--maxtext "model_name=llama2-7b ici_fsdp_parallelism=8"`` (or a YAML path first, as
MaxText's own command line takes it: ``"my.yml base_num_decoder_layers=4"``) asks for a
:class:`MaxTextSpec`, which :data:`MAXTEXT` (registered under the ``remat_kit.sources`` entry
points, ``pyproject.toml``) turns into a :class:`~remat_kit_models.maxtext_source.MaxTextSource`:
MaxText's own model, train step, optimizer and mesh, built as its AOT compiler builds them.
The kind brings its flag (:data:`OPTION`) and its notes (:data:`ATTENTION_CHOSEN`,
:data:`XLA_REMAT`, :data:`PIPELINE_OFFLOAD`); the source is imported when a spec is
resolved, so this module starts no jax (``remat-kit --help`` reads it for its flag).

What the command line owns is not taken from the config (:data:`OWNED`): the batch, the
sequence, the policy and the target; a config word that sets them is refused, naming the flag.

MaxText is an optional dependency (``pip install 'remat-kit[maxtext]'``): it is imported only
when a MaxText source is built.

Example:
  >>> import remat_kit as rk
  >>> MaxTextSpec("model_name=llama2-7b base_num_decoder_layers=2").name
  'maxtext model_name=llama2-7b base_num_decoder_layers=2'
  >>> config_lines(rk.policy("offload", offload=["decoder_layer_input"], save=["context"]))
  ('remat_policy: custom', 'decoder_layer_input: offload', 'context: device')
"""

from __future__ import annotations

import dataclasses
import importlib
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from remat_kit.errors import BadValue
from remat_kit.notes import NoteKind
from remat_kit.sources import Option, SourceKind
from remat_kit_models.maxtext_lines import CUSTOM_TENSORS, config_lines

if TYPE_CHECKING:  # what the names forwarded below are
    from remat_kit_models.maxtext_source import MaxTextSource

__all__ = [
    "ATTENTION_CHOSEN",
    "CUSTOM_TENSORS",
    "MAXTEXT",
    "OPTION",
    "OWNED",
    "PIPELINE_OFFLOAD",
    "XLA_REMAT",
    "MaxTextSource",
    "MaxTextSpec",
    "config_lines",
]

#: Config keys the command line owns, and the flag that sets each.
OWNED: Mapping[str, str] = {
    "per_device_batch_size": "the batch (the global batch; per device = batch / devices)",
    "max_target_length": "the sequence length",
    "remat_policy": "the policy (maxtext:remat_policy=NAME for MaxText's own)",
    **{
        name: "the policy (a save/offload policy; plan prints its lines)" for name in CUSTOM_TENSORS
    },
    "hardware": "the target",
    "compile_topology": "the target (a TPU slice by its name, --target v5e-4)",
    "compile_topology_num_slices": "the target's TPU slices (--slices)",
    "internal_compile": "the target and its devices",
    "internal_compile_num_devices": "the target's devices",
}


#: The default config MaxText's own command line starts from.
_BASE = "base.yml"


@dataclasses.dataclass(frozen=True)
class MaxTextSpec:
    """A MaxText model: its config words as MaxText's command line takes them.

    Attributes:
      maxtext: an optional YAML path first (default MaxText's ``base.yml``), then
        ``key=value`` overrides (``model_name=llama2-7b ici_fsdp_parallelism=8``).

    Example:
      >>> MaxTextSpec("model_name=mixtral-8x7b").overrides
      (('model_name', 'mixtral-8x7b'),)
    """

    maxtext: str

    def __post_init__(self) -> None:
        words = self.maxtext if isinstance(self.maxtext, str) else " ".join(self.maxtext)
        object.__setattr__(self, "maxtext", " ".join(shlex.split(words)))
        self.yaml  # noqa: B018 (bad words fail here, before anything is built)

    @property
    def name(self) -> str:
        """``maxtext`` and the words."""
        return f"maxtext {self.maxtext}"

    @property
    def yaml(self) -> str:
        """The YAML config (a path, or MaxText's ``base.yml``)."""
        words = self.maxtext.split()
        return words[0] if words and "=" not in words[0] else _BASE

    @property
    def overrides(self) -> tuple[tuple[str, str], ...]:
        """The ``key=value`` words as pairs, in the order given.

        Raises:
          BadValue: a word that is not ``key=value``, a key given twice or one the command
            line owns (:data:`OWNED`).
        """
        words = self.maxtext.split()
        if words and "=" not in words[0]:
            words = words[1:]
        pairs: list[tuple[str, str]] = []
        for word in words:
            key, eq, value = word.partition("=")
            if not eq or not key:
                raise BadValue(
                    f"MaxText config word {word!r}: after the optional YAML path every word is "
                    "key=value, as MaxText's command line takes them (model_name=llama2-7b)",
                    param="maxtext",
                )
            if key in OWNED:
                raise BadValue(
                    f"MaxText config word {key}={value}: {key} is set by {OWNED[key]}; drop "
                    "it from the config words",
                    param="maxtext",
                )
            if key in dict(pairs):
                raise BadValue(f"the MaxText config words give {key} twice", param="maxtext")
            pairs.append((key, value))
        return tuple(pairs)


#: ``--maxtext``: the config words, one string however many words are typed.
OPTION = Option(
    "--maxtext",
    "maxtext",
    "a MaxText config as its own command line takes it: an optional YAML path, then "
    "key=value words, e.g. --maxtext model_name=llama2-7b ici_fsdp_parallelism=8 "
    "(pip install 'remat-kit[maxtext]')",
    type="words",
    metavar="WORD",
    params=("maxtext",),
    what="a MaxText config",
)

#: On a GPU, the attention kernel measured where the config names none.
ATTENTION_CHOSEN = NoteKind(
    "maxtext_attention",
    ("chosen",),
    lambda d: (
        f"attention={d['chosen']}: the config names no kernel, and MaxText's default on a GPU "
        "(tokamax's Pallas Triton flash attention) compiles only on a GPU present; set "
        f"attention= in {OPTION.flag} to choose"
    ),
)

#: On a GPU, whether XLA's own rematerialization pass ran (MaxText's GPU configs switch it off).
XLA_REMAT = NoteKind(
    "maxtext_xla_remat",
    ("disabled",),
    lambda d: (
        "XLA's own rematerialization pass is off (XLA_FLAGS "
        "--xla_disable_hlo_passes=rematerialization, as MaxText's GPU configs set it)"
        if d["disabled"]
        else "XLA's own rematerialization pass is on; MaxText's GPU configs switch it off: "
        "XLA_FLAGS=--xla_disable_hlo_passes=rematerialization"
    ),
)

#: A policy MaxText's pipeline cannot take: one that offloads, handed to the decoder (no
#: config line sets it), which the pipeline's per-iteration checkpoint combines with its own
#: saved inputs through jax's ``save_from_both_policies`` (it takes save or recompute only).
PIPELINE_OFFLOAD = NoteKind(
    "maxtext_pipeline_offload",
    ("policy", "offloaded"),
    lambda d: (
        f"{d['policy']}: MaxText's pipeline checkpoints each iteration with the decoder's "
        "policy and its own saved inputs (jax's save_from_both_policies), which takes no "
        f"offload ({', '.join(d['offloaded']) or 'of matmul outputs'}); a pipeline offloads "
        "only through MaxText's remat_policy: custom lines (a policy naming its tensors: "
        "minimal_offloaded, offload:offload=...)"
    ),
)


def _resolve(spec: MaxTextSpec) -> MaxTextSource:
    from remat_kit_models.maxtext_source import resolve

    return resolve(spec)


#: MaxText configs (``--maxtext "model_name=llama2-7b ..."``): MaxText's own step, optimizer
#: and precision, so the kind trains no field of the train config.
MAXTEXT = SourceKind(
    "maxtext",
    MaxTextSpec,
    _resolve,
    "maxtext",
    trains=frozenset(),
    options=(OPTION,),
    notes=(ATTENTION_CHOSEN, XLA_REMAT, PIPELINE_OFFLOAD),
)


def __getattr__(name: str) -> Any:
    # The source (MaxTextSource and its helpers) starts jax: imported on first use.
    if not name.startswith("__"):
        return getattr(importlib.import_module("remat_kit_models.maxtext_source"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
