"""A package's names loaded on first use (PEP 562): importing the package starts nothing
heavy (no jax for ``--help``), and a name's module is imported when the name is first read.

Example:
  >>> import types
  >>> pkg = types.ModuleType("pkg")
  >>> get = loader("json", {"dumps": None}, vars(pkg))
  >>> get("decoder").__name__
  'json.decoder'
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

__all__ = ["loader"]


def loader(
    package: str,
    homes: Mapping[str, str | None],
    namespace: MutableMapping[str, Any],
    *,
    submodules: bool = True,
) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``.

    Args:
      package: the package's ``__name__``.
      homes: public name -> the submodule it is imported from (None: the name is a
        submodule itself).
      namespace: the package's ``globals()``: a name read once is kept there, so later
        lookups never come back here.
      submodules: any other submodule (``rk.search``, ``sources._steps``) is imported by
        its name too.

    Returns:
      ``__getattr__(name)``, raising AttributeError for a name the package does not have.
    """

    def __getattr__(name: str) -> Any:
        if name in homes:
            home = homes[name]
            if home is None:
                return importlib.import_module(f"{package}.{name}")
            value = getattr(importlib.import_module(f"{package}.{home}"), name)
            namespace[name] = value  # later lookups skip this function
            return value
        if (
            submodules
            and not name.startswith("__")
            and importlib.util.find_spec(f"{package}.{name}") is not None
        ):
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
