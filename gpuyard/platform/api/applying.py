"""`POST /api/v1/apply`: a policy file of ElasticQuotas, ResourceQuotas, Queues, ResourceClasses,
PriorityClasses (`scheduling.k8s.io/v1`: value at most 1000000000, no `system-` prefix, one
`globalDefault`, `value` immutable once created), PodDisruptionBudgets, NodeTopologies (validated
by `topologies.parse_node_topology`) and KubeDL's Crons (`apis/crons.parse_cron`).

The body is a multi-document YAML (or a JSON list): every document is validated first by
:func:`apply_documents` (the quotas as one tree: the tree in force with all of the file's quotas
in it), then all are written together through the writer — ResourceClasses, Queues, ResourceQuotas,
then ElasticQuotas, one after another with nothing in between — or none is: when the cluster
refuses one write (or a name was taken meanwhile), the writes that went through are put back
(`_undo`) and the answer says so. A problem is a 422 whose `details` name the object and the
field `documents[I].<field>`. Unknown fields follow `?fieldValidation=Strict|Warn|Ignore` (`fields`).
Needs the admin role. Decoding and storing are shared with the quota
routes (`manifests`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn

import structlog
from aiohttp import web
from pydantic import ValidationError

from gpuyard.apis.crons import Cron, parse_cron
from gpuyard.apis.disruption import PodDisruptionBudget
from gpuyard.apis.meta import Resource, metadata_problems
from gpuyard.apis.priorityclasses import BUILTIN, PriorityClass, class_problems
from gpuyard.apis.quota import QuotaValidationError, parse_quota_document, validate_quotas
from gpuyard.apis.quotakinds import ElasticQuota, Queue, ResourceQuota
from gpuyard.apis.resourceclasses import ResourceClass, validate_resource_class
from gpuyard.platform.api.app import CTX, writer_of
from gpuyard.platform.api.auth import authorize
from gpuyard.platform.api.errors import ApiError, cluster_refusal, details_from_validation
from gpuyard.platform.api.fields import (
    FIELD_VALIDATION_PARAM,
    answer_unknown_fields,
    field_validation,
    unknown_fields,
)
from gpuyard.platform.api.manifests import put_object, read_documents, rejected_fields, stored_quotas
from gpuyard.platform.api.openapi import operation
from gpuyard.platform.api.topologies import parse_node_topology
from gpuyard.state.backend import BackendError
from gpuyard.state.context import Context
from gpuyard.state.store import AlreadyExists, Conflict, NotFound, Store
from gpuyard.state.writing import write_together

__all__ = ["apply_documents", "setup"]

log = structlog.get_logger(__name__)

APPLY_KINDS = (
    "Cron",
    "ElasticQuota",
    "NodeTopology",
    "PodDisruptionBudget",
    "PriorityClass",
    "Queue",
    "ResourceClass",
    "ResourceQuota",
)
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
    current = stored_quotas(store)
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
        bad_meta = metadata_problems(meta, field=f"{prefix}metadata")
        if bad_meta:
            problems += [{"object": f"{kind}/{name}", **d} for d in bad_meta]
            continue
        namespaced = kind in ("ResourceQuota", "PodDisruptionBudget", "Cron")
        ns = str(meta.get("namespace") or "") if namespaced and isinstance(meta, dict) else ""
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
        if kind == "NodeTopology":
            topology, found_problems = parse_node_topology(doc, prefix=prefix)
            problems += found_problems
            if topology is not None:
                out.append(topology)
            continue
        if kind == "PriorityClass":
            problems += _priority_class(store, doc, docs, prefix=prefix, name=name, out=out)
            continue
        if kind == "Cron":  # KubeDL's Cron (apis/crons.py)
            cron, found_cron = parse_cron(doc, prefix=prefix)
            problems += [{"object": f"Cron/{name}", **d} for d in found_cron]
            if cron is not None:
                out.append(cron)
            continue
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
        if kind == "PodDisruptionBudget":
            try:
                budget = PodDisruptionBudget.model_validate(doc)
            except ValidationError as exc:
                problems += [
                    {"object": f"{kind}/{name}", **d}
                    for d in details_from_validation(exc, prefix=prefix.rstrip("."))
                ]
                continue
            budget.metadata.namespace = budget.metadata.namespace or "default"
            out.append(budget)
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
            problems += rejected_fields(str(kind), name, exc, prefix=prefix)
    problems += _allowed_class_problems(store, docs, out)
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


def _allowed_class_problems(store: Store, docs: list[Any], out: list[Resource]) -> list[dict[str, str]]:
    """Each class a Queue of the file allows must exist (built in, stored, or in the file)."""
    known = set(BUILTIN)
    if "PriorityClass" in store.kinds():
        known.update(c.metadata.name for c in store.list_of(PriorityClass))
    known.update(o.metadata.name for o in out if isinstance(o, PriorityClass))
    problems = []
    for queue in (o for o in out if isinstance(o, Queue)):
        i = next(
            (
                n
                for n, d in enumerate(docs)
                if isinstance(d, dict) and d.get("kind") == "Queue" and _doc_name(d) == queue.metadata.name
            ),
            0,
        )
        for j, name in enumerate(queue.spec.allowed_priority_classes or []):
            if name not in known:
                problems.append(
                    {
                        "object": f"Queue/{queue.metadata.name}",
                        "field": f"documents[{i}].spec.allowedPriorityClasses.{j}",
                        "reason": f"PriorityClass {name!r} does not exist; known: {', '.join(sorted(known))}",
                    }
                )
    return problems


def _priority_class(
    store: Store, doc: dict[str, Any], docs: list[Any], *, prefix: str, name: str, out: list[Resource]
) -> list[dict[str, str]]:
    """Validate one PriorityClass document (appended to `out` when good); its problems."""
    obj, found = class_problems(doc)
    where = f"PriorityClass/{name}"
    if obj is None:
        return [{"object": where, "field": f"{prefix}{f}", "reason": r} for f, r in found]
    old = store.get_of(PriorityClass, "", name) if "PriorityClass" in store.kinds() else None
    if old is not None and old.value != obj.value:
        return [
            {
                "object": where,
                "field": f"{prefix}value",
                "reason": f"value is immutable (stored: {old.value}); delete and create the class to change it",
            }
        ]
    if obj.global_default:
        others = [
            c.metadata.name
            for c in (store.list_of(PriorityClass) if "PriorityClass" in store.kinds() else [])
            if c.global_default and c.metadata.name != name
        ] + [
            str((d.get("metadata") or {}).get("name"))
            for d in docs
            if isinstance(d, dict)
            and d is not doc
            and d.get("kind") == "PriorityClass"
            and d.get("globalDefault") is True
        ]
        if others:
            return [
                {
                    "object": where,
                    "field": f"{prefix}globalDefault",
                    "reason": f"only one PriorityClass may be the global default; {others[0]} already is",
                }
            ]
    out.append(obj)
    return []


async def _put_priority_class(ctx: Context, obj: PriorityClass) -> tuple[Resource, str]:
    """Create the class, or replace its description, policy, default flag, labels and annotations."""
    old = ctx.store.get_of(PriorityClass, "", obj.metadata.name)
    writer = writer_of(ctx)
    if old is None:
        return await writer.create(obj), "created"
    same = (old.global_default, old.preemption_policy, old.description, old.metadata.labels) == (
        obj.global_default,
        obj.preemption_policy,
        obj.description,
        obj.metadata.labels,
    ) and old.metadata.annotations == obj.metadata.annotations
    if same:
        return old, "unchanged"
    fresh = obj.model_copy(
        update={
            "metadata": old.metadata.model_copy(
                update={"labels": dict(obj.metadata.labels), "annotations": dict(obj.metadata.annotations)}
            )
        }
    )
    return await writer.update(fresh), "configured"


_ORDER = {
    "NodeTopology": -1,
    "PriorityClass": 0,
    "ResourceClass": 0,
    "Queue": 1,
    "ResourceQuota": 2,
    "ElasticQuota": 3,
    "PodDisruptionBudget": 4,
    "Cron": 5,
}
_MODELS: dict[str, type[Resource]] = {
    "Cron": Cron,
    "ElasticQuota": ElasticQuota,
    "PodDisruptionBudget": PodDisruptionBudget,
    "PriorityClass": PriorityClass,
    "Queue": Queue,
    "ResourceClass": ResourceClass,
    "ResourceQuota": ResourceQuota,
}


@operation(
    "Apply a policy file: ElasticQuotas, ResourceQuotas, Queues, ResourceClasses, PriorityClasses, "
    "PodDisruptionBudgets and NodeTopologies, all or nothing",
    tags=["quotas"],
    params=[FIELD_VALIDATION_PARAM],
    body=APPLY_BODY_SCHEMA,
    body_content_types=("application/yaml", "application/json"),
    response=APPLY_RESULT_SCHEMA,
    errors=[400, 401, 403, 422],
)
async def apply(request: web.Request) -> web.Response:
    authorize(request, "admin")
    mode = field_validation(request)
    store = request.app[CTX].store
    docs = await read_documents(request)
    if not docs:
        raise ApiError(
            422, "nothing to apply", details=[{"field": "documents", "reason": "the body has no documents"}]
        )
    objects, problems = apply_documents(store, docs)
    if problems:
        raise ApiError(422, f"{len(problems)} problem(s); nothing was applied", details=problems)
    unknown: list[str] = []
    for i, doc in enumerate(docs):
        model = _MODELS.get(doc.get("kind", "")) if isinstance(doc, dict) else None
        if model is not None:
            unknown += unknown_fields(model, doc, prefix=f"documents[{i}].")
    warnings = answer_unknown_fields(mode, unknown)  # Strict: 422 naming them
    ctx = request.app[CTX]
    ordered = sorted(objects, key=lambda o: _ORDER[o.kind])
    before = {_key(o): store.get(o.kind, o.metadata.namespace, o.metadata.name) for o in ordered}
    # written together, in order, with nothing in between: the scheduler sees the whole file at
    # once; one journal commit makes it durable before the answer
    results = await write_together(
        _put_priority_class(ctx, obj) if isinstance(obj, PriorityClass) else put_object(ctx, obj)
        for obj in ordered
    )
    done = [r for r in results if not isinstance(r, BaseException)]
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:  # the first error, as the objects were given; what was written is undone
        await _undo(ctx, done, before, failed[0])
    applied = []
    for stored, action in done:
        applied.append(
            {
                "kind": stored.kind,
                "namespace": stored.metadata.namespace,
                "name": stored.metadata.name,
                "action": action,
            }
        )
    response = web.json_response({"applied": applied})
    for warning in warnings:
        response.headers.add("Warning", warning)
    return response


def _key(obj: Resource) -> tuple[str, str, str]:
    return (obj.kind, obj.metadata.namespace, obj.metadata.name)


async def _undo(
    ctx: Context,
    done: list[tuple[Resource, str]],
    before: dict[tuple[str, str, str], Resource | None],
    error: BaseException,
) -> NoReturn:
    """A write of the file failed (the cluster refused one, or a name was taken meanwhile): put
    back what the others changed, in reverse order (a created object is deleted, a configured one
    gets its earlier spec, labels and annotations again), then raise the failure saying so. On the
    fake backend nothing fails after validation; on a cluster this keeps the file all or nothing."""
    writer = writer_of(ctx)
    undone, stuck = 0, []
    for stored, action in reversed(done):
        kind, ns, name = _key(stored)
        old = before.get(_key(stored))
        try:
            if action == "created":
                await writer.delete(kind, ns, name)
            elif action == "configured" and old is not None:
                current = ctx.store.get(kind, ns, name) or stored
                meta = old.metadata.model_copy(update={"resource_version": current.metadata.resource_version})
                await writer.update(old.model_copy(update={"metadata": meta}))
            else:
                continue
            undone += 1
        except (BackendError, Conflict, NotFound, AlreadyExists) as exc:
            stuck.append(f"{kind} {ns + '/' if ns else ''}{name} ({exc})")
            log.error("apply.undo_failed", kind=kind, namespace=ns, name=name, error=str(exc))
    note = f"; nothing was applied: the {undone} object(s) written before it were put back"
    if stuck:
        note = f"; {undone} object(s) written before it were put back, these could not be: {', '.join(stuck)}"
    if isinstance(error, BackendError):
        raise cluster_refusal(error, note=note) from None
    if isinstance(error, AlreadyExists):
        raise ApiError(409, f"{error}; it was created meanwhile: read it and try again{note}") from None
    if isinstance(error, ApiError):
        raise ApiError(error.status, f"{error.message}{note}", details=error.details) from None
    raise error


def setup(app: web.Application) -> None:
    app.router.add_post("/api/v1/apply", apply)
