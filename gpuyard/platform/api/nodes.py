"""Node endpoints: device topology, the pods on a node, the node's events.

* `GET /api/v1/nodes/{name}/topology` — see below.
* `GET /api/v1/nodes/{name}/pods` — the pods bound to the node (`spec.nodeName`), with the same
  `summary` as a job's pods plus `job` (namespace/name); pods of namespaces the caller may not
  read are left out.
* `GET /api/v1/nodes/{name}/events` — the events whose `involvedObject` is the node, oldest first.

The topology route:
Returns the node's NodeTopology (GPUs with health, NVLink peers, PCIe switches, NUMA nodes, NICs)
and, from the Reservations on the node (the allocation ledger), which pod and job hold each GPU
and each NIC. `gpuyard describe node NAME` draws it with `gpuyard.devices.render.draw`.
Holders in namespaces the caller may not read are shown as `other`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiohttp import web

from gpuyard.apis.core import Event, Pod
from gpuyard.apis.scheduling import LABEL_JOB_NAME, Reservation
from gpuyard.platform.api.app import CTX
from gpuyard.platform.api.auth import allowed_namespaces, authorize
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.jobs import pod_view
from gpuyard.platform.api.openapi import Param, operation

__all__ = ["TOPOLOGY_SCHEMA", "node_allocations", "setup"]

_HOLDER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reservation": {"type": "string", "description": "namespace/name of the Reservation"},
        "pod": {"type": "string", "description": "namespace/name of the pod"},
        "job": {"type": "string", "description": "namespace/name of the job (PodGroup)"},
        "gpuMilli": {"type": "integer", "description": "share of the GPU (1000 = whole)"},
    },
}

TOPOLOGY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "node": {"type": "string"},
        "topology": {"type": "object", "description": "The NodeTopology as stored (gpuyard.io/v1alpha1)."},
        "gpus": {
            "type": "object",
            "description": "GPU index -> holders (several for shared GPUs).",
            "additionalProperties": {"type": "array", "items": _HOLDER},
        },
        "nics": {
            "type": "object",
            "description": "NIC name -> holders.",
            "additionalProperties": {"type": "array", "items": _HOLDER},
        },
    },
}


def node_allocations(
    reservations: Iterable[Reservation], node: str, *, visible: set[str] | None = None
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    """GPU index -> holders and NIC name -> holders of `node`; `visible` None means every namespace."""
    gpus: dict[str, list[dict[str, Any]]] = {}
    nics: dict[str, list[dict[str, Any]]] = {}
    for res in reservations:
        spec = res.spec
        if spec.node != node:
            continue
        ns = res.metadata.namespace
        if visible is not None and ns not in visible:
            holder: dict[str, Any] = {"reservation": "other", "pod": "other", "job": "other"}
        else:
            job = res.metadata.labels.get(LABEL_JOB_NAME, spec.pod_group)
            holder = {
                "reservation": f"{ns}/{res.metadata.name}",
                "pod": f"{ns}/{res.metadata.name}",
                "job": f"{ns}/{job}",
            }
        for g in spec.gpus:
            gpus.setdefault(str(g), []).append({**holder, "gpuMilli": spec.gpu_milli or 1000})
        for nic in spec.nics:
            nics.setdefault(nic, []).append(dict(holder))
    return gpus, nics


@operation(
    "Get a node's device topology and who holds each GPU and NIC",
    tags=["cluster"],
    params=[Param("name", where="path", description="Node name.", required=True)],
    response=TOPOLOGY_SCHEMA,
    errors=[401, 403, 404],
)
async def node_topology(request: web.Request) -> web.Response:
    authorize(request, "read")
    store = request.app[CTX].store
    name = request.match_info["name"]
    if store.get("Node", "", name) is None:
        raise ApiError(404, f"node {name} not found", details=[{"field": "name", "reason": "no such node"}])
    topology = store.get("NodeTopology", "", name) if "NodeTopology" in store.kinds() else None
    if topology is None:
        raise ApiError(
            404,
            f"node {name} has no NodeTopology",
            details=[{"field": "name", "reason": "the node reports no device topology"}],
        )
    allowed = allowed_namespaces(request)
    visible = None if allowed is None else set(allowed)
    gpus, nics = node_allocations(store.list_of(Reservation), name, visible=visible)
    return web.json_response({"node": name, "topology": topology.to_dict(), "gpus": gpus, "nics": nics})


def _node_name(request: web.Request) -> str:
    name = request.match_info["name"]
    if request.app[CTX].store.get("Node", "", name) is None:
        raise ApiError(404, f"node {name} not found", details=[{"field": "name", "reason": "no such node"}])
    return name


_ITEMS: dict[str, Any] = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": {"type": "object"}}},
}


@operation(
    "The pods on a node, with phase, job, GPUs and host port",
    tags=["cluster"],
    params=[Param("name", where="path", description="Node name.", required=True)],
    response=_ITEMS,
    errors=[401, 403, 404],
)
async def node_pods(request: web.Request) -> web.Response:
    authorize(request, "read")
    name = _node_name(request)
    store = request.app[CTX].store
    visible = allowed_namespaces(request)
    items = []
    for pod in store.list_of(Pod):
        if pod.spec.node_name != name or (visible is not None and pod.metadata.namespace not in visible):
            continue
        view = pod_view(pod)
        job = pod.metadata.labels.get(LABEL_JOB_NAME)
        view["summary"]["job"] = f"{pod.metadata.namespace}/{job}" if job else None
        items.append(view)
    items.sort(key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))
    return web.json_response({"items": items, "resourceVersion": str(store.resource_version)})


@operation(
    "The events about a node (involvedObject kind Node), oldest first",
    tags=["cluster"],
    params=[Param("name", where="path", description="Node name.", required=True)],
    response=_ITEMS,
    errors=[401, 403, 404],
)
async def node_events(request: web.Request) -> web.Response:
    authorize(request, "read")
    name = _node_name(request)
    store = request.app[CTX].store
    events = [
        e
        for e in store.list_of(Event)
        if e.involved_object.get("kind") == "Node" and e.involved_object.get("name") == name
    ]
    events.sort(key=lambda e: int(e.metadata.resource_version or 0))
    return web.json_response(
        {"items": [e.to_dict() for e in events], "metadata": {"resourceVersion": str(store.resource_version)}}
    )


def setup(app: web.Application) -> None:
    app.router.add_get("/api/v1/nodes/{name}/topology", node_topology)
    app.router.add_get("/api/v1/nodes/{name}/pods", node_pods)
    app.router.add_get("/api/v1/nodes/{name}/events", node_events)
