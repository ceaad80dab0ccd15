"""Independent compiles side by side: one seam, a ``concurrent.futures.Executor``.

The programs of a search that do not depend on each other (the policies of ``compare``, the
targets of ``advise`` and its ``--scale-out`` counts) go through :func:`run`. By default it
runs them here until one compiles, then in a local pool of spawned processes (``--jobs``).
Given an executor, it sends them there: :func:`connect` makes one of a Dask cluster
(``--cluster ADDRESS``, the ``cluster`` extra), after checking its workers run the same
versions as this process.

- ``_local``: :func:`run`, the local pool and the executor path;
- ``_tasks``: what a worker runs for one item (standard library only until it runs it);
- ``_cluster``: the Dask client, its version check and its errors.

Example:
  >>> run(abs, [-1, -2], jobs=1)
  [1, 2]
"""

from remat_kit._workers._cluster import (
    EXTRA,
    Cluster,
    ClusterError,
    connect,
    missing_extra,
    require_engine,
    version_mismatch,
)
from remat_kit._workers._local import default_jobs, remote_stats, run

__all__ = [
    "EXTRA",
    "Cluster",
    "ClusterError",
    "connect",
    "default_jobs",
    "missing_extra",
    "remote_stats",
    "require_engine",
    "run",
    "version_mismatch",
]
