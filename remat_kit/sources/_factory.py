"""Running the user's model code: a factory called for one policy (under ``nnx.eval_shape``, so
an NNX model's weights are never allocated), the layers of its model counted, and the model's
own errors as it is traced said in one line.

Each function takes the :class:`~remat_kit.sources.ModelSource` whose factory it calls.

Example:
  >>> src = rk.sources.from_factory("tests/data/factories.py:untagged")
  >>> type(call_factory(src, rk.policy("none"), {})).__name__
  '_Untagged'
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from flax import nnx

from remat_kit.errors import BadValue, RematKitError
from remat_kit.policies import NO_REMAT, Policy
from remat_kit.sources._adapters import auto_inputs
from remat_kit.sources._loading import patched_block
from remat_kit.targets import Target
from remat_kit.targets import target as named_target


class _Made(Protocol):
    """What these functions read of a :class:`~remat_kit.sources.ModelSource`: the factory
    and how it is called (so this module needs nothing of the class above it)."""

    @property
    def spec(self) -> str: ...

    @property
    def block(self) -> str | None: ...

    @property
    def inputs(self) -> Any: ...

    @property
    def factory(self) -> Callable[..., Any]: ...

    @property
    def takes_target(self) -> bool: ...


__all__ = [
    "call_factory",
    "count_layers",
    "model_errors",
    "target_kwargs",
]


def target_kwargs(src: _Made, target: Target | None) -> dict[str, Any]:
    """``target=`` for a factory that names it: the compiled-for target, else (a trace of the
    structure only) the factory's default, else the host's."""
    if not src.takes_target:
        return {}
    if target is not None:
        return {"target": target}
    param = inspect.signature(src.factory).parameters["target"]
    return {} if param.default is not param.empty else {"target": named_target("cpu")}


def call_factory(
    src: _Made,
    policy: Policy,
    kwargs: Mapping[str, Any],
    patch: tuple[str, Policy | list[Policy]] | None = None,
    counter: list[int] | None = None,
) -> Any:
    """The module ``src``'s factory makes for ``policy`` (an NNX one abstract).

    Args:
      src: the source.
      policy: what the factory is called with.
      kwargs: its other arguments (``schedule=``, ``target=``).
      patch: ``(block, policies)`` patched while the factory runs (:func:`patched_block`).
      counter: passed to the patch, to count the blocks built.

    Raises:
      BadValue: the factory fails (its error in one line) or returns something that is not a
        Flax module.
    """
    box: dict[str, Any] = {}

    def make() -> Any:
        with contextlib.ExitStack() as stack:
            if patch is not None:
                stack.enter_context(patched_block(*patch, counter=counter))
            out = src.factory(policy, **kwargs)
        if isinstance(out, nnx.Module):
            return out
        box["module"] = out
        return None

    try:
        abstract = nnx.eval_shape(make)
    except BadValue:
        raise
    except Exception as err:
        raise BadValue(f"{src.spec}({policy.spec!r}) failed: {type(err).__name__}: {err}") from None
    made = abstract if abstract is not None else box.get("module")
    if not (isinstance(made, nnx.Module) or (hasattr(made, "init") and hasattr(made, "apply"))):
        raise BadValue(
            f"{src.spec} returned {type(made).__name__}; a factory returns a Flax module "
            "(linen or NNX) mapping tokens [batch, seq] to logits"
        )
    return made


def count_layers(src: _Made) -> int | None:
    """Layers of the model when known (:meth:`ModelSource.n_layers`, which remembers them)."""
    if src.block:
        return _count_blocks(src)
    made = call_factory(src, NO_REMAT, target_kwargs(src, None))
    return _layer_attr(made)


def _count_blocks(src: _Made) -> int | None:
    counter = [0]
    # An NNX model (or a linen one built eagerly) builds its blocks in the factory.
    made = call_factory(
        src,
        NO_REMAT,
        target_kwargs(src, None),
        (src.block or "", NO_REMAT),
        counter,
    )
    if counter[0] or isinstance(made, nnx.Module):
        return counter[0] or None
    tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
    call = type(made).__call__
    extra = auto_inputs(call, src.spec) if src.inputs == "auto" else src.inputs
    with patched_block(src.block or "", NO_REMAT, counter=counter):
        jax.eval_shape(
            lambda k, t: made.init(k, t, **(extra(t) if callable(extra) else {})),
            jax.random.key(0),
            tokens,
        )
    return counter[0] or None


def _layer_attr(made: Any) -> int | None:
    for path in ("n_layers", "num_layers", "layers", "config.num_hidden_layers", "config.n_layer"):
        obj = made
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, int) and obj > 0:
            return obj
    cfg = getattr(made, "cfg", None)
    n = getattr(cfg, "n_layers", None)
    return n if isinstance(n, int) and n > 0 else None


@contextlib.contextmanager
def model_errors(what: str) -> Iterator[None]:
    """Within the context, an error the model's own code raises as it is traced is the user's
    to fix: a BadValue saying ``what`` and the error's first line (the traceback stays on its
    ``__cause__``, which ``--debug`` shows); remat_kit's own errors pass as they are."""
    try:
        yield
    except RematKitError:
        raise
    except Exception as err:
        first = (str(err).strip().splitlines() or [""])[0]
        raise BadValue(f"{what}: {type(err).__name__}: {first}") from err
