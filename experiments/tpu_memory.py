"""TPU memory to the byte: remat-kit's report against a bare ``jax.jit`` deviceless TPU compile.

For three models (two presets, sharded ``fsdp:4``, and Hugging Face's Flax Llama as a factory
with its decoder layer patched by ``block``, also ``fsdp:4``), three TPU generations (4-chip
slices of v5e, v5p and v6e) and every catalogue policy (``rk.policy_names()``; a family that
takes parameters with the example ``remat-kit policies`` shows): remat-kit's figure
(``rk.sources.measure``, as ``compare`` gives it) and a bare compile of the same step built
here. The bare side takes libtpu's devices from ``get_topology_desc`` with MaxText's own
``accelerator_to_spec_map`` arguments, orders them with jax's ``create_device_mesh``, puts each
argument's PartitionSpec (and memory kind) on that mesh of the same axis names and sizes, and
compiles ``jax.jit(fn, donate_argnums, in_shardings, out_shardings)`` of the step's function.
Argument, output, alias, temp and generated-code bytes and the peak (argument + output + temp -
alias) are compared, with the host (pinned_host) bytes beside them.

The bare side is compiled two ways: with the shardings given only as ``in_shardings=`` and the
abstract arguments bare, and with the arguments carrying the same shardings (as placed
``jax.Array`` s do in a real call). The two lower to one program except where the step draws
random bits (GPT-2's dropout): there jax traces the bare key argument on an empty abstract mesh
and the keys folded from it on the ``fsdp`` mesh, so ``random_fold_in`` lowers to two private
``_threefry_fold_in`` functions instead of one; libtpu assigns that program 32,256 to 65,024
more bytes of temp on v5e and v6e (on v5p, one policy of six). remat-kit places its arguments,
as a real call's arrays are placed: its figure is the placed program's.

Widths are cut so the ~400 compiles fit on two CPU cores (libtpu takes 30-120 s a compile at
the presets' real widths): the table names each model's overrides. The bare compiles of
policies whose lowered programs are identical (same StableHLO text) are shared; remat-kit
shares them through its own on-disk cache the same way (``--no-cache`` turns that off).
Writes results/tpu_memory.json (after each row: a stopped run keeps what it did).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import RESULTS, ROOT, table, write_json

#: The five byte counts of XLA's memory analysis, remat-kit's names, with the bare side's.
FIELDS = {
    "argument_bytes": "argument_size_in_bytes",
    "output_bytes": "output_size_in_bytes",
    "alias_bytes": "alias_size_in_bytes",
    "temp_bytes": "temp_size_in_bytes",
    "generated_code_bytes": "generated_code_size_in_bytes",
}
HOST = ("host_argument", "host_output", "host_temp", "host_alias")
#: Small widths: the paths (sharding, policies, libtpu) are under test, not the sizes.
SMALL = {"layers": 2, "width": 256, "ff": 1024, "heads": 4, "vocab": 4096}
HF_LLAMA = "transformers.models.llama.modeling_flax_llama:FlaxLlamaDecoderLayer"
FACTORY = str(ROOT / "tests" / "data" / "factories.py") + ":hf_llama"


@dataclasses.dataclass(frozen=True)
class Model:
    """One model: how to resolve it, and the words the table gives it."""

    name: str
    kind: str  # "preset" or "factory"
    what: str  # preset name or factory spec
    overrides: tuple[tuple[str, Any], ...] = ()
    block: str | None = None

    def source(self, shard: str) -> Any:
        import remat_kit as rk
        from remat_kit_models.spec import PresetSpec

        if self.kind == "preset":
            return rk.sources.resolve(PresetSpec(self.what, overrides=self.overrides, shard=shard))
        return rk.sources.from_factory(self.what, block=self.block, shard=shard)

    def words(self) -> str:
        if self.kind == "preset":
            sizes = ",".join(f"{k}={v}" for k, v in self.overrides)
            return f"preset {self.what} ({sizes})"
        return (
            f"factory {Path(self.what).name} (transformers FlaxLlamaForCausalLMModule, 4 layers, "
            f"width 64, vocab 256, fp32; block {self.block.split(':')[1]})"
        )


MODELS = {
    "llama3.2-1b": Model("llama3.2-1b", "preset", "llama3.2-1b", tuple(SMALL.items())),
    "gpt2-medium": Model("gpt2-medium", "preset", "gpt2-medium", tuple(SMALL.items())),
    "hf-llama": Model("hf-llama", "factory", FACTORY, block=HF_LLAMA),
}
#: One 4-chip slice of each generation, as MaxText's compile_topology names it.
SLICES = {"v5e": "v5e-4", "v5p": "v5p-8", "v6e": "v6e-4"}
SHARD = "fsdp:4"
BATCH, SEQ = 8, 128


def catalogue() -> list[str]:
    """Every catalogue policy as a spec: a parameterized family by its listing's example."""
    import remat_kit as rk
    from remat_kit.cli._listings import _EXAMPLES

    return [_EXAMPLES.get(name, name) for name in rk.policy_names()]


