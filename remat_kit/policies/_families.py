"""The policy families built from tag names: ``names``, ``except``, ``offload`` and
``maxtext`` (MaxText's ``remat_policy`` values as MaxText builds them).

Each takes its parameters as the catalogue hands them over (:func:`remat_kit.policy`) and
returns a :class:`Policy`; the tag names are checked once, here (:func:`names_param`: a list
of strings; a name outside the vocabulary is a warning, never an error: users tag their own
tensors). The catalogue's lookup and the families that combine other policies (``either``)
stay in :mod:`remat_kit.policies._catalogue`, which re-exports nothing of this module.

Example:
  >>> offload_policy(["context"], save=["query_proj"]).params["dst"]
  'pinned_host'
"""

from __future__ import annotations

import difflib
import fnmatch
import os
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import jax
from jax.ad_checkpoint import name_p

from remat_kit import names as _names
from remat_kit.errors import BadType, BadValue, unknown
from remat_kit.policies._policy import Policy, is_path_pattern

__all__ = [
    "OFFLOAD_DSTS",
    "except_policy",
    "maxtext_policy",
    "names_param",
    "names_policy",
    "offload_policy",
]

#: Where an offload policy may move tensors (jax's memory kinds on the host).
OFFLOAD_DSTS = ("pinned_host", "unpinned_host")
# remat_kit's own files: a warning about the user's names skips their frames.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def names_param(key: str, value: Any) -> tuple[str, ...]:
    """The tag names of parameter ``key``: a list of strings; a name outside the vocabulary
    (and no module path or glob) is warned about at the user's line, never refused.

    Raises:
      BadType: ``value`` is a string or no iterable, or holds something other than strings.

    Example:
      >>> names_param("save", ["query_proj", "mlpwo"])
      ('query_proj', 'mlpwo')
    """
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise BadType(
            f"policy parameter {key}={value!r} must be a list of tag names, "
            f"e.g. {key}=['query_proj']",
            param="policy",
        )
    out = tuple(value)
    for item in out:
        if not isinstance(item, str):
            raise BadType(
                f"policy parameter {key} holds {item!r}; tag names are strings", param="policy"
            )
    # Module paths and globs name tags remat_kit.tagging gives untagged models: not typos.
    unknown = [n for n in out if n not in _names.KNOWN and not is_path_pattern(n)]
    if unknown:
        # Users tag their own tensors with their own names: a warning, never an error.
        hints = {n: difflib.get_close_matches(n, _names.VOCABULARY, n=1) for n in unknown}
        detail = ", ".join(
            f"{n!r} (did you mean {h[0]!r}?)" if h else repr(n) for n, h in hints.items()
        )
        warnings.warn(
            f"{key}: {detail} not in remat_kit's tag vocabulary; only tensors you tagged "
            "yourself with these names will match",
            # Said at the user's line, whichever door the names came in by (rk.policy, a spec
            # string, rk.remat): not at ours, where once per process would hide the others.
            skip_file_prefixes=(_PACKAGE,),
        )
    return out


def names_policy(save: Iterable[str]) -> Policy:
    """``names``: save only the tensors tagged with ``save`` (module-path globs included).

    Raises:
      BadValue: no tag to save (that is ``full``).

    Example:
      >>> names_policy(["query_proj"]).spec
      'names:save=query_proj'
    """
    saved = names_param("save", save)
    if not saved:
        raise BadValue(
            "policy 'names' needs at least one tag to save, e.g. names:save=query_proj+mlpwo; "
            "to save no tagged tensor use 'full'",
            param="policy",
        )
    return Policy(
        "names",
        f"save only tensors tagged {', '.join(saved) or '(none)'}; recompute the rest",
        _save_matching(saved)
        if any(is_path_pattern(n) for n in saved)
        else jax.checkpoint_policies.save_only_these_names(*saved),
        {"save": saved},
        tags=saved,
    )


def _save_matching(patterns: tuple[str, ...]) -> Callable[..., bool]:
    # Globs over tags such as "model/layers/*/mlp/*" (remat_kit.tagging names a layer it has
    # no rule for by its module path); jax's save_only_these_names matches exact names only.
    def save_matching(prim: Any, *_: Any, **params: Any) -> bool:
        return prim is name_p and any(fnmatch.fnmatchcase(str(params["name"]), p) for p in patterns)

    return save_matching


