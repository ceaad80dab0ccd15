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
The CLI's ``--model file.py:NAME`` and ``models.measure`` go through here; remat_kit never
imports ``models``.

Example:
  >>> import remat_kit as rk                                              # doctest: +SKIP
  >>> src = rk.sources.from_factory("examples/hf_llama.py:llama")
  >>> built = src.build("minimal")
  >>> step = built.train_step(rk.TrainConfig(batch=4, seq=2048))
  >>> rk.memory_report(step.fn, *step.args, target="h100").peak_bytes
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import itertools
import math
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from remat_kit import checks, tagging
from remat_kit.analysis import MemoryReport, RematWarning, memory_report
from remat_kit.breakdown import add_breakdown
from remat_kit.errors import BadValue
from remat_kit.flops import count_flops
from remat_kit.policies import Policy, as_policy
from remat_kit.residuals import ResidualReport, saved_residuals, tags_in
from remat_kit.schedules import Schedule, parse_schedule
from remat_kit.search.workload import Workload
from remat_kit.targets import Target, as_target
from remat_kit.train import TrainConfig, TrainStep, build_train_step
from remat_kit.wrap import remat

__all__ = [
    "BuiltModel",
    "ModelSource",
    "from_factory",
    "hf_inputs",
    "load_factory",
    "measure",
    "patched_block",
    "residuals",
    "step_flops",
    "workload",
]

#: Schedules a factory that takes ``schedule=`` is offered.
ALL_SCHEDULES = frozenset({"none", "every", "sqrt", "nested", "layers"})

# Keyword inputs a Hugging Face Flax model needs beside the tokens (its rotary embedding
# indexes by position_ids; None is not accepted).
_HF_INPUTS = ("attention_mask", "position_ids")


def hf_inputs(tokens: jax.Array) -> dict[str, jax.Array]:
    """Hugging Face's keyword inputs for a batch of unpadded sequences.

    Args:
      tokens: int32 ``[batch, seq]``.

    Returns:
      ``attention_mask`` (all ones) and ``position_ids`` (``0 .. seq-1`` per row).

    Example:
      >>> hf_inputs(jnp.zeros((2, 3), jnp.int32))["position_ids"].tolist()
      [[0, 1, 2], [0, 1, 2]]
    """
    b, s = tokens.shape
    return {
        "attention_mask": jnp.ones((b, s), jnp.int32),
        "position_ids": jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s)),
    }


def load_factory(spec: str) -> Callable[..., Any]:
    """The callable ``spec`` names: ``path/to/file.py:NAME`` or ``package.module:NAME``.

    A file is executed as a fresh module each time (its directory on ``sys.path`` meanwhile,
    so it may import its neighbours); a package module is imported as usual.

    Args:
      spec: ``LOCATION:NAME``.

    Returns:
      The callable.

    Raises:
      BadValue: no ``:NAME``, a missing file, a module that fails to import (its error in
        one line), a missing name (the module's callables listed) or one that is not callable.

    Example:
      >>> load_factory("remat_kit.sources:hf_inputs").__name__
      'hf_inputs'
    """
    location, colon, name = spec.rpartition(":")
    if not colon or not location or not name.isidentifier():
        raise BadValue(
            f"--model {spec!r}: a factory is LOCATION:NAME, e.g. path/to/model.py:build or "
            "package.module:build (or give a preset name: remat-kit models)"
        )
    if location.endswith(".py"):
        module = _load_file(spec, Path(location))
    else:
        try:
            module = importlib.import_module(location)
        except Exception as err:
            raise BadValue(
                f"--model {spec!r}: cannot import {location!r}: {type(err).__name__}: {err}"
            ) from None
    if not hasattr(module, name):
        offered = sorted(
            n
            for n, v in vars(module).items()
            if callable(v)
            and not n.startswith("_")
            and getattr(v, "__module__", None) in (module.__name__, None)
        )
        raise BadValue(
            f"--model {spec!r}: {location} has no {name!r}; callables there: "
            f"{', '.join(offered) or 'none'}"
        )
    factory = getattr(module, name)
    if not callable(factory):
        raise BadValue(f"--model {spec!r}: {name} is a {type(factory).__name__}, not a callable")
    return factory


