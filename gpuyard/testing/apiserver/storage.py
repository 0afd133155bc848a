"""The test API server's object storage: one global resourceVersion, a bounded event history, watchers.

Every write (`commit`) bumps the one strictly increasing counter, stamps the object with it, appends an
event to the history and hands it to every open watcher of that resource, synchronously, so a watcher
registered between two writes sees exactly the writes after its starting version. A watch may resume
from any version the history still holds; `compact()` (or the history's bound) forgets older ones, which
then answer 410 Gone. Stored objects are never changed in place: a write stores a new dict.

Semantics of the verbs (metadata, generation, status subresource, ...) live in `objects.py`, above this.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gpuyard.testing.apiserver.errors import ApiError
from gpuyard.testing.apiserver.selecting import Matcher

__all__ = ["CLOSE", "Event", "ResourceKey", "Storage", "Watcher"]

ResourceKey = tuple[str, str]  # (group, plural)
ObjectKey = tuple[str, str]  # (namespace or "", name)
CLOSE = None  # put into a watcher's queue: end the stream


@dataclass(frozen=True, slots=True)
class Event:
    """One write: the object after it (for DELETED, its last state) and before it."""

    rv: int
    resource: ResourceKey
    type: str  # ADDED | MODIFIED | DELETED
    obj: dict[str, Any]
    old: dict[str, Any] | None = None


def _namespace(obj: dict[str, Any]) -> str:
    return (obj.get("metadata") or {}).get("namespace") or ""


@dataclass(eq=False)
class Watcher:
    """One open watch stream's filter and queue (events already shaped for it)."""

    resource: ResourceKey
    namespace: str | None
    match: Matcher | None
    queue: asyncio.Queue[tuple[str, dict[str, Any]] | None] = field(default_factory=asyncio.Queue)
    silenced: bool = False

    def offer(self, event: Event) -> None:
        if event.resource != self.resource:
            return
        if self.namespace and _namespace(event.obj) != self.namespace:
            return
        shaped = self.shape(event)
        if shaped is not None:
            self.queue.put_nowait(shaped)

    def shape(self, event: Event) -> tuple[str, dict[str, Any]] | None:
        """The event as this watcher sees it: with a selector, an object that starts (stops) matching
        is ADDED (DELETED), as on a real server."""
        if self.match is None:
            return (event.type, event.obj)
        if event.type == "DELETED":
            return (event.type, event.obj) if self.match(event.obj) else None
        now = self.match(event.obj)
        before = event.old is not None and self.match(event.old)
        if event.type == "ADDED" or (now and not before):
            return ("ADDED", event.obj) if now else None
        if now:
            return ("MODIFIED", event.obj)
        return ("DELETED", event.obj) if before else None


