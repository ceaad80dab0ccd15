"""The compile cache against a dict model, over random sequences of calls.

``cache.compiled_memory`` promises (remat_kit/cache/_entries.py, the package docstring): the
same program for the same target and options is compiled once and read back after; a
compile that dumps is compiled whatever the disk holds, unless a reader (``dump_read``)
read the same program's dump before with the same code, whose value then comes back with
the analysis; an entry that cannot be read or has a field missing, extra or of the wrong
type is compiled again and rewritten; with the cache off nothing is read or written. The
stand-in ``ptxas``'s path and the kernel file name no option that changes the compile
(``key_options``). Here random sequences of such calls, on programs that are only text (no
compile: ``compile_fn`` makes a numbered analysis by hand), with entries damaged on disk
between them, are checked against two dicts: the analyses by program, and the dumps' readings
by program and reader's code. ``store``/``load`` are checked the same way against one dict.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from pathlib import Path

import pytest

import remat_kit as rk
from remat_kit import cache
from remat_kit.xla import CompiledMemory, Kernel


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "cache"))
    monkeypatch.delenv(cache.ENV_OFF, raising=False)
    cache.set_enabled(None)
    yield tmp_path / "cache"
    cache.set_enabled(None)


class _Text:
    """A lowered program as the cache sees it: its text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def as_text(self) -> str:
        return self.text


def _analysis(serial: int, rng: random.Random) -> CompiledMemory:
    """A compile's analysis made by hand, told apart from every other by ``serial``."""
    return CompiledMemory(
        argument_bytes=serial,
        output_bytes=rng.randrange(0, 2**40),
        temp_bytes=rng.randrange(0, 2**40),
        alias_bytes=rng.randrange(0, 2**20),
        generated_code_bytes=rng.randrange(0, 2**20),
        host_bytes=rng.choice([0, 2**33]),
        host_temp_bytes=rng.choice([0, 2**31]),
        xla_peak_bytes=rng.choice([None, rng.randrange(1, 2**40)]),
        xla_remat_limit_bytes=rng.choice([None, rng.randrange(1, 2**40)]),
        xla_remat_saved_bytes=rng.randrange(0, 2**30),
        xla_remat_fell_short=rng.random() < 0.5,
        xla_messages=tuple(rng.sample(["XLA rematerialized 3 GiB.", "over the limit", "x"], 2)),
        compile_seconds=rng.uniform(1.0, 60.0),
        kernels=tuple(
            Kernel("gemm", count=rng.randint(1, 9), flops=rng.uniform(0, 1e12), bytes=serial)
            for _ in range(rng.randint(0, 2))
        ),
        over_device=rng.random() < 0.2,
    )


# Damage done to a stored record (its "record" object), each making it unreadable: a field
# of the wrong type (an int field as a float or a bool, a bool as a number, text as a number,
# a float as text or a bool, a list of text holding a number, an optional figure as text), a
# field missing or extra, a kernel record of the wrong length.
_DAMAGE = {
    "int as float": ("argument_bytes", 4096.0),
    "int as bool": ("temp_bytes", True),
    "optional int as float": ("xla_peak_bytes", 7.0),
    "optional int as text": ("xla_remat_limit_bytes", "lots"),
    "bool as int": ("xla_remat_fell_short", 0),
    "str as int": ("program", 7),
    "float as text": ("compile_seconds", "fast"),
    "float as bool": ("compile_seconds", True),
    "messages not text": ("xla_messages", ["fine", 3]),
    "messages not a list": ("xla_messages", "one"),
    "kernel too short": ("kernels", [["gemm", 1]]),
    "kernels not a list": ("kernels", {"gemm": 1}),
    "field missing": ("host_bytes", None),
    "field extra": ("something_new", 1),
}


_HOW = (*_DAMAGE, "not json", "another key", "not a record", "read lost")


