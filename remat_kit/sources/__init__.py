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

# The names are imported on first use (PEP 562), as remat_kit's own are: ``remat-kit --help``
# reads the kinds of source (their options, remat_kit.sources._kinds) without starting jax.

from typing import TYPE_CHECKING

from remat_kit._lazy import loader

if TYPE_CHECKING:  # what the names below are, for readers and type checkers
    from remat_kit.sources._adapters import MADE_INPUTS
    from remat_kit.sources._depth import DEPTH_MODES
    from remat_kit.sources._door import workload
    from remat_kit.sources._environ import ALLOCATOR_VARS, EnvSet
    from remat_kit.sources._kinds import (
        ENTRY_POINTS,
        LAYERS,
        MODEL,
        OPTION_TYPES,
        SHARD,
        TRAIN_FIELDS,
        TRAIN_OPTIONS,
        FactorySpec,
        ModelSpec,
        Option,
        SourceKind,
        StepSpec,
        kind_named,
        kind_of,
        kinds,
        resolve,
    )
    from remat_kit.sources._loading import load_factory, patched_block
    from remat_kit.sources._measured import Measured
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
    )
    from remat_kit.sources._tag_checks import (
        buildable_policies,
        check_policies,
        tags,
        usable_policies,
    )
    from remat_kit.sources._workload import Workload

#: Where each public name lives: the private module it is imported from on first use.
_HOME: dict[str, str] = {
    "MADE_INPUTS": "_adapters",
    "DEPTH_MODES": "_depth",
    "ALLOCATOR_VARS": "_environ",
    "EnvSet": "_environ",
    "ENTRY_POINTS": "_kinds",
    "Option": "_kinds",
    "TRAIN_OPTIONS": "_kinds",
    "SHARD": "_kinds",
    "OPTION_TYPES": "_kinds",
    "MODEL": "_kinds",
    "LAYERS": "_kinds",
    "FactorySpec": "_kinds",
    "ModelSpec": "_kinds",
    "SourceKind": "_kinds",
    "StepSpec": "_kinds",
    "TRAIN_FIELDS": "_kinds",
    "kind_named": "_kinds",
    "kind_of": "_kinds",
    "kinds": "_kinds",
    "resolve": "_kinds",
    "load_factory": "_loading",
    "patched_block": "_loading",
    "OwnStep": "_own_step",
    "OwnStepSource": "_own_step",
    "ROLES": "_own_step",
    "from_step": "_own_step",
    "SourceStep": "_protocol",
    "StepSource": "_protocol",
    "ALL_SCHEDULES": "_source",
    "BuiltModel": "_source",
    "ModelSource": "_source",
    "from_factory": "_source",
    "hf_inputs": "_source",
    "Spread": "_spread",
    "breakdown": "_steps",
    "measure": "_steps",
    "nbytes_count": "_steps",
    "residuals": "_steps",
    "step_flop_count": "_steps",
    "step_flops": "_steps",
    "with_baseline": "_steps",
    "workload": "_door",
    "buildable_policies": "_tag_checks",
    "check_policies": "_tag_checks",
    "tags": "_tag_checks",
    "usable_policies": "_tag_checks",
    "Measured": "_measured",
    "Workload": "_workload",
}


__getattr__ = loader(__name__, _HOME, globals())


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "ALLOCATOR_VARS",
    "ALL_SCHEDULES",
    "DEPTH_MODES",
    "ENTRY_POINTS",
    "LAYERS",
    "MADE_INPUTS",
    "MODEL",
    "OPTION_TYPES",
    "ROLES",
    "SHARD",
    "TRAIN_FIELDS",
    "TRAIN_OPTIONS",
    "BuiltModel",
    "EnvSet",
    "FactorySpec",
    "Measured",
    "ModelSource",
    "ModelSpec",
    "Option",
    "OwnStep",
    "OwnStepSource",
    "SourceKind",
    "SourceStep",
    "Spread",
    "StepSource",
    "StepSpec",
    "Workload",
    "breakdown",
    "buildable_policies",
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
