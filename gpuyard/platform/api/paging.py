"""List pagination (`limit`, `continue`) and the common list filters, Kubernetes style.

A list is ordered by (namespace, name); the continue token is an opaque, URL-safe encoding of
the last key returned, so a page boundary stays correct while objects come and go. Every list
route pages by default (`limit` 500, at most 5000).

A token is signed: HMAC-SHA256 over the list's path, the time it was issued and the key, with
`server.continue_key` (replicas behind one address share it) or else a random key of this
process. A token that does not decode, whose signature does not match (forged, changed, from
another list or another server) or that is older than `server.continue_ttl_seconds` is a 400
naming `continue`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import hmac
import itertools
import json
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from aiohttp import web

from gpuyard.apis.meta import Resource
from gpuyard.platform.api.app import CTX
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.openapi import Param

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "PAGING",
    "event_order",
    "list_body",
    "paginate",
    "paginate_in_order",
    "parse_limit",
]

T = TypeVar("T")
R = TypeVar("R", bound=Resource)
DEFAULT_LIMIT = 500
MAX_LIMIT = 5000

# The query parameters of every list route, bounded as the handler bounds them. A route that
# declares them is documented with 400 (a `continue` token this server did not give out) and
# 422 (a `limit` out of range).
PAGING = [
    Param(
        "limit",
        type="integer",
        minimum=1,
        maximum=MAX_LIMIT,
        default=DEFAULT_LIMIT,
        description=f"Page size (1..{MAX_LIMIT}, default {DEFAULT_LIMIT}).",
    ),
    Param("continue", description="The token `metadata.continue` of the previous page."),
]


_PROCESS_KEY = secrets.token_bytes(32)  # without server.continue_key: tokens of this process only


def _key(request: web.Request) -> tuple[bytes, float]:
    server = request.app[CTX].settings.server
    key = server.continue_key.encode() if server.continue_key else _PROCESS_KEY
    return key, server.continue_ttl_seconds


def _sign(key: bytes, path: str, payload: bytes) -> str:
    mac = hmac.new(key, path.encode() + b"\0" + payload, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac[:24]).decode()


def _encode(request: web.Request, after: tuple[str, str]) -> str:
    key, _ = _key(request)
    payload = json.dumps([after[0], after[1], int(time.time())], separators=(",", ":")).encode()
    body = base64.urlsafe_b64encode(payload).decode().rstrip("=")
    return f"{body}.{_sign(key, request.path, payload)}"


def _invalid(reason: str) -> ApiError:
    return ApiError(
        400, f"invalid continue token: {reason}", details=[{"field": "continue", "reason": reason}]
    )


def _decode(request: web.Request, token: str) -> tuple[str, str]:
    key, ttl = _key(request)
    body, _, signature = token.partition(".")
    try:
        payload = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        ns, name, issued = json.loads(payload)
        if not isinstance(ns, str) or not isinstance(name, str) or type(issued) is not int:
            raise ValueError
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError):
        raise _invalid("not a token of this list; use the token from the previous page") from None
    if not hmac.compare_digest(signature.encode(), _sign(key, request.path, payload).encode()):
        raise _invalid("the signature does not match: use the token from the previous page of this list")
    age = time.time() - issued
    if age > ttl or age < -60:
        raise _invalid(f"the token expired (valid {ttl:g} s, server.continue_ttl_seconds): list again")
    return ns, name


def event_order(event: Any) -> tuple[str, str]:
    """Events page oldest first: by resourceVersion (zero-padded, so strings sort as numbers)."""
    return ("", f"{int(event.metadata.resource_version or 0):020d}")


def parse_limit(request: web.Request) -> int:
    raw = request.query.get("limit")
    if raw is None:
        return DEFAULT_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIMIT:
        raise ApiError(
            422,
            f"limit must be an integer from 1 to {MAX_LIMIT}",
            details=[{"field": "limit", "reason": f"1..{MAX_LIMIT}"}],
        )
    return limit


def paginate(
    request: web.Request, items: Sequence[T] | Iterable[T], *, key: Any = None
) -> tuple[list[T], str | None]:
    """The page of `items` the request asks for, in key order ((namespace, name) by default), and
    the next token. A sequence must be sorted already; any other iterable may come in any order:
    the page is then picked with a heap of `limit` items (a page of 100 of 100,000 jobs costs one
    pass, not a sort of them all)."""
    limit = parse_limit(request)
    keyf = key or (lambda o: (o.metadata.namespace, o.metadata.name))
    token = request.query.get("continue")
    after = _decode(request, token) if token else None
    if not isinstance(items, Sequence):
        if after is not None:
            items = (o for o in items if keyf(o) > after)
        picked = heapq.nsmallest(limit + 1, items, key=keyf)
        page = picked[:limit]
        return page, (_encode(request, keyf(page[-1])) if len(picked) > limit else None)
    start = 0
    if after is not None:
        lo, hi = 0, len(items)
        while lo < hi:  # first item with key > after
            mid = (lo + hi) // 2
            if keyf(items[mid]) <= after:
                lo = mid + 1
            else:
                hi = mid
        start = lo
    page = list(items[start : start + limit])
    more = start + limit < len(items)
    return page, (_encode(request, keyf(page[-1])) if more and page else None)


def paginate_in_order(
    request: web.Request, items_after: Callable[[tuple[str, str] | None], Iterable[R]]
) -> tuple[list[R], str | None]:
    """The page the request asks for, of items that `items_after(after)` gives already in
    (namespace, name) order from the first key above `after` (None: from the start), lazily: only
    the page and one more item are read, so a page costs the same however long the list is."""
    limit = parse_limit(request)
    token = request.query.get("continue")
    after = _decode(request, token) if token else None
    picked = list(itertools.islice(items_after(after), limit + 1))
    page = picked[:limit]
    last = page[-1].metadata if page else None
    return page, (_encode(request, (last.namespace, last.name)) if len(picked) > limit and last else None)


def list_body(
    items: list[dict[str, Any]], *, next_token: str | None, resource_version: int
) -> dict[str, Any]:
    return {"items": items, "metadata": {"continue": next_token, "resourceVersion": str(resource_version)}}
