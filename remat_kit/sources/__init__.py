"""Model sources: a Flax model anyone wrote, as something remat_kit can build a train step of.

A factory is a callable ``NAME(policy)`` returning a Flax module (linen or NNX) that maps int32
tokens ``[batch, seq]`` to logits ``[batch, seq, vocab]`` (or an output with ``.logits``).
``policy`` is an ``rk.Policy``: the factory applies it where it wants
(``rk.remat(Block, policy)``, ``nn.remat(Block, policy=policy.jax_policy)``); ``policy.name ==
"none"`` means no remat. A factory that also takes ``schedule=`` (an ``rk.Schedule``) is
offered layer schedules; otherwise asking for one is an error and the planner leaves them out.

:func:`from_factory` loads one from ``path/to/file.py:NAME`` or ``package.module:NAME`` into
a :class:`ModelSource`; :meth:`ModelSource.build` makes the module for one policy, tagged by
:mod:`remat_kit.tagging` (so name-based policies work on a model nobody tagged), with the
policy applied by patching a block class when the model has no remat hook (``block=``), and
with Hugging Face's keyword inputs (``attention_mask``, ``position_ids``) made from the tokens.
A request names its model with a spec (:class:`FactorySpec`, :class:`StepSpec`, or a spec of
a kind a plugin registers, such as the presets' ``PresetSpec``); :func:`resolve` makes the
source (:mod:`remat_kit.sources._kinds`). remat_kit never imports the presets package.

A user who has a train step already hands it over instead (:func:`from_step`, ``--step
file.py:NAME``): ``NAME(policy, config)`` returns the step and its abstract arguments
(:class:`OwnStep`), measured by the same pipeline (see :mod:`remat_kit.sources._own_step`).

Example:
  >>> import remat_kit as rk
  >>> src = rk.sources.from_factory(tiny_model)  # or "path/to/file.py:NAME"
  >>> built = src.build("minimal")
  >>> step = built.train_step(rk.TrainConfig(batch=2, seq=16))
  >>> rk.memory_report(step.fn, *step.args, target="h100").fits
  True
"""

from remat_kit.sources._adapters import MADE_INPUTS
from remat_kit.sources._depth import DEPTH_MODES
from remat_kit.sources._environ import ALLOCATOR_VARS, EnvSet
from remat_kit.sources._kinds import (
    ENTRY_POINTS,
    TRAIN_FIELDS,
    FactorySpec,
    ModelSpec,
    SourceKind,
    StepSpec,
    kind_named,
    kind_of,
    kinds,
    resolve,
)
from remat_kit.sources._loading import load_factory, patched_block
from remat_kit.sources._own_step import ROLES, OwnStep, OwnStepSource, from_step
from remat_kit.sources._protocol import SourceStep, StepSource
from remat_kit.sources._source import (
    ALL_SCHEDULES,
    BuiltModel,
    ModelSource,
    from_factory,
    hf_inputs,
)
from remat_kit.sources._spread import Spread
from remat_kit.sources._steps import (
    breakdown,
    measure,
    nbytes_count,
    residuals,
    step_flop_count,
    step_flops,
    with_baseline,
    workload,
)
from remat_kit.sources._tag_checks import check_policies, tags, usable_policies
from remat_kit.sources._workload import Measured, Workload

__all__ = [
    "ALLOCATOR_VARS",
    "ALL_SCHEDULES",
    "DEPTH_MODES",
    "ENTRY_POINTS",
    "MADE_INPUTS",
    "ROLES",
    "TRAIN_FIELDS",
    "BuiltModel",
    "EnvSet",
    "FactorySpec",
    "Measured",
    "ModelSource",
    "ModelSpec",
    "OwnStep",
    "OwnStepSource",
    "SourceKind",
    "SourceStep",
    "Spread",
    "StepSource",
    "StepSpec",
    "Workload",
    "breakdown",
    "check_policies",
    "from_factory",
    "from_step",
    "hf_inputs",
    "kind_named",
    "kind_of",
    "kinds",
    "load_factory",
    "measure",
    "nbytes_count",
    "patched_block",
    "residuals",
    "resolve",
    "step_flop_count",
    "step_flops",
    "tags",
    "usable_policies",
    "with_baseline",
    "workload",
]