def _load_file(spec: str, path: Path) -> Any:
    if not path.is_file():
        raise BadValue(f"--model {spec!r}: no such file {str(path)!r}")
    module_name = f"_remat_kit_factory_{abs(hash(str(path.resolve())))}"
    loader = importlib.util.spec_from_file_location(module_name, path)
    if loader is None or loader.loader is None:
        raise BadValue(f"--model {spec!r}: cannot load {str(path)!r} as Python")
    module = importlib.util.module_from_spec(loader)
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    try:
        loader.loader.exec_module(module)
    except Exception as err:
        raise BadValue(
            f"--model {spec!r}: {path.name} failed to run: {type(err).__name__}: {err}"
        ) from None
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)
    return module


def _takes(fn: Callable[..., Any], keyword: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return keyword in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _import_class(spec: str) -> tuple[Any, str, type]:
    location, colon, name = spec.rpartition(":")
    if not colon or not location or not name:
        raise BadValue(
            f"--block {spec!r}: name the block class as module:Class, e.g. "
            "transformers.models.llama.modeling_flax_llama:FlaxLlamaDecoderLayer"
        )
    try:
        module = importlib.import_module(location)
    except Exception as err:
        raise BadValue(f"--block {spec!r}: cannot import {location!r}: {err}") from None
    cls = getattr(module, name, None)
    if not inspect.isclass(cls):
        raise BadValue(f"--block {spec!r}: {location} has no class {name!r}")
    return module, name, cls


@contextlib.contextmanager
def patched_block(
    spec: str, policies: Policy | Sequence[Policy], *, counter: list[int] | None = None
) -> Iterator[None]:
    """Within the context, the block class ``module:Class`` is rematerialized.

    For models with no remat hook: the module's global ``Class`` is replaced by
    ``rk.remat(Class, policy)`` while the model is traced, then restored. With one policy per
    layer (a ``layers`` plan on an unrolled stack), the n-th block built in the context gets
    the n-th policy.

    Args:
      spec: ``module:Class``, the module the model looks the class up in.
      policies: one policy, or one per layer in construction order.
      counter: a one-item list incremented per block built (to count layers).

    Yields:
      Nothing.

    Raises:
      BadValue: an unimportable module or a missing class.

    Example:
      >>> with patched_block("my_model:Block", rk.policy("full")):        # doctest: +SKIP
      ...     params = model.init(key, tokens)
    """
    module, name, cls = _import_class(spec)
    per_layer = not isinstance(policies, Policy)
    wrapped: dict[str, type] = {}

    def for_policy(p: Policy) -> type:
        if p.spec not in wrapped:
            wrapped[p.spec] = remat(cls, p)
        return wrapped[p.spec]

    if per_layer:
        plan = list(policies)  # type: ignore[arg-type]
        built = itertools.count()

        def replacement(*args: Any, **kwargs: Any) -> Any:
            i = next(built)
            if counter is not None:
                counter[0] += 1
            return for_policy(plan[min(i, len(plan) - 1)])(*args, **kwargs)

    else:
        base = for_policy(policies)  # type: ignore[arg-type]
        if counter is None:
            replacement = base
        else:

            def replacement(*args: Any, **kwargs: Any) -> Any:
                counter[0] += 1
                return base(*args, **kwargs)

    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, cls)


class _NNXModel:
    """An NNX model behind linen's ``init``/``apply``: parameters in, logits out.

    Built from an abstract model (``nnx.eval_shape``), so no weight is allocated. Parameters
    (``nnx.Param``) are the trained state; the rest (RNG keys and counts, batch statistics)
    is a constant of the step.
    """

    def __init__(self, model: Any) -> None:
        self.graphdef, self.params, self.rest = nnx.split(model, nnx.Param, ...)

    def init(self, key: Any, *args: Any, **kwargs: Any) -> Any:
        shapes = self.params.to_pure_dict()
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def apply(self, variables: Any, *args: Any, rngs: Any = None, **kwargs: Any) -> Any:
        if rngs:
            raise BadValue(
                "an NNX model draws its random numbers from its own nnx.Rngs: build it with "
                "the streams it needs; rng_streams are for linen models"
            )
        params = jax.tree.map(lambda x: x, self.params)  # a copy to fill
        nnx.replace_by_pure_dict(params, variables)
        rest = jax.tree.map(_concrete, self.rest)
        return nnx.merge(self.graphdef, params, rest)(*args, **kwargs)


