"""Remat decided in the run: ``rk.auto(train_step, budget=...)`` plans the policy of the
blocks marked ``rk.remat(Block, "auto")`` for the device that runs the step.

One concept per module, the data flowing one way:

- ``_budget``: the budget's four forms (``"fits"``, bytes, a fraction, torch's
  ``activations=``) and the bytes each stands for on a device;
- ``_decision``: :class:`AutoPlan`, what was decided for one shape, and its log line;
- ``_decide``: the decision (the own-step source, the planner, the disk cache);
- ``_step``: the wrapper, :func:`auto` and :class:`AutoStep` (one decision per shape).

The mark itself is data on a lower floor (:mod:`remat_kit.marks`): the model code imports
nothing from here.

Example:
  >>> step = rk.auto(lambda params, batch: params, activations=0.5, target="h100")
  >>> step.budget.text
  'activations=0.5'
"""

from remat_kit.autoplan._budget import FORMS, Budget
from remat_kit.autoplan._decide import CATALOGUE, CHALLENGERS, decide
from remat_kit.autoplan._decision import AutoPlan
from remat_kit.autoplan._step import MAX_SHAPES, AutoStep, auto

__all__ = [
    "CATALOGUE",
    "CHALLENGERS",
    "FORMS",
    "MAX_SHAPES",
    "AutoPlan",
    "AutoStep",
    "Budget",
    "auto",
    "decide",
]
