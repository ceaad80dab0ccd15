"""remat_kit: activation rematerialization for JAX/Flax, measured for a named GPU.

Example:
  >>> import remat_kit as rk
  >>> rk.policy("minimal").name
  'minimal'
"""

from remat_kit import names
from remat_kit.policies import Policy, as_policy, decide, parse_policy, policy, policy_names
from remat_kit.wrap import remat

__all__ = [
    "Policy",
    "as_policy",
    "decide",
    "names",
    "parse_policy",
    "policy",
    "policy_names",
    "remat",
]
