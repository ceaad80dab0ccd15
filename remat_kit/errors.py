"""The errors remat_kit raises: one base class, subclasses that carry data.

Callers branch on the type (``except rk.DoesNotFit as e: e.fixed_bytes``), never on the text of a
message. Every subclass also derives from the builtin it replaces (``ValueError`` for bad input,
``TypeError`` for an argument of the wrong type, ``RuntimeError`` for a failure of XLA or the
platform), so ``except ValueError`` keeps working. A bad value names the library parameter it is
about (:attr:`BadValue.param`), never a command-line flag. The CLI catches
:class:`RematKitError` once and prints one ``remat-kit: ...`` line, naming the flag that set
``param``; anything else reaching it is a bug and keeps its traceback.

Example:
  >>> import remat_kit as rk
  >>> try:
  ...     rk.policy("minmal")
  ... except rk.UnknownName as err:
  ...     print(err.kind, err.close)
  policy ('minimal',)
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "AutoOutsideStep",
    "BadOutput",
    "BadType",
    "BadValue",
    "BudgetOverDevice",
    "DoesNotFit",
    "InspectError",
    "NoAutoBlock",
    "OpenShardAxis",
    "RematKitError",
    "RematWarning",
    "ShardedStep",
    "TargetError",
    "UnitlessBudget",
    "UnknownName",
    "unknown",
]


class RematKitError(Exception):
    """Base class of every error remat_kit raises on purpose."""


class BadValue(RematKitError, ValueError):
    """An argument that is out of range or malformed; the message names it and what is valid.

    Attributes:
      param: the library parameter it is about (``"seq"``, ``"budget"``, ``"target"`` ...), or
        None. Messages name parameters, never command-line flags: the CLI maps ``param`` to its
        flag when it prints the error.
    """

    def __init__(self, *args: object, param: str | None = None):
        super().__init__(*args)
        self.param = param


class BadType(RematKitError, TypeError):
    """An argument of the wrong type; the message names it, its type and what is accepted.

    Attributes:
      param: the library parameter it is about, or None (as :attr:`BadValue.param`).
    """

    def __init__(self, *args: object, param: str | None = None):
        super().__init__(*args)
        self.param = param


class UnknownName(BadValue):
    """A name not in a catalogue (policy, target, schedule, optimizer, preset, ...).

    Attributes:
      kind: what was looked up, e.g. ``"policy"``.
      name: the name given.
      known: every valid name, sorted.
      close: the valid names closest to ``name`` (may be empty).
      param: the parameter that gave the name (``"target"``), or None.
    """

    def __init__(
        self,
        kind: str,
        name: object,
        known: Iterable[str],
        close: Iterable[str],
        *,
        heading: str = "Known",
        param: str | None = None,
    ):
        self.kind = kind
        self.name = name
        self.known = tuple(sorted(known))
        self.close = tuple(close)
        hint = f" Did you mean {', '.join(self.close)}?" if self.close else ""
        super().__init__(
            f"unknown {kind} {name!r}.{hint} {heading}: {', '.join(self.known)}", param=param
        )


def unknown(
    kind: str,
    name: object,
    known: Iterable[str],
    n: int = 3,
    *,
    close: Iterable[str] | None = None,
    heading: str = "Known",
    param: str | None = None,
) -> UnknownName:
    """The :class:`UnknownName` to raise for ``name``, with up to ``n`` close matches.

    Args:
      kind: what was looked up, e.g. ``"policy"``.
      name: the name given.
      known: every valid name.
      n: how many close matches to suggest.
      close: the suggestions, when the caller knows better (aliases); default: the ``n``
        names of ``known`` closest to ``name``.
      heading: the word before the list of valid names ("Known", "Valid").
      param: the parameter that gave the name, for :attr:`BadValue.param`.

    Returns:
      The error (the caller raises it, so the traceback points at the caller).

    Example:
      >>> str(unknown("colour", "gren", ["green", "red"]))
      "unknown colour 'gren'. Did you mean green? Known: green, red"
    """
    choices = sorted(known)
    if close is None:
        close = difflib.get_close_matches(str(name), choices, n=n)
    return UnknownName(kind, name, choices, close, heading=heading, param=param)


class OpenShardAxis(BadValue):
    """A shard spec that leaves axis sizes open where they cannot be filled in.

    One open axis takes the devices the others leave, so it needs the device count; more than
    one open axis is never readable. A caller that learns the device count later (the CLI's
    ``--shard`` before ``--gpus`` is known) catches this type and reads the spec again then.

    Attributes:
      spec: the spec given.
      open_axes: the axes whose size was left out, in the order given.
    """

    def __init__(self, message: str, *, spec: str, open_axes: Iterable[str]):
        super().__init__(message, param="shard")
        self.spec = spec
        self.open_axes = tuple(open_axes)


class UnitlessBudget(BadValue):
    """A memory budget given as a fraction of the device (or a bare number) where it cannot be.

    A fraction needs the device's memory size; a bare number above 1 is neither a fraction nor
    bytes. A caller with no device to scale (a host budget) words the fix as "give bytes with a
    unit".
    """


class BadOutput(BadValue):
    """A model whose output is not logits ``[batch, seq, vocab]`` for its tokens ``[batch, seq]``.

    Found from the traced output's shape, before a loss is computed from it.

    Attributes:
      model: the model's name (a factory's ``file.py:NAME``).
      shape: the shape of the logits it returned.
      tokens: the shape of the tokens it was given, ``(batch, seq)``.
    """

    def __init__(
        self,
        message: str,
        *,
        model: str,
        shape: Iterable[int],
        tokens: Iterable[int],
    ):
        super().__init__(message)
        self.model = model
        self.shape = tuple(shape)
        self.tokens = tuple(tokens)


class RematWarning(UserWarning):
    """A report figure the user should read twice (a no-op policy, XLA's own remat, ...)."""


class TargetError(RematKitError, RuntimeError):
    """A target that cannot be compiled for here (platform, plugin or topology missing)."""


class InspectError(RematKitError, RuntimeError):
    """XLA's dump of a compiled program could not be produced or read."""


class DoesNotFit(BadValue):
    """The step cannot fit the memory limit whatever the policy.

    What no rematerialization removes (weights, gradients, optimizer state, the batch, a
    gradient accumulator) is already over the limit.

    Attributes:
      target: the target's name.
      limit_bytes: the memory limit that was asked for.
      parts: the fixed parts in bytes, e.g. ``{"weights": ..., "gradients": ...}``.
      fixed_bytes: their sum.
      hints: what would fit instead, one short phrase each.
      note: the ``fixed_over_budget`` note of it (``Note.to_dict()``: the figures and the
        hints as data, :mod:`remat_kit.notes`), or None where none was made.
    """

    def __init__(
        self,
        message: str,
        *,
        target: str,
        limit_bytes: int,
        parts: Mapping[str, int],
        hints: Iterable[str] = (),
        note: Mapping[str, Any] | None = None,
    ):
        super().__init__(message)
        self.target = target
        self.limit_bytes = int(limit_bytes)
        self.parts = dict(parts)
        self.fixed_bytes = int(sum(self.parts.values()))
        self.hints = tuple(hints)
        self.note = None if note is None else dict(note)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields of the error (message included)."""
        return {
            "message": str(self),
            "target": self.target,
            "limit_bytes": self.limit_bytes,
            "parts": self.parts,
            "fixed_bytes": self.fixed_bytes,
            "hints": list(self.hints),
            "note": self.note,
        }


class AutoOutsideStep(RematKitError, RuntimeError):
    """A block marked ``rk.remat(Block, "auto")`` traced where no step wrapper decides its
    policy (outside ``rk.auto``'s step and any ``rk.marks.auto_as`` block).

    Attributes:
      block: the marked class's or function's name.
    """

    def __init__(self, message: str, *, block: str):
        super().__init__(message)
        self.block = block


class NoAutoBlock(BadValue):
    """A step given to ``rk.auto`` whose trace reaches no block marked ``"auto"``: there is
    nothing for the decision to apply to.

    Attributes:
      step: the step's name.
    """

    def __init__(self, message: str, *, step: str):
        super().__init__(message, param="step")
        self.step = step


class BudgetOverDevice(BadValue):
    """A memory budget above what a process may allocate on the device it is planned for.

    Attributes:
      budget_bytes: the budget asked for.
      usable_bytes: what a JAX process may allocate there (the allocator's ``bytes_limit``).
      device_bytes: the device's memory (None where unknown).
      target: the target's name.
    """

    def __init__(
        self,
        message: str,
        *,
        budget_bytes: int,
        usable_bytes: int,
        device_bytes: int | None,
        target: str,
    ):
        super().__init__(message, param="budget")
        self.budget_bytes = int(budget_bytes)
        self.usable_bytes = int(usable_bytes)
        self.device_bytes = None if device_bytes is None else int(device_bytes)
        self.target = target


class ShardedStep(BadValue):
    """A step given to ``rk.auto`` sharded over several devices in a way the decision cannot
    carry to the target's devices (a sharded step is otherwise planned for the mesh's devices
    of the target): a multi-device sharding that is not a ``NamedSharding``, shardings on two
    different meshes, a target of another device count (at a call, ``step.lower`` or
    ``step.inspect``, which inspects a sharded step on the mesh it was planned on). Refused
    rather than planned for a program it does not run; the message names the fix.

    Attributes:
      step: the step's name.
      devices: the devices the shardings span.
      where: what is refused (``"in_shardings"``, ``"out_shardings"``, ``"arguments"``,
        ``"target"``).
    """

    def __init__(self, message: str, *, step: str, devices: int, where: str):
        super().__init__(message, param="step")
        self.step = step
        self.devices = int(devices)
        self.where = where
