"""Informers: keep the store (the cache) current with one resource of the API server.

One :class:`Informer` per watched `ApiResource`, by Kubernetes' rules (client-go's reflector,
kopf's `watching.py`):

1. LIST, in pages (`limit` / `continue`, `paging.py`: a token that expired restarts the list, then
   falls back to one full list, as client-go's pager does), each page mirrored as it comes; every object is mirrored into the store with the server's resourceVersion, and every
   object of this resource the store holds but the list lacks is forgotten (a re-list after a
   410 thus turns into the deletes that were missed). `synced` is set after the first LIST.
2. WATCH from the list's resourceVersion with `allowWatchBookmarks`; each event is mirrored
   (ADDED/MODIFIED -> observe, DELETED -> forget), a BOOKMARK only moves the resourceVersion on.
   When the server ends the stream (its `timeoutSeconds`, a random time between `watch_timeout` and
   twice that, as client-go picks it, so informers do not re-watch in step), WATCH again from the
   last version.
3. 410 Gone (answer or ERROR event, or an expired `continue` token): LIST again at once. A
   stream that sends nothing for `inactivity_timeout` seconds (180 by default, well above the
   minute a real API server lets pass between bookmarks) is restarted from the last version. Any other failure (5xx, a
   refused connection) is retried with exponential backoff and full jitter, capped at
   `backoff_max`; while it lasts, `healthy` is False (so `/readyz` is not ready).
4. An informer may watch part of a resource: the objects of one `namespace` (the nodes' heartbeat
   Leases in `kube-node-lease`) or those matching a label `selector` (the Events gpuyard wrote about
   jobs: `job-name`). LIST and WATCH both carry the scope, and a re-list forgets only the objects
   of the store inside it (an object that stops matching arrives as DELETED, as the server says).
5. A resource the server does not serve (404 on LIST: a CRD not installed) is logged once, with
   the CRD's name and `gpuyard install`, and retried with backoff; never a crash loop.

Before an object is validated, the informer's `transform` (`trimming.py`, as client-go's
`SetTransform`) drops what gpuyard never reads: `managedFields`, and most of a foreign pod.

Objects go to a :class:`Mirror` (the store itself by default; the node model wraps it for Nodes,
Pods and NodeTopologies). An object that does not validate against its model is logged once
per resourceVersion and kept out of the store (a version of it the store held is forgotten); with
an `invalid` reporter (the job kinds: `invalid.py`) it is also handed over to be reported on the
API server (a `Failed` condition and a Warning Event), and a valid object is shown to it so that
a stale `InvalidSpec` condition is cleared.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol, runtime_checkable

import structlog
from pydantic import ValidationError

from gpuyard.apis.labels import Selector, parse_selector
from gpuyard.apis.meta import Resource
from gpuyard.apis.resources import ApiResource
from gpuyard.kubecluster.client import ApiError, Json, KubeClient, WatchSilent
from gpuyard.kubecluster.invalid import InvalidJobs, problem_text
from gpuyard.kubecluster.paging import DEFAULT_PAGE_SIZE
from gpuyard.state.clock import Clock
from gpuyard.state.store import Gone, NotFound, Store

__all__ = ["Backoff", "BatchingMirror", "Informer", "Mirror", "StoreMirror", "Transform"]

Transform = Callable[[str, Json], Json]  # (kind, raw object) -> the object without what is never read

log = structlog.get_logger(__name__)


class Mirror(Protocol):
    """Where an informer puts what it observes."""

    def put(self, obj: Resource) -> None: ...

    def drop(self, kind: str, namespace: str, name: str) -> None: ...


@runtime_checkable
class BatchingMirror(Mirror, Protocol):
    """A mirror that does its derived work once per batch (a LIST), not once per object."""

    def batched(self) -> AbstractContextManager[None]: ...


class StoreMirror:
    """Mirror straight into the store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def put(self, obj: Resource) -> None:
        self.store.observe(obj)

    def drop(self, kind: str, namespace: str, name: str) -> None:
        self.store.forget(kind, namespace, name)


class Backoff:
    """Exponential backoff with full jitter: attempt n waits uniform(0, min(cap, base * 2**n))."""

    def __init__(self, *, base: float = 0.2, cap: float = 30.0, rng: random.Random | None = None) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0
        self.rng = rng or random.Random()

    def reset(self) -> None:
        self.failures = 0

    def next(self) -> float:
        ceiling = min(self.cap, self.base * 2.0**self.failures)
        self.failures += 1
        return self.rng.uniform(ceiling / 2, ceiling)


