"""Program-level checks: what a traced program (a jaxpr) or a compiled report shows a policy did.

A model that ignores the policy it is given, or a trace reused from an earlier policy: the
program then holds no checkpoint with that policy, or is identical to the previous policy's
(:func:`check_traced_with`); offload XLA did not carry out in full
(:func:`offload_shortfall`); a dot policy on a mixture-of-experts model, whose grouped expert
GEMMs jax's dot policies do not see (:func:`ragged_dots_recomputed`,
:func:`expert_dots_recomputed`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from remat_kit._jaxpr import is_checkpoint, open_jaxpr, params_of, sub_jaxprs, tag_of, tags_in
from remat_kit._shapes import array_bytes
from remat_kit.checks._policy import policy_of
from remat_kit.errors import BadValue
from remat_kit.notes import Note
from remat_kit.policies import Policy, PolicyLike, as_policy, decide_eqn

if TYPE_CHECKING:  # a report is read, never made, here: the policy layer stays below analysis
    from remat_kit.analysis import MemoryReport

__all__ = [
    "OFFLOAD_SHORTFALL",
    "Trace",
    "check_traced_with",
    "checkpoint_policies",
    "expert_dots_recomputed",
    "keeps_dots",
    "offload_shortfall",
    "ragged_dots_recomputed",
    "same_policy",
]


#: Offload is reported as not carried out in full when XLA moved less than this share of the
#: bytes jax marked. A scanned stack moves exactly the marked bytes; unrolled layers moved 50-64%
#: of them (jax 0.10), so any real shortfall is reported; the 1% spares rounding alone.
OFFLOAD_SHORTFALL = 0.99


def checkpoint_policies(closed: Any) -> list[tuple[Any, frozenset[str]]]:
    """Every checkpoint of a jaxpr: (the policy callable, the tags inside it), in order.

    Descends into scans, conds, jit calls and nested checkpoints.

    Example:
      >>> import jax, jax.numpy as jnp, remat_kit as rk
      >>> f = jax.checkpoint(jnp.sin, policy=jax.checkpoint_policies.nothing_saveable)
      >>> [p.__name__ for p, _ in checkpoint_policies(jax.make_jaxpr(f)(1.0))]
      ['nothing_saveable']
    """
    out: list[tuple[Any, frozenset[str]]] = []

    def walk(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            if is_checkpoint(eqn):
                params = params_of(eqn)
                out.append((params.get("policy"), frozenset(tags_in(params["jaxpr"]))))
            for sub in sub_jaxprs(eqn):
                walk(open_jaxpr(sub))

    walk(open_jaxpr(closed))
    return out


def same_policy(fn: Any, pol: Policy) -> bool:
    if fn is None:
        return False
    if fn is pol or fn is pol.jax_policy:
        return True
    owner = policy_of(fn)
    return owner is not None and owner == pol


def _checkpoints(closed: Any) -> list[tuple[Any, Any]]:
    """Every checkpoint of a jaxpr: (the policy callable, its body), in order."""
    out: list[tuple[Any, Any]] = []

    def walk(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            if is_checkpoint(eqn):
                out.append((params_of(eqn).get("policy"), open_jaxpr(params_of(eqn)["jaxpr"])))
            for sub in sub_jaxprs(eqn):
                walk(open_jaxpr(sub))

    walk(open_jaxpr(closed))
    return out


def _decision(fn: Any, eqn: Any) -> str:
    # jax.checkpoint without a policy saves nothing.
    return "recompute" if fn is None else decide_eqn(fn, eqn)


def differs(fn: Any, pol: Policy, body: Any) -> Any | None:
    """The first operation of a checkpoint's ``body`` on which its policy ``fn`` decides
    otherwise than ``pol`` (None: they decide alike on all of them, so the checkpoint is
    ``pol``'s, whoever made it: a library's own ``remat_policy`` names it in its own words).

    Nested checkpoints are left out: their own policy decides inside them.

    Example:
      >>> import jax, jax.numpy as jnp, remat_kit as rk
      >>> f = jax.checkpoint(lambda x: jnp.sin(x @ x), policy=None)  # saves nothing
      >>> body = _checkpoints(jax.make_jaxpr(f)(jnp.ones((2, 2))))[0][1]
      >>> differs(None, rk.policy("full"), body) is None
      True
      >>> differs(None, rk.policy("dots"), body).primitive.name
      'dot_general'
    """
    mine = pol.jax_policy
    for eqn in _eqns(body):
        if _decision(fn, eqn) != _decision(mine, eqn):
            return eqn
    return None


def _eqns(jaxpr: Any) -> Iterable[Any]:
    for eqn in jaxpr.eqns:
        if is_checkpoint(eqn):
            continue
        yield eqn
        for sub in sub_jaxprs(eqn):
            yield from _eqns(open_jaxpr(sub))


def _holds(bodies: list[tuple[Any, Any]], wanted: list[Policy]) -> bool:
    """Whether some checkpoint is one of ``wanted``: handed that very policy, or one that
    decides alike on every operation of its body."""
    if any(same_policy(fn, p) for fn, _ in bodies for p in wanted):
        return True
    return any(differs(fn, p, body) is None for fn, body in bodies for p in wanted)


def _first_difference(bodies: list[tuple[Any, Any]], pol: Policy) -> str:
    for fn, body in bodies:
        eqn = differs(fn, pol, body)
        if eqn is not None:
            tag = tag_of(eqn)
            what = eqn.primitive.name if tag is None else f"the value tagged {tag!r}"
            return (
                f"{what} is {_decision(fn, eqn)}d there, "
                f"{_decision(pol.jax_policy, eqn)}d under {pol.spec!r}"
            )
    return "on no operation"


def _describe(fn: Any) -> str:
    owner = policy_of(fn)
    if owner is not None:
        return owner.spec
    if fn is None:
        return "save nothing"
    # jax's policy factories return closures (save_only_these_names.<locals>.policy): the
    # factory names them.
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", type(fn).__name__)
    return name.split(".<locals>", 1)[0]


@dataclasses.dataclass(frozen=True)
class Trace:
    """The fingerprint of a program traced for one policy (see :func:`check_traced_with`).

    Attributes:
      policy: the spec it was traced for.
      digest: a hash of the jaxpr's text and of the policy callables it holds.
    """

    policy: str
    digest: str


def check_traced_with(
    closed: Any,
    policy: PolicyLike,
    *,
    also: Iterable[Any] = (),
    previous: Trace | None = None,
    what: str = "the model",
    block: str | None = None,
) -> Trace:
    """Fails loudly when a program was not traced with ``policy``.

    A report for policy P must come from a program traced with P. Two signs that it was not:
    no checkpoint in the program carries P (the model ignored the policy it was given, or a
    cached trace from another policy was reused), or the program is identical to the one
    traced for the previous, different policy. A checkpoint carries P when it was handed P,
    or a policy that decides alike on every operation it holds (a library's own equivalent
    of P in its own words: MaxText's ``remat_policy="full"`` is a checkpoint without a
    policy, which saves nothing, as ``full`` does).

    Args:
      closed: the traced program (``jax.make_jaxpr(...)``).
      policy: the policy it was traced for.
      also: other policies the program may use instead (those a layer schedule names).
      previous: the fingerprint of the program traced for the policy before.
      what: the model, for the message.
      block: the ``module:Class`` patched to apply the policy, if one was (for the message).

    Returns:
      This program's fingerprint, to pass as ``previous`` next time.

    Raises:
      BadValue: either sign (one line saying what the program holds and what to do).

    Example:
      >>> from jax.ad_checkpoint import checkpoint_name
      >>> def block(x):
      ...     return checkpoint_name(jnp.sin(x), "mlpwo")
      >>> f = jax.checkpoint(block, policy=jax.checkpoint_policies.nothing_saveable)
      >>> check_traced_with(jax.make_jaxpr(f)(1.0), "full").policy
      'full'
      >>> g = jax.checkpoint(block)  # a library's own "full": no policy, which saves nothing
      >>> check_traced_with(jax.make_jaxpr(g)(1.0), "full").policy
      'full'
      >>> check_traced_with(jax.make_jaxpr(f)(1.0), "minimal")
      Traceback (most recent call last):
      remat_kit.errors.BadValue: the model traced for policy 'minimal' holds no checkpoint ...
    """
    pol = as_policy(policy)
    found = checkpoint_policies(closed)
    # The jaxpr's text names a policy callable by its function name only: add the callables'
    # identities, which a reused trace keeps and a fresh one does not.
    ids = [(id(fn), _describe(fn)) for fn, _ in found]
    digest = hashlib.sha256(f"{closed}\n{ids}".encode()).hexdigest()
    wanted = [pol, *(as_policy(p) for p in also)]
    bodies = _checkpoints(closed)
    if pol.is_remat and not _holds(bodies, wanted):
        held = sorted({_describe(fn) for fn, _ in found})
        detail = (
            f"its checkpoints carry other policies ({', '.join(held)}), which decide "
            f"otherwise than {pol.spec!r} ({_first_difference(bodies, pol)}): the model "
            "applied its own policy, or a trace made for another was reused"
            if held
            else "it has no checkpoint at all: the policy was never applied"
        )
        todo = (
            f"{block} was patched while the model was built and traced, yet no block of "
            "the program is one: the model takes the class from elsewhere (another module's "
            "name for it: patch that one), or replays a trace cached before the patch "
            "(nn.jit): apply the policy the factory is given (rk.remat(Block, policy))"
            if block
            else "Apply the policy the factory is given (rk.remat(Block, policy)) or name the "
            "block class to patch (block=module:Class)"
        )
        raise BadValue(
            f"{what} traced for policy {pol.spec!r} holds no checkpoint with it; {detail}. {todo}"
        )
    # A program for "none" may hold checkpoints a model always makes, but not ones that
    # rk.remat made for another policy: that model ignored "none".
    # A checkpoint handed the ``none`` Policy itself saves everything: it is no remat (a
    # user's step that wraps its block with whatever policy it is given makes one).
    others = sorted({o.spec for fn, _ in found if (o := policy_of(fn)) is not None and o.is_remat})
    if not pol.is_remat and others and not any(as_policy(p).is_remat for p in also):
        raise BadValue(
            f"{what} traced for policy 'none' holds checkpoints with {', '.join(others)}: the "
            "model applied another policy (or a trace made for one was reused); with 'none' "
            "it must not rematerialize (rk.remat(Block, policy) returns Block for 'none')"
        )
    if previous is not None and previous.policy != pol.spec and previous.digest == digest:
        raise BadValue(
            f"{what} traced for policy {pol.spec!r} is identical to the program traced for "
            f"{previous.policy!r}: a trace was reused (a module-level jax.jit or nn.jit cache?) "
            "or the policy was ignored; build the model anew for each policy"
        )
    return Trace(pol.spec, digest)


def offload_shortfall(
    report: MemoryReport, marked_bytes: int, *, threshold: float = OFFLOAD_SHORTFALL
) -> Note | None:
    """A note when XLA moved fewer bytes to host than jax marked for offload.

    jax marks the residuals an offload policy names for host memory; XLA decides whether the
    copies happen. On unrolled layers it moved part of them in our measurements (3-30% with
    older jax, 50-64% with jax 0.10: llama3-8b, 4 layers, ``minimal_offloaded`` moved 1.42 of
    2.38 GiB) and the rest stayed on the device, while a scanned stack offloads exactly the
    marked bytes: offload needs scanned layers.

    Args:
      report: the compiled report (its ``host_temp_bytes``, else ``host_bytes``).
      marked_bytes: bytes jax marked for offload in the same step that are in host memory
        at once (``rk.saved_residuals(...).marked_bytes``: the offloaded residuals and,
        under a segment schedule, one segment's; per micro-batch, like the step's host
        buffers).
      threshold: the share below which the offload counts as not carried out.

    Returns:
      The note (kind ``offload_shortfall``, with ``moved_bytes`` and ``marked_bytes``;
      ``rk.notes.words`` says it), or None.

    Example:
      >>> r = rk.memory_report(jnp.sin, jax.ShapeDtypeStruct((8,), jnp.float32), target="cpu")
      >>> offload_shortfall(r.replace(host_temp_bytes=2**30 // 10), 2**30).data
      {'moved_bytes': 107374182, 'marked_bytes': 1073741824}
    """
    moved = int(report.host_temp_bytes or report.host_bytes or 0)
    if marked_bytes <= 0 or moved >= threshold * marked_bytes:
        return None
    return Note("offload_shortfall", {"moved_bytes": moved, "marked_bytes": int(marked_bytes)})


# A dot policy's counterpart that also keeps the grouped GEMMs, by what the policy is.
_WITH_RAGGED = {
    "dots": "dots_and_ragged",
    "dots_no_batch": "dots_no_batch_and_ragged",
    "offload_dots_no_batch": "offload_dots_no_batch_and_ragged",
}


def ragged_dots_recomputed(closed: Any) -> Note | None:
    """A note when a policy that keeps matmul outputs recomputes the grouped GEMMs.

    jax's dot policies (``dots_saveable``, ``dots_with_no_batch_dims_saveable``,
    ``offload_dot_with_no_batch_dims``) look for ``dot_general`` only: a mixture-of-experts
    layer's expert GEMMs (``jax.lax.ragged_dot``, the ``ragged_dot_general`` primitive) are
    recomputed, silently. This asks each checkpoint's own policy about the program's
    primitives, not about tags: a policy counts as a dot policy when it keeps a plain
    ``dot_general`` output, and the note fires when it then recomputes a ``ragged_dot_general``
    output in the same checkpoint.

    Args:
      closed: the jaxpr of the *forward* function (``jax.make_jaxpr(loss)(params, batch)``):
        there each checkpoint's body is what its policy decides on. The checkpoints of a
        differentiated program (a train step) mix the recomputation with the backward pass's
        own ragged dots, so they are skipped.

    Returns:
      The note (kind ``ragged_dots_recomputed``): the policy, the ragged-dot output bytes one
      checkpoint (a layer) recomputes, most of any, how many checkpoint runs recompute some
      (scan trips counted), and a policy spec that keeps them (None when the policy is not one
      we can name: combine it with ``ragged_dots`` through ``rk.policy("either", ...)``); None
      when nothing is recomputed that way.

    Example:
      >>> f = jax.checkpoint(
      ...     lambda x, w: jax.lax.ragged_dot(x, w, jnp.array([3, 5])) @ jnp.ones((4, 2)),
      ...     policy=rk.policy("dots"))
      >>> args = jnp.ones((8, 2)), jnp.ones((2, 2, 4))
      >>> note = ragged_dots_recomputed(jax.make_jaxpr(f)(*args))
      >>> note.data["per_layer_bytes"], note.data["suggest"]
      (128, 'dots_and_ragged')
    """
    found = _missed_by_dot_policies(closed, _is_ragged)
    if not found:
        return None
    label, key = _label(found)
    return Note(
        "ragged_dots_recomputed",
        {
            "policy": label,
            "per_layer_bytes": max(f[1] for f in found),
            "layers": sum(f[2] for f in found),
            "suggest": _WITH_RAGGED.get(key),
        },
    )


def expert_dots_recomputed(closed: Any) -> Note | None:
    """A note when a policy that keeps weight matmuls recomputes batched ones against weights.

    Expert GEMMs written as einsums (the capacity dispatch of GShard, Switch and MaxText's
    dense path: ``"egcd,edf->egcf"``) carry the expert as a batch dimension, and jax's
    ``dots_with_no_batch_dims_saveable`` (``dots_no_batch``, ``offload_dots_no_batch``)
    leaves every product with a batch dimension to be recomputed: maxtext#2207. Read from the
    traced program, not from names: a batched ``dot_general`` one of whose operands is an
    input of the checkpointed block (a weight: cast, reshaped or transposed at most, its
    batch dimensions leading) and whose output the block's dot policy recomputes. Attention's
    batched products read projections made inside the block, so they do not count.

    Args:
      closed: the jaxpr of the forward function, as for :func:`ragged_dots_recomputed`.

    Returns:
      The note (kind ``expert_dots_recomputed``): the policy, the bytes one checkpoint run
      recomputes, most of any, and how many runs recompute some; None when none does.

    Example:
      >>> f = jax.checkpoint(
      ...     lambda x, w: jnp.einsum("ecd,edf->ecf", jnp.sin(x), w).sum(),
      ...     policy=rk.policy("dots_no_batch"))
      >>> args = jnp.ones((2, 3, 4)), jnp.ones((2, 4, 5))
      >>> expert_dots_recomputed(jax.make_jaxpr(f)(*args)).data["per_layer_bytes"]
      120
    """
    found = _missed_by_dot_policies(closed, _is_batched_weight_product)
    if not found:
        return None
    label, _ = _label(found)
    return Note(
        "expert_dots_recomputed",
        {
            "policy": label,
            "per_layer_bytes": max(f[1] for f in found),
            "layers": sum(f[2] for f in found),
        },
    )


#: Ops that change a value's dtype or layout but not what it is (a weight stays a weight).
_LAYOUT = {"convert_element_type", "copy", "copy_p", "reshape", "transpose", "squeeze"}


def _missed_by_dot_policies(
    closed: Any, counts: Callable[[Any, Any], bool]
) -> list[tuple[Any, int, int]]:
    """``(policy callable, bytes per run, runs)`` of each checkpoint whose dot policy (one that
    keeps a plain ``dot_general``) recomputes outputs of equations ``counts(eqn, body)``."""
    found: list[tuple[Any, int, int]] = []

    def walk(jaxpr: Any, runs: int) -> None:
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            params = params_of(eqn)
            if is_checkpoint(eqn) and not params.get("differentiated"):
                fn = params.get("policy")
                body = open_jaxpr(params["jaxpr"])
                if fn is not None and keeps_dots(fn):
                    nbytes = _recomputed_bytes(fn, body, counts)
                    if nbytes:
                        found.append((fn, nbytes, runs))
                walk(body, runs)  # a checkpoint nested inside decides for its own body
                continue
            inner = runs * int(eqn.params.get("length", 1)) if name == "scan" else runs
            for sub in sub_jaxprs(eqn):
                walk(open_jaxpr(sub), inner)

    walk(open_jaxpr(closed), 1)
    return found


def _label(found: list[tuple[Any, int, int]]) -> tuple[str, str]:
    # The policy that recomputes most, as the user named it, and its key in _WITH_RAGGED.
    fn = max(found, key=lambda f: f[1])[0]
    owner = policy_of(fn)
    if owner is not None and owner.name == "custom":  # rk.remat given a raw jax callable
        fn, owner = owner.jax_policy, None
    if owner is not None:
        return owner.spec, owner.spec
    import jax

    # jax's own callables, by identity: their repr differs between jax releases (an object
    # ``DotsSaveable(...)`` in 0.10, a plain function in 0.12).
    cp = jax.checkpoint_policies
    for name, known in (
        ("dots", cp.dots_saveable),
        ("dots_no_batch", cp.dots_with_no_batch_dims_saveable),
    ):
        if fn is known:
            return _describe(fn), name
    return _describe(fn), repr(fn)


def keeps_dots(fn: Any) -> bool:
    """Whether a jax policy keeps (or offloads) the output of a plain 2-D ``dot_general``.

    Example:
      >>> keeps_dots(rk.policy("dots_no_batch").jax_policy)
      True
      >>> keeps_dots(rk.policy("minimal").jax_policy)
      False
    """
    return decide_eqn(fn, _probe_dot()) != "recompute"


def _probe_dot() -> Any:
    import jax
    import jax.numpy as jnp

    x = jax.ShapeDtypeStruct((2, 2), jnp.float32)
    return jax.make_jaxpr(jnp.matmul)(x, x).eqns[0]


def _is_ragged(eqn: Any, body: Any) -> bool:
    del body
    return eqn.primitive.name == "ragged_dot_general"


def _is_batched_weight_product(eqn: Any, body: Any) -> bool:
    if eqn.primitive.name != "dot_general":
        return False
    (_, _), (lhs_batch, rhs_batch) = eqn.params["dimension_numbers"]
    if not lhs_batch:
        return False
    inputs = set(body.invars)
    producers = {v: e for e in body.eqns for v in e.outvars}
    for v, batch in zip(eqn.invars, (lhs_batch, rhs_batch), strict=True):
        if tuple(batch) != tuple(range(len(batch))):
            continue  # a weight stack leads with its batch (expert) dimensions
        while v in producers and producers[v].primitive.name in _LAYOUT:
            v = producers[v].invars[0]
        if v in inputs:
            return True
    return False


def _recomputed_bytes(
    fn: Any, scope: Any, counts: Callable[[Any, Any], bool], times: int = 1
) -> int:
    """Bytes of the outputs of ``counts`` equations in one run of ``scope`` (a checkpoint's
    body, then each sub-jaxpr in turn, whose inputs ``counts`` sees) that ``fn`` recomputes;
    nested checkpoints decide for themselves and are left out."""
    total = 0
    for eqn in scope.eqns:
        name = eqn.primitive.name
        if counts(eqn, scope):
            if decide_eqn(fn, eqn) == "recompute":
                aval = eqn.outvars[0].aval
                total += times * array_bytes(aval.shape, aval.dtype)
            continue
        if is_checkpoint(eqn):
            continue
        inner = times * int(eqn.params.get("length", 1)) if name == "scan" else times
        for sub in sub_jaxprs(eqn):
            opened = open_jaxpr(sub)
            total += _recomputed_bytes(fn, opened, counts, inner)
    return total
