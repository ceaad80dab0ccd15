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
from flax import nnx

from remat_kit.policies import Policy, as_policy

__all__ = ["remat"]

T = TypeVar("T")

PolicyLike = str | Policy | Callable[..., Any] | None


def _is_linen_class(obj: Any) -> bool:
    return inspect.isclass(obj) and issubclass(obj, nn.Module)


def _is_nnx_class(obj: Any) -> bool:
    return inspect.isclass(obj) and issubclass(obj, nnx.Module)


def _wrap(
    target: T,
    p: Policy,
    prevent_cse: bool,
    static_argnums: int | tuple[int, ...],
    methods: tuple[str, ...] | None,
) -> T:
    if not p.is_remat:
        return target
    if _is_linen_class(target):
        wrapped = nn.remat(
            target,
            policy=p.jax_policy,
            prevent_cse=prevent_cse,
            static_argnums=static_argnums,
            methods=list(methods) if methods else None,
        )
        wrapped.__doc__ = target.__doc__
        return wrapped
    if _is_nnx_class(target):
        return _nnx_remat_class(target, p, prevent_cse, static_argnums, methods or ("__call__",))
    if inspect.isclass(target):
        raise TypeError(
            f"rk.remat takes a Flax linen or NNX Module class or a function, got class {target!r}"
        )
    if callable(target):
        return functools.wraps(target)(
            jax.checkpoint(
                target,
                policy=p.jax_policy,
                prevent_cse=prevent_cse,
                static_argnums=static_argnums,
            )
        )
    raise TypeError(
        f"rk.remat takes a Flax Module class or a function, got {type(target).__name__} {target!r}"
    )


def _nnx_remat_class(
    cls: type,
    p: Policy,
    prevent_cse: bool,
    static_argnums: int | tuple[int, ...],
    methods: tuple[str, ...],
) -> type:
    # nnx.remat transforms functions of modules; rematerialize each named method by
    # routing the call through a function that takes the module as its first argument.
    # Static argnums shift by one because the module is argument 0 of that function.
    shifted = (
        tuple(i + 1 for i in static_argnums)
        if isinstance(static_argnums, tuple)
        else static_argnums + 1
    )

    def make(name: str) -> Callable[..., Any]:
        base = getattr(cls, name)
        checkpointed = nnx.remat(
            base, policy=p.jax_policy, prevent_cse=prevent_cse, static_argnums=shifted
        )

        @functools.wraps(base)
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return checkpointed(self, *args, **kwargs)

        return method

    namespace = {name: make(name) for name in methods}
    namespace["__doc__"] = cls.__doc__
    namespace["__module__"] = cls.__module__
    return type(f"Remat{cls.__name__}", (cls,), namespace)


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
        ``target`` itself.
      prevent_cse: keep XLA from merging the recomputation with the forward pass. Use
        True outside ``scan`` (the default) and False for a block inside ``nn.scan``,
        where the loop already prevents it and CSE barriers cost speed.
      static_argnums: positional arguments (after ``self``) that are Python values,
        such as a ``deterministic`` flag.
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
        raise TypeError(
            "rk.remat needs a policy: rk.remat(Block, 'full') or @rk.remat('full'); "
            f"see rk.policy_names() for the names (got target={target!r}, policy={policy!r})"
        )
    return _wrap(target, as_policy(policy), **options)


def _looks_like_jax_policy(fn: Callable[..., Any]) -> bool:
    # jax policies are called as policy(prim, *avals, **params).
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    kinds = {p.kind for p in params}
    return inspect.Parameter.VAR_KEYWORD in kinds and inspect.Parameter.VAR_POSITIONAL in kinds
