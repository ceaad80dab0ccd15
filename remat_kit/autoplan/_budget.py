"""The memory budget of ``rk.auto``: its four forms, read before anything is traced, and the
bytes each stands for on a device.

- ``"fits"``: what a JAX process may allocate on the device (``Target.usable_bytes``: on a
  GPU the allocator's real ``bytes_limit``; deviceless, the named target's at its allocator
  fraction).
- bytes: an int, or text with a unit (``"60GiB"``, ``"40GB"``).
- a fraction of that usable memory, in (0, 1] (``0.8``, ``"80%"``): ``"fits"`` is ``1.0``.
- ``activations=0.5`` (torch's ``activation_memory_budget``): the fixed parts (weights,
  gradients, optimizer state, batch) plus that share of what ``none`` keeps beside them.

Example:
  >>> from remat_kit.autoplan import Budget
  >>> Budget.of("60GiB").text, Budget.of(0.8).form, Budget.of(activations=0.5).text
  ('60GiB', 'fraction', 'activations=0.5')
"""

from __future__ import annotations

import dataclasses
from typing import Any

from remat_kit.errors import BadType, BadValue, BudgetOverDevice
from remat_kit.search import parse_budget
from remat_kit.targets import Target

__all__ = [
    "FORMS",
    "Budget",
]

#: The forms a budget takes.
FORMS = ("fits", "bytes", "fraction", "activations")

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Budget:
    """A memory budget as the user gave it: its form and value, before a device sizes it.

    Attributes:
      form: one of :data:`FORMS`.
      value: bytes (``bytes``), a share in (0, 1] (``fraction``, ``activations``), or None
        (``fits``).
      text: how it was written, for the log line and the cache key.

    Example:
      >>> Budget.of("fits").bytes_on(rk.target("h100")) == rk.target("h100").usable_bytes
      True
    """

    form: str
    value: float | int | None
    text: str

    @classmethod
    def of(cls, budget: Any = None, *, activations: Any = None) -> Budget:
        """Reads ``budget`` (or ``activations``: give one of them).

        Args:
          budget: ``"fits"``, bytes (an int, or text with a unit), or a fraction of the
            usable memory (a float in (0, 1], or ``"80%"``).
          activations: torch's relative budget: a share in [0, 1] of what ``none`` keeps
            beside the fixed parts.

        Returns:
          The Budget.

        Raises:
          BadValue: both or neither given, unreadable text, a share outside its range.
          BadType: neither a string nor a number.

        Example:
          >>> Budget.of(2**30).value, Budget.of("80%").value
          (1073741824, 0.8)
        """
        if activations is not None:
            if budget is not None:
                raise BadValue(
                    f"give budget={budget!r} or activations={activations!r}, not both",
                    param="budget",
                )
            if isinstance(activations, bool) or not isinstance(activations, int | float):
                raise BadType(
                    f"activations must be a number in [0, 1], got {activations!r}",
                    param="activations",
                )
            if not 0.0 <= float(activations) <= 1.0:
                raise BadValue(
                    f"activations={activations!r} must be in [0, 1]: the share of what `none` "
                    "keeps beside the fixed parts",
                    param="activations",
                )
            return cls("activations", float(activations), f"activations={float(activations):g}")
        if budget is None:
            raise BadValue(
                "give a budget: 'fits', bytes ('60GiB'), a fraction of the usable memory (0.8) "
                "or activations=0.5",
                param="budget",
            )
        if isinstance(budget, str) and budget.strip().lower() == "fits":
            return cls("fits", None, "fits")
        if isinstance(budget, str) and budget.strip().endswith("%"):
            share = parse_budget(budget, device_bytes=10**6) / 10**6
            return cls("fraction", share, budget.strip())
        if isinstance(budget, float) or (isinstance(budget, str) and _bare(budget)):
            share = float(budget)
            if not 0.0 < share <= 1.0:
                raise BadValue(
                    f"budget {budget!r} as a fraction of the usable memory must be in (0, 1]; "
                    "bytes take a unit (60GiB)",
                    param="budget",
                )
            return cls("fraction", share, f"{share:g}")
        # bytes: an int, or text with a unit (parse_budget's errors name what is wrong)
        return cls("bytes", parse_budget(budget), str(budget).strip())

    def bytes_on(
        self, target: Target, *, none_peak: int | None = None, fixed: int | None = None
    ) -> int:
        """The bytes this budget stands for on ``target``.

        Args:
          target: where the step is planned for (its ``usable_bytes`` must be known).
          none_peak: the compiled peak of ``none`` (``activations`` only).
          fixed: what no policy removes (``activations`` only).

        Returns:
          The budget in bytes.

        Raises:
          BudgetOverDevice: more than a process may allocate on the device.
          BadValue: a target whose memory is unknown (the CPU), or ``activations`` without
            ``none_peak`` and ``fixed``.

        Example:
          >>> Budget.of(0.5).bytes_on(rk.target("h100")) == rk.target("h100").usable_bytes // 2
          True
        """
        usable = target.usable_bytes
        if usable is None:
            raise BadValue(
                f"target {target.name!r} has no memory size to budget: plan for a named GPU, "
                "e.g. target='h100'",
                param="target",
            )
        if self.form == "fits":
            got = int(usable)
        elif self.form == "fraction":
            got = int(float(self.value or 0.0) * usable)
        elif self.form == "bytes":
            got = int(self.value or 0)
        else:
            if none_peak is None or fixed is None:
                raise BadValue("activations needs none's peak and the fixed parts", param="budget")
            got = int(fixed + float(self.value or 0.0) * max(0, none_peak - fixed))
        if got > usable:
            device = target.memory_bytes
            what = "the device" if device is not None and got > device else "what it may use"
            raise BudgetOverDevice(
                f"budget {self.text} ({got / GIB:.2f} GiB) is more than {what}: a process on "
                f"{target.name} may allocate {usable / GIB:.2f} GiB of "
                f"{(device or usable) / GIB:.2f} GiB; give at most {usable / GIB:.2f}GiB or 'fits'",
                budget_bytes=got,
                usable_bytes=usable,
                device_bytes=device,
                target=target.name,
            )
        return got


def _bare(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
