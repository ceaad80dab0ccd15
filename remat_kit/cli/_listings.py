"""``remat-kit targets``, ``remat-kit policies``, ``remat-kit models``: the three catalogues."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from rich.table import Table

from remat_kit.policies import parse_policy, policy, policy_names
from remat_kit.render import (
    console,
    fitted,
    models_table,
    nodes_table,
    policies_table,
    targets_table,
    tpus_table,
)
from remat_kit.targets import (
    NODES,
    TPU_GENERATIONS,
    node_names,
    price_for,
    target,
    target_names,
)

__all__ = ["run"]

#: A spec shown beside each parameterized family (they have no meaning without parameters).
_EXAMPLES = {
    "names": "names:save=query_proj+mlpwo",
    "except": "except:names=attn_scores+attn_probs",
    "offload": "offload:offload=context,save=query_proj",
    "either": "either:a=qkv_proj,b=context",
    "maxtext": "maxtext:remat_policy=save_qkv_proj",
}


def _targets() -> tuple[Table, ...]:
    tpus = [n for n in target_names() if n in TPU_GENERATIONS]
    return (
        targets_table((name, target(name)) for name in target_names() if name not in tpus),
        nodes_table(NODES[name] for name in node_names()),
        # one chip of each: a slice is named with its size (v5p-64)
        tpus_table(
            (target(f"{n}-{TPU_GENERATIONS[n].cores_per_chip}"), price_for(n)) for n in tpus
        ),
    )


def _policies() -> tuple[Table, ...]:
    return (
        policies_table(
            (
                (name, parse_policy(_EXAMPLES[name]) if name in _EXAMPLES else policy(name))
                for name in policy_names()
            ),
            _EXAMPLES,
        ),
    )


def _models() -> tuple[Table, ...]:
    from remat_kit.cli._model import catalogue

    return (models_table(catalogue()),)


#: Each listing: its subcommand and the function that builds its tables.
_LISTINGS: dict[str, Callable[[], tuple[Table, ...]]] = {
    "targets": _targets,
    "policies": _policies,
    "models": _models,
}


def run(args: argparse.Namespace) -> int:
    """Prints the listing ``args.command`` names.

    Args:
      args: parsed arguments with ``command`` one of ``targets``, ``policies``, ``models``.

    Returns:
      The exit code (0).

    Example:
      >>> run(argparse.Namespace(command="targets", wide=False))
      targets
      ...h100-80gb...NVIDIA H100 80GB HBM3...
      0
    """
    out = console(args.wide)
    for table in _LISTINGS[args.command]():
        out.print(fitted(table, out.width))
    return 0
