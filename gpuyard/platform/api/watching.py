"""Server-Sent Events watches: `GET /api/v1/watch/{resource}` streams store changes.

Several resources can be watched on one stream, comma-separated (`/api/v1/watch/jobs,events`).
Each change is one SSE message: `event: ADDED|MODIFIED|DELETED`, `id: <resourceVersion>`,
`data: <object JSON>`. A client resumes with `?resourceVersion=N` (or the `Last-Event-ID`
header). A client too slow to keep up, or resuming from a version the store no longer holds,
gets `event: GONE` and the stream ends: re-list, then watch from the list's version
(Kubernetes' 410 rule). A comment line is sent every `heartbeat` seconds of silence.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from aiohttp import web

from gpuyard.apis.jobkinds import JOB_KINDS
from gpuyard.platform.api.app import CTX, NAMESPACES
from gpuyard.platform.api.auth import allowed_namespaces, principal_of
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.openapi import Param, operation
from gpuyard.platform.api.redaction import redact_object
from gpuyard.state.store import Gone, WatchEvent

__all__ = ["setup"]

HEARTBEAT_SECONDS = 15.0
QUEUE_SIZE = 1024


def _resources() -> dict[str, list[str]]:
    return {
        "jobs": [cls.KIND for cls in JOB_KINDS] or ["Job"],
        "pods": ["Pod"],
        "nodes": ["Node"],
        "podgroups": ["PodGroup"],
        "events": ["Event"],
    }


def _since(request: web.Request) -> int | None:
    raw = request.query.get("resourceVersion") or request.headers.get("Last-Event-ID")
    if raw is None:
        return None
    # ASCII digits only: str.isdigit() also accepts '²' or '٣', which int() then refuses or reads
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 20:
        raise ApiError(
            400,
            f"resourceVersion must be a non-negative integer of ASCII digits, got {raw[:40]!r}",
            details=[{"field": "resourceVersion", "reason": "allowed: ASCII digits 0-9 (at most 20)"}],
        )
    return int(raw)


@operation(
    "Watch resources as Server-Sent Events (jobs, pods, nodes, podgroups, events; several comma-separated)",
    tags=["watch"],
    params=[Param("resourceVersion", type="integer"), Param("namespace")],
    response={"type": "string", "description": "text/event-stream"},
    response_content_type="text/event-stream",
    errors=[400, 404, 410],
)
async def watch(request: web.Request) -> web.StreamResponse:
    ctx = request.app[CTX]
    resources = _resources()
    kinds = []
    for resource in request.match_info["resource"].split(","):
        if resource not in resources:
            raise ApiError(404, f"cannot watch {resource!r}; allowed: {', '.join(sorted(resources))}")
        kinds += [k for k in resources[resource] if k in ctx.store.kinds() and k not in kinds]
    since = _since(request)
    namespace = request.query.get("namespace")
    visible = allowed_namespaces(request)
    who = principal_of(request)
    if since is not None and since > ctx.store.resource_version:
        current = ctx.store.resource_version
        raise ApiError(
            410,
            f"resourceVersion {since} is newer than the current resourceVersion {current}; "
            "re-list and watch from the list's resourceVersion",
            details=[
                {"field": "resourceVersion", "reason": f"at most the current resourceVersion {current}"}
            ],
        )
    if since is not None and not ctx.store.can_resume(since):
        current = ctx.store.resource_version
        raise ApiError(
            410,
            f"resourceVersion {since} can no longer be watched from (current {current}: too old, "
            "from before a restart, or never issued); re-list and watch from the list's resourceVersion",
            details=[{"field": "resourceVersion", "reason": f"not resumable; current is {current}"}],
        )

    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue(QUEUE_SIZE)

    async def pump() -> None:
        try:
            async for ev in ctx.store.watch(kinds, since=since, namespace=namespace):
                ns = ev.object.metadata.namespace
                if visible is not None and ns and ns not in visible:
                    continue
                await queue.put(ev)
        except Gone:
            pass
        await queue.put(None)  # Gone or the store closed: end the stream

    task = asyncio.create_task(pump(), name="sse-pump")
    try:
        while True:
            try:
                async with asyncio.timeout(HEARTBEAT_SECONDS):
                    ev = await queue.get()
            except TimeoutError:
                await response.write(b": keep-alive\n\n")
                continue
            if ev is None:
                await response.write(b"event: GONE\ndata: {}\n\n")
                break
            payload = json.dumps(
                redact_object(request.app[NAMESPACES], who, ev.object.to_dict()), separators=(",", ":")
            )
            await response.write(f"event: {ev.type}\nid: {ev.rv}\ndata: {payload}\n\n".encode())
    except ConnectionResetError:
        pass  # the client went away
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return response


def setup(app: web.Application) -> None:
    app.router.add_get("/api/v1/watch/{resource}", watch)