def _offload_matching(
    kept: tuple[str, ...], moved: tuple[str, ...], dst: str
) -> Callable[..., Any]:
    # Globs in either list (the planner writes a tensor saved in every layer of an untagged
    # model as layers_*/mixer, remat_kit.search.compact): jax's policy matches exact names, so
    # each tag is matched here and jax's own policy asked under a stand-in name of the list it
    # matched, the save list first as jax checks it. Its answer (saveable, offloadable to dst,
    # recompute) is then jax's.
    ask = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[_SAVED],
        names_which_can_be_offloaded=[_MOVED],
        offload_src="device",
        offload_dst=dst,
    )

    def offload_matching(prim: Any, *args: Any, **params: Any) -> Any:
        if prim is name_p:
            name = str(params["name"])
            if any(fnmatch.fnmatchcase(name, p) for p in kept):
                return ask(prim, *args, **{**params, "name": _SAVED})
            if any(fnmatch.fnmatchcase(name, p) for p in moved):
                return ask(prim, *args, **{**params, "name": _MOVED})
        return ask(prim, *args, **{**params, "name": None} if prim is name_p else params)

    return offload_matching


#: Stand-in names under which a glob-matched tag is put to jax's offload policy.
_SAVED, _MOVED = "remat_kit:save", "remat_kit:offload"


def except_policy(names: Iterable[str]) -> Policy:
    """``except``: save every tagged tensor but ``names`` (untagged ones are recomputed).

    Example:
      >>> except_policy(["context"]).params["names"]
      ('context',)
    """
    excluded = frozenset(names_param("names", names))

    # jax's save_anything_except_these_names also saves every *untagged* intermediate,
    # which keeps the excluded tensors alive through their consumers; save tagged
    # tensors only, so the excluded ones really are recomputed.
    def save_tagged_except(prim: Any, *_: Any, **params: Any) -> bool:
        return prim is name_p and params["name"] not in excluded

    return Policy(
        "except",
        f"save every tagged tensor except {', '.join(sorted(excluded)) or '(none)'}",
        save_tagged_except,
        {"names": tuple(sorted(excluded))},
        tags=tuple(n for n in _names.VOCABULARY if n not in excluded),
    )


def offload_policy(
    offload: Iterable[str], save: Iterable[str] = (), dst: str = "pinned_host"
) -> Policy:
    """``offload``: move the tensors tagged ``offload`` to ``dst``, keep ``save`` on the
    device, recompute the rest.

    Raises:
      BadValue: nothing to offload, an unknown ``dst``, or a tag in both lists.
      BadType: ``dst`` is no string.

    Example:
      >>> offload_policy(["context"]).offloads
      True
    """
    moved = names_param("offload", offload)
    kept = names_param("save", save)
    if not moved:
        raise BadValue(
            "policy 'offload' needs at least one tag to offload, e.g. offload:offload=context; "
            "to offload nothing use 'names' (save=...) or 'full'",
            param="policy",
        )
    if not isinstance(dst, str):
        raise BadType(
            f"dst={dst!r} must be a memory kind string, one of {', '.join(OFFLOAD_DSTS)}",
            param="policy",
        )
    if dst not in OFFLOAD_DSTS:
        raise BadValue(
            f"unknown offload destination {dst!r}; valid: {', '.join(OFFLOAD_DSTS)}",
            param="policy",
        )
    both = set(moved) & set(kept)
    if both:
        raise BadValue(
            f"{sorted(both)} are both offloaded and saved; name each in one list only",
            param="policy",
        )
    return Policy(
        "offload",
        f"offload {', '.join(moved) or '(nothing)'} to {dst}"
        + (f", save {', '.join(kept)}" if kept else "")
        + "; recompute the rest",
        _offload_matching(kept, moved, dst)
        if any(is_path_pattern(n) for n in (*kept, *moved))
        else jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=list(kept),
            names_which_can_be_offloaded=list(moved),
            offload_src="device",
            offload_dst=dst,
        ),
        {"offload": moved, "save": kept, "dst": dst},
        tags=moved + kept,
        offloads=True,
    )


_MT_QKV = (_names.QUERY_PROJ, _names.VALUE_PROJ, _names.KEY_PROJ, _names.KV_PROJ, _names.QKV_PROJ)
_MT_MINIMAL = (
    *_MT_QKV,
    _names.OUT_PROJ,
    _names.MLPWI_0,
    _names.MLPWI_1,
    _names.MLPWI,
    _names.MLPWO,
)

