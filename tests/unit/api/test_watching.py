"""SSE watches: events in order with ids, resume from a version, 410 for a version too old."""

from __future__ import annotations

import asyncio

import pytest

from gpuyard.platform.api.app import make_app
from gpuyard.state.context import Context
from tests.builders import make_node, make_pod


async def read_events(resp, count: int) -> list[tuple[str, str]]:
    events, current = [], {}
    while len(events) < count:
        line = (await asyncio.wait_for(resp.content.readline(), 5)).decode().rstrip("\n")
        if not line:
            if current:
                events.append((current.get("event", ""), current.get("id", "")))
                current = {}
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(": ")
        current[field] = value
    return events


@pytest.fixture
async def client(aiohttp_client):
    ctx = Context.for_tests()
    return await aiohttp_client(make_app(ctx)), ctx


async def test_stream_follows_changes(client):
    http, ctx = client
    resp = await http.get("/api/v1/watch/pods")
    assert resp.headers["Content-Type"] == "text/event-stream"
    ctx.store.create(make_node("n1"))  # not a pod: not streamed
    pod = ctx.store.create(make_pod("a"))
    changed = pod.clone()
    changed.status.phase = "Running"
    ctx.store.update(changed)
    ctx.store.delete("Pod", "default", "a")
    assert await read_events(resp, 3) == [("ADDED", "2"), ("MODIFIED", "3"), ("DELETED", "4")]
    resp.close()


async def test_resume_from_a_version(client):
    http, ctx = client
    for i in range(3):
        ctx.store.create(make_pod(f"p{i}"))
    resp = await http.get("/api/v1/watch/pods?resourceVersion=1")
    assert await read_events(resp, 2) == [("ADDED", "2"), ("ADDED", "3")]
    resp.close()


async def test_errors(client):
    http, _ = client
    assert (await http.get("/api/v1/watch/secrets")).status == 404
    assert (await http.get("/api/v1/watch/pods?resourceVersion=abc")).status == 422
