"""The MaxText source: a MaxText config as an ``rk.sources.StepSource`` (see the package)."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import math
import os
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp

import remat_kit as rk
from remat_kit.errors import BadValue
from remat_kit.notes import Note
from remat_kit_models.maxtext import (
    _BASE,
    ATTENTION_CHOSEN,
    PIPELINE_OFFLOAD,
    XLA_REMAT,
    MaxTextSpec,
)
from remat_kit_models.maxtext_lines import CUSTOM_TENSORS, config_lines
from remat_kit_models.maxtext_source._config import (
    _GPU_ONLY,
    _ONE_STAGE,
    _config,
    _maxtext,
    _microbatches,
    _settings,
    check_yaml,
)
from remat_kit_models.maxtext_source._mesh import _mesh
from remat_kit_models.maxtext_source._trace import (
    _built,
    _dtypes,
    _in_booleans,
    _per_device,
    _pipeline,
)

__all__ = ["MaxTextSource", "resolve"]


@dataclasses.dataclass(frozen=True)
class MaxTextSource(rk.sources.StepSource):
    """A MaxText config as an ``rk.sources.StepSource`` (see the module docstring).

    Attributes:
      request: the config words.
    """

    request: MaxTextSpec

    #: MaxText's model: its own tensor names (ours follow them) and dtypes.
    own_model = True
    #: A MaxText user sets the policy in the config (``policy_lines``).
    applies_in_code = "lines"
    #: MaxText checkpoints every layer: ``none`` is the baseline, never a plan.
    remat_always = True

    @property
    def spec(self) -> str:
        """``maxtext`` and the config words."""
        return self.request.name

    @property
    def schedule_kinds(self) -> frozenset[str]:
        """``none``: MaxText places its checkpoints itself (one per layer)."""
        return frozenset({"none"})

    def _cfg(self, config: rk.TrainConfig, target: rk.Target, lines: tuple[str, ...]) -> Any:
        words = _settings(
            self.request, config, target.devices, lines, target.hosts, target.tpu_slice
        )
        return _config(self.request, words)

    def n_layers(self) -> int:
        """The decoder's layers (``num_decoder_layers``, overrides included), read from the
        config at one sequence on one device of one host without a pipeline
        (:data:`_ONE_STAGE`): the count does not depend on them, and MaxText takes neither a
        pipeline's micro-batches nor ``dcn_*`` axes there."""
        words = dict(
            w.split("=", 1) for w in _settings(self.request, rk.TrainConfig(1, 128), 1, ())
        )
        words.update(w.split("=", 1) for w in _ONE_STAGE)
        # One device, one slice: the user's cross-host keys want the hosts a probe has not.
        words.update((k, "1") for k in list(words) if k.startswith("dcn_") or k == "num_slices")
        cfg = _config(self.request, tuple(f"{k}={v}" for k, v in words.items()))
        return int(cfg.num_decoder_layers)

    def at_depth(self, layers: int) -> None:
        """None: every compile is of MaxText's whole step."""
        del layers

    def check(self, config: rk.TrainConfig, target: rk.Target) -> None:
        """MaxText's config and mesh for ``config`` on ``target``, and the train config's
        fields the command line would set in vain (MaxText's config sets the optimizer,
        accumulation and precision).

        Raises:
          BadValue: the first bad value, MaxText's own message for its config.
        """
        default = rk.TrainConfig(config.batch, config.seq)
        for field in ("optimizer", "accum", "precision", "lora"):
            if getattr(config, field) != getattr(default, field):
                raise BadValue(
                    f"{field}={getattr(config, field)!r} with {self.spec}: a MaxText config "
                    f"sets its own {field} (opt_type, gradient_accumulation_steps, dtype, "
                    "weight_dtype, lora ...); set it in the config words",
                    param=field,
                )
        attention = dict(self.request.overrides).get("attention")
        if target.tpu_slice is not None:
            if attention is not None and attention.startswith("cudnn"):
                raise BadValue(
                    f"attention={attention} on {target.label}: cuDNN's kernels are NVIDIA's; "
                    "a TPU takes MaxText's autoselected (its default), flash (splash "
                    "attention) or dot_product",
                    param="maxtext",
                )
        elif attention in _GPU_ONLY:
            raise BadValue(
                f"attention={attention}: {_GPU_ONLY[attention]}; give "
                "attention=cudnn_flash_jax (cuDNN's flash attention, the default here) or "
                "dot_product",
                param="maxtext",
            )
        elif (
            attention == "cudnn_flash_te" and importlib.util.find_spec("transformer_engine") is None
        ):
            raise BadValue(
                "attention=cudnn_flash_te needs NVIDIA's TransformerEngine "
                "(pip install transformer_engine[jax]); attention=cudnn_flash_jax is cuDNN's "
                "flash attention without it",
                param="maxtext",
            )
        _mesh(self._cfg(config, target, ()), target)

    def notes(self, config: rk.TrainConfig, target: rk.Target) -> tuple[Note, ...]:
        """On a GPU, the attention kernel chosen where the config names none, and whether
        XLA's own rematerialization pass runs (MaxText's GPU configs switch it off in
        ``XLA_FLAGS``); none on a TPU, where both are MaxText's own defaults."""
        del config
        if target.tpu_slice is not None:
            return ()
        found = []
        if "attention" not in dict(self.request.overrides):
            found.append(ATTENTION_CHOSEN(chosen="cudnn_flash_jax"))
        off = "--xla_disable_hlo_passes=rematerialization" in os.environ.get("XLA_FLAGS", "")
        found.append(XLA_REMAT(disabled=off))
        return tuple(found)

    def build_step(
        self,
        policy: rk.Policy,
        schedule: rk.Schedule,
        config: rk.TrainConfig,
        target: rk.Target,
        *,
        sharded: bool = True,
    ) -> rk.sources.SourceStep:
        """MaxText's step under ``policy`` (its config lines, else handed to its decoder).

        ``sharded`` is not read: MaxText's step is built on its mesh whatever the caller
        traces it for (the traced program is the same).
        """
        del sharded
        pol = rk.as_policy(policy)
        if schedule.name != "none":
            raise BadValue(
                f"{self.spec} cannot build schedule {schedule.spec!r}: MaxText checkpoints "
                "every layer itself; schedules it takes: none",
                param="schedule",
            )
        lines = self._lines(pol, config, target)
        patch = None if lines is not None else pol
        words = _settings(
            self.request, config, target.devices, lines or (), target.hosts, target.tpu_slice
        )
        refused = self.refuses(pol, config, target)
        if refused is not None:
            raise BadValue(f"{self.spec}: {rk.notes.words(refused)}", param="policy")
        b = _built(self.request, words, target, patch)
        model_state, batch = b.args[0]["model"], b.args[1]
        weights = _per_device(model_state)
        opt = _per_device(b.args[0]["optimizer"])
        mesh = {k: int(v) for k, v in b.mesh.shape.items() if v > 1}
        meta = {
            "optimizer": str(b.cfg.opt_type),
            "layers": int(b.cfg.num_decoder_layers),
            # MaxText's micro-batches per step: the report's batch counts them all.
            "accum": int(b.cfg.gradient_accumulation_steps),
            "params": int(sum(x.size for x in jax.tree.leaves(b.loss_args[0]))),
            # The devices of MaxText's own mesh: figures are per device where it spans several.
            "devices": int(b.mesh.devices.size),
            "maxtext": {
                "config": self.request.maxtext,
                "policy_lines": list(lines) if lines is not None else None,
                "policy_applied": "config"
                if lines is not None
                else ("decoder's get_remat_policy" if pol.is_remat else "no jax.checkpoint"),
                "mesh": mesh or {"none": 1},
                "per_device_batch_size": float(b.cfg.per_device_batch_size),
                "pipeline": _pipeline(b.cfg),
            },
        }
        step = rk.train.TrainStep(
            fn=b.fn,
            args=b.args,
            donate_argnums=b.donate_argnums,
            loss_fn=b.loss_fn,
            loss_args=b.loss_args,
            breakdown={
                "weights": weights,
                "trainable": weights,
                "gradients": weights,
                "optimizer": opt,
                "batch": _per_device(batch),
            },
            in_shardings=b.in_shardings,
            out_shardings=b.out_shardings,
            mesh=b.mesh,
            precision={
                "name": "MaxText's own",
                "params": _dtypes(b.loss_args[0]),
                "frozen": "-",
                "grads": _dtypes(b.loss_args[0]),
                "optimizer_state": _dtypes(b.args[0]["optimizer"]),
                "compute": jnp.dtype(b.cfg.dtype).name,
                # MaxText's quantized matmuls (fp8, int8 ...), from the config whoever set it
                # (the words or a YAML): "-" where it computes in `compute` throughout.
                "quantization": str(getattr(b.cfg.quantization, "value", b.cfg.quantization))
                or "-",
            },
            categories={1: "input"},
        )
        return rk.sources.SourceStep(step, pol, schedule, str(b.cfg.attention), meta)

    def sequences_per_step(self, config: rk.TrainConfig, target: rk.Target) -> int:
        """The batch times the config's ``gradient_accumulation_steps``: MaxText's batch
        (``per_device_batch_size`` x GPUs) is one micro-batch, and a step trains that many
        (its ``global_batch_size_to_train_on``).

        Example:
          >>> src = MaxTextSource(MaxTextSpec("model_name=llama2-7b gradient_accumulation_steps=2"))
          >>> src.sequences_per_step(rk.TrainConfig(batch=4, seq=128), rk.target("h100"))
          8
        """
        return int(self._cfg(config, target, ()).global_batch_size_to_train_on)

    def smallest_batch(self, config: rk.TrainConfig, target: rk.Target) -> int:
        """One sequence per pipeline micro-batch (one without a pipeline): MaxText refuses a
        batch its micro-batches do not divide."""
        del config, target
        return _microbatches(self.request)

    def batch_ways(self, target: rk.Target) -> int:
        """Every GPU, and with a pipeline its micro-batches: a search steps the global batch
        by whole ``per_device_batch_size``s that MaxText splits into the pipeline's
        micro-batches (it refuses a batch they do not divide).

        Example:
          >>> pipe = "model_name=llama2-7b ici_pipeline_parallelism=2 num_pipeline_microbatches=6"
          >>> MaxTextSource(MaxTextSpec(pipe)).batch_ways(rk.target("h100", devices=4))
          12
        """
        return math.lcm(target.devices, _microbatches(self.request))

    def policy_lines(
        self, policy: rk.Policy, config: rk.TrainConfig, target: rk.Target
    ) -> tuple[str, ...] | None:
        """The MaxText config lines that set ``policy`` for ``config`` on ``target``
        (:func:`config_lines`, of the names the config's step carries where the policy names
        others): what the step is built with, so the lines are the program measured."""
        return self._lines(rk.as_policy(policy), config, target)

    def _lines(
        self, pol: rk.Policy, config: rk.TrainConfig, target: rk.Target
    ) -> tuple[str, ...] | None:
        lines = config_lines(pol)
        if lines is None and any(n not in CUSTOM_TENSORS for n in pol.tags):
            # A name no line takes (megatron's block_out): none where the step carries
            # none of them, or only recomputes them. The tags are traced once under none
            # (whose lines are none: no recursion) and remembered.
            lines = config_lines(pol, rk.sources.tags(self, config, target))
        return lines

    def refuses(self, policy: rk.Policy, config: rk.TrainConfig, target: rk.Target) -> Note | None:
        """A note (:data:`~remat_kit_models.maxtext.PIPELINE_OFFLOAD`) for a policy that
        offloads, on a pipeline, where no config line sets it: handed to the decoder, it
        meets the pipeline's per-iteration checkpoint, which combines it with its own saved
        inputs through jax's ``save_from_both_policies`` (save or recompute only: MaxText's
        own step would raise). None for any other.

        Example:
          >>> pipe = "model_name=llama2-7b ici_pipeline_parallelism=2 num_pipeline_microbatches=2"
          >>> src = MaxTextSource(MaxTextSpec(pipe))
          >>> t, config = rk.target("h100", devices=2), rk.TrainConfig(2, 128)
          >>> src.refuses(rk.policy("offload_dots_no_batch"), config, t).kind
          'maxtext_pipeline_offload'
          >>> src.refuses(rk.policy("minimal_offloaded"), config, t) is None  # its lines
          True
        """
        pol = rk.as_policy(policy)
        if not pol.offloads or self._lines(pol, config, target) is not None:
            return None
        if not self._cfg(config, target, ()).using_pipeline_parallelism:
            return None
        offloaded = tuple(n for n in pol.tags if rk.decide(pol, n) == "offload")
        return PIPELINE_OFFLOAD(policy=pol.spec, offloaded=offloaded)

    def check_step(self, built: rk.sources.SourceStep, what: str) -> None:
        """The traced loss must checkpoint as the policy says (an equivalent program is
        accepted: MaxText's own policy for ours).

        Raises:
          BadValue: the program checkpoints otherwise.
        """
        step = built.step
        closed = jax.make_jaxpr(step.loss_fn)(*step.loss_args)
        pipe = built.meta["maxtext"]["pipeline"]
        also = ()
        if pipe is not None and pipe["iteration_checkpoint"] and built.policy.is_remat:
            # MaxText's pipeline checkpoints each iteration itself, with the decoder's policy
            # and its own saved inputs (its get_pipeline_remat_policy, which reads only the
            # config's remat_policy): the policy acts inside that checkpoint.
            inner = built.policy.jax_policy
            stand_in = SimpleNamespace(
                config=SimpleNamespace(remat_policy=pipe["remat_policy"]),
                remat_policy=None if inner is None else _in_booleans(inner),
            )
            also = (_maxtext().pipeline.PipelineBase.get_pipeline_remat_policy(stand_in),)
        try:
            for composed in also:  # a dot offload, which no name says: its answer on a dot
                rk.checks.keeps_dots(composed)
            rk.checks.check_traced_with(closed, built.policy, also=also, previous=None, what=what)
        except ValueError as err:  # jax's save_from_both_policies, as MaxText's step would
            raise BadValue(
                f"{what} under {built.policy.spec!r}: MaxText's pipeline checkpoints each "
                "iteration with the decoder's policy and its own saved inputs (jax's "
                "save_from_both_policies), which takes only policies that save or recompute, "
                f"and this one offloads ({' '.join(str(err).split())[:120]}); a pipeline "
                "takes an offload as MaxText's remat_policy: custom lines (a policy naming "
                "its tensors)",
                param="policy",
            ) from None

    def mesh_plan(self, target: rk.Target) -> None:
        """None: MaxText lays out its own mesh (``meta["maxtext"]["mesh"]``)."""
        del target

    def cache_parts(self) -> Mapping[str, Any]:
        """The words, a YAML of the user's by its contents, MaxText's version and ours."""
        parts: dict[str, Any] = {
            "request": self.request.maxtext,
            "maxtext": importlib.metadata.version("maxtext"),
            "code_models": rk.cache.code_fingerprint("remat_kit_models"),
        }
        if self.request.yaml != _BASE:
            parts["yaml"] = hashlib.sha256(Path(self.request.yaml).read_bytes()).hexdigest()
        return parts

    def label(self, config: rk.TrainConfig, target: rk.Target) -> str:
        """``maxtext <words> s<seq>``."""
        del target
        return f"{self.spec} s{config.seq}"


def resolve(spec: MaxTextSpec) -> MaxTextSource:
    """The source of a MaxText config (the MaxText kind's ``resolve``).

    Raises:
      BadValue: MaxText is not installed, or bad config words, before anything is built.
    """
    if spec.yaml != _BASE:  # a typo in its path: one line before MaxText's imports (seconds)
        check_yaml(Path(spec.yaml), spec)
    _maxtext()  # not installed: one line naming the extra, before anything else
    spec.overrides  # noqa: B018 (bad words are named before anything is built)
    return MaxTextSource(spec)
