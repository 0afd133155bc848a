"""Request bodies of the write routes: who may send one, how large, of which type, read how.

Cheap refusals come first. :func:`make_body_guard_middleware` runs after authentication and,
for every write (any method but GET, HEAD, OPTIONS), *before a byte of the body is read*:

1. the role the route needs (:data:`ROUTES`: `admin`, or `write`, which a viewer lacks) and,
   where the path names a namespace (`{ns}`), access to it: else 403;
2. a body must have a content type the route takes (:data:`DOCUMENT_TYPES`, the merge patch's
   for `PATCH`): else 415 naming `Content-Type`;
3. a `Content-Length` over the route's limit is a 413 naming the setting: `server.max_body_bytes`
   (4 MiB) for the bulk writes `POST /api/v1/jobs` and `POST /api/v1/apply`,
   `server.max_object_body_bytes` (1 MiB) for every other write. A chunked body is cut off at the
   same limit while it is read.

Handlers then read the body with :func:`read_text` (within `server.body_timeout_seconds`, else
408) and decode it with :func:`off_loop`, never on the event loop, in one of two places:

* a body over :data:`PROCESS_AFTER_BYTES` (256 KiB) in a worker process
  (:mod:`gpuyard.platform.api.decoders`, :data:`~gpuyard.platform.api.decoders.DECODE_PROCESSES`
  of them): a parse there never holds the server's interpreter lock, which a thread of the server
  parsing a 4 MiB body does for most of the parse, making the event loop wait for it again and
  again. The worker applies the same function (limits, job validation) and sends back the
  decoded value or the same error. The pool starts with the first such body (or a
  `Content-Length` announcing one) in the background; until a worker is up, and for a call that
  does not pickle, the body is decoded in a thread as below;
* a smaller body in a small pool of threads of the server (:data:`DECODE_THREADS`), which is
  cheaper than a round trip to another process.

Either way an answer that takes longer than `server.decode_timeout_seconds` (waiting for a free
worker included) is a 422 naming that limit, and a worker still decoding then is killed and
replaced, so the body burns no more CPU (`apis.decoding` bounds the work itself: nodes, depth,
aliases, merge keys, integers). A worker that ends while decoding (killed from outside, out of
memory) is a 500 and is replaced.

Memory: after a body over :data:`TRIM_AFTER_BYTES`, freed heap pages are given back to the system
(glibc's `malloc_trim`, at most once a second, and again a second later: :func:`return_memory`),
by the decoding thread, or by the worker process in its own heap.
"""

from __future__ import annotations

import asyncio
import codecs
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from gpuyard.platform.api import decoders
from gpuyard.platform.api.auth import Action, principal_of
from gpuyard.platform.api.errors import ApiError, error_response
from gpuyard.state.config import ServerConfig

__all__ = [
    "DOCUMENT_TYPES",
    "PATCH_TYPES",
    "PROCESS_AFTER_BYTES",
    "ROUTES",
    "RoutePolicy",
    "body_limit",
    "make_body_guard_middleware",
    "off_loop",
    "read_text",
]

T = TypeVar("T")

