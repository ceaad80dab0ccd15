"""MaxText's step as its AOT compiler builds it, traced as MaxText traces it: under its mesh,
its logical axis rules and jax's settings as its entry points set them, with a policy no
config line sets handed to its decoder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import unittest.mock
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

import remat_kit as rk
from remat_kit.errors import BadValue
from remat_kit_models.maxtext import (
    MaxTextSpec,
)
from remat_kit_models.maxtext_source._config import _config, _first, _maxtext, _quiet
from remat_kit_models.maxtext_source._mesh import _mesh

__all__ = ["PRNG_IMPL"]


#: The key type MaxText's entry points (``train.py``'s ``initialize``, ``train_compile.py``'s
#: ``main``) set for the process: 16-byte keys (jax's default, threefry, has 8), one per
#: ``nnx.Rngs`` stream in the train state, so every argument and output count depends on it.
PRNG_IMPL = "unsafe_rbg"


@dataclasses.dataclass(frozen=True)
class _Built:
    """One MaxText step as its AOT compiler builds it, with what the tables read."""

    cfg: Any
    mesh: jax.sharding.Mesh
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    in_shardings: tuple[Any, ...]
    out_shardings: Any
    donate_argnums: tuple[int, ...]
    loss_fn: Callable[..., Any]
    loss_args: tuple[Any, ...]


class _WithoutCheckpoint:
    """``jax`` as MaxText's decoder sees it while a step without remat is traced: its
    ``jax.checkpoint`` hands the layer back (MaxText has no setting without a checkpoint)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(jax, name)

    @staticmethod
    def checkpoint(fn: Callable[..., Any], **kwargs: Any) -> Callable[..., Any]:
        del kwargs
        return fn

    remat = checkpoint  # MaxText's pipeline calls it by jax's other name


@contextlib.contextmanager
def _as_maxtext_sets_jax(cfg: Any) -> Iterator[None]:
    """jax's settings as MaxText's entry points set them, for what runs inside only.

    ``train_compile.main`` and ``train.initialize`` set the key type (:data:`PRNG_IMPL`) and
    ``jax_remove_size_one_mesh_axis_from_type`` (from the config) with ``jax.config.update``,
    for the whole process; here they hold while MaxText's state is built and its step traced,
    and the caller's process keeps its own (a user's keys, other sources' steps).
    """
    from jax._src import config as jax_config  # the setting's scoped form has no public name

    size_one = bool(cfg.remove_size_one_mesh_axis_from_type)
    with (
        jax.default_prng_impl(PRNG_IMPL),
        jax_config.remove_size_one_mesh_axis_from_type(size_one),
    ):
        yield


def _in_booleans(policy: Callable[..., Any]) -> Callable[..., Any]:
    """``policy`` answering save or recompute as ``True``/``False`` (an offload as it is):
    what jax's ``save_from_both_policies`` takes, with which MaxText's pipeline combines the
    decoder's policy and its own saved inputs (jax's own policies answer so; a policy made
    with ``save_and_offload_only_these_names`` answers ``Recompute``, which it refuses)."""
    from jax._src.interpreters import partial_eval as pe  # the answers' types are not public

    @functools.wraps(policy)
    def decide(*args: Any, **kwargs: Any) -> Any:
        answer = policy(*args, **kwargs)
        if isinstance(answer, pe.RecomputeType):
            return False
        return True if isinstance(answer, pe.SaveableType) else answer

    return decide


@contextlib.contextmanager
def _patched(patch: rk.Policy | None, pipelined: bool = False) -> Iterator[None]:
    """MaxText's code with ``patch`` (a policy no config line sets) handed to its decoder's
    ``get_remat_policy`` (in booleans where a pipeline combines it, :func:`_in_booleans`),
    or for ``none`` its decoder's and pipeline's ``jax.checkpoint`` left out; as it is for
    None. Held while the model is built too: a pipeline keeps the decoder's policy it was
    made with."""
    mt = _maxtext()
    with contextlib.ExitStack() as stack:
        if patch is not None and not patch.is_remat:
            for module in (mt.nnx_decoders, mt.pipeline):
                stack.enter_context(unittest.mock.patch.object(module, "jax", _WithoutCheckpoint()))
        elif patch is not None:
            policy = _in_booleans(patch.jax_policy) if pipelined else patch.jax_policy
            stack.enter_context(
                unittest.mock.patch.object(
                    mt.nnx_decoders.NNXDecoder, "get_remat_policy", lambda self: policy
                )
            )
        yield


