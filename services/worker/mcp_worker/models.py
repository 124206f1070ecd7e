"""The replicas one worker holds: load, unload, pause, resume, emergency stop, and the request path.

Invariants:
- Every state change of a replica is written to etcd through ``ReplicaLifecycle`` (compare-and-swap), in
  the order of DESIGN.md section 5. What a state means on this worker is done by the lifecycle's hooks,
  which the worker registers (``server.py``) and which run before the write: ``warm_up`` on READY,
  ``admit`` on RUNNING (the worker's side of joining the routing ring: only a RUNNING replica takes
  requests), ``withhold`` on leaving RUNNING, ``release`` (memory, backend) on IDLE. A hook that fails
  leaves the state as it was. A failed load (its warm-up included) ends in ERROR with its reason, and so
  does a model.yaml that is there but cannot be read (a remote repository unreachable or refusing, a file
  unlike its manifest); a version absent from the repository, or an invalid model.yaml, records nothing.
- Memory is reserved before anything is loaded (declared bytes), then adjusted to the measured bytes; a load
  that does not fit raises ``ResourceExhausted`` and loads nothing.
- Unload waits for the requests already admitted for that replica (the dispatcher's reference count), so
  a load and an unload can never race into "model unavailable" for an admitted request.
- The request path (``start``: one for every model, decoupled ones included) reads only local state: no
  etcd, no lock. What it refuses (stopped, not held here, not admitted) is marked not started, so a router
  may send it elsewhere.
- Every replica record carries the worker's incarnation (``set_info``): a record from an earlier process
  under the same worker id is stale, and routers do not follow it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from mcp_worker.backends import Backend, create_backend
from mcp_worker.batching import BatchConfig, Dispatcher, ModelShare
from mcp_worker.memory import MemoryBudget
from mcp_worker.replica import LoadOverrides, Replica, apply_overrides
from mcp_worker.repository import ModelArtifact, ModelRepository
from mcp_worker.streams import answers_on_loop
from mcpcore.breaker import secondary_outputs_off
from mcpcore.errors import (
    FailedPrecondition,
    InvalidArgument,
    MCPError,
    NotFound,
    Unavailable,
    not_started,
)
from mcpcore.keys import ReplicaId, check_name, check_version
from mcpcore.lifecycle import ReplicaLifecycle, ReplicaRecord, ReplicaState, Resync
from mcpcore.modelspec import ModelConfig

__all__ = ["ModelManager"]

log = logging.getLogger(__name__)
S = ReplicaState
#: Why a replica that leaves RUNNING takes no new request (the rest: "is <STATE>").
_WITHHELD = {S.PAUSED: "is paused", S.UNLOADING: "is being unloaded"}


class ModelManager:
    def __init__(
        self,
        *,
        worker_id: str,
        repository: ModelRepository,
        lifecycle: ReplicaLifecycle,
        dispatcher: Dispatcher,
        budget: MemoryBudget,
        checkpoint_dir: Path,
        info: Mapping[str, Any] | None = None,
        on_state: Callable[[ReplicaId, ReplicaState | None], None] | None = None,
        on_work: Callable[[str, int], None] | None = None,
        clock: Callable[[], float] = time.time,
        device: int = 0,
    ) -> None:
        self.worker_id = worker_id
        self.device = device  # the GPU index this worker's GPU models run on
        self._repo = repository
        self._lifecycle = lifecycle
        self._dispatcher = dispatcher
        self.budget = budget
        self._checkpoint_dir = checkpoint_dir
        self._info = dict(info or {})
        self._on_state = on_state or (lambda rid, state: None)
        self._on_work = on_work
        self._clock = clock
        self._replicas: dict[tuple[str, str], Replica] = {}
        self._held: dict[str, int] = {}  # model -> versions held (what admission may count)
        self._loading: dict[tuple[str, str], asyncio.Task[Replica]] = {}
        self._unloading: dict[tuple[str, str], asyncio.Task[Replica]] = {}
        self._admission = asyncio.Lock()  # serialises memory reservations
        self._batch_ratios: dict[str, float] = {}  # model -> max batch ratio (breaker level 1: 0.5)
        self.stopped: str | None = None  # the emergency-stop reason, once stopped

    def set_info(self, info: Mapping[str, Any]) -> None:
        """Endpoints etc. written into every replica record (known once the servers are bound)."""
        self._info = dict(info)

    # -- queries ---------------------------------------------------------------------------------------
    def replicas(self) -> list[Replica]:
        return sorted(self._replicas.values(), key=lambda r: (r.rid.model, int(r.rid.version)))

    def get(self, model: str, version: str) -> Replica:
        replica = self._replicas.get((model, version))
        if replica is None:
            raise NotFound(f"model {model} version {version} is not loaded on worker {self.worker_id}")
        return replica

    def holds(self, model: str) -> bool:
        """Whether any version of ``model`` is loaded here (O(1): the tensor server asks per request)."""
        return model in self._held

    def labels(self, model: str, version: str) -> tuple[str, str]:
        """Metric labels for a request naming ``model``/``version``: only names held here, so a client
        cannot mint label values ("_unknown" otherwise; an empty version is "_latest")."""
        if not any(m == model for m, _ in self._replicas):
            return "_unknown", "_unknown"
        if not version:
            return model, "_latest"
        return (model, version) if (model, version) in self._replicas else (model, "_unknown")

    def resolve(self, model: str, version: str) -> Replica:
        """The replica a request goes to; an empty version means the newest one serving here."""
        if version:
            return self.get(model, version)
        held = [r for (m, _), r in self._replicas.items() if m == model]
        if not held:
            raise NotFound(f"model {model} has no version loaded on worker {self.worker_id}")
        # the newest RUNNING version; else the newest held, whose queue then explains the refusal
        return max(held, key=lambda r: (r.state is S.RUNNING, int(r.rid.version)))

    # -- the request path ------------------------------------------------------------------------------
    def start(
        self,
        model: str,
        version: str,
        request_id: str,
        inputs: dict[str, np.ndarray],
        on_done: Callable[[Replica, dict[str, np.ndarray] | BaseException], None],
        *,
        partial: Callable[[str, dict[str, np.ndarray]], None],
        priority: int | None = None,
        timeout_s: float | None = None,
        features_off: tuple[str, ...] | None = None,
        parameters: Mapping[str, str] | None = None,
    ) -> Callable[[], None]:
        """Queue one request and return a callable that withdraws it (a queued request leaves the queue,
        a running stream stops answering); ``on_done(replica, outputs or error)`` is called once, on the
        loop. A refusal raises here. ``features_off`` (breaker level 2): the policy's features to drop,
        () for all of the model's secondary outputs; None keeps them. ``parameters`` go to the backend.
        A decoupled model's answers before its last go to ``partial(version, outputs)``, on the loop, in
        order, before ``on_done``."""
        replica, skip = self._prepare(model, version, inputs, features_off)
        emit, stop = None, None
        if replica.config.decoupled:
            stop = threading.Event()  # set once the request is withdrawn: its run stops answering
            emit = answers_on_loop(partial, replica.rid.version, replica.key, timeout_s, stop)
        queue = replica.queue
        req = queue.enqueue(
            request_id, inputs, functools.partial(on_done, replica), priority=priority, timeout_s=timeout_s,
            skip=skip, parameters=parameters, emit=emit,
        )  # fmt: skip
        if stop is None:
            return functools.partial(queue.withdraw, req)

        def withdraw() -> None:
            stop.set()
            queue.withdraw(req)

        return withdraw

    def _prepare(
        self,
        model: str,
        version: str,
        inputs: dict[str, np.ndarray],
        features_off: tuple[str, ...] | None,
    ) -> tuple[Replica, frozenset[str]]:
        """The replica that serves the request and the outputs it skips; refuses what cannot run here."""
        if self.stopped is not None:
            raise not_started(
                Unavailable(f"worker {self.worker_id} is stopped ({self.stopped}); retry on another worker")
            )
        try:
            replica = self.resolve(model, version)
        except NotFound as err:  # routed here from a stale table: another worker may hold it
            raise not_started(Unavailable(err.message)) from None
        replica.backend.check_inputs(inputs)
        skip: frozenset[str] = frozenset()
        if features_off is not None:
            skip = secondary_outputs_off(replica.config.qos.secondary_features, features_off)
        return replica, skip

    # -- control ---------------------------------------------------------------------------------------
    async def load(self, model: str, version: str, overrides: LoadOverrides | None = None) -> Replica:
        """Load and warm up ``model``/``version``: ... -> LOADING -> READY. Idempotent."""
        check_name(model, "model name")
        check_version(version)
        if self.stopped is not None:
            raise Unavailable(f"worker {self.worker_id} is stopped ({self.stopped}); load it elsewhere")
        key = (model, version)
        if key in self._replicas:
            return self._replicas[key]
        task = self._loading.get(key)
        if task is None:
            task = asyncio.ensure_future(self._load(ReplicaId(model, version, self.worker_id), overrides))
            self._loading[key] = task
            task.add_done_callback(lambda _t: self._loading.pop(key, None))
        return await asyncio.shield(task)

    async def _load(self, rid: ReplicaId, overrides: LoadOverrides | None) -> Replica:
        name = f"{rid.model}/{rid.version}"
        loop = asyncio.get_running_loop()
        try:
            config = apply_overrides(
                await loop.run_in_executor(None, self._repo.config, rid.model, rid.version), overrides
            )
        except MCPError as exc:
            if not isinstance(exc, (NotFound, InvalidArgument)):
                # the version is there but could not be read (a remote repository unreachable or refusing,
                # a file that does not match its manifest): ERROR with the reason, as a failed load
                try:
                    await self._fresh_record(rid)
                except MCPError as err:
                    log.warning("could not record %s as ERROR: %s", rid, err)
                else:
                    await self._load_failed(rid, exc)
            raise
        async with self._admission:
            self.budget.reserve(name, config.memory_bytes)  # nothing loaded, nothing written yet if full
        try:
            await self._fresh_record(rid)
            await self._set(rid, S.LOADING, "loading")
        except BaseException:
            self.budget.release(name)
            raise
        try:
            artifact, backend = await self._backend(rid, name, config)
        except BaseException as exc:
            self.budget.release(name)
            await self._fail(rid, f"load failed: {_describe(exc)}")
            raise
        queue = self._dispatcher.add_model(
            name,
            BatchConfig.from_model_config(config),
            backend.infer,
            ModelShare(priority=config.priority, latency_sensitivity=config.qos.latency_sensitivity),
            max_running=None if backend.concurrent else config.instance_count,
            inline=backend.inline,
        )
        queue.refuse("is not serving yet (loaded, not RUNNING)")  # before any await: ``admit`` opens it
        queue.set_batch_ratio(self._batch_ratios.get(rid.model, 1.0))  # a breaker already in force
        replica = Replica(rid, config, backend, queue, self.budget.held(name), S.LOADING, self._clock())
        self._replicas[(rid.model, rid.version)] = replica
        self._held[rid.model] = self._held.get(rid.model, 0) + 1
        try:
            await self._set(rid, S.READY, "loaded and warmed up", **replica.info)  # warm_up runs first
        except BaseException as exc:
            await self._discard(replica)
            await self._load_failed(rid, exc)
            raise
        if hasattr(backend, "fault_directory"):  # after the warm-up: it never fails by injection
            backend.fault_directory = artifact.path  # type: ignore[attr-defined]
        return replica

    async def _backend(self, rid: ReplicaId, name: str, config: ModelConfig) -> tuple[ModelArtifact, Backend]:
        """The version's artifact and its backend, made off the loop, its measured memory reserved."""
        loop = asyncio.get_running_loop()
        artifact = await loop.run_in_executor(None, self._repo.load, rid.model, rid.version)
        make = functools.partial(
            create_backend,
            artifact.config,
            artifact.weights,
            device=self.device,
            fits=functools.partial(self.budget.check, name),  # all the copies, before the second is made
        )
        backend = await loop.run_in_executor(None, make)
        try:
            if self._on_work is not None and hasattr(backend, "on_work"):
                backend.on_work = lambda macs, model=rid.model: self._on_work(model, macs)  # type: ignore[misc]
            async with self._admission:
                self.budget.reserve(name, max(config.memory_bytes, backend.memory_bytes))
        except BaseException:
            backend.close()
            raise
        return artifact, backend

    async def _load_failed(self, rid: ReplicaId, exc: BaseException) -> None:
        """Record a failed load as ERROR with its reason, best effort: etcd may be down too, and the
        caller gets the load's own error either way."""
        try:
            await self._fail(rid, f"load failed: {_describe(exc)}")
        except MCPError as err:
            log.warning("could not record %s as ERROR: %s", rid, err)

    async def unload(self, model: str, version: str) -> Replica:
        """Unload; a second call while the first is under way waits for it (idempotent)."""
        key = (model, version)
        task = self._unloading.get(key)
        if task is None:
            task = asyncio.ensure_future(self._unload(self.get(model, version)))
            self._unloading[key] = task
            task.add_done_callback(lambda _t: self._unloading.pop(key, None))
        return await asyncio.shield(task)

    async def _unload(self, replica: Replica) -> Replica:
        await self._set(replica.rid, S.UNLOADING, "unloading: waiting for admitted requests")
        record = await self._set(replica.rid, S.IDLE, "unloaded; memory released")  # after ``release``
        replica.state, replica.since, replica.reason, replica.record = (
            S.IDLE,
            record.since,
            record.reason,
            record,
        )
        return replica

    async def pause(self, model: str, version: str) -> Replica:
        replica = self.get(model, version)
        if replica.state is S.PAUSED:
            return replica  # idempotent, so a control call can be retried safely
        await self._set(replica.rid, S.PAUSED, "paused: draining, no new requests")
        return replica

    async def resume(self, model: str, version: str) -> Replica:
        replica = self.get(model, version)
        if replica.state is S.RUNNING:
            return replica
        await self._set(replica.rid, S.RUNNING, "running")
        return replica

    def set_batch_ratio(self, model: str, ratio: float) -> None:
        """Scale the max batch size of every version of ``model`` held now or loaded later (1.0: as
        configured)."""
        if not 0 < ratio <= 1:
            raise InvalidArgument(f"batch ratio for model {model} must be in (0, 1], got {ratio}")
        if ratio == 1.0:
            self._batch_ratios.pop(model, None)
        else:
            self._batch_ratios[model] = ratio
        for replica in self.replicas():
            if replica.rid.model == model:
                replica.queue.set_batch_ratio(ratio)

    async def emergency_stop(self, reason: str) -> dict[str, Any]:
        """Stop admitting, answer queued requests (retryable), write a checkpoint, release memory."""
        self.stopped = reason or "emergency stop"
        rejected = self._dispatcher.emergency_stop(self.stopped)
        checkpoint = {
            "worker_id": self.worker_id,
            "reason": self.stopped,
            "at": self._clock(),
            "last_active": self._dispatcher.last_active,
            "in_flight": self._dispatcher.in_flight_ids(),
            "rejected": rejected,
            "replicas": [
                {"model": r.rid.model, "version": r.rid.version, "state": r.state.value, "since": r.since}
                for r in self.replicas()
            ],
        }
        path = self._write_checkpoint(checkpoint)
        for replica in self.replicas():
            await self._discard(replica)
            try:
                await self._fail(replica.rid, f"emergency stop: {self.stopped}")
            except MCPError as exc:  # etcd may be the reason we stop: the checkpoint has the truth
                log.warning("could not record %s as ERROR: %s", replica.rid, exc)
        return {**checkpoint, "path": str(path)}

    async def resync_ops(self) -> list[Resync]:
        """The writes that make the records say what this process holds (at every registration): each held
        replica's real state, and ERROR for a record under this worker id that it does not hold (left by
        an earlier process under the same id, or from before etcd lost the worker). The registration
        commits them in one transaction with the worker's record."""
        writes = [
            await self._lifecycle.resync_op(
                replica.rid,
                replica.state,
                reason=replica.reason or "worker re-registered",
                info={**replica.info, **self._info},  # whole: the record may be gone (forgotten meanwhile)
            )
            for replica in self.replicas()
        ]
        incarnation = self._info.get("incarnation")
        for rid, record in await self._lifecycle.records_of(self.worker_id):
            key = (rid.model, rid.version)
            held = key in self._replicas or key in self._loading or key in self._unloading
            if held or record.state in (S.ERROR, S.IDLE):
                continue
            reason = f"stale: worker {self.worker_id} (incarnation {incarnation}) does not hold it"
            writes.append(await self._lifecycle.resync_op(rid, S.ERROR, reason=reason, info=self._info))
        return writes

    def resynced(self, writes: list[Resync], revision: int) -> None:
        """The ``resync_ops`` writes were committed at ``revision``."""
        for write in writes:
            replica = self._replicas.get((write.rid.model, write.rid.version))
            if replica is not None:
                replica.record = replace(write.record, revision=revision)

    async def close(self) -> None:
        for replica in self.replicas():
            await self._discard(replica)

    # -- lifecycle hooks (``ReplicaLifecycle.on_enter``/``on_exit``; the worker registers them) --------
    async def warm_up(self, rid: ReplicaId, src: ReplicaState, dst: ReplicaState) -> None:
        """On READY: one run of the loaded backend, so its first request is not slow. A failure keeps the
        replica out of READY (the load then ends in ERROR)."""
        replica = self._replicas.get((rid.model, rid.version))
        if replica is not None:
            await asyncio.get_running_loop().run_in_executor(None, replica.backend.warmup)

    async def admit(self, rid: ReplicaId, src: ReplicaState, dst: ReplicaState) -> None:
        """On RUNNING: the replica takes requests (the worker's side of joining the routing ring)."""
        replica = self._replicas.get((rid.model, rid.version))
        if replica is not None:
            replica.queue.admit()

    async def withhold(self, rid: ReplicaId, src: ReplicaState, dst: ReplicaState) -> None:
        """On leaving RUNNING: the replica takes no new request, not started; queued ones still run."""
        replica = self._replicas.get((rid.model, rid.version))
        if replica is not None:
            replica.queue.refuse(_WITHHELD.get(dst, f"is {dst.value}"))

    async def release(self, rid: ReplicaId, src: ReplicaState, dst: ReplicaState) -> None:
        """On IDLE: wait for the replica's admitted requests, then free its backend and its memory."""
        replica = self._replicas.get((rid.model, rid.version))
        if replica is not None:
            await self._discard(replica)

    # -- helpers ---------------------------------------------------------------------------------------
    async def _fresh_record(self, rid: ReplicaId) -> None:
        """Bring the record to IDLE: create it, or recover a stale one this worker does not hold."""
        record = await self._lifecycle.get(rid)
        if record is None:
            await self._lifecycle.create(rid, reason="placed on this worker", info=self._info)
            return
        if record.state not in (S.IDLE, S.ERROR, S.RECOVERING):
            await self._lifecycle.transition(rid, S.ERROR, reason="stale: the worker does not hold it")
            record = replace(record, state=S.ERROR)
        if record.state is S.ERROR:
            await self._lifecycle.transition(rid, S.RECOVERING, reason="reloading")
            record = replace(record, state=S.RECOVERING)
        if record.state is S.RECOVERING:
            await self._lifecycle.transition(rid, S.IDLE, reason="recovered")

    async def _set(self, rid: ReplicaId, state: ReplicaState, reason: str, **info: Any) -> ReplicaRecord:
        record = await self._lifecycle.transition(rid, state, reason=reason, info={**self._info, **info})
        replica = self._replicas.get((rid.model, rid.version))
        if replica is not None:
            replica.state, replica.since, replica.reason, replica.record = state, record.since, reason, record
        self._on_state(rid, state)
        return record

    async def _fail(self, rid: ReplicaId, reason: str) -> None:
        with contextlib.suppress(FailedPrecondition):  # already ERROR
            await self._lifecycle.transition(rid, S.ERROR, reason=reason)
        self._on_state(rid, S.ERROR)

    async def _discard(self, replica: Replica) -> None:
        """Stop admitting, wait for admitted requests, release the backend and the memory."""
        await self._dispatcher.remove_model(replica.key)
        if self._replicas.pop((replica.rid.model, replica.rid.version), None) is not None:
            left = self._held.get(replica.rid.model, 1) - 1
            if left:
                self._held[replica.rid.model] = left
            else:
                self._held.pop(replica.rid.model, None)
        await asyncio.get_running_loop().run_in_executor(None, replica.backend.close)
        self.budget.release(replica.key)

    def _write_checkpoint(self, data: dict[str, Any]) -> Path:
        self._checkpoint_dir.mkdir(parents=True, exist_ok=True)
        path = self._checkpoint_dir / f"{self.worker_id}-{int(data['at'] * 1000)}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, path)
        return path


def _describe(exc: BaseException) -> str:
    return exc.message if isinstance(exc, MCPError) else f"{type(exc).__name__}: {exc}"
