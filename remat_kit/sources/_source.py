"""A model source: a factory ``NAME(policy)`` and how to build its module for one policy.

See :mod:`remat_kit.sources` for what a factory is.

Example:
  >>> import remat_kit as rk
  >>> src = rk.sources.from_factory("tests/data/factories.py:untagged")
  >>> src.build("minimal").kind
  'linen'
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

from remat_kit import checks, tagging
from remat_kit.errors import BadValue
from remat_kit.notes import Note
from remat_kit.policies import FULL, NO_REMAT, Policy, PolicyLike, as_policy
from remat_kit.residuals import tags_in
from remat_kit.schedules import NO_SCHEDULE, Schedule, parse_schedule
from remat_kit.sharding import MeshPlan, check_data_parallel, parse_shard
from remat_kit.sources._adapters import Applied, NNXModel, auto_inputs, hf_inputs, retyped
from remat_kit.sources._environ import EnvSet
from remat_kit.sources._factory import call_factory, count_layers, model_errors, target_kwargs
from remat_kit.sources._loading import (
    _import_class,
    _names,
    _takes,
    load_factory_env,
    patched_block,
)
from remat_kit.sources._protocol import SourceStep, StepSource
from remat_kit.sources._streams import streams_asked
from remat_kit.targets import Target
from remat_kit.train import TrainConfig, TrainStep, build_train_step

__all__ = [
    "ALL_SCHEDULES",
    "BuiltModel",
    "ModelSource",
    "from_factory",
    "hf_inputs",
]

#: Schedules a factory that takes ``schedule=`` is offered.
ALL_SCHEDULES = frozenset({"none", "every", "sqrt", "nested", "layers"})


@dataclasses.dataclass(frozen=True)
class BuiltModel:
    """A source's module for one policy and schedule, with what its train step needs.

    Attributes:
      module: an object with linen's ``init``/``apply`` (tagged, block patched, NNX adapted).
      policy: the policy it was built with.
      schedule: the layer schedule it was built with.
      inputs: keyword inputs made from the tokens (None: the tokens alone).
      output: reads the logits from ``apply``'s result (None: ``rk.train.logits_of``).
      kind: ``"linen"`` or ``"nnx"``.
    """

    module: Any
    policy: Policy
    schedule: Schedule
    inputs: Callable[[jax.Array], Mapping[str, Any]] | None
    output: Callable[[Any], jax.Array] | None
    kind: str

    def train_step(self, config: TrainConfig, **kwargs: Any) -> TrainStep:
        """``rk.build_train_step`` of this module with its inputs and output adapter.

        Args:
          config: the train config.
          **kwargs: passed on (``sharding``, ``mesh``, ``trainable`` ...).

        Returns:
          The TrainStep.
        """
        return build_train_step(
            self.module, config, inputs=self.inputs, output=self.output, **kwargs
        )


@dataclasses.dataclass(frozen=True)
class ModelSource(StepSource):
    """A model from a factory ``NAME(policy)`` (see the module docstring).

    Attributes:
      spec: where it came from (``file.py:NAME``), its name in reports.
      factory: the callable.
      takes_schedule: the factory accepts ``schedule=``.
      takes_target: the factory names a ``target`` parameter: it is called with the Target
        the step is compiled for (a model that builds a device mesh needs the target's). Its
        traces that read only the model's structure (its layers, its own tags) pass the
        factory's default, else the host's target (``rk.target("cpu")``).
      block: ``module:Class`` of a block to rematerialize by patching (models with no remat
        hook), or None.
      tags: tag rules for :mod:`remat_kit.tagging` (rule and alias sets such as ``"hf"``,
        ``"easydel"``, ``"hf+maxtext"``, or ``"paths"``), None to leave the model's own tags
        alone, or ``"auto"``: every rule set, unless the model tags tensors itself (found by
        tracing its ``init`` once); then its own names, with ours beside those of an alias
        set (:func:`remat_kit.tagging.aliases_for`).
      inputs: keyword inputs from the tokens; ``"auto"`` gives Hugging Face's when the
        module's ``__call__`` takes ``attention_mask`` and ``position_ids``.
      output: the logits from the module's output (None: array, ``.logits`` or tuple[0]).
      env_at_import: what importing the factory's file set in the environment (EasyDeL sets
        ``XLA_PYTHON_CLIENT_MEM_FRACTION``): a process that trains the model gets it too.
      shard: a data-parallel mesh plan (``fsdp:8``, ``dp:2,fsdp:4``): the batch is split
        over every device, and each parameter (and its optimizer state) over the ``fsdp``
        devices along its largest dimension they divide (ZeRO-3 by shape: a factory's
        parameters carry no axis names); XLA places the rest. None: one device.
    """

    spec: str
    factory: Callable[..., Any] = dataclasses.field(compare=False)
    takes_schedule: bool = False
    takes_target: bool = False
    block: str | None = None
    tags: str | tuple[Any, ...] | None = "auto"
    inputs: Callable[[jax.Array], Mapping[str, Any]] | str | None = "auto"
    output: Callable[[Any], jax.Array] | None = None
    env_at_import: tuple[EnvSet, ...] = dataclasses.field(default=(), compare=False)
    shard: str | None = None
    _cache: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    #: The user's model: its own tag names and compute dtypes.
    own_model = True

    @property
    def applies_in_code(self) -> str:
        """``"arguments"`` when the factory takes ``schedule=`` beside ``policy``, else
        ``"policy"``."""
        return "arguments" if self.takes_schedule else "policy"

    @property
    def schedule_kinds(self) -> frozenset[str]:
        """Schedule names this source can build: every one when the factory takes
        ``schedule=``; ``none`` and per-layer ``layers`` plans with ``block``; else ``none``."""
        if self.takes_schedule:
            return ALL_SCHEDULES
        return frozenset({"none", "layers"}) if self.block else frozenset({"none"})

    def check_schedule(self, schedule: Any) -> Schedule:
        """The schedule, or a one-line error when this source cannot build it.

        Raises:
          BadValue: a schedule the factory cannot take (it has no ``schedule=`` parameter).
        """
        sch = parse_schedule(schedule)
        if sch.name not in self.schedule_kinds:
            how = (
                "with a patched block only per-layer plans (layers:...) are applied"
                if self.block
                else "its factory takes no schedule= argument"
            )
            raise BadValue(
                f"{self.spec} cannot build schedule {sch.spec!r}: {how}; "
                f"schedules it takes: {', '.join(sorted(self.schedule_kinds))}",
                param="schedule",
            )
        return sch

    def build(
        self, policy: PolicyLike = "none", schedule: Any = "none", target: Target | None = None
    ) -> BuiltModel:
        """The model for ``policy`` and ``schedule``, ready for a train step.

        The factory runs under ``nnx.eval_shape``, so an NNX model's weights are never
        allocated; a linen module is returned as the factory made it.

        Args:
          policy: a policy name, spec, Policy or jax callable.
          schedule: a layer schedule (see :attr:`schedule_kinds`).

        Returns:
          The BuiltModel.

        Raises:
          BadValue: a schedule the source cannot build, a factory that fails (its error in
            one line) or returns something that is not a Flax module.
        """
        pol, sch = as_policy(policy), self.check_schedule(schedule)
        return self._build(pol, sch, *self._tagging(), target=target)

    def at_depth(self, layers: int, *, label: bool = True) -> ModelSource | None:
        """The factory's model with ``layers`` layers, when the factory takes ``layers=``
        (a shallow copy for :mod:`remat_kit.sources._depth`, or ``--layers``); else None.

        Args:
          layers: the depth to build.
          label: name the depth in :attr:`spec` (``f.py:NAME [2 layers]``), as copies are.

        Returns:
          The source at that depth, or None for a factory with no ``layers`` parameter.

        Example:
          >>> from_factory("tests/data/factories.py:untagged").at_depth(2) is None
          True
        """
        if not _names(self.factory, "layers"):  # a factory must say it builds any depth
            return None
        return dataclasses.replace(
            self,
            spec=f"{self.spec} [{layers} layers]" if label else self.spec,
            factory=functools.partial(self.factory, layers=layers),
            _cache={},
        )

    def notes(self, config: TrainConfig, target: Target) -> tuple[Note, ...]:
        """``whole_model_probes`` where an unrolled stack of identical layers, deep enough
        to be answered from shallow copies (:mod:`remat_kit.sources._depth`), has none
        because the factory takes no ``layers=``: every compile is at full depth.

        Example:
          >>> from_factory(tiny_model).notes(rk.TrainConfig(2, 16), rk.target("h100"))
          ()
        """
        from remat_kit.sources._depth import DEPTHS, MIN_LAYERS

        del config
        layers = self.n_layers()
        if layers is None or layers < MIN_LAYERS or self.mesh_plan(target) is not None:
            return ()
        if self.at_depth(DEPTHS[0]) is not None or self.layer_kinds(target) != 1:
            return ()
        return (Note("whole_model_probes", {"model": self.spec, "layers": layers}),)

    def layer_kinds(self, target: Target) -> int | None:
        """How many different layers the model's stack holds: its step traced once at full
        depth under ``full``, which puts a checkpoint on each layer where the factory or
        ``block`` applies the policy per layer, each layer's body compared
        (:func:`remat_kit.sources._depth.layer_kinds`). None when it cannot tell (fewer than
        two checkpoints, or a model that does not trace at batch 1, seq 32).

        Example:
          >>> from_factory("tests/data/factories.py:deep").layer_kinds(rk.target("h100"))
          1
        """
        from remat_kit.sources._depth import layer_kinds

        if "layer_kinds" not in self._cache:
            small = TrainConfig(batch=1, seq=32, optimizer="sgd")
            try:
                built = self.build_step(FULL, NO_SCHEDULE, small, target, sharded=False)
                closed = jax.make_jaxpr(built.step.loss_fn)(*built.step.loss_args)
                self._cache["layer_kinds"] = layer_kinds(closed)
            except Exception:  # the run itself will say what fails; the kinds stay unknown
                self._cache["layer_kinds"] = None
        return self._cache["layer_kinds"]

    def check(self, config: TrainConfig, target: Target) -> None:
        """Nothing to check before the factory runs: its model is its own."""
        del config, target

    def build_step(
        self,
        policy: Policy,
        schedule: Schedule,
        config: TrainConfig,
        target: Target,
        *,
        sharded: bool = True,
    ) -> SourceStep:
        """The train step of the model for ``policy`` and ``schedule`` (the StepSource
        protocol). A factory's model is unsharded and picks its own kernels and dtypes: the
        target and ``sharded`` change nothing.

        Args:
          policy: the policy.
          schedule: a schedule in :attr:`schedule_kinds`.
          config: the train config.
          target: where it will be compiled.
          sharded: ignored (a factory's step runs on one device).

        Returns:
          The SourceStep, labelled with the parameter count and, when known, the layers.

        Raises:
          BadValue: the model's own code fails as the step is traced (its error in one
            line).
        """
        built = self.build(policy, schedule, target)
        plan = self.mesh_plan(target) if sharded else None
        what = f"{self.spec} (b{config.batch} s{config.seq})"
        with model_errors(f"{what}: the model failed as its train step was traced"):
            streams = self._rng_streams(built, config)
            if plan is None:
                step = built.train_step(config, rng_streams=streams)
            else:
                mesh = plan.mesh(target)
                step = built.train_step(config, sharding=plan, mesh=mesh, rng_streams=streams)
        meta: dict[str, Any] = {
            "params": int(sum(math.prod(x.shape) for x in jax.tree.leaves(step.args[:2]))),
            # The regime casts weights and optimizer state; the compute dtype is the module's.
            "precision": {**step.precision, "compute": "module's own"},
        }
        if self.n_layers() is not None:
            meta["layers"] = self.n_layers()
        if streams:
            meta["rng_streams"] = list(streams)
        if self.env_at_import:
            # XLA reads XLA_FLAGS when it compiles: what the import set made these programs.
            meta["env_at_import"] = [
                {"name": e.name, "value": e.value, "by": e.by, "added": list(e.added())}
                for e in self.env_at_import
            ]
        return SourceStep(step, built.policy, built.schedule, "model's own", meta)

    def _rng_streams(self, built: BuiltModel, config: TrainConfig) -> tuple[str, ...]:
        """The RNG streams the model draws from in training (``("dropout",)``), found once.

        A linen model that trains with dropout asks its ``apply`` for a ``dropout`` stream
        (flax raises ``InvalidRngError`` without one): its train step is given every stream
        it asks for, as a training loop gives them, so its masks are in the step. NNX models
        carry their own ``Rngs``.
        """
        if built.kind != "linen":
            return ()
        if "rng_streams" not in self._cache:
            self._cache["rng_streams"] = streams_asked(
                built.module, built.inputs, config.micro_batch, config.seq
            )
        return self._cache["rng_streams"]

    def check_step(self, built: SourceStep, what: str) -> None:
        """The traced program must hold a checkpoint with the policy and differ from the
        one traced for the previous policy: a factory may cache its model, or a framework
        its trace (``nn.jit``), and replay a stale program.

        Raises:
          BadValue: a stale or ignored trace, or a model that fails as it is traced (its
            error in one line).
        """
        step = built.step
        with model_errors(f"{what}: the model failed as its train step was traced"):
            closed = jax.make_jaxpr(step.loss_fn)(*step.loss_args)
        self._cache["trace"] = checks.check_traced_with(
            closed,
            built.policy,
            also=_schedule_policies(built.schedule),
            previous=self._cache.get("trace"),
            what=what,
            block=self.block,
        )

    def mesh_plan(self, target: Target) -> MeshPlan | None:
        """The data-parallel plan (:attr:`shard`) on ``target``'s devices, or None.

        Raises:
          BadValue: a plan with a model axis (``tp``, ``cp``, ``ep``: they split tensors by
            what they mean, which a factory's unnamed parameters do not say).
        """
        if not self.shard:
            return None
        check_data_parallel(self.shard, self.spec)
        return parse_shard(self.shard, target.devices)

    def cache_parts(self) -> Mapping[str, Any] | None:
        """None: a factory's code is the user's, which the cache cannot fingerprint."""
        return None

    def label(self, config: TrainConfig, target: Target) -> str:
        """``spec s<seq> <optimizer>``, with the mesh plan."""
        plan = self.mesh_plan(target)
        return f"{self.spec} s{config.seq} {config.optimizer}" + (f" {plan.spec}" if plan else "")

    def _tagging(self) -> tuple[tuple[tagging.Rule, ...] | None, dict[str, str]]:
        # (rules naming projections or None, aliases of the model's own names).
        if self.tags is None:
            return None, {}
        if self.tags == "auto":
            # A model that tags its own tensors keeps its names, with ours beside those an
            # alias set knows; others get our names for their projections.
            if "own_tags" not in self._cache:
                self._cache["own_tags"] = self._own_tags()
            own = self._cache["own_tags"]
            return (None, tagging.aliases_for(own)) if own else (tagging.rules("auto"), {})
        if isinstance(self.tags, str):
            aliases = tagging.aliases(self.tags)
            if all(name in tagging.ALIAS_SETS for name in self.tags.split("+")):
                return None, aliases  # only a library's own names: nothing else to tag
            return tagging.rules(self.tags), aliases
        return tagging.rules(self.tags), {}

    def _own_tags(self) -> tuple[str, ...]:
        built = self._build(NO_REMAT, NO_SCHEDULE, None, {})
        m, kw = built.module, built.inputs or (lambda t: {})
        tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
        with model_errors(f"{self.spec}: the model failed as it was traced for its own tags"):
            if built.kind == "nnx":  # NNX's init allocates nothing: trace the forward pass
                closed = jax.make_jaxpr(lambda t: m.apply(m.init(None, t), t, **kw(t)))(tokens)
            else:
                init = lambda k, t: m.init(k, t, **kw(t))
                closed = jax.make_jaxpr(init)(jax.random.key(0), tokens)
        return tuple(sorted(tags_in(closed)))

    def _build(
        self,
        pol: Policy,
        sch: Schedule,
        rules: tuple[tagging.Rule, ...] | None,
        aliases: Mapping[str, str],
        target: Target | None = None,
    ) -> BuiltModel:
        kwargs = {"schedule": sch} if self.takes_schedule else {}
        kwargs |= target_kwargs(self, target)
        factory_policy = pol
        block_policies: Policy | list[Policy] | None = None
        if self.block:
            # The patch applies the policy; the factory builds the plain model.
            factory_policy = NO_REMAT
            block_policies = self._per_layer(pol, sch) if sch.name == "layers" else pol
        # Patched while the factory runs too: an NNX model builds its blocks there, before
        # any trace (a linen model builds them as it is traced, under ``contexts`` below).
        patch = None if block_policies is None else (self.block, block_policies)
        made = call_factory(self, factory_policy, kwargs, patch)
        kind = "nnx" if isinstance(made, nnx.Module) else "linen"
        if patch is not None and isinstance(made, nn.Module):
            made = retyped(made)
        if kind == "nnx":
            if rules is not None:
                tagging.tag_nnx(made, rules)
            module: Any = NNXModel(made)
            call = type(made).__call__
        else:
            module = made
            call = type(made).__call__
        block_spec = self.block

        @contextlib.contextmanager
        def contexts() -> Iterator[None]:
            with contextlib.ExitStack() as stack:
                if block_spec and block_policies is not None:
                    stack.enter_context(patched_block(block_spec, block_policies))
                if rules is not None and kind == "linen":
                    stack.enter_context(tagging.tagging(rules))
                stack.enter_context(tagging.aliasing(aliases))
                yield

        inputs = self.inputs
        if inputs == "auto":
            inputs = auto_inputs(call, self.spec)
        return BuiltModel(
            module=Applied(module, contexts, self.spec, self.output),
            policy=pol,
            schedule=sch,
            inputs=inputs,  # type: ignore[arg-type]
            output=self.output,
            kind=kind,
        )

    def n_layers(self) -> int | None:
        """Layers of the model when known: blocks built (``block``), or the module's
        ``n_layers`` / ``num_layers`` / ``layers`` / ``config.num_hidden_layers`` /
        ``cfg.n_layers`` (an int)."""
        if "n_layers" not in self._cache:
            self._cache["n_layers"] = count_layers(self)
        return self._cache["n_layers"]

    def _per_layer(self, pol: Policy, sch: Schedule) -> list[Policy]:
        n = self.n_layers()
        if not n:
            raise BadValue(
                f"{self.spec}: cannot count the layers built from {self.block}, so a per-layer "
                "plan cannot be applied"
            )
        out: list[Policy] = []
        for run in sch.runs(n, pol):
            if len(run.lengths) != 1:
                raise BadValue(
                    f"{self.spec}: segments ({sch.spec}) need a factory that takes schedule=; "
                    "a patched block takes one policy per layer",
                    param="schedule",
                )
            out += [run.policy] * run.layers
        return out


def _schedule_policies(sch: Schedule) -> list[Any]:
    # Policies a schedule may put on layers instead of the model's: its plan's and segments'.
    out: list[Any] = [p for _, _, p in sch.plan]
    out += [p for p in (sch.rest, sch.inner) if p]
    if sch.name in ("every", "sqrt", "nested"):
        out.append("full")
    return out


def from_factory(
    factory: str | Callable[..., Any],
    *,
    block: str | None = None,
    tags: str | tuple[Any, ...] | None = "auto",
    inputs: Callable[[jax.Array], Mapping[str, Any]] | str | None = "auto",
    output: Callable[[Any], jax.Array] | None = None,
    shard: str | None = None,
) -> ModelSource:
    """A model source from a factory ``NAME(policy)`` (see the module docstring).

    Args:
      factory: ``path/to/file.py:NAME``, ``package.module:NAME`` or the callable itself.
      block: ``module:Class`` of the model's block to rematerialize by patching, for models
        with no remat hook; the factory then gets ``policy`` ``none``.
      tags: tag rules and alias sets (:func:`remat_kit.tagging.rules`,
        :func:`remat_kit.tagging.aliases`), ``"auto"``, or None for the model's own tags.
      inputs: keyword inputs made from the tokens; ``"auto"``: Hugging Face's
        ``attention_mask``/``position_ids`` when the module takes them.
      output: the logits from the module's output (default: array, ``.logits``, tuple[0]).
      shard: a data-parallel mesh plan, ``fsdp:8`` (see :attr:`ModelSource.shard`).

    Returns:
      The ModelSource.

    Raises:
      BadValue: a spec that cannot be loaded (see :func:`load_factory`), a factory that does
        not take a policy argument, or a ``block`` that cannot be imported.

    Example:
      >>> src = from_factory(lambda policy: nn.Dense(8))
      >>> src.spec, src.schedule_kinds
      ('<lambda>', frozenset({'none'}))
      >>> sorted(from_factory("tests/data/factories.py:preset").schedule_kinds)  # schedule=
      ['every', 'layers', 'nested', 'none', 'sqrt']
    """
    env: tuple[EnvSet, ...] = ()
    if isinstance(factory, str):
        (fn, env), spec = load_factory_env(factory), factory
    elif callable(factory):
        fn, spec = factory, getattr(factory, "__name__", type(factory).__name__)
    else:
        raise BadValue(f"factory={factory!r}: give LOCATION:NAME or a callable")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None  # a builtin or C callable: no signature to read, try it as it is
    if sig is not None:
        try:
            # ``target`` is handed when named (``takes_target``); anything else needs a default.
            sig.bind(NO_REMAT, **({"target": None} if "target" in sig.parameters else {}))
        except TypeError:
            raise BadValue(
                f"{spec}: a factory is called as NAME(policy); its signature is {sig}"
            ) from None
    if block is not None:
        _import_class(block)
    if isinstance(tags, str):
        tagging.rules(tags)  # an unknown rule or alias set is named before any trace
    if shard is not None:
        check_data_parallel(shard, spec)  # before anything is built
    return ModelSource(
        spec=spec,
        factory=fn,
        takes_schedule=_takes(fn, "schedule"),
        takes_target=_names(fn, "target"),
        block=block,
        tags=tags,
        inputs=inputs,
        output=output,
        env_at_import=env,
        shard=shard,
    )
