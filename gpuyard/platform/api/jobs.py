"""Job endpoints: submit (YAML or JSON, multi-document, all or nothing), list, get, delete, pods, events.

* `POST /api/v1/jobs` — a body of one or more job documents (YAML `---`, a JSON object or array,
  or a `List`). Every document is validated first; any bad one rejects the whole body (422 with
  each offending field path and the allowed values; 409 for a name already taken) and nothing is
  stored. Then all are created together through the writer (:func:`create_all`: one after
  another with nothing in between, one journal commit; if one is refused, none stays).
  Unknown fields follow `?fieldValidation=` (`fields`); a tenant's job naming a quota or queue
  its namespace is not bound to is a 403 naming the field (`tenancy`). A job that could never
  fit on the cluster's nodes, even empty, is created all the same (nodes may join) with a
  `Warning: 299 - "can never fit on this cluster: ..."` header saying why (`neverfit`).
* `GET /api/v1/jobs?namespace=&phase=&queue=&kind=&limit=&continue=` — jobs of every kind, paged.
* `GET|DELETE /api/v1/namespaces/{ns}/jobs/{name}` — one job; deleting it makes the operator
  delete its PodGroup, reservations, pods and services.
* `PATCH /api/v1/namespaces/{ns}/jobs/{name}` — a JSON merge patch (RFC 7386; content type
  `application/merge-patch+json` or `application/json`) of the fields that may change after
  submit (`apis/jobpatches.py`: labels, annotations, suspend, priority, queue); any other change
  is a 422 naming the field and nothing is stored; `metadata.resourceVersion` in the patch must
  be the stored one (409 otherwise). The operator reacts: a suspended job's pods stop and its
  GPUs are released; resumed, it queues again; a new queue or priority re-queues it there.
* `PUT /api/v1/namespaces/{ns}/jobs/{name}` — 405 with `Allow: GET, PATCH, DELETE`: a job is
  changed by a merge patch of the few fields that may change, never replaced whole.
* `GET /api/v1/namespaces/{ns}/jobs/{name}/pods` and `.../events`.

Handlers read the store and write through the context's writer, and answer once the write is
durable; the job operator reacts to what they write.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Iterator
from typing import Any, cast, get_args

from aiohttp import web

from gpuyard.apis.core import Event, Pod
from gpuyard.apis.decoding import json_loads
from gpuyard.apis.ignoredfields import ignored_fields
from gpuyard.apis.jobkinds import KIND_INFO, TrainingJob, find_job
from gpuyard.apis.jobpatches import merge_patch, patch_problems
from gpuyard.apis.jobs import JobValidationError, load_documents, parse_job
from gpuyard.apis.jobspecs import JobConditionType
from gpuyard.apis.managers import TRAINING_OPERATOR, external_manager
from gpuyard.apis.priorityclasses import unknown_class_problems
from gpuyard.apis.resourceclasses import validate_gang_request
from gpuyard.apis.scheduling import (
    LABEL_JOB_NAME,
    LABEL_REPLICA_INDEX,
    LABEL_REPLICA_TYPE,
    pod_devices,
)
from gpuyard.platform.api.app import CTX, WRITE_ATTEMPTS, decided_again, delete_object, writer_of
from gpuyard.platform.api.auth import Action, allowed_namespaces, authorize
from gpuyard.platform.api.bodies import PATCH_TYPES, body_limit, off_loop, read_text
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.fields import (
    FIELD_VALIDATION_PARAM,
    answer_unknown_fields,
    field_validation,
    unknown_fields,
)
from gpuyard.platform.api.jobschema import job_document_schema
from gpuyard.platform.api.neverfit import never_fit_warnings
from gpuyard.platform.api.openapi import Param, operation
from gpuyard.platform.api.paging import PAGING, event_order, list_body, paginate, paginate_in_order
from gpuyard.platform.api.priorityclasses import all_classes
from gpuyard.platform.api.tenancy import binding_problems, priority_problems
from gpuyard.platform.api.webuis import web_uis
from gpuyard.state.store import AlreadyExists
from gpuyard.state.writing import create_all

__all__ = ["GPUS_PICKED_BY_SCHEMA", "pod_view", "setup", "summarize"]


def summarize(job: TrainingJob) -> dict[str, Any]:
    """The job as stored plus the few derived fields a list view wants (`summary`)."""
    out = job.to_dict()
    replicas = {role: spec.count for role, spec in job.replica_specs.items()}
    out["summary"] = {
        "phase": job.status.phase or "Created",
        "queue": job.queue,
        "flavor": job.flavor,
        "replicas": replicas,
        "restarts": job.status.restarts,
        "hostNetwork": job.host_network,
        "managedBy": external_manager(job) or TRAINING_OPERATOR,
    }
    return out


def _json_documents(text: str) -> list[Any]:
    """A JSON body, parsed strictly (and within the decoding limits): one job, an array of jobs, or a `List`."""
    import json

    try:
        data = json_loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise JobValidationError(
            f"malformed JSON: {exc.msg} at {where}", [{"field": "<body>", "reason": f"{exc.msg} at {where}"}]
        ) from None
    if isinstance(data, list):
        docs = data
    elif isinstance(data, dict) and data.get("kind") == "List" and isinstance(data.get("items"), list):
        docs = data["items"]
    else:
        docs = [data]
    if not docs:
        raise JobValidationError(
            "no job documents in the body", [{"field": "<body>", "reason": "empty array"}]
        )
    return docs


Decoded = tuple[TrainingJob | None, list[dict[str, str]], list[str], list[tuple[str, str]]]


def _decode_jobs(text: str, *, json_body: bool, max_bytes: int, limit_name: str) -> list[Decoded]:
    """Decode a submit body and validate each job document (in a worker thread: no store reads):
    per document, the job (None when invalid), its problems, its unknown fields and the fields it
    sets that gpuyard does not act on (`apis/ignoredfields.py`), with the `documents[I].` prefix
    when the body holds more than one."""
    try:
        if json_body:
            docs = _json_documents(text)
        else:
            docs = load_documents(text, max_bytes=max_bytes, limit_name=limit_name)
    except JobValidationError as exc:
        raise ApiError(400, exc.message, details=exc.details) from None
    prefix = "documents[{}]." if len(docs) > 1 else ""
    out: list[Decoded] = []
    for i, doc in enumerate(docs):
        where = prefix.format(i)
        try:
            job = parse_job(doc)
        except JobValidationError as exc:
            out.append(
                (None, [{"field": where + d["field"], "reason": d["reason"]} for d in exc.details], [], [])
            )
            continue
        info = KIND_INFO[job.kind]
        out.append(
            (
                job,
                [],
                unknown_fields(info.cls, doc, prefix=where),
                ignored_fields(doc, replica_field=info.replica_field, prefix=where),
            )
        )
    return out


def pod_view(pod: Pod) -> dict[str, Any]:
    """The pod as stored plus `summary`: phase, node, host port, devices and each container's env."""
    out = pod.to_dict()
    ports = [p.host_port for c in pod.spec.containers for p in c.ports if p.host_port]
    devices = pod_devices(pod)
    out["summary"] = {
        "phase": pod.status.phase,
        "node": pod.spec.node_name,
        "hostPort": ports[0] if ports else None,
        "replicaType": pod.metadata.labels.get(LABEL_REPLICA_TYPE),
        "replicaIndex": pod.metadata.labels.get(LABEL_REPLICA_INDEX),
        "gpus": devices.get("gpus", []),
        "exitCode": pod.status.exit_code,
        "reason": pod.status.reason,
        "env": {c.name: {e.name: e.value for e in c.env if e.value is not None} for c in pod.spec.containers},
    }
    return out


