"""Per-node read endpoints behind `gpuyard describe node NAME`.

* `GET /api/v1/nodes/{name}/topology` — the node's NodeTopology (GPUs with health, NVLink peers,
  PCIe switches, NUMA nodes, NICs) and, from the Reservations on the node (the allocation
  ledger), which pod and job hold each GPU and each NIC; drawn with `gpuyard.devices.render.draw`.
* `GET /api/v1/nodes/{name}/pods` — the pods bound to the node (phase, job, GPUs, requests and
  limits) and `allocated`: what its non-terminated pods request, and the GPUs each job holds.
* `GET /api/v1/nodes/{name}/events` — the events whose involved object is the node, oldest first.

Pods and holders in namespaces the caller may not read are shown as `other` (they still count
in the node's allocated resources).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any, cast

from aiohttp import web

from gpuyard.apis.core import Event, Node, Pod
from gpuyard.apis.quantity import format_quantity
from gpuyard.apis.scheduling import LABEL_JOB_NAME, Reservation
from gpuyard.platform.api.app import CTX, stored
from gpuyard.platform.api.auth import allowed_namespaces, authorize
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.jobs import GPUS_PICKED_BY_SCHEMA, pod_view
from gpuyard.platform.api.openapi import Param, operation
from gpuyard.platform.api.paging import PAGING, event_order, list_body, paginate
from gpuyard.state.store import Store

__all__ = ["NODE_PODS_SCHEMA", "TOPOLOGY_SCHEMA", "node_allocations", "node_pods_view", "setup"]

TERMINATED = ("Succeeded", "Failed")

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


NODE_PODS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "node": {"type": "string"},
        "items": {
            "type": "array",
            "description": "Pods bound to the node, as `GET .../jobs/{name}/pods` shows them; `summary` adds "
            "`job` (namespace/name), `requests` and `limits`. Pods the caller may not read are `other`.",
            "items": {"type": "object"},
        },
        "allocated": {
            "type": "object",
            "description": "What the node's non-terminated (Pending or Running) pods hold.",
            "properties": {
                "pods": {"type": "integer"},
                "requests": {"type": "object", "additionalProperties": {"type": "string"}},
                "limits": {"type": "object", "additionalProperties": {"type": "string"}},
                "gpusByJob": {
                    "type": "object",
                    "description": "namespace/name of the job -> the GPU indices its pods hold.",
                    "additionalProperties": {"type": "array", "items": {"type": "integer"}},
                },
            },
        },
        "metadata": {"type": "object", "properties": {"resourceVersion": {"type": "string"}}},
        "gpusPickedBy": GPUS_PICKED_BY_SCHEMA,
    },
}
EVENTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "items": {"type": "array", "items": {"type": "object"}},
        "metadata": {"type": "object", "properties": {"resourceVersion": {"type": "string"}}},
    },
}


def _must_node(request: web.Request, name: str) -> Node:
    return cast(Node, stored(request, "Node", "", name, what=f"node {name}", field="name"))


def _sum(total: dict[str, Decimal], add: Mapping[str, Decimal]) -> None:
    for key, q in add.items():
        total[key] = total.get(key, Decimal(0)) + q


def node_pods_view(store: Store, node: str, *, visible: set[str] | None = None) -> dict[str, Any]:
    """The pods bound to `node` and what its non-terminated ones hold; `visible` None = every namespace."""
    pods = sorted(
        (p for p in store.list_of(Pod) if p.spec.node_name == node),
        key=lambda p: (p.metadata.namespace or "", p.metadata.name),
    )
    items: list[dict[str, Any]] = []
    requests: dict[str, Decimal] = {}
    limits: dict[str, Decimal] = {}
    gpus_by_job: dict[str, list[int]] = {}
    active = 0
    for pod in pods:
        ns = pod.metadata.namespace or "default"
        job = pod.metadata.labels.get(LABEL_JOB_NAME)
        view = pod_view(pod)
        pod_requests = pod.spec.requests()
        pod_limits: dict[str, Decimal] = {}
        for c in pod.spec.containers:
            _sum(pod_limits, c.resources.limits)
        hidden = visible is not None and ns not in visible
        job_ref = "other" if hidden else (f"{ns}/{job}" if job else "-")
        gpus = [int(g) for g in view["summary"]["gpus"]]
        if pod.status.phase not in TERMINATED:
            active += 1
            _sum(requests, pod_requests)
            _sum(limits, pod_limits)
            if gpus:
                held = gpus_by_job.setdefault(job_ref, [])
                held.extend(g for g in gpus if g not in held)
        summary = {
            "phase": pod.status.phase,
            "node": node,
            "job": job_ref,
            "gpus": gpus,
            "requests": {k: format_quantity(v) for k, v in sorted(pod_requests.items())},
            "limits": {k: format_quantity(v) for k, v in sorted(pod_limits.items())},
        }
        if hidden:
            items.append({"metadata": {"name": "other", "namespace": "other"}, "summary": summary})
        else:
            view["summary"].update(summary)
            items.append(view)
    return {
        "node": node,
        "items": items,
        "allocated": {
            "pods": active,
            "requests": {k: format_quantity(v) for k, v in sorted(requests.items())},
            "limits": {k: format_quantity(v) for k, v in sorted(limits.items())},
            "gpusByJob": {job: sorted(held) for job, held in sorted(gpus_by_job.items())},
        },
        "metadata": {"resourceVersion": str(store.resource_version)},
    }


@operation(
    "The pods bound to a node and the resources its non-terminated pods hold (`gpuyard describe node`)",
    tags=["cluster"],
    params=[Param("name", where="path", description="Node name.", required=True)],
    response=NODE_PODS_SCHEMA,
    errors=[401, 403, 404],
)
async def node_pods(request: web.Request) -> web.Response:
    authorize(request, "read")
    store = request.app[CTX].store
    name = request.match_info["name"]
    _must_node(request, name)
    allowed = allowed_namespaces(request)
    visible = None if allowed is None else set(allowed)
    body = node_pods_view(store, name, visible=visible)
    body["gpusPickedBy"] = request.app[CTX].settings.backend.gpus_picked_by
    return web.json_response(body)


@operation(
    "The events about a node, oldest first",
    tags=["cluster"],
    params=[Param("name", where="path", description="Node name.", required=True), *PAGING],
    response=EVENTS_SCHEMA,
    errors=[401, 403, 404],
)
async def node_events(request: web.Request) -> web.Response:
    authorize(request, "read")
    store = request.app[CTX].store
    name = request.match_info["name"]
    node = _must_node(request, name)
    events = [
        e
        for e in store.list_of(Event)
        if e.involved_object.get("kind") == "Node"
        and e.involved_object.get("name") == name
        and e.involved_object.get("uid") in (None, "", node.metadata.uid)
    ]
    events.sort(key=event_order)
    page, token = paginate(request, events, key=event_order)
    return web.json_response(
        list_body([e.to_dict() for e in page], next_token=token, resource_version=store.resource_version)
    )


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
    _must_node(request, name)
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


def setup(app: web.Application) -> None:
    app.router.add_get("/api/v1/nodes/{name}/topology", node_topology)
    app.router.add_get("/api/v1/nodes/{name}/pods", node_pods)
    app.router.add_get("/api/v1/nodes/{name}/events", node_events)