class Storage:
    """Objects by resource and key, the resourceVersion counter, the history and the watchers."""

    def __init__(self, *, history_limit: int = 10_000) -> None:
        self.rv = 0
        self.compacted = 0  # a watch from a version below this answers 410
        self.history: deque[Event] = deque()
        self.history_limit = history_limit
        self.watchers: set[Watcher] = set()
        self._objects: dict[ResourceKey, dict[ObjectKey, dict[str, Any]]] = {}
        self._order: dict[ResourceKey, list[ObjectKey]] = {}  # sorted keys, until a key comes or goes

    # --- reads ------------------------------------------------------------------------------------

    def get(self, resource: ResourceKey, name: str, *, namespace: str = "") -> dict[str, Any] | None:
        return self._objects.get(resource, {}).get((namespace, name))

    def items(self, resource: ResourceKey, namespace: str | None = None) -> list[dict[str, Any]]:
        """The objects of a resource (in one namespace when given), ordered by namespace then name."""
        found = self._objects.get(resource, {})
        keys = self._order.get(resource)
        if keys is None:
            keys = self._order[resource] = sorted(found)
        return [found[k] for k in keys if namespace is None or k[0] == namespace]

    def items_at(
        self, resource: ResourceKey, rv: int, *, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        """The objects of a resource as they were at version `rv` (not older than `compacted`): the
        current ones with every later event of the history undone."""
        later = itertools.takewhile(lambda e: e.rv > rv, reversed(self.history))
        if not any(e.resource == resource for e in later):
            return self.items(resource, namespace)  # nothing written since: the objects now
        state = {k: o for k, o in self._objects.get(resource, {}).items()}
        for event in reversed(self.history):
            if event.rv <= rv:
                break
            if event.resource != resource:
                continue
            meta = event.obj.get("metadata") or {}
            key = (meta.get("namespace") or "", meta.get("name") or "")
            if event.old is None:
                state.pop(key, None)
            else:
                state[key] = event.old
        return [state[k] for k in sorted(state) if namespace is None or k[0] == namespace]

    def all_objects(self) -> Iterator[tuple[ResourceKey, dict[str, Any]]]:
        for resource, objs in self._objects.items():
            for obj in objs.values():
                yield resource, obj

    def events_since(self, rv: int) -> list[Event]:
        """The history after `rv`; 410 when part of it was compacted away."""
        if rv < self.compacted:
            raise ApiError.gone(f"too old resource version: {rv} ({self.compacted})")
        return [e for e in self.history if e.rv > rv]

    # --- writes -----------------------------------------------------------------------------------

    def commit(self, resource: ResourceKey, obj: dict[str, Any], *, event_type: str) -> dict[str, Any]:
        """Store (or, for DELETED, remove) `obj` at the next resourceVersion and publish the event."""
        self.rv += 1
        meta = dict(obj.get("metadata") or {})
        meta["resourceVersion"] = str(self.rv)
        stored = {**obj, "metadata": meta}
        key = (meta.get("namespace") or "", meta.get("name") or "")
        bucket = self._objects.setdefault(resource, {})
        old = bucket.get(key)
        if event_type == "DELETED":
            bucket.pop(key, None)
        else:
            bucket[key] = stored
        if old is None or event_type == "DELETED":
            self._order.pop(resource, None)
        event = Event(self.rv, resource, event_type, stored, old)
        if len(self.history) >= self.history_limit:
            self.compacted = self.history.popleft().rv
        self.history.append(event)
        for watcher in list(self.watchers):
            watcher.offer(event)
        return stored

    def drop_resource(self, resource: ResourceKey, namespace: str | None = None) -> list[dict[str, Any]]:
        """Delete every object of a resource (in one namespace), each with a DELETED event."""
        gone = [self.commit(resource, obj, event_type="DELETED") for obj in self.items(resource, namespace)]
        if namespace is None:
            self._objects.pop(resource, None)
            self._order.pop(resource, None)
        return gone

    def compact(self) -> int:
        """Forget the history: a watch or a paged/exact LIST from an older version answers 410."""
        self.history.clear()
        self.compacted = self.rv
        return self.compacted

    # --- watchers ---------------------------------------------------------------------------------

    def watch(
        self,
        resource: ResourceKey,
        *,
        namespace: str | None,
        match: Matcher | None,
        since: int | None,
        silenced: bool = False,
    ) -> Watcher:
        """Register a watcher. `since=None`: ADDED for every current object first; else the events
        after that version (410 when compacted). Then every new write, in order."""
        watcher = Watcher(resource, namespace, match, silenced=silenced)
        if since is None:
            for obj in self.items(resource, namespace):
                if match is None or match(obj):
                    watcher.queue.put_nowait(("ADDED", obj))
        else:
            for event in self.events_since(since):
                watcher.offer(event)
        self.watchers.add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        self.watchers.discard(watcher)

    def close_watchers(self) -> int:
        """End every open watch stream now; the number ended."""
        watchers = list(self.watchers)
        for watcher in watchers:
            watcher.queue.put_nowait(CLOSE)
        self.watchers.clear()
        return len(watchers)
