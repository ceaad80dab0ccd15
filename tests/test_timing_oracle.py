"""The step-time model against an oracle written here from its documented rules.

``rk.timing.step_time`` prices each kernel of a step on a device's rates and adds them up
(remat_kit/timing/_model.py's module docstring, :class:`~remat_kit.timing.Speed`'s fields and
:class:`~remat_kit.timing.Kernel`'s). Here random steps (every kind of kernel, in and out of
collectives' windows, recomputed or not, async host transfers on a torus) on random devices
(GPU-like and TPU-like, with loop rates, arithmetic rates and fresh-page costs or without)
are priced by hand: each documented rule on its own, laid out differently from the model's
code (a group's members in one NVLink domain are counted by listing its device ids; the
torus axes a ring spans by trying each number of the largest axes), and every field of the
StepTime compared. The values are drawn from small sets so that the rules' boundaries (a
head dim of exactly 128, a run exactly one domain long, a group that exactly fills its torus
axes) come up often.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from remat_kit.timing import Kernel, Speed, StepTime, step_time

# --- random devices and steps ---------------------------------------------------------------


def _speed(rng: random.Random) -> Speed:
    """A random device: a GPU-like one (SMs, a switch, maybe a NVLink domain) or a TPU-like
    one (a torus, an MXU, no waves), with the CPU's extra rates or without.

    Args:
      rng: the case's generator.

    Returns:
      The Speed.
    """
    tpu = rng.random() < 0.35
    rates = ()
    if rng.random() < 0.5:  # a CPU's loop kinds; a rate of 0 stands for a kind not measured
        kinds = [(t, s) for t in (False, True) for s in (False, True)]
        rates = tuple((t, s, rng.choice([0.0, 2e9, 7e9, 3e10])) for t, s in rng.sample(kinds, 3))
    return Speed(
        name=rng.choice(["toy-gpu", "toy-tpu"]),
        peak_flops=rng.choice([1e12, 4e14, 989e12]),
        matmul_efficiency=rng.choice([0.5, 0.81, 1.0]),
        attention_efficiency=(rng.choice([0.5, 0.9]), rng.choice([0.4, 0.7])),
        memory_bandwidth=rng.choice([1e9, 8e11, 3.35e12]),
        memory_efficiency=rng.choice([0.85, 1.0]),
        kernel_seconds=rng.choice([0.0, 1e-6, 3e-6]),
        units=0 if tpu else rng.choice([0, 1, 4, 132]),
        host_link=rng.choice([None, 1e9, 64e9]),
        host_link_efficiency=rng.choice([0.86, 1.0]),
        device_link=rng.choice([1e9, 4.5e11]),
        network=rng.choice([5e9, 5e10]),
        domain=rng.choice([0, 0, 4, 8]),
        link_efficiency=rng.choice([0.8, 0.9]),
        all_reduce_efficiency=rng.choice([0.8, 1.07]),
        network_efficiency=rng.choice([0.8, 0.92]),
        contention=0.0 if tpu else rng.choice([0.0, 0.138]),
        alu_ops=rng.choice([0.0, 1e9, 5e12]),
        f32_matmul_ratio=rng.choice([0.5, 1.0]),
        fresh_bytes_per_s=rng.choice([0.0, 0.0, 1.0, 2.5e9]),  # 1 B/s: a rate, however slow
        loop_rates=rates,
        torus=rng.choice([(4, 4), (2, 4, 8), (4, 4, 4)]) if tpu else (),
        mxu=rng.choice([0, 128, 256]) if tpu else 0,
    )


def _group(rng: random.Random) -> dict[str, int]:
    """A collective's group as a mesh axis lays it out: ``runs`` runs of ``run``
    consecutive ids, ``stride`` apart (powers of two, as meshes are); run 0: not read."""
    run = rng.choice([1, 2, 4, 8, 16])
    runs = rng.choice([1, 1, 2, 4])
    stride = 0 if runs == 1 else run * rng.choice([1, 2, 4])
    if rng.random() < 0.15:
        return {"group": run * runs, "run": 0, "stride": 0}
    return {"group": run * runs, "run": run, "stride": stride}


def _kernel(rng: random.Random, windows: int) -> Kernel:
    kind = rng.choice(["gemm", "gemm", "attention", "memory", "memory", "collective",
                       "host_transfer"])  # fmt: skip
    common = {
        "count": rng.randint(1, 4),
        "bytes": rng.choice([0, 10**6, 3 * 10**8, 4 * 10**9]),
        "recompute": rng.random() < 0.3,
        "window": rng.choice([0, 0, *range(1, windows + 1)]),
    }
    if kind == "gemm":
        return Kernel("gemm", flops=rng.choice([1e9, 2e12, 7e13]),
                      m=rng.choice([0, 100, 128, 4096]), n=rng.choice([0, 128, 129, 1000]),
                      k=64, batch=rng.choice([0, 1, 3, 40]),
                      dtype=rng.choice(["bf16", "f16", "f32", "s32", "f64"]), **common)  # fmt: skip
    if kind == "attention":
        return Kernel("attention", flops=rng.choice([1e9, 5e12, 3e13]),
                      k=rng.choice([0, 64, 96, 127, 128, 192, 256, 320]),
                      op=rng.choice(["attention_fwd", "attention_bwd"]), **common)  # fmt: skip
    if kind == "memory":
        return Kernel("memory", flops=0.0, ops=rng.choice([0.0, 0.0, 1e9, 4e11]),
                      parts=rng.choice([1, 1, 2, 8]), strided=rng.random() < 0.4,
                      **common)  # fmt: skip
    if kind == "collective":
        op = rng.choice(["all-gather", "reduce-scatter", "all-reduce", "collective-permute",
                         "all-to-all"])  # fmt: skip
        return Kernel("collective", flops=0.0, op=op, asynchronous=rng.random() < 0.6,
                      **_group(rng), **common)  # fmt: skip
    op = rng.choice(["dynamic-update-slice-start", "dynamic-slice-start", "copy-start", "copy"])
    return Kernel("host_transfer", flops=0.0, host_bytes=rng.choice([10**6, 10**9, 5 * 10**9]),
                  op=op, asynchronous=rng.random() < 0.7, **common)  # fmt: skip


def _case(seed: int) -> tuple[list[Kernel], Speed, int | None, int]:
    rng = random.Random(seed)
    speed = _speed(rng)
    windows = rng.randint(0, 3)
    kernels = [_kernel(rng, windows) for _ in range(rng.randint(1, 12))]
    per_host = rng.choice([None, None, 2, 4, 8])
    fresh = rng.choice([0, 0, 10**9])
    return kernels, speed, per_host, fresh


# --- the oracle -----------------------------------------------------------------------------

_COMPUTE = ("gemm", "attention", "memory")


def _members_in_first_domain(k: Kernel, domain: int) -> int:
    """The group's device ids (runs of ``run`` consecutive ids every ``stride``; one block
    of ``group`` ids when not read) that fall in ids ``0..domain-1``."""
    n = max(1, k.group)
    if not k.run:
        ids = range(n)
    else:
        stride = k.stride or n  # one run
        ids = [s * stride + j for s in range(n // k.run) for j in range(k.run)]
    return sum(1 for i in ids if i < domain)


def _torus_axes(torus: tuple[int, ...], n: int) -> int:
    """How many of the largest torus axes hold ``n`` chips (all of them if none do; at
    least one: a switch, or a group of one)."""
    sides = sorted(torus, reverse=True)
    for a in range(len(sides) + 1):
        if math.prod(sides[:a]) >= n:
            return max(1, a)
    return max(1, len(sides))


def _collective(k: Kernel, s: Speed, per_host: int | None) -> float:
    """Module docstring: a ring over ``group`` devices; all-gather and reduce-scatter move
    ``bytes (n-1)/n`` per device, all-reduce twice that; a permute sends its bytes once (on
    a torus over one link, one way: half of ``device_link``). Inside one NVLink domain the
    ring runs at ``link_efficiency`` of the link (times the torus axes it spans), an
    all-reduce at ``all_reduce_efficiency``; across domains at
    ``min(ring, g x network x network_efficiency)``, ``g`` the members in one domain."""
    n = max(1, k.group)
    if k.op == "collective-permute" and s.torus:
        return k.bytes / (s.device_link * s.link_efficiency / 2)
    if n == 1:
        return 0.0
    moved = {"all-reduce": 2 * k.bytes * (n - 1) / n, "collective-permute": k.bytes}
    nbytes = moved.get(k.op, k.bytes * (n - 1) / n)
    domain = s.domain or per_host or n
    ring = s.device_link * s.link_efficiency * _torus_axes(s.torus, n)
    g = _members_in_first_domain(k, domain)
    if g == n:
        rate = s.device_link * s.all_reduce_efficiency if k.op == "all-reduce" else ring
    else:
        rate = min(ring, g * s.network * s.network_efficiency)
    return nbytes / rate


def _priced(k: Kernel, s: Speed, per_host: int | None) -> float:
    """One launch's seconds, by the rule of its kind (module docstring, Speed's fields)."""
    hbm = s.memory_bandwidth * s.memory_efficiency
    if k.kind == "gemm":
        rate = s.peak_flops * s.matmul_efficiency
        rate *= {"f32": s.f32_matmul_ratio, "s32": s.f32_matmul_ratio, "f64": 1 / 30}.get(
            k.dtype, 1.0
        )
        waves = 1.0
        if k.m and k.n and s.units > 0:  # 128 x 128 output tiles over the units, in waves
            tiles = -(-k.m // 128) * -(-k.n // 128) * max(1, k.batch)
            waves = -(-tiles // s.units) * s.units / tiles
        return max(k.flops / rate * waves, k.bytes / hbm)
    if k.kind == "attention":
        eff = s.attention_efficiency[1 if k.op == "attention_bwd" else 0]
        if 0 < k.k < 128:  # "at 64 both are 0.8 of these"
            eff *= 0.8
        if s.mxu and k.k:  # the share of the MXU's side the head dim fills
            eff *= k.k / (s.mxu * -(-k.k // s.mxu))
        return max(k.flops / (s.peak_flops * eff), k.bytes / hbm)
    if k.kind == "collective":
        return _collective(k, s, per_host)
    if k.kind == "host_transfer":
        return k.host_bytes / ((s.host_link or 32e9) * s.host_link_efficiency) + k.bytes / hbm
    listed = [r for t, st, r in s.loop_rates if (t, st) == (k.parts > 1, k.strided) and r > 0]
    seconds = k.bytes / (listed[0] if listed else hbm)
    if k.ops and s.alu_ops:
        seconds = max(seconds, k.ops / s.alu_ops)
    return seconds


def _oracle(kernels: list[Kernel], s: Speed, per_host: int | None, fresh: int) -> dict:
    """Every field of the StepTime, from the documented rules."""
    each = s.kernel_seconds
    rows = [(k, _priced(k, s, per_host) * k.count) for k in kernels]
    tpu_host = [(k, t) for k, t in rows if k.kind == "host_transfer" and k.asynchronous and s.torus]
    async_coll = [(k, t) for k, t in rows if k.kind == "collective" and k.asynchronous]
    inline = [(k, t) for k, t in rows if (k, t) not in tpu_host and (k, t) not in async_coll]
    by_kind = {kind: sum(t for k, t in inline if k.kind == kind) for kind in
               ("gemm", "attention", "memory", "collective", "host_transfer")}  # fmt: skip
    if fresh and s.fresh_bytes_per_s > 0:  # fresh pages cost memory time
        by_kind["memory"] += fresh / s.fresh_bytes_per_s
    compute = by_kind["gemm"] + by_kind["attention"] + by_kind["memory"]
    # A window's collectives hide behind the compute (launches included) XLA put in it.
    windows = {k.window for k, _ in async_coll if k.window}
    under = {
        w: sum(t + each * k.count for k, t in inline if k.window == w and k.kind in _COMPUTE)
        for w in {k.window for k, _ in inline if k.window}
    }
    hidden = exposed = 0.0
    for w in windows:
        c = sum(t for k, t in async_coll if k.window == w)
        hidden += min(c, under.get(w, 0.0))
        exposed += max(0.0, c - under.get(w, 0.0))
    # Collectives with no window read: behind the compute no window holds.
    pooled = sum(t for k, t in async_coll if not k.window)
    outside = max(0.0, compute - sum(under.values()))
    pooled_hidden = min(pooled, outside)
    hidden += pooled_hidden
    exposed += by_kind["collective"] + pooled - pooled_hidden
    free = max(0.0, outside - pooled_hidden)
    # A TPU's async host transfers: offloads (slices written out) behind the forward's share
    # of the free compute (a third of what is not recomputation), read-backs behind the rest.
    out_ = sum(t for k, t in tpu_host if k.op.startswith("dynamic-update-slice"))
    back = sum(t for k, t in tpu_host if not k.op.startswith("dynamic-update-slice"))
    if out_ and back:
        again = sum(t for k, t in inline if k.recompute and k.kind in _COMPUTE)
        ahead = free * ((compute - again) / 3 / compute if compute > 0 else 0.0)
        transfer = max(0.0, out_ - ahead) + max(0.0, back - (free - ahead))
    else:
        transfer = max(0.0, out_ + back - free)
    transfer += by_kind["host_transfer"]
    launch = each * sum(k.count for k in kernels)
    contention = hidden * s.contention
    products = [k for k in kernels if k.kind in ("gemm", "attention")]
    return {
        "seconds": compute + exposed + contention + transfer + launch,
        "matmul_seconds": by_kind["gemm"],
        "attention_seconds": by_kind["attention"],
        "memory_seconds": by_kind["memory"],
        "collective_seconds": exposed,
        "collective_hidden_seconds": hidden,
        "contention_seconds": contention,
        "transfer_seconds": transfer,
        "launch_seconds": launch,
        "recompute_seconds": sum(t + each * k.count for k, t in rows if k.recompute),
        "model_flops": sum(k.flops * k.count for k in products if not k.recompute),
        "flops": sum(k.flops * k.count for k in products),
        "kernels": sum(k.count for k in kernels),
    }


# --- the comparison -------------------------------------------------------------------------

SEEDS = range(400)


@pytest.mark.parametrize("chunk", range(8))
def test_step_time_is_every_kernel_priced_by_its_documented_rule(chunk):
    for seed in SEEDS[chunk::8]:
        kernels, speed, per_host, fresh = _case(seed)
        got = step_time(kernels, speed, devices_per_host=per_host, fresh_bytes=fresh)
        want = _oracle(kernels, speed, per_host, fresh)
        for field, value in want.items():
            assert getattr(got, field) == pytest.approx(value, rel=1e-9, abs=1e-18), (
                seed,
                field,
            )
        assert (got.device, got.peak_flops) == (speed.name, speed.peak_flops)
        assert sum(got.split().values()) == pytest.approx(got.seconds, rel=1e-9)


def test_each_kernel_alone_is_its_own_price_plus_its_launches():
    # One kernel at a time, synchronous and outside any window: the step is its priced time
    # and its launches (what the timeline lays out, remat_kit/timing/_program.py).
    for seed in range(300):
        rng = random.Random(seed)
        speed = _speed(rng)
        k = dataclasses.replace(_kernel(rng, 0), asynchronous=False, window=0)
        per_host = rng.choice([None, 2, 4, 8])
        got = step_time([k], speed, devices_per_host=per_host).seconds
        want = (_priced(k, speed, per_host) + speed.kernel_seconds) * k.count
        assert got == pytest.approx(want, rel=1e-9, abs=1e-18), (seed, k)


@pytest.mark.parametrize(
    ("seconds", "model_flops", "peak", "mfu", "tokens_per_s"),
    [
        (2.0, 4e12, 1e12, 2.0, 500.0),
        (0.0, 4e12, 1e12, 0.0, math.inf),  # no time: no MFU, tokens without end
        (2.0, 4e12, 0.0, 0.0, 500.0),  # a device without a peak: no MFU
    ],
)
def test_mfu_and_tokens_per_second_are_the_flops_and_tokens_over_the_time(
    seconds, model_flops, peak, mfu, tokens_per_s
):
    zero = dict.fromkeys(
        (f.name for f in dataclasses.fields(StepTime) if f.type in ("float", "int")), 0
    )
    t = StepTime(**{**zero, "seconds": seconds, "model_flops": model_flops,
                    "peak_flops": peak, "device": "d"})  # fmt: skip
    assert t.mfu == pytest.approx(mfu)
    assert t.tokens_per_second(1000) == pytest.approx(tokens_per_s)
    back = StepTime.from_dict({**t.to_dict(), "extra": 1})
    assert back == t and t.to_dict()["mfu"] == pytest.approx(mfu)
