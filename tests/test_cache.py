"""The on-disk cache of compiled memory analyses: hits, misses, damage, keys, switches."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import remat_kit as rk
from remat_kit import cache
from remat_kit.xla import compile_memory


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path))
    monkeypatch.delenv(cache.ENV_OFF, raising=False)
    cache.set_enabled(None)
    yield tmp_path
    cache.set_enabled(None)


def _preset(model, batch, seq, *, optimizer="adamw", accum=1, precision=None, lora=0, **shape):
    """A preset's source (``shape``: its spec's fields) and its train config."""
    from remat_kit_models.spec import PresetSpec

    config = rk.TrainConfig(
        batch,
        seq,
        optimizer=optimizer,
        accum=accum,
        lora=lora > 0,
        precision=rk.train.regime(precision) if precision else None,
    )
    return rk.sources.resolve(PresetSpec(model, lora=lora, **shape)), config


def _lowered(n=64):
    f = lambda a: jnp.sin(a @ a).sum()
    return jax.jit(jax.grad(f)).lower(jax.ShapeDtypeStruct((n, n), jnp.float32))


class _Counting:
    """compile_memory, counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, lowered):
        self.calls += 1
        return compile_memory(lowered)


def _entries(root):
    return sorted(p for p in root.rglob("*.json"))


def _same(a, b):
    fields = ("argument_bytes", "output_bytes", "temp_bytes", "alias_bytes", "host_bytes")
    return all(getattr(a, f) == getattr(b, f) for f in fields) and a.peak_bytes == b.peak_bytes


def test_miss_then_hit(cache_dir):
    low, count = _lowered(), _Counting()
    cpu = rk.target("cpu")
    first = cache.compiled_memory(low, cpu, count)
    assert count.calls == 1 and len(_entries(cache_dir)) == 1
    again = cache.compiled_memory(_lowered(), cpu, count)  # lowered afresh: same program
    assert count.calls == 1, "the second call must be read from disk"
    assert _same(first, again) and again.xla_messages == first.xla_messages
    other = cache.compiled_memory(_lowered(32), cpu, count)  # another program: a miss
    assert count.calls == 2 and len(_entries(cache_dir)) == 2
    assert other.argument_bytes == 32 * 32 * 4 != first.argument_bytes


def _never(lowered):
    raise AssertionError("compiled: the analysis is on disk")


def test_what_a_dump_said_is_kept_with_its_analysis(cache_dir, tmp_path_factory):
    # A compile that dumps (a shallow copy's, whose live sections rk.sources fits) is read
    # back with what its reader made of the dump: the same program is not compiled again.
    cpu, calls = rk.target("cpu"), []

    def compiled(code="names-1", read=True):
        dump = str(tmp_path_factory.mktemp("dump"))

        def compile_fn(lowered):
            calls.append(dump)
            return compile_memory(lowered, dump_to=dump)

        def listed(where):
            return sorted(p.name for p in Path(where).iterdir())

        if not read:
            return cache.compiled_memory(_lowered(), cpu, compile_fn, dump_to=dump), None, dump
        with cache.dump_read(listed, code) as got:
            mem = cache.compiled_memory(_lowered(), cpu, compile_fn, dump_to=dump)
        return mem, got.value, dump

    first, names, dump = compiled()
    assert len(calls) == 1 and names == sorted(p.name for p in Path(dump).iterdir()) != []
    again, read_back, dump = compiled()
    assert len(calls) == 1, "the same program's dump must be read from disk"
    assert read_back == names and _same(again, first)
    assert not any(Path(dump).iterdir())  # nothing compiled: nothing dumped
    compiled(code="names-2")  # read by other code: its value is not this one's
    assert len(calls) == 2
    compiled(read=False)  # a dump no reader keeps is a compile
    assert len(calls) == 3
    assert _same(cache.compiled_memory(_lowered(), cpu, _never), first)  # the plain entry


