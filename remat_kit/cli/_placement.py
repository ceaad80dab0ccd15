"""Where a command's independent compiles run: ``--jobs N`` (local worker processes) and
``--cluster ADDRESS`` (the workers of a Dask scheduler), and the executor the flag opens.

Like :mod:`remat_kit.cli._args`, importing this module starts no jax and no Dask: the engine
is imported when ``--cluster`` is given.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from concurrent.futures import Executor

from remat_kit.cli._args import group, positive_int

__all__ = [
    "add_cluster_arg",
    "add_jobs_arg",
    "check_cluster",
    "cluster_executor",
]


def add_jobs_arg(p: argparse.ArgumentParser, what: str = "") -> None:
    """Adds ``--jobs N``: independent compiles in up to N worker processes; and
    ``--cluster ADDRESS``: on the workers of a Dask scheduler instead.

    Args:
      p: an argparse parser (or subparser).
      what: which programs the command compiles side by side, if not all it compiles
        (words for the help).

    Example:
      >>> from remat_kit.cli._parser import Parser
      >>> p = Parser(); add_jobs_arg(p)
      >>> p.parse_args(["--jobs", "2"]).jobs
      2
    """
    from remat_kit._workers import default_jobs

    group(p, "compile").add_argument(
        "--jobs",
        type=positive_int,
        default=default_jobs(),
        help=f"compile independent programs{what} in up to N worker processes (default: "
        f"{default_jobs()}, min(2, cores); 1: all in this process)",
    )
    add_cluster_arg(p, what)


def add_cluster_arg(p: argparse.ArgumentParser, what: str = "") -> None:
    """Adds ``--cluster ADDRESS``: independent compiles on the workers of a Dask scheduler.

    Args:
      p: an argparse parser (or subparser).
      what: when the command hands compiles to it, if not always (words for the help).

    Example:
      >>> from remat_kit.cli._parser import Parser
      >>> p = Parser(); add_cluster_arg(p)
      >>> p.parse_args(["--cluster", "tcp://10.0.0.1:8786"]).cluster
      'tcp://10.0.0.1:8786'
    """
    group(p, "compile").add_argument(
        "--cluster",
        metavar="ADDRESS",
        default=None,
        help=f"compile independent programs{what} on the workers of the Dask scheduler at "
        "ADDRESS (tcp://host:8786; start workers with JAX_PLATFORMS=cpu dask worker ADDRESS; "
        "needs pip install 'remat-kit[cluster]'); results land in this machine's cache",
    )


def check_cluster(args: argparse.Namespace) -> None:
    """``--cluster`` needs Dask distributed: checked first, before the model is read.

    Raises:
      BadValue: ``--cluster`` given and ``distributed`` not installed (naming the extra).

    Example:
      >>> check_cluster(argparse.Namespace(cluster=None))
    """
    if getattr(args, "cluster", None) is not None:
        from remat_kit._workers import require_engine

        require_engine()


@contextlib.contextmanager
def cluster_executor(args: argparse.Namespace) -> Iterator[Executor | None]:
    """The executor of ``--cluster`` (connected, its workers' versions checked), closed after
    the block; None without the flag.

    Raises:
      BadValue: no ``distributed``, no scheduler or worker at the address, other versions.

    Example:
      >>> with cluster_executor(argparse.Namespace(cluster=None)) as ex:
      ...     ex is None
      True
    """
    address = getattr(args, "cluster", None)
    if address is None:
        yield None
        return
    from remat_kit._workers import connect, require_engine

    require_engine()

    cluster = connect(address)
    try:
        yield cluster.executor
    finally:
        cluster.close()