def _topology(slice_name: str) -> list[Any]:
    """libtpu's devices for MaxText's compile_topology ``slice_name`` (MaxText's arguments)."""
    from jax.experimental import topologies
    from maxtext.utils.accelerator_to_spec_map import UserFacingNameToSystemCharacteristics

    spec = UserFacingNameToSystemCharacteristics[slice_name]
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    return topologies.get_topology_desc(
        platform="tpu",
        topology_name=spec.topology_name,
        chip_config_name=spec.chip_config_name,
        chips_per_host_bounds=spec.chips_per_host_bounds,
        num_slices=1,
        wrap=spec.wrap,
    ).devices


def _where(d: Any) -> tuple[Any, ...]:
    return (d.id, tuple(d.coords), d.core_on_chip, d.device_kind)


class Bare:
    """Bare compiles of steps for one slice, shared between identical lowered programs."""

    def __init__(self, slice_name: str) -> None:
        self.devices = _topology(slice_name)
        self.memo: dict[str, dict[str, Any]] = {}

    def _mesh(self, axes: dict[str, int], theirs: Any) -> Any:
        """A mesh of ``axes`` over this slice, ordered by jax's ``create_device_mesh``.

        A sharded step constrains its activations to its own mesh inside the function, and
        jax compiles a function for one set of device objects: the mesh is made of the step's
        own device objects, after checking that they are libtpu's devices for MaxText's
        arguments (id, coordinates, core, kind)."""
        import numpy as np
        from jax.experimental import mesh_utils
        from jax.sharding import Mesh

        if not axes:
            return Mesh(np.array(self.devices[:1]), ("x",))
        own = sorted(theirs.devices.flat, key=lambda d: d.id)
        assert [_where(d) for d in own] == [_where(d) for d in self.devices], (own, self.devices)
        shape = tuple(axes.values())
        return Mesh(mesh_utils.create_device_mesh(shape, own), tuple(axes))

    def compile(self, step: Any) -> dict[str, dict[str, Any]]:
        """Compiles ``step``'s function on a mesh of this slice's devices, two ways: the
        shardings given to ``jax.jit(in_shardings=...)`` with bare abstract arguments
        (``"in_shardings"``), and the same shardings carried by the abstract arguments as
        placed arrays carry theirs (``"placed"``, also given as ``in_shardings``)."""
        import jax
        from jax.sharding import NamedSharding, PartitionSpec, Sharding

        def is_leaf(x: Any) -> bool:
            return x is None or isinstance(x, Sharding)

        leaves = [s for s in jax.tree.leaves(step.in_shardings, is_leaf=is_leaf) if s is not None]
        axes = dict(leaves[0].mesh.shape) if leaves else {}
        mesh = self._mesh(axes, leaves[0].mesh if leaves else None)

        def placed(s: Any) -> Any:
            if s is None:
                return None
            return NamedSharding(mesh, s.spec, memory_kind=s.memory_kind)

        args = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type), step.args
        )
        kwargs: dict[str, Any] = {"donate_argnums": step.donate_argnums}
        if leaves:
            ins = jax.tree.map(placed, step.in_shardings, is_leaf=is_leaf)
            kwargs["in_shardings"] = ins
            if step.out_shardings is not None:
                kwargs["out_shardings"] = jax.tree.map(placed, step.out_shardings, is_leaf=is_leaf)
            with_sharding = tuple(
                jax.tree.map(
                    lambda a, sh: jax.ShapeDtypeStruct(
                        a.shape, a.dtype, weak_type=a.weak_type, sharding=sh
                    ),
                    arg,
                    sh,
                )
                for arg, sh in zip(args, ins, strict=True)
            )
        else:  # one device: the arguments whole on it
            one = NamedSharding(mesh, PartitionSpec())
            args = jax.tree.map(
                lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one), args
            )
            with_sharding = args
        fn = getattr(step.fn, "__wrapped__", step.fn)
        return {
            "in_shardings": self._analysis(jax.jit(fn, **kwargs), args),
            "placed": self._analysis(jax.jit(fn, **kwargs), with_sharding),
        }

    def _analysis(self, jitted: Any, args: Any) -> dict[str, Any]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lowered = jitted.lower(*args)
        key = hashlib.sha256(lowered.as_text().encode()).hexdigest()[:16]
        if key not in self.memo:
            start = time.perf_counter()
            try:
                m = lowered.compile().memory_analysis()
            except Exception as err:  # libtpu's refusal (CompileTimeHbmOom) or another
                self.memo[key] = {"error": (str(err).strip().splitlines() or ["?"])[0][:300]}
            else:
                out = {ours: int(getattr(m, theirs)) for ours, theirs in FIELDS.items()}
                out.update({h: int(getattr(m, f"{h}_size_in_bytes", 0)) for h in HOST})
                out["peak_bytes"] = (
                    out["argument_bytes"]
                    + out["output_bytes"]
                    + out["temp_bytes"]
                    - out["alias_bytes"]
                )
                out["compile_seconds"] = round(time.perf_counter() - start, 1)
                self.memo[key] = out
        return {**self.memo[key], "program": key}


