"""Whether the cache is read and written: on unless ``REMAT_KIT_NO_CACHE=1``, or this process
says otherwise (:func:`set_enabled`, the block :func:`bypassed`: the CLI's ``--no-cache``).

Example:
  >>> with bypassed():
  ...     enabled()
  False
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from remat_kit._switches import switch
from remat_kit.errors import BadType

__all__ = [
    "ENV_OFF",
    "bypassed",
    "enabled",
    "set_enabled",
]

#: Environment variable that turns the cache off when set to 1 (or true/yes).
ENV_OFF = "REMAT_KIT_NO_CACHE"

_override: bool | None = None


def enabled() -> bool:
    """Whether the cache is read and written: :func:`set_enabled` if called, else the
    environment (``REMAT_KIT_NO_CACHE=1`` turns it off).

    Example:
      >>> set_enabled(False); enabled()
      False
      >>> set_enabled(None)
    """
    if _override is not None:
        return _override
    return not switch(ENV_OFF)


def set_enabled(flag: bool | None) -> None:
    """Turns the cache on or off for this process (None: follow ``REMAT_KIT_NO_CACHE``).

    Args:
      flag: True, False, or None.

    Raises:
      TypeError: anything else.

    Example:
      >>> set_enabled(False)  # what --no-cache does
      >>> enabled()
      False
      >>> set_enabled(None)  # back to REMAT_KIT_NO_CACHE
    """
    global _override
    if flag is not None and not isinstance(flag, bool):
        raise BadType(f"set_enabled takes True, False or None, got {flag!r}")
    _override = flag


@contextlib.contextmanager
def bypassed() -> Iterator[None]:
    """Within the block the cache is neither read nor written (the CLI's ``--no-cache``).

    Example:
      >>> with bypassed():
      ...     enabled()
      False
    """
    global _override
    before = _override
    _override = False
    try:
        yield
    finally:
        _override = before
