"""A user's own train step as a model source: ``--step file.py:NAME``, ``rk.sources.from_step``.

Where a factory (:mod:`remat_kit.sources._source`) hands remat_kit a model and remat_kit builds
the train step around it, a *step function* hands over the train step itself, so the figures
are those of the program the user runs: their loss, their optimizer, their argument
structure and donation.

A step function is called as ``NAME(policy, config)``: ``policy`` is an ``rk.Policy`` (callable
as a jax checkpoint policy: pass it to ``jax.checkpoint(policy=...)``, ``nn.remat(policy=...)``,
or ``rk.remat(Block, policy)``; ``policy.name == "none"`` means no remat) and ``config`` is the
``rk.TrainConfig`` whose ``batch`` and ``seq`` the arguments must have (a batch search varies
``config.batch``). It returns the step and its abstract arguments (``jax.ShapeDtypeStruct``
pytrees, or arrays):

- ``(fn, args)`` or ``(fn, args, donate_argnums)``, or
- :class:`OwnStep` ``(fn, args, donate_argnums=(), loss_fn=None, loss_args=None, roles=None)``.

``fn`` may be ``jax.jit``-wrapped: the function inside is compiled with the jit's donation
(read from its trace). ``roles`` says which argument holds what (``params``, ``frozen``,
``optimizer``, ``batch``): the report's breakdown (weights, gradients = the ``params``
argument's shapes and dtypes, as ``jax.grad`` returns them, optimizer state, batch) is filled
from it; where it is not given the breakdown says ``unknown``. ``loss_fn``/``loss_args``
(one micro-batch's loss of the parameters) give the residual tables (what the policy keeps
for the backward pass); without them the tags and checkpoints are read from the step's own
trace and there is no residual table.

Example:
  >>> import remat_kit as rk
  >>> src = rk.sources.from_step("tests/data/own_steps.py:linen_step")
  >>> r = rk.sources.measure(src, "full", "h100", rk.TrainConfig(batch=2, seq=32), warn=False)
  >>> r.meta["optimizer"], r.meta["roles"]["params"]
  ('own step', 'argument 0')
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from remat_kit import checks
from remat_kit.analysis import nbytes
from remat_kit.errors import BadValue
from remat_kit.policies import NO_REMAT, Policy, as_policy
from remat_kit.schedules import Schedule
from remat_kit.sharding import MeshPlan
from remat_kit.sources._loading import load_factory
from remat_kit.sources._protocol import SourceStep, StepSource
from remat_kit.targets import Target
from remat_kit.train import TrainConfig, TrainStep

__all__ = [
    "ROLES",
    "OwnStep",
    "OwnStepSource",
    "from_step",
]

#: What an argument of a step may hold (``OwnStep.roles``), and the breakdown part it fills.
ROLES: Mapping[str, str] = {
    "params": "the trained weights (their gradients have the same shapes and dtypes)",
    "frozen": "weights that are not trained (no gradient)",
    "optimizer": "the optimizer state",
    "batch": "the tokens, targets and any other per-step input",
}

#: The peak inspector's category of each role's argument (``rk.peak``).
_CATEGORIES = {
    "params": "parameter",
    "frozen": "parameter",
    "optimizer": "optimizer state",
    "batch": "input",
}

_RETURNS = (
    "(fn, args), (fn, args, donate_argnums) or rk.sources.OwnStep(fn, args, ...), args being "
    "the step's abstract arguments for config.batch and config.seq"
)


@dataclasses.dataclass(frozen=True)
class OwnStep:
    """A user's train step, as a step function returns it.

    Attributes:
      fn: the train step, ``fn(*args)`` (a plain function or ``jax.jit`` of one).
      args: its abstract arguments (``jax.ShapeDtypeStruct`` pytrees, or arrays).
      donate_argnums: arguments whose buffers the step's outputs may reuse.
      loss_fn: one micro-batch's loss, ``loss_fn(*loss_args)``, differentiated by the step:
        the residual tables read what its backward pass keeps. None: no residual table.
      loss_args: the abstract arguments of ``loss_fn``.
      roles: role -> argument index (or indices) of ``fn``; roles are the keys of
        :data:`ROLES`. None: unknown (the breakdown says so).
      in_shardings: per argument, a pytree of ``NamedSharding`` (one per leaf) on the
        target's devices: the step is compiled sharded, as ``jax.jit(fn, in_shardings=...)``
        compiles it, and reported per device (the breakdown too). None: one device.
      out_shardings: the ``jax.jit`` ``out_shardings`` of a sharded step (a prefix of its
        outputs, ``None`` where left to XLA), or None.

    Example:
      >>> s = OwnStep(lambda p, b: p, (jax.ShapeDtypeStruct((2,), "float32"),) * 2,
      ...             donate_argnums=(0,), roles={"params": 0, "batch": 1})
      >>> s.roles["params"]
      0
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    donate_argnums: tuple[int, ...] = ()
    loss_fn: Callable[..., Any] | None = None
    loss_args: tuple[Any, ...] | None = None
    roles: Mapping[str, int | tuple[int, ...]] | None = None
    in_shardings: tuple[Any, ...] | None = None
    out_shardings: Any = None


