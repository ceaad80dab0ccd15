"""Layer schedules: where checkpoints sit along the depth of a layer stack.

A policy says what one checkpointed block keeps; a schedule says which blocks (or
groups of blocks) are checkpointed at all:

- ``none``: every layer is its own checkpoint under the model's policy (the default).
- ``every:k``: segments of k consecutive layers; only each segment's input is kept and
  the whole segment is recomputed in the backward pass (Chen et al. 2016's segments,
  "checkpoint every k layers").
- ``sqrt``: ``every`` with k = round(sqrt(L)): O(sqrt L) stored layer inputs.
- ``nested:m``: m levels of nested segments (flax ``remat_scan`` style): memory
  ~ m * L^(1/m) layer inputs, one more forward recomputation per extra level.
- ``layers``: an explicit per-layer plan, e.g. the first 8 layers ``full`` and the rest
  ``minimal`` (selective layer checkpointing).

:func:`apply_layers` runs a stack of layers under a schedule, scanned (compile time flat
in depth) or unrolled, from one stacked parameter pytree, so the parameter layout - and
therefore every gradient - is the same whatever the schedule.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from remat_kit.errors import BadType, BadValue, unknown
from remat_kit.policies import Policy, PolicyLike, as_policy
from remat_kit.wrap import remat

__all__ = [
    "NO_SCHEDULE",
    "Run",
    "Schedule",
    "apply_layers",
    "parse_schedule",
    "schedule",
    "schedule_names",
]

_NAMES = ("every", "layers", "nested", "none", "sqrt")
#: Unrolled layer i runs in the name scope ``layers_{i}`` (see :func:`apply_layers`).
LAYER_SCOPE = "layers_"


@dataclasses.dataclass(frozen=True)
class Run:
    """Consecutive layers executed the same way.

    Attributes:
      start: first layer index.
      lengths: nesting of the run, outermost first; their product is the layer count.
        ``(n,)`` is n layers each checkpointed with ``policy``; ``(s, k)`` is s segments
        of k layers, each segment checkpointed as a whole (saving only its input) and
        its layers run under ``policy`` inside.
      policy: the per-layer policy inside the innermost level.
    """

    start: int
    lengths: tuple[int, ...]
    policy: Policy

    @property
    def layers(self) -> int:
        return math.prod(self.lengths)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Where the checkpoints sit along the depth.

    Example:
      >>> import remat_kit as rk
      >>> [r.lengths for r in rk.schedule("every", n=4).runs(10, "none")]
      [(2, 4), (1, 2)]
    """

    name: str
    n: int | None = None
    levels: int | None = None
    plan: tuple[tuple[int, int, str], ...] = ()
    rest: str | None = None
    inner: str | None = None

    @property
    def spec(self) -> str:
        """The schedule as :func:`parse_schedule` reads it back."""
        if self.name == "every":
            return f"every:{self.n}"
        if self.name == "nested":
            return f"nested:{self.levels}"
        if self.name == "layers":
            parts = [f"{a}-{b - 1}={p}" for a, b, p in self.plan]
            if self.rest:
                parts.append(f"rest={self.rest}")
            return "layers:" + ",".join(parts)
        return self.name

    def runs(self, n_layers: int, policy: PolicyLike) -> list[Run]:
        """The runs of a stack of ``n_layers`` whose per-layer policy is ``policy``.

        Raises:
          ValueError: the schedule does not fit ``n_layers`` (a plan naming layer 40 of 32).
        """
        if n_layers <= 0:
            raise BadValue(f"n_layers={n_layers} must be positive")
        base = as_policy(policy)
        # Inside a segment the layers run under the model's policy unless told otherwise.
        inner = base if self.inner is None else as_policy(self.inner)
        if self.name == "none":
            return [Run(0, (n_layers,), base)]
        if self.name in ("every", "sqrt"):
            if self.name == "every" and (self.n or 1) > n_layers:
                raise BadValue(
                    f"schedule {self.spec!r} makes segments of {self.n} layers but the model has "
                    f"{n_layers}: use every:K with K from 1 to {n_layers}",
                    param="schedule",
                )
            k = self.n if self.name == "every" else max(1, round(math.sqrt(n_layers)))
            k = min(k, n_layers)
            runs = [Run(0, (n_layers // k, k), inner)]
            if n_layers % k:
                runs.append(Run(n_layers - n_layers % k, (1, n_layers % k), inner))
            return runs
        if self.name == "nested":
            return _nested_runs(n_layers, self.levels or 2, inner)
        return self._plan_runs(n_layers, base)

    def _plan_runs(self, n_layers: int, base: Policy) -> list[Run]:
        per_layer: list[Policy | None] = [None] * n_layers
        for a, b, p in self.plan:
            if b > n_layers:
                raise BadValue(
                    f"layer plan names layers {a}-{b - 1} but the model has {n_layers} "
                    f"(valid indices 0-{n_layers - 1})",
                    param="schedule",
                )
            for i in range(a, b):
                per_layer[i] = as_policy(p)
        # Unnamed layers take "rest", else the model's policy (which may be a user's
        # callable without a catalogue name, so keep the Policy itself).
        fallback = as_policy(self.rest) if self.rest is not None else base
        chosen = [p if p is not None else fallback for p in per_layer]
        runs, start = [], 0
        for i in range(1, n_layers + 1):
            if i == n_layers or chosen[i] != chosen[start]:
                runs.append(Run(start, (i - start,), chosen[start]))
                start = i
        return runs


def _nested_runs(n_layers: int, levels: int, inner: Policy) -> list[Run]:
    # Split L into `levels` factors near L^(1/levels); layers left over by the rounding
    # run as one more, shallower run so that any depth works.
    k = max(1, round(n_layers ** (1.0 / levels)))
    lengths = [k] * levels
    while math.prod(lengths) > n_layers and lengths[0] > 1:
        lengths[0] -= 1
    main = math.prod(lengths)
    runs = [Run(0, tuple(lengths), inner)]
    if n_layers - main:
        runs.extend(
            Run(main + r.start, r.lengths, r.policy)
            for r in _nested_runs(n_layers - main, max(1, levels - 1), inner)
        )
    return runs


def schedule_names() -> list[str]:
    """The schedule kinds, sorted."""
    return sorted(_NAMES)


def schedule(
    name: str,
    *,
    n: int | None = None,
    levels: int | None = None,
    plan: Mapping[Any, str] | None = None,
    inner: str | None = None,
) -> Schedule:
    """Builds a Schedule.

    Args:
      name: ``none``, ``every``, ``sqrt``, ``nested`` or ``layers``.
      n: segment length for ``every``.
      levels: nesting depth for ``nested`` (2 or more).
      plan: for ``layers``: ``{index | range | "a-b": policy, "rest": policy}``; layers
        not named use ``rest`` or, without it, the model's policy.
      inner: the per-layer policy inside a segment for ``every``/``sqrt``/``nested``
        (default: the model's policy; with ``none`` a recomputed segment keeps all its
        layers' activations while its backward runs, as in Chen et al.).

    Returns:
      The Schedule.

    Raises:
      ValueError: unknown name, missing or bad parameters (close matches named).
      TypeError: parameters of the wrong type.

    Example:
      >>> import remat_kit as rk
      >>> rk.schedule("layers", plan={range(0, 8): "full", "rest": "minimal"}).spec
      'layers:0-7=full,rest=minimal'
    """
    if name not in _NAMES:
        raise unknown("schedule", name, _NAMES, n=2, param="schedule")
    if inner is not None:
        as_policy(inner)  # validate early
    if name == "every":
        if n is None:
            raise BadValue(
                "schedule 'every' needs n, the segment length: every:2", param="schedule"
            )
        _check_int("n", n, 1)
        return Schedule("every", n=n, inner=inner)
    if name == "nested":
        levels = 2 if levels is None else levels
        _check_int("levels", levels, 2)
        return Schedule("nested", levels=levels, inner=inner)
    if name == "layers":
        if not plan:
            raise BadValue(
                "schedule 'layers' needs a plan, e.g. "
                "plan={range(0, 8): 'full', 'rest': 'minimal'}",
                param="schedule",
            )
        return _plan_schedule(plan)
    if n is not None or levels is not None or plan is not None:
        raise BadValue(f"schedule {name!r} takes no n/levels/plan", param="schedule")
    return Schedule(name, inner=inner)


def _check_int(key: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadType(
            f"{key} must be an int, got {type(value).__name__} {value!r}", param="schedule"
        )
    if value < minimum:
        raise BadValue(f"{key}={value} must be >= {minimum}", param="schedule")


def _plan_schedule(plan: Mapping[Any, str]) -> Schedule:
    entries: list[tuple[int, int, str]] = []
    rest = None
    for key, pol in plan.items():
        if not isinstance(pol, str | Policy):
            raise BadType(
                f"plan values are policy names, got {pol!r} for {key!r}", param="schedule"
            )
        spec = as_policy(pol).spec
        if key == "rest":
            rest = spec
            continue
        if isinstance(key, bool):
            raise BadType(f"plan key {key!r} is not a layer index", param="schedule")
        if isinstance(key, int):
            a, b = key, key + 1
        elif isinstance(key, range):
            if key.step != 1:
                raise BadValue(f"plan range {key!r} must have step 1", param="schedule")
            a, b = key.start, key.stop
        elif isinstance(key, str) and "-" in key:
            lo, _, hi = key.partition("-")
            try:
                a, b = int(lo), int(hi) + 1
            except ValueError:
                raise BadValue(
                    f"plan key {key!r}: expected 'first-last', e.g. '0-7'", param="schedule"
                ) from None
        elif isinstance(key, str) and key.isdigit():
            a, b = int(key), int(key) + 1
        else:
            raise BadValue(
                f"plan key {key!r}: use a layer index, a range, 'a-b' or 'rest'", param="schedule"
            )
        if a < 0 or b <= a:
            raise BadValue(f"plan key {key!r} names no layers", param="schedule")
        entries.append((a, b, spec))
    entries.sort()
    for (a1, b1, _), (a2, _, _) in itertools.pairwise(entries):
        if a2 < b1:
            raise BadValue(
                f"plan entries overlap at layer {a2} (layers {a1}-{b1 - 1})", param="schedule"
            )
    return Schedule("layers", plan=tuple(entries), rest=rest)


def parse_schedule(spec: str | Schedule | None) -> Schedule:
    """Reads ``none``, ``sqrt``, ``every:2``, ``nested:3`` or ``layers:0-7=full,rest=minimal``.

    Raises:
      ValueError: a spec that cannot be read (the message shows the accepted forms).

    Example:
      >>> import remat_kit as rk
      >>> rk.parse_schedule("every:4").n
      4
    """
    if spec is None:
        return Schedule("none")
    if isinstance(spec, Schedule):
        return spec
    if not isinstance(spec, str):
        raise BadType(
            f"schedule must be a spec string or rk.Schedule, got {spec!r}", param="schedule"
        )
    name, _, arg = spec.strip().partition(":")
    if name not in _NAMES:
        schedule(name)  # raises, naming close matches
    if name == "every":
        return schedule("every", n=_int_arg(spec, arg))
    if name == "nested":
        return schedule("nested", levels=_int_arg(spec, arg))
    if name == "layers":
        plan: dict[str, str] = {}
        for item in arg.split(","):
            key, eq, pol = item.partition("=")
            if not eq:
                raise BadValue(
                    f"cannot read {item!r} in {spec!r}; expected 0-7=full,rest=minimal",
                    param="schedule",
                )
            plan[key.strip()] = pol.strip()
        return schedule("layers", plan=plan)
    if arg:
        raise BadValue(f"schedule {name!r} takes no argument (got {spec!r})", param="schedule")
    return schedule(name)


def _int_arg(spec: str, arg: str) -> int:
    try:
        return int(arg)
    except ValueError:
        raise BadValue(
            f"cannot read schedule {spec!r}: expected a number after ':' as in every:2, nested:3",
            param="schedule",
        ) from None


def apply_layers(
    layer: Callable[[Any, jax.Array, Any], jax.Array],
    params: Any,
    x: jax.Array,
    *,
    n_layers: int,
    schedule: Schedule | str | None = None,
    policy: PolicyLike = "none",
    scan: bool = True,
    keys: Any = None,
) -> jax.Array:
    """Runs ``n_layers`` layers over ``x`` under a schedule.

    Args:
      layer: ``layer(params_i, x, key_i) -> x``, one layer, pure.
      params: layer parameters stacked on a leading axis of length ``n_layers`` (scan)
        or a sequence of ``n_layers`` per-layer pytrees (unrolled).
      x: the input of the first layer.
      n_layers: number of layers.
      schedule: a Schedule or spec (default ``none``).
      policy: the per-layer policy (name, Policy or jax callable).
      scan: run levels as ``lax.scan`` (compile time flat in depth) or unrolled.
      keys: per-layer PRNG keys (a key array of length ``n_layers``) or None.

    Returns:
      The output of the last layer. Unrolled, layer ``i`` runs in the name scope
      ``layers_{i}``, so its ops' names (and XLA's op_name metadata) say which layer
      they belong to.

    Example:
      >>> import jax, jax.numpy as jnp, remat_kit as rk
      >>> w = jnp.ones((6, 3, 3)) * 0.1
      >>> y = rk.apply_layers(lambda p, x, k: jnp.tanh(x @ p), w, jnp.ones((2, 3)),
      ...                     n_layers=6, schedule="sqrt")
      >>> y.shape
      (2, 3)
    """
    sched = parse_schedule(schedule)
    for run in sched.runs(n_layers, policy):
        sl = slice(run.start, run.start + run.layers)
        p = jax.tree.map(lambda a, sl=sl: a[sl], params) if scan else list(params[sl])
        k = None if keys is None else keys[sl]
        x = _run_level(layer, p, k, x, run.lengths, run.policy, scan, run.start)
    return x


def _run_level(
    layer: Callable[..., jax.Array],
    params: Any,
    keys: Any,
    x: jax.Array,
    lengths: Sequence[int],
    policy: Policy,
    scan: bool,
    start: int,
) -> jax.Array:
    """Applies ``prod(lengths)`` layers, the first being layer ``start`` of the stack;
    every level but the innermost is a segment."""
    if len(lengths) == 1:
        one = remat(layer, policy, prevent_cse=not scan) if policy.is_remat else layer
        return _loop(one, params, keys, x, lengths[0], scan, start)
    outer, rest = lengths[0], tuple(lengths[1:])
    size = math.prod(rest)

    def segment(first: int) -> Callable[..., jax.Array]:
        # A segment is checkpointed whole: only its input is kept for the backward pass.
        def run(p: Any, x: jax.Array, k: Any) -> jax.Array:
            return _run_level(layer, p, k, x, rest, policy, scan, first)

        return remat(run, "full", prevent_cse=not scan)

    if scan:
        grouped = jax.tree.map(lambda a: a.reshape(outer, size, *a.shape[1:]), params)
        gkeys = None if keys is None else keys.reshape(outer, size, *keys.shape[1:])
        return _loop(segment(start), grouped, gkeys, x, outer, scan, start)
    for i in range(outer):
        p = params[i * size : (i + 1) * size]
        k = None if keys is None else keys[i * size : (i + 1) * size]
        x = segment(start + i * size)(p, x, k)
    return x


def _loop(
    fn: Callable[..., jax.Array],
    params: Any,
    keys: Any,
    x: jax.Array,
    n: int,
    scan: bool,
    start: int,
) -> jax.Array:
    if scan:

        def body(carry: jax.Array, xs: Any) -> tuple[jax.Array, None]:
            p, k = xs
            return fn(p, carry, k), None

        x, _ = jax.lax.scan(body, x, (params, keys), length=n)
        return x
    for i in range(n):
        # Unrolled, each layer's ops carry its index in their names (``layers_3/...`` in the
        # jaxpr's name stack and XLA's op_name), so a buffer can be told apart by layer.
        with jax.named_scope(f"{LAYER_SCOPE}{start + i}"):
            x = fn(params[i], x, None if keys is None else keys[i])
    return x


#: Every layer alike, as the searches and model sources name it: built once.
NO_SCHEDULE: Schedule = parse_schedule("none")
