"""Names the projections of a model we did not write, without forking it.

Name-based policies (``minimal``, ``names:save=...``, the planner's plans) decide per
``checkpoint_name`` tag; a model nobody tagged has none, so they would all behave like
``full``. :func:`tagging` intercepts every Dense / DenseGeneral / Einsum call of a Flax linen
model (``flax.linen.intercept_methods``) and wraps its output in
``jax.ad_checkpoint.checkpoint_name``: with our tag vocabulary (:mod:`remat_kit.names`) where a
rule set knows the module's name (Hugging Face ``q_proj`` ... ``down_proj``, GPT-2 ``c_attn``
``c_proj`` ``c_fc``, gemma's ``q_einsum`` ... ``linear``), else with the module's path
(``model/layers/0/self_attn/rotary``). :func:`tag_nnx` does the same for an NNX model.

A model that tags its own tensors keeps its names; :func:`aliasing` adds ours beside them
where an alias set knows the library's names (EasyDeL's ``attn_query`` ... ``mlp_down``,
MaxText's ``qkv_proj`` and ``attention_out``), so a catalogue policy (``minimal``) and a
policy in the library's own names (``names:save=mlp_gate``) both act on the model.

Tags exist only while the model is traced inside the context (or through
:class:`TaggedModule`), so the user's model and its parameters are unchanged.

Example:
  >>> import flax.linen as nn, jax, jax.numpy as jnp, remat_kit as rk
  >>> class Attn(nn.Module):
  ...     @nn.compact
  ...     def __call__(self, x):
  ...         return nn.Dense(4, name="o_proj")(nn.Dense(4, name="q_proj")(x))
  >>> m = rk.tagging.TaggedModule(Attn())
  >>> x = jnp.ones((1, 4))
  >>> params = jax.eval_shape(m.init, jax.random.key(0), x)
  >>> sorted(rk.residuals.tags_in(jax.make_jaxpr(m.apply)(params, x)))
  ['out_proj', 'query_proj']
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
from flax import nnx
from jax.ad_checkpoint import checkpoint_name, name_p

from remat_kit import names
from remat_kit.errors import unknown

__all__ = [
    "ALIAS_SETS",
    "RULE_SETS",
    "Rule",
    "TaggedModule",
    "aliases",
    "aliases_for",
    "aliasing",
    "rules",
    "tag_for",
    "tag_nnx",
    "tagging",
]


@dataclasses.dataclass(frozen=True)
class Rule:
    """Module path suffix -> tag.

    Attributes:
      pattern: a glob matched against the last ``pattern.count("/") + 1`` components of a
        module's path: ``q_proj`` matches ``model/layers/0/self_attn/q_proj``, ``mlp/c_proj``
        matches the MLP's ``c_proj`` and not attention's.
      tag: the name its output gets, usually one of :data:`remat_kit.names.VOCABULARY`.
    """

    pattern: str
    tag: str

    def matches(self, path: Sequence[str]) -> bool:
        depth = self.pattern.count("/") + 1
        return len(path) >= depth and fnmatch.fnmatchcase("/".join(path[-depth:]), self.pattern)


#: Naming schemes of published Flax models -> our tag vocabulary. Fused projections take the
#: name of their first part (GPT-2's ``c_attn`` is q, k and v: ``query_proj``), so policies
#: that save the projections save them too.
RULE_SETS: Mapping[str, tuple[Rule, ...]] = {
    # Hugging Face Llama, Mistral, Qwen2, Gemma (transformers naming).
    "hf": (
        Rule("q_proj", names.QUERY_PROJ),
        Rule("k_proj", names.KEY_PROJ),
        Rule("v_proj", names.VALUE_PROJ),
        Rule("o_proj", names.OUT_PROJ),
        Rule("gate_proj", names.MLPWI_0),
        Rule("up_proj", names.MLPWI_1),
        Rule("down_proj", names.MLPWO),
    ),
    # Hugging Face GPT-2 (Conv1D layers).
    "gpt2": (
        Rule("attn/c_attn", names.QUERY_PROJ),
        Rule("attn/c_proj", names.OUT_PROJ),
        Rule("mlp/c_fc", names.MLPWI),
        Rule("mlp/c_proj", names.MLPWO),
    ),
    # flax's own modules, as its examples (lm1b, wmt) build a Transformer with them: linen's
    # MultiHeadDotProductAttention / SelfAttention and NNX's MultiHeadAttention name their
    # projections query, key, value and out; the examples' MlpBlock holds two unnamed Dense.
    "flax": (
        Rule("*ttention*/query", names.QUERY_PROJ),
        Rule("*ttention*/key", names.KEY_PROJ),
        Rule("*ttention*/value", names.VALUE_PROJ),
        Rule("*ttention*/out", names.OUT_PROJ),
        Rule("MlpBlock*/Dense_0", names.MLPWI),
        Rule("MlpBlock*/Dense_1", names.MLPWO),
    ),
    # google-deepmind/gemma (Einsum layers).
    "gemma": (
        Rule("q_einsum", names.QUERY_PROJ),
        Rule("qkv_einsum", names.QUERY_PROJ),
        Rule("kv_einsum", names.KEY_PROJ),
        Rule("attn_vec_einsum", names.OUT_PROJ),
        Rule("gating_einsum", names.MLPWI_0),
        Rule("mlp/linear", names.MLPWO),
    ),
}

#: Tag names libraries give their own tensors -> ours. Applied to a model that tags itself
#: (:func:`aliasing`): its tensor then carries both names. Only names that mean the same
#: tensor are mapped; a library's name with no counterpart (EasyDeL's ``residual``, which it
#: gives both residual sums of a layer; MaxText's MLA ``query_wa_proj``) keeps its own name only.
ALIAS_SETS: Mapping[str, Mapping[str, str]] = {
    # EasyDeL 0.3 (easydel/layers/attention/_unified.py, modules/*/modeling_*.py). Its
    # ``mlp_gate`` is the gate after the activation: the same size as the projection.
    "easydel": {
        "attn_qkv": names.QUERY_PROJ,
        "attn_query": names.QUERY_PROJ,
        "attn_key": names.KEY_PROJ,
        "attn_value": names.VALUE_PROJ,
        "attn_output": names.OUT_PROJ,
        "mlp_gate": names.MLPWI_0,
        "mlp_up": names.MLPWI_1,
        "mlp_down": names.MLPWO,
        "moe_router_logits": names.ROUTER_LOGITS,
        "layer_output": names.BLOCK_OUT,
    },
    # MaxText (src/maxtext/layers): most of its names are ours already (they follow its
    # vocabulary); these are the ones that differ. ``attention_out`` is the attention
    # kernel's output before the out projection.
    "maxtext": {
        "qkv_proj": names.QUERY_PROJ,
        "kv_proj": names.KEY_PROJ,
        "attention_out": names.CONTEXT,
    },
}

# Layer classes whose output is a projection worth naming, by class name so that a model's own
# Einsum or Conv1D (gemma, Hugging Face GPT-2) counts like flax's.
_PROJECTION_CLASSES = frozenset(
    {"Dense", "DenseGeneral", "Einsum", "Conv1D", "FlaxConv1D", "Linear", "LinearGeneral"}
)


def rules(spec: str | Sequence[Rule | tuple[str, str]] = "auto") -> tuple[Rule, ...]:
    """The rule list a spec names.

    Args:
      spec: ``"auto"`` (every rule set), ``"paths"`` (no rules: every projection is named by
        its path), a rule set name (``"hf"``, ``"gpt2"``, ``"gemma"``, ``"flax"``, or several
        joined by ``+``), or rules as ``Rule`` s or ``(pattern, tag)`` pairs.

    Returns:
      The rules, first match wins.

    Raises:
      UnknownName: an unknown rule set name.

    Example:
      >>> [r.tag for r in rules("gpt2")][:2]
      ['query_proj', 'out_proj']
    """
    if isinstance(spec, str):
        if spec == "auto":
            return tuple(r for rs in RULE_SETS.values() for r in rs)
        if spec == "paths":
            return ()
        out: list[Rule] = []
        for name in _set_names(spec):
            out.extend(RULE_SETS.get(name, ()))  # an alias set names no projection
        return tuple(out)
    return tuple(r if isinstance(r, Rule) else Rule(*r) for r in spec)


def _set_names(spec: str) -> list[str]:
    # The sets a ``+``-joined spec names; an unknown one is an error naming the valid ones.
    known = [*RULE_SETS, *ALIAS_SETS, "auto", "paths"]
    out = spec.split("+")
    for name in out:
        if name not in known or (name in ("auto", "paths") and len(out) > 1):
            raise unknown("tag rule set", name, known, param="tags")
    return out


def aliases(spec: str | Mapping[str, str] | None) -> dict[str, str]:
    """The alias map (a library's tag name -> ours) a spec names.

    Args:
      spec: a ``+``-joined spec as :func:`rules` takes (its alias sets count: ``"easydel"``,
        ``"hf+maxtext"``; ``"auto"`` and ``"paths"`` name none), a mapping, or None.

    Returns:
      The map, first set first.

    Raises:
      UnknownName: an unknown set name.

    Example:
      >>> aliases("hf+easydel")["attn_query"]
      'query_proj'
      >>> aliases("auto")
      {}
    """
    if spec is None:
        return {}
    if not isinstance(spec, str):
        return dict(spec)
    out: dict[str, str] = {}
    if spec in ("auto", "paths"):
        return out
    for name in _set_names(spec):
        for theirs, ours in ALIAS_SETS.get(name, {}).items():
            out.setdefault(theirs, ours)
    return out


def aliases_for(own: Iterable[str]) -> dict[str, str]:
    """The aliases a model that tags itself gets (``--tags auto``): every alias set whose
    names the traced program holds, less names the model already gives a tensor itself.

    Args:
      own: the tags of the model's traced program.

    Returns:
      Their name -> ours, for the names the program holds.

    Example:
      >>> aliases_for(["attn_query", "mlp_gate", "residual"])
      {'attn_query': 'query_proj', 'mlp_gate': 'mlpwi_0'}
      >>> aliases_for(["qkv_proj", "query_proj", "attention_out"])  # query_proj is its own
      {'attention_out': 'context'}
    """
    present = set(own)
    out: dict[str, str] = {}
    for table in ALIAS_SETS.values():
        for theirs, ours in table.items():
            if theirs in present and ours not in present:
                out.setdefault(theirs, ours)
    return out


@contextlib.contextmanager
def aliasing(mapping: Mapping[str, str]) -> Iterator[dict[str, str]]:
    """Within the context, a tensor a model tags ``theirs`` also carries ``mapping[theirs]``.

    The model's own ``checkpoint_name(x, theirs)`` becomes
    ``checkpoint_name(checkpoint_name(x, theirs), ours)`` as it is traced (the way MaxText
    tags its experts twice): a policy naming either name acts on the tensor, and tables list
    both. A library calls ``checkpoint_name`` from its own code, not from a module method an
    interceptor sees, so the primitive's ``bind`` is wrapped for the duration of the context.

    Args:
      mapping: their name -> ours (see :func:`aliases`, :func:`aliases_for`).

    Yields:
      The mapping in use.

    Example:
      >>> from jax.ad_checkpoint import checkpoint_name
      >>> with aliasing({"attn_query": "query_proj"}):
      ...     closed = jax.make_jaxpr(lambda x: checkpoint_name(x * 2, "attn_query"))(1.0)
      >>> sorted(rk.residuals.tags_in(closed))
      ['attn_query', 'query_proj']
    """
    table = dict(mapping)
    if not table:
        yield table
        return
    prim = name_p
    inner = prim.bind  # an enclosing context's wrapper, or the class's method

    def bind(*args: Any, **params: Any) -> Any:
        out = inner(*args, **params)
        ours = table.get(params.get("name"))  # type: ignore[arg-type]
        return out if ours is None else inner(out, **{**params, "name": ours})

    had = "bind" in vars(prim)
    prim.bind = bind
    try:
        yield table
    finally:
        if had:
            prim.bind = inner
        else:
            del prim.bind


def tag_for(path: Sequence[Any], rule_list: Sequence[Rule]) -> str:
    """The tag of a module at ``path``: the first matching rule's, else the path itself.

    Example:
      >>> tag_for(("model", "layers", "0", "mlp", "down_proj"), rules("hf"))
      'mlpwo'
      >>> tag_for(("model", "layers", "0", "mlp", "wx"), rules("hf"))
      'model/layers/0/mlp/wx'
    """
    parts = tuple(str(p) for p in path)
    for rule in rule_list:
        if rule.matches(parts):
            return rule.tag
    return "/".join(parts)


def _path_of(module: Any) -> tuple[str, ...]:
    path = tuple(str(p) for p in (module.path or ()))
    # gemma's Einsum layers share their parent's scope (nn.share_scope), so their path is the
    # parent's; their weight_name ("gating_einsum", "linear") tells them apart.
    weight = getattr(module, "weight_name", None)
    if isinstance(weight, str) and weight not in ("w", "kernel") and path[-1:] != (weight,):
        path = (*path, weight)
    return path


def _name_outputs(out: Any, tag: str) -> Any:
    return jax.tree.map(lambda x: checkpoint_name(x, tag) if isinstance(x, jax.Array) else x, out)


def _wants(module: Any, path: Sequence[str], rule_list: Sequence[Rule]) -> bool:
    if type(module).__name__ in _PROJECTION_CLASSES:
        return True
    return any(r.matches(path) for r in rule_list)


@contextlib.contextmanager
def tagging(spec: str | Sequence[Rule | tuple[str, str]] = "auto") -> Iterator[tuple[Rule, ...]]:
    """Within the context, every linen projection's output carries a ``checkpoint_name`` tag.

    Wrap whatever traces the model (``init``, ``apply``, ``jax.grad`` of a loss): the tags are
    added when the module's code runs, which is inside the trace.

    Args:
      spec: the rules (see :func:`rules`).

    Yields:
      The rules in use.

    Raises:
      UnknownName: an unknown rule set name.

    Example:
      >>> model, tokens = tiny_model("none"), jnp.zeros((1, 8), jnp.int32)
      >>> params = jax.eval_shape(model.init, jax.random.key(0), tokens)
      >>> sorted(rk.residuals.tags_in(jax.make_jaxpr(model.apply)(params, tokens)))
      []
      >>> with rk.tagging.tagging("hf"):
      ...     jaxpr = jax.make_jaxpr(model.apply)(params, tokens)
      >>> sorted(rk.residuals.tags_in(jaxpr))
      ['lm_head', 'mlpwi_1', 'mlpwo']
    """
    rule_list = rules(spec)

    def interceptor(next_fun: Callable[..., Any], args: Any, kwargs: Any, context: Any) -> Any:
        out = next_fun(*args, **kwargs)
        if context.method_name != "__call__":
            return out
        module = context.module
        path = _path_of(module)
        # A module applied functionally (Hugging Face GPT-2's tied head) has no path.
        if not path or not _wants(module, path, rule_list):
            return out
        return _name_outputs(out, tag_for(path, rule_list))

    with nn.intercept_methods(interceptor):
        yield rule_list


class TaggedModule:
    """A linen module whose ``init`` and ``apply`` run under :func:`tagging`.

    Not a Module itself, so parameters keep the wrapped module's layout exactly; it offers
    what :func:`remat_kit.build_train_step` and the report need: ``init`` and ``apply``.

    Args:
      module: the linen module.
      spec: the tag rules (see :func:`rules`).

    Example:
      >>> m, tokens = TaggedModule(tiny_model("none")), jnp.zeros((1, 8), jnp.int32)
      >>> params = jax.eval_shape(m.init, jax.random.key(0), tokens)
      >>> sorted(rk.residuals.tags_in(jax.make_jaxpr(m.apply)(params, tokens)))
      ['lm_head', 'mlpwi_1', 'mlpwo']
    """

    def __init__(self, module: Any, spec: str | Sequence[Any] = "auto") -> None:
        self.module = module
        self.rules = rules(spec)

    def init(self, *args: Any, **kwargs: Any) -> Any:
        with tagging(self.rules):
            return self.module.init(*args, **kwargs)

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        with tagging(self.rules):
            return self.module.apply(*args, **kwargs)

    def __repr__(self) -> str:
        return f"TaggedModule({type(self.module).__name__})"


@functools.cache
def _tagged_nnx_class(cls: type) -> type:
    # One subclass per layer class: a graphdef built from it stays equal across splits.
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _name_outputs(cls.__call__(self, *args, **kwargs), self.rk_tag)

    return type(f"Tagged{cls.__name__}", (cls,), {"__call__": __call__, "__module__": __name__})


def tag_nnx(model: Any, spec: str | Sequence[Rule | tuple[str, str]] = "auto") -> dict[str, str]:
    """Names every projection of an NNX model in place (NNX has no method interceptor).

    Each ``nnx.Linear`` / ``LinearGeneral`` / ``Einsum`` (or a layer a rule names) becomes an
    instance of a subclass whose ``__call__`` tags its output; parameters are untouched.

    Args:
      model: an ``nnx.Module`` (concrete or from ``nnx.eval_shape``).
      spec: the tag rules (see :func:`rules`).

    Returns:
      Module path -> tag, for every layer tagged.

    Example:
      >>> class Mlp(nnx.Module):
      ...     def __init__(self, rngs):
      ...         self.up_proj = nnx.Linear(4, 8, rngs=rngs)
      ...         self.down_proj = nnx.Linear(8, 4, rngs=rngs)
      ...     def __call__(self, x):
      ...         return self.down_proj(self.up_proj(x))
      >>> tag_nnx(nnx.eval_shape(lambda: Mlp(nnx.Rngs(0))))  # no weight allocated
      {'down_proj': 'mlpwo', 'up_proj': 'mlpwi_1'}
    """
    rule_list = rules(spec)
    done: dict[str, str] = {}
    for path, node in nnx.iter_graph(model):
        if not isinstance(node, nnx.Module) or not path:
            continue
        parts = tuple(str(p) for p in path)
        if not _wants(node, parts, rule_list):
            continue
        tag = tag_for(parts, rule_list)
        if not type(node).__name__.startswith("Tagged"):
            node.__class__ = _tagged_nnx_class(type(node))
        node.rk_tag = tag
        done["/".join(parts)] = tag
    return done
