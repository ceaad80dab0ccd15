"""MaxText's own AOT path, as a user runs it: ``train_compile.main`` in a fresh process.

The independent side of ``remat_kit_models.maxtext``'s figures (``tests/test_maxtext.py``,
``experiments/maxtext_scale.py``). Each config runs through MaxText's own entry point,
``maxtext.trainers.pre_train.train_compile.main``, with MaxText's own settings: its
``jax_default_prng_impl=unsafe_rbg`` (set by ``main`` for the whole process, as it is on a
cluster: the reason this runs in a process of its own), its ``get_topology_mesh`` (GPU branch:
``compile_topology=a3``, ``compile_topology_num_slices`` = hosts, ``jax.devices()`` and
``create_device_mesh``), its ``get_shaped_inputs``, ``jit_and_compile`` and the memory analysis
it prints. Three things stand in for the cluster, and nothing else of MaxText is touched:

- ``jax.devices()`` answers the compile-only GPUs of jax's own CUDA topology
  (``jax.experimental.topologies.get_topology_desc``) for the GPU's target config; on a
  cluster it answers the cards of all hosts (MaxText's ``mock_num_gpu_processes``);
- on more than one host, each GPU shows its host as its slice (``slice_index``), as on a
  GPU cluster (jax's compile-only GPUs all carry slice 0), and MaxText's ``Mesh`` is made
  of the cards themselves;
- a host of other than 8 GPUs (MaxText names one GPU host, ``a3``: 8 H100s) is registered
  in MaxText's ``accelerator_to_spec_map`` as ``a3`` is, with its GPUs per host.

XLA's options reach the compile as a GPU user gives them, in ``XLA_FLAGS``: remat-kit's
analysis-only codegen (``analysis_options``: the same buffer assignment without the machine
code; ``codegen="full"`` leaves them out, for jax's full codegen on both sides).

A TPU slice needs no stand-in: MaxText's TPU path (``compile_topology=v5e-4``,
``compile_topology_num_slices`` = the slices) asks libtpu for the slice's devices itself
(``get_topology_desc`` with its ``accelerator_to_spec_map`` arguments), deviceless, as a user
runs it on a CPU machine: the child has ``JAX_PLATFORMS=cpu`` and ``ALLOW_MULTIPLE_LIBTPU_LOAD=1``
(without it libtpu takes a machine-wide lock another process may hold), XLA_FLAGS as the
caller's, and nothing of MaxText is touched but the two spies that read its mesh and batch.

Run as a script it reads a JSON list of configs on stdin and writes one JSON line per config
(``own_path`` is the Python door); all GPU configs or all TPU ones::

    [{"words": [...], "target": "h100", "gpus": 8, "hosts": 1}]
    [{"words": [...], "target": "v5e-4", "slices": 1}]
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: The five byte counts of XLA's memory analysis, by the names MaxText's print gives them.
FIELDS = {
    "argument": "argument_size_in_bytes",
    "output": "output_size_in_bytes",
    "alias": "alias_size_in_bytes",
    "temp": "temp_size_in_bytes",
    "generated_code": "generated_code_size_in_bytes",
}

#: MaxText's one GPU host (``accelerator_to_spec_map``): 8 H100s.
_A3_GPUS = 8


def own_path(
    configs: Sequence[Mapping[str, Any]], *, codegen: str = "analysis", timeout: float = 3600
) -> list[dict[str, Any]]:
    """MaxText's own ``train_compile.main`` for each config, in one fresh process.

    Args:
      configs: each ``{"words": [...], "target": "h100", "gpus": N, "hosts": H}``: the words
        after ``base.yml`` as MaxText's command line takes them (per_device_batch_size,
        max_target_length, remat keys and all), and the compile-only GPUs; or for a TPU
        slice ``{"words": [...], "target": "v5e-4", "slices": S}`` (MaxText's
        ``compile_topology`` name). All of one kind: a process's XLA options are its first
        backend's.
      codegen: ``analysis`` (remat-kit's analysis-only codegen in ``XLA_FLAGS``) or ``full``.
      timeout: seconds for the whole process.

    Returns:
      Per config: the five byte counts (:data:`FIELDS`), ``mesh`` (the device ids of
      MaxText's mesh, in its order, and its axis sizes), ``sequences`` (the batch its step
      takes), or ``error`` (MaxText's message).

    Raises:
      RuntimeError: the process died without answering every config.
    """
    if codegen not in ("analysis", "full"):
        raise ValueError(f"codegen={codegen!r}: takes 'analysis' or 'full'")
    kinds = {_is_tpu(c["target"]) for c in configs}
    if len(kinds) > 1:
        raise ValueError(
            "own_path takes GPU configs or TPU ones in one call, not both: "
            + ", ".join(sorted({c["target"] for c in configs}))
        )
    # libtpu's lock is machine-wide; a compile-only process takes none (as remat-kit's own).
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        REMAT_KIT_OWN_CODEGEN=codegen,
        ALLOW_MULTIPLE_LIBTPU_LOAD="1",
    )
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve())],
        input=json.dumps(list(map(dict, configs))),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    answers = [json.loads(x[len(_MARK) :]) for x in done.stdout.splitlines() if x.startswith(_MARK)]
    if len(answers) != len(configs):
        raise RuntimeError(
            f"MaxText's own path answered {len(answers)} of {len(configs)} configs "
            f"(exit {done.returncode}): {done.stderr[-3000:]}"
        )
    return answers


_MARK = "REMAT_KIT_OWN "


def _is_tpu(name: str) -> bool:
    """Whether ``name`` is a TPU slice (``v5e-4``): MaxText's TPU path, not its GPU one."""
    import remat_kit as rk

    return rk.target(name).kind == "tpu"


def _xla_flags(target: Any) -> str:
    """``XLA_FLAGS`` words for remat-kit's analysis-only codegen (booleans as XLA spells them)."""
    from remat_kit.targets import PROCESS_FLAGS, analysis_options

    words = list(PROCESS_FLAGS)
    for key, value in analysis_options(target).items():
        words.append(f"--{key}={str(value).lower() if isinstance(value, bool) else value}")
    return " ".join(words)


class _OnHost:
    """A compile-only GPU as a GPU cluster shows it to MaxText: its slice is its host (jax's
    compile-only GPUs all carry slice 0; on a cluster each host is a slice, MaxText's a3)."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.slice_index = int(device.process_index)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.device, name)


def _cluster_mesh(mesh: Any) -> Any:
    """jax's ``Mesh`` of the cards the grid names (a cluster's devices are the cards)."""
    import numpy as np

    def make(grid: Any, *args: Any, **kwargs: Any) -> Any:
        cards = np.vectorize(lambda d: getattr(d, "device", d), otypes=[object])(grid)
        return mesh(cards, *args, **kwargs)

    return make


def _run(configs: list[dict[str, Any]]) -> None:
    if configs and _is_tpu(configs[0]["target"]):
        _run_tpu(configs)
        return
    # Flags first: XLA reads XLA_FLAGS once, as its first backend starts.
    import remat_kit as rk

    first = configs[0]
    target = rk.target(first["target"], devices=first["gpus"], hosts=first.get("hosts", 1))
    if os.environ.get("REMAT_KIT_OWN_CODEGEN", "analysis") == "analysis":
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + " " + _xla_flags(target)
        ).strip()
    else:
        from remat_kit.targets import PROCESS_FLAGS

        os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *PROCESS_FLAGS])

    import dataclasses

    import jax
    from jax.experimental import topologies
    from maxtext.configs import pyconfig
    from maxtext.trainers.pre_train import train_compile
    from maxtext.utils import accelerator_to_spec_map

    spec_map = accelerator_to_spec_map.UserFacingNameToSystemCharacteristics
    real_devices = jax.devices
    real_mesh = train_compile.Mesh
    for config in configs:
        t = rk.target(config["target"], devices=config["gpus"], hosts=config.get("hosts", 1))
        per_host = t.devices // t.hosts
        topology = "a3" if per_host == _A3_GPUS else f"a3-{per_host}gpu"
        spec_map.setdefault(
            topology, dataclasses.replace(spec_map["a3"], devices_per_slice=per_host)
        )
        devices = topologies.get_topology_desc(
            platform="cuda", target_config=t.compile_config, topology=t.topology
        ).devices
        if t.hosts > 1:
            devices = [_OnHost(d) for d in devices]
        jax.devices = lambda *a, _d=devices, **k: list(_d)  # the cluster's cards
        seen: dict[str, Any] = {}
        get_mesh = train_compile.get_topology_mesh

        def spy(cfg: Any, _get=get_mesh, _seen=seen) -> Any:
            mesh = _get(cfg)
            _seen["mesh"] = {
                "ids": [int(d.id) for d in mesh.devices.reshape(-1)],
                "shape": {k: int(v) for k, v in mesh.shape.items()},
            }
            return mesh

        get_inputs = train_compile.get_shaped_inputs

        def spy_inputs(mesh: Any, cfg: Any, _get=get_inputs, _seen=seen) -> Any:
            shaped = _get(mesh, cfg)
            _seen["sequences"] = int(shaped[0][1]["inputs"].shape[0])  # the step's batch
            return shaped

        train_compile.get_topology_mesh = spy
        train_compile.Mesh = _cluster_mesh(real_mesh)
        train_compile.get_shaped_inputs = spy_inputs
        base = Path(pyconfig.__file__).parent / "base.yml"
        argv = [
            "train_compile.py",
            str(base),
            *config["words"],
            "hardware=gpu",
            f"compile_topology={topology}",
            f"compile_topology_num_slices={t.hosts}",
        ]
        try:
            answer = _run_main(train_compile, argv)
        finally:
            train_compile.get_topology_mesh = get_mesh
            train_compile.Mesh = real_mesh
            train_compile.get_shaped_inputs = get_inputs
            jax.devices = real_devices
        answer.update(seen, argv=shlex.join(argv[2:]))
        print(_MARK + json.dumps(answer), flush=True)


def _memory(printed: str) -> dict[str, int]:
    """The five counts of the memory analysis ``train_compile.main`` printed."""
    found = re.search(r"Memory analysis: (CompiledMemoryStats\(.*\))", printed)
    return {k: int(re.search(rf"\b{v}=(\d+)", found[1])[1]) for k, v in FIELDS.items()}


def _spies(train_compile: Any, seen: dict[str, Any]) -> list[tuple[str, Any]]:
    """Puts spies on MaxText's mesh and inputs that note what they return in ``seen``; the
    originals, to put back."""
    get_mesh = train_compile.get_topology_mesh
    get_inputs = train_compile.get_shaped_inputs

    def spy(cfg: Any) -> Any:
        mesh = get_mesh(cfg)
        seen["mesh"] = {
            "ids": [int(d.id) for d in mesh.devices.reshape(-1)],
            "shape": {k: int(v) for k, v in mesh.shape.items()},
        }
        return mesh

    def spy_inputs(mesh: Any, cfg: Any) -> Any:
        shaped = get_inputs(mesh, cfg)
        seen["sequences"] = int(shaped[0][1]["inputs"].shape[0])  # the step's batch
        seen["attention"] = str(cfg.attention)
        return shaped

    train_compile.get_topology_mesh = spy
    train_compile.get_shaped_inputs = spy_inputs
    return [("get_topology_mesh", get_mesh), ("get_shaped_inputs", get_inputs)]


def _run_tpu(configs: list[dict[str, Any]]) -> None:
    """MaxText's TPU path for each config: ``train_compile.main`` as a user runs it, the
    slice named by ``compile_topology``; only the spies added (no stand-in: libtpu builds the
    slice deviceless)."""

    from maxtext.configs import pyconfig
    from maxtext.trainers.pre_train import train_compile

    base = Path(pyconfig.__file__).parent / "base.yml"
    for config in configs:
        argv = [
            "train_compile.py",
            str(base),
            *config["words"],
            f"compile_topology={config['target']}",
            f"compile_topology_num_slices={config.get('slices', 1)}",
        ]
        seen: dict[str, Any] = {}
        originals = _spies(train_compile, seen)
        try:
            answer = _run_main(train_compile, argv)
        finally:
            for name, original in originals:
                setattr(train_compile, name, original)
        answer.update(seen, argv=shlex.join(argv[2:]))
        print(_MARK + json.dumps(answer), flush=True)


def _run_main(train_compile: Any, argv: list[str]) -> dict[str, Any]:
    """``train_compile.main(argv)``: its memory analysis and key type, or MaxText's refusal,
    which is the answer for that config."""
    import contextlib
    import io

    import jax

    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            train_compile.main(argv)
    except BaseException as err:
        return {"error": f"{type(err).__name__}: {' '.join(str(err).split())}"}
    answer = _memory(out.getvalue())
    answer["prng_impl"] = str(jax.config.jax_default_prng_impl)
    return answer


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    _run(json.load(sys.stdin))
