"""Does XProf's Memory Viewer, in a real browser, show our deviceless program and its peak?

Issue 46: ``remat-kit inspect --xprof DIR`` writes a profile directory with no GPU. This runs it
(default llama3-8b b4 s2048 on h100 under minimal; ``--quick``: tiny-llama b2 s64), starts
``xprof --logdir DIR`` on a free local port, reads the Memory Viewer's figures back from XProf's
own HTTP data endpoint (the JSON its Angular page draws from) and compares its peak with the
report's ``xla_peak_bytes`` and ``peak_bytes``, then opens the Memory Viewer page of our run, host
and module in headless Chromium (Debian's ``chromium``): the rendered DOM must state our module and
peak, and a screenshot goes to results/. The same ``inspect`` call writes ``--trace``: its JSON is
checked against the Chrome trace format (Perfetto's UI needs the internet, so no browser there).
Writes results/xprof_view.json and results/xprof_memory_viewer.png (``_quick`` with ``--quick``).
The server is stopped in a ``finally``.
"""

from __future__ import annotations

import argparse
import gzip
import html
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import RESULTS, ROOT, table, write_json

MIB = 2**20
#: Where xprof's standalone server mounts the profile plugin (xprof/server.py): its data routes
#: and, for a path without a dot, the Angular page, which reads the tool from the path.
PLUGIN = "/data/plugin/profile"
TOOL = "memory_viewer"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama3-8b")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--target", default="h100")
    p.add_argument("--policy", default="minimal")
    p.add_argument("--quick", action="store_true", help="tiny-llama b2 s64, for a smoke run")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument(
        "--baseline",
        action="store_true",
        help="also time a plain inspect (no --xprof/--trace): the time they add",
    )
    p.add_argument("--budget-ms", type=int, default=30000, help="Chromium's virtual time budget")
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.batch, args.seq = "tiny-llama", 2, 64
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    xprof = Path(sys.executable).parent / "xprof"
    if chromium is None:
        raise SystemExit("xprof_view: no chromium on PATH (apt-get install -y chromium)")
    if not xprof.exists():
        raise SystemExit(f"xprof_view: no {xprof} (pip install xprof)")
    suffix = "_quick" if args.quick else ""
    shot = args.out / f"xprof_memory_viewer{suffix}.png"
    args.out.mkdir(parents=True, exist_ok=True)
    run_args = [
        "--model", args.model, "--batch", str(args.batch), "--seq", str(args.seq),
        "--target", args.target, "--policy", args.policy,
    ]  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="xprof_view_"))
    start = time.perf_counter()
    try:
        data = _measure(args, run_args, work, xprof, chromium, shot)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    data["times_s"]["script_total"] = time.perf_counter() - start
    write_json(args.out / f"xprof_view{suffix}.json", data)
    c = data["compare"]
    rows = [
        {"figure": "XLA's peak (report xla_peak_bytes)", "bytes": c["xla_peak_bytes"]},
        {"figure": "Memory Viewer peak (data endpoint)", "bytes": c["viewer_peak_bytes"]},
        {"figure": "report peak_bytes", "bytes": c["peak_bytes"]},
        {"figure": "Memory Viewer total allocation", "bytes": c["viewer_total_allocation_bytes"]},
        {"figure": "trace peak counter", "bytes": data["trace"]["peak_counter_bytes"]},
        {"figure": "report live_peak_bytes", "bytes": c["live_peak_bytes"]},
    ]
    print(table(rows, ["figure", "bytes"], f"{c['module']}: our peak vs XProf's Memory Viewer"))
    print(f"page shows: {c['page_module']}, peak {c['page_peak_mib']} MiB")
    print(table([data["times_s"]], list(data["times_s"]), "seconds"))
    print(f"screenshot: {shot}")


