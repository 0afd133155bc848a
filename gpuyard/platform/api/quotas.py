"""Quota and queue endpoints: create, read, replace and delete ElasticQuota, Queue, ResourceQuota.

* `GET /api/v1/quotas`, `GET|PUT|DELETE /api/v1/quotas/{name}` — the ElasticQuota tree. Quota
  names are cluster-wide (the tree is keyed by name) while the store keeps each quota in a
  namespace (`metadata.namespace`, default `default`): `{name}` finds it in whichever namespace it
  lives, and a PUT without a namespace keeps the one it has.
  Once quotas are in use, the quota that charges jobs no quota covers, `koordinator-default-quota`
  (min 0, no max, as in Koordinator), is listed like any other even when nobody stored it:
  *implicit*, with the annotation `gpuyard.io/implicit: "true"`, its `used` (the Reservations of
  its jobs) and `request` (its unfinished jobs' whole demand) counted from the store, and no
  `runtime` (only the scheduler knows it; a job's quota reason names it). A PUT stores it.
* `GET /api/v1/queues`, `GET|PUT|DELETE /api/v1/queues/{name}` — tenant queues (cluster-scoped).
  A queue that jobs name (`schedulingPolicy.queue`, else their namespace) but no Queue object
  defines is *implicit*: list and get show it with the default settings, the annotation
  `gpuyard.io/implicit: "true"` and its pending/running counts (from the jobs and their
  PodGroups in the caller's namespaces; no `share`, which only the scheduler knows).
* `GET /api/v1/resourcequotas` (`?namespace=`), `GET|PUT|DELETE
  /api/v1/namespaces/{ns}/resourcequotas/{name}` — per-namespace hard limits.
* `POST /api/v1/apply` (module `applying`) — a policy file of all these kinds, all or nothing.

Bodies are YAML or JSON. A PUT creates (201) or replaces (200) the spec, labels and annotations
and keeps the status the scheduler wrote; a `metadata.resourceVersion` makes it conditional
(409 when stale). Bad input is a 422 whose `details` name the object and the field; nothing
stored changes. Deleting a quota that still has children is a 409. Changes need the admin
role, reads the read role (ResourceQuotas: in their namespace).

Handlers read the store and write through the context's writer; the scheduler applies the change at its next cycle. Body
decoding and storing are in `manifests`.
"""

from __future__ import annotations

from aiohttp import web

from gpuyard.apis.jobkinds import KIND_INFO
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.quota import QuotaValidationError, parse_quota_document, validate_quota_deletion
from gpuyard.apis.quotakinds import (
    DEFAULT_QUOTA,
    LABEL_QUOTA_NAME,
    ElasticQuota,
    ElasticQuotaStatus,
    Queue,
    QueueStatus,
    ResourceQuota,
)
from gpuyard.apis.scheduling import PodGroup, Reservation
from gpuyard.platform.api.app import CTX, delete_object, stored
from gpuyard.platform.api.auth import allowed_namespaces, authorize
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.manifests import (
    PAGING,
    find_quota,
    list_response,
    list_schema,
    prepare_document,
    put_response,
    read_one_document,
    rejected_fields,
    stored_quotas,
    visible_list_response,
)
from gpuyard.platform.api.openapi import Param, operation
from gpuyard.platform.api.paging import list_body, paginate
from gpuyard.platform.api.tenancy import default_quota
from gpuyard.platform.cluster_metrics import PENDING_PHASES
from gpuyard.scheduler.admission.quota.resources import (
    Vector,
    add,
    podgroup_usage,
    quantities_of,
    usage_of_requests,
)
from gpuyard.state.store import Store

__all__ = ["setup"]


# --- ElasticQuota -------------------------------------------------------------------------------


@operation(
    "List elastic quotas (the quota tree) with the runtime/used/request the scheduler wrote",
    tags=["quotas"],
    params=PAGING,
    response=list_schema("ElasticQuota"),
    errors=[401, 422],
)
async def list_quotas(request: web.Request) -> web.Response:
    authorize(request, "read")
    store = request.app[CTX].store
    implicit = implicit_default_quota(store)
    return list_response(request, [*stored_quotas(store), *([implicit] if implicit else [])])