#: MaxText's ``remat_policy`` values -> (names saved on device, names offloaded to pinned_host),
#: as maxtext 0.2.5 builds them (layers/nnx_decoders.py, NNXDecoder.get_remat_policy and
#: minimal_policy), in its order. ``qkv_proj_offloaded`` leaves out ``qkv_proj`` there, unlike
#: ``save_qkv_proj``; ``full`` (and MaxText's ``none``) is ``jax.checkpoint(policy=None)``.
_MAXTEXT_REMAT: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "minimal_with_context": ((*_MT_MINIMAL, _names.CONTEXT), ()),
    "minimal_flash": ((*_MT_MINIMAL, _names.CONTEXT), ()),  # deprecated alias of the above
    "minimal": (_MT_MINIMAL, ()),
    "minimal_with_quantization": ((*_MT_MINIMAL, _names.QUANTIZATION), ()),
    "minimal_with_context_and_quantization": (
        (*_MT_MINIMAL, _names.CONTEXT, _names.QUANTIZATION),
        (),
    ),
    "save_dot_with_context_except_mlp": ((*_MT_QKV, _names.CONTEXT, _names.OUT_PROJ), ()),
    "save_dot_except_mlpwi": ((*_MT_QKV, _names.OUT_PROJ, _names.MLPWO), ()),
    "save_dot_except_mlp": ((*_MT_QKV, _names.OUT_PROJ), ()),
    "save_qkv_proj": (_MT_QKV, ()),
    "qkv_proj_offloaded": (
        (),
        (_names.QUERY_PROJ, _names.VALUE_PROJ, _names.KEY_PROJ, _names.KV_PROJ),  # no qkv_proj
    ),
    "minimal_offloaded": ((), _MT_MINIMAL),
    "save_out_proj": ((_names.OUT_PROJ,), ()),
    "full": ((), ()),
}

#: MaxText values this family refuses, and what to use instead.
_MAXTEXT_REFUSED = {
    "custom": "it saves and offloads per tensor (tensors_on_device, tensors_to_offload): "
    "write it as the 'offload' family, e.g. offload:offload=context+mlpwo,save=query_proj "
    "(or names:save=... when nothing is offloaded)",
    "none": "MaxText passes policy=None to jax.checkpoint, which recomputes everything: the "
    "same as remat_policy=full (remat_kit's own 'none' means no rematerialization)",
}


def maxtext_policy(remat_policy: str) -> Policy:
    """``maxtext``: what MaxText builds for its ``remat_policy`` value (:data:`_MAXTEXT_REMAT`).

    Raises:
      BadValue: a value this family refuses (``custom``, ``none``: what to use instead) or
        an unknown one (close matches named).
      BadType: ``remat_policy`` is no string.

    Example:
      >>> maxtext_policy("save_out_proj").tags
      ('out_proj',)
    """
    if not isinstance(remat_policy, str):
        raise BadType(
            f"remat_policy={remat_policy!r} must be one of MaxText's remat_policy strings, "
            f"e.g. remat_policy='save_qkv_proj'",
            param="policy",
        )
    if remat_policy in _MAXTEXT_REFUSED:
        raise BadValue(
            f"policy 'maxtext' takes no remat_policy={remat_policy!r}: "
            f"{_MAXTEXT_REFUSED[remat_policy]}",
            param="policy",
        )
    try:
        saved, moved = _MAXTEXT_REMAT[remat_policy]
    except KeyError:
        raise unknown(
            "MaxText remat_policy", remat_policy, _MAXTEXT_REMAT, heading="Valid", param="policy"
        ) from None
    params = {"remat_policy": remat_policy}
    alias = (
        " (MaxText's deprecated alias of minimal_with_context)"
        if remat_policy == "minimal_flash"
        else ""
    )
    if moved:
        return Policy(
            "maxtext",
            f"MaxText's remat_policy={remat_policy}: offload {', '.join(moved)} to pinned_host"
            + (f", save {', '.join(saved)}" if saved else ""),
            jax.checkpoint_policies.save_and_offload_only_these_names(
                names_which_can_be_saved=list(saved),
                names_which_can_be_offloaded=list(moved),
                offload_src="device",
                offload_dst="pinned_host",
            ),
            params,
            tags=saved + moved,
            offloads=True,
        )
    if not saved:
        return Policy(
            "maxtext",
            f"MaxText's remat_policy={remat_policy}: save nothing inside a block (as 'full')",
            jax.checkpoint_policies.nothing_saveable,
            params,
        )
    return Policy(
        "maxtext",
        f"MaxText's remat_policy={remat_policy}{alias}: save {', '.join(saved)}",
        jax.checkpoint_policies.save_only_these_names(*saved),
        params,
        tags=saved,
    )
