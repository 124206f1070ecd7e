"""The model-control API as one transport-neutral object; the v1 and v2 servicers adapt protobuf to it.

Invariants:
- The API only writes desired state (spec, traffic, breaker, drain) to etcd, by compare-and-swap where a
  read-modify-write is involved; the leader's reconcile loop makes it real. Any scheduler instance,
  leader or standby, can serve the API.
- Calls that wait (LoadModel, UnloadModel, Pause/Resume) wait on the state mirror (watch-fed, no polling
  of etcd) until the published status says done, failed, or the caller's deadline is near. A LoadModel
  that fails for a model it created removes that model's spec again, so a failed load leaves nothing
  behind; one that runs out of time keeps it (the load goes on in the background, as its message says).
  A load failure that is retried elsewhere (status ``retrying``) is not a failure: the call waits on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

from mcp_scheduler.state import ClusterState
from mcp_scheduler.view import ClusterView, ReplicaInfo
from mcpcore.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    error_for_code,
)
from mcpcore.keys import Keyspace, check_name, check_version
from mcpcore.lifecycle import ReplicaState
from mcpcore.records import BreakerDoc, DrainDoc, ModelSpecDoc, ModelStatusDoc, TrafficDoc
from mcpcore.store import Compare, Delete, Put, Store

__all__ = ["ControlService", "ModelStatusView"]

DEFAULT_WAIT_S = 60.0
TRAFFIC_STATUS_WAIT_S = 5.0  # SetTraffic waits this long for the status planned from the new split
S = ReplicaState
_NO_STATUS = ModelStatusDoc(model="")  # shared by every view of a model without a status
HEADLINE_ORDER = (S.RUNNING, S.PAUSED, S.READY, S.LOADING, S.UNLOADING, S.RECOVERING, S.ERROR, S.IDLE)


@dataclass(frozen=True)
class ModelStatusView:
    model: str
    spec: ModelSpecDoc | None
    traffic: TrafficDoc | None
    routing: TrafficDoc | None
    replicas: tuple[ReplicaInfo, ...]
    status: ModelStatusDoc = _NO_STATUS  # the leader's published status (none yet: an empty one)
    breaker: BreakerDoc | None = None

    @property
    def state(self) -> ReplicaState | None:
        """The model's headline state: RUNNING if any replica runs, else the most advanced one."""
        states = {r.state for r in self.replicas}
        return next((s for s in HEADLINE_ORDER if s in states), None)