@operation(
    "Get one elastic quota by its cluster-wide name",
    tags=["quotas"],
    response=ElasticQuota,
    errors=[401, 404],
)
async def get_quota(request: web.Request) -> web.Response:
    authorize(request, "read")
    name = request.match_info["name"]
    store = request.app[CTX].store
    obj = find_quota(store, name)
    if obj is None and name == DEFAULT_QUOTA:
        obj = implicit_default_quota(store)
    if obj is None:
        raise ApiError(404, f"elastic quota {name} not found")
    return web.json_response(obj.to_dict())


@operation(
    "Create or replace an elastic quota (201/200); 422 names the object and field, nothing is stored",
    tags=["quotas"],
    body=ElasticQuota,
    body_content_types=("application/yaml", "application/json"),
    response=ElasticQuota,
    errors=[400, 401, 403, 409, 422],
)
async def put_quota(request: web.Request) -> web.Response:
    authorize(request, "admin")
    store = request.app[CTX].store
    name = request.match_info["name"]
    data = prepare_document(await read_one_document(request, "ElasticQuota"), kind="ElasticQuota", name=name)
    current = stored_quotas(store)
    existing = next((q for q in current if q.metadata.name == name), None)
    if existing is not None and not data["metadata"].get("namespace"):
        data["metadata"]["namespace"] = existing.metadata.namespace
    try:
        obj = parse_quota_document(data, current_quotas=current)
    except QuotaValidationError as exc:
        raise ApiError(
            422, f"{exc.message}: nothing was stored", details=rejected_fields("ElasticQuota", name, exc)
        ) from None
    return await put_response(request.app[CTX], obj)


@operation(
    "Delete an elastic quota (409 while it still has children)",
    tags=["quotas"],
    errors=[401, 403, 404, 409],
)
async def delete_quota(request: web.Request) -> web.Response:
    authorize(request, "admin")
    store = request.app[CTX].store
    name = request.match_info["name"]
    current = stored_quotas(store)
    obj = next((q for q in current if q.metadata.name == name), None)
    if obj is None:
        raise ApiError(404, f"elastic quota {name} not found")
    problems = validate_quota_deletion(current, name)
    if problems:
        raise ApiError(
            409,
            f"elastic quota {name} was not deleted",
            details=[{"object": f"ElasticQuota/{o}", "field": f, "reason": r} for o, f, r in problems],
        )
    await delete_object(
        request.app[CTX], "ElasticQuota", obj.metadata.namespace, name, what=f"elastic quota {name}"
    )
    return web.json_response(
        {"deleted": {"kind": "ElasticQuota", "namespace": obj.metadata.namespace, "name": name}}
    )


def implicit_default_quota(store: Store) -> ElasticQuota | None:
    """`koordinator-default-quota` as the scheduler's quota tree has it when nobody stored it
    (min 0, no max), once any quota is stored; None otherwise. Its `used` and `request` are
    counted from the store: the Reservations and the unfinished PodGroups of the jobs it charges
    (their quota label, else the quota covering their namespace, else this one)."""
    quotas = stored_quotas(store)
    if not quotas or any(q.metadata.name == DEFAULT_QUOTA for q in quotas):
        return None
    kinds = set(store.kinds())
    charged: set[tuple[str, str]] = set()
    request: Vector = {}
    if "PodGroup" in kinds:
        for pg in store.list_of(PodGroup):
            meta = pg.metadata
            quota = meta.labels.get(LABEL_QUOTA_NAME, "").strip() or default_quota(quotas, meta.namespace)
            if quota == DEFAULT_QUOTA and pg.status.phase in ("Pending", "Placed"):
                charged.add((meta.namespace, meta.name))
                add(request, podgroup_usage(pg))
    used: Vector = {}
    if charged and "Reservation" in kinds:
        for res in store.list_of(Reservation):
            if (res.metadata.namespace, res.spec.pod_group) in charged:
                add(used, usage_of_requests(res.spec.requests))
    return ElasticQuota(
        metadata=ObjectMeta(name=DEFAULT_QUOTA, annotations={IMPLICIT: "true"}),
        status=ElasticQuotaStatus(used=quantities_of(used), request=quantities_of(request)),
    )