def _concrete(x: Any) -> Any:
    if not isinstance(x, jax.ShapeDtypeStruct):
        return x
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        key = jax.random.key(0)
        return jax.random.split(key, x.shape) if x.shape else key
    return jnp.zeros(x.shape, x.dtype)


class _Applied:
    """A module's ``init``/``apply`` run inside contexts (tagging, a patched block class)."""

    def __init__(self, module: Any, contexts: Callable[[], contextlib.AbstractContextManager]):
        self.module, self._contexts = module, contexts

    def init(self, *args: Any, **kwargs: Any) -> Any:
        with self._contexts():
            return self.module.init(*args, **kwargs)

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        with self._contexts():
            return self.module.apply(*args, **kwargs)

    def __repr__(self) -> str:
        inner = getattr(self.module, "module", self.module)
        return f"{type(inner).__name__} (model source)"


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
class ModelSource:
    """A model from a factory ``NAME(policy)`` (see the module docstring).

    Attributes:
      spec: where it came from (``file.py:NAME``), its name in reports.
      factory: the callable.
      takes_schedule: the factory accepts ``schedule=``.
      block: ``module:Class`` of a block to rematerialize by patching (models with no remat
        hook), or None.
      tags: tag rules for :mod:`remat_kit.tagging` (a rule set, ``"paths"``), None to leave
        the model's own tags alone, or ``"auto"``: every rule set, unless the model tags
        tensors itself (found by tracing its ``init`` once).
      inputs: keyword inputs from the tokens; ``"auto"`` gives Hugging Face's when the
        module's ``__call__`` takes ``attention_mask`` and ``position_ids``.
      output: the logits from the module's output (None: array, ``.logits`` or tuple[0]).
    """

    spec: str
    factory: Callable[..., Any] = dataclasses.field(compare=False)
    takes_schedule: bool = False
    block: str | None = None
    tags: str | tuple[Any, ...] | None = "auto"
    inputs: Callable[[jax.Array], Mapping[str, Any]] | str | None = "auto"
    output: Callable[[Any], jax.Array] | None = None
    _cache: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

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
                "with --block only per-layer plans (layers:...) are applied"
                if self.block
                else "its factory takes no schedule= argument"
            )
            raise BadValue(
                f"{self.spec} cannot build schedule {sch.spec!r}: {how}; "
                f"schedules it takes: {', '.join(sorted(self.schedule_kinds))}"
            )
        return sch

    def build(self, policy: Any = "none", schedule: Any = "none") -> BuiltModel:
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
        return self._build(pol, sch, self._rules())

    def _rules(self) -> tuple[tagging.Rule, ...] | None:
        if self.tags is None:
            return None
        if self.tags != "auto":
            return tagging.rules(self.tags)
        # "auto": a model that tags its own tensors keeps its names; others get ours.
        if "own_tags" not in self._cache:
            self._cache["own_tags"] = self._own_tags()
        return None if self._cache["own_tags"] else tagging.rules("auto")

    def _own_tags(self) -> tuple[str, ...]:
        built = self._build(as_policy("none"), parse_schedule("none"), None)
        m, kw = built.module, built.inputs or (lambda t: {})
        tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
        if built.kind == "nnx":  # NNX's init allocates nothing: trace the forward pass
            closed = jax.make_jaxpr(lambda t: m.apply(m.init(None, t), t, **kw(t)))(tokens)
        else:
            closed = jax.make_jaxpr(lambda k, t: m.init(k, t, **kw(t)))(jax.random.key(0), tokens)
        return tuple(sorted(tags_in(closed)))

    def _build(
        self, pol: Policy, sch: Schedule, rules: tuple[tagging.Rule, ...] | None
    ) -> BuiltModel:
        kwargs = {"schedule": sch} if self.takes_schedule else {}
        factory_policy = pol
        block_policies: Policy | list[Policy] | None = None
        if self.block:
            # The patch applies the policy; the factory builds the plain model.
            factory_policy = as_policy("none")
            block_policies = self._per_layer(pol, sch) if sch.name == "layers" else pol
        made = self._call_factory(factory_policy, kwargs)
        kind = "nnx" if isinstance(made, nnx.Module) else "linen"
        if kind == "nnx":
            if rules is not None:
                tagging.tag_nnx(made, rules)
            module: Any = _NNXModel(made)
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
                yield

        inputs = self.inputs
        if inputs == "auto":
            inputs = hf_inputs if all(_takes(call, k) for k in _HF_INPUTS) else None
        return BuiltModel(
            module=_Applied(module, contexts),
            policy=pol,
            schedule=sch,
            inputs=inputs,  # type: ignore[arg-type]
            output=self.output,
            kind=kind,
        )

    def _call_factory(self, policy: Policy, kwargs: Mapping[str, Any]) -> Any:
        box: dict[str, Any] = {}

        def make() -> Any:
            out = self.factory(policy, **kwargs)
            if isinstance(out, nnx.Module):
                return out
            box["module"] = out
            return None

        try:
            abstract = nnx.eval_shape(make)
        except BadValue:
            raise
        except Exception as err:
            raise BadValue(
                f"{self.spec}({policy.spec!r}) failed: {type(err).__name__}: {err}"
            ) from None
        made = abstract if abstract is not None else box.get("module")
        if not (isinstance(made, nnx.Module) or (hasattr(made, "init") and hasattr(made, "apply"))):
            raise BadValue(
                f"{self.spec} returned {type(made).__name__}; a factory returns a Flax module "
                "(linen or NNX) mapping tokens [batch, seq] to logits"
            )
        return made

    def n_layers(self) -> int | None:
        """Layers of the model when known: blocks built (``block``), or the module's
        ``n_layers`` / ``num_layers`` / ``config.num_hidden_layers`` / ``cfg.n_layers``."""
        if "n_layers" in self._cache:
            return self._cache["n_layers"]
        n: int | None = None
        if self.block:
            n = self._count_blocks()
        else:
            made = self._call_factory(as_policy("none"), {})
            n = _layer_attr(made)
        self._cache["n_layers"] = n
        return n

    def _count_blocks(self) -> int | None:
        made = self._call_factory(as_policy("none"), {})
        if isinstance(made, nnx.Module):
            return None
        counter = [0]
        tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
        extra = hf_inputs if self.inputs == "auto" else self.inputs
        call = type(made).__call__
        if self.inputs == "auto" and not all(_takes(call, k) for k in _HF_INPUTS):
            extra = None
        with patched_block(self.block or "", as_policy("none"), counter=counter):
            jax.eval_shape(
                lambda k, t: made.init(k, t, **(extra(t) if callable(extra) else {})),
                jax.random.key(0),
                tokens,
            )
        return counter[0] or None

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
                    "--block applies one policy per layer"
                )
            out += [run.policy] * run.layers
        return out