@pytest.mark.parametrize(
    "damage",
    [
        "not json {",
        "",
        json.dumps([1, 2, 3]),
        'RECORD:argument_bytes="lots"',  # valid JSON, wrong type in a field
        "RECORD:argument_bytes=4096.0",  # a byte count is an int: a float is another writer's
        'RECORD:compile_seconds="fast"',  # a time must be a number, not text
        "RECORD:compile_seconds=true",  # nor a bool (JSON's true is not 1 second)
        "RECORD:program=7",  # the fingerprint is text
        "RECORD:xla_remat_fell_short=0",  # a flag is a bool, not a number
        "RECORD:-host_bytes",  # a field missing
        "RECORD:argument_bytes=null",  # only a field that may be None may read back as None
        "KEY:0000",  # an entry stored under another key
    ],
)
def test_a_damaged_entry_is_ignored_and_rewritten(cache_dir, damage):
    low, count = _lowered(), _Counting()
    cpu = rk.target("cpu")
    good = cache.compiled_memory(low, cpu, count)
    (path,) = _entries(cache_dir)
    data = json.loads(path.read_text())
    if damage.startswith("RECORD:-"):
        del data["record"][damage.removeprefix("RECORD:-")]
        text = json.dumps(data)
    elif damage.startswith("RECORD:"):
        field, value = damage.removeprefix("RECORD:").split("=")
        data["record"][field] = json.loads(value)
        text = json.dumps(data)
    elif damage.startswith("KEY:"):
        data["key"] = damage.removeprefix("KEY:")
        text = json.dumps(data)
    else:
        text = damage
    path.write_text(text)
    got = cache.compiled_memory(low, cpu, count)
    assert count.calls == 2, "a damaged entry must be compiled again"
    assert _same(got, good)
    assert json.loads(path.read_text())["record"]["argument_bytes"] == good.argument_bytes
    cache.compiled_memory(low, cpu, count)
    assert count.calls == 2, "and the rewritten entry is read back"


def test_the_key_follows_what_determines_the_analysis(monkeypatch):
    text = _lowered().as_text()
    h100 = rk.target("h100")
    key = cache.entry_key(text, h100)
    assert key == cache.entry_key(text, rk.target("h100")) and len(key) == 64
    changed = {
        "another GPU": cache.entry_key(text, rk.target("a100-80gb")),
        "more devices": cache.entry_key(text, rk.target("h100", devices=8)),
        "another config": cache.entry_key(
            text,
            dataclasses.replace(h100, target_config=h100.target_config.replace("1.98", "1.5")),
        ),
        "another program": cache.entry_key(_lowered(32).as_text(), h100),
        "compiler options": cache.entry_key(text, h100, {"xla_gpu_autotune_level": 0}),
    }
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_latency_hiding_scheduler=true")
    changed["XLA_FLAGS"] = cache.entry_key(text, h100)
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_enable_windowed_einsum_for_all_gather=false")
    changed["LIBTPU_INIT_ARGS"] = cache.entry_key(text, h100)
    for why, other in changed.items():
        assert other != key, why
    assert len(set(changed.values())) == len(changed)


def test_the_key_names_the_jax_versions(monkeypatch):
    text = _lowered().as_text()
    key = cache.entry_key(text, rk.target("cpu"))
    monkeypatch.setattr(cache._keys, "_versions", lambda: (("jax", "0.0.0"), ("jaxlib", "0.0.0")))
    assert cache.entry_key(text, rk.target("cpu")) != key


def test_the_key_follows_the_code_that_words_the_log_and_reads_the_kernels(tmp_path, monkeypatch):
    # A record holds XLA's log in words and the kernels read from the HLO: an entry written
    # before that code changed must not answer with the old words.
    text = _lowered().as_text()
    key = cache.entry_key(text, rk.target("cpu"))
    fake = tmp_path / "remat_kit"
    shutil.copytree(Path(cache.__file__).parents[1] / "xla", fake / "xla")
    (fake / "xla" / "_hlo.py").write_text("# another parser\n")  # one file of the reader
    monkeypatch.setattr(cache._keys, "__file__", str(fake / "cache" / "_keys.py"))
    cache._keys._record_code.cache_clear()
    try:
        assert cache.entry_key(text, rk.target("cpu")) != key
    finally:
        monkeypatch.undo()
        cache._keys._record_code.cache_clear()
    assert cache.entry_key(text, rk.target("cpu")) == key


@pytest.mark.parametrize("how", ["env", "call"])
def test_the_cache_can_be_bypassed(cache_dir, monkeypatch, how):
    if how == "env":
        monkeypatch.setenv(cache.ENV_OFF, "1")
    else:
        cache.set_enabled(False)
    assert not cache.enabled()
    count, before = _Counting(), cache.compiles()
    cache.compiled_memory(_lowered(), rk.target("cpu"), count)
    cache.compiled_memory(_lowered(), rk.target("cpu"), count)
    assert count.calls == 2 and _entries(cache_dir) == []
    assert cache.compiles() - before == count.calls  # a bypassed compile is counted too