class ControlService:
    def __init__(
        self, state: ClusterState, store: Store, keys: Keyspace, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._state = state
        self._store = store
        self._keys = keys
        self._clock = clock

    # -- reading ---------------------------------------------------------------------------------------
    def status(self, model: str, version: str = "") -> ModelStatusView:
        check_name(model, "model name")
        if version:
            check_version(version)
        return self._status(self._state.view(), model, version)

    def _status(self, view: ClusterView, model: str, version: str = "") -> ModelStatusView:
        replicas = tuple(sorted(view.replicas_of(model, version or None), key=lambda r: r.key))
        spec = view.specs.get(model)
        if spec is None and not replicas:
            raise NotFound(f"model {model} is not registered; load it first")
        breaker = self._state.breaker_doc(model)  # the one in force: the last good, if a write was rejected
        return ModelStatusView(
            model,
            spec,
            view.traffic.get(model),
            view.routing.get(model),
            replicas,
            self._state.status_doc(model) or _NO_STATUS,
            breaker,
        )

    def model_names(self, prefix: str = "") -> list[str]:
        """Models with a spec or a replica record, sorted; O(models) (the state's indexes)."""
        view = self._state.view()
        names = {*view.specs, *(m for m, keys in view.by_model.items() if keys)}
        return sorted(m for m in names if m.startswith(prefix))

    async def list_models(
        self, prefix: str = "", *, chunk: int = 100
    ) -> AsyncIterator[list[ModelStatusView]]:
        """Every model's status, ``chunk`` models at a time: the caller yields the loop between chunks, so
        listing 10,000 models never holds it for long."""
        names = self.model_names(prefix)
        for i in range(0, len(names), chunk):
            view = self._state.view()  # one per chunk: the state may change between chunks
            views = []
            for m in names[i : i + chunk]:
                with contextlib.suppress(NotFound):  # gone since the names were read
                    views.append(self._status(view, m))
            yield views
            await asyncio.sleep(0)

    # -- loading ---------------------------------------------------------------------------------------
    async def load_model(self, spec: ModelSpecDoc, *, timeout_s: float | None = None) -> ModelStatusView:
        spec.to_json()  # checks it with the same rules as an operator's write
        key = self._keys.model_spec(spec.model)
        created = False

        def merge(current: ModelSpecDoc | None) -> ModelSpecDoc:
            nonlocal created
            created = current is None
            if current is None:
                return spec
            versions = tuple(sorted(set(current.versions) | set(spec.versions), key=int))
            paused = tuple(v for v in current.paused_versions if v in versions)
            return replace(spec, versions=versions, paused_versions=paused)

        revision = await self._update_spec(spec.model, merge)
        try:
            await self._wait(
                spec.model,
                lambda s: self._loaded(s, spec.versions),
                min_revision=revision,
                timeout_s=timeout_s,
                what=f"load of {spec.model}",
            )
        except DeadlineExceeded:
            raise  # the load goes on in the background (the message says so): the spec stays
        except Exception:
            if created:  # a failed load of a new model leaves nothing behind
                removed = await self._store.txn([Compare(key, revision)], [Delete(key)])
                if removed.succeeded:
                    await self._until_gone(spec.model)
            raise
        return self.status(spec.model)

    async def unload_model(
        self, model: str, version: str = "", *, timeout_s: float | None = None
    ) -> ModelStatusView:
        check_name(model, "model name")
        if version:
            check_version(version)
        before = self.status(model)
        if before.routing is not None and version and version in before.routing.versions:
            split = before.routing.to_json().decode()
            raise FailedPrecondition(
                f"version {version} of {model} receives traffic ({split}); move traffic to another version "
                "first (SetTraffic)"
            )
        spec = before.spec
        if spec is not None:
            remaining = tuple(v for v in spec.versions if v != version) if version else ()
            if remaining:
                await self._update_spec(
                    model,
                    lambda cur: replace(
                        cur or spec,
                        versions=remaining,
                        paused_versions=tuple(v for v in (cur or spec).paused_versions if v in remaining),
                    ),
                )
            else:
                await self._store.delete(self._keys.model_spec(model))
                await self._store.delete(self._keys.model_traffic(model))
        await self._wait(
            model,
            lambda s: not s.replicas,
            timeout_s=timeout_s,
            what=f"unload of {model}",
            version=version,
        )
        return before

    # -- traffic, pause, breakers, drain -------------------------------------------------------------
    async def set_traffic(self, model: str, traffic: TrafficDoc) -> tuple[TrafficDoc, str]:
        raw = traffic.to_json()  # checks it with the same rules as an operator's etcdctl put
        if self._state.spec(model) is None:
            raise NotFound(f"model {model} is not registered; load it before setting its traffic")
        revision = await self._store.put(self._keys.model_traffic(model), raw)
        deadline = time.monotonic() + TRAFFIC_STATUS_WAIT_S  # until the leader's status plans from it
        while _traffic_revision(self._state.status_doc(model)) < revision:
            left = deadline - time.monotonic()
            if left <= 0:
                break  # no leader answering: the split is written; say what the last status said
            await self._state.wait_change(left)
        # The status is read from what arrived; the indexes (this traffic among them) are applied in
        # batches after it: wait for them, so a read right after this answer sees the split.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await self._state.idle.wait()
        return traffic, self.status(model).status.pending

    async def set_paused(
        self, model: str, version: str, paused: bool, *, timeout_s: float | None = None
    ) -> ModelStatusView:
        """Pause (or resume) one version, or with an empty ``version`` every version the spec declares (the
        contract of PauseModelRequest and ResumeModelRequest); returns once their replicas are there."""
        check_name(model, "model name")
        if version:
            check_version(version)

        def change(cur: ModelSpecDoc | None) -> ModelSpecDoc:
            if cur is None:
                raise NotFound(f"model {model} is not registered")
            if version and version not in cur.versions:
                raise NotFound(
                    f"version {version} of {model} is not loaded; loaded: {', '.join(cur.versions)}"
                )
            chosen = (version,) if version else cur.versions
            rest = tuple(v for v in cur.paused_versions if v not in chosen)
            return replace(cur, paused_versions=(*rest, *chosen) if paused else rest)

        revision = await self._update_spec(model, change)
        want = ReplicaState.PAUSED if paused else ReplicaState.RUNNING
        await self._wait(
            model,
            lambda s: bool(s.replicas) and all(r.state is want for r in s.replicas),
            min_revision=revision,
            timeout_s=timeout_s,
            what=f"{'pause' if paused else 'resume'} of {model}{'/' + version if version else ''}",
            version=version,
        )
        return self.status(model, version)

    async def set_breaker(self, model: str, doc: BreakerDoc, *, clear: bool = False) -> BreakerDoc | None:
        check_name(model, "model name")
        key = self._keys.breaker(model)
        if clear:
            await self._store.delete(key)
            return None
        doc = replace(doc, since=doc.since or self._clock())
        await self._store.put(key, doc.to_json())
        return doc

    def breaker(self, model: str) -> BreakerDoc:
        key = self._keys.breaker(model)
        raw = self._state.raw(key)
        return BreakerDoc() if raw is None else BreakerDoc.parse(key, raw)

    async def drain(self, worker: str, reason: str) -> list[ReplicaInfo]:
        check_name(worker, "worker id")
        view = self._state.view()
        if worker not in view.workers:
            raise NotFound(f"worker {worker} is not registered")
        doc = DrainDoc(reason=reason or "drained by an operator", at=self._clock())
        await self._store.put(self._keys.drain(worker), doc.to_json())
        return sorted(view.replicas_on(worker), key=lambda r: r.key)

    async def undrain(self, worker: str) -> str:
        """End a drain; returns its recorded reason. ``NotFound`` when the worker is not drained."""
        check_name(worker, "worker id")
        key = self._keys.drain(worker)
        kv = await self._store.get(key)
        if kv is None:
            raise NotFound(f"worker {worker} is not drained")
        result = await self._store.txn([Compare(key, kv.mod_revision)], [Delete(key)])
        if not result.succeeded:
            raise FailedPrecondition(f"the drain of {worker} changed meanwhile; retry")
        try:
            return DrainDoc.parse(key, kv.value).reason
        except InvalidArgument:
            return ""

    # -- helpers ---------------------------------------------------------------------------------------
    async def _update_spec(self, model: str, change: Callable[[ModelSpecDoc | None], ModelSpecDoc]) -> int:
        """Read-modify-write of a spec by compare-and-swap; returns the revision written."""
        key = self._keys.model_spec(model)
        for _ in range(10):
            kv = await self._store.get(key)
            current = None if kv is None else ModelSpecDoc.parse(key, kv.value)
            result = await self._store.txn(
                [Compare(key, kv.mod_revision if kv else 0)], [Put(key, change(current).to_json())]
            )
            if result.succeeded:
                return result.revision
        raise FailedPrecondition(f"the spec of {model} keeps changing under concurrent writers; retry")

    def _loaded(self, status: ModelStatusView, versions: tuple[str, ...]) -> bool:
        """Every requested version RUNNING on its replica count, and a routing in force: once LoadModel
        returns, routers can route the model (they follow the routing key within milliseconds)."""
        if status.spec is not None and status.spec.load_on_demand and status.spec.replicas == 0:
            return True
        counts = status.status.versions
        running = all(
            v in counts and counts[v].required > 0 and counts[v].running >= counts[v].required
            for v in versions
        )
        return running and status.routing is not None

    async def _until_gone(self, model: str, timeout_s: float = 2.0) -> None:
        """Until this scheduler's view no longer has ``model`` (its watch took the delete), so that a
        status read after the failed load's answer finds nothing; at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                self.status(model)
            except NotFound:
                return
            await self._state.wait_change(min(left, 1.0))

    async def _wait(
        self,
        model: str,
        done: Callable[[ModelStatusView], bool],
        *,
        timeout_s: float | None,
        what: str,
        version: str = "",
        min_revision: int = 0,
    ) -> None:
        """Wait until ``done``; only a status planned from spec revision >= ``min_revision`` counts."""
        deadline = time.monotonic() + (DEFAULT_WAIT_S if timeout_s is None else timeout_s)
        while True:
            try:
                status = self.status(model, version)
            except NotFound:
                status = ModelStatusView(model, None, None, None, ())
            if status.status.spec_revision < min_revision:
                status = replace(status, status=_NO_STATUS)  # planned before our change: not an answer yet
            if done(status):
                return
            doc = status.status
            if doc.error_code and doc.error:
                raise error_for_code(doc.error_code, doc.error)
            left = deadline - time.monotonic()
            if left <= 0:
                pending = doc.pending or "no progress reported yet"
                if doc.retrying:
                    pending = f"{pending}; last failure: {doc.retrying}"
                raise DeadlineExceeded(
                    f"{what} did not finish in time ({pending}); it goes on in the background"
                )
            await self._state.wait_change(min(left, 1.0))


def _traffic_revision(status: ModelStatusDoc | None) -> int:
    return status.traffic_revision if status is not None else 0
