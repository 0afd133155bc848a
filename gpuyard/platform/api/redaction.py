"""Read-time redaction (L4): a tenant never reads the names of another team's jobs.

Events and conditions are written once, for everyone: a preemption message says
`reclaimed by quota team-a (min 8) for team-a/big: ...` on the victim of team-b, and the
beneficiary's event lists its victims. When a caller without the admin role reads them, every
`namespace/name` whose namespace the caller may not see (and that the store knows as a
namespace: one holding jobs, PodGroups or events, so `3/4` or `nvidia.com/gpu` stay as they are)
is replaced by `a job of another team`.

:func:`make_redaction_middleware` applies this to every JSON answer of the API (all string
values; keys stay), so lists, job conditions, PodGroup explanations and event lists are covered
alike; the watch stream calls :func:`redact_object` per event.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from gpuyard.apis.jobkinds import KIND_INFO
from gpuyard.platform.api.auth import PRINCIPAL, Principal
from gpuyard.state.store import Store

__all__ = ["FOREIGN_JOB", "Redactor", "make_redaction_middleware", "redact_object"]

FOREIGN_JOB = "a job of another team"

# `ns/name` not inside a longer token: no word character, dot, slash or dash just before it
# (so `nvidia.com/gpu` and `/api/v1/...` are not split); a DNS-1123 namespace and object name.
_REFERENCE = re.compile(r"(?<![\w./-])([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)/([a-z0-9](?:[-a-z0-9.]*[a-z0-9])?)")
_NAMESPACED_KINDS = (*KIND_INFO, "PodGroup", "Pod", "Event")


class Redactor:
    """Replaces references to objects of namespaces outside `visible` in text and JSON values."""

    def __init__(self, foreign: frozenset[str]) -> None:
        self.foreign = foreign

    @classmethod
    def for_principal(cls, store: Store, who: Principal) -> Redactor | None:
        """The redactor for `who`, or None when it sees every namespace (nothing to hide)."""
        if who.role == "admin" or "*" in who.namespaces:
            return None
        return cls(known_namespaces(store) - who.namespaces)

    def text(self, value: str) -> str:
        if "/" not in value or not self.foreign:
            return value

        def replace(m: re.Match[str]) -> str:
            return FOREIGN_JOB if m.group(1) in self.foreign else m.group(0)

        return _REFERENCE.sub(replace, value)

    def value(self, data: Any) -> Any:
        """`data` (decoded JSON) with every string value redacted; dict keys are kept."""
        if isinstance(data, str):
            return self.text(data)
        if isinstance(data, dict):
            return {k: self.value(v) for k, v in data.items()}
        if isinstance(data, list):
            return [self.value(v) for v in data]
        return data


_CACHE: dict[int, tuple[int, frozenset[str]]] = {}


def known_namespaces(store: Store) -> frozenset[str]:
    """Namespaces holding jobs, PodGroups, pods or events (cached per store version)."""
    cached = _CACHE.get(id(store))
    if cached is not None and cached[0] == store.resource_version:
        return cached[1]
    kinds = set(store.kinds())
    found = frozenset(
        obj.metadata.namespace
        for kind in _NAMESPACED_KINDS
        if kind in kinds
        for obj in store.list(kind)
        if obj.metadata.namespace
    )
    _CACHE.clear()  # one store per process in practice; tests make many
    _CACHE[id(store)] = (store.resource_version, found)
    return found


def redact_object(store: Store, who: Principal, data: dict[str, Any]) -> dict[str, Any]:
    """`data` as `who` may read it."""
    redactor = Redactor.for_principal(store, who)
    return data if redactor is None else redactor.value(data)


def make_redaction_middleware(store_of: Callable[[web.Request], Store]) -> Middleware:
    """Redact the JSON answers of callers who do not see every namespace."""

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
        redactor = Redactor.for_principal(store_of(request), who)
        if redactor is None or not redactor.foreign or b"/" not in response.body:
            return response
        data = json.loads(response.body)
        response.body = json.dumps(redactor.value(data)).encode()
        return response

    return redaction_middleware
