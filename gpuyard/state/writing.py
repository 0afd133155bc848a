"""The one write path: every component writes through a :class:`Writer`, and reads the store.

The store is the cache of what the backend holds. Writes go to the backend, which answers with
the stored object (server-assigned resourceVersion) once the write is durable; the store then
holds it too. Semantics are the Kubernetes API server's, whichever backend runs:

* `create(obj)` -> the stored object; :class:`AlreadyExists` when the name is taken.
* `update(obj)` replaces metadata and spec; `obj.metadata.resourceVersion` must be the stored one
  (else :class:`Conflict`). For kinds with a `status`, the stored status is kept: status is a
  subresource, written only with `patch_status`.
* `patch_status(kind, namespace, name, changes)` merges `changes` (status field name -> value,
  snake_case as in the models) into the status; with `resource_version` it is a precondition.
  Owners of different status fields never overwrite each other's fields.
* `delete(kind, namespace, name)`; :class:`NotFound` when it is not there.

Conflicts are typed (:class:`~gpuyard.state.store.Conflict`); a caller re-reads, re-decides and
retries (:func:`retry_on_conflict`). :class:`StoreWriter` implements the interface over the
in-memory store (the fake backend's API server): a write is answered after the journal has made
it durable, when a journal is attached (one group commit for all writes of a loop iteration).

**Who writes.** Every write carries the identity of the component that makes it, as a Kubernetes
request carries its `fieldManager`: a component writes through `identified(writer, identity)`
(the identities are in :mod:`gpuyard.state.ownership`), or runs a block `with acting_as(identity)`
(a backend's own tasks: the fake kubelet, the Kubernetes backend's sweeps). The identity travels
with the call in a context variable, so a writer that wraps another (fault injection in tests)
passes it on untouched; the innermost identity wins. The backend reads it with
:func:`writer_identity`: the Kubernetes writer sends it as `fieldManager`, and
:class:`StoreWriter` hands every write, as a :class:`WriteRecord` (identity, verb, kind, the parts
touched), to its `audit` hook when one is set (the ownership tests check each against
:data:`gpuyard.state.ownership.OWNERSHIP`).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, cast, runtime_checkable

from pydantic import BaseModel

from gpuyard.apis.meta import Resource
from gpuyard.state.store import Conflict, NotFound, Store

__all__ = [
    "Durability",
    "IdentifiedWriter",
    "StoreWriter",
    "WriteRecord",
    "Writer",
    "acting_as",
    "create_all",
    "identified",
    "patchable_status",
    "retry_on_conflict",
    "unidentified",
    "write_together",
    "writer_identity",
]

R = TypeVar("R", bound=Resource)
T = TypeVar("T")


@runtime_checkable
class Writer(Protocol):
    """What a component may do to the objects of the cluster (see the module docstring)."""

    async def create(self, obj: R) -> R: ...

    async def update(self, obj: R) -> R: ...

    async def patch_status(
        self,
        kind: str,
        namespace: str,
        name: str,
        changes: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> Resource: ...

    async def delete(
        self, kind: str, namespace: str, name: str, *, resource_version: str | None = None
    ) -> None: ...


# --- who writes ---------------------------------------------------------------------------------

_IDENTITY: contextvars.ContextVar[str] = contextvars.ContextVar("gpuyard_writer_identity", default="")

Verb = Literal["create", "update", "patch_status", "delete"]


def writer_identity() -> str:
    """The identity of the component making the current write ("" when none said who it is)."""
    return _IDENTITY.get()


@contextmanager
def acting_as(identity: str) -> Iterator[None]:
    """Writes made inside the block (and by tasks started inside it) carry `identity`."""
    token = _IDENTITY.set(identity)
    try:
        yield
    finally:
        _IDENTITY.reset(token)


class IdentifiedWriter:
    """A :class:`Writer` whose every write carries `identity` (see the module docstring). Other
    attributes are the wrapped writer's (read-only here)."""

    __slots__ = ("identity", "inner")

    def __init__(self, inner: Writer, identity: str) -> None:
        self.inner = inner
        self.identity = identity

    async def create(self, obj: R) -> R:
        with acting_as(self.identity):
            return await self.inner.create(obj)

    async def update(self, obj: R) -> R:
        with acting_as(self.identity):
            return await self.inner.update(obj)

    async def patch_status(
        self,
        kind: str,
        namespace: str,
        name: str,
        changes: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> Resource:
        with acting_as(self.identity):
            return await self.inner.patch_status(
                kind, namespace, name, changes, resource_version=resource_version
            )

    async def delete(
        self, kind: str, namespace: str, name: str, *, resource_version: str | None = None
    ) -> None:
        with acting_as(self.identity):
            await self.inner.delete(kind, namespace, name, resource_version=resource_version)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"IdentifiedWriter({self.inner!r}, {self.identity!r})"


def unidentified(writer: Writer) -> Writer:
    """The writer under an identity (`writer` itself when it carries none): what really writes."""
    return writer.inner if isinstance(writer, IdentifiedWriter) else writer


def identified(writer: Writer, identity: str) -> IdentifiedWriter:
    """`writer` with `identity` on every write (an identified writer is re-identified, not nested)."""
    if isinstance(writer, IdentifiedWriter):
        writer = writer.inner
    return IdentifiedWriter(writer, identity)


@dataclass(frozen=True, slots=True)
class WriteRecord:
    """One write as the store's writer saw it: who made it and what it touched.

    `parts`: for `create`, the object's top-level fields that are set (`metadata`, `spec`,
    `status`, or a kind's own top-level fields such as an Event's `reason`); for `update`, the
    top-level fields that changed (never `status`: a subresource); for `patch_status`, `status`
    and `status.<field>` for each field given; for `delete`, none.
    """

    identity: str
    verb: Verb
    kind: str
    namespace: str
    name: str
    parts: frozenset[str]


def _top_level(obj: Resource) -> dict[str, Any]:
    data = obj.model_dump(exclude={"kind", "api_version"}, exclude_defaults=True, by_alias=False)
    return {k: v for k, v in data.items() if v not in (None, {}, [])}


def _changed(old: Resource, new: Resource) -> frozenset[str]:
    a = old.model_dump(exclude={"kind", "api_version", "status"}, by_alias=False)
    b = new.model_dump(exclude={"kind", "api_version", "status"}, by_alias=False)
    for data in (a, b):  # what the server sets is nobody's write
        for key in ("resource_version", "generation", "uid", "creation_timestamp"):
            (data.get("metadata") or {}).pop(key, None)
    return frozenset(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


class Durability(Protocol):
    """A journal: `pending` writes not yet durable, `flush()` makes them durable."""

    @property
    def pending(self) -> int: ...

    def flush(self) -> None: ...


class _WithStatus(Protocol):
    """A model with a `status` field (checked with `"status" in type(obj).model_fields`)."""

    status: BaseModel


def patchable_status(current: Resource, changes: Mapping[str, Any]) -> BaseModel:
    """`current`'s status (the write path's `patch_status` target); ValueError when the kind has no
    status or `changes` names a field its status lacks. Shared by every backend's writer."""
    kind = current.kind
    if "status" not in type(current).model_fields:
        raise ValueError(f"{kind} has no status")
    status = cast(_WithStatus, current).status  # the model has a `status` field (checked above)
    unknown = set(changes) - set(type(status).model_fields)
    if unknown:
        raise ValueError(f"{kind}.status has no field {', '.join(sorted(unknown))}")
    return status


class StoreWriter:
    """API-server semantics over the in-memory store (the fake backend's write path)."""

    def __init__(self, store: Store, *, journal: Durability | None = None) -> None:
        self.store = store
        self.journal = journal
        self._flush: asyncio.Future[None] | None = None
        # every write that reached the store, with who made it (tests of the ownership table)
        self.audit: Callable[[WriteRecord], None] | None = None

    def _audited(self, verb: Verb, obj: Resource, parts: frozenset[str]) -> None:
        audit = self.audit
        if audit is not None:
            meta = obj.metadata
            audit(WriteRecord(writer_identity(), verb, obj.kind, meta.namespace, meta.name, parts))

    async def create(self, obj: R) -> R:
        stored = self.store.create(obj)
        if self.audit is not None:
            self._audited("create", stored, frozenset(_top_level(obj)))
        await self._durable(stored.kind)
        return stored

    async def update(self, obj: R) -> R:
        current = self.store.must_get(obj.kind, obj.metadata.namespace, obj.metadata.name)
        if obj.metadata.resource_version != current.metadata.resource_version:
            raise Conflict(
                f"{obj.kind} {_fmt(obj)}: resourceVersion {obj.metadata.resource_version or '<none>'} "
                f"is stale (current {current.metadata.resource_version})",
                key=(obj.kind, current.metadata.namespace, current.metadata.name),
            )
        if "status" in type(obj).model_fields:
            # status is a subresource; `current` is of the same kind, so it has the field too
            obj = obj.model_copy(update={"status": cast(_WithStatus, current).status})
        stored = self.store.update(obj)
        if self.audit is not None:
            self._audited("update", stored, _changed(current, stored))
        await self._durable(stored.kind)
        return stored

    async def patch_status(
        self,
        kind: str,
        namespace: str,
        name: str,
        changes: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> Resource:
        current = self.store.must_get(kind, namespace, name)
        if resource_version is not None and resource_version != current.metadata.resource_version:
            raise Conflict(
                f"{kind} {_fmt(current)}: resourceVersion {resource_version} is stale "
                f"(current {current.metadata.resource_version})",
                key=(kind, current.metadata.namespace, current.metadata.name),
            )
        status = patchable_status(current, changes)
        new = current.model_copy(update={"status": status.model_copy(update=dict(changes))})
        stored = self.store.update(new)
        if self.audit is not None:
            self._audited("patch_status", stored, frozenset({"status", *(f"status.{k}" for k in changes)}))
        await self._durable(kind)
        return stored

    async def delete(
        self, kind: str, namespace: str, name: str, *, resource_version: str | None = None
    ) -> None:
        gone = self.store.get(kind, namespace, name) if self.audit is not None else None
        self.store.delete(kind, namespace, name, resource_version=resource_version)
        if gone is not None:
            self._audited("delete", gone, frozenset())
        await self._durable(kind)

    async def _durable(self, kind: str) -> None:
        """Wait until the journal holds this write: one flush per loop iteration for all writers."""
        journal = self.journal
        if journal is None or not self.store.is_journaled(kind) or not journal.pending:
            return
        fut = self._flush
        if fut is None:
            loop = asyncio.get_running_loop()
            fut = self._flush = loop.create_future()
            loop.call_soon(self._group_commit, journal, fut)
        await asyncio.shield(fut)

    def _group_commit(self, journal: Durability, fut: asyncio.Future[None]) -> None:
        self._flush = None
        try:
            journal.flush()
        except Exception as exc:  # the writers waiting on it learn the write is not durable
            if not fut.done():
                fut.set_exception(exc)
            return
        if not fut.done():
            fut.set_result(None)


async def retry_on_conflict(
    write: Callable[[], Awaitable[T]], *, attempts: int = 5, on_missing: T | None = None
) -> T | None:
    """Run `write` (which re-reads the store and re-decides each time) until it does not conflict.

    Returns `on_missing` when the object is gone (:class:`NotFound`); re-raises the last
    :class:`Conflict` after `attempts` tries.
    """
    for attempt in range(attempts):
        try:
            return await write()
        except NotFound:
            return on_missing
        except Conflict:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0)
    raise AssertionError("unreachable")


async def write_together(writes: Iterable[Awaitable[T]]) -> list[T | BaseException]:
    """Issue several writes at once and wait for all: each result, or the exception it raised.

    The writes reach the store in the order given, one after another with nothing in between
    (each is a task whose first step is the store write), and share one journal commit instead
    of one each. Use it for a batch a reader must see whole: a multi-document submit, a policy
    file, a scenario's nodes.
    """
    return await asyncio.gather(*writes, return_exceptions=True)


async def create_all(writer: Writer, objects: Sequence[R]) -> list[R]:
    """Create every object or none: if any create is refused, the ones created are deleted
    again and the first error is raised."""
    results = await write_together(writer.create(obj) for obj in objects)
    done: list[R] = []
    errors: list[BaseException] = []
    for r in results:
        if isinstance(r, BaseException):
            errors.append(r)
        else:
            done.append(r)
    if not errors:
        return done
    for created in done:
        try:
            await writer.delete(created.kind, created.metadata.namespace, created.metadata.name)
        except NotFound:
            pass
    raise errors[0]


def _fmt(obj: Resource) -> str:
    ns = obj.metadata.namespace
    return f"{ns}/{obj.metadata.name}" if ns else obj.metadata.name
