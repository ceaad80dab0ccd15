"""Yes/no switches read from the environment (``REMAT_KIT_NO_CACHE``,
``REMAT_KIT_FULL_CODEGEN``): a value that is neither is refused, never read as "no".

Example:
  >>> switch("REMAT_KIT_EXAMPLE", {"REMAT_KIT_EXAMPLE": "Yes"})
  True
  >>> switch("REMAT_KIT_EXAMPLE", {})
  False
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from remat_kit.errors import BadValue

__all__ = ["OFF", "ON", "switch"]

#: The values that turn a switch on, and off (unset and empty are off too); any case.
ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")


def switch(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment variable ``name`` is on.

    Args:
      name: the variable.
      environ: where to read it (None: ``os.environ``).

    Raises:
      BadValue: a value that is neither on nor off (``REMAT_KIT_NO_CACHE=2`` would
        otherwise leave the cache on without a word).
    """
    text = (os.environ if environ is None else environ).get(name, "").strip().lower()
    if text in ON:
        return True
    if text in OFF or not text:
        return False
    raise BadValue(
        f"{name}={text!r} is neither on ({', '.join(ON)}) nor off ({', '.join(OFF)}, or unset)",
        param=name,
    )
