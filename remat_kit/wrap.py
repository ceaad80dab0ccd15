"""Applies a policy to Flax modules and functions: ``rk.remat``, direct or as a decorator.

Linen module classes go through ``nn.remat``, NNX module classes through ``nnx.remat``,
plain functions through ``jax.checkpoint``. The policy ``none`` returns its argument
unchanged: no checkpoint boundary, nothing recomputed.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import flax.linen as nn
import jax
import numpy as np
from flax import nnx
from jax.ad_checkpoint import name_p

from remat_kit import checks, marks
from remat_kit.errors import BadType, BadValue
from remat_kit.policies import Policy, as_policy

__all__ = ["remat"]

T = TypeVar("T")

PolicyLike = str | Policy | Callable[..., Any] | None


def _is_linen_class(obj: Any) -> bool:
    return inspect.isclass(obj) and issubclass(obj, nn.Module)


def _is_nnx_class(obj: Any) -> bool:
    return inspect.isclass(obj) and issubclass(obj, nnx.Module)


def _wrap[T](
    target: T,
    p: Policy,
    prevent_cse: bool,
    static_argnums: int | tuple[int, ...],
    methods: tuple[str, ...] | None,
) -> T:
    if not p.is_remat:
        return target
    if _is_linen_class(target):
        return _remat_class(target, p, prevent_cse, static_argnums, methods, nn.remat, "Checkpoint")
    if _is_nnx_class(target):
        return _remat_class(target, p, prevent_cse, static_argnums, methods, nnx.remat, "Remat")
    if inspect.isclass(target):
        raise BadType(
            f"rk.remat takes a Flax linen or NNX Module class or a function, got class {target!r}"
        )
    if callable(target):
        recorder = _Recorder(p, getattr(target, "__name__", "function"))
        checkpointed = jax.checkpoint(
            target, policy=recorder.policy, prevent_cse=prevent_cse, static_argnums=static_argnums
        )

        @functools.wraps(target)
        def call(*args: Any, **kwargs: Any) -> Any:
            recorder.check()
            out = checkpointed(*args, **kwargs)
            recorder.check()
            return out

        return call
    raise BadType(
        f"rk.remat takes a Flax Module class or a function, got {type(target).__name__} {target!r}"
    )


class _Recorder:
    """The jax policy handed to ``jax.checkpoint``: ``p``'s, noting the tags it is asked about.

    jax asks the policy about every operation of the checkpointed code when it differentiates
    it, tagged ones (``checkpoint_name``) included; so after a differentiated call the recorder
    knows the tags there and can say once that a name-based policy matched none of them.
    Registered with :func:`remat_kit.checks.register`, so a checkpoint found in a jaxpr names
    the Policy it was made for.
    """

    def __init__(self, p: Policy, what: str) -> None:
        self.p, self.what = p, what
        self.asked, self.warned = False, False
        self.tags: set[str] = set()
        name_prim, jax_policy = name_p, p.jax_policy

        def policy(prim: Any, *avals: Any, **params: Any) -> Any:
            self.asked = True
            if prim is name_prim:
                self.tags.add(str(params["name"]))
            return jax_policy(prim, *avals, **params)

        self.policy = checks.register(policy, p)

    def check(self) -> None:
        # Scanned code is differentiated after the call returns: checked at the next call too.
        if self.asked and not self.warned and checks.unmatched_policy(self.p, self.tags):
            self.warned = True
            checks.check_policy_matches(self.p, self.tags, where=f"rk.remat({self.what})")


def _is_static(value: Any) -> bool:
    # A value with no array leaf (a flag, None, a string, a shape) cannot be traced by
    # jax.checkpoint: it steers Python control flow (`if not deterministic:`), so it is
    # closed over instead of passed through the checkpoint.
    return not any(
        isinstance(leaf, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))
        for leaf in jax.tree.leaves(value)
    )


def _remat_class(
    cls: type,
    p: Policy,
    prevent_cse: bool,
    static_argnums: int | tuple[int, ...],
    methods: tuple[str, ...] | None,
    transform: Callable[..., Any],
    prefix: str,
) -> type:
    """A subclass of ``cls`` whose ``methods`` run under ``transform`` (nn.remat / nnx.remat).

    Each call splits its arguments into arrays, passed through the checkpoint, and Python
    values, closed over: positional arguments named by ``static_argnums`` (counted after
    ``self``) and any argument without an array leaf, keyword arguments included. Hugging
    Face calls its layers with ``deterministic=True`` as a keyword, which a checkpoint would
    otherwise turn into a traced bool. The transform is built per call, so a call never
    reuses a trace made under other static values.
    """
    fixed = _static_positions(static_argnums)
    recorder = _Recorder(p, cls.__name__)

    def make(name: str) -> Callable[..., Any]:
        return _remat_method(getattr(cls, name), name, recorder, fixed, prevent_cse, transform)

    namespace: dict[str, Any] = {name: make(name) for name in methods or ("__call__",)}
    namespace["__doc__"] = cls.__doc__
    namespace["__module__"] = cls.__module__
    return type(f"{prefix}{cls.__name__}", (cls,), namespace)


def _static_positions(static_argnums: int | tuple[int, ...]) -> set[int]:
    fixed = {static_argnums} if isinstance(static_argnums, int) else set(static_argnums)
    for i in fixed:
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise BadValue(
                f"static_argnums={static_argnums!r}: positions are ints >= 0, counted after self"
            )
    return fixed


def _remat_method(
    base: Callable[..., Any],
    name: str,
    recorder: _Recorder,
    fixed: set[int],
    prevent_cse: bool,
    transform: Callable[..., Any],
) -> Callable[..., Any]:
    """``base`` (a method) run under ``transform`` with the recorder's policy; see
    :func:`_remat_class` for how its arguments are split."""

    @functools.wraps(base)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        static_pos = {i: a for i, a in enumerate(args) if i in fixed or _is_static(a)}
        dyn_args = [a for i, a in enumerate(args) if i not in static_pos]
        static_kw = {k: v for k, v in kwargs.items() if _is_static(v)}
        # Array keyword arguments go through the checkpoint as positions: nnx.remat
        # cannot place keywords (EasyDeL calls its layers with hidden_states=...).
        dyn_keys = [k for k in kwargs if k not in static_kw]
        n = len(args)

        def run(module: Any, *dyn: Any) -> Any:
            it = iter(dyn)
            full = [static_pos[i] if i in static_pos else next(it) for i in range(n)]
            dkw = dict(zip(dyn_keys, it, strict=True))
            return base(module, *full, **dkw, **static_kw)

        run.__name__ = name  # flax names a lifted method's scope after it
        checkpointed = transform(run, policy=recorder.policy, prevent_cse=prevent_cse)
        recorder.check()
        out = checkpointed(self, *dyn_args, *(kwargs[k] for k in dyn_keys))
        recorder.check()
        return out

    return method


def _policy_key(p: Policy) -> tuple[str, int]:
    # Plans are rebuilt from their specs: one wrapped copy per spec. A raw callable's spec
    # ("custom") does not tell two apart: those are keyed by the callable too.
    return p.spec, id(p.jax_policy) if p.name == "custom" else 0


def _initializing(module: Any) -> bool:
    # A linen init differentiates nothing: no policy is needed to build the parameters.
    check = getattr(module, "is_initializing", None)
    try:
        return bool(check()) if callable(check) else False
    except Exception:  # an unbound module has no scope to ask
        return False


def _wrap_auto[T](
    target: T,
    prevent_cse: bool,
    static_argnums: int | tuple[int, ...],
    methods: tuple[str, ...] | None,
) -> T:
    """``target`` marked ``"auto"``: each trace applies the policy of the step's scope
    (:func:`remat_kit.marks.policy_for`), one wrapped copy per policy."""
    if _is_linen_class(target) or _is_nnx_class(target):
        cls: Any = target
        transform = nn.remat if _is_linen_class(cls) else nnx.remat
        fixed = _static_positions(static_argnums)
        made: dict[tuple[str, tuple[str, int]], Callable[..., Any]] = {}

        def make(name: str) -> Callable[..., Any]:
            base = getattr(cls, name)

            @functools.wraps(base)
            def method(self: Any, *args: Any, **kwargs: Any) -> Any:
                if marks.current() is None and _initializing(self):
                    return base(self, *args, **kwargs)
                p = marks.policy_for(cls.__name__)
                if not p.is_remat:
                    return base(self, *args, **kwargs)
                key = (name, _policy_key(p))
                if key not in made:
                    recorder = _Recorder(p, cls.__name__)
                    made[key] = _remat_method(base, name, recorder, fixed, prevent_cse, transform)
                return made[key](self, *args, **kwargs)

            return method

        namespace: dict[str, Any] = {n: make(n) for n in methods or ("__call__",)}
        namespace["__doc__"] = cls.__doc__
        namespace["__module__"] = cls.__module__
        return type(f"Auto{cls.__name__}", (cls,), namespace)  # type: ignore[return-value]
    if inspect.isclass(target) or not callable(target):
        raise BadType(
            f"rk.remat takes a Flax linen or NNX Module class or a function, got {target!r}"
        )
    fn: Any = target
    what = getattr(fn, "__name__", "function")
    wrapped: dict[tuple[str, int], Callable[..., Any]] = {}

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        p = marks.policy_for(what)
        key = _policy_key(p)
        if key not in wrapped:
            wrapped[key] = _wrap(fn, p, prevent_cse, static_argnums, None)
        return wrapped[key](*args, **kwargs)

    return call  # type: ignore[return-value]


def remat(
    target: Any = None,
    policy: PolicyLike = None,
    /,
    *,
    prevent_cse: bool = True,
    static_argnums: int | tuple[int, ...] = (),
    methods: tuple[str, ...] | None = None,
) -> Any:
    """Rematerializes a Flax module class (linen or NNX) or a function under ``policy``.

    Two ways to call it, like Flax's own transforms::

      Block = rk.remat(Block, "full")      # direct
      @rk.remat("dots")                    # decorator
      class Block(nn.Module): ...

    Args:
      target: a ``flax.linen.Module`` subclass, a ``flax.nnx.Module`` subclass or a
        function. When it is a policy (name, Policy or jax policy callable) instead,
        ``remat`` returns a decorator.
      policy: a catalogue name or spec (``"minimal"``, ``"names:save=context"``), an
        ``rk.Policy`` or a raw ``jax.checkpoint`` policy callable. ``"none"`` returns
        ``target`` itself. ``"auto"`` marks the block for the step to decide: a step wrapped
        by ``rk.auto(step, budget=...)`` plans its policy under a memory budget at its first
        call (:mod:`remat_kit.marks`); traced outside one it raises ``AutoOutsideStep``.
      prevent_cse: keep XLA from merging the recomputation with the forward pass. Use
        True outside ``scan`` (the default) and False for a block inside ``nn.scan``,
        where the loop already prevents it and CSE barriers cost speed.
      static_argnums: for a function, as ``jax.checkpoint``'s. For a Module class, the
        positional arguments of its methods counted after ``self`` (0 is the first
        argument after ``self``) to close over instead of tracing. Module methods also
        close over every argument, keyword ones included, that holds no array (a
        ``deterministic=True`` flag, None, a string), so Hugging Face layers work as is.
      methods: methods to rematerialize (default ``__call__``).

    Returns:
      The rematerialized class or function, or a decorator producing one.

    Raises:
      TypeError: ``target`` is neither a Module class nor a function, or no policy given.
      ValueError: unknown policy name.

    Example:
      >>> import flax.linen as nn, remat_kit as rk
      >>> @rk.remat("full")
      ... class MLP(nn.Module):
      ...     @nn.compact
      ...     def __call__(self, x):
      ...         return nn.Dense(4)(nn.relu(nn.Dense(8)(x)))
      >>> MLP.__name__
      'CheckpointMLP'
    """
    options = {"prevent_cse": prevent_cse, "static_argnums": static_argnums, "methods": methods}
    if _is_auto(target) and policy is None:
        return lambda t: _wrap_auto(t, **options)  # @rk.remat("auto")
    if _is_auto(policy):
        if target is None:
            raise BadType("rk.remat needs a block to mark: rk.remat(Block, 'auto')")
        return _wrap_auto(target, **options)
    wrappable = _is_linen_class(target) or _is_nnx_class(target)
    if policy is None and not wrappable and target is not None and not inspect.isfunction(target):
        # Decorator form: the only positional argument is the policy.
        p = as_policy(target)
        return lambda t: _wrap(t, p, **options)
    # A plain function could be a user's jax policy callable or a function to wrap.
    if policy is None and inspect.isfunction(target) and _looks_like_jax_policy(target):
        p = as_policy(target)
        return lambda t: _wrap(t, p, **options)
    if target is None or policy is None:
        raise BadType(
            "rk.remat needs a policy: rk.remat(Block, 'full') or @rk.remat('full'); "
            f"see rk.policy_names() for the names (got target={target!r}, policy={policy!r})"
        )
    return _wrap(target, as_policy(policy), **options)


def _is_auto(p: Any) -> bool:
    return isinstance(p, str) and p.strip().lower() == marks.AUTO


def _looks_like_jax_policy(fn: Callable[..., Any]) -> bool:
    # jax policies are called as policy(prim, *avals, **params).
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    kinds = {p.kind for p in params}
    return inspect.Parameter.VAR_KEYWORD in kinds and inspect.Parameter.VAR_POSITIONAL in kinds
