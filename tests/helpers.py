"""Small shared helpers for the tests (not fixtures)."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_kit_models as models

#: A test that builds or traces a MaxText model imports MaxText's model code first: about 9 s
#: in a worker (pydantic configs, tokamax, orbax), so it runs in the slow tier.
IMPORTS_MAXTEXT = pytest.mark.slow


def tokens(batch: int = 2, seq: int = 16, vocab: int = 256, seed: int = 1) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (batch, seq), 0, vocab)


def _loss(cfg: models.ModelConfig, toks, dropout_key):
    module = models.build(cfg, deterministic=dropout_key is None)
    rngs = {} if dropout_key is None else {"dropout": dropout_key}

    def loss(p):
        logits = module.apply(p, toks[:, :-1], rngs=rngs).astype(jnp.float32)
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, toks[:, 1:, None], axis=-1).mean()

    return loss


def loss_and_grads(cfg: models.ModelConfig, params, toks, *, dropout_key=None):
    """Next-token cross-entropy and its gradients for ``cfg`` (policy from the config)."""
    return jax.jit(jax.value_and_grad(_loss(cfg, toks, dropout_key)))(params)


def losses_and_grads(configs, params, toks, *, dropout_key=None) -> tuple:
    """:func:`loss_and_grads` of each config, in their order, computed by one compiled program.

    Each gradient is its own computation in that program (a policy's remat stays inside its
    own value_and_grad), and XLA's fixed cost per compile is paid once: eight policies' gradients
    of a 2-layer model took 12.8 s of CPU as one program against 28 s as eight.
    """
    losses = [jax.value_and_grad(_loss(cfg, toks, dropout_key)) for cfg in configs]
    return jax.jit(lambda p: tuple(f(p) for f in losses))(params)


def size_words(nbytes: int) -> str:
    """Bytes as remat_kit words them (the convention of ``remat_kit/_units.py``), written out
    here independently so a test's expected sentence does not call the formatter it checks:
    GiB when the figure is at least 1 GiB (however large: no TiB), else MiB, else KiB, two
    decimals; below 1 KiB, whole bytes (``300 B``)."""
    for power, unit in ((3, "GiB"), (2, "MiB"), (1, "KiB")):
        if nbytes >= 1024**power:
            return f"{nbytes / 1024**power:.2f} {unit}"
    return f"{int(nbytes)} B"


def memory_report(target: str | None = "h100", **fields):
    """A ``MemoryReport`` made by hand, no compile: ``target``'s memory figures (None: none),
    a 1 GiB peak that is all arguments, nothing else; any field may be given."""
    import remat_kit as rk

    t = rk.target(target) if target is not None else None
    peak = fields.get("peak_bytes", 2**30)
    values = dict(
        target=t.name if t is not None else "h100-80gb",
        target_memory_bytes=t.memory_bytes if t is not None else None,
        usable_bytes=t.usable_bytes if t is not None else None,
        mem_fraction=t.mem_fraction if t is not None else None,
        fits_with_fraction=None,
        devices=1,
        peak_bytes=peak,
        argument_bytes=peak,
        output_bytes=0,
        temp_bytes=0,
        alias_bytes=0,
        host_bytes=0,
        host_temp_bytes=0,
        generated_code_bytes=0,
        xla_peak_bytes=None,
        flops=0.0,
        flops_detail={},
        tags=(),
        xla_remat=False,
        xla_remat_saved_bytes=0,
        xla_remat_limit_bytes=None,
        policy="full",
        schedule="none",
        attention=None,
        compile_seconds=0.0,
    )
    values.update(fields)
    return rk.MemoryReport(**values)


def step_time(seconds: float, **fields):
    """A predicted step time of ``seconds``, all of it matmul at half a 2 TFLOP/s peak (the
    fakes read only ``seconds``); any field may be given."""
    from remat_kit.timing import StepTime

    values = dict(
        seconds=seconds,
        matmul_seconds=seconds,
        attention_seconds=0.0,
        memory_seconds=0.0,
        collective_seconds=0.0,
        collective_hidden_seconds=0.0,
        transfer_seconds=0.0,
        launch_seconds=0.0,
        recompute_seconds=0.0,
        model_flops=1e12 * seconds,
        flops=1e12 * seconds,
        kernels=1,
        device="fake",
        peak_flops=2e12,
    )
    values.update(fields)
    return StepTime(**values)


def axis_groups(mesh, axis: str) -> set:
    """The device groups of one mesh axis, as the partition ids HLO names them."""
    ids = np.arange(mesh.size).reshape(tuple(mesh.shape.values()))
    ids = np.moveaxis(ids, list(mesh.shape).index(axis), -1)
    return {frozenset(g.tolist()) for g in ids.reshape(-1, mesh.shape[axis])}


def replica_groups(line):
    """The device groups of a collective, in any of the three forms XLA writes them."""
    m = re.search(r"replica_groups=\{(\{[\d,]*\}(?:,\{[\d,]*\})*)\}", line)
    if m:
        return {frozenset(map(int, g.split(","))) for g in re.findall(r"\{([\d,]+)\}", m.group(1))}
    m = re.search(
        r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?\))?"
        r"\s*\{([^}]*)\}",
        line,
    )
    if m:  # mesh['axis_0'=2,'axis_1'=4] {'axis_1'}: devices in order over that mesh, or in
        # the order device_ids=([2,2]T(1,0)) lays them out (an iota, transposed)
        sizes = [(a, int(n)) for a, n in re.findall(r"'([^']+)'=(\d+)", m.group(1))]
        named = re.findall(r"'([^']+)'", m.group(4))
        ids = np.arange(np.prod([n for _, n in sizes]))
        if m.group(2):
            laid = np.arange(ids.size).reshape(tuple(map(int, m.group(2).split(","))))
            if m.group(3):
                laid = laid.transpose(tuple(map(int, m.group(3).split(","))))
            ids = laid.reshape(-1)
        ids = ids.reshape([n for _, n in sizes])
        axes = [a for a, _ in sizes]
        ids = np.moveaxis(ids, [axes.index(a) for a in named], range(-len(named), 0))
        width = int(np.prod([n for a, n in sizes if a in named]))
        return {frozenset(g.tolist()) for g in ids.reshape(-1, width)}
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
    if not m:
        return set()
    dims = tuple(map(int, m.group(3).split(",")))
    ids = np.arange(int(np.prod(dims))).reshape(dims)
    if m.group(4):
        ids = ids.transpose(tuple(map(int, m.group(4).split(","))))
    return {frozenset(g.tolist()) for g in ids.reshape(int(m.group(1)), int(m.group(2)))}


def collectives(text, op):
    """(result arrays as (dtype, dims), replica groups, op_name) of every ``op`` in the HLO."""
    out = []
    for line in text.splitlines():
        if not re.search(rf"\s{op}(-start)?\(", line):
            continue
        result = line.split("=", 1)[1].split(f" {op}", 1)[0]
        arrays = [
            (dtype, tuple(map(int, d.split(","))))
            for dtype, d in re.findall(r"(\w+)\[([\d,]+)\]", result)
        ]
        name = re.search(r'op_name="([^"]*)"', line)
        out.append((arrays, replica_groups(line), name.group(1) if name else ""))
    return out


def on_both_layouts(items, models=("tiny-llama", "tiny-gpt2")):
    """``pytest.param(item, model, scan)`` for each item on the scanned and the unrolled stack,
    the models taking turns: every item meets both layouts and both models, in half the
    compiles of the full product."""
    import pytest

    return [
        pytest.param(
            item,
            models[(i + scan) % 2],
            scan,
            id=f"{item}-{models[(i + scan) % 2]}-" + ("scan" if scan else "unrolled"),
        )
        for i, item in enumerate(items)
        for scan in (True, False)
    ]


@functools.cache
def maxtext_tpu_devices(name: str):
    """libtpu's devices for MaxText's ``compile_topology`` ``name``, built with the arguments
    MaxText's ``accelerator_to_spec_map`` gives (not remat_kit's): the TPU tests' independent
    topology."""
    import os

    from jax.experimental import topologies
    from maxtext.utils.accelerator_to_spec_map import UserFacingNameToSystemCharacteristics

    spec = UserFacingNameToSystemCharacteristics[name]
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # xdist's workers side by side
    return topologies.get_topology_desc(
        platform="tpu",
        topology_name=spec.topology_name,
        chip_config_name=spec.chip_config_name,
        chips_per_host_bounds=spec.chips_per_host_bounds,
        num_slices=1,
        wrap=spec.wrap,
    ).devices


def changed(workload, **changes):
    """``workload`` (of a ``Measured`` step) with some of its fields changed: the Workload's
    own (``target``, ``spread``...) on it, the rest (callbacks, ``n_layers``,
    ``schedule_kinds``) on its Measured step; a new workload, caches empty."""
    import dataclasses

    own = {f.name for f in dataclasses.fields(workload) if f.init}
    mine = {k: changes.pop(k) for k in list(changes) if k in own}
    source = dataclasses.replace(workload.source, **changes) if changes else workload.source
    return dataclasses.replace(workload, source=source, **mine)