@pytest.mark.parametrize("flag", [True, False, None])
@pytest.mark.parametrize("env", ["", "0", "1"])
def test_set_enabled_wins_over_the_environment_and_none_follows_it(monkeypatch, flag, env):
    # _switch's docstring: on unless REMAT_KIT_NO_CACHE=1, or this process says otherwise
    # (set_enabled's True or False, whatever the variable; None: back to the variable).
    monkeypatch.setenv(cache.ENV_OFF, env)
    try:
        cache.set_enabled(flag)
        assert cache.enabled() is (env != "1" if flag is None else flag)
        with cache.bypassed():
            assert cache.enabled() is False
        assert cache.enabled() is (env != "1" if flag is None else flag)  # restored
    finally:
        cache.set_enabled(None)


@pytest.mark.parametrize(
    ("env", "xdg", "where"),
    [
        ("/tmp/rk-a", "/tmp/xdg", "/tmp/rk-a"),  # the cache's own variable first
        ("", "/tmp/xdg", "/tmp/xdg/remat_kit"),  # then $XDG_CACHE_HOME/remat_kit
        ("", "", "HOME/.cache/remat_kit"),  # else ~/.cache/remat_kit
    ],
)
def test_the_cache_lives_where_its_variables_say(monkeypatch, tmp_path, env, xdg, where):
    monkeypatch.setenv(cache.ENV_DIR, env)
    monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache.cache_dir() == Path(where.replace("HOME", str(tmp_path)))


def test_dir_problem_says_what_keeps_the_cache_dir_from_holding_entries(monkeypatch, tmp_path):
    # store's directory made if missing, a file made in it: fine twice (the directory now
    # there), a path that is a file is not a directory, one under a file cannot be made.
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "new" / "cache"))
    assert cache.dir_problem() is None
    assert cache.dir_problem() is None and (tmp_path / "new" / "cache").is_dir()
    assert list((tmp_path / "new" / "cache").iterdir()) == []  # the probe removed
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "file"))
    assert cache.dir_problem() == "is not a directory"
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "file" / "sub"))
    assert cache.dir_problem().startswith("cannot be made (")


def test_dir_problem_says_a_directory_that_takes_no_file_is_not_writable(monkeypatch, tmp_path):
    """A directory there whose files cannot be made (a read-only mount; root writes through
    a mode, so the refusal is made by hand, for that directory only: elsewhere files are
    made as usual): issue 58 mutant _store.py:79 of seed 76, and seed 96's ``dir=where``
    left out, which probed the system's temporary directory instead."""
    import tempfile

    made = tempfile.mkstemp

    def refuse(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == tmp_path:
            raise PermissionError(13, "Permission denied")
        return made(*args, dir=dir, **kwargs)

    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path))
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    assert cache.dir_problem() == "is not writable (Permission denied)"


def test_set_enabled_rejects_a_non_bool():
    with pytest.raises(TypeError, match="True, False or None"):
        cache.set_enabled("no")


def test_concurrent_writers_never_leave_a_partial_entry(cache_dir):
    key = cache.entry_key("module {}", rk.target("cpu"))
    record = {"blob": "x" * 200_000}
    seen, errors = [], []

    def write():
        for _ in range(30):
            assert cache.store(key, record)

    def read():
        for _ in range(200):
            try:
                got = cache.load(key)
            except Exception as err:  # any error is the failure
                errors.append(err)
                return
            if got is not None:
                seen.append(len(got["blob"]))

    threads = [threading.Thread(target=write) for _ in range(3)]
    threads += [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and set(seen) <= {200_000}
    assert [p.name for p in _entries(cache_dir)] == [f"{key}.json"]  # no temporary left


def test_an_unwritable_cache_is_not_an_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(cache.ENV_DIR, str(blocker / "sub"))  # a directory under a file
    count = _Counting()
    got = cache.compiled_memory(_lowered(), rk.target("cpu"), count)
    assert count.calls == 1 and got.argument_bytes == 64 * 64 * 4


def test_memory_report_reads_the_cache(cache_dir):
    """End to end on a GPU target: the second report of the same step compiles nothing."""
    x = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16)
    first = rk.memory_report(lambda a: jnp.tanh(a @ a), x, target="h100")
    assert len(_entries(cache_dir)) == 1
    again = rk.memory_report(lambda a: jnp.tanh(a @ a), x, target="h100")
    assert again.peak_bytes == first.peak_bytes and again.temp_bytes == first.temp_bytes
    assert len(_entries(cache_dir)) == 1


