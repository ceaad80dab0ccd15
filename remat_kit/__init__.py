"""remat_kit: activation rematerialization for JAX/Flax, measured for a named GPU.

Example:
  >>> import remat_kit as rk
  >>> rk.policy("minimal").name
  'minimal'
"""

from remat_kit import names
from remat_kit.analysis import (
    MemoryReport,
    RematWarning,
    TransferEstimate,
    abstract,
    memory_report,
    transfer_estimate,
)
from remat_kit.flops import FlopCount, count_flops, count_jaxpr_flops
from remat_kit.policies import (
    Policy,
    as_policy,
    decide,
    parse_policy,
    policy,
    policy_names,
    recompute_instead,
)
from remat_kit.residuals import Residual, ResidualReport, saved_residuals
from remat_kit.schedules import (
    Run,
    Schedule,
    apply_layers,
    parse_schedule,
    schedule,
    schedule_names,
)
from remat_kit.targets import (
    Target,
    TargetError,
    configure_for_deviceless,
    custom_target,
    target,
    target_from_config,
    target_names,
)
from remat_kit.train import (
    OPTIMIZERS,
    TrainConfig,
    TrainStep,
    add_breakdown,
    build_train_step,
    make_optimizer,
)
from remat_kit.wrap import remat

__all__ = [
    "OPTIMIZERS",
    "FlopCount",
    "MemoryReport",
    "Policy",
    "RematWarning",
    "Residual",
    "ResidualReport",
    "Run",
    "Schedule",
    "Target",
    "TargetError",
    "TrainConfig",
    "TrainStep",
    "TransferEstimate",
    "abstract",
    "add_breakdown",
    "apply_layers",
    "as_policy",
    "build_train_step",
    "configure_for_deviceless",
    "count_flops",
    "count_jaxpr_flops",
    "custom_target",
    "decide",
    "make_optimizer",
    "memory_report",
    "names",
    "parse_policy",
    "parse_schedule",
    "policy",
    "policy_names",
    "recompute_instead",
    "remat",
    "saved_residuals",
    "schedule",
    "schedule_names",
    "target",
    "target_from_config",
    "target_names",
    "transfer_estimate",
]
