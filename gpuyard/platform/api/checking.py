"""`GET /api/v1/check`: the platform's invariants checked on the live store (admin).

Runs :func:`gpuyard.platform.invariants.check_store` on the store the server holds. The safety
invariants (no device, CPU, memory or port over-allocated, versions, quota max) are reported as
found; a settled one (owners alive, gangs at their minimum, quota within runtime) may be broken
for a moment while a change is in flight, so it is reported only when it is still there after
`grace` seconds (default 1; 0 reports what one look sees). The answer is 200 with
`{"ok": bool, "violations": [...], "checked": {kind: count}, "resourceVersion": N}`;
`gpuyard check` turns it into an exit code.
"""

from __future__ import annotations

import asyncio
import math

from aiohttp import web

from gpuyard.platform.api.app import CTX
from gpuyard.platform.api.auth import authorize
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.openapi import Param, operation
from gpuyard.platform.invariants import INVARIANTS, check_store

__all__ = ["MAX_GRACE", "setup"]

MAX_GRACE = 60.0
_COUNTED = ("Node", "Pod", "Reservation", "PodGroup", "ElasticQuota")


def _grace(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 <= value <= MAX_GRACE:
        raise ApiError(
            400,
            f"grace must be a number of seconds in 0..{MAX_GRACE:g}, not {raw!r}",
            details=[{"field": "grace", "reason": f"seconds, 0..{MAX_GRACE:g}"}],
        )
    return value


@operation(
    "Check the platform's invariants on the live store (admin)",
    tags=["admin"],
    params=[
        Param(
            "grace",
            type="number",
            description=f"seconds a settled invariant may stay broken (a change in flight); 0..{MAX_GRACE:g}, default 1",
        )
    ],
    errors=[400, 403],
)
async def check(request: web.Request) -> web.Response:
    authorize(request, "admin")
    grace = _grace(request.query.get("grace", "1"))
    ctx = request.app[CTX]
    scheduler = ctx.settings.scheduler
    delegated_to = scheduler.pod_scheduler_name if scheduler.mode == "delegate" else None
    found = check_store(ctx.store, delegated_to=delegated_to)
    if grace > 0 and any(v.family == "settled" for v in found):
        await asyncio.sleep(grace)  # real time: a virtual clock may be standing still
        again = {(v.invariant, v.message) for v in check_store(ctx.store, delegated_to=delegated_to)}
        found = [v for v in found if v.family == "safety" or (v.invariant, v.message) in again]
    known = set(ctx.store.kinds())
    return web.json_response(
        {
            "ok": not found,
            "violations": [v.to_dict() for v in found],
            "invariants": dict(INVARIANTS),
            "checked": {k: ctx.store.count(k) for k in _COUNTED if k in known},
            "resourceVersion": ctx.store.resource_version,
        }
    )


def setup(app: web.Application) -> None:
    app.router.add_get("/api/v1/check", check)