def _partitioned(scale):
    """A jax custom_partitioning op (as cuDNN attention's sharding rule is) scaling by
    ``scale``, lowered for two deviceless H100s: its text, and the op, which the caller holds
    so that the next op cannot be given the same id()."""
    from jax.experimental.custom_partitioning import custom_partitioning
    from jax.sharding import NamedSharding, PartitionSpec

    @custom_partitioning
    def op(x):
        return x * scale

    def partition(mesh, arg_shapes, result_shape):
        sharding = arg_shapes[0].sharding
        return mesh, (lambda x: x * scale), sharding, (sharding,)

    op.def_partition(
        partition=partition,
        infer_sharding_from_operands=lambda mesh, arg_shapes, shape: arg_shapes[0].sharding,
        sharding_rule="i j -> i j",
    )
    t = rk.target("h100", devices=2)
    x = jax.ShapeDtypeStruct(
        (8, 8), jnp.float32, sharding=NamedSharding(t.mesh(), PartitionSpec("x"))
    )
    return jax.jit(op).lower(x).as_text(), op


def test_the_fingerprint_ignores_python_object_ids():
    """custom_partitioning writes an id() into the program: another number every lowering."""
    (a, op_a), (b, op_b) = _partitioned(2.0), _partitioned(2.0)
    assert op_a is not op_b  # both alive while compared
    assert "CustomSPMDPartitioning" in a and a != b  # the ids differ...
    assert cache.fingerprint(a) == cache.fingerprint(b)  # ...the fingerprint does not
    assert cache.fingerprint(a) != cache.fingerprint(a.replace("8x8", "8x9"))
    # The same callback code over another value is another partitioner.
    assert cache.fingerprint(_partitioned(3.0)[0]) != cache.fingerprint(a)


# --- answers remembered by the request that asked for them --------------------------------------


class _Answer:
    """A computation that counts its calls."""

    def __init__(self, value):
        self.value, self.calls = value, 0

    def __call__(self):
        self.calls += 1
        return self.value


def test_remember_computes_once_per_request(cache_dir):
    cpu, gpu = rk.target("cpu"), rk.target("h100")
    answer = _Answer({"peak": 7})
    assert cache.remember("report", {"policy": "full"}, cpu, answer) == {"peak": 7}
    assert cache.remember("report", {"policy": "full"}, cpu, answer) == {"peak": 7}
    assert answer.calls == 1
    # Any part of the request, the kind or the target makes it another question.
    for kind, parts, t in [
        ("report", {"policy": "minimal"}, cpu),
        ("flops", {"policy": "full"}, cpu),
        ("report", {"policy": "full"}, gpu),
    ]:
        other = _Answer(1)
        cache.remember(kind, parts, t, other)
        assert other.calls == 1, (kind, parts, t.name)


def test_remember_recomputes_what_it_cannot_decode_and_obeys_the_switch(cache_dir):
    cpu = rk.target("cpu")
    answer = _Answer([1, 2])

    def strict(stored):
        if stored != [1, 2]:
            raise ValueError("not mine")
        return stored

    cache.remember("x", {}, cpu, answer, decode=strict)
    (entry,) = _entries(cache_dir)
    data = json.loads(entry.read_text())
    data["record"]["value"] = "damaged"
    entry.write_text(json.dumps(data))
    assert cache.remember("x", {}, cpu, answer, decode=strict) == [1, 2]
    assert answer.calls == 2
    assert cache.remember("x", {}, cpu, answer, decode=strict) == [1, 2]
    assert answer.calls == 2  # rewritten whole by the recompute
    with cache.bypassed():
        cache.remember("x", {}, cpu, answer, decode=strict)
    assert answer.calls == 3


