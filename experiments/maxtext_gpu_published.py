"""Published multi-node MaxText GPU runs through ``--maxtext``: predicted vs published step time.

Issue 61. Every row of ``experiments/data/maxtext_gpu_published.json`` (each with its source at a
commit: MaxText's A3 Llama2-7B table at 1-16 VMs, JAX-Toolbox's one-node Llama2-7B, NVIDIA
dgxc-benchmarking's Llama2-70B at 64-2,048 H100s, gpu-recipes' A3 Ultra Llama-3.1-70B log line)
is compiled deviceless through ``remat-kit report --maxtext`` with the row's **own** MaxText
config keys (not a preset), at its full mesh (``--gpus`` = the row's GPUs, ``--hosts`` = its
nodes, ``--node`` its machine, so the ``dcn_*`` keys lay their axes across hosts as MaxText does
on a GPU cluster), with the XLA flags and the allocator fraction its script exports. The
program's predicted step time (remat_kit/timing) is set beside the published figure.

What is translated, and why (each row's JSON says which of its words were):

* The keys the command line owns become its flags: ``per_device_batch_size`` x GPUs is
  ``--batch``, ``max_target_length`` is ``--seq``, ``remat_policy`` is
  ``--policy maxtext:remat_policy=NAME``; ``remat_policy=custom`` with ``NAME=device`` lines is
  ``--policy names:save=...`` (``decoder_layer_input`` included, MaxText's default for it is
  ``device``; remat-kit writes the same lines back, ``meta.maxtext.policy_lines``);
  ``hardware`` (``gpu`` / ``gpu_multiprocess``) is ``--target h100``/``h200``.
* ``attention=cudnn_flash_te`` (TransformerEngine's cuDNN fused attention) is
  ``attention=cudnn_flash_jax`` (cuDNN's flash attention through jax): TransformerEngine is not
  installed here and ``--maxtext`` refuses the TE kernel without it. Both are cuDNN's fused
  flash-attention kernels; remat-kit prices either from its shapes.
* Run logistics (``run_name``, ``steps``, output and data paths, profiler, goodput, the YAML
  path, which is MaxText's ``base.yml`` either way) are left out: they change no program.
  An empty ``quantization=`` is MaxText's default and is left out.
* XLA flags this XLA (jax 0.12) no longer knows are left out (:data:`DROPPED_FLAGS`; each
  is fatal in ``XLA_FLAGS``), and so are the dump flags. ``XLA_PYTHON_CLIENT_MEM_FRACTION``
  is ``--mem-fraction``.

The published figure becomes a step time as the source gives it: a step time is one; a
TFLOP/s per chip (MaxText's A3 table, April 2024) stands for ``TFLOP / (TFLOP/s)`` seconds,
the TFLOP by MaxText's formula of that commit (``maxtext_utils.calculate_tflops_training_per
_device`` at efb6d9e4: ``6 x params x tokens`` plus causal attention ``12 x heads x layers x
head_dim x seq^2 x batch / 2``), with ``params`` the train state's parameter count that
remat-kit reads from MaxText's own state (``meta.params``, as MaxText's
``calculate_num_params_from_pytree``). Nothing is fitted to the published figures.

Usage: ``python experiments/maxtext_gpu_published.py [ID ...]`` (row ids, default all) runs
each row as a ``remat-kit report --json`` subprocess with a :data:`TIMEOUT_S` limit, writes
results/maxtext_gpu_published.json (rows not named keep their last result) and prints the
table. Cold timings: ``REMAT_KIT_CACHE_DIR=$(mktemp -d) python experiments/...``.
``--own [ID ...]`` compiles MaxText's own ``train_compile.main`` for the rows (their config at
their full mesh, their XLA flags and allocator fraction; experiments/maxtext_own.py) and
records whether its five byte counts equal the ``--maxtext`` report's (``maxtext_own``).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import ROOT, table, write_json

DATA = ROOT / "experiments" / "data" / "maxtext_gpu_published.json"
OUT = ROOT / "results" / "maxtext_gpu_published.json"
CLI = str(Path(sys.executable).parent / "remat-kit")
TIMEOUT_S = 600  # a row that does not compile in 10 minutes on this machine is not priced

#: Config keys that are run logistics: they change no compiled program.
LOGISTICS = {
    "run_name", "steps", "base_output_directory", "dataset_path", "dataset_type",
    "tokenizer_path", "enable_checkpointing", "async_checkpointing", "enable_profiler",
    "profiler", "skip_first_n_steps_for_profiler", "profiler_steps", "monitor_goodput",
    "enable_goodput_recording", "save_config_to_gcs", "base_config",
}  # fmt: skip

#: XLA flags of the sources' scripts that this XLA (jax 0.12) no longer has, and why leaving
#: them out changes nothing the flag meant (or what it loses).
DROPPED_FLAGS = {
    "--xla_gpu_graph_level": "command buffers off: --xla_gpu_enable_command_buffer= (empty) "
    "says it in this XLA, and is passed instead",
    "--xla_gpu_enable_async_all_gather": "asynchronous collectives are XLA's default now",
    "--xla_gpu_enable_async_reduce_scatter": "asynchronous collectives are XLA's default now",
    "--xla_gpu_enable_async_all_reduce": "asynchronous collectives are XLA's default now",
    "--xla_gpu_simplify_all_fp_conversions": "removed from XLA",
    "--xla_gpu_enable_triton_softmax_fusion": "removed from XLA",
    "--xla_gpu_enable_custom_fusions": "removed from XLA",
    "--xla_gpu_enable_address_computation_fusion": "removed from XLA (was false in the source)",
    "--xla_gpu_pgle_profile_file_or_directory_path": "the run's own profile (PGLE) is not "
    "published: the latency-hiding scheduler schedules by its own cost model here",
    "--xla_dump_to": "a dump of the HLO: changes no program",
    "--xla_dump_hlo_as_text": "a dump of the HLO: changes no program",
}

#: What each source's machines and software differ in from what remat-kit prices (words for
#: the table's last column; the figures beside them are the program's own split).
DRIVERS = {
    "jt": "compute: the kernels at remat-kit's calibrated rates (one H100, short runs) fall short "
    "of the published step; attention is TransformerEngine's cuDNN fused kernel there, cuDNN "
    "flash through jax priced from its shapes here; one node, no network",
    "a3": "compute, as on one node; over GPUDirect-TCPX (the node table's 4 x 200 Gb/s) the "
    "data-parallel gradient all-reduce after the last layer adds what was published at 2 VMs "
    "and more than published at 4-16 (the added-step column), which hides part of the compute "
    "gap there; the April 2024 stack (TE attention, that XLA's scheduler)",
    "dgxc": "compute (rates above what the runs sustained); FSDP's gathers over InfiniBand NDR "
    "hide behind the layers, the step flat from 64 to 2,048 GPUs as published; the run's "
    "profile-guided schedule (PGLE) is not published; TE attention there",
    "a3u": "compute on H200 (H100's bf16 peak, H200's HBM rate); the published figure is one "
    "example log line (step 12 of 50), not a mean; TE attention there",
}


def _family(row_id: str) -> str:
    return row_id.split("-")[0]


def translate(row: dict[str, Any]) -> dict[str, Any]:
    """The row's config and environment as ``remat-kit report`` words, and what was changed."""
    words = shlex.split(row["config"].replace("${", "{").replace("$", ""))
    kept: dict[str, str] = {}
    left_out: dict[str, str] = {}
    custom: list[str] = []
    owned: dict[str, str] = {}
    for word in words:
        key, eq, value = word.partition("=")
        if not eq:
            if key.endswith(".yml") or key.endswith(":"):
                left_out[key] = "the YAML path: MaxText's base.yml either way"
            continue
        if key in LOGISTICS:
            left_out[key] = "run logistics"
        elif key in ("per_device_batch_size", "max_target_length", "hardware"):
            owned[key] = value
        elif key == "remat_policy":
            owned[key] = value  # the last one given wins, as in MaxText's command line
        elif value in ("device", "offload", "remat"):
            custom.append(f"{key}={value}")
        elif key == "quantization" and value == "":
            left_out[key] = "empty: MaxText's default"
        elif key == "attention" and value == "cudnn_flash_te":
            kept[key] = "cudnn_flash_jax"
            left_out["attention=cudnn_flash_te"] = (
                "TransformerEngine is not installed here: cuDNN's flash attention through jax "
                "(cudnn_flash_jax) instead"
            )
        else:
            kept[key] = value
    policy_name = owned.get("remat_policy", "full")
    if policy_name == "custom":
        saved = [c.split("=")[0] for c in custom if c.endswith("=device")]
        offloaded = [c.split("=")[0] for c in custom if c.endswith("=offload")]
        if "decoder_layer_input" not in {c.split("=")[0] for c in custom}:
            saved.append("decoder_layer_input")  # MaxText's default line for it: device
        policy = (
            f"offload:offload={','.join(offloaded)},save={','.join(saved)}"
            if offloaded
            else "names:save=" + "+".join(saved)
        )
    else:
        policy = f"maxtext:remat_policy={policy_name}"
    per_device = float(owned["per_device_batch_size"])
    batch = per_device * row["gpus"]
    env = dict(row.get("env", {}))
    flags, dropped = [], {}
    for flag in env.get("XLA_FLAGS", "").split():
        name = flag.split("=")[0]
        if name in DROPPED_FLAGS:
            dropped[flag] = DROPPED_FLAGS[name]
        else:
            flags.append(flag.replace("=''", "="))
    if any(f.startswith("--xla_gpu_graph_level=0") for f in dropped) and not any(
        f.startswith("--xla_gpu_enable_command_buffer") for f in flags
    ):
        flags.append("--xla_gpu_enable_command_buffer=")
    target = "h200" if row["node"] == "a3-ultra" else "h100"
    cmd = ["report", "--maxtext", *(f"{k}={v}" for k, v in kept.items()),
           "--target", target, "--gpus", str(row["gpus"]), "--hosts", str(row["nodes"]),
           "--node", row["node"], "--batch", str(int(batch)), "--seq", owned["max_target_length"],
           "--policy", policy, "--no-residuals"]  # fmt: skip
    if "XLA_PYTHON_CLIENT_MEM_FRACTION" in env:
        cmd[cmd.index("--no-residuals") : cmd.index("--no-residuals")] = [
            "--mem-fraction", env["XLA_PYTHON_CLIENT_MEM_FRACTION"]
        ]  # fmt: skip
    return {
        "args": cmd,
        "xla_flags": " ".join(flags),
        "per_device_batch_size": per_device,
        "seq": int(owned["max_target_length"]),
        "left_out": left_out,
        "flags_left_out": dropped,
    }