class Informer:
    """LIST + WATCH of one resource into a mirror; see the module docstring."""

    def __init__(
        self,
        *,
        client: KubeClient,
        resource: ApiResource,
        cls: type[Resource],
        store: Store,
        clock: Clock,
        mirror: Mirror | None = None,
        watch_timeout: float = 300.0,
        inactivity_timeout: float = 180.0,
        backoff_max: float = 30.0,
        on_relist: Callable[[], None] | None = None,
        invalid: InvalidJobs | None = None,
        namespace: str | None = None,
        selector: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        transform: Transform | None = None,
    ) -> None:
        """`namespace` and `selector` (a label selector, e.g. `job-name`) limit what is watched;
        `page_size` is the `limit` of each LIST page; `transform` (kind, raw) -> raw cuts what
        gpuyard never reads before an object is validated (`trimming.Trimmer`)."""
        self.client = client
        self.resource = resource
        self.cls = cls
        self.store = store
        self.clock = clock
        self.mirror: Mirror = mirror or StoreMirror(store)
        self.watch_timeout = watch_timeout
        self.inactivity_timeout = inactivity_timeout
        self.backoff = Backoff(cap=backoff_max)
        self.on_relist = on_relist
        self.invalid = invalid
        self.namespace = namespace or None
        self.selector = selector or None
        self._matcher: Selector = parse_selector(selector)
        self.page_size = page_size
        self.transform = transform
        self.synced = asyncio.Event()
        self.healthy = False
        self.error: str | None = None
        self.resource_version = ""
        self.lists = 0  # LISTs made (the first, then one per 410)
        self.list_restarts = 0  # lists started over: a `continue` token expired between pages
        self.pages = 0  # LIST pages read
        self.watches = 0  # WATCH requests opened
        self._missing_logged = False
        self._invalid: set[tuple[str, str, str]] = set()

    @property
    def name(self) -> str:
        r = self.resource
        return f"{r.plural}.{r.group}" if r.group else r.plural

    # --- mirroring -----------------------------------------------------------------------------

    def _model(self, raw: Json) -> Resource | None:
        raw.setdefault("apiVersion", self.resource.api_version)
        raw["kind"] = self.resource.kind  # the store's kind (GangPodGroup is a `PodGroup` on the wire)
        if self.transform is not None:
            raw = self.transform(self.resource.kind, raw)
        obj: Resource | None = None
        try:
            obj = self.cls.model_validate(raw)
            problem = self.invalid.check(raw) if self.invalid is not None else None
        except ValidationError as exc:
            problem = problem_text(exc)
        if obj is not None and problem is None and self.invalid is not None:
            held = self.store.get(self.resource.kind, obj.metadata.namespace, obj.metadata.name)
            problem, evict = self.invalid.clash(obj, held)
            if evict:  # the other group's job of this name came later: it leaves the store
                self.mirror.drop(self.resource.kind, obj.metadata.namespace, obj.metadata.name)
        if obj is not None and problem is None:
            if self.invalid is not None:
                self.invalid.cleared(self.resource, raw, obj)
            return obj
        meta = raw.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("resourceVersion")))
        if key not in self._invalid:
            self._invalid.add(key)
            log.warning(
                "informer.invalid_object",
                resource=self.name,
                object=f"{key[0]}/{key[1]}" if key[0] else key[1],
                error=problem,
            )
            if self.invalid is not None and problem is not None:
                self.invalid.note(self.resource, raw, problem)
        held = self.store.get(self.resource.kind, key[0], key[1])
        if held is not None and self._mine(held):
            self.mirror.drop(self.resource.kind, key[0], key[1])  # its last valid version is stale
        return None

    def missing_hint(self) -> str:
        """What to tell the user when the API server does not serve the resource."""
        res = self.resource
        if res.gang_scheduler:
            return (
                f"the API server does not serve {self.name}: scheduler.mode is delegate with "
                f"gang_scheduler {res.gang_scheduler}, whose CRDs come with it; install "
                f"{res.gang_scheduler} or change scheduler.gang_scheduler; retrying"
            )
        what = f"CRD {res.crd_name}" if res.group else f"resource {self.name}"
        return (
            f"the API server does not serve {self.name}: is the {what} installed? "
            "run `gpuyard install` (or apply configs/deploy/crds/); retrying"
        )

    def _drop(self, kind: str, namespace: str, name: str) -> None:
        self.mirror.drop(kind, namespace, name)
        if self.invalid is not None:  # a job that won a name clash may leave room for the loser
            self.invalid.freed(kind, namespace, name)

    async def refetch(self, namespace: str, name: str) -> None:
        """GET one object and mirror it as a watch event would (a job that lost a name clash,
        looked at again once the winner is gone)."""
        try:
            raw = await self.client.get(self.resource, namespace, name)
        except (NotFound, ApiError) as exc:
            log.info(
                "informer.refetch_skipped", resource=self.name, object=f"{namespace}/{name}", error=str(exc)
            )
            return
        obj = self._model(raw)
        if obj is not None:
            self.mirror.put(obj)

    def _mine(self, obj: Resource) -> bool:
        """Objects of the store's kind served by this resource (a job kind has one per group)."""
        return obj.api_version == self.resource.api_version

    def _in_scope(self, obj: Resource) -> bool:
        """Inside what this informer watches (its namespace and label selector)."""
        if self.namespace is not None and obj.metadata.namespace != self.namespace:
            return False
        return self._matcher.matches(obj.metadata.labels)

    async def relist(self) -> None:
        """LIST page by page (each page mirrored as it comes, so no whole list is held as JSON),
        then forget what the list lacked; the watch resumes from the list's resourceVersion."""
        seen: set[tuple[str, str]] = set()
        rv = ""
        with self._batch():  # the node model re-derives each node once, when the list is in
            async for page in self.client.pages(
                self.resource, namespace=self.namespace, selector=self.selector, page_size=self.page_size
            ):
                self.pages += 1
                if page.restarted:  # a token expired: the list started over, of a newer snapshot
                    self.list_restarts += 1
                    seen.clear()
                rv = page.resource_version
                for raw in page.items:
                    obj = self._model(raw)
                    if obj is None:
                        continue
                    seen.add((obj.metadata.namespace, obj.metadata.name))
                    self.mirror.put(obj)
        kind = self.resource.kind
        for ns, name in self.store.keys_of(kind):
            held = self.store.get(kind, ns, name)
            if (ns, name) not in seen and held is not None and self._mine(held) and self._in_scope(held):
                self._drop(kind, ns, name)
        self.resource_version = rv
        self.lists += 1
        if self.on_relist is not None:
            self.on_relist()

    def _batch(self) -> AbstractContextManager[None]:
        """The mirror's batch of one LIST (`BatchingMirror`), when it has one."""
        if isinstance(self.mirror, BatchingMirror):
            return self.mirror.batched()
        return nullcontext()

    def apply(self, event: Json) -> None:
        kind = event.get("type")
        raw = event.get("object") or {}
        rv = str((raw.get("metadata") or {}).get("resourceVersion") or "")
        if kind == "BOOKMARK":
            self.resource_version = rv or self.resource_version
            return
        obj = self._model(raw)
        if rv:
            self.resource_version = rv
        if obj is None:
            return
        if kind == "DELETED":
            self._drop(obj.kind, obj.metadata.namespace, obj.metadata.name)
        elif kind in ("ADDED", "MODIFIED"):
            self.mirror.put(obj)

    # --- the loop ------------------------------------------------------------------------------

    def _opened(self) -> None:
        self.healthy, self.error = True, None

    def _broken(self, error: str) -> None:
        self.healthy = False
        self.error = error

    async def run(self) -> None:
        listed = False
        while True:
            try:
                if not listed:
                    await self.relist()
                    listed = True
                    self.synced.set()
                    self.healthy, self.error = True, None
                    self._missing_logged = False
                    self.backoff.reset()
                self.watches += 1
                async for event in self.client.watch(
                    self.resource,
                    resource_version=self.resource_version,
                    timeout_seconds=self.watch_timeout * random.uniform(1.0, 2.0),
                    inactivity=self.inactivity_timeout,
                    opened=self._opened,
                    namespace=self.namespace,
                    selector=self.selector,
                ):
                    self.healthy, self.error = True, None
                    self.backoff.reset()
                    self.apply(event)
                # the server closed the stream (timeoutSeconds): watch again from where we are
            except Gone as exc:
                log.info(
                    "informer.gone",
                    resource=self.name,
                    resource_version=self.resource_version,
                    error=str(exc),
                )
                listed = False  # re-list at once
            except WatchSilent as exc:
                log.warning("informer.silent", resource=self.name, error=str(exc))
                self._broken(str(exc))  # healthy again at the next event or list
            except NotFound as exc:
                self._broken(str(exc))
                if not self._missing_logged:
                    self._missing_logged = True
                    log.error("informer.resource_missing", resource=self.name, error=self.missing_hint())
                await self.clock.sleep(self.backoff.next())
            except ApiError as exc:
                self._broken(str(exc))
                delay = self.backoff.next()
                log.warning("informer.error", resource=self.name, error=str(exc), retry_in=round(delay, 2))
                await self.clock.sleep(delay)