@dataclasses.dataclass(frozen=True)
class OwnStepSource(StepSource):
    """A user's step function ``NAME(policy, config)`` as an ``rk.sources.StepSource``.

    Attributes:
      spec: where it came from (``file.py:NAME``), its name in reports.
      step_fn: the step function.
    """

    spec: str
    step_fn: Callable[..., Any] = dataclasses.field(compare=False)
    _cache: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    #: The user's step: its own model, tag names and dtypes.
    own_model = True

    @property
    def schedule_kinds(self) -> frozenset[str]:
        """``none`` only: the step applies its policy where it wants, along the depth too."""
        return frozenset({"none"})

    def n_layers(self) -> int | None:
        """None: the layers of a user's step are not counted."""
        return None

    def at_depth(self, layers: int) -> None:
        """None: a step function builds one depth (every compile is of the whole step)."""
        del layers

    def check(self, config: TrainConfig, target: Target) -> None:
        """A train config that sets what the step decides itself is refused: the step has
        its own optimizer, accumulation and precision (its kind trains none of them), so a
        config asking for others would be ignored without a word.

        Raises:
          BadValue: ``optimizer``, ``accum`` or ``precision`` other than the defaults.
        """
        del target
        default = TrainConfig(config.batch, config.seq)
        for field in ("optimizer", "accum", "precision"):
            value = getattr(config, field)
            if value != getattr(default, field):
                shown = getattr(value, "name", value)  # a Precision by its regime's name
                raise BadValue(
                    f"{field}={shown!r} with the step {self.spec}: a step of your own has its "
                    f"own {field}; leave it at {getattr(default, field)!r} and set it in the "
                    "step function",
                    param=field,
                )

    def step(self, policy: Policy, config: TrainConfig) -> OwnStep:
        """What the step function returns for ``policy`` and ``config``, checked.

        Raises:
          BadValue: the function fails (its error in one line) or returns something else
            than :data:`_RETURNS` says, bad donation or role indices.
        """
        pol = as_policy(policy)
        try:
            out = self.step_fn(pol, config)
        except BadValue:
            raise
        except Exception as err:
            raise BadValue(
                f"{self.spec}({pol.spec!r}, batch={config.batch}, seq={config.seq}) failed: "
                f"{type(err).__name__}: {err}",
                param="step",
            ) from None
        return _checked(self.spec, out)

    def build_step(
        self,
        policy: Policy,
        schedule: Schedule,
        config: TrainConfig,
        target: Target,
        *,
        sharded: bool = True,
    ) -> SourceStep:
        """The user's step under ``policy`` (the StepSource protocol): on one device, or
        sharded as its ``in_shardings`` / ``out_shardings`` say (:class:`OwnStep`).

        Args:
          policy: the policy handed to the step function.
          schedule: ``none`` (the step places its checkpoints itself).
          config: the train config handed to the step function (batch, seq).
          target: where it will be compiled (unused: the step is the user's).
          sharded: compile a sharded step with its shardings; False: the step to trace
            (its arguments keep their shardings, for the mesh the step's code may name).

        Returns:
          The SourceStep, labelled ``optimizer: own step`` and with its argument roles.
        """
        del target
        pol = as_policy(policy)
        if schedule.name != "none":
            raise BadValue(
                f"{self.spec} cannot build schedule {schedule.spec!r}: a step function places "
                "its checkpoints itself; schedules it takes: none",
                param="schedule",
            )
        own = self.step(pol, config)
        fn, donate = _unjitted(self.spec, own)
        loss_given = own.loss_fn is not None
        roles = _roles(own)
        meta: dict[str, Any] = {
            "optimizer": "own step",
            "roles": {r: _where(i) for r, i in roles.items()} if roles else "not given",
            "loss_given": loss_given,
        }
        if "params" in roles:
            meta["params"] = _count(own.args, roles["params"])
        step = TrainStep(
            fn=fn,
            args=tuple(own.args),
            donate_argnums=donate,
            # Without the loss, the whole step is the traced program: its jaxpr names the
            # tags and checkpoints (its VJP is no backward pass: no residuals are read).
            loss_fn=own.loss_fn if loss_given else fn,
            loss_args=tuple(own.loss_args) if loss_given else tuple(own.args),
            breakdown=_breakdown(own.args, roles),
            precision=_precision(own.args, roles),
            categories={i: _CATEGORIES[r] for r, idx in roles.items() for i in _indices(idx)}
            if roles
            else {},
            loss_given=loss_given,
            in_shardings=tuple(own.in_shardings) if sharded and own.in_shardings else None,
            out_shardings=own.out_shardings if sharded and own.in_shardings else None,
        )
        return SourceStep(step, pol, schedule, "step's own", meta)

    def check_step(self, built: SourceStep, what: str) -> None:
        """The traced step must hold a checkpoint with the policy (none for ``none``) and
        differ from the one traced for the previous policy (a cached trace replayed).

        Raises:
          BadValue: a stale or ignored trace.
        """
        step = built.step
        closed = jax.make_jaxpr(step.loss_fn)(*step.loss_args)
        self._cache["trace"] = checks.check_traced_with(
            closed, built.policy, previous=self._cache.get("trace"), what=what
        )

    def mesh_plan(self, target: Target) -> MeshPlan | None:
        """None: a user's step is measured on one device."""
        del target
        return None

    def cache_parts(self) -> Mapping[str, Any] | None:
        """None: the step's code is the user's, which the cache cannot fingerprint."""
        return None

    def label(self, config: TrainConfig, target: Target) -> str:
        """``spec s<seq> own step``."""
        del target
        return f"{self.spec} s{config.seq} own step"