def _measure(
    args: argparse.Namespace,
    run_args: list[str],
    work: Path,
    xprof: Path,
    chromium: str,
    shot: Path,
) -> dict[str, Any]:
    from remat_kit.render import module_names

    prof, report_path, trace_path = work / "prof", work / "report.json", work / "trace.json"
    times: dict[str, float] = {}
    command = [sys.executable, "-m", "remat_kit.cli", "inspect", *run_args]
    extra = ["--xprof", str(prof), "--trace", str(trace_path), "--json", str(report_path)]
    if args.baseline:
        times["inspect_plain"] = _timed(
            [*command, "--json", str(work / "plain.json")], "inspect (plain)"
        )
    times["inspect_xprof_trace"] = _timed([*command, *extra], "inspect --xprof --trace")
    report = json.loads(report_path.read_text())
    files = {
        str(f.relative_to(prof)): f.stat().st_size for f in sorted(prof.rglob("*")) if f.is_file()
    }
    module = module_names([report["module"]])[0]  # the one program: id 1
    trace = _check_trace(json.loads(trace_path.read_text()), report)

    port, grpc_port = _free_port(), _free_port()
    base = f"http://127.0.0.1:{port}"
    log = (work / "xprof.log").open("w")
    server = subprocess.Popen(
        [str(xprof), "--logdir", str(prof), "--port", str(port), "--grpc_port", str(grpc_port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        start = time.perf_counter()
        runs = _wait_for(f"{base}{PLUGIN}/runs", server, 90)
        times["xprof_start"] = time.perf_counter() - start
        run = runs[0]
        tools = _get_json(f"{base}{PLUGIN}/run_tools?" + _q(run=run))
        hosts = [h["hostname"] for h in _get_json(f"{base}{PLUGIN}/hosts?" + _q(run=run, tag=TOOL))]
        listed = _get(f"{base}{PLUGIN}/module_list?" + _q(run=run)).decode().split(",")
        if TOOL not in tools or module not in listed:
            raise SystemExit(f"xprof_view: XProf lists tools {tools} and modules {listed}")
        query = _q(run=run, tag=TOOL, host=hosts[0], module_name=module)
        start = time.perf_counter()
        view = _get_json(f"{base}{PLUGIN}/data?{query}")
        times["xprof_memory_viewer_data"] = time.perf_counter() - start
        page = f"{base}{PLUGIN}/{TOOL}?{query}"
        start = time.perf_counter()
        dom = _chromium(chromium, page, args.budget_ms, "--dump-dom")
        times["chromium_dump_dom"] = time.perf_counter() - start
        start = time.perf_counter()
        _chromium(chromium, page, args.budget_ms, f"--screenshot={shot}")
        times["chromium_screenshot"] = time.perf_counter() - start
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()

    text = _visible_text(dom)
    shown = re.search(r"Peak memory allocation: ([0-9.]+) MiB, ([0-9.]+) MiB", text)
    name = re.search(r"Module Name: (\S+)", text)
    if shown is None or name is None:
        raise SystemExit(f"xprof_view: the page did not render the peak: {text[:400]!r}")
    peak = round(view["peakHeapMib"] * MIB)  # bytes / 2**20 is exact in a double
    total = round(view["totalBufferAllocationMib"] * MIB)
    compare = {
        "module": module,
        "xla_peak_bytes": report["xla_peak_bytes"],
        "viewer_peak_bytes": peak,
        "equal": peak == report["xla_peak_bytes"],
        "peak_bytes": report["peak_bytes"],
        "viewer_total_allocation_bytes": total,
        "total_minus_peak_bytes": total - report["peak_bytes"],
        "live_peak_bytes": report["live_peak_bytes"],
        "page_module": name.group(1),
        "page_peak_mib": shown.group(1),
        "page_peak_with_fragmentation_mib": shown.group(2),
        "page_shows_viewer_peak": f"{view['peakHeapMib']:.2f}" == shown.group(1),
    }
    return {
        "command": " ".join(["python", "experiments/xprof_view.py", *(sys.argv[1:])]),
        "inspect_command": "remat-kit inspect "
        + " ".join(run_args + extra).replace(str(work), "$TMP"),
        "model": args.model,
        "batch": args.batch,
        "seq": args.seq,
        "target": report["target"],
        "policy": args.policy,
        "jax_version": report["jax_version"],
        "xprof_version": _xprof_version(),
        "chromium": subprocess.run(
            [chromium, "--version"], capture_output=True, text=True
        ).stdout.strip(),
        "page_url": page.replace(base, "http://127.0.0.1:PORT"),
        "data_url": f"http://127.0.0.1:PORT{PLUGIN}/data?{query}",
        "xprof_runs": runs,
        "xprof_tools": tools,
        "xprof_hosts": hosts,
        "xprof_modules": listed,
        "compare": compare,
        "viewer": {k: v for k, v in view.items() if isinstance(v, (int, float, str))},
        "page_text": text[:1200],
        "screenshot": str(shot.relative_to(ROOT) if shot.is_relative_to(ROOT) else shot),
        "screenshot_bytes": shot.stat().st_size,
        "profile_files_bytes": files,
        "trace_bytes": trace_path.stat().st_size,
        "report_compile_seconds": report["compile_seconds"],
        "trace": trace,
        "times_s": times,
    }


def _check_trace(doc: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """Checks the trace against the Chrome trace format's fields; returns its figures."""
    events = doc["traceEvents"]
    need = {"X": ("name", "ts", "dur", "pid", "tid"), "C": ("name", "ts", "pid", "args")}
    need["M"] = ("name", "pid", "args")
    for e in events:
        missing = [k for k in need.get(e.get("ph"), ("?",)) if k not in e]
        if missing:
            raise SystemExit(f"xprof_view: trace event {e} lacks {missing}")
        if e["ph"] == "C" and not all(isinstance(v, (int, float)) for v in e["args"].values()):
            raise SystemExit(f"xprof_view: counter {e} has a non-numeric value")
        if e["ph"] == "X" and (e["dur"] < 0 or e["ts"] < 0):
            raise SystemExit(f"xprof_view: slice {e} is negative")
    step = doc["otherData"]["steps"][0]
    timed = [e for e in events if e["ph"] in "XC"]
    extent_us = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed)
    total = max(e["args"]["bytes"] for e in events if e["ph"] == "C" and "bytes" in e["args"])
    kinds = {ph: sum(e["ph"] == ph for e in events) for ph in "XCM"}
    return {
        "events": len(events),
        "events_by_phase": kinds,
        "recompute_slices": sum(e["ph"] == "X" and "recompute" in e.get("cat", "") for e in events),
        "peak_counter_bytes": total,
        "report_live_peak_bytes": report["live_peak_bytes"],
        "peak_equal": total == report["live_peak_bytes"],
        "length_us": extent_us,
        "predicted_step_us": step["predicted_step_seconds"] * 1e6,
    }


def _timed(command: list[str], label: str) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"xprof_view: {label} failed: {done.stderr[-2000:]}")
    return time.perf_counter() - start


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _q(**params: str) -> str:
    return urllib.parse.urlencode(params)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=300) as r:
        body = r.read()
        # The server gzips its answers whatever the request accepts.
        return gzip.decompress(body) if r.headers.get("Content-Encoding") == "gzip" else body


def _get_json(url: str) -> Any:
    return json.loads(_get(url))


def _wait_for(url: str, server: subprocess.Popen, seconds: float) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        if server.poll() is not None:
            raise SystemExit(f"xprof_view: xprof exited ({server.returncode}) before answering")
        try:
            return _get_json(url)
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise SystemExit(f"xprof_view: xprof did not answer {url} in {seconds} s") from None
            time.sleep(0.5)


def _chromium(chromium: str, url: str, budget_ms: int, action: str) -> str:
    # Headless, as root in a container: no sandbox, no GPU, /tmp instead of a small /dev/shm.
    # The virtual time budget lets the Angular page fetch and draw before the capture.
    # The page's area charts load Google Charts from www.gstatic.com, which is not reachable
    # here: those two charts stay blank; the numbers and the buffer timeline do not need it.
    command = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-dev-shm-usage", "--hide-scrollbars", "--window-size=1600,1200",
        f"--virtual-time-budget={budget_ms}", action, url,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(f"xprof_view: chromium failed: {done.stderr[-2000:]}")
    return done.stdout


def _visible_text(dom: str) -> str:
    dom = re.sub(r"<(style|script)\b.*?</\1>", " ", dom, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", dom))).strip()


def _xprof_version() -> str:
    from importlib.metadata import version

    return version("xprof")


if __name__ == "__main__":
    main()
