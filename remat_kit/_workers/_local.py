"""Independent compiles in worker processes (``--jobs N`` of ``compare`` and ``advise``), or
on any ``concurrent.futures.Executor`` handed in (a Dask cluster's, ``--cluster``).

XLA compiles for a GPU target hold the GIL-free C++ compiler for seconds each, but one process
compiles one program at a time: programs that do not depend on each other (the policies of a
comparison, the targets of an advice) can be compiled side by side in separate processes.

Workers are started with ``spawn``, never ``fork``: a forked copy of a process whose jax runtime
is up (threads, the XLA client) is not safe. A spawned worker imports jax afresh, so it must
find ``JAX_PLATFORMS=cpu`` in its environment before its first ``import jax``: :func:`run`
sets it in this process's environment, which the workers inherit (jax here has read its own
setting already, so it changes nothing for this process). Each worker also gets this process's
cache switch (:func:`remat_kit.cache.set_enabled`).

Example:
  >>> from remat_kit import _workers
  >>> _workers.run(abs, [-1, -2], jobs=1)
  [1, 2]
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from remat_kit._workers._tasks import Done, call, factory_files, payload
from remat_kit.errors import BadType

__all__ = ["default_jobs", "remote_stats", "run"]

# What each item sent to an executor reported (the experiments read it; see remote_stats).
_REMOTE: list[Done] = []

T = TypeVar("T")
R = TypeVar("R")


def default_jobs() -> int:
    """Worker processes used when the user names none: ``min(2, os.cpu_count())``.

    Example:
      >>> default_jobs() >= 1
      True
    """
    return max(1, min(2, os.cpu_count() or 1))


def remote_stats() -> list[Done]:
    """Every item this process sent to an executor so far (its time, compiles, memory),
    without the results; for measuring a cluster (``experiments/cluster_speed.py``)."""
    return [dataclasses.replace(d, result=None, entries=()) for d in _REMOTE]


def run[T, R](
    fn: Callable[[T], R],
    items: Iterable[T],
    jobs: int,
    *,
    on_done: Callable[[int, R], None] | None = None,
    executor: Executor | None = None,
    here: Callable[[T], R] | None = None,
    at_once: bool = False,
) -> list[R]:
    """``[fn(x) for x in items]``, the costly ones in up to ``jobs`` spawned worker processes.

    Starting a worker costs seconds (a fresh Python imports jax, flax and the model), more than
    a cached item costs here. So items run here, in order, until one compiles a program (the
    on-disk cache did not have it: :func:`remat_kit.cache.compiles` grew); the items left then
    go to a pool of ``min(jobs, left)`` workers. A run whose programs are all cached starts
    no worker. With ``jobs == 1`` everything runs here.

    With an ``executor`` (a Dask cluster's, :func:`remat_kit._workers.connect`), the items
    left after the first compile go to it instead, whatever ``jobs`` is, each as
    :func:`remat_kit._workers.call`: the factory files the request names travel with
    it, and the cache entries the worker wrote come back and are stored here, so a rerun is
    warm on this machine. An item that raises there (or whose worker died too often) does not
    stop the others; once all are done, they are named in one :class:`ClusterError`.

    With ``at_once``, the items after the first go out (to the pool or the ``executor``) as
    soon as the first starts here, so two slow compiles run side by side; where the first
    turns out cached (nothing compiled), the ones sent out are cancelled (a local pool's
    workers stopped) and run here: their programs are likely cached too, and a worker
    costs seconds to start.

    ``fn`` and the items must pickle (``fn`` a module-level function or a
    ``functools.partial`` of one); an exception in a local worker is raised here.

    Args:
      fn: the work for one item.
      items: the items.
      jobs: worker processes at most.
      on_done: called as ``on_done(index, result)`` when an item finishes (progress bars).
      executor: where the items that compile run (None: a local pool of ``jobs``).
      here: what runs an item in this process (default ``fn``): e.g. through the caller's
        live objects, where ``fn`` rebuilds them in a worker.
      at_once: send the items after the first out while the first runs here (see above).

    Returns:
      The results, in the order of ``items``.

    Raises:
      TypeError: ``jobs`` is not a positive int.
      ClusterError: items that failed on the ``executor``, or that a local worker which
        died left unfinished (the others' results are cached).

    Example:
      >>> run(abs, [-3, 4], jobs=1)
      [3, 4]
    """
    from remat_kit import cache

    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise BadType(f"jobs must be a positive int, got {jobs!r}", param="jobs")
    items = list(items)
    local = fn if here is None else here
    results: list[Any] = [None] * len(items)
    if at_once and len(items) >= 2 and (executor is not None or jobs > 1):
        return _at_once(fn, local, items, jobs, executor, results, on_done)
    i = 0
    while i < len(items):
        before = cache.compiles()
        results[i] = local(items[i])
        if on_done is not None:
            on_done(i, results[i])
        i += 1
        spread = executor is not None or (jobs > 1 and len(items) - i >= 2)
        if spread and cache.compiles() > before:
            break
    if i == len(items):
        return results
    if executor is not None:
        _collect_remote(_submit_remote(executor, fn, items, i), items, results, on_done)
        return results
    pool = _pool(min(jobs, len(items) - i))
    try:
        futures = _submit(pool, fn, items, i)
        _collect_local(futures, items, results, on_done)
    except BaseException:
        # Ctrl-C (or an error): the workers are mid-compile and would finish first; stop them.
        _stop(pool)
        raise
    pool.shutdown(wait=True)
    return results


def _at_once(
    fn: Callable[[Any], Any],
    local: Callable[[Any], Any],
    items: list[Any],
    jobs: int,
    executor: Executor | None,
    results: list[Any],
    on_done: Callable[[int, Any], None] | None,
) -> list[Any]:
    """:func:`run` with ``at_once``: items ``1:`` sent out before item 0 runs here."""
    from remat_kit import cache

    pool = None if executor is not None else _pool(min(jobs - 1, len(items) - 1) or 1)
    futures: dict[Future[Any], int] = {}
    try:
        if pool is not None:
            futures = _submit(pool, fn, items, 1)
        else:
            futures = _submit_remote(executor, fn, items, 1)
        before = cache.compiles()
        results[0] = local(items[0])
        if on_done is not None:
            on_done(0, results[0])
        if cache.compiles() == before:
            # Item 0 was cached: so, likely, are the rest; a worker would only be slower.
            for fut in futures:
                fut.cancel()
            if pool is not None:
                _stop(pool)
            for j in range(1, len(items)):
                results[j] = local(items[j])
                if on_done is not None:
                    on_done(j, results[j])
            return results
        if pool is not None:
            _collect_local(futures, items, results, on_done)
        else:
            _collect_remote(futures, items, results, on_done)
    except BaseException:
        if pool is not None:
            _stop(pool)
        else:
            for fut in futures:
                fut.cancel()
        raise
    if pool is not None:
        pool.shutdown(wait=True)
    return results


def _submit(
    pool: ProcessPoolExecutor, fn: Callable[[Any], Any], items: list[Any], start: int
) -> dict[Future[Any], int]:
    """Items ``start:`` submitted to the local ``pool``, each future mapped to its index.

    The pool starts its workers here, with Ctrl-C (SIGINT) blocked: a worker inherits the
    mask (through the exec of ``spawn`` too) and keeps it, so a terminal's Ctrl-C, which
    reaches the whole process group, reaches this process alone, which stops the workers;
    in a worker it would print a ``KeyboardInterrupt`` traceback into this run's stderr.

    A stopping signal that comes meanwhile is acted on once every worker has started
    (:func:`_held`): one acted on as a worker starts (``spawn`` has started the new
    interpreter but not yet written it what to run) would leave that worker reading a cut
    pipe, and printing ``EOFError: Ran out of input`` with a traceback into this run's
    stderr, or running unseen by the pool that should stop it. This process's kernel
    directory is off the disk meanwhile (:func:`remat_kit.targets.kernel_dir_stowed`): were
    it killed outright as its only worker starts, no process would be left to remove it.
    """
    from remat_kit.targets import kernel_dir_stowed

    mask = getattr(signal, "pthread_sigmask", None)
    with _held(), kernel_dir_stowed():
        old = mask(signal.SIG_BLOCK, {signal.SIGINT}) if mask is not None else None
        try:
            return {pool.submit(fn, items[j]): j for j in range(start, len(items))}
        finally:
            if mask is not None and old is not None:
                mask(signal.SIG_SETMASK, old)


#: The signals that stop a run (the CLI's: ``remat_kit.cli._interrupt``), where this platform
#: has them.
_STOPPING = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


@contextlib.contextmanager
def _held() -> Iterator[None]:
    """Inside, the Python handlers of the stopping signals wait; each signal that came is
    sent again, to its own handler, on the way out.

    The signal mask cannot do this: the kernel gives a process's signal to any thread that
    does not block it (jax's, the pool's), and Python then runs the handler in the main thread
    at its next bytecode all the same. Outside the main thread (where no handler runs)
    nothing is held.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []

    def hold(signum: int, frame: object) -> None:
        came.append(signum)

    saved = {s: h for s in _STOPPING if callable(h := signal.getsignal(s))}
    for s in saved:
        signal.signal(s, hold)
    try:
        yield
    finally:
        # signal.signal runs the handlers of signals already come: a restored one may raise
        # (a signal between the hold's last bytecode and here). Every handler is restored
        # first; that signal, having been acted on, is not sent again.
        cut: BaseException | None = None
        for s, h in saved.items():
            try:
                signal.signal(s, h)
            except BaseException as err:  # raised again below
                cut = cut or err
        if cut is not None:
            raise cut
        for s in dict.fromkeys(came):
            signal.raise_signal(s)


def _pool(workers: int) -> ProcessPoolExecutor:
    """A local pool of ``workers`` spawned processes with this process's cache switch."""
    from remat_kit import cache

    # Inherited by the spawned workers, read by their jax at import.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start_worker,
        initargs=(cache._switch._override, os.getpid()),
    )


def _collect_local(
    futures: dict[Future[Any], int],
    items: list[Any],
    results: list[Any],
    on_done: Callable[[int, Any], None] | None,
) -> None:
    """The local pool's results as they come. A worker that dies (the kernel's OOM killer
    ends a compile that outgrew the host's memory) breaks the pool: the items done are kept
    (and cached), the others are named in one :class:`ClusterError`."""
    from remat_kit._workers._cluster import ClusterError

    try:
        for fut in as_completed(futures):
            j = futures[fut]
            results[j] = fut.result()
            if on_done is not None:
                on_done(j, results[j])
    except BrokenProcessPool:
        lost = [_item_words(items[j]) for f, j in futures.items() if not f.done() or _broke(f)]
        raise ClusterError(
            f"a worker process died (out of host memory?) with {len(lost)} of {len(items)} "
            f"items unfinished: {', '.join(lost)}; the others' compiles are cached; run "
            "fewer side by side, or on a machine with more memory",
            tuple((what, "worker process died") for what in lost),
        ) from None


def _broke(fut: Future[Any]) -> bool:
    return not fut.cancelled() and isinstance(fut.exception(), BrokenProcessPool)


def _submit_remote(
    executor: Executor, fn: Callable[[Any], Any], items: list[Any], start: int
) -> dict[Future[Any], int]:
    """Items ``start:`` submitted to ``executor`` (as :func:`call`, with the factory files
    the request names), each future mapped to its item's index."""
    from remat_kit import cache

    files = factory_files(fn)
    flag = cache._switch._override if cache.enabled() else False
    futures = {
        executor.submit(call, payload(fn, items[j]), files, flag): j
        for j in range(start, len(items))
    }
    return futures


def _collect_remote(
    futures: dict[Future[Any], int],
    items: list[Any],
    results: list[Any],
    on_done: Callable[[int, Any], None] | None,
) -> None:
    """The remote items' results, their cache entries stored here (see :func:`run`)."""
    from remat_kit import cache
    from remat_kit._workers._cluster import ClusterError

    failed: list[tuple[str, str]] = []
    try:
        for fut in as_completed(futures):
            j = futures[fut]
            try:
                done = fut.result()
            except Exception as err:  # the item's own error, or the cluster's KilledWorker
                first = (str(err).strip().splitlines() or [""])[0]
                failed.append((_item_words(items[j]), f"{type(err).__name__}: {first}"))
                continue
            if cache.enabled():
                for key, record in done.entries:
                    cache.store(key, record)
            _REMOTE.append(done)
            results[j] = done.result
            if on_done is not None:
                on_done(j, results[j])
    except BaseException:
        for fut in futures:  # Ctrl-C: what has not started does not start
            fut.cancel()
        raise
    if failed:
        raise ClusterError(
            f"{len(failed)} of {len(items)} items failed on the cluster (the others' compiles "
            "are cached): " + "; ".join(f"{what}: {why}" for what, why in failed),
            tuple(failed),
        )


def _item_words(item: Any) -> str:
    """An item as the error names it: a target by its name, a (policy, schedule) as is."""
    name = getattr(item, "name", None)
    if isinstance(name, str):
        return name
    if isinstance(item, tuple):
        return " @ ".join(map(str, item))
    return str(item)


def _stop(pool: ProcessPoolExecutor) -> None:
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in processes:
        p.terminate()
    for p in processes:
        p.join(timeout=1)
        if p.is_alive():  # SIGTERM not acted on yet (a worker still starting up): SIGKILL
            p.kill()
            p.join(timeout=1)
    from remat_kit.targets import remove_kernel_dirs

    remove_kernel_dirs()  # a worker ended by a signal leaves its kernel directory


def _start_worker(cache_flag: bool | None, parent: int) -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    warnings.simplefilter("ignore")  # the parent prints what matters, once
    threading.Thread(
        # The parent's id as it sent it: one read here could already be the new parent's.
        target=_watch_parent,
        args=(parent,),
        name="remat-kit-parent",
        daemon=True,
    ).start()
    from remat_kit import cache

    cache.set_enabled(cache_flag)


#: Seconds between a worker's looks at its parent.
PARENT_POLL = 0.5


def _watch_parent(parent: int) -> None:
    """Ends this worker once its parent is gone. A parent killed outright (SIGKILL, the OOM
    killer) stops no pool: its workers, mid-compile, would finish their compiles (minutes,
    gigabytes) for no one, and a resource tracker with them. The kernel gives an orphan a
    new parent, so a changed parent id is the sign; polled, as Linux's parent-death signal
    follows the parent's thread rather than its process."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL)
    from remat_kit.targets import end_process

    end_process(1)  # with the parent's kernel directory, which it could not remove, and ours