def from_step(step: str | Callable[..., Any]) -> OwnStepSource:
    """A model source from a user's step function ``NAME(policy, config)`` (see the module
    docstring).

    Args:
      step: ``path/to/file.py:NAME``, ``package.module:NAME`` or the callable itself.

    Returns:
      The source (an ``rk.sources.StepSource``).

    Raises:
      BadValue: a spec that cannot be loaded (see ``rk.sources.load_factory``) or a function
        that cannot be called as ``NAME(policy, config)``.

    Example:
      >>> src = from_step("tests/data/own_steps.py:linen_step")
      >>> src.spec, sorted(src.schedule_kinds)
      ('tests/data/own_steps.py:linen_step', ['none'])
    """
    if isinstance(step, str):
        try:
            fn = load_factory(step)
        except BadValue as err:
            raise BadValue(str(err).replace("factory ", "step ", 1), param="step") from None
        spec = step
    elif callable(step):
        fn, spec = step, getattr(step, "__name__", type(step).__name__)
    else:
        raise BadValue(
            f"step={step!r}: give LOCATION:NAME or a callable NAME(policy, config)", param="step"
        )
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None  # a builtin: no signature to read, try it as it is
    if sig is not None:
        try:
            sig.bind(NO_REMAT, TrainConfig(batch=1, seq=1))
        except TypeError:
            raise BadValue(
                f"{spec}: a step function is called as NAME(policy, config) and returns "
                f"{_RETURNS}; its signature is {sig}",
                param="step",
            ) from None
    return OwnStepSource(spec=spec, step_fn=fn)


