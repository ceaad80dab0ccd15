"""Mesh plans: which axes (dp, fsdp, ep, cp, tp) a ``--shard`` spec names, and their logical rules.

A factory's model, whose parameters carry no axis names, takes the data axes alone
(:func:`check_data_parallel`).

Example:
  >>> plan = parse_shard("fsdp:2,cp:4")
  >>> plan.spec, plan.devices, plan.data_size, plan.seq_ways
  ('fsdp:2,cp:4', 8, 2, 4)
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import re
from collections.abc import Iterator
from typing import Any

import flax.linen as nn
import jax
from jax.sharding import Mesh

from remat_kit.errors import BadType, BadValue, OpenShardAxis
from remat_kit.targets import Target

__all__ = [
    "ACTIVATION_AXES",
    "PARAM_AXES",
    "STRATEGIES",
    "MeshPlan",
    "check_data_parallel",
    "parse_shard",
]

#: Mesh axis kinds, in the order they are laid out on the mesh (the last varies fastest over
#: the device ids, so it lands on the devices of one host): the data axes (``dp``, ``fsdp``)
#: outermost, across hosts; then ``ep`` (expert parallelism: a data axis whose devices also
#: split the experts, with an all-to-all dispatch and combine in every MoE layer); then
#: ``cp``, whose all-gathers of keys and values sit in every attention layer; ``tp`` last,
#: whose collectives sit in every block. The last three want NVLink: with ``ep * cp * tp``
#: at most the devices of one host, each group stays on one host.
STRATEGIES: tuple[str, ...] = ("dp", "fsdp", "ep", "cp", "tp")

#: Logical names of parameter dimensions the models use (Flax ``with_logical_partitioning``).
PARAM_AXES: tuple[str, ...] = (
    "vocab",
    "embed",
    "heads",
    "kv_heads",
    "head_dim",
    "mlp",
    "norm",
    "layers",
    "pos",
    "lora_in",
    "lora_rank",
    "lora_out",
    "exp",
)

#: Logical names of activation dimensions the models constrain (``nn.with_logical_constraint``).
#: ``act_seq`` is the sequence axis of the residual stream between blocks (split over ``cp``,
#: or without ``cp`` over ``tp``: Megatron's sequence parallelism); ``act_len`` the sequence
#: axis inside a block, where ``tp`` splits the heads or the MLP width (split over ``cp``):
#: queries, attention outputs, the MLP's hidden activations and the logits. Keys and values
#: that attention reads are constrained with ``None`` there: the whole sequence, gathered.
ACTIVATION_AXES: tuple[str, ...] = (
    "act_batch",
    "act_seq",
    "act_len",
    "act_embed",
    "act_heads",
    "act_kv_heads",
    "act_mlp",
    "act_vocab",
    "act_exp",
)

_EXAMPLES = "e.g. dp:8, fsdp:8, tp:8, cp:8, ep:8, fsdp:4,tp:2, fsdp:2,cp:4, fsdp:2,ep:4"


@dataclasses.dataclass(frozen=True)
class MeshPlan:
    """Mesh axes and sizes of a sharding strategy, e.g. ``fsdp:4,tp:2``.

    Build one with :func:`parse_shard`. Axes are kept in :data:`STRATEGIES` order whatever
    order the spec names them in.

    Attributes:
      axes: ``((kind, size), ...)`` with kinds from :data:`STRATEGIES`, each at most once.

    Example:
      >>> dict(MeshPlan((("fsdp", 8),)).rules())["act_batch"]
      'fsdp'
    """

    axes: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        if not self.axes:
            raise BadValue(f"a mesh plan needs at least one axis ({_EXAMPLES})", param="shard")
        seen: set[str] = set()
        for kind, size in self.axes:
            if kind not in STRATEGIES:
                raise BadValue(
                    f"unknown sharding axis {kind!r}; valid: {', '.join(STRATEGIES)}", param="shard"
                )
            if kind in seen:
                raise BadValue(
                    f"sharding axis {kind!r} appears twice in {self.axes}", param="shard"
                )
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise BadValue(
                    f"size of sharding axis {kind!r} must be a positive int: {size!r}",
                    param="shard",
                )
            seen.add(kind)
        ordered = tuple(sorted(self.axes, key=lambda a: STRATEGIES.index(a[0])))
        object.__setattr__(self, "axes", ordered)

    @property
    def spec(self) -> str:
        """The plan as :func:`parse_shard` reads it back, e.g. ``"fsdp:4,tp:2"``."""
        return ",".join(f"{k}:{n}" for k, n in self.axes)

    @property
    def axis_names(self) -> tuple[str, ...]:
        """Mesh axis names (the kinds), in mesh order."""
        return tuple(k for k, _ in self.axes)

    @property
    def shape(self) -> tuple[int, ...]:
        """Mesh shape, in mesh order."""
        return tuple(n for _, n in self.axes)

    @property
    def devices(self) -> int:
        """Devices the mesh spans: the product of the sizes."""
        return math.prod(self.shape)

    def size(self, kind: str) -> int:
        """Size of axis ``kind`` (1 when the plan has no such axis)."""
        return dict(self.axes).get(kind, 1)

    @property
    def data_axes(self) -> tuple[str, ...]:
        """The axes that split the batch (``dp``, ``fsdp``, ``ep``; not ``cp``, whose devices
        share their samples and split each sequence).

        ``ep`` is one: outside the experts its devices hold different samples, as MaxText's
        ``expert`` axis does; each MoE layer's all-to-all sends every token to the device
        of its expert and back.
        """
        return tuple(k for k in self.axis_names if k in ("dp", "fsdp", "ep"))

    @property
    def data_size(self) -> int:
        """Ways the batch is split: the global batch must be a multiple of it."""
        return math.prod(self.size(k) for k in self.data_axes)

    @property
    def weight_axes(self) -> tuple[str, ...]:
        """The axes that split the model width (``embed``) of weights, gradients and optimizer
        state, ZeRO-3 style: ``fsdp``, ``ep`` and ``cp`` together (as MaxText shards ``embed``
        over its ``fsdp``, ``expert`` and ``context`` axes). An expert weight is split over
        ``ep`` by its experts instead, and its width over the others."""
        return tuple(k for k in self.axis_names if k in ("fsdp", "ep", "cp"))

    @property
    def seq_axes(self) -> tuple[str, ...]:
        """The axes that split the residual stream's sequence between blocks: ``cp``, or
        ``tp`` (sequence parallelism) in a plan without ``cp``.

        Not both: with the sequence over ``cp`` x ``tp`` XLA's partitioner cannot bring the
        weight gradients (partial sums over both) to the weights' split (``embed`` over
        ``cp``, heads over ``tp``) and replicates them whole ("Involuntary full
        rematerialization", 8 times per step for llama3-8b at ``cp:4,tp:2``, with 11 times
        the all-gathered bytes); with ``cp``, ``tp`` splits the heads and the MLP only.
        """
        if "cp" in self.axis_names:
            return ("cp",)
        return ("tp",) if "tp" in self.axis_names else ()

    @property
    def seq_ways(self) -> int:
        """Ways the residual stream's sequence is split: ``seq`` must be a multiple of it."""
        return math.prod(self.size(k) for k in self.seq_axes)

    def rules(self) -> tuple[tuple[str, Any], ...]:
        """Flax logical-axis rules: every name of :data:`PARAM_AXES` and :data:`ACTIVATION_AXES`.

        Names that this plan does not split map to None, so a constraint on them is explicit
        (replicated) rather than skipped.

        Flax takes the first rule of a name whose mesh axes are still free in the array. With
        ``ep``, the experts' rules come first (an expert weight's ``exp`` and dispatched
        tokens' ``act_exp`` take ``ep``), and ``embed`` and ``act_batch`` have a second rule
        without ``ep``, for the arrays where the experts took it.

        Returns:
          ``((logical_name, mesh_axis | tuple of mesh axes | None), ...)`` for
          ``nn.logical_axis_rules`` / ``nn.logical_to_mesh_axes``.

        Example:
          >>> dict(parse_shard("fsdp:4,tp:2").rules())["heads"]
          'tp'
          >>> rules = dict(parse_shard("fsdp:2,cp:2,tp:2").rules())
          >>> rules["act_seq"], rules["act_len"], rules["embed"], rules["heads"]
          ('cp', 'cp', ('fsdp', 'cp'), 'tp')
          >>> [r for r in parse_shard("fsdp:2,ep:4").rules() if r[0] in ("exp", "embed")]
          [('exp', 'ep'), ('embed', ('fsdp', 'ep')), ('embed', 'fsdp')]
        """
        tp = "tp" if "tp" in self.axis_names else None
        cp = "cp" if "cp" in self.axis_names else None
        ep = "ep" if "ep" in self.axis_names else None
        experts = {"exp": ep, "act_exp": ep}
        mapping = {
            "act_batch": _one(self.data_axes),
            "act_seq": _one(self.seq_axes),
            "act_len": cp,
            "act_embed": None,
            "act_heads": tp,
            "act_kv_heads": tp,
            "act_mlp": tp,
            "act_vocab": tp,
            "vocab": tp,
            "heads": tp,
            "kv_heads": tp,
            "mlp": tp,
            "embed": _one(self.weight_axes),
            "head_dim": None,
            "norm": None,
            "layers": None,
            "pos": None,
            "lora_in": None,
            "lora_rank": None,
            "lora_out": None,
        }
        rules = [*experts.items()]
        for name, target in mapping.items():
            rules.append((name, target))
            if ep and name in ("embed", "act_batch"):
                rules.append((name, _one(tuple(a for a in _axes(target) if a != ep))))
        return tuple(rules)

    def check_seq(self, seq: int) -> None:
        """Raises BadValue unless ``seq`` splits over the sequence axis (``cp``, else ``tp``).

        Checked from the numbers alone, before any trace or compile.

        Args:
          seq: tokens per sequence.

        Raises:
          BadValue: one line naming ``seq``, the axes and the nearest valid lengths.

        Example:
          >>> parse_shard("cp:4,tp:2").check_seq(4096)
          >>> parse_shard("cp:8").check_seq(1020)
          Traceback (most recent call last):
          remat_kit.errors.BadValue: seq=1020 does not split over cp:8 ...
        """
        ways = self.seq_ways
        if seq % ways == 0:
            return
        (kind,) = self.seq_axes
        why = {"cp": "context parallelism", "tp": "sequence parallelism between blocks"}[kind]
        below = seq // ways * ways
        near = [n for n in (below, below + ways) if n > 0]
        raise BadValue(
            f"seq={seq} does not split over {kind}:{ways} ({why} splits each sequence {ways} "
            f"ways): use a sequence length that is a multiple of {ways}, e.g. "
            f"{' or '.join(map(str, near))}",
            param="seq",
        )

    def check_experts(self, n_experts: int) -> None:
        """Raises BadValue unless ``ep`` splits ``n_experts`` evenly (before any compile).

        Args:
          n_experts: routed experts per MoE layer (0: a dense model, which ``ep`` cannot
            split: its devices would only be a data axis).

        Raises:
          BadValue: one line naming the expert count, ``ep`` and the sizes that divide it.

        Example:
          >>> parse_shard("ep:8").check_experts(128)
          >>> parse_shard("ep:3").check_experts(8)
          Traceback (most recent call last):
          remat_kit.errors.BadValue: ep:3 does not split 8 experts ...
        """
        ways = self.size("ep")
        if ways == 1:
            return
        if n_experts <= 0:
            raise BadValue(
                f"ep:{ways} splits the experts of a mixture-of-experts model, and this model "
                "has none: use dp or fsdp for its data axis",
                param="shard",
            )
        if n_experts % ways:
            valid = [d for d in range(2, n_experts + 1) if n_experts % d == 0]
            raise BadValue(
                f"ep:{ways} does not split {n_experts} experts evenly: use an ep size in {valid}",
                param="shard",
            )

    def mesh(self, target: Target) -> Mesh:
        """The device mesh of this plan on ``target`` (compile-only devices for GPU targets).

        Args:
          target: a Target whose ``devices`` equals :attr:`devices`.

        Returns:
          A :class:`jax.sharding.Mesh` with axes :attr:`axis_names` of sizes :attr:`shape`.

        Raises:
          ValueError: the plan's device count differs from the target's.
          remat_kit.TargetError: the GPU target cannot be compiled for here.

        Example:
          >>> dict(parse_shard("fsdp:8").mesh(rk.target("h100", devices=8)).shape)
          {'fsdp': 8}
        """
        self.check_devices(target.devices)
        return target.mesh(self.axis_names, self.shape)

    def check_devices(self, devices: int) -> None:
        """Raises ValueError unless the sizes multiply to ``devices``.

        Example:
          >>> parse_shard("fsdp:8").check_devices(8)
        """
        if self.devices != devices:
            raise BadValue(
                f"mesh {self.spec} holds {self.devices} devices but the target has {devices}: "
                f"the sizes must multiply to {devices} ({_suggest(devices)})",
                param="shard",
            )

    @contextlib.contextmanager
    def activation_context(self, mesh: Mesh) -> Iterator[None]:
        """Makes the models' ``nn.with_logical_constraint`` calls act on ``mesh``.

        Usable while tracing (inside ``jax.jit``): it sets the abstract mesh and Flax's logical
        axis rules, not the concrete device context.

        Example:
          >>> plan = parse_shard("fsdp:8")
          >>> dense = nn.Dense(16)
          >>> params = jax.eval_shape(dense.init, jax.random.key(0), jnp.ones((8, 8)))
          >>> with plan.activation_context(plan.mesh(rk.target("h100", devices=8))):
          ...     jax.eval_shape(dense.apply, params, jnp.ones((8, 8))).shape
          (8, 16)
        """
        with (
            jax.sharding.use_abstract_mesh(mesh.abstract_mesh),
            nn.logical_axis_rules(self.rules()),
        ):
            yield