def _ours(src: Any, spec: str, target: Any, config: Any) -> dict[str, Any]:
    """remat-kit's report of the step: its five byte counts, peak and labels."""
    import remat_kit as rk

    start = time.perf_counter()
    r = rk.sources.measure(src, spec, target, config, warn=False)
    out = {k: int(getattr(r, k)) for k in (*FIELDS, "peak_bytes", "host_bytes")}
    out["compile_seconds"] = round(time.perf_counter() - start, 1)
    out["depth"] = r.meta.get("depth")
    out["warnings"] = list(r.warnings)
    return out


def row(model: Model, gen: str, spec: str) -> dict[str, Any]:
    """One (model, generation, policy): both sides and which of their counts are equal."""
    import remat_kit as rk
    from remat_kit.schedules import NO_SCHEDULE

    slice_name = SLICES[gen]
    target = rk.target(slice_name)
    config = rk.TrainConfig(batch=BATCH, seq=SEQ)
    src = _source(model)
    out: dict[str, Any] = {"model": model.name, "generation": gen, "slice": slice_name}
    out["policy"] = spec
    try:
        ours = _ours(src, spec, target, config)
    except Exception as err:
        out["ours_error"] = f"{type(err).__name__}: {(str(err).splitlines() or ['?'])[0][:300]}"
        ours = None
    try:
        step = src.build_step(rk.as_policy(spec), NO_SCHEDULE, config, target).step
        bares = _bare(slice_name).compile(step)
    except Exception as err:
        error = {"error": f"{type(err).__name__}: {(str(err).splitlines() or ['?'])[0][:300]}"}
        bares = {"in_shardings": error, "placed": error}
    out["ours"], out["bare"], out["bare_placed"] = ours, bares["in_shardings"], bares["placed"]
    out["same_program"] = bares["in_shardings"].get("program") == bares["placed"].get("program")
    for side, suffix in (("bare", ""), ("bare_placed", "_placed")):
        bare = out[side]
        if ours is not None and "error" not in bare:
            unequal = [k for k in (*FIELDS, "peak_bytes") if ours[k] != bare[k]]
            host = bare["host_argument"] + bare["host_output"] + bare["host_temp"]
            if ours["host_bytes"] != host - bare["host_alias"]:
                unequal.append("host_bytes")
            out["unequal" + suffix], out["equal" + suffix] = unequal, not unequal
        else:
            out["unequal" + suffix], out["equal" + suffix] = ["error"], False
    return out


_SOURCES: dict[str, Any] = {}
_BARES: dict[str, Bare] = {}


def _source(model: Model) -> Any:
    if model.name not in _SOURCES:
        _SOURCES[model.name] = model.source(SHARD)
    return _SOURCES[model.name]


def _bare(slice_name: str) -> Bare:
    if slice_name not in _BARES:
        _BARES[slice_name] = Bare(slice_name)
    return _BARES[slice_name]


def _verdict(r: dict[str, Any], suffix: str) -> str:
    return "equal" if r["equal" + suffix] else ",".join(r["unequal" + suffix])


