"""Field validation of submitted documents, as Kubernetes' `?fieldValidation=Strict|Warn|Ignore`.

The API models keep fields they do not know (Kubernetes objects written for other tools carry
fields gpuyard passes through), so a misspelt field (`spec.bogusField`, `replica: 2`) would be
accepted without a word. :func:`unknown_fields` walks a decoded document along its model and
names every key that is neither a field of the model nor, for the Kubernetes types the models
cover only in part (ObjectMeta, PodTemplateSpec, PodSpec, Container, ...), a field of the real
Kubernetes type (:data:`KUBERNETES_FIELDS`, from the Kubernetes 1.37 OpenAPI schema), nor a field
of the KubeDL/Kubeflow APIs that gpuyard accepts but does not model (:data:`UNMODELLED_FIELDS`).
Below a field the models do not describe (`volumes`, `securityContext`, ...) nothing is checked.

`POST /api/v1/jobs` and `POST /api/v1/apply` then answer per the query parameter
`fieldValidation` (any case; default `Warn`):

* `Strict` - a 422 whose details name each unknown field; nothing is stored;
* `Warn` - accepted, with one `Warning: 299 - "unknown field \\"spec.bogusField\\""` header per
  field (Kubernetes' form; the CLI prints them);
* `Ignore` - accepted silently.

Fields gpuyard accepts but does not act on (`apis/ignoredfields.py`, each with its reason) are
answered the same way: `Strict` refuses them (`accepted but not acted on: REASON`), `Warn` warns.
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin

from aiohttp import web
from pydantic import AliasChoices, BaseModel

from gpuyard.apis.core import (
    Affinity,
    Container,
    ContainerPort,
    EnvVar,
    NodeAffinity,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodSpec,
    PodTemplateSpec,
    ResourceRequirements,
    Toleration,
)
from gpuyard.apis.jobspecs import ElasticPolicy, JobSpec, ReplicaSpec, RunPolicy, SchedulingPolicy
from gpuyard.apis.meta import ObjectMeta, Resource
from gpuyard.apis.podvalidation import CONTAINER_FIELDS
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.openapi import Param

__all__ = [
    "FIELD_VALIDATION_PARAM",
    "KUBERNETES_FIELDS",
    "NOT_ACTED_ON",
    "UNMODELLED_FIELDS",
    "FieldValidation",
    "answer_unknown_fields",
    "field_validation",
    "unknown_fields",
    "warning_header",
]

FieldValidation = Literal["Strict", "Warn", "Ignore"]
_MODES: dict[str, FieldValidation] = {"strict": "Strict", "warn": "Warn", "ignore": "Ignore"}

FIELD_VALIDATION_PARAM = Param(
    "fieldValidation",
    enum=("Strict", "Warn", "Ignore"),
    description="Unknown fields: Strict (422 naming them), Warn (default: accepted with a "
    "`Warning` header per field) or Ignore.",
)

# Fields of the Kubernetes types the models describe only in part (Kubernetes 1.37).
KUBERNETES_FIELDS: dict[type[BaseModel], frozenset[str]] = {
    ObjectMeta: frozenset(
        "annotations creationTimestamp deletionGracePeriodSeconds deletionTimestamp finalizers "
        "generateName generation labels managedFields name namespace ownerReferences "
        "resourceVersion selfLink uid".split()
    ),
    PodTemplateSpec: frozenset({"metadata", "spec"}),
    PodSpec: frozenset(
        "activeDeadlineSeconds affinity automountServiceAccountToken containers dnsConfig dnsPolicy "
        "enableServiceLinks ephemeralContainers evictionResponders hostAliases hostIPC hostNetwork "
        "hostPID hostUsers hostname hostnameOverride imagePullSecrets initContainers nodeName "
        "nodeSelector os overhead preemptionPolicy priority priorityClassName readinessGates "
        "resourceClaims resources restartPolicy runtimeClassName schedulerName schedulingGates "
        "schedulingGroup securityContext serviceAccount serviceAccountName setHostnameAsFQDN "
        "shareProcessNamespace subdomain terminationGracePeriodSeconds tolerations "
        "topologySpreadConstraints volumes".split()
    ),
    Container: CONTAINER_FIELDS,
    ResourceRequirements: frozenset({"claims", "limits", "requests"}),
    EnvVar: frozenset({"name", "value", "valueFrom"}),
    ContainerPort: frozenset({"containerPort", "hostIP", "hostPort", "name", "protocol"}),
    Affinity: frozenset({"nodeAffinity", "podAffinity", "podAntiAffinity"}),
    NodeAffinity: frozenset(
        {"preferredDuringSchedulingIgnoredDuringExecution", "requiredDuringSchedulingIgnoredDuringExecution"}
    ),
    NodeSelector: frozenset({"nodeSelectorTerms"}),
    NodeSelectorTerm: frozenset({"matchExpressions", "matchFields"}),
    NodeSelectorRequirement: frozenset({"key", "operator", "values"}),
    Toleration: frozenset({"effect", "key", "operator", "tolerationSeconds", "value"}),
}

# Fields of the KubeDL (training.kubedl.io) and Kubeflow (kubeflow.org) job APIs that gpuyard
# accepts and passes through without modelling them; a subclass inherits its base's entries.
UNMODELLED_FIELDS: dict[type[BaseModel], frozenset[str]] = {
    JobSpec: frozenset(
        {
            "cronPolicy",  # KubeDL
            "modelVersion",  # KubeDL
            "cacheBackend",  # KubeDL
            "enableDynamicWorker",  # Kubeflow TFJob
            "launcherCreationPolicy",  # Kubeflow MPIJob
            "mpiImplementation",  # Kubeflow MPIJob v2
            "sshAuthMountPath",  # Kubeflow MPIJob v2
            "runLauncherAsWorker",  # Kubeflow MPIJob v2
        }
    ),
    RunPolicy: frozenset(),  # managedBy is modelled (apis/managers.py)
    ReplicaSpec: frozenset(),
    ElasticPolicy: frozenset({"metrics"}),  # Kubeflow PyTorchJob
    SchedulingPolicy: frozenset(),
}

_TOP_LEVEL = frozenset({"apiVersion", "kind", "metadata", "spec", "status"})


def field_validation(request: web.Request) -> FieldValidation:
    """The request's `fieldValidation` (default Warn); anything else is a 400 naming it."""
    raw = request.query.get("fieldValidation")
    if raw is None or raw == "":
        return "Warn"
    mode = _MODES.get(raw.lower())
    if mode is None:
        raise ApiError(
            400,
            f"unknown fieldValidation {raw[:32]!r}",
            details=[{"field": "fieldValidation", "reason": "allowed: Strict, Warn, Ignore"}],
        )
    return mode