def _in_context(
    fn: Callable[..., Any], spec: MaxTextSpec, cfg: Any, mesh: Any, patch: rk.Policy | None
) -> Callable[..., Any]:
    """``fn`` traced as MaxText traces it: under its mesh and logical axis rules; with
    ``patch`` (a policy no config line sets) handed to the decoder's ``get_remat_policy``,
    or for ``none`` its ``jax.checkpoint`` left out. An error in MaxText's code is a
    BadValue naming the config (its first line)."""
    from flax.core.spmd import logical_axis_rules

    @functools.wraps(fn)
    def traced(*args: Any) -> Any:
        with contextlib.ExitStack() as stack:
            # The abstract mesh (MaxText enters jax.set_mesh, which a trace may not).
            stack.enter_context(_as_maxtext_sets_jax(cfg))
            stack.enter_context(jax.sharding.use_abstract_mesh(mesh.abstract_mesh))
            stack.enter_context(logical_axis_rules(cfg.logical_axis_rules))
            stack.enter_context(_patched(patch, cfg.using_pipeline_parallelism))
            try:
                return fn(*args)
            except BadValue:
                raise
            except Exception as err:
                raise BadValue(
                    f"MaxText's step for {spec.maxtext!r} failed: {_first(err)}"
                ) from err

    return traced


@functools.cache
def _built(spec: MaxTextSpec, words: tuple[str, ...], target: rk.Target, patch: Any) -> _Built:
    """The step ``train_compile`` compiles for ``words`` on ``target``'s GPUs."""
    from flax import nnx

    mt = _maxtext()
    cfg = _config(spec, words)
    mesh = _mesh(cfg, target)
    with _quiet(), _as_maxtext_sets_jax(cfg), _patched(patch, cfg.using_pipeline_parallelism):
        args, kwargs, state_sh, _, graphdef = mt.train_compile.get_shaped_inputs(mesh, cfg)
        params_sh, state_sh = mt.sharding.maybe_update_params_sharding_with_opt(cfg, state_sh)
        in_state = mt.sharding.build_zero1_input_state_mesh_shardings(cfg, state_sh, params_sh)
        data_sh = mt.sharding.get_input_data_sharding(cfg, mesh)
        fn, in_sh, out_sh, static, donate = mt.maxtext_utils.get_functional_train_with_signature(
            mt.train.train_step, data_sh, in_state, graphdef, cfg, params_sh
        )
    if static or kwargs:
        raise BadValue(
            f"{spec.maxtext!r}: MaxText's step takes static or keyword arguments here "
            "(DiLoCo, pipeline stages ...), which this source does not build",
            param="maxtext",
        )
    # One micro-batch's loss of the model's parameters: what the residual tables read.
    model = nnx.merge(graphdef, args[0]).model
    model_def, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params: Any, rest: Any, batch: Any) -> Any:
        merged = nnx.merge(model_def, params, rest)
        return mt.train.loss_fn(merged, cfg, batch, None, None, is_train=True)[0]

    return _Built(
        cfg=cfg,
        mesh=mesh,
        fn=_in_context(fn, spec, cfg, mesh, patch),
        args=tuple(args),
        in_shardings=tuple(in_sh),
        out_shardings=out_sh,
        donate_argnums=(donate,) if isinstance(donate, int) else tuple(donate),
        loss_fn=_in_context(loss, spec, cfg, mesh, patch),
        loss_args=(params, rest, args[1]),
    )


def _pipeline(cfg: Any) -> dict[str, Any] | None:
    """MaxText's pipeline of ``cfg`` (None without one): stages, micro-batches, repeats,
    whether it checkpoints each iteration, and the config's ``remat_policy`` its
    per-iteration checkpoint reads."""
    if not cfg.using_pipeline_parallelism:
        return None
    return {
        "stages": int(cfg.ici_pipeline_parallelism * cfg.dcn_pipeline_parallelism),
        "microbatches": int(cfg.num_pipeline_microbatches),
        "repeats": int(cfg.num_pipeline_repeats),
        "layers_per_stage": int(cfg.num_layers_per_pipeline_stage),
        "iteration_checkpoint": bool(cfg.set_remat_policy_on_pipeline_iterations),
        "remat_policy": str(cfg.remat_policy),
    }


def _per_device(tree: Any) -> int:
    """Bytes one device holds of ``tree``'s abstract, sharded leaves."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
        total += int(leaf.dtype.itemsize) * math.prod(shape)  # a key's dtype has one too
    return total


def _dtypes(tree: Any) -> str:
    leaves = jax.tree.leaves(tree)
    found = {jnp.dtype(x.dtype).name for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)}
    return "+".join(sorted(found)) or "-"
