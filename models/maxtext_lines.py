"""MaxText's remat vocabulary: the tensors its ``remat_policy: custom`` takes a line for, and
the config lines that set a policy (what ``plan`` prints for a MaxText model, and what
:mod:`remat_kit_models.maxtext` builds its step with).

Example:
  >>> config_lines(rk.policy("offload", offload=["decoder_layer_input"], save=["context"]))
  ('remat_policy: custom', 'decoder_layer_input: offload', 'context: device')
"""

from __future__ import annotations

from collections.abc import Collection

import remat_kit as rk

__all__ = [
    "CUSTOM_TENSORS",
    "config_lines",
]

#: The tensors MaxText's ``remat_policy: custom`` reads a ``remat|device|offload`` line for
#: (maxtext 0.2.5, ``configs/types.py``, where ``custom`` lists them; ``decoder_layer_input``
#: defaults to ``device``, the others to ``remat``; base.yml's ``engram`` line is not read).
CUSTOM_TENSORS = (
    "decoder_layer_input",
    "context",
    "mlpwi",
    "mlpwi_0",
    "mlpwi_1",
    "mlpwo",
    "moe_mlpwi_0",
    "moe_mlpwi_1",
    "moe_mlpwo",
    "moe_x_sorted",
    "moe_routing_maps",
    "query_proj",
    "key_proj",
    "value_proj",
    "kv_proj",
    "qkv_proj",
    "out_proj",
    "query_wa_proj",
    "kv_wa_proj",
    "mla_q",
    "mla_kv",
    "attention_out",
    "indexer_cutoff_threshold",
)


#: The layer's input: MaxText's custom policy keeps it on the device unless a line says remat.
_INPUT = "decoder_layer_input"


def config_lines(
    policy: rk.policies.PolicyLike, tags: Collection[str] | None = None
) -> tuple[str, ...] | None:
    """The MaxText config lines that set ``policy``, None where no config line can.

    MaxText's own ``remat_policy`` values and ``full`` are one line; a policy that saves
    and offloads tensors by name (none of jax's dot policies) is ``remat_policy: custom``
    with a line per tensor it saves or offloads, where every name is one of
    :data:`CUSTOM_TENSORS` (and ``decoder_layer_input: remat`` where it recomputes that one:
    MaxText's default keeps it on the device). ``remat_policy: custom`` recomputes every
    name it has no line for (jax's ``save_and_offload_only_these_names``).

    Args:
      policy: a policy (name, spec or ``rk.Policy``).
      tags: the checkpoint names the config's step carries (``rk.sources.tags``); None:
        any name may be carried. A name of the policy outside :data:`CUSTOM_TENSORS` that
        the step does not carry decides nothing there (``megatron``'s ``block_out``), nor
        does one the policy recomputes: neither needs a line.

    Returns:
      The lines (``key: value``), or None.

    Example:
      >>> config_lines("maxtext:remat_policy=save_qkv_proj")
      ('remat_policy: save_qkv_proj',)
      >>> config_lines("dots") is None
      True
      >>> config_lines("megatron") is None  # block_out: no line takes it
      True
      >>> config_lines("megatron", tags=["decoder_layer_input", "query_proj", "mlpwo"])
      ('remat_policy: custom', 'decoder_layer_input: device', 'query_proj: device', 'mlpwo: device')
    """
    pol = rk.as_policy(policy)
    if pol.name == "maxtext":
        return (f"remat_policy: {pol.params['remat_policy']}",)
    if pol.name == "full":
        return ("remat_policy: full",)
    if pol.params.get("dst", "pinned_host") != "pinned_host":
        return None  # MaxText offloads to pinned host memory only
    if not pol.tags:
        return None  # a dot policy
    named = [n for n in pol.tags if n in CUSTOM_TENSORS]
    for n in pol.tags:
        if n in CUSTOM_TENSORS:
            continue
        carried = tags is None or n in tags
        if carried and rk.decide(pol, n) != "recompute":
            return None  # a name the step may carry that no line keeps
    if not named or rk.checks.keeps_dots(pol.jax_policy):
        return None
    # The policy's own names first, in its order; then any other it decides on (of those
    # the step carries, where that is known: a line for another would set nothing).
    order = dict.fromkeys(
        n for n in (*named, *CUSTOM_TENSORS) if tags is None or n in tags or n == _INPUT
    )
    decided = {n: rk.decide(pol, n) for n in order}
    lines = ["remat_policy: custom"]
    if decided[_INPUT] == "recompute":
        # MaxText's default keeps it on the device; the policy recomputes it.
        lines.append("decoder_layer_input: remat")
    lines += [f"{n}: offload" for n, d in decided.items() if d == "offload"]
    lines += [f"{n}: device" for n, d in decided.items() if d == "save"]
    return tuple(lines)
