"""Builds the aiohttp application: error middleware, health, metrics, and the API routes.

State shared with handlers is stored under typed `web.AppKey`s (`CTX`, `READY`). Handlers read
the store (`stored`) and write only through the context's writer (`writer_of`, `delete_object`),
which answers once the write is durable.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpuyard.apis.decoding import DocumentLimitError
from gpuyard.apis.meta import Resource
from gpuyard.platform.api.auth import make_auth_middleware
from gpuyard.platform.api.errors import ApiError, error_response
from gpuyard.platform.api.middleware_metrics import make_metrics_middleware
from gpuyard.state.context import Context
from gpuyard.state.store import NotFound
from gpuyard.state.writing import Writer

__all__ = ["CTX", "READY", "delete_object", "make_app", "stored", "writer_of"]

log = structlog.get_logger(__name__)

CTX: web.AppKey[Context] = web.AppKey("ctx", Context)
READY = web.AppKey[Callable[[], bool]]("ready")  # a callable is not a class: the type goes in [...]

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
    "gpuyard.platform.api.priorityclasses",
    "gpuyard.platform.api.rescheduling",
    "gpuyard.platform.api.topologies",
]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.message, exc.details)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[CTX].settings.server.max_body_bytes
        return error_response(
            413, f"request body too large; the limit is {limit} bytes (server.max_body_bytes)"
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, exc.reason)
    except DocumentLimitError as exc:
        return error_response(exc.status, exc.message, exc.details)
    except json.JSONDecodeError as exc:
        return error_response(400, f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")
    except Exception:
        log.exception("http.unhandled", path=request.path, method=request.method)
        return error_response(500, "internal error; see the server log")


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
    """The one write path (the backend's writer); handlers never write the store themselves."""
    assert ctx.writer is not None, "Context always has a writer"
    return ctx.writer


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
    body = generate_latest(request.app[CTX].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def make_app(ctx: Context, *, ready: Callable[[], bool] = lambda: True) -> web.Application:
    """The application for `ctx`; routes of every module in `ROUTE_MODULES` are added."""
    import importlib

    app = web.Application(
        middlewares=[
            make_metrics_middleware(ctx.registry),
            error_middleware,
            make_auth_middleware(ctx.settings.server.tokens),
        ],
        client_max_size=ctx.settings.server.max_body_bytes,
    )
    app[CTX] = ctx
    app[READY] = ready
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    for name in ROUTE_MODULES:
        importlib.import_module(name).setup(app)
    return app
