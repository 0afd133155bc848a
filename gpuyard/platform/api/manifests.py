"""Bodies of the policy-object endpoints (ElasticQuota, ResourceQuota, Queue, ResourceClass).

Shared by the quota routes (`quotas`) and `apply` (`applying`):

* reading: :func:`read_documents` (multi-document YAML, a JSON list or a `List`, read within the
  route's limits and decoded off the event loop by :func:`decode_body`; 400 when malformed),
  :func:`read_one_document`, :func:`prepare_document` (kind/apiVersion defaulted,
  metadata.name/namespace checked against the URL; 422 naming the field), :func:`rejected_fields`
  (a validation error as 422 `details`);
* storing, through the context's writer (answered once durable): :func:`put_object` creates an
  object or replaces the stored one's spec, labels and annotations, keeping the status the
  scheduler wrote (conditional on a resourceVersion: 409 when stale; without one, a write that
  raced the scheduler's is decided again); :func:`find_quota` finds an ElasticQuota by its cluster-wide
  name in whichever namespace it lives;
* listing: :func:`list_response` (one page), :func:`list_schema` and :data:`PAGING` for the
  OpenAPI document.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol, cast

import yaml
from aiohttp import web
from pydantic import BaseModel

from gpuyard.apis.decoding import DEFAULT_MAX_BYTES, json_loads, yaml_load_all
from gpuyard.apis.meta import Resource, metadata_problems
from gpuyard.apis.quota import QuotaValidationError
from gpuyard.apis.quotakinds import API_ELASTIC_QUOTA, API_QUEUE, ElasticQuota
from gpuyard.apis.resourceclasses import ResourceClass
from gpuyard.platform.api.app import CTX, WRITE_ATTEMPTS, decided_again, writer_of
from gpuyard.platform.api.auth import allowed_namespaces, authorize
from gpuyard.platform.api.bodies import body_limit, off_loop, read_text
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.paging import PAGING, list_body, paginate
from gpuyard.state.context import Context
from gpuyard.state.store import Store

__all__ = [
    "PAGING",
    "decode_body",
    "find_quota",
    "list_response",
    "list_schema",
    "prepare_document",
    "put_object",
    "put_response",
    "read_documents",
    "read_one_document",
    "rejected_fields",
    "stored_quotas",
]

_API_VERSIONS = {
    "ElasticQuota": API_ELASTIC_QUOTA,
    "Queue": API_QUEUE,
    "ResourceQuota": "v1",
    "ResourceClass": ResourceClass.API_VERSION,
}


def list_schema(ref: str) -> dict[str, Any]:
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


# --- bodies -------------------------------------------------------------------------------------


def decode_body(
    text: str, *, max_bytes: int = DEFAULT_MAX_BYTES, limit_name: str = "server.max_body_bytes"
) -> list[Any]:
    """Documents of a YAML or JSON body (multi-document YAML, a JSON list, or a `List`); a
    document beyond a decoding limit (nesting, nodes, aliases expanding beyond `max_bytes`,
    integers) raises :class:`DocumentLimitError` (413/422, rendered by the error middleware).
    Synchronous: the routes run it off the event loop (:func:`read_documents`)."""
    try:
        if text.lstrip().startswith(("{", "[")):
            data = json_loads(text)
            docs = data if isinstance(data, list) else [data]
        else:
            docs = [
                d for d in yaml_load_all(text, max_bytes=max_bytes, limit_name=limit_name) if d is not None
            ]
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


async def read_documents(request: web.Request) -> list[Any]:
    """The request's documents: read within the route's limits, decoded in a worker thread."""
    server = request.app[CTX].settings.server
    text = await read_text(request, timeout_s=server.body_timeout_seconds)
    limit, name = body_limit(request)
    return await off_loop(
        decode_body, text, max_bytes=limit, limit_name=name, timeout_s=server.decode_timeout_seconds
    )


async def read_one_document(request: web.Request, kind: str) -> dict[str, Any]:
    """The one object of a PUT body; its name (the URL's too), namespace, labels and annotations
    checked as the API server does (422 naming the field)."""
    docs = await read_documents(request)
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise ApiError(400, f"the body must be one {kind} object (a mapping)")
    name = request.match_info.get("name", "")
    problems = metadata_problems({"name": name}) + metadata_problems(docs[0].get("metadata"))
    if problems:
        raise ApiError(
            422,
            f"invalid {kind} {name[:253]}: nothing was stored",
            details=[{"object": f"{kind}/{name[:253]}", **d} for d in problems],
        )
    return docs[0]


def prepare_document(
    doc: dict[str, Any], *, kind: str, name: str, namespace: str | None = None
) -> dict[str, Any]:
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


def rejected_fields(
    kind: str, name: str, exc: QuotaValidationError, *, prefix: str = ""
) -> list[dict[str, str]]:
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


class _WithSpec(Protocol):
    @property
    def spec(self) -> BaseModel: ...


def _existing(store: Store, obj: Resource) -> Resource | None:
    if isinstance(obj, ElasticQuota):
        return find_quota(store, obj.metadata.name)
    ns = obj.metadata.namespace if obj.NAMESPACED else ""
    return store.get(obj.kind, ns, obj.metadata.name)


async def put_object(ctx: Context, obj: Resource, *, conditional: bool = False) -> tuple[Resource, str]:
    """Create `obj`, or replace the stored one's spec, labels and annotations (keeping its status).

    `conditional` (the body gave a resourceVersion): 409 when it is stale. Otherwise a replace that
    lost a race (the scheduler wrote the object's status meanwhile: on Kubernetes the API server
    answers 409) is decided again on the fresher object, a few times (`decided_again`)."""
    return await decided_again(
        lambda: _put_once(ctx, obj, conditional=conditional), attempts=1 if conditional else WRITE_ATTEMPTS
    )


async def put_response(ctx: Context, obj: Resource) -> web.Response:
    """A PUT route's answer: `obj` stored (conditional on the body's resourceVersion, when it gave
    one), 201 when it was created, else 200."""
    stored, action = await put_object(ctx, obj, conditional=bool(obj.metadata.resource_version))
    return web.json_response(stored.to_dict(), status=201 if action == "created" else 200)


async def _put_once(ctx: Context, obj: Resource, *, conditional: bool) -> tuple[Resource, str]:
    existing = _existing(ctx.store, obj)
    if existing is None:
        return await writer_of(ctx).create(obj), "created"
    if not conditional and _same(existing, obj):
        return existing, "unchanged"
    fresh = existing.model_copy(
        update={
            "spec": cast(_WithSpec, obj).spec,  # every policy kind has a spec (`_same` compares it)
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
    return await writer_of(ctx).update(fresh), "configured"


def find_quota(store: Store, name: str) -> ElasticQuota | None:
    for q in store.list_of(ElasticQuota):
        if q.metadata.name == name:
            return q
    return None


def stored_quotas(store: Store) -> list[ElasticQuota]:
    return store.list_of(ElasticQuota)


def visible_list_response(request: web.Request, kind: str) -> web.Response:
    """`GET` of a namespaced kind: `?namespace=` if given (read access checked), else every
    namespace the caller may see, one page of it."""
    ns = request.query.get("namespace") or None
    authorize(request, "read", ns)
    visible = allowed_namespaces(request)
    items = [
        o
        for o in request.app[CTX].store.list(kind, namespace=ns)
        if visible is None or o.metadata.namespace in visible
    ]
    return list_response(request, items)


def list_response(request: web.Request, items: Sequence[Resource]) -> web.Response:
    page, token = paginate(request, items)
    store = request.app[CTX].store
    return web.json_response(
        list_body([o.to_dict() for o in page], next_token=token, resource_version=store.resource_version)
    )
