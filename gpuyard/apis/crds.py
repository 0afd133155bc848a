"""CustomResourceDefinitions of gpuyard's kinds, generated from their pydantic models.

The API server of a Kubernetes cluster stores gpuyard's objects (jobs, PodGroups, Reservations,
queues, quotas, device topologies) only once their CRDs are installed. The CRDs in
`configs/deploy/crds/` are written by :func:`write_crds` (`gpuyard install --write-crds DIR`,
`make crds`) from the same models the HTTP API validates with, so the two never drift apart; a
test regenerates them and fails if the files differ. Where each kind lives (group, version,
plural, scope, short names, categories) comes from :mod:`gpuyard.apis.resources`.

Kubernetes wants a *structural* OpenAPI v3 schema, which a pydantic JSON schema is not, so
:func:`structural` rewrites it: `$ref`s inlined, `X | None` as `nullable: true` instead of
`anyOf` with null, a `type` on every node, `dict[str, X]` as `additionalProperties`, quantities
(`1`, `500m`, `2Gi`) as `x-kubernetes-int-or-string`, number bounds in OpenAPI v3's boolean
`exclusiveMinimum` form, and the free-form parts (pod templates, `dict[str, Any]`, unions other
than with null) as `x-kubernetes-preserve-unknown-fields: true`. Titles and defaults are left out:
the server must not default fields the models default themselves, and the CRDs stay small enough
for `kubectl apply` (its last-applied annotation is limited to 256 KiB).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter

from gpuyard.apis.crons import Cron
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.jobkinds import API_KUBEDL, API_KUBEFLOW, KIND_INFO
from gpuyard.apis.meta import Resource
from gpuyard.apis.models import MODEL_KINDS
from gpuyard.apis.quantity import Quantity
from gpuyard.apis.quotakinds import ElasticQuota, Queue
from gpuyard.apis.resourceclasses import ResourceClass
from gpuyard.apis.resources import API_RESOURCES, ApiResource
from gpuyard.apis.scheduling import PodGroup, Reservation

__all__ = ["FREE_FORM_MODELS", "crd_for", "crd_models", "crds", "dump_yaml", "structural", "write_crds"]

FREE_FORM_MODELS = frozenset({"PodTemplateSpec", "PodSpec"})
"""Models kept free-form in the CRDs (`x-kubernetes-preserve-unknown-fields`): pod templates are
Kubernetes' own PodSpec, which the API server does not re-validate inside a custom resource."""

_QUANTITY_SCHEMA = TypeAdapter(Quantity).json_schema()
_FORMATS = frozenset({"date-time", "date", "int32", "int64", "float", "double", "byte", "uri"})
_KEEP = (
    "description",
    "enum",
    "pattern",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "format",
    "x-kubernetes-validations",  # CEL rules a model declares (json_schema_extra), e.g. immutability
)
_FREE: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_DESCRIPTION_LIMIT = 300


def crd_models() -> dict[str, type[Resource]]:
    """Kind -> the model of every kind gpuyard ships a CRD for."""
    models: dict[str, type[Resource]] = {kind: info.cls for kind, info in KIND_INFO.items()}
    for cls in (PodGroup, Reservation, ResourceClass, NodeTopology, Queue, ElasticQuota, Cron):
        models[cls.KIND] = cls
    models.update({cls.KIND: cls for cls in MODEL_KINDS})  # KubeDL's Model and ModelVersion
    return models


