"""LISTs in pages, on both API servers: the backend's client asks for `limit` objects at a time and
follows `continue` (as client-go's pager does), so a re-list after a 410 on a large cluster is many
small answers of one snapshot, not one huge one."""

from __future__ import annotations

from gpuyard.kubecluster.writing import to_json
from tests.builders import make_node
from tests.kubernetes.conftest_backend import FakeApiServerView, served
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
