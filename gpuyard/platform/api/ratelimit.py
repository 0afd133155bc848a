"""Per-caller request rate limit: a token bucket per API token (or per IP without one).

Configured by `server.rate_limit` (`requests_per_second`, `burst`, `exempt_loopback`; unset: no
limit). Each caller's bucket holds up to `burst` requests and refills at `requests_per_second`;
a request finding it empty is answered 429 with `Retry-After` (whole seconds until one request
is available again) and the usual JSON error body, before any handler runs.

Who is a caller: a bearer token is one caller (keyed by its SHA-256, never the token itself), so
a team's scripts sharing a token share its budget; a request without a token is keyed by the
client's IP address, and one from a loopback address (the node-local CLI, probes) is exempt
unless `exempt_loopback: false`. `/healthz` and `/readyz` are never limited.

Buckets are measured in wall-clock time (`time.monotonic`), also under the virtual clock. At most
:data:`MAX_BUCKETS` are kept; beyond that, the buckets that are full again (idle callers) are
dropped, which forgets nothing a caller could use (and, should every bucket be busy, the stalest
half).
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from gpuyard.platform.api.auth import hash_token
from gpuyard.platform.api.errors import error_response
from gpuyard.state.config import RateLimitConfig

__all__ = ["MAX_BUCKETS", "RateLimiter", "caller_key", "make_rate_limit_middleware"]

MAX_BUCKETS = 10_000
EXEMPT_PATHS = ("/healthz", "/readyz")


@dataclass(slots=True)
class _Bucket:
    tokens: float
    stamp: float


class RateLimiter:
    """Token buckets by caller key; `take(key)` is 0.0 when allowed, else seconds to wait."""

    def __init__(self, *, rate: float, burst: int, now: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self._now = now
        self._buckets: dict[str, _Bucket] = {}

    def take(self, key: str) -> float:
        now = self._now()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= MAX_BUCKETS:
                self._forget_idle(now)
            bucket = self._buckets[key] = _Bucket(tokens=float(self.burst), stamp=now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.stamp) * self.rate)
        bucket.stamp = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.rate

    def _forget_idle(self, now: float) -> None:
        full = [k for k, b in self._buckets.items() if b.tokens + (now - b.stamp) * self.rate >= self.burst]
        for k in full:
            del self._buckets[k]
        if len(self._buckets) >= MAX_BUCKETS:  # still full of busy callers: forget the stalest half
            stale = sorted(self._buckets, key=lambda k: self._buckets[k].stamp)[: MAX_BUCKETS // 2]
            for k in stale:
                del self._buckets[k]

    def __len__(self) -> int:
        return len(self._buckets)


def _is_loopback(remote: str | None) -> bool:
    if not remote:
        return False
    try:
        return ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False


def caller_key(request: web.Request) -> str:
    """`token:<sha256>` of the bearer token, else `ip:<address>`."""
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and presented.strip():
        return "token:" + hash_token(presented.strip())
    return f"ip:{request.remote or '?'}"


def make_rate_limit_middleware(config: RateLimitConfig) -> Middleware:
    limiter = RateLimiter(rate=config.requests_per_second, burst=config.burst)

    @web.middleware
    async def rate_limit_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in EXEMPT_PATHS:
            return await handler(request)
        key = caller_key(request)
        if key.startswith("ip:") and config.exempt_loopback and _is_loopback(request.remote):
            return await handler(request)
        wait = limiter.take(key)
        if wait > 0:
            retry = max(1, math.ceil(wait))
            response = error_response(
                429,
                f"too many requests: at most {config.requests_per_second:g}/s (burst {config.burst}) "
                f"per token; retry in {retry} s",
                [{"field": "server.rate_limit", "reason": "per-token request rate exceeded"}],
            )
            response.headers["Retry-After"] = str(retry)
            return response
        return await handler(request)

    return rate_limit_middleware
