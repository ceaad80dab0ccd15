"""The one model-source protocol: what the measuring pipeline needs from any model.

A preset (``models``), a Hugging Face ``config.json`` mapped onto our decoder and a user's
factory (:class:`remat_kit.sources.ModelSource`) are all a :class:`StepSource`: given a
policy, a schedule, a train config and a target, a source builds the train step and says how
to label it. :mod:`remat_kit.sources._steps` measures any of them the same way; nothing there
asks which kind of source it holds.

Example:
  >>> import remat_kit as rk
  >>> src = rk.sources.from_factory("tests/data/factories.py:untagged")
  >>> isinstance(src, rk.sources.StepSource)
  True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from remat_kit.notes import Note
from remat_kit.policies import Policy
from remat_kit.schedules import Schedule
from remat_kit.sharding import MeshPlan
from remat_kit.sources._environ import EnvSet
from remat_kit.targets import Target
from remat_kit.train import TrainConfig, TrainStep

__all__ = [
    "SourceStep",
    "StepSource",
]


@dataclasses.dataclass(frozen=True)
class SourceStep:
    """A source's train step for one policy, schedule, config and target.

    Attributes:
      step: the train step (``rk.train.TrainStep``).
      policy: the policy the model was built with.
      schedule: the layer schedule it was built with.
      attention: the attention kernel the step runs (``"xla"``, ``"cudnn"``, or
        ``"model's own"`` where the source does not choose it).
      meta: the source's own labels for the report (layers, parameters, LoRA rank ...).
    """

    step: TrainStep
    policy: Policy
    schedule: Schedule
    attention: str
    meta: Mapping[str, Any]


@runtime_checkable
class StepSource(Protocol):
    """A model the pipeline can build train steps of (see the module docstring).

    The members below ``label`` say how one kind differs from another; each has a default,
    which a source inherits by naming the protocol as its base (``class S(StepSource)``).
    Nothing asks a source what kind it is.

    Attributes:
      spec: the model's name in reports (a preset name, ``file.py:NAME`` ...).
      schedule_kinds: the schedule names (``none``, ``every``, ``layers`` ...) it builds.
      own_model: the model is the user's code: it names its tensors its own way (a
        name-based policy is checked against its traced program) and computes in its own
        dtypes. Default False.
      env_at_import: what importing the user's code set in the environment (EasyDeL sets
        ``XLA_FLAGS`` and the allocator's fraction): a process that trains the model runs
        with it. Default none.
      applies_in_code: how the user hands a plan's policy and schedule to this model in
        code: ``"config"`` (fields of the model's config), ``"arguments"`` (``policy`` and
        ``schedule=`` arguments of the user's function), ``"policy"`` (a ``policy``
        argument only: schedules go through a patched block), ``"lines"`` (lines of the model's
        own config file, :meth:`policy_lines`). Default ``"policy"``.
      remat_always: the model's own trainer checkpoints every layer and has no setting
        without (MaxText): ``none`` is measured as the baseline, never planned. Default
        False.
    """

    spec: str
    own_model: bool = False
    env_at_import: tuple[EnvSet, ...] = ()
    applies_in_code: str = "policy"
    remat_always: bool = False

    @property
    def schedule_kinds(self) -> frozenset[str]: ...

    def n_layers(self) -> int | None:
        """Layers of the model, None when they cannot be counted."""
        ...

    def at_depth(self, layers: int) -> StepSource | None:
        """The same model with ``layers`` identical layers (a shallow copy whose programs
        :mod:`remat_kit.sources._depth` extrapolates from), None when it has no such copy
        (a scanned stack compiles one body anyway; a factory that takes no ``layers=``)."""
        ...

    def check(self, config: TrainConfig, target: Target) -> None:
        """Checks what needs no trace, before anything is built: the model's sizes, its
        kernels on ``target``; raises BadValue."""
        ...

    def build_step(
        self,
        policy: Policy,
        schedule: Schedule,
        config: TrainConfig,
        target: Target,
        *,
        sharded: bool = True,
    ) -> SourceStep:
        """The train step under ``policy`` and ``schedule`` (unsharded when not
        ``sharded``), every input already typed."""
        ...

    def check_step(self, built: SourceStep, what: str) -> None:
        """Checks the traced program of ``built`` before it is compiled (a framework that
        caches traces may replay a stale one); raises BadValue."""
        ...

    def mesh_plan(self, target: Target) -> MeshPlan | None:
        """The mesh plan its steps are sharded with on ``target`` (None: one device)."""
        ...

    def cache_parts(self) -> Mapping[str, Any] | None:
        """Everything the source's programs depend on, JSON-ready, for the on-disk cache;
        None: its answers are not remembered (code the cache cannot fingerprint)."""
        ...

    def label(self, config: TrainConfig, target: Target) -> str:
        """A short name of the run for tables (model, sequence, optimizer ...)."""
        ...

    def layer_kinds(self, target: Target) -> int | None:
        """How many different layers the model's stack holds, None when it cannot tell
        (the default: a preset's layers are alike by construction)."""
        del target
        return None

    def train_config(self, config: TrainConfig) -> TrainConfig:
        """The train config as this source trains it, where it fills in what ``config``
        leaves open (a preset trains in the default precision regime where none is named):
        equal configs key the same answers on disk. Default: as given."""
        return config

    def sequences_per_step(self, config: TrainConfig, target: Target) -> int:
        """Sequences one optimizer step of ``config`` trains on ``target``: its batch (the
        default), or more where the model's own config accumulates gradients over
        micro-batches of that batch (MaxText's ``gradient_accumulation_steps``): what a
        report's batch, tokens and tokens/s count."""
        del target
        return config.batch

    def smallest_batch(self, config: TrainConfig, target: Target) -> int:
        """The smallest batch its steps take for ``config``, at which what does not depend on
        the batch (the tags a program holds) is traced: one sequence per micro-batch (the
        default), or more where the model's own config splits the batch further (MaxText's
        pipeline micro-batches, which it refuses a smaller batch for)."""
        del target
        return max(1, config.accum)

    def batch_ways(self, target: Target) -> int:
        """The batch sizes its steps take on ``target`` are multiples of this: the devices
        that hold different samples (a mesh plan's data-parallel size; default one)."""
        plan = self.mesh_plan(target)
        return plan.data_size if plan is not None else 1

    def policy_lines(
        self, policy: Policy, config: TrainConfig, target: Target
    ) -> tuple[str, ...] | None:
        """The lines of the model's own config that set ``policy`` for ``config`` on
        ``target``, for a model whose own trainer reads its remat from a config file
        (MaxText's ``remat_policy: custom`` and a line per tensor its step carries); None
        where no config line sets it (the default: a model takes its policy in code,
        ``applies_in_code``)."""
        del policy, config, target
        return None

    def refuses(self, policy: Policy, config: TrainConfig, target: Target) -> Note | None:
        """Why its steps cannot take ``policy`` for ``config`` on ``target``, as a note of
        its kind (MaxText's pipeline combines the policy in a way that takes no offload), or
        None (the default: every policy). A default catalogue leaves such a policy out and
        says why (:func:`~remat_kit.sources.buildable_policies`); one the user names is
        refused in one line when its step is built."""
        del policy, config, target
        return None

    def notes(self, config: TrainConfig, target: Target) -> tuple[Note, ...]:
        """What a user should know about how this source's programs are made for ``target``
        (a kernel it chose and why), as notes for the rendering layer. Default none."""
        del config, target
        return ()