DOCUMENT_TYPES = ("application/json", "application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
"""The content types of a YAML or JSON body (`kubectl` sends `application/json` or `application/yaml`)."""
PATCH_TYPES = ("application/merge-patch+json", "application/json")
READ_METHODS = ("GET", "HEAD", "OPTIONS")
BULK_LIMIT = "server.max_body_bytes"
OBJECT_LIMIT = "server.max_object_body_bytes"


@dataclass(frozen=True, slots=True)
class RoutePolicy:
    """What a write route needs before its body is read."""

    action: Action = "write"
    bulk: bool = False  # the body limit: server.max_body_bytes (bulk) or server.max_object_body_bytes
    content_types: tuple[str, ...] = DOCUMENT_TYPES  # () = the route reads no body

    @property
    def limit_name(self) -> str:
        return BULK_LIMIT if self.bulk else OBJECT_LIMIT


_ADMIN = RoutePolicy(action="admin")
_ADMIN_NO_BODY = RoutePolicy(action="admin", content_types=())
ROUTES: dict[tuple[str, str], RoutePolicy] = {
    ("POST", "/api/v1/jobs"): RoutePolicy(action="write", bulk=True),
    ("POST", "/api/v1/apply"): RoutePolicy(action="admin", bulk=True),
    ("PATCH", "/api/v1/namespaces/{ns}/jobs/{name}"): RoutePolicy(action="write", content_types=PATCH_TYPES),
    ("PUT", "/api/v1/namespaces/{ns}/jobs/{name}"): RoutePolicy(action="write", content_types=()),
    ("DELETE", "/api/v1/namespaces/{ns}/jobs/{name}"): RoutePolicy(action="write", content_types=()),
    ("PUT", "/api/v1/quotas/{name}"): _ADMIN,
    ("DELETE", "/api/v1/quotas/{name}"): _ADMIN_NO_BODY,
    ("PUT", "/api/v1/queues/{name}"): _ADMIN,
    ("DELETE", "/api/v1/queues/{name}"): _ADMIN_NO_BODY,
    ("PUT", "/api/v1/namespaces/{ns}/resourcequotas/{name}"): _ADMIN,
    ("DELETE", "/api/v1/namespaces/{ns}/resourcequotas/{name}"): _ADMIN_NO_BODY,
    ("PUT", "/api/v1/resourceclasses/{name}"): _ADMIN,
    ("DELETE", "/api/v1/resourceclasses/{name}"): _ADMIN_NO_BODY,
    ("PUT", "/api/v1/nodetopologies/{name}"): _ADMIN,
    ("DELETE", "/api/v1/nodetopologies/{name}"): _ADMIN_NO_BODY,
    ("POST", "/api/v1/scheduler:reschedule"): _ADMIN_NO_BODY,
    ("POST", "/api/v1/fake/nodes/{name}:{action}"): _ADMIN_NO_BODY,
    ("POST", "/api/v1/fake/nodes/{name}/gpus/{idx}:{action}"): _ADMIN_NO_BODY,
    ("POST", "/api/v1/fake/pods/{ns}/{name}:{action}"): _ADMIN_NO_BODY,
    ("POST", "/api/v1/fake/pods:{action}"): _ADMIN_NO_BODY,
}
"""Every write route by (method, path pattern); a route missing here needs the `write` role and
takes a YAML or JSON body of at most `server.max_object_body_bytes` (a test keeps the table
complete)."""
DEFAULT_POLICY = RoutePolicy()

_LIMIT: web.RequestKey[tuple[int, str]] = web.RequestKey("body_limit", tuple)
_DEFAULT_LIMIT = (ServerConfig().max_object_body_bytes, OBJECT_LIMIT)


def policy_of(request: web.Request) -> RoutePolicy | None:
    """The route's policy (None for a read, or a path that matched no route: a 404/405 follows)."""
    if request.method in READ_METHODS:
        return None
    resource = request.match_info.route.resource
    if resource is None:
        return None
    return ROUTES.get((request.method, resource.canonical), DEFAULT_POLICY)


def _refuse_role(request: web.Request, policy: RoutePolicy) -> None:
    who = principal_of(request)
    if who.role == "admin":
        return
    if policy.action == "admin":
        raise ApiError(
            403,
            f"user {who.user} ({who.role}) may not {request.method} {request.path}; it needs the admin role",
        )
    if who.role != "user":
        raise ApiError(
            403, f"user {who.user} is a {who.role} and may only read; {request.method} needs the user role"
        )
    ns = request.match_info.get("ns")
    if ns is not None and not who.sees(ns):
        raise ApiError(403, f"user {who.user} has no access to namespace {ns}")
    if not who.namespaces:
        raise ApiError(403, f"user {who.user} has no namespace to write in")


def _refuse_type(request: web.Request, policy: RoutePolicy) -> None:
    if not policy.content_types or not request.body_exists:
        return
    if request.content_type not in policy.content_types:
        sent = request.headers.get("Content-Type")
        what = f"unsupported content type {request.content_type!r}" if sent else "no content type"
        allowed = ", ".join(policy.content_types)
        raise ApiError(
            415,
            f"{what} for {request.method} {request.path}; allowed: {allowed}",
            details=[{"field": "Content-Type", "reason": f"allowed: {allowed}"}],
        )


def _too_large(limit: int, name: str) -> ApiError:
    return ApiError(
        413,
        f"request body too large; the limit of this route is {limit} bytes ({name})",
        details=[{"field": "<body>", "reason": f"at most {limit} bytes ({name})"}],
    )


def make_body_guard_middleware(server: ServerConfig) -> Middleware:
    """The checks of the module docstring, in that order, before the handler reads the body."""

    @web.middleware
    async def body_guard_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        policy = policy_of(request)
        if policy is None:
            return await handler(request)
        try:
            _refuse_role(request, policy)
            _refuse_type(request, policy)
            limit = server.max_body_bytes if policy.bulk else server.max_object_body_bytes
            if request.content_length is not None and request.content_length > limit:
                raise _too_large(limit, policy.limit_name)
        except ApiError as exc:
            response = error_response(exc.status, exc.message, exc.details)
            if request.body_exists:  # the body is not read: close rather than read it to the end
                response.force_close()
            return response
        if policy.content_types and (request.content_length or 0) > PROCESS_AFTER_BYTES:
            await _warm_decoders()  # the workers start while the body arrives
        bounded = request.clone(client_max_size=limit)
        bounded[_LIMIT] = (limit, policy.limit_name)
        return await handler(bounded)

    return body_guard_middleware


def body_limit(request: web.Request) -> tuple[int, str]:
    """The route's body limit in bytes and the setting that sets it."""
    return request[_LIMIT] if _LIMIT in request else _DEFAULT_LIMIT


async def read_text(request: web.Request, *, timeout_s: float) -> str:
    """The body as UTF-8 text, read within `timeout_s` (408) and the route's limit (413),
    decoded chunk by chunk as it arrives: no step of a 4 MiB body holds the loop for the whole
    body (reading it whole, then decoding it, copied it twice more in two long steps)."""
    limit, name = body_limit(request)
    decoder = codecs.getincrementaldecoder("utf-8")()
    parts: list[str] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            while chunk := await request.content.readany():
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit, name)
                parts.append(decoder.decode(chunk))  # a chunk at a time, as it arrives
        parts.append(decoder.decode(b"", final=True))
    except TimeoutError:
        raise ApiError(
            408,
            f"the request body did not arrive within {timeout_s:g} s (server.body_timeout_seconds)",
            details=[{"field": "<body>", "reason": f"sent within {timeout_s:g} s"}],
        ) from None
    except UnicodeDecodeError:
        raise ApiError(400, "the body is not UTF-8 text; send YAML or JSON") from None
    return "".join(parts)


