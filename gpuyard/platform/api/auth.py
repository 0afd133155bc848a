"""Bearer-token authentication and per-namespace authorisation for the HTTP API.

Tokens are configured by their SHA-256 hash (`server.tokens`: hash -> user, role, namespaces),
so the config file never holds a usable secret; `gpuyard token hash` prints a token's hash.
Roles: `admin` does everything (quotas, fault injection), `user` reads and changes jobs in its
namespaces, `viewer` only reads its namespaces, `metrics` may only scrape `/metrics`.
Comparison is constant-time and tokens never reach a log line. With no tokens configured every
request is an anonymous admin, and the CLI refuses to bind a non-loopback address without
`--insecure`.

`/metrics` with tokens configured: an admin or metrics token sees every series; without
`server.metrics_public` any other caller is refused (401 without a token, 403 with one); with it,
anyone may scrape, and a caller without one of those roles gets no per-tenant series
(`platform.metrics.exposition`).

401 means "who are you?" (no or unknown token); 403 means "you may not do this".
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from gpuyard.platform.api.errors import ApiError
from gpuyard.state.config import TokenConfig

__all__ = [
    "METRICS_ROLES",
    "PRINCIPAL",
    "Action",
    "Principal",
    "allowed_namespaces",
    "authorize",
    "hash_token",
    "make_auth_middleware",
    "principal_of",
]

Action = Literal["read", "write", "admin"]

# Paths anyone may call: probes, the dashboard's page, icon and static files (`/metrics`: see above).
PUBLIC_PREFIXES = ("/healthz", "/readyz", "/static/")
PUBLIC_EXACT = ("/", "/favicon.ico", "/api/v1/openapi.json")
METRICS_PATH = "/metrics"
METRICS_ROLES = frozenset({"admin", "metrics"})  # see every series


@dataclass(frozen=True, slots=True)
class Principal:
    user: str
    role: Literal["admin", "user", "viewer", "metrics"]
    namespaces: frozenset[str]  # "*" = all

    def sees(self, namespace: str) -> bool:
        return self.role == "admin" or "*" in self.namespaces or namespace in self.namespaces


ANONYMOUS_ADMIN = Principal(user="anonymous", role="admin", namespaces=frozenset({"*"}))
ANONYMOUS_SCRAPER = Principal(user="anonymous", role="viewer", namespaces=frozenset())  # public /metrics
PRINCIPAL: web.RequestKey[Principal] = web.RequestKey("principal", Principal)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _lookup(tokens: Iterable[TokenConfig], presented: str) -> Principal | None:
    digest = hash_token(presented)
    found: Principal | None = None
    for entry in tokens:  # check every entry: the time taken does not depend on which matched
        if hmac.compare_digest(digest, entry.sha256.lower()):
            found = Principal(user=entry.user, role=entry.role, namespaces=frozenset(entry.namespaces))
    return found


def make_auth_middleware(tokens: list[TokenConfig], *, metrics_public: bool = False) -> Middleware:
    @web.middleware
    async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not tokens:
            request[PRINCIPAL] = ANONYMOUS_ADMIN
            return await handler(request)
        path = request.path
        if path in PUBLIC_EXACT or path.startswith(PUBLIC_PREFIXES):
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            if path == METRICS_PATH and metrics_public:
                request[PRINCIPAL] = ANONYMOUS_SCRAPER
                return await handler(request)
            raise ApiError(401, "missing bearer token: send 'Authorization: Bearer <token>'")
        principal = _lookup(tokens, presented.strip())
        if principal is None:
            raise ApiError(401, "unknown or revoked token")
        if path == METRICS_PATH and principal.role not in METRICS_ROLES and not metrics_public:
            raise ApiError(
                403,
                f"user {principal.user} ({principal.role}) may not scrape /metrics; it needs the admin "
                "or metrics role (or server.metrics_public: true)",
            )
        if principal.role == "metrics" and path != METRICS_PATH:
            raise ApiError(403, f"user {principal.user} has the metrics role: it may only scrape /metrics")
        request[PRINCIPAL] = principal
        return await handler(request)

    return auth_middleware


def principal_of(request: web.Request) -> Principal:
    if PRINCIPAL in request:
        return request[PRINCIPAL]
    return ANONYMOUS_ADMIN


def authorize(request: web.Request, action: Action, namespace: str | None = None) -> Principal:
    """Raise 403 unless the caller may do `action` (in `namespace`, when given)."""
    who = principal_of(request)
    if who.role == "admin":
        return who
    if action == "admin":
        raise ApiError(403, f"user {who.user} ({who.role}) may not do this; it needs the admin role")
    if action == "write" and who.role == "viewer":
        raise ApiError(403, f"user {who.user} is a viewer and may only read")
    if namespace is not None and not who.sees(namespace):
        raise ApiError(403, f"user {who.user} has no access to namespace {namespace}")
    return who


def allowed_namespaces(request: web.Request) -> frozenset[str] | None:
    """The namespaces the caller may see, or None for all."""
    who = principal_of(request)
    if who.role == "admin" or "*" in who.namespaces:
        return None
    return who.namespaces
