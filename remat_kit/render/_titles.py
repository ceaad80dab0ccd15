"""The words every title says about a run: its model, batch, sequence, optimizer and precision.

Shared by the tables (:mod:`remat_kit.render._tables`) and the plots' titles.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

__all__ = [
    "RunOptions",
    "opts_precision",
    "precision_words",
    "run_words",
    "training_line",
]


class RunOptions(Protocol):
    """What a table's title reads of the run (the CLI's ``ModelRun`` has them; its
    ``optimizer`` is ``"own step"`` for a step of the user's)."""

    model: str
    batch: int
    seq: int
    optimizer: str
    lora: int
    accum: int
    shard: str | None

    def precision_record(self) -> Mapping[str, str] | None:
        """The precision regime as ``precision_words`` reads it (None: the model's own)."""
        ...


_SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def precision_words(precision: Mapping[str, str] | None) -> str:
    """A precision record (``TrainStep.precision``, ``meta["precision"]``) in a few words.

    Args:
      precision: ``name``, ``params``, ``frozen``, ``grads``, ``optimizer_state`` and
        ``compute`` dtype names, and ``quantization`` where the model quantizes its
        matmuls (MaxText's ``quantization=fp8``), or None.

    Returns:
      E.g. ``"precision mixed: weights f32, grads f32, optimizer state f32, compute bf16"``;
      with frozen weights (LoRA) ``"trained f32, frozen bf16"`` in place of ``weights``;
      ``""`` for None.

    Example:
      >>> precision_words({"name": "bf16", "params": "bfloat16", "frozen": "-",
      ...     "grads": "bfloat16", "optimizer_state": "bfloat16", "compute": "bfloat16"})
      'precision bf16: weights bf16, grads bf16, optimizer state bf16, compute bf16'
      >>> precision_words({"name": "own", "params": "float32", "grads": "float32",
      ...     "optimizer_state": "float32", "compute": "bfloat16", "quantization": "fp8"})
      'precision own: weights f32, grads f32, optimizer state f32, compute bf16 quantized fp8'
    """
    if not precision:
        return ""
    short = lambda key: "+".join(_SHORT.get(d, d) for d in str(precision.get(key, "-")).split("+"))
    frozen = precision.get("frozen", "-")
    weights = (
        f"weights {short('params')}"
        if frozen in ("-", None)
        else f"trained {short('params')}, frozen {short('frozen')}"
    )
    state = short("optimizer_state")
    state_words = "no optimizer state" if state == "-" else f"optimizer state {state}"
    quantized = precision.get("quantization") or "-"
    compute = short("compute") + ("" if quantized == "-" else f" quantized {quantized}")
    return (
        f"precision {precision.get('name')}: {weights}, grads {short('grads')}, {state_words}, "
        f"compute {compute}"
    )


def run_words(opts: RunOptions, *, batch: bool | int = True, seq: bool = True) -> str:
    """The run as every title names it: ``model b<batch> s<seq> optimizer`` (with the LoRA
    rank, the accumulation steps and the mesh when set; without the batch where a search sets
    it, or with the batch it found; without the sequence where a search sets that). The
    model's name carries its overrides (``llama3-8b (layers=64)``).

    Example:
      >>> from types import SimpleNamespace as NS
      >>> run_words(NS(model="llama3-8b", batch=4, seq=2048, optimizer="sgd", lora=16, accum=1))
      'llama3-8b b4 s2048 sgd lora16'
      >>> run_words(NS(model="m", batch=8, seq=512, optimizer="adamw", lora=0, accum=2,
      ...              shard="fsdp:4,tp:2"))
      'm b8 s512 adamw accum2 fsdp:4,tp:2'
    """
    shard = getattr(opts, "shard", None)
    b = opts.batch if batch is True else None if batch is False else batch
    return (
        f"{opts.model}{f' b{b}' if b is not None else ''}{f' s{opts.seq}' if seq else ''} "
        f"{opts.optimizer}"
        + (f" lora{opts.lora}" if opts.lora else "")
        + (f" accum{opts.accum}" if opts.accum > 1 else "")
        + (f" {shard}" if shard else "")
    )


def training_line(
    precision: Mapping[str, str] | None, dropout: float | None, remat_impl: str | None = None
) -> str:
    """The title's second line: the precision regime, dropout, and jax's remat
    implementation when it is not the default (``meta["remat_impl"]``).

    Example:
      >>> training_line(None, 0.1, "remat3")
      '\\ndropout 0.1 (applied); traced with jax_remat3'
    """
    parts = [precision_words(precision)]
    if dropout:
        parts.append(f"dropout {dropout:g} (applied)")
    if remat_impl == "remat3":
        parts.append("traced with jax_remat3")
    words = "; ".join(p for p in parts if p)
    return f"\n{words}" if words else ""


def opts_precision(opts: RunOptions) -> Mapping[str, str] | None:
    """The run's precision record (``RunOptions.precision_record``)."""
    return opts.precision_record()