def _layer_attr(made: Any) -> int | None:
    for path in ("n_layers", "num_layers", "config.num_hidden_layers", "config.n_layer"):
        obj = made
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, int) and obj > 0:
            return obj
    cfg = getattr(made, "cfg", None)
    n = getattr(cfg, "n_layers", None)
    return n if isinstance(n, int) and n > 0 else None


def from_factory(
    factory: str | Callable[..., Any],
    *,
    block: str | None = None,
    tags: str | tuple[Any, ...] | None = "auto",
    inputs: Callable[[jax.Array], Mapping[str, Any]] | str | None = "auto",
    output: Callable[[Any], jax.Array] | None = None,
) -> ModelSource:
    """A model source from a factory ``NAME(policy)`` (see the module docstring).

    Args:
      factory: ``path/to/file.py:NAME``, ``package.module:NAME`` or the callable itself.
      block: ``module:Class`` of the model's block to rematerialize by patching, for models
        with no remat hook; the factory then gets ``policy`` ``none``.
      tags: tag rules (:func:`remat_kit.tagging.rules`), or None for the model's own tags.
      inputs: keyword inputs made from the tokens; ``"auto"``: Hugging Face's
        ``attention_mask``/``position_ids`` when the module takes them.
      output: the logits from the module's output (default: array, ``.logits``, tuple[0]).

    Returns:
      The ModelSource.

    Raises:
      BadValue: a spec that cannot be loaded (see :func:`load_factory`), a factory that does
        not take a policy argument, or a ``block`` that cannot be imported.

    Example:
      >>> src = from_factory(lambda policy: nn.Dense(8))                  # doctest: +SKIP
      >>> src.schedule_kinds
      frozenset({'none'})
    """
    if isinstance(factory, str):
        fn, spec = load_factory(factory), factory
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
            sig.bind(as_policy("none"))
        except TypeError:
            raise BadValue(
                f"{spec}: a factory is called as NAME(policy); its signature is {sig}"
            ) from None
    if block is not None:
        _import_class(block)
    return ModelSource(
        spec=spec,
        factory=fn,
        takes_schedule=_takes(fn, "schedule"),
        block=block,
        tags=tags,
        inputs=inputs,
        output=output,
    )