def _checked(spec: str, out: Any) -> OwnStep:
    """``out`` as an OwnStep, or a one-line BadValue naming ``spec`` and what it returned."""
    if isinstance(out, OwnStep):
        own = out
    elif isinstance(out, tuple) and len(out) in (2, 3):
        own = OwnStep(out[0], *out[1:])
    else:
        what = f"a tuple of {len(out)}" if isinstance(out, tuple) else type(out).__name__
        raise BadValue(f"{spec} returned {what}; a step function returns {_RETURNS}", param="step")
    if not callable(own.fn):
        raise BadValue(
            f"{spec} returned a {type(own.fn).__name__} as the step; a step function returns "
            f"{_RETURNS}",
            param="step",
        )
    if not isinstance(own.args, tuple | list):
        raise BadValue(
            f"{spec} returned args of type {type(own.args).__name__}; the arguments are a "
            f"tuple, fn(*args): a step function returns {_RETURNS}",
            param="step",
        )
    donate = own.donate_argnums
    donate = (donate,) if isinstance(donate, int) else tuple(donate)
    n = len(own.args)
    bad = [i for i in donate if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n]
    if bad:
        raise BadValue(
            f"{spec} donates argument {bad[0]!r}, but the step has {n} arguments (0 to {n - 1})",
            param="step",
        )
    if (own.loss_fn is None) != (own.loss_args is None):
        raise BadValue(
            f"{spec} returned {'loss_fn' if own.loss_fn is not None else 'loss_args'} without "
            "the other: give both (the loss and its abstract arguments) or neither",
            param="step",
        )
    if own.in_shardings is not None and len(own.in_shardings) != n:
        raise BadValue(
            f"{spec} returned {len(own.in_shardings)} in_shardings for {n} arguments: give one "
            "pytree of shardings per argument",
            param="step",
        )
    own = dataclasses.replace(own, args=_placed(own), donate_argnums=donate)
    _roles(own, spec)
    return own


def _placed(own: OwnStep) -> tuple[Any, ...]:
    """The arguments, each leaf carrying its ``in_shardings`` (traces see the mesh)."""
    if own.in_shardings is None:
        return tuple(own.args)
    return tuple(
        jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), a, sh)
        for a, sh in zip(own.args, own.in_shardings, strict=True)
    )


def _indices(idx: int | tuple[int, ...]) -> tuple[int, ...]:
    return (idx,) if isinstance(idx, int) else tuple(idx)


def _roles(own: OwnStep, spec: str = "the step") -> dict[str, tuple[int, ...]]:
    """The roles as argument indices; raises BadValue on an unknown role or index."""
    if own.roles is None:
        return {}
    n, out, seen = len(own.args), {}, {}
    for role, idx in dict(own.roles).items():
        if role not in ROLES:
            raise BadValue(
                f"{spec} returned an unknown role {role!r}; roles are {', '.join(ROLES)}",
                param="step",
            )
        indices = _indices(idx)
        for i in indices:
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n:
                raise BadValue(
                    f"{spec} returned role {role!r} naming argument {i!r}, but the step has {n} "
                    f"arguments (0 to {n - 1})",
                    param="step",
                )
            if i in seen:
                raise BadValue(
                    f"{spec} returned two roles for argument {i}, {seen[i]!r} and {role!r}",
                    param="step",
                )
            seen[i] = role
        out[role] = indices
    return out


