"""Quota and queue endpoints: ElasticQuota, Queue, ResourceQuota, and `apply` of a policy file.

* `GET /api/v1/quotas`, `GET|PUT|DELETE /api/v1/quotas/{name}` — the ElasticQuota tree. Quota
  names are cluster-wide (the tree is keyed by name) while the store keeps each quota in a
  namespace (`metadata.namespace`, default `default`): `{name}` finds it in whichever namespace it
  lives, and a PUT without a namespace keeps the one it has.
* `GET /api/v1/queues`, `GET|PUT|DELETE /api/v1/queues/{name}` — tenant queues (cluster-scoped).
* `GET /api/v1/resourcequotas` (`?namespace=`), `GET|PUT|DELETE
  /api/v1/namespaces/{ns}/resourcequotas/{name}` — per-namespace hard limits.
* `POST /api/v1/apply` — a multi-document YAML (or JSON list) of ElasticQuotas, ResourceQuotas,
  Queues and ResourceClasses: every document is validated first (the quotas as one tree: the
  tree in force with all of the file's quotas in it), then all are stored, or none.

Bodies are YAML or JSON. A PUT creates (201) or replaces (200) the spec, labels and annotations
and keeps the status the scheduler wrote; a `metadata.resourceVersion` makes it conditional
(409 when stale). Bad input is a 422 whose `details` name the object and the field; nothing
stored changes. Deleting a quota that still has children is a 409. Changes need the admin
role, reads the read role (ResourceQuotas: in their namespace).

Handlers only read and write the store; the scheduler applies the change at its next cycle.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import yaml
from aiohttp import web

from gpuyard.apis.meta import Resource
from gpuyard.apis.quota import (
    API_ELASTIC_QUOTA,
    API_QUEUE,
    ElasticQuota,
    Queue,
    QuotaValidationError,
    ResourceQuota,
    parse_quota_document,
    validate_quota_deletion,
    validate_quotas,
)
from gpuyard.apis.resourceclasses import ResourceClass, validate_resource_class
from gpuyard.platform.api.app import CTX, stored
from gpuyard.platform.api.auth import allowed_namespaces, authorize
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.openapi import Param, operation
from gpuyard.platform.api.paging import list_body, paginate
from gpuyard.platform.store import Conflict, Store

__all__ = ["apply_documents", "setup"]

APPLY_KINDS = ("ElasticQuota", "Queue", "ResourceClass", "ResourceQuota")
_API_VERSIONS = {
    "ElasticQuota": API_ELASTIC_QUOTA,
    "Queue": API_QUEUE,
    "ResourceQuota": "v1",
    "ResourceClass": ResourceClass.API_VERSION,
}


def _list_schema(ref: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"$ref": f"#/components/schemas/{ref}"}},
            "metadata": {
                "type": "object",
                "properties": {
                    "continue": {"type": "string", "nullable": True},
                    "resourceVersion": {"type": "string"},
                },
            },
        },
    }


APPLY_RESULT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "applied": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "kind": {"type": "string"},
                    "namespace": {"type": "string"},
                    "name": {"type": "string"},
                    "action": {"type": "string", "enum": ["created", "configured", "unchanged"]},
                },
            },
        }
    },
}
APPLY_BODY_SCHEMA: dict[str, Any] = {
    "type": "string",
    "description": "Multi-document YAML (or a JSON list) of "
    + ", ".join(APPLY_KINDS)
    + " objects; all are validated, then all stored or none.",
}
_PAGING = [
    Param("limit", description="Page size (1..5000, default 500).", type="integer"),
    Param("continue", description="Token from the previous page."),
]


# --- bodies -------------------------------------------------------------------------------------


def _decode(raw: bytes) -> list[Any]:
    """Documents of a YAML or JSON body (multi-document YAML, a JSON list, or a `List`)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "the body is not UTF-8 text; send YAML or JSON") from None
    try:
        if text.lstrip().startswith(("{", "[")):
            data = json.loads(text)
            docs = data if isinstance(data, list) else [data]
        else:
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise ApiError(400, f"malformed YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if len(docs) == 1 and isinstance(docs[0], dict) and docs[0].get("kind") == "List":
        items = docs[0].get("items")
        docs = items if isinstance(items, list) else []
    return docs


def _one(raw: bytes, kind: str) -> dict[str, Any]:
    docs = _decode(raw)
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise ApiError(400, f"the body must be one {kind} object (a mapping)")
    return docs[0]


def _prepare(doc: dict[str, Any], *, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    """The body with kind/apiVersion defaulted and metadata.name/namespace checked against the URL."""
    found = doc.get("kind", kind)
    if found != kind:
        raise ApiError(
            422,
            f"the body is not a {kind}",
            details=[
                {"object": f"{kind}/{name}", "field": "kind", "reason": f"must be {kind}, got {found!r}"}
            ],
        )
    data = dict(doc)
    data["kind"] = kind
    data.setdefault("apiVersion", _API_VERSIONS[kind])
    meta = data.get("metadata") or {}
    if not isinstance(meta, dict):
        raise ApiError(
            422,
            f"invalid {kind} {name}",
            details=[{"object": f"{kind}/{name}", "field": "metadata", "reason": "must be a mapping"}],
        )
    meta = dict(meta)
    for key, want in (("name", name), ("namespace", namespace)):
        if want is not None and meta.get(key) not in (None, "", want):
            raise ApiError(
                422,
                f"invalid {kind} {name}: nothing was stored",
                details=[
                    {
                        "object": f"{kind}/{name}",
                        "field": f"metadata.{key}",
                        "reason": f"{meta[key]!r} differs from the URL's {want!r}",
                    }
                ],
            )
        if want is not None:
            meta[key] = want
    data["metadata"] = meta
    return data


def _rejected(kind: str, name: str, exc: QuotaValidationError, *, prefix: str = "") -> list[dict[str, str]]:
    return [
        {"object": f"{kind}/{name}", "field": f"{prefix}{d['field']}", "reason": d["reason"]}
        for d in exc.details
    ]


# --- storing ------------------------------------------------------------------------------------


def _same(old: Resource, new: Resource) -> bool:
    return (
        getattr(old, "spec", None) == getattr(new, "spec", None)
        and old.metadata.labels == new.metadata.labels
        and old.metadata.annotations == new.metadata.annotations
    )


def _existing(store: Store, obj: Resource) -> Resource | None:
    if isinstance(obj, ElasticQuota):
        return _find_quota(store, obj.metadata.name)
    ns = obj.metadata.namespace if obj.NAMESPACED else ""
    return store.get(obj.kind, ns, obj.metadata.name)


def _put(store: Store, obj: Resource, *, conditional: bool = False) -> tuple[Resource, str]:
    """Create `obj`, or replace the stored one's spec, labels and annotations (keeping its status)."""
    existing = _existing(store, obj)
    if existing is None:
        return store.create(obj), "created"
    if not conditional and _same(existing, obj):
        return existing, "unchanged"
    fresh = existing.model_copy(
        update={
            "spec": obj.spec,  # type: ignore[attr-defined]
            "metadata": existing.metadata.model_copy(
                update={
                    "labels": dict(obj.metadata.labels),
                    "annotations": dict(obj.metadata.annotations),
                    "resource_version": obj.metadata.resource_version
                    if conditional
                    else existing.metadata.resource_version,
                }
            ),
        }
    )
    try:
        return store.update(fresh, check_version=conditional), "configured"
    except Conflict as exc:
        raise ApiError(409, str(exc)) from None


async def _synced(request: web.Request) -> None:
    journal = getattr(request.app[CTX], "journal", None)
    if journal is not None:
        await journal.sync()


def _find_quota(store: Store, name: str) -> ElasticQuota | None:
    for q in store.list("ElasticQuota"):
        if q.metadata.name == name:
            return q  # type: ignore[return-value]
    return None


def _quotas(store: Store) -> list[ElasticQuota]:
    return store.list("ElasticQuota")  # type: ignore[return-value]


def _listed(request: web.Request, items: list[Resource]) -> web.Response:
    page, token = paginate(request, items)
    store = request.app[CTX].store
    return web.json_response(
        list_body([o.to_dict() for o in page], next_token=token, resource_version=store.resource_version)
    )


# --- ElasticQuota -------------------------------------------------------------------------------


@operation(
    "List elastic quotas (the quota tree) with the runtime/used/request the scheduler wrote",
    tags=["quotas"],
    params=_PAGING,
    response=_list_schema("ElasticQuota"),
    errors=[401, 422],
)
async def list_quotas(request: web.Request) -> web.Response:
    authorize(request, "read")
    return _listed(request, _quotas(request.app[CTX].store))  # type: ignore[arg-type]


@operation(
    "Get one elastic quota by its cluster-wide name",
    tags=["quotas"],
    response=ElasticQuota,
    errors=[401, 404],
)
async def get_quota(request: web.Request) -> web.Response:
    authorize(request, "read")
    name = request.match_info["name"]
    obj = _find_quota(request.app[CTX].store, name)
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
    data = _prepare(_one(await request.read(), "ElasticQuota"), kind="ElasticQuota", name=name)
    current = _quotas(store)
    existing = next((q for q in current if q.metadata.name == name), None)
    if existing is not None and not data["metadata"].get("namespace"):
        data["metadata"]["namespace"] = existing.metadata.namespace
    try:
        obj = parse_quota_document(data, current_quotas=current)
    except QuotaValidationError as exc:
        raise ApiError(
            422, f"{exc.message}: nothing was stored", details=_rejected("ElasticQuota", name, exc)
        ) from None
    stored, action = _put(store, obj, conditional=bool(obj.metadata.resource_version))
    await _synced(request)
    return web.json_response(stored.to_dict(), status=201 if action == "created" else 200)


@operation(
    "Delete an elastic quota (409 while it still has children)",
    tags=["quotas"],
    errors=[401, 403, 404, 409],
)
async def delete_quota(request: web.Request) -> web.Response:
    authorize(request, "admin")
    store = request.app[CTX].store
    name = request.match_info["name"]
    current = _quotas(store)
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
    store.delete("ElasticQuota", obj.metadata.namespace, name)
    await _synced(request)
    return web.json_response(
        {"deleted": {"kind": "ElasticQuota", "namespace": obj.metadata.namespace, "name": name}}
    )


# --- Queue --------------------------------------------------------------------------------------


@operation(
    "List queues with their pending/running jobs and fair share",
    tags=["quotas"],
    params=_PAGING,
    response=_list_schema("Queue"),
    errors=[401, 422],
)
async def list_queues(request: web.Request) -> web.Response:
    authorize(request, "read")
    return _listed(request, request.app[CTX].store.list("Queue"))


@operation("Get one queue", tags=["quotas"], response=Queue, errors=[401, 404])
async def get_queue(request: web.Request) -> web.Response:
    authorize(request, "read")
    name = request.match_info["name"]
    return web.json_response(stored(request, "Queue", "", name, what=f"queue {name}").to_dict())


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
    data = _prepare(_one(await request.read(), "Queue"), kind="Queue", name=name)
    try:
        obj = parse_quota_document(data)
    except QuotaValidationError as exc:
        raise ApiError(
            422, f"{exc.message}: nothing was stored", details=_rejected("Queue", name, exc)
        ) from None
    stored, action = _put(request.app[CTX].store, obj, conditional=bool(obj.metadata.resource_version))
    await _synced(request)
    return web.json_response(stored.to_dict(), status=201 if action == "created" else 200)


@operation("Delete a queue", tags=["quotas"], errors=[401, 403, 404])
async def delete_queue(request: web.Request) -> web.Response:
    authorize(request, "admin")
    name = request.match_info["name"]
    store = request.app[CTX].store
    stored(request, "Queue", "", name, what=f"queue {name}")
    store.delete("Queue", "", name)
    await _synced(request)
    return web.json_response({"deleted": {"kind": "Queue", "name": name}})


# --- ResourceQuota ------------------------------------------------------------------------------


@operation(
    "List resource quotas (namespace hard limits and what is used) in the namespaces you may see",
    tags=["quotas"],
    params=[Param("namespace", description="Only this namespace."), *_PAGING],
    response=_list_schema("ResourceQuota"),
    errors=[401, 403, 422],
)
async def list_resource_quotas(request: web.Request) -> web.Response:
    ns = request.query.get("namespace") or None
    authorize(request, "read", ns)
    visible = allowed_namespaces(request)
    items = [
        q
        for q in request.app[CTX].store.list("ResourceQuota", namespace=ns)
        if visible is None or q.metadata.namespace in visible
    ]
    return _listed(request, items)


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
    raw = _one(await request.read(), "ResourceQuota")
    data = _prepare(raw, kind="ResourceQuota", name=name, namespace=ns)
    try:
        obj = parse_quota_document(data)
    except QuotaValidationError as exc:
        raise ApiError(
            422, f"{exc.message}: nothing was stored", details=_rejected("ResourceQuota", f"{ns}/{name}", exc)
        ) from None
    stored, action = _put(request.app[CTX].store, obj, conditional=bool(obj.metadata.resource_version))
    await _synced(request)
    return web.json_response(stored.to_dict(), status=201 if action == "created" else 200)


@operation("Delete a resource quota", tags=["quotas"], errors=[401, 403, 404])
async def delete_resource_quota(request: web.Request) -> web.Response:
    authorize(request, "admin")
    ns, name = request.match_info["ns"], request.match_info["name"]
    store = request.app[CTX].store
    stored(request, "ResourceQuota", ns, name, what=f"resource quota {ns}/{name}")
    store.delete("ResourceQuota", ns, name)
    await _synced(request)
    return web.json_response({"deleted": {"kind": "ResourceQuota", "namespace": ns, "name": name}})


# --- apply --------------------------------------------------------------------------------------


def _doc_name(doc: Any) -> str:
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    return str(meta.get("name") or "<unnamed>") if isinstance(meta, dict) else "<unnamed>"


def _structural_quota(doc: dict[str, Any]) -> ElasticQuota | None:
    """The quota a document describes, without checking the tree (None if it does not parse)."""
    try:
        data = {k: v for k, v in doc.items() if k != "status"}
        obj = ElasticQuota.model_validate(data)
    except ValueError:
        return None
    if not obj.metadata.namespace:
        obj.metadata.namespace = "default"
    return obj


def apply_documents(store: Store, docs: Iterable[Any]) -> tuple[list[Resource], list[dict[str, str]]]:
    """Validate a policy file's documents against the store: (objects to store, problems).

    ElasticQuotas are checked as one tree: each against the tree in force with every other quota
    of the file in it, then the whole result against the tree in force. Problem fields are
    `documents[I].<field>`.
    """
    docs = list(docs)
    problems: list[dict[str, str]] = []
    current = _quotas(store)
    # the tree after the apply, built from the quotas of the file that at least parse
    staged: dict[str, ElasticQuota] = {q.metadata.name: q for q in current}
    seen: set[tuple[str, str, str]] = set()
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "ElasticQuota":
            q = _structural_quota(doc)
            if q is not None:
                old = staged.get(q.metadata.name)
                meta = doc.get("metadata")
                if old is not None and isinstance(meta, dict) and not meta.get("namespace"):
                    q.metadata.namespace = old.metadata.namespace
                staged[q.metadata.name] = q
    out: list[Resource] = []
    for i, doc in enumerate(docs):
        prefix = f"documents[{i}]."
        name = _doc_name(doc)
        if not isinstance(doc, dict):
            problems.append(
                {"object": f"documents[{i}]", "field": f"documents[{i}]", "reason": "expected a mapping"}
            )
            continue
        kind = doc.get("kind")
        if kind not in APPLY_KINDS:
            problems.append(
                {
                    "object": f"{kind}/{name}",
                    "field": f"{prefix}kind",
                    "reason": f"unknown kind {kind!r}; allowed: {', '.join(APPLY_KINDS)}",
                }
            )
            continue
        meta = doc.get("metadata")
        ns = str(meta.get("namespace") or "") if kind == "ResourceQuota" and isinstance(meta, dict) else ""
        key = (kind, ns, name)
        if key in seen:
            problems.append(
                {
                    "object": f"{kind}/{name}",
                    "field": f"{prefix}metadata.name",
                    "reason": f"{kind} {name} appears more than once in the file",
                }
            )
            continue
        seen.add(key)
        if kind == "ResourceClass":
            data = dict(doc)
            data.setdefault("apiVersion", ResourceClass.API_VERSION)
            if not name or name == "<unnamed>":
                problems.append(
                    {
                        "object": "ResourceClass/<unnamed>",
                        "field": f"{prefix}metadata.name",
                        "reason": "required",
                    }
                )
                continue
            found = validate_resource_class(data)
            if found:
                problems += [
                    {"object": f"ResourceClass/{name}", "field": f"{prefix}{p.field}", "reason": p.reason}
                    for p in found
                ]
                continue
            out.append(ResourceClass.model_validate(data))
            continue
        data = dict(doc)
        others: list[ElasticQuota] = []
        if kind == "ElasticQuota":
            others = [q for n, q in staged.items() if n != name]
            old = next((q for q in current if q.metadata.name == name), None)
            meta = data.get("metadata")
            if old is not None and isinstance(meta, dict) and not meta.get("namespace"):
                data["metadata"] = {**meta, "namespace": old.metadata.namespace}
        try:
            out.append(parse_quota_document(data, current_quotas=others))
        except QuotaValidationError as exc:
            problems += _rejected(str(kind), name, exc, prefix=prefix)
    if not problems:
        before = set(validate_quotas(current))
        index = {o.metadata.name: i for i, o in enumerate(out) if isinstance(o, ElasticQuota)}
        for obj_name, field, reason in validate_quotas(staged.values()):
            if (obj_name, field, reason) not in before:
                where = f"documents[{index[obj_name]}]." if obj_name in index else ""
                problems.append(
                    {"object": f"ElasticQuota/{obj_name}", "field": f"{where}{field}", "reason": reason}
                )
    return out, problems


_ORDER = {"ResourceClass": 0, "Queue": 1, "ResourceQuota": 2, "ElasticQuota": 3}


@operation(
    "Apply a policy file: ElasticQuotas, ResourceQuotas, Queues and ResourceClasses, all or nothing",
    tags=["quotas"],
    body=APPLY_BODY_SCHEMA,
    body_content_types=("application/yaml", "application/json"),
    response=APPLY_RESULT_SCHEMA,
    errors=[400, 401, 403, 422],
)
async def apply(request: web.Request) -> web.Response:
    authorize(request, "admin")
    store = request.app[CTX].store
    docs = _decode(await request.read())
    if not docs:
        raise ApiError(
            422, "nothing to apply", details=[{"field": "documents", "reason": "the body has no documents"}]
        )
    objects, problems = apply_documents(store, docs)
    if problems:
        raise ApiError(422, f"{len(problems)} problem(s); nothing was applied", details=problems)
    applied = []
    # one synchronous block: the scheduler sees the whole file at once or not at all
    for obj in sorted(objects, key=lambda o: _ORDER[o.kind]):
        stored, action = _put(store, obj)
        applied.append(
            {
                "kind": stored.kind,
                "namespace": stored.metadata.namespace,
                "name": stored.metadata.name,
                "action": action,
            }
        )
    await _synced(request)
    return web.json_response({"applied": applied})


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
    app.router.add_post("/api/v1/apply", apply)
