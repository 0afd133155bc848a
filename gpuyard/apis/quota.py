"""Validation and parsing of quota and queue objects (ElasticQuota, ResourceQuota, Queue).

This is the user-facing edge of quota and queueing (`submit -> validate -> store`):
:func:`parse_quota_document` turns a decoded document into a validated object or raises
:class:`QuotaValidationError`. The models and their label/annotation keys live in
:mod:`gpuyard.apis.quotakinds`; durations such as a job's `gpuyard.io/expected-duration` are
read by :mod:`gpuyard.apis.durations`.

The scheduler turns these into plain data once (`gpuyard.scheduler.admission.quota`); the functions here
validate whole *sets* of quotas (`current + candidate`) so that a rejected object never changes
the tree in force. Every problem is `(object name, field path, reason)`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from gpuyard.apis.core import GPU_RESOURCE
from gpuyard.apis.meta import Resource
from gpuyard.apis.quantity import QuantityError, format_quantity, parse_quantity
from gpuyard.apis.quotakinds import (
    ANNOTATION_QUOTA_NAMESPACES,
    ANNOTATION_SHARED_WEIGHT,
    API_ELASTIC_QUOTA,
    API_QUEUE,
    LABEL_ALLOW_LENT_RESOURCE,
    LABEL_QUOTA_IS_PARENT,
    LABEL_QUOTA_PARENT,
    ROOT_QUOTA,
    ElasticQuota,
    Queue,
    ResourceQuota,
)

__all__ = [
    "Problem",
    "QuotaValidationError",
    "parse_quota_document",
    "validate_queue",
    "validate_quota_deletion",
    "validate_quotas",
    "validate_resource_quota",
]

Problem = tuple[str, str, str]
"""(object name, field path, reason)."""


class QuotaValidationError(ValueError):
    """A quota/queue document that cannot be accepted; `details` lists `{"field", "reason"}`."""

    def __init__(self, message: str, details: Iterable[dict[str, str]]) -> None:
        super().__init__(message)
        self.message = message
        self.details = list(details)


# --- validation --------------------------------------------------------------------------------


def _resource_problems(name: str, prefix: str, values: Mapping[str, Decimal]) -> list[Problem]:
    out = []
    for res, q in values.items():
        if q < 0:
            out.append((name, f"{prefix}.{res}", f"must not be negative, got {format_quantity(q)}"))
    return out


def _object_problems(quota: ElasticQuota) -> list[Problem]:
    """Problems of one ElasticQuota on its own (no other quota needed)."""
    name = quota.metadata.name
    labels, annotations = quota.metadata.labels, quota.metadata.annotations
    out: list[Problem] = []
    if not name:
        out.append(("<unnamed>", "metadata.name", "required"))
    if name == ROOT_QUOTA:
        out.append(
            (
                name,
                "metadata.name",
                f"{ROOT_QUOTA} is the implicit root (the whole cluster) and cannot be defined",
            )
        )
    out += _resource_problems(name, "spec.min", quota.spec.min)
    out += _resource_problems(name, "spec.max", quota.spec.max)
    for res, lo in quota.spec.min.items():
        hi = quota.spec.max.get(res)
        if hi is not None and hi < lo:
            out.append(
                (name, f"spec.max.{res}", f"max {format_quantity(hi)} is less than min {format_quantity(lo)}")
            )
    for key in (LABEL_QUOTA_IS_PARENT, LABEL_ALLOW_LENT_RESOURCE):
        value = labels.get(key, annotations.get(key))
        if value is not None and value.strip().lower() not in ("true", "false"):
            where = "labels" if key in labels else "annotations"
            out.append((name, f"metadata.{where}.{key}", f'must be "true" or "false", got {value!r}'))
    raw = annotations.get(ANNOTATION_SHARED_WEIGHT)
    if raw is not None:
        field = f"metadata.annotations.{ANNOTATION_SHARED_WEIGHT}"
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            out.append((name, field, 'must be a JSON resource list, e.g. {"nvidia.com/gpu": "60"}'))
        else:
            for res, v in data.items():
                try:
                    w = parse_quantity(v)
                except QuantityError as exc:
                    out.append((name, f"{field}.{res}", str(exc)))
                    continue
                if w < 0:
                    out.append((name, f"{field}.{res}", f"must not be negative, got {v}"))
    raw = annotations.get(ANNOTATION_QUOTA_NAMESPACES)
    if raw is not None:
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        if not isinstance(data, list) or not all(isinstance(n, str) for n in data):
            out.append(
                (
                    name,
                    f"metadata.annotations.{ANNOTATION_QUOTA_NAMESPACES}",
                    'must be a JSON list of namespaces, e.g. ["team-a"]',
                )
            )
    return out


def _chain_problem(by_name: Mapping[str, ElasticQuota], start: str) -> Problem | None:
    """A cycle or an unknown parent on the way from `start` to the root."""
    seen = [start]
    current = by_name[start]
    field = f"metadata.labels.{LABEL_QUOTA_PARENT}"
    while True:
        parent = current.parent_name
        if parent == ROOT_QUOTA:
            return None
        if parent not in by_name:
            if current.metadata.name == start:
                return (start, field, f"unknown parent quota {parent!r}")
            return None  # reported on the quota that names it
        if parent in seen:
            loop = " -> ".join([*seen[seen.index(parent) :], parent])
            return (start, field, f"the parent chain forms a cycle: {loop}")
        seen.append(parent)
        current = by_name[parent]


def _tree_problems(quotas: list[ElasticQuota]) -> list[Problem]:
    out: list[Problem] = []
    by_name: dict[str, ElasticQuota] = {}
    for q in quotas:
        out += _object_problems(q)
        other = by_name.get(q.metadata.name)
        if other is not None and other.metadata.namespace != q.metadata.namespace:
            out.append(
                (
                    q.metadata.name,
                    "metadata.name",
                    f"quota names are cluster-wide; {q.metadata.name!r} already exists in namespace {other.metadata.namespace!r}",
                )
            )
        by_name[q.metadata.name] = q
    children: dict[str, list[ElasticQuota]] = {}
    covered: dict[str, str] = {}
    for q in by_name.values():
        name = q.metadata.name
        problem = _chain_problem(by_name, name) if name != ROOT_QUOTA else None
        if problem is not None:
            out.append(problem)
        parent = q.parent_name
        children.setdefault(parent, []).append(q)
        if parent != ROOT_QUOTA and parent in by_name and not by_name[parent].is_parent:
            out.append(
                (
                    name,
                    f"metadata.labels.{LABEL_QUOTA_PARENT}",
                    f'parent quota {parent!r} is not marked {LABEL_QUOTA_IS_PARENT}: "true"',
                )
            )
        for ns in q.covered_namespaces:
            if ns in covered and covered[ns] != name:
                out.append(
                    (name, "spec.namespaces", f"namespace {ns!r} is already covered by quota {covered[ns]!r}")
                )
            covered.setdefault(ns, name)
    for parent, kids in children.items():
        if parent == ROOT_QUOTA or parent not in by_name:
            continue
        pmin = by_name[parent].spec.min
        resources = sorted({r for k in kids for r in k.spec.min})
        for res in resources:
            total = sum((k.spec.min.get(res, Decimal(0)) for k in kids), Decimal(0))
            limit = pmin.get(res, Decimal(0))
            if total > limit:
                who = ", ".join(sorted(k.metadata.name for k in kids if k.spec.min.get(res, 0) > 0))
                out.append(
                    (
                        parent,
                        f"spec.min.{res}",
                        f"the children's min add up to {format_quantity(total)} {res} ({who}); "
                        f"{parent}'s min is {format_quantity(limit)}",
                    )
                )
    return out


def _attribute(problems: list[Problem], candidate: ElasticQuota) -> list[Problem]:
    """Report a children-exceed-parent problem on the candidate when it is one of those children."""
    name = candidate.metadata.name
    out = []
    for obj, field, reason in problems:
        if (
            obj != name
            and field.startswith("spec.min.")
            and "children's min" in reason
            and candidate.parent_name == obj
        ):
            out.append((name, field, f"with this quota, {reason}"))
        else:
            out.append((obj, field, reason))
    return out


def validate_quotas(current: Iterable[ElasticQuota], candidate: ElasticQuota | None = None) -> list[Problem]:
    """Problems the candidate would bring into the tree `current` (the tree in force).

    The candidate replaces the quota of the same name. Only problems that are new with the
    candidate are reported (an existing tree from elsewhere is not blamed on it); with no
    candidate, every problem of `current` is reported.
    """
    existing = list(current)
    before = _tree_problems(existing)
    if candidate is None:
        return before
    name, ns = candidate.metadata.name, candidate.metadata.namespace
    after_set = [q for q in existing if not (q.metadata.name == name and q.metadata.namespace == ns)] + [
        candidate
    ]
    after = _tree_problems(after_set)
    old = set(before)
    return _attribute([p for p in after if p not in old], candidate)


def validate_quota_deletion(current: Iterable[ElasticQuota], name: str) -> list[Problem]:
    """Deleting a quota that still has children would leave them without a parent."""
    kids = sorted(q.metadata.name for q in current if q.parent_name == name and q.metadata.name != name)
    if kids:
        return [
            (
                name,
                "metadata.name",
                f"quota {name!r} still has children: {', '.join(kids)}; delete or move them first",
            )
        ]
    return []


_COUNT_RE = re.compile(r"^count/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_WHOLE_PREFIXES = ("count/",)


def _whole_resource(key: str) -> bool:
    """Quota keys counted in whole units: GPUs, GPU classes, object counts, pods."""
    base = key.removeprefix("requests.").removeprefix("limits.")
    if key.startswith(_WHOLE_PREFIXES) or base == "pods" or base == GPU_RESOURCE:
        return True
    return (
        "/" not in base
        and base not in ("cpu", "memory", "ephemeral-storage", "storage")
        and not base.startswith("hugepages-")
    )


def validate_resource_quota(quota: ResourceQuota) -> list[Problem]:
    """Problems of a ResourceQuota: negative or fractional counts, scopes gpuyard cannot honour."""
    name = quota.metadata.name or "<unnamed>"
    out: list[Problem] = []
    if not quota.metadata.namespace:
        out.append((name, "metadata.namespace", "required: a ResourceQuota limits one namespace"))
    for key, q in quota.spec.hard.items():
        field = f"spec.hard.{key}"
        if q < 0:
            out.append((name, field, f"must not be negative, got {format_quantity(q)}"))
        elif _whole_resource(key) and q != q.to_integral_value():
            out.append((name, field, f"{key} is counted in whole units, got {format_quantity(q)}"))
        if key.startswith("count/") and not _COUNT_RE.match(key):
            out.append((name, field, "object counts are written count/<resource>, e.g. count/jobs"))
    if quota.spec.scopes or quota.spec.scope_selector:
        out.append(
            (
                name,
                "spec.scopes",
                "scopes and scopeSelector are not supported; the quota would apply to every job",
            )
        )
    return out


def validate_queue(queue: Queue) -> list[Problem]:
    name = queue.metadata.name or "<unnamed>"
    out: list[Problem] = []
    if not queue.metadata.name:
        out.append((name, "metadata.name", "required"))
    return out


def _pydantic_problems(name: str, exc: ValidationError) -> list[Problem]:
    out = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "<root>"
        reason = (
            "unknown field" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        )
        out.append((name, path, reason))
    return out


_KINDS: dict[str, tuple[type[Resource], str]] = {
    "ElasticQuota": (ElasticQuota, API_ELASTIC_QUOTA),
    "ResourceQuota": (ResourceQuota, "v1"),
    "Queue": (Queue, API_QUEUE),
}


def parse_quota_document(
    doc: Any, *, current_quotas: Iterable[ElasticQuota] = ()
) -> ElasticQuota | ResourceQuota | Queue:
    """Validate one decoded ElasticQuota/ResourceQuota/Queue; raise :class:`QuotaValidationError`.

    An ElasticQuota is checked against `current_quotas` (the tree in force): it is accepted only
    if it brings no new problem into the tree.
    """
    if not isinstance(doc, Mapping):
        raise QuotaValidationError(
            "a document must be a mapping",
            [{"field": "<root>", "reason": f"expected an object, got {type(doc).__name__}"}],
        )
    kind = doc.get("kind")
    if kind not in _KINDS:
        raise QuotaValidationError(
            f"unknown kind {kind!r}",
            [{"field": "kind", "reason": f"unknown kind {kind!r}; allowed: {', '.join(sorted(_KINDS))}"}],
        )
    cls, api = _KINDS[kind]
    if doc.get("apiVersion", api) != api:
        raise QuotaValidationError(
            f"unknown apiVersion for {kind}",
            [
                {
                    "field": "apiVersion",
                    "reason": f"{doc.get('apiVersion')!r} is not an apiVersion of {kind}; allowed: {api}",
                }
            ],
        )
    meta = doc.get("metadata")
    name = str(meta.get("name") or "<unnamed>") if isinstance(meta, Mapping) else "<unnamed>"
    data = dict(doc)
    data.pop("status", None)
    try:
        obj = cls.model_validate(data)
    except ValidationError as exc:
        problems = _pydantic_problems(name, exc)
    else:
        if obj.NAMESPACED and not obj.metadata.namespace:
            obj.metadata.namespace = "default"
        if isinstance(obj, ElasticQuota):
            problems = validate_quotas(current_quotas, obj)
        elif isinstance(obj, ResourceQuota):
            problems = validate_resource_quota(obj)
        else:
            assert isinstance(obj, Queue)
            problems = validate_queue(obj)
        if not problems:
            return obj
    raise QuotaValidationError(
        f"invalid {kind} {name}",
        [{"field": f, "reason": r if o == name else f"{o}: {r}"} for o, f, r in problems],
    )