def _names(model: type[BaseModel]) -> set[str]:
    """Every key the model reads: field names, aliases, alias choices, plus the known extras."""
    out: set[str] = set()
    for name, info in model.model_fields.items():
        out.add(name)
        if info.alias:
            out.add(info.alias)
        choices = info.validation_alias
        if isinstance(choices, str):
            out.add(choices)
        elif isinstance(choices, AliasChoices):
            out.update(c for c in choices.choices if isinstance(c, str))
    for cls in model.__mro__:
        out |= KUBERNETES_FIELDS.get(cls, frozenset()) | UNMODELLED_FIELDS.get(cls, frozenset())
    if issubclass(model, Resource):
        out |= _TOP_LEVEL
    return out


def _fields_by_key(model: type[BaseModel]) -> dict[str, Any]:
    """Wire key (alias or name) -> the field's annotation."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        out[name] = info.annotation
        if info.alias:
            out[info.alias] = info.annotation
        choices = info.validation_alias
        if isinstance(choices, AliasChoices):
            for c in choices.choices:
                if isinstance(c, str):
                    out[c] = info.annotation
    return out


def _walk_value(annotation: Any, value: Any, path: str, found: list[str]) -> None:
    """Descend into `value` where `annotation` says models live (Optional, list, dict, union)."""
    origin = get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if isinstance(value, Mapping):
            _walk_model(annotation, value, path, found)
        return
    if origin in (Union, types.UnionType):
        for option in get_args(annotation):
            if option is not type(None):
                _walk_value(option, value, path, found)
                return
        return
    if origin is list and isinstance(value, list):
        (item,) = get_args(annotation) or (Any,)
        for i, v in enumerate(value):
            _walk_value(item, v, f"{path}[{i}]", found)
    elif origin is dict and isinstance(value, Mapping):
        args = get_args(annotation)
        item = args[1] if len(args) == 2 else Any
        for k, v in value.items():
            _walk_value(item, v, f"{path}.{k}", found)


def _walk_model(model: type[BaseModel], data: Mapping[Any, Any], path: str, found: list[str]) -> None:
    known = _names(model)
    fields = _fields_by_key(model)
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        if not isinstance(key, str) or key not in known:
            found.append(where)
        elif key in fields and key != "status":  # status is not the submitter's
            _walk_value(fields[key], value, where, found)


def unknown_fields(model: type[BaseModel], data: Any, *, prefix: str = "") -> list[str]:
    """The paths (`spec.tfReplicaSpecs.Worker.replica`) of keys in `data` that `model` does not know."""
    found: list[str] = []
    if isinstance(data, Mapping):
        _walk_model(model, data, prefix.rstrip("."), found)
    return found


MAX_WARNING = 256  # characters of one warning's text


def _printable(text: str) -> str:
    """`text` in printable ASCII: anything else (control characters, non-ASCII) as `\\uXXXX`.

    A field name is the submitter's text; a raw control character in a header would be header
    injection (and aiohttp refuses to send it, dropping the connection)."""
    return "".join(c if " " <= c <= "~" else f"\\u{ord(c):04x}" for c in text)


def warning_header(text: str) -> str:
    """Kubernetes' warning form: `299 - "unknown field \\"spec.x\\""` (quotes and backslashes
    escaped, other characters as printable ASCII, at most :data:`MAX_WARNING` characters)."""
    escaped = _printable(text).replace("\\", "\\\\").replace('"', '\\"')
    if len(escaped) > MAX_WARNING:
        escaped = escaped[: MAX_WARNING - 3].rstrip("\\") + "..."
    return f'299 - "{escaped}"'


MAX_WARNINGS = 20  # Warning headers per answer; the rest are counted in one more


def answer_unknown_fields(
    mode: FieldValidation, unknown: list[str], *, ignored: Sequence[tuple[str, str]] = ()
) -> list[str]:
    """Raise the 422 of `Strict`; else the `Warning` header values to send (none for `Ignore`).

    `ignored`: `(path, reason)` of fields gpuyard accepts but does not act on
    (`apis/ignoredfields.py`): named like unknown fields, with the reason."""
    if (not unknown and not ignored) or mode == "Ignore":
        return []
    if mode == "Strict":
        named = [*unknown[:5], *(path for path, _ in ignored[: max(0, 5 - len(unknown))])]
        what = "unknown field(s)"
        if ignored:
            what = "unknown or unused field(s)" if unknown else "unused field(s)"
        raise ApiError(
            422,
            f"{what} (fieldValidation=Strict): {', '.join(named)}: nothing was stored",
            details=[{"field": path, "reason": "unknown field"} for path in unknown]
            + [{"field": path, "reason": f"{NOT_ACTED_ON}: {reason}"} for path, reason in ignored],
        )
    texts = [f'unknown field "{path}"' for path in unknown]
    texts += [f'field "{path}" is {NOT_ACTED_ON}: {reason}' for path, reason in ignored]
    shown = [warning_header(text) for text in texts[:MAX_WARNINGS]]
    if len(texts) > MAX_WARNINGS:  # clients refuse answers with too many headers (100 is common)
        shown.append(warning_header(f"and {len(texts) - MAX_WARNINGS} more unknown or unused fields"))
    return shown


NOT_ACTED_ON = "accepted but not acted on"