def structural(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    """The structural OpenAPI v3 form of one JSON-schema node (`defs`: the `$defs` it refers to)."""
    if {k: v for k, v in schema.items() if k not in ("default", "title")} == _QUANTITY_SCHEMA:
        return {"x-kubernetes-int-or-string": True, "description": schema["description"]}
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        inlined = dict(_FREE) if name in FREE_FORM_MODELS else structural(defs[name], defs)
        if "description" in schema:
            inlined["description"] = _describe(schema["description"])
        return inlined
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return _union(schema, key, defs)
    out: dict[str, Any] = {k: schema[k] for k in _KEEP if k in schema}
    if "description" in out:
        out["description"] = _describe(out["description"])
    if out.get("format") not in _FORMATS:
        out.pop("format", None)
    if "const" in schema:
        out["enum"] = [schema["const"]]
    _bounds(schema, out)
    kind = schema.get("type")
    if kind == "object" or "properties" in schema or "additionalProperties" in schema:
        return _object(schema, out, defs)
    if kind == "array":
        out["type"] = "array"
        out["items"] = _items(schema, defs)
        return out
    if kind in ("string", "integer", "number", "boolean"):
        out["type"] = kind
        return out
    return {**_FREE, **{k: v for k, v in out.items() if k == "description"}}


def _describe(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _DESCRIPTION_LIMIT else text[: _DESCRIPTION_LIMIT - 3] + "..."


def _bounds(schema: Mapping[str, Any], out: dict[str, Any]) -> None:
    """JSON Schema's numeric `exclusiveMinimum: n` is OpenAPI v3's `minimum: n, exclusiveMinimum: true`."""
    for bound in ("minimum", "maximum"):
        if bound in schema:
            out[bound] = schema[bound]
        exclusive = "exclusive" + bound.capitalize()
        if exclusive in schema:
            out[bound] = schema[exclusive]
            out[exclusive] = True


def _object(schema: Mapping[str, Any], out: dict[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    out["type"] = "object"
    props = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    if props:
        out["properties"] = {name: structural(sub, defs) for name, sub in props.items()}
        required = [r for r in schema.get("required", ()) if r in props]
        if required:
            out["required"] = required
        if extra is True:  # a K8sModel keeps unknown fields: so does the server
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif isinstance(extra, Mapping) and extra:
        out["additionalProperties"] = structural(extra, defs)
    elif extra is not False:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _items(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    if "items" in schema and isinstance(schema["items"], Mapping):
        return structural(schema["items"], defs)
    prefix = [structural(s, defs) for s in schema.get("prefixItems", ())]
    if prefix and all(p == prefix[0] for p in prefix):
        return prefix[0]
    return dict(_FREE)


def _union(schema: Mapping[str, Any], key: str, defs: Mapping[str, Any]) -> dict[str, Any]:
    branches = [b for b in schema[key] if b.get("type") != "null"]
    nullable = len(branches) < len(schema[key])
    if len(branches) == 1:
        out = structural({**branches[0], **_annotations(schema)}, defs)
    elif {b.get("type") for b in branches} == {"integer", "string"} and len(branches) == 2:
        out = {"x-kubernetes-int-or-string": True, **_annotations(schema)}
    else:
        out = {"x-kubernetes-preserve-unknown-fields": True, **_annotations(schema)}
    if "description" in out:
        out["description"] = _describe(out["description"])
    if nullable:
        out["nullable"] = True
    return out


def _annotations(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {k: schema[k] for k in ("description", "x-kubernetes-validations") if k in schema}


_STATE = {"name": "State", "type": "string", "jsonPath": ".status.conditions[-1:].type"}
_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
_PHASE_WIDE = {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "priority": 1}
_LIFETIME = {"name": "Max-Lifetime", "type": "integer", "jsonPath": ".spec.activeDeadlineSeconds"}
_TTL = {"name": "TTL-AFTER-FINISHED", "type": "integer", "jsonPath": ".spec.ttlSecondsAfterFinished"}
_MODEL = {"name": "Model-Version", "type": "string", "jsonPath": ".status.modelVersionName"}
_CACHE = {"name": "Cache-Backend", "type": "string", "jsonPath": ".status.cacheBackendName"}

# A job kind's CRD is also installed by the operator that owns its group (training-operator for
# kubeflow.org, KubeDL for training.kubedl.io); whichever applies last wins, so gpuyard's serves
# what theirs serves: their printer columns (gpuyard's phase only in `-o wide`), their `scale`
# subresources, every version they serve with the same storage version.
_KUBEFLOW, _KUBEDL = API_KUBEFLOW.split("/")[0], API_KUBEDL.split("/")[0]
_PEER_COLUMNS: dict[tuple[str, str], list[dict[str, Any]]] = {
    **{(_KUBEFLOW, kind): [_STATE, _AGE] for kind in KIND_INFO},
    **{(_KUBEDL, kind): [_STATE, _AGE, _TTL, _LIFETIME] for kind in KIND_INFO},
    (_KUBEDL, "TFJob"): [_STATE, _AGE, _MODEL, _CACHE, _LIFETIME, _TTL],
    (_KUBEDL, "PyTorchJob"): [_STATE, _AGE, _MODEL, _CACHE, _LIFETIME, _TTL],
}
_SCALED = {
    "PyTorchJob": "pytorchReplicaSpecs",
    "JAXJob": "jaxReplicaSpecs",
    "PaddleJob": "paddleReplicaSpecs",
}
_EXTRA_VERSIONS: dict[tuple[str, str], str] = {
    # mpi-operator v0.8 serves and stores kubeflow.org MPIJobs at v2beta1. Without a conversion
    # webhook both versions hold the same fields: gpuyard reads them at v1.
    (_KUBEFLOW, "MPIJob"): "v2beta1",
}


def _scale(resource: ApiResource) -> dict[str, str] | None:
    """training-operator's `scale` subresource (the Worker replicas; HPA and `kubectl scale`)."""
    field = _SCALED.get(resource.kind)
    if field is None or resource.api_version != API_KUBEFLOW:
        return None
    return {
        "labelSelectorPath": ".status.replicaStatuses.Worker.selector",
        "specReplicasPath": f".spec.{field}.Worker.replicas",
        "statusReplicasPath": ".status.replicaStatuses.Worker.active",
    }


def _columns(resource: ApiResource, model: type[Resource]) -> list[dict[str, Any]]:
    """`kubectl get` columns: a job's as its project prints them, a PodGroup's phase and placed pods."""
    peer = _PEER_COLUMNS.get((resource.group, resource.kind))
    if peer is not None:
        return [*peer, _PHASE_WIDE]
    columns: list[dict[str, Any]] = []
    if resource.kind == "PodGroup":
        columns += [
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Placed", "type": "integer", "jsonPath": ".status.placed"},
            {"name": "Queue", "type": "string", "jsonPath": ".spec.queue", "priority": 1},
        ]
    elif resource.kind == "Reservation":
        columns += [
            {"name": "Node", "type": "string", "jsonPath": ".spec.node"},
            {"name": "GPUs", "type": "string", "jsonPath": ".spec.gpus", "priority": 1},
        ]
    elif resource.kind == "Queue":
        columns += [
            {"name": "Pending", "type": "integer", "jsonPath": ".status.pending"},
            {"name": "Running", "type": "integer", "jsonPath": ".status.running"},
        ]
    elif resource.kind == "Model":  # KubeDL's columns
        columns += [
            {"name": "Latest-Version", "type": "string", "jsonPath": ".status.latestVersion.modelVersion"},
            {"name": "Latest-Image", "type": "string", "jsonPath": ".status.latestVersion.imageName"},
        ]
    elif resource.kind == "ModelVersion":  # KubeDL's columns
        columns += [
            {"name": "Model", "type": "string", "jsonPath": ".spec.modelName"},
            {"name": "Image", "type": "string", "jsonPath": ".status.image"},
            {"name": "Created-By", "type": "string", "jsonPath": ".spec.createdBy"},
            {"name": "Finish-Time", "type": "string", "jsonPath": ".status.finishTime"},
        ]
    elif resource.kind == "ResourceClass":
        columns.append({"name": "Description", "type": "string", "jsonPath": ".spec.description"})
    elif resource.kind == "Cron":
        columns += [
            {"name": "Schedule", "type": "string", "jsonPath": ".spec.schedule"},
            {"name": "Suspend", "type": "boolean", "jsonPath": ".spec.suspend"},
            {"name": "Last-Schedule", "type": "date", "jsonPath": ".status.lastScheduleTime"},
        ]
    columns.append(_AGE)
    return columns


def crd_for(resource: ApiResource, model: type[Resource]) -> dict[str, Any]:
    """The CustomResourceDefinition (apiextensions.k8s.io/v1) of one resource."""
    schema = model.model_json_schema(by_alias=True, mode="validation")
    defs = schema.get("$defs", {})
    properties: dict[str, Any] = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
    }
    for name in ("spec", "status"):
        if name in schema["properties"]:
            properties[name] = structural(schema["properties"][name], defs)
    top: dict[str, Any] = {"type": "object", "properties": properties}
    if "spec" in schema.get("required", ()):
        top["required"] = ["spec"]
    if model.__doc__ and model.__doc__.strip():  # the kind's own docstring (not inherited)
        top["description"] = _describe(model.__doc__)
    version: dict[str, Any] = {
        "name": resource.version,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": top},
        "additionalPrinterColumns": _columns(resource, model),
    }
    if resource.status_subresource and "status" in properties:
        version["subresources"] = {"status": {}}
        if scale := _scale(resource):
            version["subresources"]["scale"] = scale
    versions = [version]
    if extra := _EXTRA_VERSIONS.get((resource.group, resource.kind)):
        versions = [{**copy.deepcopy(version), "storage": False}, {**version, "name": extra}]
    names = resource.crd_names()
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {**resource.crd_metadata(), "labels": {"app.kubernetes.io/part-of": "gpuyard"}},
        "spec": {
            "group": resource.group,
            "names": names,
            "scope": "Namespaced" if resource.namespaced else "Cluster",
            "versions": versions,
        },
    }


def crds() -> list[dict[str, Any]]:
    """Every CRD gpuyard ships, in a stable order (by name)."""
    models = crd_models()
    out = [crd_for(r, models[r.kind]) for r in API_RESOURCES if r.crd]
    return sorted(out, key=lambda c: c["metadata"]["name"])


def dump_yaml(obj: Any) -> str:
    """YAML as the shipped files hold it: block style, keys in the order written."""
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=100, allow_unicode=True)


def write_crds(directory: Path) -> list[Path]:
    """Write one file per CRD (`<plural>.<group>.yaml`) into `directory`; return the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for crd in crds():
        path = directory / f"{crd['metadata']['name']}.yaml"
        path.write_text(dump_yaml(crd))
        paths.append(path)
    return paths
