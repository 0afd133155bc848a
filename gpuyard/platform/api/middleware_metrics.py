"""HTTP request duration by route and status code, as a Prometheus histogram.

`make_metrics_middleware(registry)` returns an aiohttp middleware that times every request and
observes `gpuyard_http_request_duration_seconds{method, route, code}`. The `route` label is the
route's template (`/api/v1/namespaces/{ns}/jobs/{name}`), never the concrete path, so label
cardinality stays bounded; unmatched paths are labelled `unmatched`. Server-Sent Event streams
are observed when they end. Place it first in `make_app`'s middlewares so the status written by
the error middleware is the one recorded.
"""

from __future__ import annotations

import time
import weakref

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CollectorRegistry, Histogram

__all__ = ["make_metrics_middleware"]

_HISTOGRAMS: weakref.WeakKeyDictionary[CollectorRegistry, Histogram] = weakref.WeakKeyDictionary()
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


def _route_of(request: web.Request) -> str:
    info = request.match_info
    route = getattr(info, "route", None)
    resource = getattr(route, "resource", None)
    if not isinstance(resource, web.AbstractResource) or getattr(info, "http_exception", None) is not None:
        return "unmatched"
    return resource.canonical


def make_metrics_middleware(registry: CollectorRegistry) -> Middleware:
    """A middleware observing request durations on `registry` (one histogram per registry, so
    building a second app on the same registry shares it)."""
    histogram = _HISTOGRAMS.get(registry)
    if histogram is None:
        histogram = Histogram(
            "gpuyard_http_request_duration_seconds",
            "HTTP request duration by method, route template and status code.",
            ["method", "route", "code"],
            registry=registry,
            buckets=BUCKETS,
        )
        _HISTOGRAMS[registry] = histogram

    @web.middleware
    async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        start = time.perf_counter()
        code = 500
        try:
            response = await handler(request)
            code = response.status
            return response
        except web.HTTPException as exc:
            code = exc.status
            raise
        finally:
            histogram.labels(request.method, _route_of(request), str(code)).observe(
                time.perf_counter() - start
            )

    return metrics_middleware
