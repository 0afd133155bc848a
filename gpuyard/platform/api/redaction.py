"""Read-time redaction (L4): a tenant never reads the names of another team's jobs.

Events and conditions are written once, for everyone: a preemption message says
`reclaimed by quota team-a (min 8) for team-a/big: ...` on the victim of team-b, and the
beneficiary's event lists its victims. When a caller without the admin role reads them, every
`namespace/name` whose namespace the caller may not see (and that the store knows as a
namespace: one holding jobs, PodGroups or events, so `3/4` or `nvidia.com/gpu` stay as they are)
is replaced by `a job of another team`.

:func:`make_redaction_middleware` applies this to every JSON answer of the API, so lists, job
conditions, PodGroup explanations and event lists are covered alike; the watch stream calls
:func:`redact_object` per event. The namespaces the store knows are kept by a
:class:`NamespaceIndex`, which the app runs while it serves (a watch, so a request costs no scan).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from gpuyard.apis.jobkinds import KIND_INFO
from gpuyard.platform.api.auth import PRINCIPAL, Principal
from gpuyard.state.store import Gone, Store

__all__ = ["FOREIGN_JOB", "NamespaceIndex", "Redactor", "make_redaction_middleware", "redact_object"]

FOREIGN_JOB = "a job of another team"

# `ns/name` not inside a longer token: no word character, dot, slash or dash just before it
# (so `nvidia.com/gpu` and `/api/v1/...` are not split); a DNS-1123 namespace and object name.
_REFERENCE = re.compile(r"(?<![\w./-])([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)/([a-z0-9](?:[-a-z0-9.]*[a-z0-9])?)")
_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?")
_NAMESPACED_KINDS = (*KIND_INFO, "PodGroup", "Pod", "Event")


def _is_label_char(c: str) -> bool:
    return c == "-" or ("a" <= c <= "z") or ("0" <= c <= "9")


def _joins(c: str) -> bool:
    """A character that makes `ns/` part of a longer token (`nvidia.com/gpu`, `/api/v1/x`, `X_a/b`)."""
    return c.isalnum() or c in "_./-"


class NamespaceIndex:
    """The namespaces the store knows (of jobs, PodGroups, pods, events), kept current by a watch.

    :meth:`run` (started with the app) scans once, then adds the namespace of every object the
    store reports; a namespace is never removed (redacting a namespace that is gone is harmless).
    Before it runs, :meth:`known` scans on demand, cached per store version.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._known: set[str] = set()
        self._watching = False
        self._scanned_at = -1

    def _kinds(self) -> list[str]:
        registered = set(self.store.kinds())
        return [k for k in _NAMESPACED_KINDS if k in registered]

    def _scan(self) -> None:
        for kind in self._kinds():
            self._known.update(o.metadata.namespace for o in self.store.list(kind) if o.metadata.namespace)
        self._scanned_at = self.store.resource_version

    def known(self) -> frozenset[str]:
        if not self._watching and self._scanned_at != self.store.resource_version:
            self._scan()
        return frozenset(self._known)

    async def run(self) -> None:
        while True:
            since = self.store.resource_version
            self._scan()
            self._watching = True
            try:
                async for event in self.store.watch(self._kinds(), since=since):
                    if event.object.metadata.namespace:
                        self._known.add(event.object.metadata.namespace)
                return  # the store closed
            except Gone:  # fell behind: scan again
                continue
            finally:
                self._watching = False


class Redactor:
    """Replaces references to objects of namespaces outside `visible` in text and JSON values."""

    def __init__(self, foreign: frozenset[str]) -> None:
        self.foreign = foreign

    @classmethod
    def for_principal(cls, namespaces: NamespaceIndex, who: Principal) -> Redactor | None:
        """The redactor for `who`, or None when it sees every namespace (nothing to hide)."""
        if who.role == "admin" or "*" in who.namespaces:
            return None
        return cls(namespaces.known() - who.namespaces)

    def text(self, value: str) -> str:
        """`value` with each `ns/name` of a foreign namespace replaced.

        The same matches as :data:`_REFERENCE` (a test holds them equal), found from each `/`
        outwards instead of by a regex tried at every position: about fifty times faster on a
        list page, which is mostly text without references."""
        if not self.foreign:
            return value
        out: list[str] = []
        start = 0
        slash = value.find("/")
        while slash != -1:
            begin = slash
            while begin > 0 and _is_label_char(value[begin - 1]):
                begin -= 1
            namespace = value[begin:slash]
            if namespace in self.foreign and (begin == 0 or not _joins(value[begin - 1])):
                name = _NAME.match(value, slash + 1)
                if name is not None:
                    out += [value[start:begin], FOREIGN_JOB]
                    start = name.end()
                    slash = value.find("/", start)
                    continue
            slash = value.find("/", slash + 1)
        if not out:
            return value
        out.append(value[start:])
        return "".join(out)

    def value(self, data: Any) -> Any:
        """`data` (decoded JSON) with every string value redacted; dict keys are kept."""
        if isinstance(data, str):
            return self.text(data)
        if isinstance(data, dict):
            return {k: self.value(v) for k, v in data.items()}
        if isinstance(data, list):
            return [self.value(v) for v in data]
        return data


def redact_object(namespaces: NamespaceIndex, who: Principal, data: dict[str, Any]) -> dict[str, Any]:
    """`data` as `who` may read it."""
    redactor = Redactor.for_principal(namespaces, who)
    return data if redactor is None else redactor.value(data)


def make_redaction_middleware(index_of: Callable[[web.Request], NamespaceIndex]) -> Middleware:
    """Redact the JSON answers of callers who do not see every namespace.

    The serialised body is rewritten in place: a reference matches only `[a-z0-9.-]` characters
    and the replacement has no character JSON escapes, so the document stays valid JSON; this
    is several times cheaper than decoding and walking it."""

    @web.middleware
    async def redaction_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        who = request.get(PRINCIPAL)
        if (
            who is None
            or not isinstance(response, web.Response)
            or response.content_type != "application/json"
            or not isinstance(response.body, bytes)
        ):
            return response
        redactor = Redactor.for_principal(index_of(request), who)
        if redactor is None or not redactor.foreign or b"/" not in response.body:
            return response
        response.body = redactor.text(response.body.decode()).encode()
        return response

    return redaction_middleware
