"""Step time from the compiled program: each kernel priced on the device's rates, then added up.

Each :class:`~remat_kit.xla.Kernel` costs:

- **gemm**: ``max(flops / matmul rate, bytes / memory rate)``, the compute side stretched by wave
  quantization (output tiles of 128 x 128 spread over the device's SMs: a product with 140 tiles
  on 132 SMs takes two waves);
- **attention** (cuDNN flash attention): flops at the attention efficiency (backward already 2.5x
  the forward's flops), at least its bytes over the memory rate;
- **memory**: bytes over the memory rate;
- **collective**: a ring over ``group`` devices: all-gather and reduce-scatter move
  ``bytes x (n - 1) / n`` per device, all-reduce twice that. Inside one NVLink domain the ring
  runs at NCCL's share of NVLink; a group that spans domains runs at
  ``min(NVLink ring, g x network per GPU)``, ``g`` the group's members in one domain (read
  from its replica groups: an FSDP axis over whole nodes has all 8, a data axis across nodes
  one). An asynchronous one hides behind the kernels XLA scheduled between its start and its
  done (its window: :attr:`~remat_kit.xla.Kernel.window`), the rest of it is exposed; while it
  runs, the compute beside it loses NCCL's SMs (:attr:`~remat_kit.timing.Speed.contention`);
- **host_transfer**: its host bytes over the host link at the link's efficiency, added in full
  (measured: XLA did not overlap offload copies with compute on an H100); on a TPU an
  asynchronous one runs beside the compute, offloads beside the forward's and read-backs
  beside the backward's (:func:`_host_exposed`);

plus a fixed cost per launch. Recomputation is the time of the kernels the program re-runs.

Example:
  >>> import remat_kit as rk
  >>> from remat_kit.timing import Kernel, speed_of
  >>> n = 4096  # one bf16 product: 137 GFLOP at 801 TFLOP/s, 1024 tiles in 8 waves of 132
  >>> gemm = Kernel("gemm", count=1, flops=2.0 * n**3, bytes=3 * n * n * 2, m=n, n=n, k=n,
  ...               batch=1, dtype="bf16")
  >>> round(step_time([gemm], speed_of(rk.target("h100"))).matmul_seconds * 1e6)
  177
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from remat_kit.timing._speed import Speed
from remat_kit.xla import Kernel

__all__ = [
    "StepTime",
    "fresh_bytes_of",
    "measure_cpu_speed",
    "step_time",
]

_TILE = 128


@dataclasses.dataclass(frozen=True)
class StepTime:
    """A predicted step time and where it goes.

    Attributes:
      seconds: the step's predicted wall time.
      matmul_seconds: matrix products.
      attention_seconds: fused attention kernels.
      memory_seconds: memory-bound kernels (norms, activations, optimizer updates, copies).
      collective_seconds: collectives that the step waits for (exposed).
      collective_hidden_seconds: asynchronous collectives' time hidden behind compute.
      contention_seconds: what the compute loses while collectives run beside it (NCCL's
        kernels hold SMs and memory bandwidth): the hidden time times
        :attr:`~remat_kit.timing.Speed.contention`.
      transfer_seconds: host-link transfers (offload), exposed.
      launch_seconds: the fixed per-kernel costs.
      recompute_seconds: the part of all the above that re-runs forward work.
      model_flops: FLOPs of products and attention, recomputation excluded (for MFU).
      flops: FLOPs of products and attention, recomputation included.
      kernels: kernel launches per step.
      device: the :class:`Speed`'s name.
      assumptions: where the rates come from.
    """

    seconds: float
    matmul_seconds: float
    attention_seconds: float
    memory_seconds: float
    collective_seconds: float
    collective_hidden_seconds: float
    transfer_seconds: float
    launch_seconds: float
    recompute_seconds: float
    model_flops: float
    flops: float
    kernels: int
    device: str
    peak_flops: float
    assumptions: tuple[str, ...] = ()
    contention_seconds: float = 0.0

    def tokens_per_second(self, tokens: int) -> float:
        """``tokens`` (per step) over the step time."""
        return tokens / self.seconds if self.seconds > 0 else math.inf

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: model FLOPs per second over the device's peak."""
        if self.seconds <= 0 or self.peak_flops <= 0:
            return 0.0
        return self.model_flops / self.seconds / self.peak_flops

    def split(self) -> dict[str, float]:
        """Seconds by where they go (they add up to ``seconds``)."""
        return {
            "matmul": self.matmul_seconds,
            "attention": self.attention_seconds,
            "memory": self.memory_seconds,
            "collective": self.collective_seconds,
            "contention": self.contention_seconds,
            "transfer": self.transfer_seconds,
            "launch": self.launch_seconds,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, with ``mfu`` and the split."""
        out = dataclasses.asdict(self)
        out["assumptions"] = list(self.assumptions)
        out["mfu"] = self.mfu
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepTime:
        """The inverse of :meth:`to_dict` (extra keys ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["assumptions"] = tuple(values.get("assumptions", ()))
        return cls(**values)


def step_time(
    kernels: Iterable[Kernel],
    speed: Speed,
    *,
    devices_per_host: int | None = None,
    fresh_bytes: int = 0,
) -> StepTime:
    """Prices every kernel of a step on ``speed`` and adds them up.

    Args:
      kernels: the step's kernels (:func:`remat_kit.timing.kernels_of`).
      speed: the device's rates (:func:`remat_kit.timing.speed_of`).
      devices_per_host: devices one host holds (collectives over more cross the network);
        None: all on one host.
      fresh_bytes: memory the step allocates afresh each run (its temporaries and the outputs
        that alias no input: :func:`fresh_bytes_of`). Priced at ``speed.fresh_bytes_per_s``
        as memory time; nothing where that rate is 0 (GPUs).

    Returns:
      The StepTime.

    Example:
      >>> import remat_kit as rk
      >>> from remat_kit.timing import Kernel, speed_of
      >>> k = Kernel("memory", count=10, flops=0.0, bytes=3_016_800_000)  # 3.02 GB at 3.02 TB/s
      >>> round(step_time([k], speed_of(rk.target("h100"))).memory_seconds, 4)
      0.01
    """
    parts = dict.fromkeys(("gemm", "attention", "memory", "collective", "host_transfer"), 0.0)
    pooled = 0.0  # asynchronous collectives whose window was not read
    to_host = from_host = 0.0  # a TPU's asynchronous host transfers, by direction
    recomputed = 0.0  # compute that re-runs forward work (it belongs to the backward)
    beside: dict[int, float] = {}  # window -> its collectives' seconds
    under: dict[int, float] = {}  # window -> the compute scheduled under them
    launch = recompute = model_flops = flops = 0.0
    launches = 0
    for k in kernels:
        seconds = _seconds(k, speed, devices_per_host)
        each = speed.kernel_seconds
        if k.kind == "host_transfer" and k.asynchronous and speed.torus:
            # A TPU's host DMA runs beside the TensorCore, started and waited for around the
            # compute libtpu schedules between (MaxText's HOST_OFFLOAD_FLAGS let it overlap):
            # hidden behind the compute that no collective's window holds. An offload (a
            # slice written to the host) and a read-back go opposite ways over the link.
            if k.op.startswith("dynamic-update-slice"):
                to_host += seconds * k.count
            else:
                from_host += seconds * k.count
        elif k.kind == "collective" and k.asynchronous:
            if k.window:
                beside[k.window] = beside.get(k.window, 0.0) + seconds * k.count
            else:
                pooled += seconds * k.count
        else:
            parts[k.kind] += seconds * k.count
            if k.window and k.kind in ("gemm", "attention", "memory"):
                under[k.window] = under.get(k.window, 0.0) + (seconds + each) * k.count
        launch += each * k.count
        launches += k.count
        if k.recompute:
            recompute += (seconds + each) * k.count
            if k.kind in ("gemm", "attention", "memory"):
                recomputed += seconds * k.count
        if k.kind in ("gemm", "attention"):
            flops += k.flops * k.count
            if not k.recompute:
                model_flops += k.flops * k.count
    if fresh_bytes and speed.fresh_bytes_per_s > 0:
        # XLA:CPU takes each run's temporaries and outputs from the allocator anew, and the
        # large ones come back as untouched pages: their first write faults every page in.
        parts["memory"] += fresh_bytes / speed.fresh_bytes_per_s
    compute = parts["gemm"] + parts["attention"] + parts["memory"]
    # A collective hides behind what XLA scheduled between its start and its done; past
    # that, the step waits at the done.
    hidden = sum(min(c, under.get(w, 0.0)) for w, c in beside.items())
    exposed = sum(max(0.0, c - under.get(w, 0.0)) for w, c in beside.items())
    # Collectives without a window (a program read before windows were): behind the compute
    # no window holds.
    pooled_hidden = min(pooled, max(0.0, compute - sum(under.values())))
    hidden += pooled_hidden
    exposed += parts["collective"] + pooled - pooled_hidden
    free = max(0.0, compute - sum(under.values()) - pooled_hidden)
    parts["host_transfer"] += _host_exposed(to_host, from_host, free, compute, recomputed)
    contention = hidden * speed.contention
    total = compute + exposed + contention + parts["host_transfer"] + launch
    return StepTime(
        seconds=total,
        matmul_seconds=parts["gemm"],
        attention_seconds=parts["attention"],
        memory_seconds=parts["memory"],
        collective_seconds=exposed,
        collective_hidden_seconds=hidden,
        contention_seconds=contention,
        transfer_seconds=parts["host_transfer"],
        launch_seconds=launch,
        recompute_seconds=recompute,
        model_flops=model_flops,
        flops=flops,
        kernels=launches,
        device=speed.name,
        peak_flops=speed.peak_flops,
        assumptions=speed.sources,
    )


def _host_exposed(
    to_host: float, from_host: float, free: float, compute: float, recomputed: float
) -> float:
    """What of a TPU's asynchronous host transfers the step waits for.

    Alone, they hide behind the ``free`` compute (what no collective's window holds). A step
    that writes residuals to the host and reads them back runs the writes in its forward pass
    and the reads in its backward: a write cannot start before its layer's forward, a read
    must end before its layer's gradient. The link is full duplex (each way its own rate), so
    each direction is taken to hide behind its own pass's compute: the forward is a
    third of the compute that is not recomputation (the backward's products are twice the
    forward's: the inputs' and the weights' gradients), the backward the rest."""
    if not (to_host and from_host):
        return max(0.0, to_host + from_host - free)
    forward = (compute - recomputed) / 3 / compute if compute > 0 else 0.0
    ahead = free * forward
    return max(0.0, to_host - ahead) + max(0.0, from_host - (free - ahead))


def _seconds(k: Kernel, speed: Speed, devices_per_host: int | None) -> float:
    memory = k.bytes / speed.bytes_per_s()
    if k.kind == "gemm":
        compute = k.flops / speed.matmul_flops_per_s(k.dtype) * _waves(k, speed.units)
        return max(compute, memory)
    if k.kind == "attention":
        fwd, bwd = speed.attention_efficiency
        eff = bwd if k.op == "attention_bwd" else fwd
        if k.k and k.k < 128:
            eff *= 0.8
        if speed.mxu and k.k:
            # A TPU's MXU holds a product's right-hand operand (the scaling book's "weight",
            # an mxu x mxu tile) while the other streams through. Every product of jax's
            # splash kernels (qk, pv; dq, dk, dv, dp) holds an operand with the head dim as
            # one side: a head dim of 128 fills half of v6e's 256 x 256 array.
            eff *= k.k / (math.ceil(k.k / speed.mxu) * speed.mxu)
        return max(k.flops / (speed.peak_flops * eff), memory)
    if k.kind == "collective":
        return _collective_seconds(k, speed, devices_per_host)
    if k.kind == "host_transfer":
        link = (speed.host_link or 32e9) * speed.host_link_efficiency
        return k.host_bytes / link + memory
    memory = k.bytes / speed.loop_bytes_per_s(k.parts > 1, k.strided)
    if k.ops and speed.alu_ops:
        return max(memory, k.ops / speed.alu_ops)
    return memory


def _waves(k: Kernel, units: int) -> float:
    # Output tiles spread over the units; the last wave runs partly empty.
    if not k.m or not k.n or units <= 0:
        return 1.0
    tiles = math.ceil(k.m / _TILE) * math.ceil(k.n / _TILE) * max(1, k.batch)
    return math.ceil(tiles / units) * units / tiles


def _collective_seconds(k: Kernel, speed: Speed, devices_per_host: int | None) -> float:
    n = max(1, k.group)
    if k.op == "collective-permute" and speed.torus:
        # A TPU permute (libtpu decomposes all-gathers and reduce-scatters into them) sends
        # its buffer once to a neighbour: over one ICI link, one way (half of device_link,
        # which counts a torus axis's two directions).
        return k.bytes / (speed.device_link / 2 * speed.link_efficiency)
    if n == 1:
        return 0.0
    share = k.bytes * (n - 1) / n
    if k.op == "all-reduce":
        share *= 2
    elif k.op == "collective-permute":
        share = k.bytes
    return share / _ring_bytes_per_s(k, speed, devices_per_host)


def _ring_bytes_per_s(k: Kernel, speed: Speed, devices_per_host: int | None) -> float:
    """What one device of ``k``'s ring moves per second (NCCL's bus bandwidth).

    Inside one NVLink domain the ring runs over NVLink. A group that spans domains is as fast
    as its slowest hop: NCCL builds one ring per NIC and each ring leaves a domain once, so a
    domain's share of a ring is ``g`` devices (the group's members in one domain) sending
    through ``g`` devices' worth of NICs: ``min(NVLink, g x network per device)`` (a data
    axis across nodes, one member per node, gets one device's NICs; an FSDP axis with every
    GPU of each node, all of them)."""
    n = max(1, k.group)
    domain = speed.domain or devices_per_host or n
    nvlink = speed.device_link * speed.link_efficiency * _torus_axes(speed.torus, n)
    together = _in_one_domain(k, domain)
    if together >= n:
        if k.op == "all-reduce":  # NVLink SHARP reduces in the switch
            return speed.device_link * speed.all_reduce_efficiency
        return nvlink
    return min(nvlink, together * speed.network * speed.network_efficiency)


def _torus_axes(torus: tuple[int, ...], n: int) -> int:
    """How many axes of a TPU torus a group of ``n`` chips spans, its largest axes first
    (each adds its links to the ring); 1 for a GPU's switch."""
    axes, held = 0, 1
    for side in sorted(torus, reverse=True):
        if held >= n:
            break
        held *= side
        axes += 1
    return max(1, axes)


def _in_one_domain(k: Kernel, domain: int) -> int:
    """How many members of ``k``'s group share an NVLink domain of ``domain`` devices (ids
    ``0..domain-1`` the first), from the group's runs of consecutive ids."""
    n = max(1, k.group)
    run = k.run or n  # not read: one block of ids
    if run >= domain:
        return domain
    if not k.stride or k.stride >= domain:
        return min(run, n)
    return min(n, run * (domain // k.stride))


def fresh_bytes_of(memory: Any) -> int:
    """What a run of a compiled program allocates anew: its temporaries and the outputs that
    alias no input (a donated parameter's update is written in place).

    Args:
      memory: ``compiled.memory_analysis()`` (anything with its ``*_size_in_bytes`` fields).

    Returns:
      Bytes, for :func:`step_time`'s ``fresh_bytes``.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> x = jax.ShapeDtypeStruct((1024,), jnp.float32)
      >>> fresh_bytes_of(jax.jit(lambda a: a * 2).lower(x).compile().memory_analysis())
      4096
      >>> donated = jax.jit(lambda a: a * 2, donate_argnums=0).lower(x).compile()
      >>> fresh_bytes_of(donated.memory_analysis())
      0
    """
    out = memory.output_size_in_bytes - memory.alias_size_in_bytes
    return int(memory.temp_size_in_bytes + max(0, out))


def measure_cpu_speed(seconds: float = 2.0) -> Speed:
    """This CPU's rates, measured now, the way XLA's CPU programs use them.

    bf16 and f32 products give the matmul rates; an elementwise update in place (a donated buffer,
    so no fresh output pages are touched) the memory rate; random bits (the threefry fusion
    dropout uses) the arithmetic rate, counted as :func:`kernels_of` counts a fusion's
    operations; a chain of tiny ops the per-kernel cost; a fill of a new output less the same
    write in place the cost of fresh pages (what a run's newly allocated memory costs on first
    write: on this workplace's VMs 11-19x the in-place write).

    Args:
      seconds: roughly how long to spend measuring.

    Returns:
      A Speed whose efficiencies are 1 (the measured rates are the rates).

    Example:
      >>> s = measure_cpu_speed(0.2)
      >>> s.peak_flops > 1e8 and s.memory_bandwidth > 1e8 and s.alu_ops > 1e7
      True
      >>> s.fresh_bytes_per_s > 0
      True
    """
    import jax
    import jax.numpy as jnp

    from remat_kit.xla import kernels_of

    cpu = jax.devices("cpu")[0]
    budget = seconds / 4
    n = 1024
    product = jax.jit(lambda x: x @ x)
    rates = {}
    for dtype in (jnp.float32, jnp.bfloat16):  # XLA:CPU runs bf16 products at its own rate
        a = jax.device_put(jnp.ones((n, n), dtype), cpu)
        rates[dtype] = 2.0 * n**3 / _best(product, a, budget / 2)
    flops = rates[jnp.bfloat16]

    size = 256 * 2**20  # the bytes the update and the fill move: one number for both
    update = jax.jit(lambda x: x * 1.0001 + 1.0, donate_argnums=0)
    state = {"x": jax.device_put(jnp.ones((size // 4,), jnp.float32), cpu)}

    def step(_: Any) -> Any:
        state["x"] = update(state["x"])
        return state["x"]

    bandwidth = 2 * size / _best(step, None, budget)
    # The same bytes written into a new output each call: the allocator maps fresh pages
    # (glibc serves blocks this large from mmap), so the write also faults every page in.
    fill = jax.jit(lambda x: jnp.full_like(x, 2.0))
    faults = _best(fill, state["x"], budget) - size / bandwidth
    fresh = size / faults if faults > 0 else 0.0

    loops = _loop_rates(budget)

    bits = jax.jit(lambda k: jax.random.bits(k, (2**22,), jnp.uint32))
    key = jax.random.key(0)
    ops = sum(k.ops * k.count for k in kernels_of(bits.lower(key).compile().as_text()))
    alu = ops / _best(bits, key, budget) if ops else 0.0

    tiny = jax.device_put(jnp.ones((8,), jnp.float32), cpu)
    overhead = _best(jax.jit(lambda x: x + 1.0), tiny, budget)
    return Speed(
        name="cpu (measured)",
        peak_flops=flops,
        matmul_efficiency=1.0,
        attention_efficiency=(1.0, 1.0),
        memory_bandwidth=bandwidth,
        memory_efficiency=1.0,
        kernel_seconds=min(overhead, 2e-5),
        units=os.cpu_count() or 1,
        host_link=None,
        host_link_efficiency=1.0,
        device_link=bandwidth,
        network=bandwidth,
        alu_ops=alu,
        f32_matmul_ratio=rates[jnp.float32] / flops,
        fresh_bytes_per_s=fresh,
        loop_rates=loops,
        sources=(
            f"measured on this CPU: bf16 / f32 products {flops / 1e9:.0f} / "
            f"{rates[jnp.float32] / 1e9:.0f} GFLOP/s, in-place update "
            f"{bandwidth / 1e9:.1f} GB/s ("
            + ", ".join(
                f"{'threaded' if t else 'one thread'}{' transposing' if st else ''} {r / 1e9:.2g}"
                for t, st, r in loops
            )
            + f"), fresh pages {fresh / 1e9:.1f} GB/s, random bits {alu / 1e9:.1f} Gop/s",
        ),
    )


def _loop_rates(budget: float) -> tuple[tuple[bool, bool, float], ...]:
    """The rates of XLA:CPU's memory-bound loops by kind, each from a program that XLA
    compiles to one loop of that kind and in place (a donated buffer: no fresh pages): an
    update written into a slice of a stacked buffer (one thread), the same update
    transposed (one thread, strided), and a transposed sum (threaded, strided). Each loop's
    bytes are counted as :func:`kernels_of` counts them, and its rate goes to the kind the
    walker gives it: a loop XLA compiles otherwise on another CPU still prices its own
    kind."""
    import jax
    import jax.numpy as jnp

    from remat_kit.xla import kernels_of

    n = 4096
    upd = jnp.ones((n, n), jnp.float32)
    programs = (
        (lambda b, u: jax.lax.dynamic_update_index_in_dim(b, u, 1, 0), (2, n, n)),
        (lambda b, u: jax.lax.dynamic_update_index_in_dim(b, u.T, 1, 0), (2, n, n)),
        (lambda b, u: b + u.T, (n, n)),
    )
    found: dict[tuple[bool, bool], float] = {}
    for fn, shape in programs:
        program = jax.jit(fn, donate_argnums=0)
        state = {"b": jnp.zeros(shape, jnp.float32)}
        kernels = kernels_of(program.lower(state["b"], upd).compile().as_text())
        loops = [k for k in kernels if k.kind == "memory"]
        if not loops:
            continue
        main = max(loops, key=lambda k: k.bytes * k.count)

        def step(_: Any, program: Any = program, state: dict[str, Any] = state) -> Any:
            state["b"] = program(state["b"], upd)
            return state["b"]

        moved = sum(k.bytes * k.count for k in loops)
        found.setdefault((main.parts > 1, main.strided), moved / _best(step, None, budget / 3))
    return tuple((t, s, rate) for (t, s), rate in sorted(found.items()))


def _best(fn: Any, x: Any, budget: float) -> float:
    import jax

    jax.block_until_ready(fn(x))
    best = math.inf
    end = time.perf_counter() + budget
    runs = 0
    while runs < 3 or time.perf_counter() < end:
        start = time.perf_counter()
        jax.block_until_ready(fn(x))
        best = min(best, time.perf_counter() - start)
        runs += 1
    return best
