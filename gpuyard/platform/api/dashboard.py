"""The web dashboard's routes: the page, its static files, and the two reads it needs.

* `GET /` — the dashboard (`gpuyard/platform/dashboard/static/index.html`); `GET /static/...` —
  its ES modules and stylesheet, shipped in the package (no CDN, no build step). Both are public:
  the page asks for a token and sends it on every API call.
* `GET /favicon.ico` — the dashboard's icon (`static/favicon.svg`, `image/svg+xml`), public, for
  the browsers that ask for it at that path whatever the page links.
* `GET /api/v1/reservations?namespace=&node=&jobName=` — the allocation ledger: one Reservation
  per placed pod (node, GPU indices, NICs, host ports, requests). Paginated (`limit`,
  `continue`); a non-admin caller sees its namespaces only.
* `GET /api/v1/nodetopologies/{name}` — a node's NodeTopology (GPUs, NVLink peers, PCIe switches,
  NUMA nodes, NICs), for the topology view when the richer `/api/v1/nodes/{name}/topology` route
  is not there.

The dashboard reads everything else through the public API (summary, jobs, explain, pods,
events, quotas) and keeps itself current with the SSE watches.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.scheduling import LABEL_JOB_NAME, Reservation
from gpuyard.platform.api.app import CTX
from gpuyard.platform.api.auth import allowed_namespaces, authorize
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.openapi import Param, operation
from gpuyard.platform.api.paging import PAGING, list_body, paginate

__all__ = ["STATIC_DIR", "setup"]

STATIC_DIR = Path(str(resources.files("gpuyard.platform.dashboard") / "static"))

RESERVATION_LIST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "items": {"type": "array", "items": {"type": "object", "description": "a Reservation"}},
        "metadata": {
            "type": "object",
            "properties": {
                "continue": {"type": "string", "nullable": True},
                "resourceVersion": {"type": "string"},
            },
        },
    },
}


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


async def favicon(request: web.Request) -> web.FileResponse:
    return web.FileResponse(
        STATIC_DIR / "favicon.svg",
        headers={"Content-Type": "image/svg+xml", "Cache-Control": "public, max-age=86400"},
    )


@operation(
    "List reservations (the allocation ledger: node, GPUs, NICs, ports per placed pod)",
    tags=["scheduling", "cluster"],
    params=[
        Param("namespace", description="Only this namespace"),
        Param("node", description="Only reservations on this node"),
        Param("jobName", description="Only the reservations of this job (its PodGroup)"),
        *PAGING,
    ],
    response=RESERVATION_LIST_SCHEMA,
    errors=[400, 422],
)
async def list_reservations(request: web.Request) -> web.Response:
    store = request.app[CTX].store
    q = request.query
    namespace = q.get("namespace") or None
    authorize(request, "read", namespace)
    visible = allowed_namespaces(request)
    node, job = q.get("node") or None, q.get("jobName") or None
    items = store.list_of(Reservation, namespace=namespace, selector={LABEL_JOB_NAME: job} if job else None)
    items = [
        r
        for r in items
        if (visible is None or r.metadata.namespace in visible)
        and (node is None or r.spec.node == node)
        and (job is None or r.spec.pod_group == job)
    ]
    page, token = paginate(request, items)
    return web.json_response(
        list_body([r.to_dict() for r in page], next_token=token, resource_version=store.resource_version)
    )


@operation(
    "Get a node's device topology (GPUs, NVLink peers, PCIe switches, NUMA nodes, NICs)",
    tags=["cluster"],
    response=NodeTopology,
    errors=[404],
)
async def get_node_topology(request: web.Request) -> web.Response:
    authorize(request, "read")
    name = request.match_info["name"]
    topo = request.app[CTX].store.get("NodeTopology", "", name)
    if topo is None:
        raise ApiError(404, f"node topology {name} not found; the node has no NodeTopology (a CPU node?)")
    return web.json_response(topo.to_dict())


def setup(app: web.Application) -> None:
    app.router.add_get("/", index)
    app.router.add_get("/favicon.ico", favicon)
    app.router.add_static("/static/", STATIC_DIR, append_version=False)
    app.router.add_get("/api/v1/reservations", list_reservations)
    app.router.add_get("/api/v1/nodetopologies/{name}", get_node_topology)
