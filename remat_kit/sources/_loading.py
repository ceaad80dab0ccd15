"""Finding the user's code: a factory by ``LOCATION:NAME``, a block class by ``module:Class``,
and patching that block class with a remat policy while a model is traced.

Example:
  >>> from remat_kit.sources import load_factory
  >>> load_factory("remat_kit.sources:hf_inputs").__name__
  'hf_inputs'
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import itertools
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from remat_kit._workers._tasks import shipped, shipped_path
from remat_kit.errors import BadValue
from remat_kit.policies import Policy
from remat_kit.sources._environ import EnvSet, recording_environ
from remat_kit.wrap import remat

__all__ = [
    "load_factory",
    "load_factory_env",
    "patched_block",
    "shipped",
]


def load_factory_env(spec: str) -> tuple[Callable[..., Any], tuple[EnvSet, ...]]:
    """:func:`load_factory`, and the watched environment variables its import set.

    Example:
      >>> fn, env = load_factory_env("remat_kit.sources:hf_inputs")
      >>> fn.__name__, env
      ('hf_inputs', ())
    """
    location = spec.rpartition(":")[0]
    with recording_environ(Path(location).name if location.endswith(".py") else location) as env:
        fn = load_factory(spec)
    return fn, tuple(env)


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
            f"factory {spec!r}: a factory is LOCATION:NAME, e.g. path/to/model.py:build or "
            "package.module:build (or a preset name)",
            param="model",
        )
    if location.endswith(".py"):
        module = _load_file(spec, Path(location))
    else:
        try:
            module = importlib.import_module(location)
        except Exception as err:
            raise BadValue(
                f"factory {spec!r}: cannot import {location!r}: {type(err).__name__}: {err}",
                param="model",
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
            f"factory {spec!r}: {location} has no {name!r}; callables there: "
            f"{', '.join(offered) or 'none'}",
            param="model",
        )
    factory = getattr(module, name)
    if not callable(factory):
        raise BadValue(
            f"factory {spec!r}: {name} is a {type(factory).__name__}, not a callable",
            param="model",
        )
    return factory


def _load_file(spec: str, path: Path) -> Any:
    path = Path(shipped_path(str(path)))
    if not path.is_file():
        raise BadValue(f"factory {spec!r}: no such file {str(path)!r}", param="model")
    module_name = f"_remat_kit_factory_{abs(hash(str(path.resolve())))}"
    loader = importlib.util.spec_from_file_location(module_name, path)
    if loader is None or loader.loader is None:
        raise BadValue(f"factory {spec!r}: cannot load {str(path)!r} as Python", param="model")
    module = importlib.util.module_from_spec(loader)
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    # Registered as it runs, as an import would: a dataclass (a linen Module) with a string
    # annotation (``from __future__ import annotations``) looks its module up there.
    sys.modules[module_name] = module
    try:
        loader.loader.exec_module(module)
    except Exception as err:
        sys.modules.pop(module_name, None)
        raise BadValue(
            f"factory {spec!r}: {path.name} failed to run: {type(err).__name__}: {err}",
            param="model",
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


def _names(fn: Callable[..., Any], keyword: str) -> bool:
    # A parameter named so (not **kwargs: a keyword it must understand, not pass on).
    try:
        return keyword in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _import_class(spec: str) -> tuple[Any, str, type]:
    location, colon, name = spec.rpartition(":")
    if not colon or not location or not name:
        raise BadValue(
            f"block {spec!r}: name the block class as module:Class, e.g. "
            "transformers.models.llama.modeling_flax_llama:FlaxLlamaDecoderLayer",
            param="block",
        )
    try:
        module = importlib.import_module(location)
    except Exception as err:
        raise BadValue(
            f"block {spec!r}: cannot import {location!r}: {err}", param="block"
        ) from None
    cls = getattr(module, name, None)
    if not inspect.isclass(cls):
        raise BadValue(f"block {spec!r}: {location} has no class {name!r}", param="block")
    return module, name, cls


@contextlib.contextmanager
def patched_block(
    spec: str, policies: Policy | Sequence[Policy], *, counter: list[int] | None = None
) -> Iterator[None]:
    """Within the context, the block class ``module:Class`` is rematerialized.

    For models with no remat hook: the module's global ``Class`` is replaced by
    ``rk.remat(Class, policy)`` while the model is traced, then restored. With one policy per
    layer (a ``layers`` plan on an unrolled stack), the n-th layer built in the context gets
    the n-th policy (a layer: a block's ``name``, or each unnamed block).

    Args:
      spec: ``module:Class``, the module the model looks the class up in.
      policies: one policy, or one per layer in construction order.
      counter: a one-item list set to the layers built so far (to count them): the
        distinct names blocks are given, each unnamed block one more.

    Yields:
      Nothing.

    Raises:
      BadValue: an unimportable module or a missing class.

    Example:
      >>> import flax.linen
      >>> with patched_block("flax.linen:Dense", rk.policy("full")):
      ...     type(flax.linen.Dense(4)).__name__  # what a model built here gets
      'CheckpointDense'
      >>> flax.linen.Dense.__name__
      'Dense'
    """
    module, name, cls = _import_class(spec)
    per_layer = not isinstance(policies, Policy)
    wrapped: dict[str, type] = {}

    def for_policy(p: Policy) -> type:
        if p.spec not in wrapped:
            wrapped[p.spec] = remat(cls, p)
        return wrapped[p.spec]

    # A layer is a block's name where the model gives one (gemma's ``layer_3``, Hugging
    # Face's ``"3"``): a linen ``setup`` runs again for each clone of the model (``nn.jit``
    # runs gemma's three times), building its blocks again under the same names. An unnamed
    # block (NNX, compact linen) is a new layer each time it is built.
    layers: dict[Any, int] = {}
    unnamed = itertools.count()

    def layer_of(kwargs: Mapping[str, Any]) -> int:
        key = kwargs.get("name")
        key = ("unnamed", next(unnamed)) if not isinstance(key, str) else key
        i = layers.setdefault(key, len(layers))
        if counter is not None:
            counter[0] = len(layers)
        return i

    if per_layer:
        plan = list(policies)  # type: ignore[arg-type]

        def replacement(*args: Any, **kwargs: Any) -> Any:
            i = layer_of(kwargs)
            return for_policy(plan[min(i, len(plan) - 1)])(*args, **kwargs)

    else:
        base = for_policy(policies)  # type: ignore[arg-type]
        if counter is None:
            replacement = base
        else:

            def replacement(*args: Any, **kwargs: Any) -> Any:
                layer_of(kwargs)
                return base(*args, **kwargs)

    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, cls)