def _read_axis(item: str, spec: str) -> tuple[str, int | None]:
    """One ``kind[:size]`` item of ``spec``: its axis and size (None where left open)."""
    kind, colon, size = (p.strip() for p in item.partition(":"))
    if kind not in STRATEGIES:
        close = difflib.get_close_matches(kind, STRATEGIES, n=1)
        hint = f" Did you mean {close[0]}?" if close else ""
        raise BadValue(
            f"unknown sharding axis {kind!r} in {spec!r}.{hint} Valid: "
            f"{', '.join(STRATEGIES)} ({_EXAMPLES})",
            param="shard",
        )
    if not colon:
        return kind, None
    if not size.isdigit() or int(size) < 1:
        raise BadValue(
            f"cannot read size {size!r} of axis {kind!r} in {spec!r}: expected a positive int",
            param="shard",
        )
    return kind, int(size)


def parse_shard(spec: str | MeshPlan, devices: int | None = None) -> MeshPlan:
    """Reads a sharding spec: ``dp:8``, ``fsdp:8``, ``tp:8``, ``cp:8``, ``fsdp:4,tp:2``, ...

    Axes are separated by ``,`` or ``+``. One axis may leave its size out (``fsdp`` or
    ``fsdp,tp:2``): it takes the devices the others leave.

    Args:
      spec: the spec, or a MeshPlan (returned as is, after the device check).
      devices: the target's device count; when given, the sizes must multiply to it.

    Returns:
      The MeshPlan.

    Raises:
      ValueError: an unknown axis, a bad or missing size, an axis named twice, or sizes that
        do not multiply to ``devices`` (one line naming the values and valid choices).
      OpenShardAxis: (a ValueError) sizes left open without ``devices``, or more than one.

    Example:
      >>> parse_shard("tp:2,fsdp:4").spec
      'fsdp:4,tp:2'
      >>> parse_shard("fsdp", devices=16).spec
      'fsdp:16'
      >>> parse_shard("cp:4,fsdp:2").data_size  # cp's devices share their samples
      2
    """
    if isinstance(spec, MeshPlan):
        if devices is not None:
            spec.check_devices(devices)
        return spec
    if not isinstance(spec, str):
        raise BadType(
            f"shard spec must be a str or MeshPlan, got {type(spec).__name__}", param="shard"
        )
    items = [s.strip() for s in re.split(r"[,+]", spec.strip().lower()) if s.strip()]
    if not items:
        raise BadValue(f"empty shard spec {spec!r} ({_EXAMPLES})", param="shard")
    axes = [_read_axis(item, spec) for item in items]
    kinds = [k for k, _ in axes]
    dups = sorted({k for k in kinds if kinds.count(k) > 1})
    if dups:
        raise BadValue(f"sharding axis {', '.join(dups)} named twice in {spec!r}", param="shard")
    open_axes = [k for k, n in axes if n is None]
    if open_axes:
        if len(open_axes) > 1 or devices is None:
            raise OpenShardAxis(
                f"shard spec {spec!r} leaves the size of {', '.join(open_axes)} open: give sizes "
                f"({_EXAMPLES}); only one axis may be left open, and only with a device count",
                spec=spec,
                open_axes=open_axes,
            )
        known = math.prod(n for _, n in axes if n is not None)
        if devices % known:
            raise BadValue(
                f"shard spec {spec!r}: the given sizes hold {known} devices, which does not "
                f"divide the target's {devices} ({_suggest(devices)})",
                param="shard",
            )
        axes = [(k, devices // known if n is None else n) for k, n in axes]
    plan = MeshPlan(tuple((k, int(n)) for k, n in axes))  # type: ignore[arg-type]
    if devices is not None:
        plan.check_devices(devices)
    return plan


#: The mesh axes a factory's step may be split over: the batch and, by shape, the weights.
DATA_PARALLEL = ("dp", "fsdp")


def check_data_parallel(shard: str, spec: str) -> None:
    """Refuses a mesh plan a factory's model cannot take: one with a model axis.

    Args:
      shard: the plan, ``fsdp:8`` (sizes may be left open).
      spec: the factory, for the message.

    Raises:
      BadValue: naming the axes and what a factory takes.

    Example:
      >>> check_data_parallel("fsdp:4,tp:2", "f.py:model")
      Traceback (most recent call last):
      remat_kit.errors.BadValue: f.py:model: tp:2 splits tensors by what they mean...
    """
    parts = [p.strip() for p in shard.replace("+", ",").split(",")]
    model_axes = [p for p in parts if p.split(":")[0] not in DATA_PARALLEL]
    if model_axes:
        raise BadValue(
            f"{spec}: {','.join(model_axes)} splits tensors by what they mean, which a "
            "factory's parameters do not say (no axis names); a factory takes dp and fsdp "
            "(fsdp splits each weight along its largest dimension it divides)",
            param="shard",
        )


def _axes(target: Any) -> tuple[str, ...]:
    # A rule's target as a tuple of mesh axes.
    if target is None:
        return ()
    return target if isinstance(target, tuple) else (target,)


def _one(axes: tuple[str, ...]) -> Any:
    # A rule's target: None, one mesh axis, or a tuple of them (split over their product).
    return (axes[0] if len(axes) == 1 else axes) if axes else None


def _suggest(devices: int) -> str:
    options = [f"fsdp:{devices}", f"dp:{devices}"]
    if devices % 2 == 0 and devices > 2:
        options.append(f"fsdp:{devices // 2},tp:2")
    return "e.g. " + " or ".join(options)
