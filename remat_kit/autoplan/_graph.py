"""NNX graph objects at the step's edge: a step that takes ``nnx.Module`` / ``nnx.Optimizer``
arguments, as ``nnx.jit`` takes them.

``nnx.jit`` splits the graph objects among a step's arguments into a graph definition and
their state (arrays) at the call, merges them back inside the traced function, and updates
the objects it was given with the state the step left. :class:`Edge` does the same around
the decision and the jitted step: the planner sees a pure step ``(state, *others)`` whose
outputs are ``(outputs, new state)``; the objects the user holds are updated after each
call, so ``model`` and ``optimizer`` change in place as under ``nnx.jit``. The graph
objects of all arguments are split together, so an object two of them share (the model an
``nnx.Optimizer`` holds) is one state, as ``nnx.jit`` keeps it.

Example:
  >>> from flax import nnx
  >>> model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
  >>> edge, pure = Edge.of((model, jnp.ones((1, 2))))
  >>> edge.nodes, len(pure)
  ((0,), 2)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from flax import nnx

__all__ = [
    "Edge",
    "is_node",
    "unwrap_nnx_jit",
]

_NODE_TYPES: dict[type, bool] = {}


def is_node(x: Any) -> bool:
    """Whether ``x`` is an NNX graph object (``nnx.graph.is_graph_node``, which asks by the
    type: remembered per type, as each call of a step asks it of every argument).

    Example:
      >>> is_node(nnx.Linear(2, 3, rngs=nnx.Rngs(0))), is_node(jnp.ones(2))
      (True, False)
    """
    t = type(x)
    got = _NODE_TYPES.get(t)
    if got is None:
        got = _NODE_TYPES[t] = bool(nnx.graph.is_graph_node(x))
    return got


@dataclasses.dataclass(frozen=True)
class Edge:
    """Where a step's graph objects are split off its arguments, and how they merge back.

    Attributes:
      graphdef: the graph definition of the graph-object arguments, taken together.
      nodes: the positions of the arguments that are graph objects.
      count: how many arguments the step takes.
    """

    graphdef: Any
    nodes: tuple[int, ...]
    count: int

    @classmethod
    def of(cls, args: tuple[Any, ...]) -> tuple[Edge | None, tuple[Any, ...]]:
        """The edge of a call with ``args`` and the pure step's arguments (the graph
        objects' state first, then the other arguments); ``(None, args)`` when no argument
        is a graph object.

        Example:
          >>> Edge.of((jnp.ones(2),))[0] is None
          True
        """
        nodes = tuple(i for i, a in enumerate(args) if is_node(a))
        if not nodes:
            return None, args
        graphdef, state = nnx.split(tuple(args[i] for i in nodes))
        pure = (state, *(a for i, a in enumerate(args) if i not in nodes))
        return cls(graphdef, nodes, len(args)), pure

    def _merged(self, pure: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        objects = nnx.merge(self.graphdef, pure[0])
        rest = iter(pure[1:])
        it = iter(objects)
        full = tuple(next(it) if i in self.nodes else next(rest) for i in range(self.count))
        return objects, full

    def step(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` as a pure step: ``(state, *others) -> (outputs, new state)``."""

        def pure(*args: Any) -> Any:
            objects, full = self._merged(args)
            out = fn(*full)
            return out, nnx.split(objects)[1]

        pure.__name__ = getattr(fn, "__name__", "step")
        return pure

    def loss(
        self, fn: Callable[..., Any], argnums: tuple[int, ...]
    ) -> tuple[Callable[..., Any], tuple[int, ...]]:
        """The loss ``fn(*(args[i] for i in argnums))`` over the pure step's arguments, and
        the pure arguments it takes (all of them: the state holds every object)."""

        def pure(*args: Any) -> Any:
            _, full = self._merged(args)
            return fn(*(full[i] for i in argnums))

        pure.__name__ = getattr(fn, "__name__", "loss")
        return pure, tuple(range(1 + self.count - len(self.nodes)))

    def donate(self, donate: Iterable[int]) -> tuple[int, ...]:
        """The pure step's donated arguments: the state when any graph object is donated."""
        donated = set(donate)
        others = [i for i in range(self.count) if i not in self.nodes]
        out = [0] if donated & set(self.nodes) else []
        return (*out, *(1 + others.index(i) for i in sorted(donated) if i in others))

    def update(self, args: tuple[Any, ...], state: Any) -> None:
        """Updates the graph objects among ``args`` with the state the step left."""
        nnx.update(tuple(args[i] for i in self.nodes), state)


def unwrap_nnx_jit(fn: Any) -> tuple[Callable[..., Any], tuple[int, ...] | None]:
    """The function inside an ``nnx.jit`` and what it donates (None: not an ``nnx.jit``, or
    its donation not readable), or ``fn`` itself.

    Example:
      >>> step = nnx.jit(lambda m, x: m(x), donate_argnums=0)
      >>> unwrap_nnx_jit(step)[1]
      (0,)
    """
    inner = getattr(fn, "fun", None)
    jitted = getattr(fn, "jitted_fn", None)
    if inner is None or jitted is None or not callable(inner):
        return fn, None
    info = getattr(jitted, "_jit_info", None)  # jax's record of the jit's options
    donate = getattr(info, "donate_argnums", None)
    return inner, None if donate is None else tuple(donate)