def maxtext_2024_tflop(params: int, heads: int, layers: int, head_dim: int, b: float, s: int):
    """TFLOP per device per step by MaxText's formula at efb6d9e4 (April 2024, the A3 table's
    date): ``6 x params x seq x batch`` + causal attention ``12 x heads x layers x head_dim x
    seq^2 x batch / 2``."""
    return (6 * params * s * b + 12 * heads * layers * head_dim * s**2 * b / 2) / 1e12


def _arch(model_name: str) -> dict[str, int]:
    """heads, layers, head_dim of MaxText's model config as the installed maxtext ships it."""
    import maxtext
    import yaml

    path = Path(maxtext.__file__).parent / "configs" / "models" / f"{model_name}.yml"
    cfg = yaml.safe_load(path.read_text())
    return {
        "heads": cfg["base_num_query_heads"],
        "layers": cfg["base_num_decoder_layers"],
        "head_dim": cfg["head_dim"],
    }


_SPLIT = ("matmul", "attention", "memory", "collective", "contention", "transfer", "launch")


_FIELDS = ("argument", "output", "alias", "temp", "generated_code")


def own_words(row: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The row's config as MaxText's own command line takes it (after ``base.yml``): the words
    ``--maxtext`` got, the policy as MaxText's keys (the lines remat-kit writes), the batch and
    sequence; and the translation."""
    tr = translate(row)
    args = tr["args"]
    words = args[args.index("--maxtext") + 1 : args.index("--target")]
    policy = args[args.index("--policy") + 1]
    if policy.startswith("maxtext:"):
        remat = [policy.split(":", 1)[1]]
    else:
        remat = [
            "remat_policy=custom",
            *(f"{n}=device" for n in policy.split("=", 1)[1].split("+")),
        ]
    per_device = tr["per_device_batch_size"]
    words += [*remat, "override_model_config=True",
              f"per_device_batch_size={int(per_device) if per_device.is_integer() else per_device}",
              f"max_target_length={tr['seq']}", "jax_cache_dir="]  # fmt: skip
    return words, tr


def _ours_bytes(row: dict[str, Any], tr: dict[str, Any]) -> dict[str, int] | None:
    """The five byte counts of the row's ``--maxtext`` report (from the cache when it holds
    the compile), or None when the report gives none."""
    out_json = Path("/tmp") / f"maxtext_gpu_published_{row['id']}_own.json"
    out_json.unlink(missing_ok=True)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": tr["xla_flags"]}
    env.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
    subprocess.run([CLI, *tr["args"], "--json", str(out_json)], capture_output=True,
                   timeout=TIMEOUT_S, cwd=ROOT, env=env, check=False)  # fmt: skip
    if not out_json.exists():
        return None
    rep = json.loads(out_json.read_text())
    return {f: rep[f"{f}_bytes"] for f in _FIELDS}


def own_check(row: dict[str, Any]) -> dict[str, Any]:
    """MaxText's own AOT path (``train_compile.main`` in a fresh process,
    experiments/maxtext_own.py) for the row's config at its full mesh, with the row's XLA flags
    and allocator fraction, against the five byte counts its ``--maxtext`` report holds."""
    from maxtext_own import own_path

    words, tr = own_words(row)
    saved = {k: os.environ.get(k) for k in ("XLA_FLAGS", "XLA_PYTHON_CLIENT_MEM_FRACTION")}
    os.environ["XLA_FLAGS"] = tr["xla_flags"]
    fraction = row.get("env", {}).get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    if fraction:
        os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = fraction
    else:
        os.environ.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
    start = time.perf_counter()
    try:
        target = "h200" if row["node"] == "a3-ultra" else "h100"
        theirs = own_path(
            [{"words": words, "target": target, "gpus": row["gpus"], "hosts": row["nodes"]}],
            timeout=TIMEOUT_S,
        )[0]
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        theirs = {"error": f"{type(err).__name__}: {str(err)[-300:]}"}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    out: dict[str, Any] = {"wall_s": round(time.perf_counter() - start, 1), "argv": words}
    ours = _ours_bytes(row, tr)
    if ours is not None:
        out["ours_bytes"] = ours
    if "error" in theirs:
        out["error"] = theirs["error"]
        return out
    out["bytes"] = {f: theirs[f] for f in _FIELDS}
    out["mesh"] = (
        theirs.get("mesh", {}).get("shape") if isinstance(theirs.get("mesh"), dict) else None
    )
    return out


def run_one(row: dict[str, Any]) -> dict[str, Any]:
    """The row compiled and priced; the published figure beside the prediction."""
    tr = translate(row)
    out_json = Path("/tmp") / f"maxtext_gpu_published_{row['id']}.json"
    out_json.unlink(missing_ok=True)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": tr["xla_flags"]}
    env.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
    out: dict[str, Any] = {
        "id": row["id"], "gpus": row["gpus"], "nodes": row["nodes"], "node": row["node"],
        "urls": row["urls"], "command": "XLA_FLAGS=... remat-kit " + shlex.join(tr["args"]),
        "xla_flags": tr["xla_flags"], "left_out": tr["left_out"],
        "flags_left_out": tr["flags_left_out"], "load_before": os.getloadavg(),
    }  # fmt: skip
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [CLI, *tr["args"], "--json", str(out_json)],
            capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT, env=env,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        out["status"] = f"no compile within {TIMEOUT_S} s (the time limit used)"
        out["wall_s"] = TIMEOUT_S
        return out
    out["wall_s"] = round(time.perf_counter() - start, 1)
    out["load_after"] = os.getloadavg()
    if not out_json.exists():
        out["status"] = f"refused (exit {done.returncode}): {done.stderr.strip()[-600:]}"
        return out
    rep = json.loads(out_json.read_text())
    st = rep.get("step_time")
    if not st:
        out["status"] = "compiled, not priced: " + "; ".join(rep.get("warnings", []))[:400]
        return out
    meta = rep["meta"]
    seconds = st["seconds"]
    published = row["published"]
    out.update(
        status="priced",
        compile_seconds=rep.get("compile_seconds"),
        peak_gib=rep["peak_bytes"] / 2**30,
        usable_gib=rep["usable_bytes"] / 2**30,
        bytes={f: rep[f"{f}_bytes"] for f in _FIELDS},
        fits=rep["fits"],
        policy_lines=meta.get("maxtext", {}).get("policy_lines"),
        mesh=meta.get("maxtext", {}).get("mesh"),
        params=meta["params"],
        predicted_s=seconds,
        split={k: st[f"{k}_seconds"] for k in _SPLIT},
        collective_hidden_s=st["collective_hidden_seconds"],
        recompute_s=st["recompute_seconds"],
        our_mfu=st.get("mfu"),
        collectives=meta.get("collectives"),
        quantity=published["quantity"],
        published=published["value"],
    )
    if published["quantity"] == "TFLOP/s/chip":
        model_name = dict(w.split("=", 1) for w in row["config"].split() if "=" in w)["model_name"]
        tflop = maxtext_2024_tflop(
            meta["params"], **_arch(model_name), b=tr["per_device_batch_size"], s=tr["seq"]
        )
        out["maxtext_2024_tflop_per_device"] = tflop
        out["published_s"] = tflop / published["value"]
        out["predicted"] = tflop / seconds
    else:
        out["published_s"] = published["value"]
        out["predicted"] = seconds
    out["error"] = seconds / out["published_s"] - 1
    return out


def _write(rows: list[dict[str, Any]]) -> None:
    write_json(
        OUT,
        {
            "description": "remat-kit's predicted step time for the published multi-node MaxText "
            "GPU runs, each compiled through --maxtext with its own config at its full mesh "
            "(experiments/maxtext_gpu_published.py; issue 61)",
            "data": str(DATA.relative_to(ROOT)),
            "timeout_s": TIMEOUT_S,
            "cpu_count": os.cpu_count(),
            "rows": rows,
        },
    )


def _shown(x: dict[str, Any]) -> dict[str, str]:
    priced = x.get("status") == "priced"
    split = x.get("split", {})
    top = sorted(split.items(), key=lambda kv: -kv[1])[:3] if priced else []
    return {
        "row": x["id"],
        "GPUs": f"{x['gpus']} ({x['nodes']} node{'s' if x['nodes'] > 1 else ''})",
        "published": f"{x['published']:.4g} {'s' if x['quantity'] != 'TFLOP/s/chip' else 'TFLOP/s'}"
        if priced
        else "-",
        "predicted": (
            f"{x['predicted']:.4g} {'s' if x['quantity'] != 'TFLOP/s/chip' else 'TFLOP/s'}"
            if priced
            else x["status"][:60]
        ),
        "step s pred/pub": f"{x['predicted_s']:.3f}/{x['published_s']:.3f}" if priced else "-",
        "error": f"{x['error']:+.1%}" if priced else "-",
        "split (s)": ", ".join(f"{k} {v:.2f}" for k, v in top),
        "compile s": f"{x['wall_s']:.0f}",
    }


def _growth(x: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """Step time added over the family's one-node row, predicted / published (seconds): what
    the network adds in each, with the compute (the same program per GPU) taken out."""
    fam = [r for r in rows if _family(r["id"]) == _family(x["id"]) and r["status"] == "priced"]
    base = min(fam, key=lambda r: r["gpus"])
    if base["id"] == x["id"]:
        return "-"
    pred, pub = x["predicted_s"] - base["predicted_s"], x["published_s"] - base["published_s"]
    return f"{pred:+.3f} / {pub:+.3f} (vs {base['gpus']})"


#: The same runs rebuilt from presets (experiments/published_runs.py -> results/step_time.json,
#: its ``family``), for the column that sets the two programs' predictions side by side.
_PRESET_FAMILY = {"jt": "7b-dgx", "a3": "7b-a3", "dgxc": "70b-dgx"}


def _preset(x: dict[str, Any]) -> str:
    path = ROOT / "results" / "step_time.json"
    fam = _PRESET_FAMILY.get(_family(x["id"]))
    if fam is None or not path.exists():
        return "-"
    got = [
        r["predicted s"]
        for r in json.loads(path.read_text()).get("published", [])
        if r.get("family") == fam and r.get("gpus") == x["gpus"]
    ]
    return f"{got[0]:.3f}" if got else "-"


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as the Markdown table of docs/your-model.md ("Published multi-node runs")."""
    head = (
        "| row | GPUs (nodes) | published | predicted | step s pred / pub | error | "
        "exposed comm. s | added step s pred / pub | preset's pred. s | wall s (load) |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for x in rows:
        if x.get("status") != "priced":
            lines.append(f"| {x['id']} | {x['gpus']} ({x['nodes']}) | | {x['status']} ||||||")
            continue
        unit = "TFLOP/s/GPU" if x["quantity"] == "TFLOP/s/chip" else "s"
        load = x.get("load_after", x["load_before"])[0]
        lines.append(
            f"| {x['id']} | {x['gpus']} ({x['nodes']}) | {x['published']:.4g} {unit} | "
            f"{x['predicted']:.4g} {unit} | {x['predicted_s']:.3f} / {x['published_s']:.3f} | "
            f"{x['error']:+.1%} | {x['split']['collective']:.3f} | {_growth(x, rows)} | "
            f"{_preset(x)} | "
            f"{x['wall_s']:.0f} ({load:.1f}) |"
        )
    return "\n".join(lines)


def own_summary(rows: list[dict[str, Any]]) -> str:
    """How many rows MaxText's own AOT path (``--own``) matched in all five byte counts."""
    checked = [x["maxtext_own"] for x in rows if "maxtext_own" in x]
    equal = sum(1 for c in checked if c.get("equal") is True)
    wall = sum(c["wall_s"] for c in checked)
    return (
        f"MaxText's own train_compile.main, each row's config at its full mesh with its XLA "
        f"flags and allocator fraction: {equal} of {len(checked)} rows checked equal to "
        f"--maxtext in all five byte counts ({wall:.0f} s of MaxText compiles)"
    )


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Predicted vs published step time per row (the issue's figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from common import save_png

    priced = [x for x in rows if x.get("status") == "priced"]
    xs = range(len(priced))
    fig, ax = plt.subplots(figsize=(max(6, 0.75 * len(priced)), 4.2))
    ax.bar([i - 0.2 for i in xs], [x["published_s"] for x in priced], 0.4, label="published")
    ax.bar([i + 0.2 for i in xs], [x["predicted_s"] for x in priced], 0.4, label="predicted")
    for i, x in zip(xs, priced, strict=True):
        label = f"{x['error']:+.0%}"
        ax.text(i + 0.2, x["predicted_s"], label, ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(xs), [f"{x['id']}\n{x['gpus']} GPUs" for x in priced], rotation=60,
                  ha="right", fontsize=7)  # fmt: skip
    ax.set_yscale("log")
    ax.set_ylabel("step time, s (log)")
    ax.set_title("Published multi-node MaxText GPU runs through --maxtext")
    ax.legend()
    fig.tight_layout()
    save_png(fig, path)


def main(selected: list[str]) -> list[dict[str, Any]]:
    own = "--own" in selected
    selected = [s for s in selected if s != "--own"]
    data = json.loads(DATA.read_text())["rows"]
    order = [r["id"] for r in data]
    unknown = set(selected) - set(order)
    if unknown:
        raise SystemExit(f"unknown row id(s) {sorted(unknown)}; {order}")
    rows: list[dict[str, Any]] = []
    if selected and OUT.exists():  # rows not named keep their last result
        rows = [x for x in json.loads(OUT.read_text())["rows"] if own or x["id"] not in selected]
    for row in data:
        if selected and row["id"] not in selected:
            continue
        if own:  # the row's report stays; MaxText's own path is compiled beside it
            res = next(x for x in rows if x["id"] == row["id"])
            res["maxtext_own"] = check = own_check(row)
            if "bytes" in check and "ours_bytes" in check:
                check["equal"] = check["bytes"] == check["ours_bytes"]
            res.setdefault("wall_s", 0)
            print(f"{row['id']}: MaxText's own path {check.get('equal', check.get('error'))} "
                  f"({check['wall_s']:.0f} s)", file=sys.stderr)  # fmt: skip
            _write(rows)
            continue
        res = run_one(row)
        res["drivers"] = DRIVERS[_family(row["id"])]
        rows = [x for x in rows if x["id"] != row["id"]] + [res]
        rows.sort(key=lambda x: order.index(x["id"]))
        _write(rows)
        print(f"{row['id']}: {res['status'][:200]} ({res['wall_s']:.0f} s)", file=sys.stderr)
    shown = [_shown(x) for x in rows]
    print(table(shown, list(shown[0]), "published MaxText GPU runs through --maxtext"))
    print(markdown(rows))
    print(own_summary(rows))
    plot(rows, OUT.with_suffix(".png"))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