def test_the_code_fingerprint_follows_the_source(tmp_path, monkeypatch):
    pkg = tmp_path / "rk_probe_pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("X = 1\n")
    (pkg / "sub" / "m.py").write_text("Y = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = cache.code_fingerprint.__wrapped__("rk_probe_pkg")
    assert cache.code_fingerprint.__wrapped__("rk_probe_pkg") == before
    (pkg / "sub" / "m.py").write_text("Y = 3\n")
    assert cache.code_fingerprint.__wrapped__("rk_probe_pkg") != before


@pytest.mark.slow
def test_a_preset_report_is_remembered_whole(cache_dir, monkeypatch):
    """The second identical report neither traces nor compiles, and reads back field for field;
    another policy is measured afresh."""
    from remat_kit_models import preset_source

    src, config = _preset(model="tiny-llama", batch=2, seq=32, attention="xla")

    def measure(policy):
        return rk.sources.measure(src, policy, "h100", config, warn=False)

    first = measure("minimal")
    assert first.compile_seconds > 0

    def untouchable(*args, **kwargs):
        raise AssertionError("a remembered report must not build the step")

    # where the preset's source builds its step (a patch elsewhere would make this vacuous)
    monkeypatch.setattr(preset_source, "train_step", untouchable)
    again = measure("minimal")
    assert again.compile_seconds == 0.0
    want = {**first.to_dict(), "compile_seconds": 0.0}
    assert json.loads(json.dumps(again.to_dict())) == json.loads(json.dumps(want))
    assert again.tags == first.tags and isinstance(again.tags, tuple)
    with pytest.raises(AssertionError, match="must not build"):
        measure("full")
    with pytest.raises(AssertionError, match="must not build"), cache.bypassed():
        measure("minimal")


def test_memory_report_from_dict_rejects_other_fields():
    x = jax.ShapeDtypeStruct((4, 4), jnp.float32)
    r = rk.memory_report(lambda a: a @ a, x, target="cpu")
    assert rk.MemoryReport.from_dict(r.to_dict()) == r
    with pytest.raises(ValueError, match="unknown"):
        rk.MemoryReport.from_dict({**r.to_dict(), "peak_gib": 1.0})
    data = r.to_dict()
    del data["peak_bytes"]
    with pytest.raises(ValueError, match="missing"):
        rk.MemoryReport.from_dict(data)


# --- every input that changes an answer changes its key (issue 27) -----------------------------

_H100 = dict(rk.targets.GPU_FACTS["h100-80gb"])


def _card(**changes):
    """A custom GPU named like the H100 whose facts differ from it only by ``changes``."""
    return rk.targets.custom_target("h100-80gb", {**_H100, **changes})


#: Targets that differ from ``_card()`` in one respect each, and whether that respect can change
#: a compiled analysis (True) or only what is derived from it: the step time and offload
#: estimate a remembered report carries (False).
_TARGETS = {
    "allocator fraction": (lambda: _card().with_mem_fraction(0.9), True),
    "platform allocator": (
        lambda: dataclasses.replace(
            _card(), runtime=rk.targets.Runtime(None, "platform allocator")
        ),
        True,
    ),
    "devices": (lambda: rk.targets.custom_target("h100-80gb", _H100, devices=8), True),
    "hosts": (lambda: rk.targets.custom_target("h100-80gb", _H100, devices=8, hosts=2), True),
    "memory size": (lambda: _card(memory_bytes=_H100["memory_bytes"] - 1), True),
    "SMs": (lambda: _card(sms=114), True),
    "shared memory": (lambda: _card(smem_per_sm=167936), True),
    "L2": (lambda: _card(l2_bytes=41943040), True),
    "clock": (lambda: _card(clock_ghz=1.755), True),
    "HBM bandwidth": (lambda: _card(hbm_bandwidth=2039040000000), True),
    "compute capability": (lambda: _card(compute_capability=(8, 0)), True),
    "peak bf16 FLOP/s": (lambda: _card(peak_bf16_flops=756e12), False),
    "host link": (lambda: _card(host_link_bandwidth=32e9), False),
    # the node's network prices the collectives of the step time
    "node": (lambda: dataclasses.replace(_card(), node="a3-high"), False),
}


@pytest.mark.parametrize("why", sorted(_TARGETS))
def test_every_fact_of_the_target_keys_what_it_changes(why):
    text = _lowered().as_text()
    base, (make, compiled) = _card(), _TARGETS[why]
    other = make()
    assert cache.entry_key(text, base) == cache.entry_key(text, _card())  # a value, not an id
    assert (cache.entry_key(text, other) != cache.entry_key(text, base)) is compiled, why
    # A remembered report holds the step time and offload estimate priced at the target's
    # rates: every fact keys it.
    parts = {"model": "m"}
    assert cache.request_key("report", parts, other) != cache.request_key("report", parts, base)


def test_the_local_targets_key_names_the_devices_this_machine_holds(monkeypatch):
    # "local" is whatever jax.local_devices() holds: the same program for it on a machine
    # with other devices is another compile, and another answer.
    from types import SimpleNamespace

    local, text, parts = rk.target("local"), "module {}", {"model": "m"}

    def keys():
        return cache.entry_key(text, local), cache.request_key("report", parts, local)

    here = keys()
    h100 = [SimpleNamespace(platform="gpu", device_kind="NVIDIA H100 80GB HBM3")]
    monkeypatch.setattr(jax, "local_devices", lambda: h100)
    there = keys()
    assert there[0] != here[0] and there[1] != here[1]
    assert keys() == there  # the same devices: the same keys
    monkeypatch.setattr(jax, "local_devices", lambda: h100 * 2)
    assert keys()[0] != there[0]


def test_a_key_does_not_depend_on_the_order_a_mapping_was_built_in():
    # Equal mappings built key by key in two orders (as two call sites build a request's
    # parts, or a compile's options) key the same answer; a changed value keys another.
    h100 = rk.target("h100")
    one = {"policy": "full", "options": {"seq": 16, "batch": 4}}
    other = {"options": {"batch": 4, "seq": 16}, "policy": "full"}
    assert one == other and list(one) != list(other)
    key = cache.request_key("report", one, h100)
    assert cache.request_key("report", other, h100) == key
    assert cache.request_key("report", {**one, "policy": "none"}, h100) != key
    text = "module {}"
    options = cache.entry_key(text, h100, {"xla_gpu_autotune_level": 0, "xla_a": "x"})
    assert cache.entry_key(text, h100, {"xla_a": "x", "xla_gpu_autotune_level": 0}) == options


class _Asked(Exception):
    """Raised by the stand-in for cache.remember once it has the request's key."""


@pytest.fixture
def request_keys(monkeypatch):
    """The keys of the requests made, without computing any of them."""
    keys = []

    def remember(kind, parts, target, compute, **kwargs):
        keys.append((kind, cache.request_key(kind, parts, target)))
        raise _Asked

    monkeypatch.setattr(cache, "remember", remember)
    return keys


_BASE = dict(model="tiny-llama", batch=2, seq=64)
_REPORTS = {  # one input changed each, from _BASE under "full" on the h100
    "precision": (dict(precision="bf16"), "full", "none", "h100"),
    "optimizer": (dict(optimizer="sgd"), "full", "none", "h100"),
    "batch": (dict(batch=4), "full", "none", "h100"),
    "seq": (dict(seq=128), "full", "none", "h100"),
    "accumulation": (dict(accum=2), "full", "none", "h100"),
    "LoRA": (dict(lora=4), "full", "none", "h100"),
    "attention": (dict(attention="xla"), "full", "none", "h100"),
    "model size": (dict(overrides=(("layers", 3),)), "full", "none", "h100"),
    "policy": ({}, "minimal", "none", "h100"),
    "schedule": ({}, "full", "every:2", "h100"),
    "target": ({}, "full", "none", "a100-80gb"),
    "allocator fraction": ({}, "full", "none", "MEM_FRACTION"),
}


def _report_key(keys, changes, policy, schedule, target):
    if target == "MEM_FRACTION":
        target = rk.target("h100", mem_fraction=0.9)
    src, config = _preset(**{**_BASE, **changes})
    with pytest.raises(_Asked):
        rk.sources.measure(src, policy, target, config, schedule=schedule, warn=False)
    kind, key = keys[-1]
    assert kind == "report"
    return key


@pytest.mark.parametrize("why", sorted(_REPORTS))
def test_every_option_of_a_report_keys_it(why, request_keys):
    base = _report_key(request_keys, {}, "full", "none", "h100")
    assert _report_key(request_keys, {}, "full", "none", "h100") == base
    assert _report_key(request_keys, *_REPORTS[why]) != base, why


def test_the_environment_keys_what_it_changes(request_keys, monkeypatch):
    base = _report_key(request_keys, {}, "full", "none", "h100")
    changed = {}
    flags = os.environ.get("XLA_FLAGS", "")  # the suite's own (conftest.py)
    monkeypatch.setenv("XLA_FLAGS", f"{flags} --xla_gpu_enable_latency_hiding_scheduler=true")
    changed["XLA_FLAGS"] = _report_key(request_keys, {}, "full", "none", "h100")
    monkeypatch.setenv("XLA_FLAGS", flags)
    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)  # libtpu's flags, as the base had
    base_no_args = _report_key(request_keys, {}, "full", "none", "h100")
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_enable_windowed_einsum_for_all_gather=false")
    changed["LIBTPU_INIT_ARGS"] = _report_key(request_keys, {}, "full", "none", "h100")
    assert changed["LIBTPU_INIT_ARGS"] != base_no_args
    monkeypatch.delenv("LIBTPU_INIT_ARGS")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    changed["jax's fraction variable"] = _report_key(request_keys, {}, "full", "none", "h100")
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
    changed["platform allocator"] = _report_key(request_keys, {}, "full", "none", "h100")
    monkeypatch.delenv("XLA_PYTHON_CLIENT_ALLOCATOR")
    versions = cache._keys._versions
    monkeypatch.setattr(cache._keys, "_versions", lambda: (("jax", "0.0.0"), ("jaxlib", "0.0.0")))
    changed["jax version"] = _report_key(request_keys, {}, "full", "none", "h100")
    monkeypatch.setattr(cache._keys, "_versions", versions)
    previous = jax.config.jax_default_matmul_precision
    jax.config.update("jax_default_matmul_precision", "float32")
    try:
        changed["a jax setting"] = _report_key(request_keys, {}, "full", "none", "h100")
    finally:
        jax.config.update("jax_default_matmul_precision", previous)
    for why, key in changed.items():
        assert key != base, why
    assert len(set(changed.values())) == len(changed)
    # What only says where answers go or how they look keys nothing.
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv(cache.ENV_DIR, "/elsewhere")
    assert _report_key(request_keys, {}, "full", "none", "h100") == base


