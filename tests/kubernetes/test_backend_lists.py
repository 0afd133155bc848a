"""LISTs in pages, on both API servers: the backend's client asks for `limit` objects at a time and
follows `continue` (as client-go's pager does), so a re-list after a 410 on a large cluster is many
small answers of one snapshot, not one huge one; a token that expired between pages restarts the
list (development server: its compaction)."""

from __future__ import annotations

import asyncio

import pytest

from gpuyard.apis.core import Node
from gpuyard.kubecluster.informing import Informer
from gpuyard.kubecluster.writing import to_json
from gpuyard.state.clock import RealClock
from gpuyard.state.kinds import register_kinds
from gpuyard.state.store import Store
from tests.builders import make_node
from tests.kubernetes.conftest_backend import FakeApiServerView, served
from tests.kubernetes.test_backend_informers import eventually
from tests.kubernetes.test_backend_platform import NODES, connect

__all__ = ["served"]


async def test_a_list_comes_in_pages_of_one_snapshot(served: FakeApiServerView) -> None:
    client = await connect(served)
    try:
        for i in range(5):
            await client.create(NODES, to_json(make_node(f"gpu-{i}", gpus=8)))
        before = len([p for m, p in served.requests if m == "GET" and p == "/nodes"])
        items, rv = await client.list(NODES, page_size=2)
        assert sorted(n["metadata"]["name"] for n in items) == [f"gpu-{i}" for i in range(5)]
        assert all(n["kind"] == "Node" and n["apiVersion"] == "v1" for n in items)
        assert rv and int(rv) > 0
        pages = len([p for m, p in served.requests if m == "GET" and p == "/nodes"]) - before
        assert pages == 3  # 2 + 2 + 1
    finally:
        await client.close()


def _nodes_listed(served: FakeApiServerView) -> int:
    return len([p for m, p in served.requests if m == "GET" and p == "/nodes"])


@pytest.mark.dev_apiserver_only
async def test_an_expired_continue_token_restarts_the_list(served: FakeApiServerView) -> None:
    client = await connect(served)
    try:
        for i in range(5):
            await client.create(NODES, to_json(make_node(f"gpu-{i}", gpus=8)))
        pages = client.pages(NODES, page_size=2)
        first = await anext(pages)
        assert len(first.items) == 2 and not first.restarted
        await client.delete(NODES, "", "gpu-0")  # written, then compacted: the token is too old
        served.server.faults.compact()
        rest = [page async for page in pages]
        assert rest[0].restarted  # from the first page again, of the newer snapshot
        listed = [n["metadata"]["name"] for page in rest for n in page.items]
        assert listed == [f"gpu-{i}" for i in range(1, 5)]
        assert int(rest[-1].resource_version) > int(first.resource_version)
    finally:
        await client.close()


@pytest.mark.dev_apiserver_only
async def test_a_re_list_after_a_410_comes_in_pages_and_the_watch_resumes(served: FakeApiServerView) -> None:
    client = await connect(served)
    store = Store()
    register_kinds(store)
    inf = Informer(client=client, resource=NODES, cls=Node, store=store, clock=RealClock(), page_size=2)
    task = asyncio.ensure_future(inf.run())
    try:
        for i in range(5):
            await client.create(NODES, to_json(make_node(f"gpu-{i}", gpus=8)))
        await asyncio.wait_for(inf.synced.wait(), 10)
        await eventually(lambda: store.count("Node") == 5, what="5 nodes mirrored")
        faults = served.server.faults
        faults.go_silent()  # the informer misses what follows
        await client.delete(NODES, "", "gpu-0")
        await client.create(NODES, to_json(make_node("gpu-9", gpus=8)))
        before = _nodes_listed(served)
        faults.compact()  # its version is gone: the next watch answers 410
        faults.clear()
        faults.drop_watches()
        await eventually(lambda: inf.lists == 2, what="a re-list after the 410")
        names = sorted(n for _, n in store.keys_of("Node"))
        assert names == ["gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-9"]  # the missed delete and add
        assert _nodes_listed(served) - before == 3  # 2 + 2 + 1 objects, one page each
        await client.create(NODES, to_json(make_node("gpu-10", gpus=8)))
        await eventually(lambda: store.get("Node", "", "gpu-10") is not None, what="the watch resumed")
        assert inf.lists == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()