def _damage(path: Path, how: str) -> None:
    data = json.loads(path.read_text())
    held = data["record"]["memory"] if "memory" in data["record"] else data["record"]
    if how == "not json":
        path.write_text("{ half written")
        return
    if how == "another key":
        data["key"] = "0" * 64
    elif how == "not a record":
        data["record"] = [1, 2]
    elif how == "read lost":
        if "memory" in data["record"]:
            del data["record"]["read"]
        else:
            held["argument_bytes"] = None  # only a field that may be None may be None
    elif how == "field missing":
        del held["host_bytes"]
    else:
        field, value = _DAMAGE[how]
        held[field] = value
    path.write_text(json.dumps(data))


def _readable(root: Path) -> list[Path]:
    """The entries under ``root`` that still parse and name their analysis."""
    out = []
    for path in sorted(root.rglob("*.json")):
        try:
            record = json.loads(path.read_text())["record"]
            held = record.get("memory", record)
            if isinstance(held["argument_bytes"], int):
                out.append(path)
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
    return out


_TARGETS = ("cpu", "h100", "a100-40gb")
_OPTIONS = (
    {},
    {"xla_gpu_autotune_level": 0},
    {"xla_gpu_autotune_level": 4},
    # the stand-in's path and the kernel file are the user's own: the same compile
    {"xla_gpu_cuda_data_dir": "/home/a/.cache/remat_kit/ptxas/1"},
    {"xla_gpu_cuda_data_dir": "/home/b/ptxas/2", "xla_gpu_kernel_cache_file": "/tmp/k/1.bin"},
    {"xla_gpu_kernel_cache_file": "/tmp/k/2.bin"},
)


def _as_keyed(options: dict) -> frozenset:
    """What of the options the compile sees (the package docstring): the kernel file none of
    it, the stand-in's path only that there is one."""
    out = {k: v for k, v in options.items() if k != "xla_gpu_kernel_cache_file"}
    if "xla_gpu_cuda_data_dir" in out:
        out["xla_gpu_cuda_data_dir"] = "stand-in"
    return frozenset(out.items())


@pytest.mark.parametrize("seed", range(12))
def test_compiled_memory_is_a_dict_of_compiles_by_program_read_back_until_damaged(
    cache_dir, tmp_path, seed
):
    rng = random.Random(seed)
    analyses: dict[tuple, CompiledMemory] = {}  # (program, target, options) -> analysis
    readings: dict[tuple, tuple[CompiledMemory, dict]] = {}  # (..., code) -> (analysis, read)
    serial = [0]
    compiled: list[int] = []

    def compile_fn(lowered):
        serial[0] += 1
        compiled.append(serial[0])
        return _analysis(serial[0], rng)

    targets = {name: rk.target(name) for name in _TARGETS}
    damaged = 0
    for step in range(40):
        text = f"module @m{rng.randrange(4)} {{}}"
        name, options = rng.choice(_TARGETS), rng.choice(_OPTIONS)
        program = (text, name, _as_keyed(options))
        roll = rng.random()
        live = _readable(cache_dir)
        if roll < 0.12 and live:  # damage a stored entry
            path = rng.choice(live)
            record = json.loads(path.read_text())["record"]
            n = record.get("memory", record)["argument_bytes"]
            _damage(path, _HOW[(seed + damaged) % len(_HOW)])  # each kind in turn
            damaged += 1
            kept = readings if "memory" in record else analyses
            for key in [k for k, v in kept.items() if (v[0] if kept is readings else v)
                        .argument_bytes == n]:  # fmt: skip
                del kept[key]
            continue
        off = roll < 0.22
        dump = str(tmp_path / f"dump{step}") if rng.random() < 0.5 else None
        code = rng.choice(["reader-1", "reader-2"]) if rng.random() < 0.6 else None
        before, start = len(compiled), time.perf_counter()
        cache.set_enabled(False if off else None)
        if code is None:
            got, read = cache.compiled_memory(_Text(text), targets[name], compile_fn,
                                              options=options, dump_to=dump), None  # fmt: skip
        else:
            with cache.dump_read(lambda at, c=code: {"code": c, "at": Path(at).name,
                                                     "n": serial[0]}, code) as reader:  # fmt: skip
                got = cache.compiled_memory(_Text(text), targets[name], compile_fn,
                                            options=options, dump_to=dump)  # fmt: skip
            read = reader.value
        took = time.perf_counter() - start
        cache.set_enabled(None)
        fresh = len(compiled) > before
        assert len(compiled) - before <= 1
        assert got.program == cache.fingerprint(text)[:16]
        reads = code is not None and dump is not None
        if off:  # nothing read, nothing written
            assert fresh, (seed, step)
            want_read = {"code": code, "at": Path(dump).name, "n": serial[0]} if reads else None
            assert read == want_read, (seed, step)
            continue
        if reads and (program, code) in readings:
            want, want_read = readings[(program, code)]
        elif not reads and dump is None and program in analyses:
            want, want_read = analyses[program], None
        else:
            want, want_read = None, None
        if want is not None:  # read back: the stored analysis, timed by its reading
            assert not fresh, (seed, step, "compiled what the disk held")
            assert dataclasses.replace(got, compile_seconds=0.0, program="") == (
                dataclasses.replace(want, compile_seconds=0.0, program="")
            ), (seed, step)
            assert 0.0 <= got.compile_seconds <= took
            assert read == want_read, (seed, step)
            continue
        assert fresh, (seed, step, "read back what the disk did not hold")
        assert got.argument_bytes == compiled[-1]
        analyses[program] = dataclasses.replace(got, program="")
        if reads:
            assert read == {"code": code, "at": Path(dump).name, "n": compiled[-1]}
            readings[(program, code)] = (analyses[program], read)
        else:
            assert read is None


