"""Names a reader knows a buffer by: checkpoint tags, Flax module paths and layers.

Checkpoint names (``checkpoint_name`` tags) do not reach HLO; they are recovered from
the jaxpr, whose tagged values are matched to HLO ops by module path and op. The module
path comes from the jax name stack that both carry (``op_name`` in HLO metadata).

Example:
  >>> module_path("jit(step)/transpose(jvp(Llama))/decoder/layers_0/attention/dot_general")
  ('Llama', 'decoder', 'layers_0', 'attention', 'dot_general')
  >>> layer_of(("Llama", "decoder", "layers_0"), scanned=False)
  'layers_0'
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from remat_kit._jaxpr import open_jaxpr, sub_jaxprs, tag_of
from remat_kit.peak._parsers import xla_dtype

__all__ = [
    "INPUT_KEY",
    "NON_LAYER",
    "SCANNED_LAYERS",
    "STACK",
    "Tag",
    "layer_of",
    "match_tag",
    "module_path",
    "sliced_sibling",
    "tag_index",
]


_STRUCTURAL = {
    "while",
    "body",
    "cond",
    "closed_call",
    "core_call",
    "checkpoint",
    "remat",
    "remat2",
    "rematted_computation",
    "eval_jaxpr",
    "scan",
    "custom_jvp_call",
    "custom_vjp_call",
}
_WRAPPER = re.compile(r"^(?:jvp|transpose|vmap|batched|remat|checkpoint)\((.*)\)$")


def module_path(op_name: str) -> tuple[str, ...]:
    """jax op_name/name stack -> Flax module path and op, transforms and calls stripped."""
    out = []
    for seg in op_name.split("/"):
        while True:
            m = _WRAPPER.match(seg)
            if not m:
                break
            seg = m.group(1)
        if not seg or seg in _STRUCTURAL or seg.startswith(("jit(", "pjit(")):
            continue
        out.append(seg)
    return tuple(out)


#: The key of a tagged value that enters a (scan) body as an input, not made inside it.
INPUT_KEY = ("<input>",)
_PASS_THROUGH = {"convert_element_type", "reduce_precision", "copy", "copy_p", "reshape", "squeeze"}


@dataclasses.dataclass(frozen=True)
class Tag:
    """A ``checkpoint_name`` tag and the size and dtype of the value it names."""

    name: str
    elements: int
    dtype: str


def tag_index(closed: Any) -> dict[tuple[str, ...], list[Tag]]:
    """Module path + op of each tagged value's producer -> its checkpoint names.

    Args:
      closed: a ClosedJaxpr (``jax.make_jaxpr(fn)(*args)``); sub-jaxprs are walked.

    Returns:
      ``module_path(...)`` key -> the tags of values its op produced.

    Example:
      >>> from jax.ad_checkpoint import checkpoint_name
      >>> f = lambda a: jnp.sin(checkpoint_name(a @ a, "mlpwo"))
      >>> tag_index(jax.make_jaxpr(f)(jnp.ones((8, 8))))
      {('dot_general',): [Tag(name='mlpwo', elements=64, dtype='f32')]}
    """
    index: dict[tuple[str, ...], list[Tag]] = {}

    def walk(jaxpr: Any, prefix: str) -> None:
        producers: dict[Any, Any] = {}
        for eqn in jaxpr.eqns:
            stack = f"{prefix}/{eqn.source_info.name_stack}"
            for v in eqn.outvars:
                producers[v] = eqn
            tag = tag_of(eqn)
            if tag is not None:
                src = eqn.invars[0]
                prod = producers.get(src)
                while prod is not None and prod.primitive.name in _PASS_THROUGH:
                    keys = [
                        module_path(f"{prefix}/{prod.source_info.name_stack}/{prod.primitive.name}")
                    ]
                    _add_tag(index, keys[0], tag, src.aval)
                    src = prod.invars[0]
                    prod = producers.get(src)
                if prod is not None:
                    key = module_path(
                        f"{prefix}/{prod.source_info.name_stack}/{prod.primitive.name}"
                    )
                    _add_tag(index, key, tag, src.aval)
                elif hasattr(src, "aval"):  # a tagged input of a (scan) body
                    _add_tag(index, INPUT_KEY, tag, src.aval)
            for sub in sub_jaxprs(eqn):
                walk(open_jaxpr(sub), stack)

    walk(closed.jaxpr, "")
    return index


def _add_tag(
    index: dict[tuple[str, ...], list[Tag]], key: tuple[str, ...], name: str, aval: Any
) -> None:
    if not key or not hasattr(aval, "shape"):
        return
    tag = Tag(str(name), int(np.prod(aval.shape, dtype=np.int64)), xla_dtype(np.dtype(aval.dtype)))
    entries = index.setdefault(key, [])
    if tag not in entries:
        entries.append(tag)


def match_tag(
    tags: Mapping[tuple[str, ...], list[Tag]], key: tuple[str, ...], elements: int, dtype: str
) -> str | None:
    """The checkpoint name(s) at ``key`` of a value this size ("a|b" when two fit), or None."""
    names = sorted(
        {t.name for t in tags.get(key, ()) if t.elements == elements and t.dtype == dtype}
    )
    if not names:
        # The same op in another dtype (a convert fused into the producer).
        names = sorted({t.name for t in tags.get(key, ()) if t.elements == elements})
    return "|".join(names) if names else None


def sliced_sibling(
    tags: Mapping[tuple[str, ...], list[Tag]],
    key: tuple[str, ...],
    window: Sequence[tuple[int, int]],
    elements: int,
) -> tuple[str, ...] | None:
    """The key of the tagged op whose output a slice of a merged op holds, or None.

    Newer XLA merges sibling ops that share an input (the ``wi_0`` and ``wi_1`` matmuls of a
    gated MLP, or q/k/v projections) into one op over concatenated weights and slices its
    output; every slice keeps the first op's name (``key``). Siblings sit under the same
    parent module with the same op, in program order (the order of ``tags``), so the slice's
    offset along the cut dimension says whose output it is.

    Args:
      tags: the tag index (:func:`tag_index`).
      key: the module path and op the slice's metadata names.
      window: the slice's ``(start, limit)`` per dimension.
      elements: the slice's element count.

    Returns:
      The sibling's key; None for a slice at offset 0 (the first sibling, ``key`` itself),
      for a window cut along more than one dimension, or where no sibling of the slice's
      size starts there.

    Example:
      >>> t = [Tag("a", 8, "bf16")]
      >>> sliced_sibling({("m", "x", "dot"): t, ("m", "y", "dot"): t},
      ...                ("m", "x", "dot"), ((0, 2), (4, 8)), 8)
      ('m', 'y', 'dot')
    """
    cut = [(a, b) for a, b in window if a > 0]
    if len(cut) != 1 or key not in tags:
        return None
    start, limit = cut[0]
    per_unit, rest = divmod(elements, limit - start)  # elements per step along the cut
    if rest or per_unit <= 0:
        return None
    siblings = [k for k in tags if len(k) == len(key) and k[:-2] == key[:-2] and k[-1] == key[-1]]
    offset = 0
    for k in siblings[siblings.index(key) :]:
        if offset == start:
            fits = any(t.elements == elements for t in tags[k])
            return k if k != key and fits else None
        offset += tags[k][0].elements // per_unit
    return None


_LAYER = re.compile(r"^(?:\w*?layers?|\w*?blocks?|h)_\d+$", re.IGNORECASE)
#: The layer of a buffer of a scanned stack: every layer's at once (stacked along dim 0).
SCANNED_LAYERS = "scanned layers"
#: The layer of a buffer outside the layers (embedding, head, loss).
NON_LAYER = "non-layer"
#: A module holding a stack of layers (``layers``, ``blocks``, ``h``): a scanned stack.
STACK = re.compile(r"^(?:\w*?layers?|\w*?blocks?|h)$", re.IGNORECASE)


def layer_of(path: Sequence[str], scanned: bool) -> str:
    """``layers_3`` for an unrolled layer, ``scanned layers`` inside a scan, else ``non-layer``.

    A layer is a path segment ``layers_3`` / ``h_3`` (linen's names for a list of modules), or
    a stack's name followed by an index, ``h/16`` or ``layers/3`` (Hugging Face's Flax
    models and NNX lists): named ``h_16``, ``layers_3``.

    Example:
      >>> layer_of(("transformer", "h", "16", "attn", "dot_general"), scanned=False)
      'h_16'
      >>> layer_of(("model", "layers_3", "mlp"), True), layer_of(("lm_head",), False)
      ('layers_3', 'non-layer')
    """
    for i, seg in enumerate(path):
        if _LAYER.match(seg):
            return seg
        if STACK.match(seg) and i + 1 < len(path) and path[i + 1].isdigit():
            return f"{seg}_{path[i + 1]}"
    if scanned:
        return SCANNED_LAYERS
    return NON_LAYER
