"""remat_kit: activation rematerialization for JAX/Flax, measured for a named GPU.

The public API is the names below, grouped by concept; everything else lives in the
submodules (``remat_kit.search``, ``remat_kit.peak``, ``remat_kit.policies`` ...), whose own
``__all__`` lists what they offer.

The names are imported on first use (PEP 562), so ``import remat_kit`` (and the
``remat-kit --help`` of the CLI) does not start jax; ``rk.search``, ``rk.train`` and the other
submodules load the same way.

Example:
  >>> import remat_kit as rk
  >>> rk.policy("minimal").name
  'minimal'
"""

from typing import TYPE_CHECKING

from remat_kit._lazy import loader

if TYPE_CHECKING:  # what the names below are, for readers and type checkers
    from remat_kit import checks, marks, names, sources, tagging, timing
    from remat_kit.analysis import MemoryReport, memory_report
    from remat_kit.autoplan import AutoPlan, AutoStep, auto
    from remat_kit.errors import (
        AutoOutsideStep,
        BadValue,
        BudgetOverDevice,
        DoesNotFit,
        NoAutoBlock,
        RematKitError,
        RematWarning,
        TargetError,
        UnknownName,
    )
    from remat_kit.flops import count_flops
    from remat_kit.peak import PeakReport, inspect
    from remat_kit.policies import Policy, as_policy, decide, policy, policy_names
    from remat_kit.residuals import saved_residuals
    from remat_kit.schedules import Schedule, apply_layers, parse_schedule, schedule
    from remat_kit.search import advise, fit, front, max_batch, plan
    from remat_kit.sharding import parse_shard, strip_boxes
    from remat_kit.sources import Workload
    from remat_kit.targets import (
        Target,
        as_target,
        cudnn_attention_available,
        target,
        target_names,
    )
    from remat_kit.train import TrainConfig, build_train_step
    from remat_kit.wrap import remat

#: Where each public name lives: the submodule it is imported from on first use (None: the
#: name is that submodule).
_HOME: dict[str, str | None] = {
    "checks": None,
    "marks": None,
    "names": None,
    "sources": None,
    "tagging": None,
    "timing": None,
    "MemoryReport": "analysis",
    "memory_report": "analysis",
    "AutoPlan": "autoplan",
    "AutoStep": "autoplan",
    "auto": "autoplan",
    "AutoOutsideStep": "errors",
    "BadValue": "errors",
    "BudgetOverDevice": "errors",
    "DoesNotFit": "errors",
    "RematKitError": "errors",
    "RematWarning": "errors",
    "TargetError": "errors",
    "NoAutoBlock": "errors",
    "UnknownName": "errors",
    "count_flops": "flops",
    "PeakReport": "peak",
    "inspect": "peak",
    "Policy": "policies",
    "as_policy": "policies",
    "decide": "policies",
    "policy": "policies",
    "policy_names": "policies",
    "saved_residuals": "residuals",
    "Schedule": "schedules",
    "apply_layers": "schedules",
    "parse_schedule": "schedules",
    "schedule": "schedules",
    "Workload": "sources",
    "advise": "search",
    "fit": "search",
    "front": "search",
    "max_batch": "search",
    "plan": "search",
    "parse_shard": "sharding",
    "strip_boxes": "sharding",
    "Target": "targets",
    "as_target": "targets",
    "cudnn_attention_available": "targets",
    "target": "targets",
    "target_names": "targets",
    "TrainConfig": "train",
    "build_train_step": "train",
    "remat": "wrap",
}


__getattr__ = loader(__name__, _HOME, globals())


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [  # noqa: RUF022 -- grouped by concept, in the order data flows
    # what a checkpointed block keeps
    "names",
    "Policy",
    "policy",
    "policy_names",
    "as_policy",
    "decide",
    "remat",
    # where checkpoints sit along the depth
    "Schedule",
    "schedule",
    "parse_schedule",
    "apply_layers",
    # where memory is measured
    "Target",
    "target",
    "target_names",
    "as_target",
    "cudnn_attention_available",
    # the step and its sharding
    "TrainConfig",
    "build_train_step",
    "parse_shard",
    "strip_boxes",
    # what XLA says about it
    "MemoryReport",
    "memory_report",
    "timing",
    "count_flops",
    "saved_residuals",
    "PeakReport",
    "inspect",
    # searching over policies, batches and GPUs
    "Workload",
    "fit",
    "max_batch",
    "plan",
    "front",
    "advise",
    # remat decided in the run, under a memory budget
    "marks",
    "auto",
    "AutoStep",
    "AutoPlan",
    # models nobody here wrote
    "sources",
    "tagging",
    "checks",
    # errors and warnings
    "RematKitError",
    "BadValue",
    "UnknownName",
    "DoesNotFit",
    "TargetError",
    "BudgetOverDevice",
    "NoAutoBlock",
    "AutoOutsideStep",
    "RematWarning",
]