@pytest.mark.parametrize(
    "flags",
    [("--json", "OUT/a.json"), ("--json", "OUT/b.json"), ("--no-residuals",), ("--wide",)],
)
def test_output_flags_key_nothing(flags, request_keys, tmp_path, capsys):
    from remat_kit.cli import main

    argv = ["report", "--model", "tiny-llama", "--batch", "2", "--seq", "64", "--target", "h100"]
    with pytest.raises(_Asked):
        main(argv)
    with pytest.raises(_Asked):
        main([*argv, *(f.replace("OUT", str(tmp_path)) for f in flags)])
    with pytest.raises(_Asked):
        main([*argv, "--mem-fraction", "0.9"])
    (_, plain), (_, output), (_, fraction) = request_keys[-3:]
    assert output == plain
    assert fraction != plain


def test_compiler_options_key_the_entry_but_the_stand_in_path_does_not(cache_dir):
    # Options the caller hands the compile change the analysis; the stand-in ptxas's directory
    # is the user's own and does not.
    low, count = _lowered(), _Counting()
    cpu = rk.target("cpu")

    def run(options):
        return cache.compiled_memory(low, cpu, count, options=options)

    run({"xla_gpu_cuda_data_dir": "/home/a/.cache/remat_kit/ptxas/1"})
    run({"xla_gpu_cuda_data_dir": "/home/b/.cache/remat_kit/ptxas/2"})
    assert count.calls == 1, "another stand-in path is the same compile"
    run({"xla_gpu_cuda_data_dir": "/home/b/.cache/remat_kit/ptxas/2", "xla_some_option": 1})
    assert count.calls == 2, "another compiler option is another compile"


