"""The object store: the single source of truth of the process.

Objects are the pydantic models of `gpuyard.apis`, keyed by (kind, namespace, name). Every write
bumps one monotonic resourceVersion and appends a change event to a bounded in-memory log;
`watch(kind, since=rv)` replays the log from `rv` and then follows it, in order. A watcher that
falls further behind than the log holds gets :class:`Gone` (HTTP 410 in Kubernetes) and must
re-list, so a slow watcher costs no memory and never blocks a writer.

Writes are synchronous (the scheduler "assumes" a placement in the same step as it decides it)
and never await. Kinds registered as journaled are also written to a :class:`Journal` (SQLite),
so a restarted process reloads them with the same resourceVersions.

Objects handed out by the store are shared and must not be mutated: `obj.clone()`, change the
copy, then `store.update(copy)`. `update` checks the copy's resourceVersion and raises
:class:`Conflict` when someone else wrote in between (optimistic concurrency, as Kubernetes).

A backend whose store of record is elsewhere (the Kubernetes API server) uses the store as its
informer cache instead: `observe(obj)` mirrors an object as the server holds it (its
resourceVersion kept; an older or equal version is ignored), `forget(kind, ns, name)` drops one
the server no longer holds. Watchers get the same ADDED/MODIFIED/DELETED events. The store's
version then follows the server's: a mirrored object's event is numbered with the object's own
resourceVersion when that is above every version issued so far (else with the next one: the
informers of different resources deliver their events in their own order), so the store's
`resource_version` is never below an object's, versions only grow, and a watch from an object's
own resourceVersion gets every change made after it (and, where events arrived out of the
server's order, a few it may have seen already). The numbering may skip: the log is kept in
order of arrival and a watch from version N starts at the first event numbered above N.
Nothing is journaled in that mode.
"""

from __future__ import annotations

import asyncio
import bisect
import builtins
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar, cast

from pydantic import BaseModel

from gpuyard.apis.labels import Selector, parse_selector
from gpuyard.apis.meta import Resource, utcnow

__all__ = [
    "AlreadyExists",
    "Conflict",
    "Gone",
    "JournalSink",
    "NotFound",
    "Store",
    "StoreError",
    "WatchEvent",
]

R = TypeVar("R", bound=Resource)
VERSION_BLOCK = 1_000  # resourceVersions reserved in the journal per durable write of the mark
M = TypeVar("M", bound=BaseModel)
EventType = Literal["ADDED", "MODIFIED", "DELETED"]


_uid_random = random.Random(os.urandom(16))


def new_uid() -> str:
    """A random (version 4 format) UUID string; cheaper than `uuid.uuid4()` per write."""
    h = f"{_uid_random.getrandbits(128) & ~(0xF000 << 64) & ~(0xC000 << 48) | (0x4000 << 64) | (0x8000 << 48):032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def tune_gc() -> None:
    """Collect garbage less often, in short pauses: the store keeps many long-lived objects.

    CPython's default thresholds (700, 10, 10) scan them every few hundred allocations (2-3x
    slower writes). Too large a young generation is as bad the other way: a generation-1
    collection scans every object that survived `threshold0 x threshold1` allocations, which
    under load are mostly new store objects (with (50,000, 20) about a million of them: a 400 ms
    pause of the event loop, measured with `GPUYARD_SLOW_GC_MS`, and the p99 of every request).
    Here a collection scans at most ~15,000 young objects (under 50 ms on a busy 2-core machine),
    and full collections stay as rare as before (one per 100 M net allocations at most, and only
    once the heap has grown by a quarter since the last)."""
    import gc

    gc.set_threshold(5_000, 2, 10_000)
    gc.freeze()


def _copy_with(model: M, changes: dict[str, Any]) -> M:
    """A shallow copy of a pydantic model with some fields replaced (no validation).

    What `model_copy(update=...)` does, minus its generic overhead: the store makes two such
    copies per write, so this is the write path's main cost.
    """
    cls = model.__class__
    new = cls.__new__(cls)
    setattr_ = object.__setattr__
    setattr_(new, "__dict__", {**model.__dict__, **changes})
    setattr_(new, "__pydantic_fields_set__", model.__pydantic_fields_set__ | changes.keys())
    extra = model.__pydantic_extra__
    setattr_(new, "__pydantic_extra__", dict(extra) if extra is not None else None)
    setattr_(new, "__pydantic_private__", model.__pydantic_private__)
    return new


