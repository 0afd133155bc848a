"""Versions in Kubernetes mode: the HTTP API shows the API server's resourceVersions (objects as
the server holds them, a list's version at least every object's), `GET /api/v1/check` finds the
versions sound, and an HTTP watch resumes from an object's own resourceVersion."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from gpuyard.apis.core import Node
from gpuyard.apis.resources import resource_for
from gpuyard.kubecluster.writing import to_json
from gpuyard.state.store import Gone, Store
from tests.builders import make_node
from tests.kubernetes.conftest_backend import FakeApiServerView, served
from tests.kubernetes.test_backend_platform import connect, eventually, platform, settings

__all__ = ["served"]

NODES = resource_for("Node")


async def sse_events(
    http: aiohttp.ClientSession, url: str, *, until: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """The events of a Server-Sent Events watch (type, id, object) until `until(events)`."""
    out: list[dict[str, Any]] = []
    async with http.get(url) as resp:
        assert resp.status == 200, await resp.text()
        event: dict[str, Any] = {}
        while not until(out):
            line = (await asyncio.wait_for(resp.content.readline(), 10)).decode().rstrip("\n")
            if line.startswith("event: "):
                event["type"] = line[7:]
            elif line.startswith("id: "):
                event["id"] = line[4:]
            elif line.startswith("data: "):
                event["object"] = json.loads(line[6:])
            elif not line and event:
                out.append(event)
                event = {}
    return out


async def test_http_api_versions_are_the_api_servers(served: FakeApiServerView) -> None:
    client = await connect(served)
    try:
        for i in range(3):
            await client.create(NODES, to_json(make_node(f"gpu-{i}", gpus=8)))
        async with platform(settings(served.kubeconfig, election=False), serve_http=True) as p:
            on_server = served.get("nodes", "", "gpu-1")
            assert on_server is not None
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{p.url}/api/v1/nodes/gpu-1") as resp:
                    node = await resp.json()
                assert node["metadata"]["resourceVersion"] == on_server["metadata"]["resourceVersion"]
                async with http.get(f"{p.url}/api/v1/nodes") as resp:
                    listed = await resp.json()
                top = int(listed["metadata"]["resourceVersion"])
                assert all(int(n["metadata"]["resourceVersion"]) <= top for n in listed["items"])
                async with http.get(f"{p.url}/api/v1/check", params={"grace": "0"}) as resp:
                    answer = await resp.json()
                versions = [v for v in answer["violations"] if v["invariant"] == "resource-version"]
                assert versions == []
    finally:
        await client.close()


async def test_http_watch_resumes_from_an_objects_own_version(served: FakeApiServerView) -> None:
    client = await connect(served)
    try:
        for i in range(3):
            await client.create(NODES, to_json(make_node(f"gpu-{i}", gpus=8)))
        async with platform(settings(served.kubeconfig, election=False), serve_http=True) as p:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{p.url}/api/v1/nodes/gpu-2") as resp:
                    seen = (await resp.json())["metadata"]["resourceVersion"]
                # later changes on the API server, one to each of the other nodes
                for name in ("gpu-0", "gpu-1"):
                    await client.patch(NODES, "", name, {"metadata": {"labels": {"seen-after": "yes"}}})
                await eventually(
                    lambda: all(
                        n.metadata.labels.get("seen-after") == "yes"
                        for n in p.store.list("Node")
                        if n.metadata.name != "gpu-2"
                    ),
                    what="the changes in the cache",
                )

                def ours(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
                    return [e for e in events if e["object"]["metadata"]["labels"].get("seen-after") == "yes"]

                events = await sse_events(
                    http,
                    f"{p.url}/api/v1/watch/nodes?resourceVersion={seen}",
                    until=lambda got: len({e["object"]["metadata"]["name"] for e in ours(got)}) == 2,
                )
                # nothing from before `seen` (on a real cluster the node controllers also change the
                # nodes, gpu-2 included: those later changes may come too)
                assert all(int(e["id"]) > int(seen) for e in events)
                assert sorted({e["object"]["metadata"]["name"] for e in ours(events)}) == ["gpu-0", "gpu-1"]
                for e in ours(events):
                    assert e["type"] == "MODIFIED"
                    on_server = served.get("nodes", "", e["object"]["metadata"]["name"])
                    assert on_server is not None
                    # the API server's own version of that change: after `seen`, and at most the
                    # node's version now (on a real cluster the node controllers may write again)
                    version = int(e["object"]["metadata"]["resourceVersion"])
                    assert int(seen) < version <= int(on_server["metadata"]["resourceVersion"])
    finally:
        await client.close()


def node_at(name: str, rv: int) -> Node:
    node = make_node(name, gpus=1)
    node.metadata.resource_version = str(rv)
    return node


async def test_store_numbers_mirrored_events_with_the_servers_versions() -> None:
    store = Store(history=4)
    store.register(Node)
    store.observe(node_at("a", 500))
    store.observe(node_at("b", 480))  # another informer, behind: delivered after 500
    store.observe(node_at("c", 900))
    assert store.resource_version == 900
    assert all(n.resource_version <= store.resource_version for n in store.list("Node"))
    store.forget("Node", "", "a")  # a delete seen on a re-list carries no version: the next one
    assert store.resource_version == 901
    # from b's own version (480): every event numbered above it, b's own too (numbered 501:
    # it arrived after 500), none missed
    seen = []
    async for ev in store.watch("Node", since=480):
        seen.append((ev.type, ev.object.metadata.name, ev.rv))
        if ev.rv == store.resource_version:
            break
    assert seen == [("ADDED", "a", 500), ("ADDED", "b", 501), ("ADDED", "c", 900), ("DELETED", "a", 901)]
    after: list[tuple[str, int]] = []
    async for ev in store.watch("Node", since=500):  # from a's: what came after it alone
        after.append((ev.object.metadata.name, ev.rv))
        if ev.rv == store.resource_version:
            break
    assert after == [("b", 501), ("c", 900), ("a", 901)]
    # the log of 4 drops its oldest: a watch from before what it holds is Gone
    store.observe(node_at("d", 950))
    store.observe(node_at("e", 960))
    assert not store.can_resume(480)
    assert store.can_resume(501) and store.can_resume(960)
    with pytest.raises(Gone):
        async for _ in store.watch("Node", since=480):
            break
