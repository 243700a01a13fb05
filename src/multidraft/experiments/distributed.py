"""Evaluation sharded over a Ray cluster: a mapper for :func:`.acceptance.cell_acceptance`.

A cell (dataset, temperatures, law, K, verifier) is cut into fixed position shards
(:func:`.acceptance.shards`); each shard is one :func:`.acceptance.shard_acceptance` task
with its own generator seeded by (seed, cell key, shard index). :func:`ray_mapper` submits
those tasks as Ray remote tasks and returns their results in shard order, so the rows it
produces are the single-process rows (``local_map``) bit for bit: same seeds and the same
float64 arithmetic. Workers run torch (and OpenMP/BLAS) with one thread; the estimator's
values do not depend on the thread count anyway: its reductions are per position (over the
support axis of ``[draws, positions, M]`` tensors, which torch splits across threads by
output row, so each row is summed in the same order), and the only thread-dependent
reduction of torch on CPU, a full reduction of one output over more than 32,768 elements,
cannot occur: a stored support has at most 16,385 columns. ``tests/test_distributed.py``
checks 1 vs 2 threads, and the Ray rows against the single-process rows.

* The P/Q rows of each shard are put in the object store once and shared by every verifier
  of the same (law, K) (they are re-put only when the tensors change), and at most
  ``max_in_flight`` tasks are submitted at a time, which bounds the memory held by results
  and arguments in flight.
* Ray is an optional extra (``pip install 'multidraft[ray]'``), imported only when a Ray
  mapper is made; without it :func:`ray_mapper` raises one line naming the extra.
* ``address``: ``"auto"`` connects to a running cluster (``RAY_ADDRESS``, or the latest one
  started on this machine) or else starts a local one; any other value is a cluster
  address (``HOST:PORT`` or ``ray://HOST:PORT``). Ray is connected on the first cell, and
  shut down on ``close()`` / leaving the ``with`` block when this mapper connected it (a
  Ray session that was already initialised in the process is left alone).

Resumability stays at the cell level: rows are written by the driver, one per finished
cell, into the run's JSONL file (:mod:`.records`); an interrupted run reruns only the cells
whose rows are missing.
"""
from __future__ import annotations

import os
from typing import Sequence

from .. import _optional

__all__ = ["RAY_EXTRA", "ray_mapper", "RayMapper", "import_ray", "worker_env"]

RAY_EXTRA = _optional.hint("ray")


def import_ray():
    """``import ray``, or ``ImportError`` with one line naming the extra to install."""
    return _optional.require("ray", "--ray")


def worker_env() -> dict:
    """Environment of the Ray workers: one OpenMP/BLAS thread, and the driver's
    ``ATEN_CPU_CAPABILITY`` when it is set (torch's vectorised kernels can differ between CPU
    capabilities in the last bits; pin it, e.g. ``avx2``, for identical rows on a cluster of
    mixed CPUs)."""
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    if os.environ.get("ATEN_CPU_CAPABILITY"):
        env["ATEN_CPU_CAPABILITY"] = os.environ["ATEN_CPU_CAPABILITY"]
    return env


def _shard_task(P, Q, name, law, k, draws, seed, key, b):
    """Runs in a Ray worker: one shard of one cell, single-threaded."""
    import torch

    torch.set_num_threads(1)
    from .acceptance import shard_acceptance

    return shard_acceptance(name, P, Q, law, k, draws, seed, key, b)


def _tensor_key(t) -> tuple:
    # identity of the data: storage address, view geometry and the version counter (bumped
    # by any in-place write), valid while the cache below holds a reference to the tensor
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), str(t.dtype), t._version)


class RayMapper:
    """Evaluate ``shard_acceptance`` tasks on Ray; call it with a task list, get results in order.

    Use as a context manager (or call :meth:`close`) so a Ray session it started is shut
    down. ``num_cpus`` only applies when a local cluster is started; ``max_in_flight``
    defaults to twice the cluster's CPUs."""

    def __init__(self, address: str = "auto", *, num_cpus: int | None = None, max_in_flight: int | None = None):
        if not isinstance(address, str) or not address.strip():
            raise ValueError(f"address must be 'auto' or a Ray cluster address, got {address!r}")
        if max_in_flight is not None and int(max_in_flight) < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self._ray = import_ray()
        self.address = address.strip()
        self.num_cpus = num_cpus
        self.max_in_flight = int(max_in_flight) if max_in_flight is not None else None
        self._started = False   # this mapper called ray.init (so it shuts Ray down)
        self._remote = None
        self._cache: dict[tuple, tuple] = {}  # tensor key -> (tensor, object ref), last cell only

    # -- connection ---------------------------------------------------------------------------
    def _connect(self):
        ray = self._ray
        if not ray.is_initialized():
            kw = dict(include_dashboard=False, logging_level="WARNING", runtime_env={"env_vars": worker_env()})
            if self.num_cpus is not None:
                kw["num_cpus"] = int(self.num_cpus)
            # address None: RAY_ADDRESS, else the latest cluster on this machine, else a new local one
            ray.init(address=None if self.address == "auto" else self.address, **kw)
            self._started = True
        if self._remote is None:
            self._remote = ray.remote(num_cpus=1)(_shard_task)
        if self.max_in_flight is None:
            self.max_in_flight = max(1, 2 * int(ray.cluster_resources().get("CPU", 1)))

    def close(self) -> None:
        self._cache = {}
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()
        self._started = False
        self._remote = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- mapping ------------------------------------------------------------------------------
    def _put(self, t, cache: dict):
        key = _tensor_key(t)
        hit = self._cache.get(key) or cache.get(key)
        if hit is None:
            # clone: a view would pickle its whole base storage (the full cell, once per shard)
            hit = (t, self._ray.put(t.clone()))
        cache[key] = hit
        return hit[1]

    def __call__(self, tasks: Sequence[tuple]) -> list:
        tasks = list(tasks)
        if not tasks:
            return []
        self._connect()
        ray = self._ray
        cache: dict[tuple, tuple] = {}
        out: list = [None] * len(tasks)
        pending: dict = {}
        nxt = 0
        while nxt < len(tasks) or pending:
            while nxt < len(tasks) and len(pending) < self.max_in_flight:
                name, P, Q, law, k, draws, seed, key, b = tasks[nxt]
                ref = self._remote.remote(self._put(P, cache), self._put(Q, cache), name, law, k, draws, seed,
                                          tuple(key), b)
                pending[ref] = nxt
                nxt += 1
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                out[pending.pop(ref)] = ray.get(ref)
        self._cache = cache  # keep this cell's shards for the next verifier of the same (law, K)
        return out


def ray_mapper(address: str = "auto", *, num_cpus: int | None = None, max_in_flight: int | None = None) -> RayMapper:
    """A mapper evaluating cell shards on a Ray cluster (``"auto"`` or an address); see :class:`RayMapper`."""
    return RayMapper(address, num_cpus=num_cpus, max_in_flight=max_in_flight)