# --- Queue --------------------------------------------------------------------------------------


@operation(
    "List queues with their pending/running jobs and fair share",
    tags=["quotas"],
    params=PAGING,
    response=list_schema("Queue"),
    errors=[401, 422],
)
async def list_queues(request: web.Request) -> web.Response:
    authorize(request, "read")
    store = request.app[CTX].store
    queues = sorted(
        [*store.list_of(Queue), *implicit_queues(store, allowed_namespaces(request)).values()],
        key=lambda q: q.metadata.name,
    )
    page, token = paginate(request, queues)
    return web.json_response(
        list_body([queue_view(q) for q in page], next_token=token, resource_version=store.resource_version)
    )


@operation("Get one queue (an implicit one too)", tags=["quotas"], response=Queue, errors=[401, 404])
async def get_queue(request: web.Request) -> web.Response:
    authorize(request, "read")
    store = request.app[CTX].store
    name = request.match_info["name"]
    queue = store.get_of(Queue, "", name) or implicit_queues(store, allowed_namespaces(request)).get(name)
    if queue is None:
        raise ApiError(404, f"queue {name} not found: no Queue object defines it and no job names it")
    return web.json_response(queue_view(queue))


IMPLICIT = "gpuyard.io/implicit"


def implicit_queues(store: Store, visible: frozenset[str] | None) -> dict[str, Queue]:
    """The queues jobs use (`schedulingPolicy.queue`, else their namespace) that no Queue object
    defines, by name, with default settings and their jobs counted: pending (PodGroup Pending,
    or no PodGroup yet and the job not started) and running (PodGroup Placed). Only jobs in the
    `visible` namespaces (None: all) are seen."""
    defined = {q.metadata.name for q in store.list_of(Queue)}
    kinds = set(store.kinds())
    groups = (
        {(pg.metadata.namespace, pg.metadata.name): pg for pg in store.list_of(PodGroup)}
        if "PodGroup" in kinds
        else {}
    )
    counts: dict[str, list[int]] = {}
    for info in KIND_INFO.values():
        if info.cls.KIND not in kinds:
            continue
        for job in store.list_of(info.cls):
            ns = job.metadata.namespace
            if (visible is not None and ns not in visible) or job.queue in defined:
                continue
            count = counts.setdefault(job.queue, [0, 0])
            pg = groups.get((ns, job.metadata.name))
            if pg is not None:
                if pg.status.phase == "Placed":
                    count[1] += 1
                elif pg.status.phase == "Pending":
                    count[0] += 1
            elif (job.status.phase or "") in PENDING_PHASES:
                count[0] += 1
    return {
        name: Queue(
            metadata=ObjectMeta(name=name, annotations={IMPLICIT: "true"}),
            status=QueueStatus(pending=pending, running=running),
        )
        for name, (pending, running) in counts.items()
    }


def queue_view(queue: Queue) -> dict[str, object]:
    """A queue as the API shows it; an implicit one without the `share` only the scheduler knows."""
    data = queue.to_dict()
    if queue.metadata.annotations.get(IMPLICIT) == "true":
        status = data.get("status")
        if isinstance(status, dict):
            status.pop("share", None)
    return data


@operation(
    "Create or replace a queue (201/200); 422 names the field",
    tags=["quotas"],
    body=Queue,
    body_content_types=("application/yaml", "application/json"),
    response=Queue,
    errors=[400, 401, 403, 409, 422],
)
async def put_queue(request: web.Request) -> web.Response:
    authorize(request, "admin")
    name = request.match_info["name"]
    data = prepare_document(await read_one_document(request, "Queue"), kind="Queue", name=name)
    try:
        obj = parse_quota_document(data)
    except QuotaValidationError as exc:
        raise ApiError(
            422, f"{exc.message}: nothing was stored", details=rejected_fields("Queue", name, exc)
        ) from None
    return await put_response(request.app[CTX], obj)


