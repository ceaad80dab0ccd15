"""Context parallelism (``cp``): checks that a model can split its sequence, and what it costs.

Under ``cp:N`` every device of a context-parallel group holds the same samples and ``1/N`` of
each sequence. A model takes part through its activation constraints: the residual stream's
sequence (logical axis ``act_seq``) and the queries' (``act_len``) map to ``cp``; keys and
values constrained with ``None`` there are all-gathered over ``cp`` for attention. A model
that constrains no activation's sequence would be compiled with every activation whole on
every device of the group: :func:`check_sequence_split` says so before any compile.

Example:
  >>> plan = rk.parse_shard("cp:8")
  >>> mesh = plan.mesh(rk.target("h100", devices=8))
  >>> x = jax.ShapeDtypeStruct((2, 64, 16), jnp.float32)
  >>> def split(x):
  ...     with plan.activation_context(mesh):
  ...         return nn.with_logical_constraint(x, ("act_batch", "act_seq", "act_embed"))
  >>> sequence_constraints(jax.make_jaxpr(split)(x), seq=64)
  1
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax

from remat_kit._jaxpr import open_jaxpr, sub_jaxprs
from remat_kit.errors import BadValue
from remat_kit.sharding._plan import MeshPlan

__all__ = [
    "check_sequence_split",
    "collective_summary",
    "sequence_constraints",
]


def sequence_constraints(closed: Any, seq: int, axis: str = "cp") -> int:
    """How many sharding constraints of a traced program split a sequence over ``axis``.

    A constraint counts when mesh axis ``axis`` splits a dimension of ``seq`` elements (the
    sequence of a ``[batch, seq, ...]`` activation). Scans, remat and jit bodies are entered.

    Args:
      closed: a ClosedJaxpr (``jax.make_jaxpr(fn)(*args)``) or a Jaxpr.
      seq: the sequence length.
      axis: the mesh axis (default ``cp``).

    Returns:
      The number of such constraints (0: the program never splits a sequence over ``axis``).

    Example:
      >>> sequence_constraints(jax.make_jaxpr(lambda x: x * 2)(jnp.ones((2, 8))), seq=8)
      0
    """
    count = 0
    stack = [open_jaxpr(closed)]
    seen: set[int] = set()
    while stack:
        jaxpr = stack.pop()
        if id(jaxpr) in seen:
            continue
        seen.add(id(jaxpr))
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "sharding_constraint":
                count += _splits(eqn, seq, axis)
            stack.extend(open_jaxpr(j) for j in sub_jaxprs(eqn))
    return count


def check_sequence_split(
    loss: Callable[..., Any], args: Iterable[Any], plan: MeshPlan, seq: int, what: str
) -> None:
    """Raises BadValue when ``plan`` has ``cp`` but the model never splits a sequence over it.

    Traces ``loss(*args)`` (the forward pass, under the plan's activation context: the caller
    enters it inside ``loss``), without compiling, and looks for a sharding constraint that
    splits a ``seq``-long dimension over ``cp`` (:func:`sequence_constraints`).

    Args:
      loss: the micro-batch loss, entering the plan's activation context itself.
      args: its abstract arguments.
      plan: the mesh plan.
      seq: the sequence length.
      what: the model, for the message.

    Raises:
      BadValue: one line naming the model, the plan and what the model needs.

    Example:
      >>> plan = rk.parse_shard("cp:8")
      >>> x = jax.ShapeDtypeStruct((2, 64), jnp.float32)
      >>> check_sequence_split(lambda x: x.sum(), [x], plan, 64, "my_model")
      Traceback (most recent call last):
      remat_kit.errors.BadValue: cp:8 splits each sequence over 8 devices, but my_model ...
    """
    cp = plan.size("cp")
    if cp == 1:
        return
    closed = jax.make_jaxpr(loss)(*args)
    if sequence_constraints(closed, seq, "cp"):
        return
    sizes = dict(plan.axes)
    sizes["fsdp"] = sizes.get("fsdp", 1) * sizes.pop("cp")
    instead = MeshPlan(tuple(sizes.items())).spec
    raise BadValue(
        f"cp:{cp} splits each sequence over {cp} devices, but {what} constrains no "
        "activation's sequence axis: context parallelism needs a model that marks its "
        "[batch, seq, ...] activations with nn.with_logical_constraint(x, ('act_batch', "
        f"'act_seq', 'act_embed')) as the presets do; shard it without cp, e.g. {instead}",
        param="shard",
    )


def collective_summary(kernels: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """The collectives of a compiled step by kind: launches, bytes and group sizes, per step.

    Args:
      kernels: the step's kernels (``remat_kit.timing.kernels_of``; those of kind
        ``"collective"`` are read).

    A collective inside a rematerialized region (an expert layer's all-to-all under a
    policy that recomputes it, a tensor-parallel all-gather under ``full``) runs again in
    the backward pass: those launches are counted apart as well, in ``recomputed_launches``
    and ``recomputed_bytes`` (included in the totals).

    Returns:
      ``{op: {"launches": n, "bytes": moved per device per step, "groups": [sizes],
      "recomputed_launches": n, "recomputed_bytes": b}}``, ops sorted (``all-gather``,
      ``all-reduce``, ``all-to-all``, ``reduce-scatter`` ...); empty without collectives.

    Example:
      >>> from remat_kit.timing import Kernel
      >>> k = Kernel("collective", count=32, flops=0.0, bytes=1024, op="all-gather", group=4)
      >>> again = Kernel("collective", count=8, flops=0.0, bytes=1024, op="all-gather", group=4,
      ...                recompute=True)
      >>> row = collective_summary([k, again])["all-gather"]
      >>> row["launches"], row["bytes"], row["recomputed_launches"], row["recomputed_bytes"]
      (40, 40960, 8, 8192)
    """
    out: dict[str, dict[str, Any]] = {}
    for k in kernels:
        if getattr(k, "kind", None) != "collective":
            continue
        row = out.setdefault(
            k.op,
            {
                "launches": 0,
                "bytes": 0,
                "groups": set(),
                "recomputed_launches": 0,
                "recomputed_bytes": 0,
            },
        )
        moved = int(k.bytes * k.count)
        row["launches"] += int(k.count)
        row["bytes"] += moved
        row["groups"].add(int(k.group))
        if k.recompute:
            row["recomputed_launches"] += int(k.count)
            row["recomputed_bytes"] += moved
    return {op: {**row, "groups": sorted(row["groups"])} for op, row in sorted(out.items())}


def _splits(eqn: Any, seq: int, axis: str) -> int:
    sharding = eqn.params.get("sharding")
    spec = getattr(sharding, "spec", None)
    if spec is None:
        return 0
    shape = tuple(getattr(eqn.invars[0].aval, "shape", ()))
    for dim, entry in enumerate(tuple(spec)[: len(shape)]):
        axes = entry if isinstance(entry, tuple) else (entry,)
        if axis in axes and shape[dim] == seq:
            return 1
    return 0
