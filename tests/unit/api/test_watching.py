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
    assert (await http.get("/api/v1/watch/pods?resourceVersion=abc")).status == 400


@pytest.mark.parametrize("raw", ["²", "٣", "1²", "-1", "1.0", "9" * 40])
async def test_a_version_that_is_not_ascii_digits_is_400_naming_the_parameter(client, raw):
    http, _ = client
    resp = await asyncio.wait_for(http.get("/api/v1/watch/pods", params={"resourceVersion": raw}), 1)
    assert resp.status == 400
    assert (await resp.json())["error"]["details"][0]["field"] == "resourceVersion"
    resp = await asyncio.wait_for(http.get("/api/v1/watch/pods", headers={"Last-Event-ID": raw}), 1)
    assert resp.status == 400


async def test_a_version_from_the_future_is_410_naming_the_current_version(client):
    http, ctx = client
    ctx.store.create(make_pod("a"))
    current = ctx.store.resource_version
    resp = await asyncio.wait_for(http.get(f"/api/v1/watch/pods?resourceVersion={current + 1}"), 1)
    assert resp.status == 410
    body = await resp.json()
    assert f"current resourceVersion {current}" in body["error"]["message"]
    assert body["error"]["details"][0]["field"] == "resourceVersion"
    resp = await http.get(f"/api/v1/watch/pods?resourceVersion={current}")  # the current one is fine
    assert resp.status == 200
    resp.close()