@pytest.mark.parametrize("enabled", [True, False], ids=["cached", "bypassed"])
def test_a_report_names_its_program_on_a_miss_and_on_a_hit(cache_dir, enabled):
    cache.set_enabled(enabled)
    low = _lowered()
    want = cache.fingerprint(low.as_text())[:16]  # what two equal programs share
    miss = cache.compiled_memory(low, rk.target("cpu"), _Counting())
    hit = cache.compiled_memory(_lowered(), rk.target("cpu"), _Counting())
    assert miss.program == hit.program == want


def test_a_fresh_process_has_compiled_nothing():
    import subprocess
    import sys

    code = "from remat_kit import cache; print(cache.compiles())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"


@pytest.mark.parametrize("key", ["ab" + "0" * 62, "7f" + "e" * 62])
def test_an_entry_lives_under_the_format_and_its_keys_first_two_digits(cache_dir, key):
    # The layout on disk is what every cache already written is found by: a change to it
    # without a FORMAT bump orphans them all.
    assert cache.store(key, {"n": 1})
    want = cache_dir / "v1" / key[:2] / f"{key}.json"
    assert _entries(cache_dir) == [want]
    assert json.loads(want.read_text())["record"] == {"n": 1}


def _hand_made(lowered):
    """A CompiledMemory made by hand (a 50 s compile on record): nothing is compiled."""
    from remat_kit.xla import CompiledMemory

    fields = dict.fromkeys(("argument_bytes", "output_bytes", "temp_bytes", "alias_bytes"), 8)
    return CompiledMemory(
        **fields,
        generated_code_bytes=0,
        host_bytes=0,
        host_temp_bytes=0,
        xla_peak_bytes=None,
        xla_remat_limit_bytes=None,
        xla_remat_saved_bytes=0,
        xla_remat_fell_short=False,
        xla_messages=(),
        compile_seconds=50.0,
    )