def test_compiles_counts_every_compile_and_no_reading_back(cache_dir):
    rng = random.Random(5)
    cpu = rk.target("cpu")
    before = cache.compiles()
    made = 0

    def compile_fn(lowered):
        nonlocal made
        made += 1
        return _analysis(made, rng)

    for i in range(30):
        cache.set_enabled(rng.random() < 0.7)
        cache.compiled_memory(_Text(f"module @p{rng.randrange(5)}"), cpu, compile_fn)
        assert cache.compiles() - before == made, i
    cache.set_enabled(None)


@pytest.mark.parametrize("seed", range(4))
def test_store_and_load_are_a_dict_whose_damaged_entries_read_as_absent(cache_dir, seed):
    rng = random.Random(seed)
    model: dict[str, dict] = {}
    keys = ["".join(rng.choice("0123456789abcdef") for _ in range(64)) for _ in range(6)]
    keys += [keys[0][:2] + "f" * 62]  # two keys under one directory
    with cache._store.journal() as written:
        expected_journal = []
        for _ in range(60):
            key = rng.choice(keys)
            roll = rng.random()
            if roll < 0.5:
                record = {"n": rng.randrange(100), "s": rng.choice(["a", "b"]), "l": [1, 2]}
                assert cache.store(key, record)
                model[key] = record
                expected_journal.append((key, record))
            elif roll < 0.65 and key in model:
                path = cache_dir / "v1" / key[:2] / f"{key}.json"
                data = json.loads(path.read_text())
                how = rng.choice(["text", "key", "record", "list"])
                if how == "text":
                    path.write_text("{")
                else:
                    data.update({"key": "f" * 64} if how == "key" else {"record": [1]}
                                if how == "list" else {"record": "r"})  # fmt: skip
                    path.write_text(json.dumps(data))
                del model[key]
            assert cache.load(key) == model.get(key)
        assert written == expected_journal
    for key in keys:
        assert cache.load(key) == model.get(key)
    # no temporary file is left behind beside the entries
    assert all(p.suffix == ".json" for p in cache_dir.rglob("*") if p.is_file())
