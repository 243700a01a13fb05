"""Replicas of the batch decoder on Ray, behind the one FastAPI ingress (``multidraft serve --replicas N``).

Each replica is a Ray actor (:class:`Replica`) that loads the served pair once (its ``load``
callable, run in the actor's process) and owns one :class:`worker.Worker`: the same queue,
lanes and decoding as the one-process server. The ingress is the unchanged app of ``app``: the
:class:`Router` stands where the app's worker stands (``submit``, ``status``, ``ready``,
``drain``, ``stop``), so the endpoints, request checks, errors, streaming and metrics are the
one-process server's code. The ingress tokenizes (it holds a copy of the served model for its
tokenizer, context and settings); a replica receives the prompt's ids, the request's settings,
seed and stop sequences, and streams back the worker's events (``("delta", text, tokens)``, then
``("done", result)`` or ``("error", ...)``) through a Ray streaming generator, so tokens reach
the client as each decoding step gives them.

Why plain Ray actors behind our own router rather than Ray Serve deployments: the ingress must
stay the existing app (its 413 / 429 / 503 answers before any byte, its disconnect handling,
its metrics), and Ray Serve's own router neither exposes the in-flight count per replica nor
tells the caller that a replica died before or after the first token, which the two rules below
need. A Ray Serve deployment would add its HTTP proxy and controller actors to a 2-core machine
for nothing the router does not do. The actors run on any Ray cluster (``--ray ADDRESS``).

Routing: each request goes to the replica with the fewest requests in flight (its count is
kept by the router: submitted and not yet answered), ties broken round-robin; with every live
replica at its ``capacity`` (``queue_size + max_lanes``) the request is refused 429 with
``Retry-After`` at once, as the one-process queue refuses it.

A replica that dies (its process killed, ``ray.kill``): a request it held that had sent no text
yet is sent again to another live replica (the same ids, settings and seed: the same text, see
below); one that had sent text is answered with an error event (503 ``replica_failed``,
retryable), a whole response with HTTP 503 and ``Retry-After``; with no live replica left the
request is answered 503 the same way. No request is lost silently. The replica is marked dead
in ``/health`` and never chosen again.

Seeds: every replica decodes a request alone in its lanes with the request's seed
(``torch.Generator`` seeded per request, ``decoding.batch``), so with ``--max-lanes 1`` the same
request and seed give token for token the same text on any replica (the same as
``decoding.generate`` alone); with more lanes, as on one process, up to the engines'
floating-point differences between batch shapes.

Readiness: ``ready`` is True once every replica has built its decoder (models loaded), and
stays True while at least one replica lives and none is still starting; ``status()`` lists each
replica (``starting``, ``ready``, ``dead``; ``stopped`` after the server's shutdown) with its requests in flight and
served, its queue and lanes and its process id (``/health``).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import sys
import threading
import time
import uuid

from .protocol import APIError
from .worker import RETRY_AFTER_S, Job, deliver

__all__ = ["Replica", "Router", "connect"]

log = logging.getLogger("multidraft.serve")
_STATUS_EVERY_S = 0.5  # how often the router asks each replica for its status
_CANCEL_POLL_S = 0.25  # how often a relayed request checks that its client is still there


def connect(address: str | None = None, num_cpus: int = 2, object_store_mb: int = 256):
    """``ray.init``: a local Ray of ``num_cpus`` CPUs and an object store of ``object_store_mb``
    MiB (sized for a small machine: the replicas pass only ids and text), or the cluster at
    ``address``. A local Ray's workers get this process's ``sys.path`` (so they import the same
    ``multidraft``). Returns the ``ray`` module; nothing is done when Ray is already initialised."""
    from .. import _optional

    ray = _optional.require("ray", "multidraft serve --replicas")
    if ray.is_initialized():
        return ray
    if address:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        return ray
    path = os.pathsep.join(os.path.abspath(p) for p in sys.path if p and os.path.isdir(p))
    ray.init(num_cpus=num_cpus, object_store_memory=object_store_mb * 1024 * 1024, include_dashboard=False,
             logging_level=logging.WARNING, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    return ray


def _error(exc: APIError) -> dict:
    """An ``APIError`` as a plain dict (it crosses processes; the exception's keyword-only
    constructor does not unpickle)."""
    return {"status": exc.status, "message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code,
            "headers": exc.headers}


def _unavailable(message: str) -> APIError:
    return APIError(503, message, type="server_error", code="replica_failed",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


class Replica:
    """One replica (made a Ray actor by :class:`Router`): the pair loaded by ``load()`` (a
    picklable callable returning a ``ServedModel``) and one ``Worker`` of ``queue_size`` and
    ``max_lanes``; ``threads`` torch threads when given."""

    def __init__(self, index: int, load, queue_size: int = 64, max_lanes: int = 1, threads: int | None = None):
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        from .worker import Worker

        self.index = index
        self.model = load()
        self.worker = Worker(self.model, queue_size, max_lanes)
        self.worker.start()
        self.jobs: dict[str, Job] = {}

    async def status(self) -> dict:
        return {"ready": self.worker.ready, "pid": os.getpid(), **self.worker.status()}

    async def generate(self, rid: str, ids: list, settings, seed: int, stop: tuple):
        """The worker's events for one request (a Ray streaming generator): ``("delta", text,
        tokens)``..., then ``("done", result)`` or ``("error", dict)``."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def emit(ev):  # from the worker thread
            loop.call_soon_threadsafe(events.put_nowait, ev)

        job = Job(list(ids), settings, seed, tuple(stop), emit)
        self.jobs[rid] = job
        try:
            try:
                self.worker.submit(job)
            except APIError as exc:
                yield ("error", _error(exc))
                return
            while True:
                ev = await events.get()
                if ev[0] == "error":
                    yield ("error", _error(ev[1]))
                    return
                if ev[0] == "done":
                    ev[1]["speculative"]["replica"] = self.index
                yield ev
                if ev[0] == "done":
                    return
        finally:
            job.cancel.set()  # a no-op once done; stops the lane when the caller went away
            self.jobs.pop(rid, None)

    async def cancel(self, rid: str) -> None:
        job = self.jobs.get(rid)
        if job is not None:
            job.cancel.set()

    async def drain(self, grace_s: float) -> None:
        self.worker.drain(grace_s)

    async def stop(self, timeout: float) -> None:
        """Stop the worker (off this actor's event loop, so the running requests' last events
        still stream), then wait (at most 2 s) until those events have left."""
        await asyncio.to_thread(self.worker.stop, timeout)
        t0 = time.monotonic()
        while self.jobs and time.monotonic() - t0 < 2.0:
            await asyncio.sleep(0.02)


