"""A Dask cluster as the executor of independent compiles (``--cluster ADDRESS``).

:func:`connect` opens a ``distributed.Client`` on the scheduler's address, checks that every
worker runs the same Python, jax, jaxlib, GPU plugin and remat-kit as this process (a compile's
figures depend on them), and returns a :class:`Cluster` whose ``executor`` is the client's
``concurrent.futures.Executor``: :func:`remat_kit._workers.run` hands it the items that
compile. Dask is an optional extra (``pip install 'remat-kit[cluster]'``), imported here only.

Example:
  >>> missing_extra().param
  'cluster'
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import re
import socket
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from remat_kit._workers._tasks import versions
from remat_kit.errors import BadValue, RematKitError

__all__ = [
    "EXTRA",
    "Cluster",
    "ClusterError",
    "connect",
    "missing_extra",
    "require_engine",
    "version_mismatch",
]

#: How to install the engine.
EXTRA = "pip install 'remat-kit[cluster]'"
#: Seconds to wait for the scheduler, and for its first worker.
CONNECT_TIMEOUT = 10.0
#: Times a task is run again after an exception (not a worker's death: Dask reschedules
#: those itself, up to ``distributed.scheduler.allowed-failures`` times).
RETRIES = 0


class ClusterError(RematKitError, RuntimeError):
    """Items a cluster could not run (a compile that raised, a worker killed too often).

    Attributes:
      failures: ``(item, error's first line)`` for each.
    """

    def __init__(self, message: str, failures: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.failures = failures


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A connected Dask cluster.

    Attributes:
      address: the scheduler's address.
      client: the ``distributed.Client``.
      executor: ``client.get_executor()``, a ``concurrent.futures.Executor``.
      workers: worker processes connected.
      versions: what each worker runs (:func:`remat_kit._workers._tasks.versions`).
    """

    address: str
    client: Any
    executor: Executor
    workers: int
    versions: dict[str, dict[str, str | None]]

    def close(self) -> None:
        """Closes the client (the cluster itself runs on)."""
        self.client.close()


def missing_extra() -> BadValue:
    """The error for a missing ``distributed``: one line naming the extra."""
    return BadValue(
        f"compiles on a cluster need Dask distributed, which is not installed: {EXTRA}",
        param="cluster",
    )


def _first(err: BaseException) -> str:
    """An error's first line (its type where it says nothing)."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def require_engine() -> None:
    """Raises :func:`missing_extra` where ``distributed`` cannot be imported (nothing else is
    started).

    Raises:
      BadValue: ``distributed`` is not installed.
    """
    if importlib.util.find_spec("distributed") is None:
        raise missing_extra()


def version_mismatch(
    here: dict[str, str | None], workers: dict[str, dict[str, str | None]]
) -> BadValue | None:
    """The error for the first worker whose versions differ from ``here``, or None.

    Example:
      >>> here = {"python": "3.12.1", "jax": "0.12.0"}
      >>> err = version_mismatch(here, {"w1": {"python": "3.12.1", "jax": "0.11.0"}})
      >>> str(err).split(":")[0]
      'worker w1 runs jax 0.11.0, this process jax 0.12.0'
    """
    for address, theirs in sorted(workers.items()):
        for name in sorted(here.keys() | theirs.keys()):
            if here.get(name) != theirs.get(name):
                return BadValue(
                    f"worker {address} runs {name} {theirs.get(name) or '(none)'}, this process "
                    f"{name} {here.get(name) or '(none)'}: a compile's figures depend on it; "
                    "install the same versions on both",
                    param="cluster",
                )
    return None


def _probe(address: str, timeout: float) -> None:
    """A TCP address whose port does not answer is refused here, before distributed's client
    starts its event loop: a client that cannot connect has been seen to hang in its own
    start under load, where a socket's connect ends at ``timeout``. Other protocols (tls://,
    ucx://) are left to distributed."""
    m = re.fullmatch(r"(?:tcp://)?(\[[^\]]+\]|[^:/\s\[\]]+):(\d+)", address.strip())
    if m is None:
        if "://" in address and not address.strip().startswith("tcp://"):
            return
        raise BadValue(
            f"{address!r} is not a Dask scheduler's address (tcp://HOST:PORT)", param="cluster"
        )
    host, port = m.group(1).strip("[]"), int(m.group(2))
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        raise BadValue(
            f"no Dask scheduler answered at {address!r} within {timeout:g} s ({_first(err)})",
            param="cluster",
        ) from None


def _greet(distributed: Any, address: str, timeout: float) -> None:
    """A port that accepts but is no Dask scheduler is refused here, within ``timeout``.

    distributed's client waits for the peer's handshake with no time limit (``comm.connect``
    reads it unbounded), so a port that accepts and never answers hangs ``Client()`` for good,
    and a port that answers in another protocol fails it with a stray loop thread left behind.
    Here the handshake and an ``identity`` call run on a loop of their own that
    ``asyncio.run`` closes, in a thread joined before this returns, under one ``wait_for``:
    nothing is left running whatever comes back. A scheduler that stalls between this and
    the client's start is not covered.
    """
    args = distributed.Security().get_connection_args("client")

    async def identity() -> Any:
        comm = await distributed.comm.connect(address, timeout=timeout, **args)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    async def bounded() -> Any:
        return await asyncio.wait_for(identity(), timeout)

    try:
        # A thread of its own: asyncio.run refuses a thread whose loop runs (a notebook's).
        with ThreadPoolExecutor(1) as pool:
            info = pool.submit(asyncio.run, bounded()).result()
    except TimeoutError:
        got = "the port accepted a connection, then sent no Dask handshake"
    except distributed.comm.CommClosedError:
        got = "the port closed the connection without a Dask handshake"
    except OSError as err:
        got = _first(err)
    except Exception:  # another protocol's bytes read as Dask's framing (a MemoryError, ...)
        got = "the port answered, not in Dask's protocol"
    else:
        kind = info.get("type") if isinstance(info, dict) else type(info).__name__
        if kind == "Scheduler":
            return
        got = f"a Dask {kind} answered there, not the scheduler"
    raise BadValue(
        f"no Dask scheduler answered at {address!r} within {timeout:g} s ({got})",
        param="cluster",
    )


def connect(address: str, *, timeout: float = CONNECT_TIMEOUT) -> Cluster:
    """Connects to the Dask scheduler at ``address`` and checks its workers' versions.

    Args:
      address: ``tcp://host:port`` (or ``host:port``) of a running ``dask scheduler``.
      timeout: seconds to wait for the scheduler and for at least one worker.

    Returns:
      A :class:`Cluster`.

    Raises:
      BadValue: ``distributed`` is not installed; no Dask scheduler answers at ``address``
        within ``timeout`` (nothing listens, or what does is no scheduler); the scheduler
        has no worker within ``timeout``; a worker runs other versions than this process.
    """
    try:
        import distributed
    except ImportError:
        raise missing_extra() from None
    _probe(address, timeout)
    _greet(distributed, address, timeout)
    try:
        client = distributed.Client(address, timeout=timeout, set_as_default=False)
    except (ValueError, TypeError) as err:
        raise BadValue(
            f"{address!r} is not a Dask scheduler's address (tcp://HOST:PORT): {_first(err)}",
            param="cluster",
        ) from None
    except (OSError, TimeoutError) as err:
        raise BadValue(
            f"no Dask scheduler answered at {address!r} within {timeout:g} s ({_first(err)})",
            param="cluster",
        ) from None
    except Exception as err:  # the client's own start failed: still one line, not a trace
        raise BadValue(
            f"could not open a Dask client to {address!r}: {type(err).__name__}: {_first(err)}",
            param="cluster",
        ) from err
    try:
        try:
            client.wait_for_workers(1, timeout=timeout)
        except TimeoutError:
            raise BadValue(
                f"the Dask scheduler at {address!r} has no worker after {timeout:g} s: start "
                "some with 'JAX_PLATFORMS=cpu dask worker ADDRESS'",
                param="cluster",
            ) from None
        seen = client.run(versions)
        wrong = version_mismatch(versions(), seen)
        if wrong is not None:
            raise wrong
    except BaseException:
        client.close()
        raise
    return Cluster(
        address=address,
        client=client,
        executor=client.get_executor(retries=RETRIES, pure=False),
        workers=len(seen),
        versions=seen,
    )