def _unjitted(spec: str, own: OwnStep) -> tuple[Callable[..., Any], tuple[int, ...]]:
    """The function inside a ``jax.jit`` and the arguments the jit donates (read off its
    trace), joined with those the step function gave; a plain function as it is."""
    fn, donate = own.fn, own.donate_argnums
    inner = getattr(fn, "__wrapped__", None)
    if inner is None or not hasattr(fn, "trace"):
        return fn, donate
    positional, _ = fn.trace(*own.args).args_info  # (args, kwargs), an ArgInfo per leaf
    by_jit = tuple(
        i
        for i, arg in enumerate(positional)
        if (leaves := jax.tree.leaves(arg, is_leaf=_is_arg_info))
        and all(leaf.donated for leaf in leaves)
    )
    # A jit that donates nothing leaves the donation to donate_argnums, as the error says.
    if donate and by_jit and set(donate) != set(by_jit):
        raise BadValue(
            f"{spec} returned a jax.jit that donates arguments {by_jit} and donate_argnums="
            f"{donate}: give the donation once (in the jit, or as donate_argnums)",
            param="step",
        )
    return inner, by_jit or donate


def _is_arg_info(x: Any) -> bool:
    return hasattr(x, "donated") and hasattr(x, "shape")


def _where(idx: tuple[int, ...]) -> str:
    return ("argument " if len(idx) == 1 else "arguments ") + ", ".join(map(str, idx))


def _count(args: tuple[Any, ...], idx: tuple[int, ...]) -> int:
    return int(sum(math.prod(x.shape) for i in idx for x in jax.tree.leaves(args[i])))


def _bytes(args: tuple[Any, ...], roles: Mapping[str, tuple[int, ...]], role: str) -> int:
    """Bytes of the role's arguments on one device (a sharded leaf's shard)."""
    return int(sum(_local_bytes(x) for i in roles.get(role, ()) for x in jax.tree.leaves(args[i])))


def _local_bytes(x: Any) -> int:
    sharding = getattr(x, "sharding", None)
    if not isinstance(sharding, jax.sharding.Sharding):
        return nbytes(x)
    return nbytes(jax.ShapeDtypeStruct(sharding.shard_shape(tuple(x.shape)), x.dtype))


def _breakdown(args: tuple[Any, ...], roles: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """Bytes by role from the arguments' shapes, per device (the gradients sharded as the
    weights, as a sharded step's ``out_shardings`` usually give them); a part whose role is
    not given is absent (unknown), unless every argument has a role: the others are then
    certainly empty."""
    if not roles:
        return {}
    covered = {i for idx in roles.values() for i in idx} == set(range(len(args)))
    parts: dict[str, int] = {}
    if "params" in roles or covered:
        trained = _bytes(args, roles, "params")
        parts.update(trainable=trained, gradients=trained)
        if "frozen" in roles or covered:
            parts["weights"] = trained + _bytes(args, roles, "frozen")
    for role, key in (("optimizer", "optimizer"), ("batch", "batch")):
        if role in roles or covered:
            parts[key] = _bytes(args, roles, role)
    return parts


def _precision(args: tuple[Any, ...], roles: Mapping[str, tuple[int, ...]]) -> dict[str, str]:
    """The dtypes the roles hold (``"unknown"`` where a role is not given); empty without
    roles, which tables then leave out."""
    if not roles:
        return {}

    covered = {i for idx in roles.values() for i in idx} == set(range(len(args)))

    def names(role: str) -> str:
        if role not in roles:
            return "-" if covered else "unknown"
        leaves = [x for i in roles[role] for x in jax.tree.leaves(args[i])]
        found = sorted(
            {jnp.dtype(x.dtype).name for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)}
        )
        return "+".join(found) or "-"

    return {
        "name": "step's own",
        "params": names("params"),
        "frozen": names("frozen"),
        "grads": names("params"),
        "optimizer_state": names("optimizer"),
        "compute": "step's own",
    }