JOB_SCHEMA: dict[str, Any] = {
    "description": "One or more KubeDL (training.kubedl.io/v1alpha1) or Kubeflow (kubeflow.org/v1) job documents",
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": {"type": "object"},
    },
}
LIST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": {"type": "object"}}},
}

GPUS_PICKED_BY_SCHEMA: dict[str, Any] = {
    "type": "string",
    "enum": ["scheduler", "kubelet"],
    "description": "Who picks the GPUs a container gets: `scheduler` (the pods' `gpus` are the container's) or "
    "`kubelet` (count-only mode, `backend.kubernetes.gpu_resource: nvidia.com/gpu`: NVIDIA's device plugin "
    "picks them, and the scheduler's GPU indices need not be what the container gets).",
}
JOB_PODS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "items": {"type": "array", "items": {"type": "object"}},
        "gpusPickedBy": GPUS_PICKED_BY_SCHEMA,
    },
}


_YIELD_EVERY = 100
"""Documents of one submission checked between two yields to the event loop."""


@operation(
    "Submit jobs (YAML or JSON, multi-document; all or nothing)",
    tags=["jobs"],
    params=[FIELD_VALIDATION_PARAM],
    body=job_document_schema,
    body_content_types=("application/yaml", "application/json"),
    response=LIST_SCHEMA,
    errors=[400, 403, 409, 422],
    created=True,
)
async def submit(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    server = ctx.settings.server
    mode = field_validation(request)
    text = await read_text(request, timeout_s=server.body_timeout_seconds)
    limit, limit_name = body_limit(request)
    decoded = await off_loop(
        _decode_jobs,
        text,
        json_body=request.content_type == "application/json",
        max_bytes=limit,
        limit_name=limit_name,
        timeout_s=server.decode_timeout_seconds,
    )
    multi = len(decoded) > 1
    jobs: list[TrainingJob] = []
    problems: list[dict[str, str]] = []
    unknown: list[str] = []
    unused: list[tuple[str, str]] = []
    classes = all_classes(ctx.store).values()
    for i, (job, found, strange, ignored) in enumerate(decoded):
        if i and not i % _YIELD_EVERY:
            await asyncio.sleep(0)  # a bulk submission shares the loop with every other request
        prefix = f"documents[{i}]." if multi else ""
        problems += found
        if job is None:
            continue
        unknown += strange
        unused += ignored
        for problem in validate_gang_request(job, store=ctx.store):  # could this job ever be placed?
            problems.append({"field": prefix + problem.field, "reason": problem.reason})
        for detail in unknown_class_problems(job, classes):
            problems.append({"field": prefix + detail["field"], "reason": detail["reason"]})
        jobs.append(job)
    if problems:
        what = "job" if not multi else f"{len(decoded)} documents"
        raise ApiError(422, f"invalid {what}: nothing was stored", details=problems)
    warnings = answer_unknown_fields(mode, unknown, ignored=unused)  # Strict: 422 naming them
    forbidden: list[dict[str, str]] = []
    for i, job in enumerate(jobs):
        who = authorize(request, "write", job.metadata.namespace)
        prefix = f"documents[{i}]." if multi else ""
        forbidden += binding_problems(ctx.store, who, job, prefix=prefix)
        forbidden += priority_problems(ctx.store, who, job, classes, prefix=prefix)
    if forbidden:
        raise ApiError(
            403,
            f"{forbidden[0]['reason']}: nothing was stored",
            details=forbidden,
        )
    conflicts = []
    seen: set[tuple[str, str]] = set()
    for i, job in enumerate(jobs):
        key = (job.metadata.namespace, job.metadata.name)
        existing = find_job(ctx.store, *key)
        field = f"documents[{i}].metadata.name" if multi else "metadata.name"
        if existing is not None:
            conflicts.append(
                {
                    "field": field,
                    "reason": f"{existing.kind} {key[0]}/{key[1]} already exists; job names are unique in a namespace",
                }
            )
        elif key in seen:
            conflicts.append(
                {"field": field, "reason": f"{key[0]}/{key[1]} is given twice in this submission"}
            )
        seen.add(key)
    if conflicts:
        raise ApiError(409, "a job with this name already exists: nothing was stored", details=conflicts)
    try:
        created = await create_all(writer_of(ctx), jobs)
    except AlreadyExists as exc:  # created by someone else since the check above
        raise ApiError(409, f"{exc}: nothing was stored") from None
    response = web.json_response({"items": [summarize(j) for j in created]}, status=201)
    for warning in warnings + never_fit_warnings(ctx.store, created):  # stored: they may fit later
        response.headers.add("Warning", warning)
    return response


@operation(
    "List jobs of every kind",
    tags=["jobs"],
    params=[
        Param("namespace", description="Only this namespace"),
        Param(
            "phase", description="Created | Queuing | Running | Restarting | Succeeded | Failed | Suspended"
        ),
        Param("queue", description="Only jobs of this queue"),
        Param("kind", description="Only this kind (TFJob, PyTorchJob, ...)"),
        *PAGING,
    ],
    response=LIST_SCHEMA,
    errors=[400],
)
async def list_jobs(request: web.Request) -> web.Response:
    store = request.app[CTX].store
    q = request.query
    namespace = q.get("namespace") or None
    if namespace:
        authorize(request, "read", namespace)
    visible = allowed_namespaces(request)
    phase, queue, kind = q.get("phase"), q.get("queue"), q.get("kind")
    if kind and kind not in KIND_INFO:
        raise ApiError(
            400,
            f"unknown kind {kind!r}",
            details=[{"field": "kind", "reason": f"allowed: {', '.join(sorted(KIND_INFO))}"}],
        )
    phases = get_args(JobConditionType)
    if phase and phase.lower() not in {p.lower() for p in phases}:
        raise ApiError(
            400,
            f"unknown phase {phase[:64]!r}",
            details=[{"field": "phase", "reason": f"allowed: {', '.join(phases)}"}],
        )
    wanted = phase.lower() if phase else None

    def matching(jobs: Iterator[TrainingJob]) -> Iterator[TrainingJob]:
        for job in jobs:
            ns = job.metadata.namespace
            if namespace is not None and ns != namespace:
                return  # in (namespace, name) order: past the namespace asked for
            if visible is not None and ns not in visible:
                continue
            if wanted and (job.status.phase or "Created").lower() != wanted:
                continue
            if queue and job.queue != queue:
                continue
            yield job

    def jobs_after(after: tuple[str, str] | None) -> Iterator[TrainingJob]:
        """Every kind's matching jobs in (namespace, name) order, merged (kinds in KIND_INFO order
        where two share a name): a page reads only the jobs up to its end."""
        if namespace is not None and (after is None or after < (namespace, "")):
            after = (namespace, "")
        walks = [
            matching(store.in_order(cast(type[TrainingJob], store.kind_class(k)), after=after))
            for k in ([kind] if kind else list(KIND_INFO))
        ]
        return heapq.merge(*walks, key=lambda j: (j.metadata.namespace, j.metadata.name))

    page, token = paginate_in_order(request, jobs_after)
    body = list_body([summarize(j) for j in page], next_token=token, resource_version=store.resource_version)
    body["resourceVersion"] = str(store.resource_version)  # where earlier clients read it
    return web.json_response(body)


def _job(request: web.Request, action: Action = "read") -> TrainingJob:
    ns, name = request.match_info["ns"], request.match_info["name"]
    authorize(request, action, ns)
    job = find_job(request.app[CTX].store, ns, name)
    if job is None:
        raise ApiError(404, f"job {ns}/{name} not found")
    return job


@operation("Get one job", tags=["jobs"], response=JOB_SCHEMA, errors=[404])
async def get_job(request: web.Request) -> web.Response:
    job = _job(request)
    body = summarize(job)
    body["summary"]["webUIs"] = web_uis(request.app[CTX].store, job)  # Tensorboard, Mars web (webuis.py)
    return web.json_response(body)


@operation("Delete a job with its pods, services, reservations and PodGroup", tags=["jobs"], errors=[404])
async def delete_job(request: web.Request) -> web.Response:
    job = _job(request, "write")
    ns, name = job.metadata.namespace, job.metadata.name
    await delete_object(request.app[CTX], job.kind, ns, name, what=f"job {ns}/{name}")
    return web.json_response(
        {"deleted": {"kind": job.kind, "namespace": job.metadata.namespace, "name": job.metadata.name}}
    )


@operation(
    "Change a job: a JSON merge patch of labels, annotations, suspend, priority or queue",
    tags=["jobs"],
    body={"type": "object", "description": "RFC 7386 merge patch of the job"},
    body_content_types=PATCH_TYPES,
    response=JOB_SCHEMA,
    errors=[400, 404, 409, 415, 422],
)
async def patch_job(request: web.Request) -> web.Response:
    import json

    if request.content_type not in PATCH_TYPES:
        raise ApiError(
            415,
            f"unsupported content type {request.content_type!r}; allowed: {', '.join(PATCH_TYPES)}",
            details=[{"field": "Content-Type", "reason": f"allowed: {', '.join(PATCH_TYPES)}"}],
        )
    _job(request, "write")  # 404, or 403 for a caller who may not write it, before the body is read
    server = request.app[CTX].settings.server
    text = await read_text(request, timeout_s=server.body_timeout_seconds)
    try:
        patch = await off_loop(json_loads, text, timeout_s=server.decode_timeout_seconds)
    except json.JSONDecodeError as exc:
        raise ApiError(
            400, f"the patch is not JSON: {exc}", details=[{"field": "<body>", "reason": str(exc)}]
        ) from None
    if not isinstance(patch, dict):
        raise ApiError(
            400,
            "a merge patch must be a JSON object",
            details=[{"field": "<body>", "reason": "expected an object"}],
        )
    wanted_rv = (
        (patch.get("metadata") or {}).get("resourceVersion")
        if isinstance(patch.get("metadata"), dict)
        else None
    )
    # Without a resourceVersion in the patch, a write that raced the operator's (its status, on
    # Kubernetes a 409 from the API server) is decided again on the fresher job, as the API server
    # does for a merge patch; with one, the 409 is the answer.
    return await decided_again(
        lambda: _patch_once(request, _job(request, "write"), patch=patch, wanted_rv=wanted_rv),
        attempts=1 if wanted_rv is not None else WRITE_ATTEMPTS,
        note="; nothing was changed",
    )


async def _patch_once(
    request: web.Request, job: TrainingJob, *, patch: dict[str, Any], wanted_rv: object
) -> web.Response:
    """One try of `patch_job` against `job` as stored now; raises :class:`Conflict` when it is stale."""
    ctx = request.app[CTX]
    if wanted_rv is not None and str(wanted_rv) != job.metadata.resource_version:
        raise ApiError(
            409,
            f"job {job.metadata.namespace}/{job.metadata.name} changed: resourceVersion {wanted_rv} is stale "
            f"(current {job.metadata.resource_version}); nothing was changed",
            details=[{"field": "metadata.resourceVersion", "reason": "stale"}],
        )
    before = job.to_dict()
    before.pop("status", None)
    after = merge_patch(before, patch)
    problems = patch_problems(before, after)
    if problems:
        raise ApiError(422, f"{problems[0]['reason']}; nothing was changed", details=problems)
    if after == before:
        return web.json_response(summarize(job))
    try:
        updated = parse_job(after)
    except JobValidationError as exc:
        raise ApiError(
            422, f"invalid patch: {exc.message}; nothing was changed", details=exc.details
        ) from None
    problems = unknown_class_problems(updated, all_classes(ctx.store).values())
    if problems:
        raise ApiError(422, f"{problems[0]['reason']}; nothing was changed", details=problems)
    who = authorize(request, "write", job.metadata.namespace)
    forbidden = binding_problems(ctx.store, who, updated) + priority_problems(
        ctx.store, who, updated, all_classes(ctx.store).values()
    )
    if forbidden:
        raise ApiError(403, f"{forbidden[0]['reason']}; nothing was changed", details=forbidden)
    updated.metadata = job.metadata.model_copy(
        update={"labels": updated.metadata.labels, "annotations": updated.metadata.annotations}
    )
    stored = await writer_of(ctx).update(updated)
    assert isinstance(stored, TrainingJob)
    return web.json_response(summarize(stored))


@operation(
    "Not allowed: a job is changed with PATCH (405, `Allow: GET, PATCH, DELETE`)",
    tags=["jobs"],
    errors=[404, 405],
)
async def put_job(request: web.Request) -> web.Response:
    _job(request, "write")
    message = (
        "a job is changed with PATCH (a JSON merge patch of labels, annotations, suspend, priority, "
        "queue), not replaced with PUT"
    )
    return web.json_response(
        {"error": {"code": 405, "message": message, "details": []}},
        status=405,
        headers={"Allow": "GET, PATCH, DELETE"},
    )


@operation(
    "The pods of a job, with node, host port, GPUs and env",
    tags=["jobs"],
    params=PAGING,
    response=JOB_PODS_SCHEMA,
    errors=[404],
)
async def job_pods(request: web.Request) -> web.Response:
    job = _job(request)
    store = request.app[CTX].store
    pods = [
        p
        for p in store.list_of(
            Pod, namespace=job.metadata.namespace, selector={LABEL_JOB_NAME: job.metadata.name}
        )
        if any(ref.uid == job.metadata.uid for ref in p.metadata.owner_references)
    ]
    pods.sort(key=lambda p: (p.metadata.namespace, p.metadata.name))
    page, token = paginate(request, pods)
    body = list_body([pod_view(p) for p in page], next_token=token, resource_version=store.resource_version)
    body["gpusPickedBy"] = request.app[CTX].settings.backend.gpus_picked_by
    return web.json_response(body)


@operation(
    "The events of a job, oldest first", tags=["jobs"], params=PAGING, response=LIST_SCHEMA, errors=[404]
)
async def job_events(request: web.Request) -> web.Response:
    job = _job(request)
    store = request.app[CTX].store
    events = [
        e
        for e in store.list_of(
            Event, namespace=job.metadata.namespace, selector={LABEL_JOB_NAME: job.metadata.name}
        )
        if e.involved_object.get("uid") == job.metadata.uid
    ]
    events.sort(key=event_order)
    page, token = paginate(request, events, key=event_order)
    # The list's resourceVersion: a watch from it misses nothing that happens after this answer.
    return web.json_response(
        list_body([e.to_dict() for e in page], next_token=token, resource_version=store.resource_version)
    )


def setup(app: web.Application) -> None:
    app.router.add_post("/api/v1/jobs", submit)
    app.router.add_get("/api/v1/jobs", list_jobs)
    app.router.add_get("/api/v1/namespaces/{ns}/jobs/{name}", get_job)
    app.router.add_delete("/api/v1/namespaces/{ns}/jobs/{name}", delete_job)
    app.router.add_patch("/api/v1/namespaces/{ns}/jobs/{name}", patch_job)
    app.router.add_put("/api/v1/namespaces/{ns}/jobs/{name}", put_job)
    app.router.add_get("/api/v1/namespaces/{ns}/jobs/{name}/pods", job_pods)
    app.router.add_get("/api/v1/namespaces/{ns}/jobs/{name}/events", job_events)