_POOL: ThreadPoolExecutor | None = None
DECODE_THREADS = 2  # the event loop keeps the interpreter's lock most of the time


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=DECODE_THREADS, thread_name_prefix="decode")
    return _POOL


TRIM_AFTER_BYTES = 256 * 1024
_TRIM_LOCK = threading.Lock()
_last_trim = 0.0


_LIBC = decoders.malloc_trim_libc()


def return_memory() -> None:
    """Give freed heap pages back to the system (glibc `malloc_trim`; nothing elsewhere)."""
    global _last_trim
    if _LIBC is None or not _TRIM_LOCK.acquire(blocking=False):
        return
    try:
        now = time.monotonic()
        if now - _last_trim >= 1.0:
            _last_trim = now
            _LIBC.malloc_trim(0)
    finally:
        _TRIM_LOCK.release()


_trim_later: asyncio.TimerHandle | None = None


def _trim_now() -> None:
    global _last_trim
    _last_trim = 0.0
    return_memory()


def _decode_then_trim(call: Callable[[], T], size: int) -> T:
    try:
        return call()
    finally:
        if size > TRIM_AFTER_BYTES:
            return_memory()


PROCESS_AFTER_BYTES = 256 * 1024
"""A body longer than this (in characters) is decoded in a worker process (`decoders`)."""


async def _warm_decoders() -> decoders.DecoderPool | None:
    if decoders.DECODE_PROCESSES <= 0:
        return None
    pool = await decoders.decoder_pool(decoders.DECODE_PROCESSES)
    pool.warm()
    return pool


def _overran(timeout_s: float) -> ApiError:
    return ApiError(
        422,
        f"the body took more than {timeout_s:g} s to decode and check (server.decode_timeout_seconds)",
        details=[{"field": "<body>", "reason": f"decoding time: at most {timeout_s:g} s"}],
    )


async def off_loop(fn: Callable[..., T], /, *args: object, timeout_s: float, **kwargs: object) -> T:
    """`fn(*args, **kwargs)` off the event loop: in a worker process when `args[0]` (the body) is
    over :data:`PROCESS_AFTER_BYTES` and a worker is up, else in a decoding thread; a 422 naming
    the limit after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    size = len(args[0]) if args and isinstance(args[0], str | bytes) else 0
    if size > TRIM_AFTER_BYTES:  # once the burst's buffers are freed too: trim again a second later
        global _trim_later
        if _trim_later is not None:
            _trim_later.cancel()
        _trim_later = loop.call_later(1.0, lambda: loop.run_in_executor(_pool(), _trim_now))
    try:
        if size > PROCESS_AFTER_BYTES:
            workers = await _warm_decoders()
            if workers is not None and workers.ready:
                try:
                    result: T = await workers.run(fn, args, kwargs, deadline=deadline)
                    return result
                except decoders.NotPortable:
                    pass  # decoded in a thread below
                except decoders.WorkerLost as exc:
                    raise ApiError(
                        500,
                        f"the process decoding the body ended before it answered ({exc}); nothing was stored",
                    ) from None
        future = loop.run_in_executor(
            _pool(), _decode_then_trim, functools.partial(fn, *args, **kwargs), size
        )
        try:
            async with asyncio.timeout_at(deadline):
                return await future
        finally:
            del future  # it holds a refusal whose traceback holds this frame: no cycle (decoders.run)
    except TimeoutError:
        raise _overran(timeout_s) from None