def _schedule_policies(sch: Schedule) -> list[Any]:
    # Policies a schedule may put on layers instead of the model's: its plan's and segments'.
    out: list[Any] = [p for _, _, p in sch.plan]
    out += [p for p in (sch.rest, sch.inner) if p]
    if sch.name in ("every", "sqrt", "nested"):
        out.append("full")
    return out


def measure(
    source: ModelSource,
    policy: Any,
    target: Target | str,
    config: TrainConfig,
    *,
    schedule: Any = "none",
    baseline: float | None = None,
    strict: bool = False,
    warn: bool = True,
    meta: Mapping[str, Any] | None = None,
) -> MemoryReport:
    """Compiles the train step of ``source`` under ``policy`` for ``target`` and reports it.

    Before compiling, the forward pass of one micro-batch is traced and checked: the program
    must hold a checkpoint with ``policy`` and differ from the one traced for the previous
    policy (else BadValue: a stale or ignored trace), and a name-based policy must match a
    tag there (else a RematWarning, or BadValue with ``strict``). Offload that XLA did not
    carry out is a warning with both figures.

    Args:
      source: the model source.
      policy: a policy name, spec or Policy.
      target: a Target or target name.
      config: batch, sequence, optimizer, precision ...
      schedule: a layer schedule the source can build.
      baseline: FLOPs of the step without remat: the report's meta then holds
        ``recompute_overhead``.
      strict: a policy matching no tag is an error, not a warning (the CLI).
      warn: issue the report's warnings as RematWarning.
      meta: extra labels for the report.

    Returns:
      The MemoryReport, with the weights/gradients/optimizer/activations breakdown.

    Raises:
      BadValue: a stale trace, an unbuildable schedule, or (``strict``) an unmatched policy.

    Example:
      >>> src = from_factory("tests/data/factories.py:tiny_llama")        # doctest: +SKIP
      >>> measure(src, "minimal", "h100", rk.TrainConfig(batch=2, seq=64)).peak_bytes
    """
    t = as_target(target)
    built = source.build(policy, schedule)
    step = built.train_step(config)
    pol = built.policy
    closed = jax.make_jaxpr(step.loss_fn)(*step.loss_args)
    source._cache["trace"] = checks.check_traced_with(
        closed,
        pol,
        also=_schedule_policies(built.schedule),
        previous=source._cache.get("trace"),
        what=f"{source.spec} (b{config.batch} s{config.seq})",
    )
    tags = sorted(tags_in(closed))
    if strict:
        checks.check_policy_matches(pol, tags, strict=True, where=source.spec)
    labels = {
        "model": source.spec,
        "batch": config.batch,
        "seq": config.seq,
        "optimizer": config.optimizer,
        "accum": config.accum,
        "params": int(nbytes_count(step.args[:2])),
        "tokens_per_step": config.batch * config.seq,
        # The regime casts weights and optimizer state; the compute dtype is the module's.
        "precision": {**step.precision, "compute": "module's own"},
        **(meta or {}),
    }
    if source.n_layers() is not None:
        labels["layers"] = source.n_layers()
    report = memory_report(
        step.fn,
        *step.args,
        target=t,
        donate_argnums=step.donate_argnums,
        policy=pol,
        attention="model's own",
        schedule=built.schedule.spec,
        meta=labels,
        warn=warn,
    )
    report = add_breakdown(report, step)
    if baseline:
        report = report.replace(
            meta={**report.meta, "recompute_overhead": report.flops / baseline - 1.0}
        )
    if pol.offloads:
        marked = saved_residuals(step.loss_fn, *step.loss_args, policy=pol).bytes_by("offloaded")
        note = checks.offload_shortfall(report, marked)
        if note is not None:
            if warn:
                warnings.warn(note, RematWarning, stacklevel=2)
            report = report.replace(warnings=(*report.warnings, note))
    return report


