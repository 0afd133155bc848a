"""Builds the aiohttp application: error, redaction (other teams' job names) and auth middleware,
health, metrics, and the API routes.

State shared with handlers is stored under typed `web.AppKey`s (`CTX`, `READY`). Handlers read
the store (`stored`) and write only through the context's writer (`writer_of`, `delete_object`),
which answers once the write is durable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST

from gpuyard.apis.decoding import DocumentLimitError
from gpuyard.apis.meta import Resource
from gpuyard.platform.api.auth import METRICS_ROLES, make_auth_middleware, principal_of
from gpuyard.platform.api.bodies import make_body_guard_middleware
from gpuyard.platform.api.errors import ApiError, cluster_refusal, error_response
from gpuyard.platform.api.middleware_metrics import make_metrics_middleware
from gpuyard.platform.api.ratelimit import make_rate_limit_middleware
from gpuyard.platform.api.redaction import NamespaceIndex, make_redaction_middleware
from gpuyard.platform.metrics import exposition
from gpuyard.state.backend import BackendError
from gpuyard.state.context import Context
from gpuyard.state.ownership import USER
from gpuyard.state.store import AlreadyExists, Conflict, NotFound
from gpuyard.state.writing import Writer, identified

__all__ = ["CTX", "NAMESPACES", "READY", "delete_object", "make_app", "stored", "writer_of"]

log = structlog.get_logger(__name__)

CTX: web.AppKey[Context] = web.AppKey("ctx", Context)
READY = web.AppKey[Callable[[], bool]]("ready")  # a callable is not a class: the type goes in [...]
NAMESPACES: web.AppKey[NamespaceIndex] = web.AppKey("namespaces", NamespaceIndex)

# Each module exposes `setup(app: web.Application) -> None` adding its routes.
ROUTE_MODULES: list[str] = [
    "gpuyard.platform.api.cluster",
    "gpuyard.platform.api.fake",
    "gpuyard.platform.api.jobs",
    "gpuyard.platform.api.scheduling",
    "gpuyard.platform.api.watching",
    "gpuyard.platform.api.openapi",
    "gpuyard.platform.api.dashboard",
    "gpuyard.platform.api.nodes",
    "gpuyard.platform.api.quotas",
    "gpuyard.platform.api.applying",
    "gpuyard.platform.api.disruption",
    "gpuyard.platform.api.priorityclasses",
    "gpuyard.platform.api.crons",
    "gpuyard.platform.api.rescheduling",
    "gpuyard.platform.api.checking",
    "gpuyard.platform.api.topologies",
    "gpuyard.platform.api.pods",
]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.message, exc.details)
    except web.HTTPRequestEntityTooLarge:  # a body read past the app's limit outside `bodies.read_text`
        limit = request.app[CTX].settings.server.max_body_bytes
        return error_response(
            413, f"request body too large; the limit is {limit} bytes (server.max_body_bytes)"
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = error_response(exc.status, exc.reason)
        if "Allow" in exc.headers:  # a 405 says which methods the path has (RFC 9110)
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    except DocumentLimitError as exc:
        return error_response(exc.status, exc.message, exc.details)
    except BackendError as exc:  # the cluster refused or did not take a write
        log.warning("http.write_failed", path=request.path, method=request.method, error=str(exc))
        refused = cluster_refusal(exc)
        return error_response(refused.status, refused.message, refused.details)
    except AlreadyExists as exc:  # a create whose name was taken after the handler looked (the cache lags)
        return error_response(409, f"{exc}; it was created meanwhile: read it and try again")
    except json.JSONDecodeError as exc:
        return error_response(400, f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")
    except Exception:
        log.exception("http.unhandled", path=request.path, method=request.method)
        return error_response(500, "internal error; see the server log")


READ_METHODS = ("GET", "HEAD", "OPTIONS")


@web.middleware
async def read_only_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """`server.read_only`: every write through the API is refused (after authentication)."""
    if request.method not in READ_METHODS:
        return error_response(
            403,
            f"{request.method} {request.path}: this gpuyard serves a read-only API (server.read_only: "
            "true); create and change objects with kubectl",
            [{"field": "server.read_only", "reason": "true: the API takes no writes"}],
        )
    return await handler(request)


def stored(
    request: web.Request, kind: str, namespace: str, name: str, *, what: str, field: str | None = None
) -> Resource:
    """The stored object, or a 404 naming `what` (e.g. "queue team-a") and, if given, the path `field`."""
    obj = request.app[CTX].store.get(kind, namespace, name)
    if obj is None:
        details = [{"field": field, "reason": f"no such {kind.lower()}"}] if field else []
        raise ApiError(404, f"{what} not found", details=details)
    return obj


def writer_of(ctx: Context) -> Writer:
    """The one write path (the backend's writer), writing as the users it serves (`USER`);
    handlers never write the store themselves."""
    assert ctx.writer is not None, "Context always has a writer"
    return identified(ctx.writer, USER)


T = TypeVar("T")
WRITE_ATTEMPTS = 5


async def decided_again(
    write: Callable[[], Awaitable[T]], *, attempts: int = WRITE_ATTEMPTS, note: str = ""
) -> T:
    """Run `write` (which reads the store afresh each time) until it does not conflict: a write
    without the caller's resourceVersion that raced another writer (the scheduler's status; on
    Kubernetes the API server's 409) is decided again on the fresher object, as the API server
    does for a merge patch. The last :class:`Conflict` is a 409 (`note` added to its message)."""
    for attempt in range(attempts):
        try:
            return await write()
        except Conflict as exc:
            if attempt == attempts - 1:
                raise ApiError(409, f"{exc}{note}") from None
            await asyncio.sleep(0.01 * (attempt + 1))
    raise AssertionError("unreachable: attempts >= 1")


async def delete_object(ctx: Context, kind: str, namespace: str, name: str, *, what: str) -> None:
    """Delete through the writer (answered once the journal holds it); 404 naming `what`."""
    try:
        await writer_of(ctx).delete(kind, namespace, name)
    except NotFound:
        raise ApiError(404, f"{what} not found") from None


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    if request.app[READY]():
        return web.json_response({"status": "ready"})
    return error_response(503, "not ready: the cluster backend has not synced yet")


async def metrics(request: web.Request) -> web.Response:
    """Prometheus' exposition; per-tenant series only for admin and metrics principals (`auth`)."""
    detail = principal_of(request).role in METRICS_ROLES
    body = exposition(request.app[CTX].registry, tenant_detail=detail)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _index_namespaces(app: web.Application) -> AsyncIterator[None]:
    """Keep the namespace index (for redaction) current while the app serves."""
    task = asyncio.create_task(app[NAMESPACES].run(), name="namespace-index")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def make_app(ctx: Context, *, ready: Callable[[], bool] = lambda: True) -> web.Application:
    """The application for `ctx`; routes of every module in `ROUTE_MODULES` are added."""
    import importlib

    server = ctx.settings.server
    limits = [make_rate_limit_middleware(server.rate_limit)] if server.rate_limit is not None else []
    app = web.Application(
        middlewares=[
            make_metrics_middleware(ctx.registry),
            error_middleware,
            *limits,
            make_redaction_middleware(lambda request: request.app[NAMESPACES]),
            make_auth_middleware(server.tokens, metrics_public=server.metrics_public),
            *([read_only_middleware] if server.read_only else []),
            make_body_guard_middleware(server),  # role, content type and size before the body is read
        ],
        client_max_size=max(server.max_body_bytes, server.max_object_body_bytes),  # each route: `bodies`
    )
    app[CTX] = ctx
    app[READY] = ready
    app[NAMESPACES] = NamespaceIndex(ctx.store)
    app.cleanup_ctx.append(_index_namespaces)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    for name in ROUTE_MODULES:
        importlib.import_module(name).setup(app)
    return app
