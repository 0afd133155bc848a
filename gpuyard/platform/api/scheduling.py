"""Scheduling endpoints: ResourceClasses, and why a job is (not) placed.

* `GET /api/v1/resourceclasses` — every class; `GET /api/v1/resourceclasses/{name}` — one.
* `PUT /api/v1/resourceclasses/{name}` — create or replace a class (YAML or JSON body). A bad
  selector (unknown operator, a `Gt` on something that is not a number, ...) is a 422 naming
  the field; nothing is stored. A `metadata.resourceVersion` in the body makes the write
  conditional (409 when stale). 201 when created, 200 when replaced.
* `DELETE /api/v1/resourceclasses/{name}`.
* `GET /api/v1/namespaces/{ns}/jobs/{name}/explain` — the job's PodGroup as the scheduler sees
  it: phase, the readable reason it is pending ("0/512 nodes have 4 free GPUs of class
  nvidia.v100 in one node; 2 nodes have 3"), and the reservations it holds (node, GPUs, ports).

Handlers only read and write the store; the scheduler reacts to what changes.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gpuyard.apis.resourceclasses import ResourceClass, validate_resource_class
from gpuyard.apis.scheduling import PodGroup, Reservation
from gpuyard.platform.api.app import CTX, delete_object, stored, writer_of
from gpuyard.platform.api.auth import authorize
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.manifests import read_one_document
from gpuyard.platform.api.openapi import operation
from gpuyard.platform.api.paging import PAGING, list_body, paginate
from gpuyard.state.store import Conflict

__all__ = ["explain_view", "setup"]


CLASS_LIST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "items": {"type": "array", "items": {"$ref": "#/components/schemas/ResourceClass"}},
        "resourceVersion": {"type": "string"},
    },
}
EXPLAIN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Why a job is (not) placed, and the reservations it holds.",
    "properties": {
        "namespace": {"type": "string"},
        "name": {"type": "string"},
        "phase": {"type": "string", "enum": ["Pending", "Placed", "Suspended"]},
        "reason": {"type": "string"},
        "message": {"type": "string"},
        "placed": {"type": "integer"},
        "replicas": {"type": "integer"},
        "minimum": {"type": "integer"},
        "attempts": {"type": "integer"},
        "queuedAt": {"type": "string", "nullable": True},
        "placedAt": {"type": "string", "nullable": True},
        "gangGroup": {"type": "array", "items": {"type": "string"}},
        "reservations": {"type": "array", "items": {"type": "object"}},
    },
}


@operation(
    "List resource classes (GPU types)", tags=["scheduling"], params=PAGING, response=CLASS_LIST_SCHEMA
)
async def list_classes(request: web.Request) -> web.Response:
    store = request.app[CTX].store
    items = sorted(store.list("ResourceClass"), key=lambda c: (c.metadata.namespace, c.metadata.name))
    page, token = paginate(request, items)
    body = list_body([c.to_dict() for c in page], next_token=token, resource_version=store.resource_version)
    body["resourceVersion"] = str(store.resource_version)  # where earlier clients read it
    return web.json_response(body)


@operation("Get one resource class", tags=["scheduling"], response=ResourceClass, errors=[404])
async def get_class(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    return web.json_response(
        stored(request, "ResourceClass", "", name, what=f"resource class {name}").to_dict()
    )


@operation(
    "Create or replace a resource class (201 created, 200 replaced; 422 names a bad selector field)",
    tags=["scheduling"],
    body=ResourceClass,
    body_content_types=("application/yaml", "application/json"),
    response=ResourceClass,
    errors=[400, 409, 422],
)
async def put_class(request: web.Request) -> web.Response:
    authorize(request, "admin")
    store = request.app[CTX].store
    name = request.match_info["name"]
    data = await read_one_document(request, "ResourceClass")
    kind = data.get("kind")
    if kind not in (None, ResourceClass.KIND):
        raise ApiError(
            422,
            "the body is not a ResourceClass",
            details=[{"field": "kind", "reason": f"must be ResourceClass, got {kind!r}"}],
        )
    version = data.get("apiVersion")
    if version not in (None, ResourceClass.API_VERSION):
        raise ApiError(
            422,
            "unsupported apiVersion",
            details=[
                {"field": "apiVersion", "reason": f"must be {ResourceClass.API_VERSION}, got {version!r}"}
            ],
        )
    meta = data.setdefault("metadata", {}) or {}
    if not isinstance(meta, dict):
        raise ApiError(
            422, "invalid resource class", details=[{"field": "metadata", "reason": "must be a mapping"}]
        )
    data["metadata"] = meta
    if meta.get("name") not in (None, name):
        raise ApiError(
            422,
            "invalid resource class",
            details=[
                {"field": "metadata.name", "reason": f"{meta['name']!r} differs from the URL's {name!r}"}
            ],
        )
    meta["name"] = name
    problems = validate_resource_class(data)
    if problems:
        raise ApiError(
            422, f"invalid resource class {name}: nothing was stored", details=[p._asdict() for p in problems]
        )
    obj = ResourceClass.model_validate(data)
    existing = store.get_of(ResourceClass, "", name)
    writer = writer_of(request.app[CTX])
    if existing is None:
        stored = await writer.create(obj)
        status = 201
    else:
        wanted_rv = obj.metadata.resource_version
        fresh = existing.model_copy(
            update={
                "spec": obj.spec,
                "metadata": existing.metadata.model_copy(
                    update={
                        "labels": obj.metadata.labels or existing.metadata.labels,
                        "annotations": obj.metadata.annotations or existing.metadata.annotations,
                    }
                ),
            }
        )
        if wanted_rv:
            fresh.metadata.resource_version = wanted_rv
        try:
            stored = await writer.update(fresh)
        except Conflict as exc:
            raise ApiError(409, str(exc)) from None
        status = 200
    return web.json_response(stored.to_dict(), status=status)


@operation("Delete a resource class", tags=["scheduling"], errors=[404])
async def delete_class(request: web.Request) -> web.Response:
    authorize(request, "admin")
    name = request.match_info["name"]
    stored(request, "ResourceClass", "", name, what=f"resource class {name}")
    await delete_object(request.app[CTX], "ResourceClass", "", name, what=f"resource class {name}")
    return web.json_response({"deleted": {"kind": ResourceClass.KIND, "name": name}})


def explain_view(pg: PodGroup, reservations: list[Reservation]) -> dict[str, Any]:
    """What `gpuyard describe job` shows about placement."""
    status = pg.status
    spec = pg.spec
    return {
        "namespace": pg.metadata.namespace,
        "name": pg.metadata.name,
        "phase": status.phase,
        "reason": status.reason,
        "message": status.message,
        "placed": len(reservations),
        "replicas": spec.total_replicas(),
        "minimum": spec.minimum(),
        "attempts": status.attempts,
        "queuedAt": status.queued_at.isoformat() if status.queued_at else None,
        "placedAt": status.placed_at.isoformat() if status.placed_at else None,
        "gangGroup": list(spec.gang_group),
        "reservations": [
            {
                "pod": r.metadata.name,
                "role": r.spec.role,
                "index": r.spec.index,
                "node": r.spec.node,
                "gpus": r.spec.gpus,
                "gpuIds": r.spec.gpu_ids,
                "hostPorts": r.spec.host_ports,
                "nics": r.spec.nics,
            }
            for r in sorted(reservations, key=lambda r: (r.spec.role, r.spec.index))
        ],
    }


@operation(
    "Why a job is (not) placed: its PodGroup's phase, reason and reservations",
    tags=["scheduling", "jobs"],
    response=EXPLAIN_SCHEMA,
    errors=[404],
)
async def explain(request: web.Request) -> web.Response:
    ns, name = request.match_info["ns"], request.match_info["name"]
    authorize(request, "read", ns)
    store = request.app[CTX].store
    pg = store.get_of(PodGroup, ns, name)
    if pg is None:
        raise ApiError(
            404, f"job {ns}/{name} has no PodGroup: it does not exist, or the operator has not seen it yet"
        )
    reservations = [r for r in store.list_of(Reservation, namespace=ns) if r.spec.pod_group == name]
    return web.json_response(explain_view(pg, reservations))


def setup(app: web.Application) -> None:
    app.router.add_get("/api/v1/resourceclasses", list_classes)
    app.router.add_get("/api/v1/resourceclasses/{name}", get_class)
    app.router.add_put("/api/v1/resourceclasses/{name}", put_class)
    app.router.add_delete("/api/v1/resourceclasses/{name}", delete_class)
    app.router.add_get("/api/v1/namespaces/{ns}/jobs/{name}/explain", explain)
