"""Cluster read endpoints: nodes, the cluster summary and per-node use.

* `GET /api/v1/nodes`, `GET /api/v1/nodes/{name}` — nodes as stored.
* `GET /api/v1/summary` — nodes, GPUs total/allocated/free per model (from reservations), the
  fragmentation ratio (definition in `gpuyard.platform.cluster_metrics`), jobs by phase and queue
  depths (pending jobs per queue). Non-admin callers get job counts of their namespaces only.
* `GET /api/v1/usage/nodes` — per node: GPUs, CPU and memory allocatable and held by
  reservations, and the job holding each GPU (what `gpuyard top nodes` and the dashboard's node
  grid show). Jobs of namespaces the caller may not see are shown as `other`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from aiohttp import web

from gpuyard.apis.jobkinds import KIND_INFO
from gpuyard.apis.labels import Selector, SelectorError, parse_selector
from gpuyard.platform.api.app import CTX, stored
from gpuyard.platform.api.auth import allowed_namespaces, authorize
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.openapi import Param, operation
from gpuyard.platform.api.paging import PAGING, list_body, paginate
from gpuyard.platform.cluster_metrics import PENDING_PHASES, cluster_usage
from gpuyard.state.store import Store

__all__ = ["setup"]


@operation(
    "List nodes",
    tags=["cluster"],
    params=[
        *PAGING,
        Param("labelSelector", description="e.g. gpuyard.io/gpu-model=v100"),
    ],
    errors=[400, 422],
)
async def list_nodes(request: web.Request) -> web.Response:
    store = request.app[CTX].store
    nodes = store.list("Node", selector=_selector(request))
    page, token = paginate(request, nodes)
    return web.json_response(
        list_body([n.to_dict() for n in page], next_token=token, resource_version=store.resource_version)
    )


@operation("Get a node", tags=["cluster"], errors=[404])
async def get_node(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    return web.json_response(stored(request, "Node", "", name, what=f"node {name}").to_dict())


SUMMARY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Cluster overview; see docs/operations.md for the fragmentation definition.",
    "properties": {
        "nodes": {"type": "integer"},
        "readyNodes": {"type": "integer"},
        "gpusByModel": {"type": "object", "additionalProperties": {"type": "integer"}},
        "gpusTotal": {"type": "integer"},
        "gpusAllocated": {"type": "integer"},
        "gpusFree": {"type": "integer"},
        "gpus": {
            "type": "object",
            "description": "Per model: total, allocated, free, unhealthy GPUs and fragmentation.",
            "additionalProperties": {"type": "object"},
        },
        "fragmentation": {
            "type": "object",
            "properties": {
                "ratio": {"type": "number"},
                "referenceGpus": {"type": "integer"},
                "definition": {"type": "string"},
            },
        },
        "jobsByPhase": {"type": "object", "additionalProperties": {"type": "integer"}},
        "queueDepths": {"type": "object", "additionalProperties": {"type": "integer"}},
        "pods": {"type": "integer"},
        "resourceVersion": {"type": "string"},
    },
}
FRAGMENTATION_DEFINITION = (
    "share of free GPUs on nodes whose free count is below the reference request "
    "(the most common per-pod multi-GPU request; 2 when there is none)"
)


@operation(
    "Cluster summary: nodes, GPUs total/allocated per model, fragmentation, jobs by phase, queue depths",
    tags=["cluster"],
    response=SUMMARY_SCHEMA,
)
async def summary(request: web.Request) -> web.Response:
    authorize(request, "read")
    store = request.app[CTX].store
    usage = cluster_usage(store)
    by_model = usage.gpus_by_model()
    visible = allowed_namespaces(request)
    jobs_by_phase = usage.jobs_by_phase
    queues = usage.queue_depths
    if visible is not None:  # a tenant sees counts of the jobs it may see, not the whole cluster's
        tenant = cluster_usage_jobs(store, visible)
        jobs_by_phase, queues = tenant
    return web.json_response(
        {
            "nodes": len(usage.nodes),
            "readyNodes": sum(1 for n in usage.nodes if n.ready),
            "gpusByModel": {m: row["total"] for m, row in by_model.items()},
            "gpusTotal": sum(row["total"] for row in by_model.values()),
            "gpusAllocated": sum(row["allocated"] for row in by_model.values()),
            "gpusFree": sum(row["free"] for row in by_model.values()),
            "gpus": {
                m: {**row, "fragmentation": round(usage.fragmentation(m), 4)} for m, row in by_model.items()
            },
            "fragmentation": {
                "ratio": round(usage.fragmentation(), 4),
                "referenceGpus": usage.reference_request,
                "definition": FRAGMENTATION_DEFINITION,
            },
            "jobsByPhase": jobs_by_phase,
            "queueDepths": queues,
            "pods": store.count("Pod"),
            "resourceVersion": str(store.resource_version),
        }
    )


def cluster_usage_jobs(store: Store, visible: frozenset[str]) -> tuple[dict[str, int], dict[str, int]]:
    """Jobs by phase and queue depths over the namespaces in `visible` only."""
    phases: Counter[str] = Counter()
    queues: Counter[str] = Counter()
    for info in KIND_INFO.values():
        for job in store.list_of(info.cls):
            if job.metadata.namespace not in visible:
                continue
            phase = job.status.phase or "Created"
            phases[phase] += 1
            if phase in PENDING_PHASES:
                queues[job.queue or "default"] += 1
    return dict(sorted(phases.items())), dict(sorted(queues.items()))


@operation(
    "Per-node use: GPUs, CPU and memory held by reservations, and the job holding each GPU",
    tags=["cluster"],
    params=[Param("labelSelector", description="e.g. gpuyard.io/gpu-model=v100"), *PAGING],
    response={"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object"}}}},
    errors=[400],
)
async def node_usage(request: web.Request) -> web.Response:
    authorize(request, "read")
    store = request.app[CTX].store
    selector = _selector(request)
    names: set[str] | None = None
    if selector is not None:
        names = {n.metadata.name for n in store.list("Node", selector=selector)}
    visible = allowed_namespaces(request)
    rows = sorted(
        (n for n in cluster_usage(store).nodes if names is None or n.name in names), key=lambda n: n.name
    )
    page, token = paginate(request, rows, key=lambda n: ("", n.name))
    items = []
    for n in page:
        row = n.to_dict()
        if visible is not None:  # other tenants' jobs are shown as "other"
            row["holders"] = {
                idx: [h if h.partition("/")[0] in visible else "other" for h in hs]
                for idx, hs in row["holders"].items()
            }
        items.append(row)
    body = list_body(items, next_token=token, resource_version=store.resource_version)
    body["resourceVersion"] = str(store.resource_version)  # where earlier clients read it
    return web.json_response(body)


def setup(app: web.Application) -> None:
    app.router.add_get("/api/v1/nodes", list_nodes)
    app.router.add_get("/api/v1/nodes/{name}", get_node)
    app.router.add_get("/api/v1/summary", summary)
    app.router.add_get("/api/v1/usage/nodes", node_usage)


def _selector(request: web.Request) -> Selector | None:
    """`?labelSelector=`, parsed: a 400 naming the field when it is not a selector (only a
    selector error is the caller's; anything else raised later is a bug, a 500)."""
    text = request.query.get("labelSelector")
    if not text:
        return None
    try:
        return parse_selector(text)
    except SelectorError as exc:
        raise ApiError(400, str(exc), details=[{"field": "labelSelector", "reason": str(exc)}]) from None
