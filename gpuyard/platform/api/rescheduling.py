"""`POST /api/v1/scheduler:reschedule[?dryRun=true]`: ask the defragmenting rescheduler for a run.

The scheduler answers at its next cycle (`scheduler/rescheduling.py`): the plan as JSON — per
move the job, pod, from and to (node and GPU indices), the GPU-hours the move throws away and the
waiting job it is for. With `dryRun=true` nothing changes; otherwise the moves start (each new
place reserved before the pod is stopped), within the configured limits, whether or not the
periodic rescheduler is enabled. Needs the admin role; 503 when no scheduler runs in this process.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from gpuyard.platform.api.app import CTX
from gpuyard.platform.api.auth import authorize
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.openapi import Param, operation
from gpuyard.scheduler.running import service_for

__all__ = ["setup"]

ANSWER_SECONDS = 30.0
PLACE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"node": {"type": "string"}, "gpus": {"type": "array", "items": {"type": "integer"}}},
}
RESULT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "dryRun": {"type": "boolean"},
        "message": {"type": "string"},
        "beneficiaries": {"type": "array", "items": {"type": "string"}},
        "moves": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "job": {"type": "string"},
                    "pod": {"type": "string"},
                    "from": PLACE_SCHEMA,
                    "to": PLACE_SCHEMA,
                    "costGpuHours": {"type": "number"},
                    "for": {"type": "string"},
                },
            },
        },
    },
}


@operation(
    "Run the defragmenting rescheduler now (dryRun=true: only print the plan)",
    tags=["scheduling"],
    params=[Param("dryRun", description="true: plan only, change nothing (default false)")],
    response=RESULT_SCHEMA,
    errors=[400, 401, 403, 503],
)
async def reschedule(request: web.Request) -> web.Response:
    authorize(request, "admin")
    raw = request.query.get("dryRun", "false").lower()
    if raw not in ("true", "false", "1", "0", ""):
        raise ApiError(
            400,
            f"dryRun must be true or false, got {raw[:32]!r}",
            details=[{"field": "dryRun", "reason": "allowed: true, false"}],
        )
    service = service_for(request.app[CTX].store)
    if service is None:
        raise ApiError(503, "no scheduler runs in this process")
    try:
        result = await asyncio.wait_for(service.request(dry_run=raw in ("true", "1")), ANSWER_SECONDS)
    except TimeoutError:
        raise ApiError(503, f"the scheduler did not answer within {ANSWER_SECONDS:g} s") from None
    return web.json_response(result)


def setup(app: web.Application) -> None:
    app.router.add_post("/api/v1/scheduler:reschedule", reschedule)