class StoreError(Exception):
    """Base of store errors; carries the object's key."""

    def __init__(self, message: str, *, key: tuple[str, str, str] | None = None) -> None:
        super().__init__(message)
        self.key = key


class NotFound(StoreError):
    pass


class AlreadyExists(StoreError):
    pass


class Conflict(StoreError):
    pass


class Gone(StoreError):
    """The requested resourceVersion is older than the watch log holds: re-list."""


@dataclass(slots=True, frozen=True)
class WatchEvent:
    type: EventType
    object: Resource
    rv: int
    at: float  # time.perf_counter() when written, to measure delivery delay
    seq: int = 0  # position in the log (versions may skip where they follow a store of record)


class JournalSink(Protocol):
    """Where journaled writes go (see `state/journal.py`)."""

    def record_put(self, obj: Resource, rv: int) -> None: ...

    def record_delete(self, kind: str, namespace: str, name: str, rv: int) -> None: ...

    def reserve_versions(self, upto: int) -> None:
        """Durably record that resourceVersions up to `upto` may be handed out (before any is)."""
        ...


class _Kind:
    __slots__ = ("by_label", "changed", "cls", "journaled", "objects", "order")

    def __init__(self, cls: type[Resource], journaled: bool) -> None:
        self.cls = cls
        self.journaled = journaled
        self.changed = 0  # the store's change count when an object of the kind was last written
        self.objects: dict[tuple[str, str], Resource] = {}
        # the keys of `objects` sorted (`Store.in_order`); None once an object came or went
        self.order: list[tuple[str, str]] | None = None
        # label key -> label value -> set of (namespace, name)
        self.by_label: dict[str, dict[str, set[tuple[str, str]]]] = {}

    def index(self, key: tuple[str, str], labels: Mapping[str, str]) -> None:
        for k, v in labels.items():
            self.by_label.setdefault(k, {}).setdefault(v, set()).add(key)

    def unindex(self, key: tuple[str, str], labels: Mapping[str, str]) -> None:
        for k, v in labels.items():
            values = self.by_label.get(k)
            if values is None:
                continue
            keys = values.get(v)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del values[v]