@operation("Delete a queue", tags=["quotas"], errors=[401, 403, 404])
async def delete_queue(request: web.Request) -> web.Response:
    authorize(request, "admin")
    name = request.match_info["name"]
    stored(request, "Queue", "", name, what=f"queue {name}")
    await delete_object(request.app[CTX], "Queue", "", name, what=f"queue {name}")
    return web.json_response({"deleted": {"kind": "Queue", "name": name}})


# --- ResourceQuota ------------------------------------------------------------------------------


@operation(
    "List resource quotas (namespace hard limits and what is used) in the namespaces you may see",
    tags=["quotas"],
    params=[Param("namespace", description="Only this namespace."), *PAGING],
    response=list_schema("ResourceQuota"),
    errors=[401, 403, 422],
)
async def list_resource_quotas(request: web.Request) -> web.Response:
    return visible_list_response(request, "ResourceQuota")


@operation(
    "Get one resource quota",
    tags=["quotas"],
    response=ResourceQuota,
    errors=[401, 403, 404],
)
async def get_resource_quota(request: web.Request) -> web.Response:
    ns, name = request.match_info["ns"], request.match_info["name"]
    authorize(request, "read", ns)
    return web.json_response(
        stored(request, "ResourceQuota", ns, name, what=f"resource quota {ns}/{name}").to_dict()
    )


@operation(
    "Create or replace a resource quota (201/200); 422 names the field",
    tags=["quotas"],
    body=ResourceQuota,
    body_content_types=("application/yaml", "application/json"),
    response=ResourceQuota,
    errors=[400, 401, 403, 409, 422],
)
async def put_resource_quota(request: web.Request) -> web.Response:
    authorize(request, "admin")
    ns, name = request.match_info["ns"], request.match_info["name"]
    raw = await read_one_document(request, "ResourceQuota")
    data = prepare_document(raw, kind="ResourceQuota", name=name, namespace=ns)
    try:
        obj = parse_quota_document(data)
    except QuotaValidationError as exc:
        raise ApiError(
            422,
            f"{exc.message}: nothing was stored",
            details=rejected_fields("ResourceQuota", f"{ns}/{name}", exc),
        ) from None
    return await put_response(request.app[CTX], obj)


@operation("Delete a resource quota", tags=["quotas"], errors=[401, 403, 404])
async def delete_resource_quota(request: web.Request) -> web.Response:
    authorize(request, "admin")
    ns, name = request.match_info["ns"], request.match_info["name"]
    stored(request, "ResourceQuota", ns, name, what=f"resource quota {ns}/{name}")
    await delete_object(request.app[CTX], "ResourceQuota", ns, name, what=f"resource quota {ns}/{name}")
    return web.json_response({"deleted": {"kind": "ResourceQuota", "namespace": ns, "name": name}})


def setup(app: web.Application) -> None:
    app.router.add_get("/api/v1/quotas", list_quotas)
    app.router.add_get("/api/v1/quotas/{name}", get_quota)
    app.router.add_put("/api/v1/quotas/{name}", put_quota)
    app.router.add_delete("/api/v1/quotas/{name}", delete_quota)
    app.router.add_get("/api/v1/queues", list_queues)
    app.router.add_get("/api/v1/queues/{name}", get_queue)
    app.router.add_put("/api/v1/queues/{name}", put_queue)
    app.router.add_delete("/api/v1/queues/{name}", delete_queue)
    app.router.add_get("/api/v1/resourcequotas", list_resource_quotas)
    app.router.add_get("/api/v1/namespaces/{ns}/resourcequotas/{name}", get_resource_quota)
    app.router.add_put("/api/v1/namespaces/{ns}/resourcequotas/{name}", put_resource_quota)
    app.router.add_delete("/api/v1/namespaces/{ns}/resourcequotas/{name}", delete_resource_quota)