def _table_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        ours, bare = r.get("ours") or {}, r.get("bare") or {}
        placed = r.get("bare_placed") or {}
        out.append(
            {
                "model": r["model"],
                "tpu": r["slice"],
                "policy": r["policy"].split(":")[0],
                "remat-kit peak B": ours.get("peak_bytes", r.get("ours_error", "")[:30]),
                "bare peak B": bare.get("peak_bytes", bare.get("error", "")[:30]),
                "vs bare (in_shardings=)": _verdict(r, ""),
                "bare, args placed": placed.get("peak_bytes", placed.get("error", "")[:30]),
                "vs bare (placed)": _verdict(r, "_placed"),
                "temp B": ours.get("temp_bytes", ""),
                "host B": ours.get("host_bytes", ""),
            }
        )
    return out


def _seed(path: Path) -> list[dict[str, Any]]:
    """Takes the bare compiles of an earlier run's results as already done (``--resume``):
    keyed by their program's hash, so only programs not compiled then are compiled now.
    Returns the earlier rows (those this run does not redo are kept in the results)."""
    import json

    if not path.exists():
        return []
    earlier = json.loads(path.read_text())["rows"]
    for r in earlier:
        for side in ("bare", "bare_placed"):
            bare = dict(r.get(side) or {})
            key = bare.pop("program", None)
            if key is not None and "error" not in bare:
                _bare(r["slice"]).memo.setdefault(key, bare)
    return earlier


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--models", default=",".join(MODELS), help=",".join(MODELS))
    p.add_argument("--generations", default=",".join(SLICES), help="v5e,v5p,v6e")
    p.add_argument("--policies", default="", help="comma-separated policy names (default: all)")
    p.add_argument("--quick", action="store_true", help="none and full only")
    p.add_argument("--no-cache", action="store_true", help="remat-kit compiles every row afresh")
    p.add_argument(
        "--resume", action="store_true", help="reuse the bare compiles of the results file"
    )
    args = p.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, str(ROOT))
    if args.no_cache:
        os.environ["REMAT_KIT_NO_CACHE"] = "1"
    import jax
    import libtpu

    specs = catalogue()
    if args.policies:
        wanted = set(args.policies.split(","))
        specs = [s for s in specs if s.split(":")[0] in wanted]
    if args.quick:
        specs = [s for s in specs if s in ("none", "full")]
    cases = [
        (MODELS[m], g, s)
        for m in args.models.split(",")
        for g in args.generations.split(",")
        for s in specs
    ]
    earlier = _seed(args.out / "tpu_memory.json") if args.resume else []
    redone = {(m.name, g, s) for m, g, s in cases}
    kept = [r for r in earlier if (r["model"], r["generation"], r["policy"]) not in redone]
    started = time.perf_counter()
    rows: list[dict[str, Any]] = list(kept)
    result: dict[str, Any] = {
        "command": "python experiments/tpu_memory.py " + " ".join(argv or sys.argv[1:]),
        "jax": jax.__version__,
        "libtpu": getattr(libtpu, "__version__", "?"),
        "config": {"batch": BATCH, "seq": SEQ, "shard": SHARD, "optimizer": "adamw (default)"},
        "models": {m.name: m.words() for m in MODELS.values()},
        "slices": SLICES,
        "rows": rows,
    }
    for model, gen, spec in cases:
        rows.append(row(model, gen, spec))
        r = rows[-1]
        print(
            f"{model.name:12} {gen} {spec:45} equal={r['equal']}/{r['equal_placed']} "
            f"{(r.get('ours') or {}).get('peak_bytes')} {r['bare'].get('peak_bytes')} "
            f"{r['bare_placed'].get('peak_bytes')} "
            f"({time.perf_counter() - started:.0f} s)",
            flush=True,
        )
        result["equal"] = sum(x["equal"] for x in rows)
        result["equal_placed"] = sum(x["equal_placed"] for x in rows)
        result["wall_seconds"] = round(time.perf_counter() - started, 1)
        write_json(args.out / "tpu_memory.json", result)
    print(table(_table_rows(rows), list(_table_rows(rows)[0]), "remat-kit vs bare jax.jit, TPU"))
    print(
        f"{len(rows)} rows; equal to the byte: {result['equal']} to the bare compile with "
        f"in_shardings=, {result['equal_placed']} to it with the arguments placed "
        f"({result['wall_seconds']} s)"
    )


if __name__ == "__main__":
    main()
