"""The OpenAPI v3 documents kubectl reads (`/openapi/v3`, `/openapi/v3/{api/v1|apis/g/v}`).

kubectl (1.27+) validates what it sends by asking the server whether PATCH of the object's kind takes
the `fieldValidation` query parameter (server-side validation); it reads that from these documents.
They list, per served resource, a PATCH operation with the `x-kubernetes-group-version-kind` extension
and that parameter: kubectl then leaves validation to the server, which here accepts any field (no
schema validation, see docs/kubernetes-testing.md). Without them kubectl falls back to `/openapi/v2`
and refuses to apply anything unless run with `--validate=false`.

A custom resource's document also carries its schema, built from its CRD's `openAPIV3Schema` as a real
server publishes it: named `<reversed group>.<version>.<Kind>` (`org.kubeflow.v1.TFJob`), with the
`x-kubernetes-group-version-kind` extension, described `apiVersion` and `kind`, and `metadata` a
reference to `ObjectMeta` (in the same document). `kubectl explain tfjob.spec.runPolicy` reads those.
Built-in kinds have no schema here (`kubectl explain pod` says so).
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from gpuyard.testing.apiserver.catalog import Catalog, Resource
from gpuyard.testing.apiserver.errors import ApiError

__all__ = ["OBJECT_META", "group_version_document", "root_document", "schema_name"]


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def root_document(catalog: Catalog) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for group in ["", *catalog.groups()]:
        for version in catalog.versions_of(group):
            doc = json.dumps(group_version_document(catalog, group, version), sort_keys=True)
            digest = hashlib.sha256(doc.encode()).hexdigest()[:32].upper()
            path = _gv_path(group, version)
            paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": paths}


def group_version_document(catalog: Catalog, group: str, version: str) -> dict[str, Any]:
    served = catalog.of(group, version)
    if not served:
        raise ApiError(404, "the server could not find the requested resource", reason="NotFound")
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for res in sorted(served, key=lambda r: r.plural):
        if res.schema is not None:
            schemas[schema_name(res.group, res.version, res.kind)] = _resource_schema(res, res.schema)
            schemas.setdefault(OBJECT_META, OBJECT_META_SCHEMA)
        if "patch" not in res.verbs:
            continue
        base = "/" + _gv_path(group, version) + ("/namespaces/{namespace}" if res.namespaced else "")
        paths[f"{base}/{res.plural}/{{name}}"] = {
            "patch": {
                "operationId": f"patch{res.kind}",
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": res.kind},
                "parameters": [
                    {
                        "name": "fieldValidation",
                        "in": "query",
                        "schema": {"type": "string", "uniqueItems": True},
                    },
                    {
                        "name": "fieldManager",
                        "in": "query",
                        "schema": {"type": "string", "uniqueItems": True},
                    },
                ],
                "responses": {"200": {"description": "OK"}},
            }
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.30.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def schema_name(group: str, version: str, kind: str) -> str:
    """`kubeflow.org`, `v1`, `TFJob` -> `org.kubeflow.v1.TFJob`, a real server's name for a CRD's schema."""
    return ".".join([*reversed(group.split(".")), version, kind])


def _resource_schema(res: Resource, schema: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(schema)
    out["x-kubernetes-group-version-kind"] = [{"group": res.group, "kind": res.kind, "version": res.version}]
    props = out.setdefault("properties", {})
    props["apiVersion"] = {"type": "string", "description": _API_VERSION}
    props["kind"] = {"type": "string", "description": _KIND}
    props["metadata"] = {
        "allOf": [{"$ref": f"#/components/schemas/{OBJECT_META}"}],
        "default": {},
        "description": "Standard object's metadata.",
    }
    out.setdefault("type", "object")
    return out


_API_VERSION = (
    "APIVersion defines the versioned schema of this representation of an object. Servers should convert "
    "recognized schemas to the latest internal value, and may reject unrecognized values."
)
_KIND = (
    "Kind is a string value representing the REST resource this object represents. Servers may infer "
    "this from the endpoint the client submits requests to. Cannot be updated. In CamelCase."
)
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


def _string_map(description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": {"type": "string", "default": ""},
        "description": description,
    }


OBJECT_META_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "ObjectMeta is metadata that all persisted resources must have, which includes all "
    "objects users must create.",
    "properties": {
        "name": {"type": "string", "description": "Name must be unique within a namespace."},
        "generateName": {
            "type": "string",
            "description": "An optional prefix, used by the server to generate a unique name if name is not given.",
        },
        "namespace": {
            "type": "string",
            "description": "Namespace defines the space within which each name must be unique.",
        },
        "labels": _string_map(
            "Map of string keys and values that can be used to organize and categorize objects."
        ),
        "annotations": _string_map("Annotations is an unstructured key value map stored with a resource."),
        "uid": {
            "type": "string",
            "description": "UID is the unique in time and space value for this object.",
        },
        "resourceVersion": {
            "type": "string",
            "description": "An opaque value that represents the internal version of this object.",
        },
        "generation": {
            "type": "integer",
            "format": "int64",
            "description": "A sequence number representing a specific generation of the desired state.",
        },
        "creationTimestamp": {
            "type": "string",
            "format": "date-time",
            "description": "A timestamp representing the server time when this object was created.",
        },
        "deletionTimestamp": {
            "type": "string",
            "format": "date-time",
            "description": "RFC 3339 date and time at which this resource will be deleted.",
        },
        "finalizers": {
            "type": "array",
            "items": {"type": "string", "default": ""},
            "description": "Must be empty before the object is deleted from the registry.",
        },
        "ownerReferences": {
            "type": "array",
            "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "description": "List of objects depended by this object.",
        },
        "managedFields": {
            "type": "array",
            "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "description": "Maps workflow-id and version to the set of fields that are managed by that "
            "workflow (server-side apply).",
        },
    },
}