class Store:
    """Typed, versioned, watchable in-memory object store."""

    def __init__(
        self,
        *,
        history: int = 50_000,
        now: Callable[[], datetime] = utcnow,
        journal: JournalSink | None = None,
    ) -> None:
        if history < 1:
            raise ValueError("history must be at least 1")
        self._kinds: dict[str, _Kind] = {}
        self._rv = 0
        self._cap = history
        self._log: list[WatchEvent | None] = [None] * history
        self._seq = 0  # events written (the log is indexed by it; versions may skip)
        self._seq_base = 0  # the log holds no event at or before this position (a restart)
        self._changes = 0  # writes of any kind, journal loads included (`changed`)
        self._floor = 0  # the log holds every event numbered above this version
        self._new: asyncio.Future[None] | None = None
        self._closed = False
        self._now = now
        self._journal = journal
        # with a journal, versions are reserved durably in blocks before they are handed out,
        # so a restart continues above every version any watcher or client has seen
        self._reserved = 0

    # --- kinds -------------------------------------------------------------------------------

    def register(self, cls: type[Resource], *, journaled: bool = False) -> None:
        """Make a kind known to the store; `journaled` kinds survive a restart."""
        if not cls.KIND:
            raise ValueError(f"{cls.__name__} has no KIND")
        known = self._kinds.get(cls.KIND)
        if known is not None:
            known.journaled = known.journaled or journaled
            return
        self._kinds[cls.KIND] = _Kind(cls, journaled)

    def kind_class(self, kind: str) -> type[Resource]:
        return self._kind(kind).cls

    def kinds(self) -> list[str]:
        return list(self._kinds)

    def is_journaled(self, kind: str) -> bool:
        return self._kind(kind).journaled

    def attach_journal(self, journal: JournalSink | None) -> None:
        self._journal = journal
        self._reserved = self._rv  # the next write reserves a new block

    def _next_rv(self, *, at_least: int = 0) -> int:
        """The next resourceVersion, durably reserved first when a journal is attached.

        Every kind consumes versions, journaled or not (Events, Services), so the journal keeps
        a high-water mark: versions up to it may have been seen; after a crash numbering
        continues above it (a crash skips unused versions of the block, never reuses one).
        """
        rv = max(self._rv + 1, at_least)
        journal = self._journal
        if journal is not None and rv > self._reserved:
            upto = rv + VERSION_BLOCK - 1
            journal.reserve_versions(upto)  # raises before anything changes if it cannot
            self._reserved = upto
        return rv

    def _kind(self, kind: str) -> _Kind:
        try:
            return self._kinds[kind]
        except KeyError:
            raise StoreError(f"unknown kind {kind!r}; known: {', '.join(sorted(self._kinds))}") from None

    # --- reads -------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    def changed(self, *kinds: str) -> tuple[int, ...]:
        """Per kind, a number that moves whenever an object of it is written (created, updated,
        deleted, mirrored or loaded); 0 for a kind never written or not registered. What a
        cache derived from every object of some kinds compares to know it is still good."""
        return tuple(k.changed if (k := self._kinds.get(kind)) is not None else 0 for kind in kinds)

    def get(self, kind: str, namespace: str, name: str) -> Resource | None:
        return self._kind(kind).objects.get((namespace, name))

    def must_get(self, kind: str, namespace: str, name: str) -> Resource:
        obj = self._kind(kind).objects.get((namespace, name))
        if obj is None:
            raise NotFound(f"{kind} {_fmt(namespace, name)} not found", key=(kind, namespace, name))
        return obj

    def list(
        self,
        kind: str,
        *,
        namespace: str | None = None,
        selector: str | Mapping[str, str] | Selector | None = None,
    ) -> list[Resource]:
        """Objects of a kind, optionally in one namespace and matching a label selector.

        Ordered by (namespace, name). Equality requirements are answered from a label index.
        """
        k = self._kind(kind)
        sel = parse_selector(selector)
        eq = sel.equalities() if sel else {}
        objects = k.objects
        out = []
        if not eq:  # the kind's sorted keys (`in_order`): no sort per call
            order = self._order(k)
            start, stop = 0, len(order)
            if namespace is not None:
                start = bisect.bisect_left(order, (namespace, ""))
                stop = bisect.bisect_left(order, (namespace + "\0", ""), lo=start)
            for i in range(start, stop):
                obj = objects[order[i]]
                if sel and not sel.matches(obj.metadata.labels):
                    continue
                out.append(obj)
            return out
        sets = [k.by_label.get(lk, {}).get(lv, set()) for lk, lv in eq.items()]
        for key in set.intersection(*sorted(sets, key=len)):
            if namespace is not None and key[0] != namespace:
                continue
            obj = objects[key]
            if not sel.matches(obj.metadata.labels):
                continue
            out.append(obj)
        out.sort(key=lambda o: (o.metadata.namespace, o.metadata.name))
        return out

    @staticmethod
    def _order(k: _Kind) -> builtins.list[tuple[str, str]]:
        """`k`'s keys sorted, kept until an object of the kind comes or goes."""
        order = k.order
        if order is None:
            order = k.order = sorted(k.objects)
        return order

    # Typed reads: the kind comes from the model class, and the result has that type. The store
    # holds only objects of a kind's registered class, so no check is made per object.

    def get_of(self, cls: type[R], namespace: str, name: str) -> R | None:
        """`get(cls.KIND, ...)` typed as `cls`."""
        return cast("R | None", self._kind(cls.KIND).objects.get((namespace, name)))

    def must_get_of(self, cls: type[R], namespace: str, name: str) -> R:
        """`must_get(cls.KIND, ...)` typed as `cls`."""
        return cast(R, self.must_get(cls.KIND, namespace, name))

    def list_of(
        self,
        cls: type[R],
        *,
        namespace: str | None = None,
        selector: str | Mapping[str, str] | Selector | None = None,
    ) -> builtins.list[R]:
        """`list(cls.KIND, ...)` typed as `cls`."""
        return cast("builtins.list[R]", self.list(cls.KIND, namespace=namespace, selector=selector))

    def all_of(self, cls: type[R]) -> builtins.list[R]:
        """Every object of `cls`'s kind in no particular order: a scan that needs no order (a sweep
        over every pod of a large cluster) skips `list`'s sort."""
        return cast("builtins.list[R]", builtins.list(self._kind(cls.KIND).objects.values()))

    def in_order(self, cls: type[R], *, after: tuple[str, str] | None = None) -> Iterator[R]:
        """The objects of `cls`'s kind in (namespace, name) order, from the first key above `after`:
        what `list` gives, read lazily, so a page of a long list costs the objects it reads. The
        sorted keys are kept until an object of the kind is created or deleted (sorted again at
        the next call). Consume it before the next write: an object deleted meanwhile is skipped."""
        k = self._kind(cls.KIND)
        order = self._order(k)
        objects = k.objects
        start = 0 if after is None else bisect.bisect_right(order, after)
        for i in range(start, len(order)):
            obj = objects.get(order[i])
            if obj is not None:
                yield cast(R, obj)

    def count(self, kind: str) -> int:
        return len(self._kind(kind).objects)

    # --- writes ------------------------------------------------------------------------------

    def create(self, obj: R) -> R:
        """Store a new object; raise :class:`AlreadyExists` if its key is taken."""
        k = self._kind(obj.kind)
        meta = obj.metadata
        if not meta.name:
            if meta.generate_name:
                meta = meta.model_copy(update={"name": f"{meta.generate_name}{new_uid()[:5]}"})
            else:
                raise StoreError(f"{obj.kind}: metadata.name is required")
        namespace = meta.namespace if k.cls.NAMESPACED else ""
        if k.cls.NAMESPACED and not namespace:
            namespace = "default"
        key = (namespace, meta.name)
        if key in k.objects:
            raise AlreadyExists(f"{obj.kind} {_fmt(*key)} already exists", key=(obj.kind, *key))
        rv = self._next_rv()
        stored = _copy_with(
            obj,
            {
                "metadata": _copy_with(
                    meta,
                    {
                        "namespace": namespace,
                        "labels": dict(meta.labels),
                        "annotations": dict(meta.annotations),
                        "uid": meta.uid or new_uid(),
                        "resource_version": str(rv),
                        "generation": 1,
                        "creation_timestamp": meta.creation_timestamp or self._now(),
                    },
                )
            },
        )
        k.objects[key] = stored
        k.order = None
        k.index(key, stored.metadata.labels)
        self._commit("ADDED", stored, rv, k)
        return stored

    def update(self, obj: R, *, check_version: bool = True) -> R:
        """Replace an object. With `check_version`, its resourceVersion must be the stored one."""
        k = self._kind(obj.kind)
        key = (obj.metadata.namespace if k.cls.NAMESPACED else "", obj.metadata.name)
        old = k.objects.get(key)
        if old is None:
            raise NotFound(f"{obj.kind} {_fmt(*key)} not found", key=(obj.kind, *key))
        if check_version and obj.metadata.resource_version != old.metadata.resource_version:
            raise Conflict(
                f"{obj.kind} {_fmt(*key)}: resourceVersion {obj.metadata.resource_version or '<none>'} "
                f"is stale (current {old.metadata.resource_version})",
                key=(obj.kind, *key),
            )
        rv = self._next_rv()
        generation = old.metadata.generation
        if getattr(old, "spec", None) != getattr(obj, "spec", None):
            generation += 1
        stored = _copy_with(
            obj,
            {
                "metadata": _copy_with(
                    obj.metadata,
                    {
                        "namespace": key[0],
                        "labels": dict(obj.metadata.labels),
                        "annotations": dict(obj.metadata.annotations),
                        "uid": old.metadata.uid,
                        "resource_version": str(rv),
                        "generation": generation,
                        "creation_timestamp": old.metadata.creation_timestamp,
                    },
                )
            },
        )
        if old.metadata.labels != stored.metadata.labels:
            k.unindex(key, old.metadata.labels)
            k.index(key, stored.metadata.labels)
        k.objects[key] = stored
        self._commit("MODIFIED", stored, rv, k)
        return stored

    def mutate(self, kind: str, namespace: str, name: str, change: Callable[[Any], Any]) -> Resource:
        """Read, copy, apply `change(copy)` and write back; the read and write are one step."""
        current = self.must_get(kind, namespace, name)
        copy = current.clone()
        change(copy)
        return self.update(copy)

    def delete(
        self, kind: str, namespace: str, name: str, *, resource_version: str | None = None
    ) -> Resource:
        k = self._kind(kind)
        key = (namespace if k.cls.NAMESPACED else "", name)
        old = k.objects.get(key)
        if old is None:
            raise NotFound(f"{kind} {_fmt(*key)} not found", key=(kind, *key))
        if resource_version is not None and resource_version != old.metadata.resource_version:
            raise Conflict(
                f"{kind} {_fmt(*key)}: resourceVersion {resource_version} is stale", key=(kind, *key)
            )
        rv = self._next_rv()
        del k.objects[key]
        k.order = None
        k.unindex(key, old.metadata.labels)
        tomb = old.model_copy(
            update={"metadata": old.metadata.model_copy(update={"resource_version": str(rv)})}
        )
        self._commit("DELETED", tomb, rv, k)
        return tomb

    # --- mirroring (a backend whose store of record is elsewhere: the Kubernetes API server) --

    def observe(self, obj: Resource, *, force: bool = False) -> bool:
        """Mirror an object as the store of record holds it: its resourceVersion, uid and
        generation are kept as given. Watchers get ADDED or MODIFIED, numbered with the object's
        own resourceVersion where it is numeric and above every version issued (the store's
        `resource_version` follows the store of record's), else with the next version.

        Idempotent: an object no newer than the one held (numeric resourceVersions compared, as
        etcd's are) is ignored, so a watch event that repeats a write already mirrored is a
        no-op; `force` mirrors it anyway (a backend that derives what it caches from several
        objects, e.g. a node's capacity less other pods'). Returns whether anything changed.
        """
        k = self._kind(obj.kind)
        key = (obj.metadata.namespace if k.cls.NAMESPACED else "", obj.metadata.name)
        old = k.objects.get(key)
        if old is obj or (
            old is not None
            and not force
            and not _newer(obj.metadata.resource_version, old.metadata.resource_version)
        ):
            return False
        given = obj.metadata.resource_version
        rv = self._next_rv(at_least=int(given) if given.isascii() and given.isdigit() else 0)
        if old is not None:
            k.unindex(key, old.metadata.labels)
        else:
            k.order = None
        k.objects[key] = obj
        k.index(key, obj.metadata.labels)
        self._commit("ADDED" if old is None else "MODIFIED", obj, rv, k)
        return True

    def forget(self, kind: str, namespace: str, name: str) -> bool:
        """The store of record no longer holds the object: drop it (watchers get DELETED).
        Returns whether it was held."""
        k = self._kind(kind)
        key = (namespace if k.cls.NAMESPACED else "", name)
        old = k.objects.pop(key, None)
        if old is None:
            return False
        k.order = None
        k.unindex(key, old.metadata.labels)
        self._commit("DELETED", old, self._next_rv(), k)
        return True

    def keys_of(self, kind: str) -> builtins.list[tuple[str, str]]:
        """The (namespace, name) of every object of a kind (a re-list compares them)."""
        return builtins.list(self._kind(kind).objects)

    def load(self, obj: Resource) -> None:
        """Put back an object read from the journal, keeping its resourceVersion; no event."""
        k = self._kind(obj.kind)
        key = (obj.metadata.namespace, obj.metadata.name)
        k.objects[key] = obj
        k.order = None
        k.index(key, obj.metadata.labels)
        self._changes += 1
        k.changed = self._changes
        self._rv = max(self._rv, obj.resource_version)
        self._floor = self._rv  # no event stands for it: a watch from before it is Gone

    def restore_version(self, rv: int) -> None:
        """After a journal load: continue numbering after the highest version ever issued
        (or reserved). The watch log starts empty, so a watch from an older version is Gone."""
        self._rv = max(self._rv, rv)
        self._reserved = self._rv
        self._log = [None] * self._cap
        self._seq_base = self._seq
        self._floor = self._rv

    def _commit(self, type_: EventType, obj: Resource, rv: int, k: _Kind) -> None:
        self._changes += 1
        k.changed = self._changes
        self._rv = rv
        self._seq = seq = self._seq + 1
        slot = seq % self._cap
        dropped = self._log[slot]
        if dropped is not None and dropped.rv > self._floor:
            self._floor = dropped.rv
        self._log[slot] = WatchEvent(type_, obj, rv, time.perf_counter(), seq)
        if k.journaled and self._journal is not None:
            if type_ == "DELETED":
                self._journal.record_delete(obj.kind, obj.metadata.namespace, obj.metadata.name, rv)
            else:
                self._journal.record_put(obj, rv)
        fut = self._new
        if fut is not None:
            self._new = None
            if not fut.done():
                fut.set_result(None)

    # --- watch -------------------------------------------------------------------------------

    @property
    def oldest_watchable(self) -> int:
        """The oldest resourceVersion a watch may start from, less one."""
        return self._floor + 1

    def can_resume(self, since: int) -> bool:
        """Whether a watch from `since` continues exactly: it is the current version, or the
        log still holds every event numbered after it (not after a restart: the log starts empty)."""
        return self._floor <= since <= self._rv

    def _position_after(self, since: int) -> int:
        """The log position just before the first held event numbered above `since`."""
        lo, hi = max(self._seq_base, self._seq - self._cap), self._seq
        while lo < hi:  # versions grow with positions: find the last position numbered <= since
            mid = (lo + hi + 1) // 2
            ev = self._log[mid % self._cap]
            if ev is not None and ev.rv <= since:
                lo = mid
            else:
                hi = mid - 1
        return lo

    async def watch(
        self,
        kind: str | Iterable[str] | None = None,
        *,
        since: int | None = None,
        namespace: str | None = None,
    ) -> AsyncIterator[WatchEvent]:
        """Changes after resourceVersion `since` (default: now), in order, until the store closes.

        Raises :class:`Gone` when `since` is older than the log, or when this watcher falls
        more than `history` events behind.
        """
        kinds: frozenset[str] | None
        if kind is None:
            kinds = None
        elif isinstance(kind, str):
            self._kind(kind)
            kinds = frozenset([kind])
        else:
            kinds = frozenset(kind)
        if since is not None and since > self._rv:
            # never issued by this store: after a restart (numbering continues above every
            # version handed out before) or made up; waiting would silently skip changes
            raise Gone(f"resourceVersion {since} is newer than the current {self._rv}; re-list")
        if since is not None and since < self._floor:
            raise Gone(f"resourceVersion {since} is too old; oldest is {self.oldest_watchable}")
        cursor = self._seq if since is None else self._position_after(since)
        while True:
            while cursor < self._seq:
                cursor += 1
                if cursor <= self._seq - self._cap:
                    raise Gone("watcher fell behind: the events after its version are no longer held")
                ev = self._log[cursor % self._cap]
                if ev is None or ev.seq != cursor:
                    raise Gone(f"the event at log position {cursor} is no longer held")
                if kinds is not None and ev.object.kind not in kinds:
                    continue
                if namespace is not None and ev.object.metadata.namespace != namespace:
                    continue
                yield ev
            if self._closed:
                return
            fut = self._new
            if fut is None:
                fut = self._new = asyncio.get_running_loop().create_future()
            await asyncio.shield(fut)  # one watcher cancelled must not cancel the others' shared wait

    def close(self) -> None:
        """End every watch (after it has delivered what was written)."""
        self._closed = True
        fut = self._new
        if fut is not None:
            self._new = None
            if not fut.done():
                fut.set_result(None)


def _fmt(namespace: str, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


def _newer(given: str, held: str) -> bool:
    """Whether resourceVersion `given` is newer than `held` (numeric ones compared; any other
    pair is taken as newer when it differs: the store of record's versions are opaque)."""
    if given.isdigit() and held.isdigit():
        return int(given) > int(held)
    return given != held
