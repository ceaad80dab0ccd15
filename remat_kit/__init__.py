"""remat_kit: activation rematerialization for JAX/Flax, measured for a named GPU.

The public API is the names below, grouped by concept; everything else lives in the
submodules (``remat_kit.search``, ``remat_kit.peak``, ``remat_kit.policies`` ...), whose own
``__all__`` lists what they offer.

Example:
  >>> import remat_kit as rk
  >>> rk.policy("minimal").name
  'minimal'
"""

from remat_kit import checks, names, sources, tagging
from remat_kit.analysis import MemoryReport, memory_report
from remat_kit.errors import DoesNotFit, RematKitError, TargetError, UnknownName
from remat_kit.flops import count_flops
from remat_kit.peak import PeakReport, inspect
from remat_kit.policies import Policy, as_policy, decide, policy, policy_names
from remat_kit.residuals import saved_residuals
from remat_kit.schedules import Schedule, apply_layers, parse_schedule, schedule
from remat_kit.search import Workload, advise, front, max_batch, plan
from remat_kit.sharding import parse_shard, strip_boxes
from remat_kit.targets import Target, as_target, cudnn_attention_available, target, target_names
from remat_kit.train import TrainConfig, build_train_step
from remat_kit.wrap import remat

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
    "count_flops",
    "saved_residuals",
    "PeakReport",
    "inspect",
    # searching over policies, batches and GPUs
    "Workload",
    "max_batch",
    "plan",
    "front",
    "advise",
    # models nobody here wrote
    "sources",
    "tagging",
    "checks",
    # errors
    "RematKitError",
    "UnknownName",
    "DoesNotFit",
    "TargetError",
]
