"""Cluster read endpoints: nodes and a summary of GPUs by model.

`GET /api/v1/nodes`, `GET /api/v1/nodes/{name}`, `GET /api/v1/summary`.
"""

from __future__ import annotations

from collections import Counter

from aiohttp import web

from gpuyard.apis.core import GPU_RESOURCE, Node
from gpuyard.platform.api.app import CTX
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.openapi import Param, operation
from gpuyard.platform.api.paging import list_body, paginate

__all__ = ["setup"]

LABEL_GPU_MODEL = "gpuyard.io/gpu-model"


@operation(
    "List nodes",
    tags=["cluster"],
    params=[
        Param("limit", type="integer", description="Page size (1-5000, default 500)."),
        Param("continue", description="Token from the previous page."),
        Param("labelSelector", description="e.g. gpuyard.io/gpu-model=v100"),
    ],
    errors=[400, 422],
)
async def list_nodes(request: web.Request) -> web.Response:
    store = request.app[CTX].store
    selector = request.query.get("labelSelector")
    try:
        nodes = store.list("Node", selector=selector)
    except ValueError as exc:
        raise ApiError(400, str(exc), details=[{"field": "labelSelector", "reason": str(exc)}]) from None
    page, token = paginate(request, nodes)
    return web.json_response(
        list_body([n.to_dict() for n in page], next_token=token, resource_version=store.resource_version)
    )


@operation("Get a node", tags=["cluster"], errors=[404])
async def get_node(request: web.Request) -> web.Response:
    node = request.app[CTX].store.get("Node", "", request.match_info["name"])
    if node is None:
        raise ApiError(404, f"node {request.match_info['name']} not found")
    return web.json_response(node.to_dict())


@operation("Cluster summary: nodes, GPUs by model, pods", tags=["cluster"])
async def summary(request: web.Request) -> web.Response:
    store = request.app[CTX].store
    gpus: Counter[str] = Counter()
    ready = 0
    nodes = store.list("Node")
    for node in nodes:
        assert isinstance(node, Node)
        ready += node.ready
        count = node.status.allocatable.get(GPU_RESOURCE)
        if count:
            gpus[node.metadata.labels.get(LABEL_GPU_MODEL, "unknown")] += int(count)
    return web.json_response(
        {
            "nodes": len(nodes),
            "readyNodes": ready,
            "gpusByModel": dict(sorted(gpus.items())),
            "gpusTotal": sum(gpus.values()),
            "pods": store.count("Pod"),
            "resourceVersion": str(store.resource_version),
        }
    )


def setup(app: web.Application) -> None:
    app.router.add_get("/api/v1/nodes", list_nodes)
    app.router.add_get("/api/v1/nodes/{name}", get_node)
    app.router.add_get("/api/v1/summary", summary)
