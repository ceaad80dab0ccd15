"""The ``remat-kit`` catalogue listings: targets, policies and model presets as rich tables.

Each function takes (name, value) pairs in the order to show and returns a ``rich.table.Table``;
the CLI looks the catalogues up (``models`` presets included) and prints the table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rich.table import Table

from remat_kit.render._format import count_words, fmt, gib

if TYPE_CHECKING:
    from remat_kit.policies import Policy
    from remat_kit.targets import Node, Target

__all__ = [
    "models_table",
    "nodes_table",
    "policies_table",
    "targets_table",
    "tpus_table",
]


def targets_table(targets: Iterable[tuple[str, Target]]) -> Table:
    """The ``targets`` listing: memory, bandwidths and peak FLOP/s of each target.

    Args:
      targets: (name, target) pairs, in the order to show.

    Returns:
      The table.

    Example:
      >>> t = targets_table([("h100-80gb", rk.target("h100"))])
      >>> t.columns[2].header, list(t.columns[2].cells)
      ('memory GiB', ['79.18'])
    """
    table = Table(title="targets")
    for col in ("name", "device", "memory GiB", "HBM TB/s", "host link GB/s", "bf16 TFLOP/s"):
        table.add_column(col)
    for name, t in targets:
        table.add_row(
            name,
            t.description,
            gib(t.memory_bytes),
            fmt(t.hbm_bandwidth, 1e12),
            fmt(t.host_link_bandwidth, 1e9, 0),
            fmt(t.peak_bf16_flops, 1e12, 0),
        )
    return table


def tpus_table(rows: Iterable[tuple[Target, Any]]) -> Table:
    """The TPU generations: per chip and per device, the runtime's usable share, the price.

    Args:
      rows: (a one-chip target of the generation, its price or None), in the order to show.

    Returns:
      The table.

    Example:
      >>> t = tpus_table([(rk.target("v5e-1"), None)])
      >>> list(t.columns[3].cells), list(t.columns[7].cells)
      (['15.75'], ['v5e-1 ... v5e-256'])
    """
    table = Table(title="TPUs (--target v5p-64, v6e-256, v5litepod-16, v6e:8x16; --slices N)")
    cols = ("name", "device", "HBM GiB/device", "usable GiB", "HBM TB/s/chip",
            "bf16 TFLOP/s/chip", "devices/chip", "slices", "$/chip-h")  # fmt: skip
    for col in cols:
        table.add_column(col)
    for t, price in rows:
        layout = t.tpu_slice.layout
        per_chip = layout.devices_per_chip
        first = f"{t.name}-{layout.cores_per_chip}"
        table.add_row(
            t.name,
            t.description,
            gib(t.memory_bytes),
            gib(t.usable_bytes),
            fmt(t.hbm_bandwidth * per_chip, 1e12),
            fmt(t.peak_bf16_flops * per_chip, 1e12, 0),
            str(per_chip),
            f"{first} ... {t.name}-{layout.max_chips * layout.cores_per_chip}",
            "-" if price is None else f"{price.usd_per_gpu_hour:.2f} ({price.date})",
        )
    table.caption = (
        "figures: Cloud TPU's system-architecture pages (cloud.google.com/tpu/docs/v4, v5e, "
        "v5p, v6e, tpu7x); usable = HBM less libtpu's reserve, the bytes_limit jax reports "
        "(measured deviceless); prices: Cloud TPU on demand, us-central (no TPU7x price found)"
    )
    return table


def nodes_table(nodes: Iterable[Node]) -> Table:
    """The machines GPUs come in (``--node``): NVLink domain and GPU network per node.

    Args:
      nodes: the nodes, in the order to show.

    Returns:
      The table.

    Example:
      >>> t = nodes_table([rk.targets.node("a3-mega")])
      >>> list(t.columns[5].cells), list(t.columns[6].cells)
      (['8 x 200'], ['25.0'])
    """
    table = Table(title="nodes (--node)")
    for col in ("name", "target", "GPUs", "NVLink domain", "NVLink GB/s", "GPU NICs x Gb/s",
                "network GB/s per GPU", "transport"):  # fmt: skip
        table.add_column(col)
    for n in nodes:
        table.add_row(
            n.name,
            n.gpu,
            str(n.gpus),
            str(n.nvlink_domain),
            fmt(n.nvlink, 1e9, 0),
            f"{n.nics} x {n.nic_gbps:g}",
            fmt(n.network_per_gpu, 1e9, 1),
            n.transport,
        )
    return table


def policies_table(policies: Iterable[tuple[str, Policy]], examples: Mapping[str, str]) -> Table:
    """The ``policies`` listing: each name and what it keeps.

    Args:
      policies: (name, policy) pairs; a parameterized family's policy is its example's.
      examples: a spec per parameterized family, shown beside its name.

    Returns:
      The table.

    Example:
      >>> t = policies_table([("full", rk.policy("full"))], {})
      >>> list(t.columns[1].cells)
      ['save nothing inside a block: keep its input, recompute all of it']
    """
    table = Table(title="policies (rk.policy(name) / --policy NAME or NAME:key=a+b)")
    table.add_column("name")
    table.add_column("what it keeps")
    for name, p in policies:
        shown = f"{name}  (e.g. {examples[name]})" if name in examples else name
        table.add_row(shown, p.description)
    return table


def models_table(configs: Iterable[tuple[str, Any]]) -> Table:
    """The ``models`` listing: size and shape of each preset.

    Args:
      configs: (name, ``models.ModelConfig``) pairs, in the order to show.

    Returns:
      The table.

    Example:
      >>> import remat_kit_models as models
      >>> t = models_table([("llama3-8b", models.get_config("llama3-8b"))])
      >>> [list(c.cells)[0] for c in t.columns]
      ['llama3-8b', 'llama', '8.03 B', '32', '4096', '32/8', '14336', '128256']
    """
    table = Table(title="model presets (override with --layers/--width/--heads/--ff/--vocab)")
    for col in ("name", "family", "params", "layers", "d_model", "heads/kv", "d_ff", "vocab"):
        table.add_column(col)
    for name, c in configs:
        table.add_row(
            name,
            c.family,
            count_words(c.param_count()),  # a tiny preset's 0.53 M, not 0.00 B
            str(c.n_layers),
            str(c.d_model),
            f"{c.n_heads}/{c.n_kv_heads}",
            str(c.d_ff),
            str(c.vocab_size),
        )
    return table
