"""Object metadata and the base class of every object kept in the store.

Every object has `apiVersion`, `kind` and `metadata`, exactly as in Kubernetes. Python attributes
are snake_case; JSON/YAML use the Kubernetes camelCase names (`resourceVersion`, `nodeName`), and
both spellings are accepted on input.

Objects returned by the store are shared: never mutate them in place. Make a copy
(`obj.clone()`, or `deep_copy(model)` for a part), change it, and write it back with `store.update`.

:func:`metadata_problems` checks a submitted object's metadata as the API server does: its name
(a DNS-1123 subdomain, or label where the kind needs one), namespace (a DNS-1123 label), labels
and annotations. It is called at the edges (HTTP bodies, files), never on objects gpuyard builds.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from typing import Any, ClassVar, Self, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from gpuyard.apis.labels import annotation_problems, label_problems

__all__ = [
    "K8sModel",
    "ObjectMeta",
    "OwnerReference",
    "Resource",
    "deep_copy",
    "dns_label_problem",
    "dns_subdomain_problem",
    "metadata_problems",
    "utcnow",
]

_T = TypeVar("_T")
_ATOMIC = (str, int, float, bool, bytes, Decimal, datetime, date, time, timedelta, Enum, type(None))


def utcnow() -> datetime:
    return datetime.now(UTC)


def deep_copy(value: _T) -> _T:
    """A deep copy of a pydantic model (or list/dict/tuple of them) without re-validation.

    `model_copy(deep=True)` goes through `copy.deepcopy`, whose generic machinery dominates the
    operator's reconcile; this walks the model's fields directly: immutable values are shared,
    models, lists, dicts, tuples and sets are copied, anything else falls back to `deepcopy`.
    """
    return cast(_T, _copy(value))


def _copy(value: Any) -> Any:
    if isinstance(value, _ATOMIC):
        return value
    if isinstance(value, BaseModel):
        cls = value.__class__
        new = cls.__new__(cls)
        setattr_ = object.__setattr__
        setattr_(new, "__dict__", {k: _copy(v) for k, v in value.__dict__.items()})
        setattr_(new, "__pydantic_fields_set__", set(value.__pydantic_fields_set__))
        extra = value.__pydantic_extra__
        setattr_(new, "__pydantic_extra__", _copy(extra) if extra is not None else None)
        private = value.__pydantic_private__
        setattr_(new, "__pydantic_private__", _copy(private) if private is not None else None)
        return new
    if isinstance(value, list):
        return [_copy(v) for v in value]
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_copy(v) for v in value)
    if isinstance(value, set):
        return {_copy(v) for v in value}
    return copy.deepcopy(value)


class K8sModel(BaseModel):
    """Base of all API models: camelCase on the wire, snake_case in Python, unknown fields kept.

    Kubernetes objects written for other tools carry fields gpuyard does not interpret
    (`volumes`, `securityContext`, ...); they are preserved and passed through, not rejected.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="allow",
        validate_assignment=False,
    )

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form as Kubernetes writes it (camelCase, no nulls)."""
        return self.model_dump(mode="json", exclude_none=True)


class StrictK8sModel(K8sModel):
    """A model whose unknown fields are errors (gpuyard's own kinds)."""

    model_config = ConfigDict(extra="forbid")


class OwnerReference(K8sModel):
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(K8sModel):
    name: str = ""
    generate_name: str | None = None
    namespace: str = ""
    uid: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    resource_version: str = ""
    generation: int = 0
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    owner_references: list[OwnerReference] = Field(default_factory=list)
    finalizers: list[str] = Field(default_factory=list)


class Resource(K8sModel):
    """A top-level object with kind, apiVersion and metadata.

    Subclasses set `KIND`, `API_VERSION` and `NAMESPACED`; the store keys objects by
    (kind, namespace, name) and uses these class attributes to register kinds.
    """

    KIND: ClassVar[str] = ""
    API_VERSION: ClassVar[str] = "v1"
    NAMESPACED: ClassVar[bool] = True

    api_version: str = ""
    kind: str = ""
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)

    def model_post_init(self, __context: Any) -> None:
        if not self.kind:
            self.kind = self.KIND
        if not self.api_version:
            self.api_version = self.API_VERSION

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.metadata.namespace, self.metadata.name)

    @property
    def resource_version(self) -> int:
        return int(self.metadata.resource_version or 0)

    def clone(self) -> Self:
        """A deep copy that is safe to change and write back."""
        return deep_copy(self)

    def controller_reference(self) -> OwnerReference:
        """The ownerReference an object this one controls carries: `controller` and
        `blockOwnerDeletion` set, as Kubernetes' controllers write it."""
        return OwnerReference(
            api_version=self.api_version,
            kind=self.kind,
            name=self.metadata.name,
            uid=self.metadata.uid,
            controller=True,
            block_owner_deletion=True,
        )


# --- names as Kubernetes checks them (k8s.io/apimachinery/pkg/util/validation) -----------------

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def dns_label_problem(value: object, *, max_length: int = 63) -> str | None:
    """Why `value` is not a DNS-1123 label of at most `max_length` characters, or None."""
    if not isinstance(value, str) or not _DNS_LABEL.match(value) or len(value) > max_length:
        shown = (
            value
            if not isinstance(value, str) or len(value) <= 70
            else f"{value[:40]}...({len(value)} characters)"
        )
        return (
            f"{shown!r} must be a DNS-1123 label: lower-case letters, digits and '-', starting and "
            f"ending with a letter or digit, at most {max_length} characters"
        )
    return None


def dns_subdomain_problem(value: object) -> str | None:
    """Why `value` is not a DNS-1123 subdomain (what most object names are), or None."""
    if not isinstance(value, str) or not _DNS_SUBDOMAIN.match(value) or len(value) > 253:
        shown = (
            value
            if not isinstance(value, str) or len(value) <= 70
            else f"{value[:40]}...({len(value)} characters)"
        )
        return (
            f"{shown!r} must be a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', "
            "starting and ending with a letter or digit, at most 253 characters"
        )
    return None


def metadata_problems(
    metadata: object, *, field: str = "metadata", name_rule: str = "subdomain", namespaced: bool = True
) -> list[dict[str, str]]:
    """422 details for a submitted `metadata` mapping: name (`subdomain` or `label`; an absent name
    is left to the caller), namespace (a DNS-1123 label), labels and annotations."""
    if metadata is None:
        return []
    if not isinstance(metadata, Mapping):
        return [{"field": field, "reason": "must be a mapping"}]
    out: list[dict[str, str]] = []
    name = metadata.get("name")
    if name not in (None, ""):
        problem = dns_label_problem(name) if name_rule == "label" else dns_subdomain_problem(name)
        if problem is not None:
            out.append({"field": f"{field}.name", "reason": problem})
    namespace = metadata.get("namespace")
    if namespaced and namespace not in (None, ""):
        problem = dns_label_problem(namespace)
        if problem is not None:
            out.append({"field": f"{field}.namespace", "reason": problem})
    out += label_problems(metadata.get("labels"), field=f"{field}.labels")
    out += annotation_problems(metadata.get("annotations"), field=f"{field}.annotations")
    return out