class _Handle:
    """The router's view of one replica: its actor, state and requests in flight."""

    def __init__(self, index: int, actor):
        self.index, self.actor = index, actor
        self.state = "starting"  # -> "ready" -> "dead" (or "starting" -> "dead"); "stopped" at shutdown
        self.in_flight = 0
        self.served = 0
        self.status: dict = {}


class Router:
    """The replicas and the least-loaded routing between them (module docstring); it has the
    ``Worker`` interface the app uses (``start``, ``submit``, ``ready``, ``draining``,
    ``status``, ``drain``, ``stop``, ``max_lanes``, ``observe``), so ``app.create_app(model,
    worker=Router(...))`` serves through it. Ray must be initialised (:func:`connect`)."""

    def __init__(self, load, replicas: int, *, queue_size: int = 64, max_lanes: int = 1, threads: int | None = None,
                 replica_cpus: float = 1):
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"replicas must be a positive integer, got {replicas!r}")
        import ray

        self._ray = ray
        actor = ray.remote(Replica)
        self.max_lanes = max_lanes
        self.capacity = queue_size + max_lanes  # requests one replica holds at most (queued and decoding)
        self.replicas = [_Handle(i, actor.options(num_cpus=replica_cpus, max_concurrency=1000).remote(
            i, load, queue_size, max_lanes, threads)) for i in range(replicas)]
        self.draining = threading.Event()
        self.observe = None  # observe(job, done): as Worker.observe (metrics), from the event loop
        self.counts = {"served": 0, "cancelled": 0, "refused": 0, "failed": 0, "retried": 0}
        self._turn = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poller: asyncio.Task | None = None
        self._tasks: set = set()

    # the Worker interface -----------------------------------------------------------------
    def start(self) -> None:
        """Start polling the replicas' status (from the app's event loop)."""
        self._loop = asyncio.get_running_loop()
        self._poller = self._loop.create_task(self._poll())

    @property
    def ready(self) -> bool:
        states = [h.state for h in self.replicas]
        return "starting" not in states and "ready" in states and not self.draining.is_set()

    def status(self) -> dict:
        per = [{"replica": h.index, "state": h.state, "in_flight": h.in_flight, "served": h.served,
                **{k: h.status[k] for k in ("queued", "lanes", "pid") if k in h.status}} for h in self.replicas]
        live = [h for h in self.replicas if h.state != "dead"]
        return {"queued": sum(h.status.get("queued", 0) for h in live),
                "running": any(h.status.get("running") for h in live),
                "lanes": sum(h.status.get("lanes", 0) for h in live), "max_lanes": self.max_lanes,
                **self.counts, "draining": self.draining.is_set(), "replicas": per}

    def submit(self, job: Job) -> None:
        """Route ``job`` to the least-loaded live replica (its events reach ``job.emit`` from a
        task of the event loop), or raise 503 (draining, no live replica) or 429 (all full)."""
        if self.draining.is_set():
            raise APIError(503, "the server is shutting down", type="server_error", code="server_shutting_down",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
        handle = self._pick()
        task = self._loop.create_task(self._relay(job, handle))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def drain(self, grace_s: float) -> None:
        if self.draining.is_set():
            return
        self.draining.set()
        for h in self.replicas:
            if h.state != "dead":
                h.actor.drain.remote(grace_s)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every replica's worker (within ``timeout`` seconds) and end the actors."""
        self.drain(0.0)
        if self._poller is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._poller.cancel)
        ray = self._ray
        refs = [h.actor.stop.remote(timeout) for h in self.replicas if h.state != "dead"]
        try:
            ray.wait(refs, num_returns=len(refs), timeout=timeout + 5)
        except Exception:  # a replica already gone
            pass
        for h in self.replicas:
            try:
                ray.kill(h.actor)
            except Exception:
                pass
            h.state = "dead" if h.state == "dead" else "stopped"

    # routing -------------------------------------------------------------------------------
    def _pick(self, avoid: _Handle | None = None) -> _Handle:
        live = [h for h in self.replicas if h.state == "ready" and h is not avoid]
        if not live:
            raise _unavailable("no replica is ready to serve the request; retry later")
        turn = next(self._turn)
        live = live[turn % len(live):] + live[: turn % len(live)]  # ties: round-robin
        best = min(live, key=lambda h: h.in_flight)
        if best.in_flight >= self.capacity:
            self.counts["refused"] += 1
            raise APIError(429, f"the server is busy: {len(live)} replicas hold {self.capacity} requests each; "
                                f"retry later", type="rate_limit_error", code="rate_limit_exceeded",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
        return best

    async def _relay(self, job: Job, handle: _Handle) -> None:
        """Run ``job`` on ``handle`` and pass its events to ``job.emit``; on the replica's death,
        send it again elsewhere while no text was sent, else answer it 503 (module docstring)."""
        rid = uuid.uuid4().hex
        sent = False
        while True:
            here = handle
            here.in_flight += 1
            watch = asyncio.get_running_loop().create_task(self._watch_cancel(job, here, rid))
            try:
                gen = handle.actor.generate.options(num_returns="streaming").remote(
                    rid, job.prompt_ids, job.settings, job.seed, job.stop)
                first = None
                async for ref in gen:
                    ev = await ref
                    if ev[0] == "delta":
                        sent = True
                        if first is None:
                            first = time.perf_counter()
                        job.emit(ev)
                    elif ev[0] == "error":
                        err = ev[1]
                        self.counts["failed" if err["status"] >= 500 else "refused"] += 1
                        job.emit(("error", APIError(err["status"], err["message"], type=err["type"],
                                                    param=err["param"], code=err["code"], headers=err["headers"])))
                        return
                    else:
                        done = ev[1]
                        done["first_token_at"] = first  # this process's clock (metrics: time to first token)
                        cancelled = job.cancel.is_set()
                        self.counts["cancelled" if cancelled else "served"] += 1
                        here.served += not cancelled
                        deliver(job, done, self.observe)
                        return
                # the stream ended without its last event: the replica is gone
                raise self._ray.exceptions.RayActorError()
            except self._ray.exceptions.RayError as exc:
                self._dead(handle, exc)
                if sent or job.cancel.is_set():
                    self.counts["failed"] += 1
                    job.emit(("error", _unavailable(f"replica {handle.index} failed while decoding this request "
                                                    f"(its text so far was sent); retry the request")))
                    return
                try:
                    handle = self._pick(avoid=here)
                except APIError as err:
                    self.counts["failed"] += 1
                    job.emit(("error", err))
                    return
                self.counts["retried"] += 1
                log.warning("request retried on replica %d (replica failed before any text)", handle.index)
            except Exception as exc:  # never lost silently
                log.exception("relaying a request failed")
                self.counts["failed"] += 1
                job.emit(("error", APIError(500, f"routing failed: {type(exc).__name__}: {exc}", type="server_error",
                                            code="internal_error")))
                return
            finally:
                here.in_flight -= 1
                watch.cancel()

    async def _watch_cancel(self, job: Job, handle: _Handle, rid: str) -> None:
        while not job.cancel.is_set():
            await asyncio.sleep(_CANCEL_POLL_S)
        try:
            handle.actor.cancel.remote(rid)
        except Exception:
            pass

    def _dead(self, handle: _Handle, exc: BaseException) -> None:
        if handle.state != "dead":
            log.error("replica %d died: %s", handle.index, " ".join(str(exc).split())[:200])
        handle.state = "dead"

    async def _poll(self) -> None:
        """Each replica's status every ``_STATUS_EVERY_S`` seconds: ``ready`` once its decoder is
        built, ``dead`` when its actor is gone."""
        ray = self._ray
        while True:
            for h in self.replicas:
                if h.state == "dead":
                    continue
                try:
                    st = await asyncio.wait_for(h.actor.status.remote(), 5.0 if h.state == "ready" else 600.0)
                except asyncio.TimeoutError:
                    continue
                except ray.exceptions.RayError as exc:
                    self._dead(h, exc)
                    continue
                h.status = st
                if st.get("ready"):
                    h.state = "ready"
            await asyncio.sleep(_STATUS_EVERY_S)