def test_a_hit_reports_the_time_it_took_to_read_back(cache_dir):
    import time

    low, cpu = _lowered(), rk.target("cpu")
    assert cache.compiled_memory(low, cpu, _hand_made).compile_seconds == 50.0
    start = time.perf_counter()
    hit = cache.compiled_memory(low, cpu, _never)
    took = time.perf_counter() - start
    assert 0 <= hit.compile_seconds <= took


@pytest.mark.parametrize("callback", ["1", "140234567890"])
def test_a_partitioning_callback_no_process_registered_is_left_as_written(callback):
    # No custom_partitioning callback has that id in this process: the text is hashed as it
    # is (a miss later, never a wrong hit), the number and its words kept.
    import hashlib

    text = (
        "module {\n"
        "  %0 = stablehlo.custom_call @CustomSPMDPartitioning(%a) "
        f'{{backend_config = "{callback}"}}\n'
        "}"
    )
    assert cache.fingerprint(text) == hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize(
    ("peak", "limit"),
    [(3 * 2**20, 5 * 2**20), (None, None), (3 * 2**20, None)],
    ids=["both stated", "neither stated", "peak only"],
)
def test_a_hit_gives_back_the_optional_figures_the_compile_gave(cache_dir, peak, limit):
    # XLA's own peak and its remat pass's limit are None where the compile stated none: a
    # hit gives back what was stored, a figure as a figure and a None as a None.
    from remat_kit.xla import CompiledMemory

    def stated(lowered):
        return dataclasses.replace(
            _hand_made(lowered),
            xla_peak_bytes=peak,
            xla_remat_limit_bytes=limit,
            xla_remat_saved_bytes=2**20,
        )

    low, cpu = _lowered(), rk.target("cpu")
    miss = cache.compiled_memory(low, cpu, stated)
    hit = cache.compiled_memory(low, cpu, _never)
    assert isinstance(hit, CompiledMemory)
    assert (miss.xla_peak_bytes, miss.xla_remat_limit_bytes) == (peak, limit)
    assert (hit.xla_peak_bytes, hit.xla_remat_limit_bytes) == (peak, limit)
    # _hand_made: 8 B arguments + 8 outputs + 8 temporaries - 8 aliased.
    assert hit.xla_remat_saved_bytes == 2**20 and hit.peak_bytes == miss.peak_bytes == 16


def test_an_entry_is_written_as_a_hidden_temporary_beside_it_named_after_its_key(
    cache_dir, monkeypatch
):
    """The record goes to a temporary that a directory listing hides, named after the entry
    it becomes (what a run killed mid-write leaves says whose it was), then is renamed over
    the entry (seed 93's _store.py:157 dropped the prefix: a visible ``tmp*.tmp``)."""
    key = "4567cdef" * 8
    renamed = []
    replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (renamed.append((a, b)), replace(a, b)))
    assert cache.store(key, {"b": 2}) is True
    ((tmp, entry),) = renamed
    tmp, entry = Path(tmp), Path(entry)
    assert entry == cache_dir / "v1" / key[:2] / f"{key}.json" and tmp.parent == entry.parent
    assert tmp.name.startswith(".4567cdef.") and tmp.name.endswith(".tmp")
    assert cache.load(key) == {"b": 2}


def test_a_store_that_cannot_write_says_so_and_leaves_no_temporary(cache_dir):
    """Issue 58 mutant _store.py:166 of seed 75 (a failed write read as written): where the
    entry's path is a directory, the rename fails; ``store`` says False and the temporary it
    wrote beside the entry is gone."""
    key = "89abcdef" * 8
    entry = cache_dir / "v1" / key[:2] / f"{key}.json"  # the layout the test above pins
    entry.mkdir(parents=True)  # os.replace cannot put a file where a directory is
    assert cache.store(key, {"b": 2}) is False
    assert sorted(p.name for p in entry.parent.iterdir()) == [entry.name]
    assert cache.load(key) is None