def nbytes_count(tree: Any) -> int:
    """Number of elements in a pytree of arrays or ShapeDtypeStructs (a parameter count)."""
    return int(sum(math.prod(x.shape) for x in jax.tree.leaves(tree)))


def step_flops(
    source: ModelSource, policy: Any, config: TrainConfig, schedule: Any = "none"
) -> float:
    """FLOPs of the train step of ``source`` under ``policy`` (traced, not compiled)."""
    step = source.build(policy, schedule).train_step(config)
    return float(count_flops(step.fn, *step.args).total)


def residuals(
    source: ModelSource, policy: Any, config: TrainConfig, schedule: Any = "none"
) -> ResidualReport:
    """What ``policy`` keeps for the backward pass of one micro-batch, by tag (traced).

    A name-based policy that matches no tag there is a RematWarning.
    """
    built = source.build(policy, schedule)
    step = built.train_step(config)
    report = saved_residuals(step.loss_fn, *step.loss_args, policy=built.policy)
    checks.check_policy_matches(built.policy, report.tags, where=source.spec)
    return report


def workload(
    source: ModelSource | str | Callable[..., Any],
    target: Target | str,
    config: TrainConfig,
    *,
    strict: bool = False,
    label: str | None = None,
) -> Workload:
    """The train step of a factory as an ``rk.Workload`` for ``rk.plan``, ``rk.max_batch``,
    ``rk.front`` and ``rk.advise``: one call from a factory to the search.

    ``config.batch`` is only a default: the search sets the batch. Schedules the source cannot
    build are left out of the search; per-layer splits need a known layer count.

    Args:
      source: a ModelSource, or what :func:`from_factory` takes.
      target: where to compile.
      config: sequence, optimizer, precision, accumulation (``batch`` is overridden).
      strict: a policy matching no tag is an error (the CLI), not a warning.
      label: a name for tables (default: the source's spec, seq and optimizer).

    Returns:
      The Workload.

    Example:
      >>> w = workload("my_model.py:build", "h100", rk.TrainConfig(batch=4, seq=2048))
      ...                                                                 # doctest: +SKIP
      >>> rk.plan(w, batch=4).policy.spec
    """
    src = source if isinstance(source, ModelSource) else from_factory(source)
    t = as_target(target)

    def at(batch: int) -> TrainConfig:
        return dataclasses.replace(config, batch=batch)

    n_layers = src.n_layers() if "layers" in src.schedule_kinds else None
    return Workload(
        lambda p, s, b: measure(src, p, t, at(b), schedule=s, strict=strict, warn=False),
        lambda p, s, b: step_flops(src, p, at(b), s),
        target=t,
        seq=config.seq,
        n_layers=n_layers or 1,
        batch_multiple=config.accum,
        residuals_fn=lambda p, s, b: residuals(src, p, at(max(config.accum, b)), s),
        breakdown_fn=lambda b: dict(src.build("none").train_step(at(b)).breakdown),
        label=label or f"{src.spec} s{config.seq} {config.optimizer}",
        schedule_kinds=src.schedule_kinds,
    )
