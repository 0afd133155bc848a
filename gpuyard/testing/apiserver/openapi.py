"""The smallest OpenAPI v3 documents kubectl needs (`/openapi/v3`, `/openapi/v3/{api/v1|apis/g/v}`).

kubectl (1.27+) validates what it sends by asking the server whether PATCH of the object's kind takes
the `fieldValidation` query parameter (server-side validation); it reads that from these documents.
They list, per served resource, a PATCH operation with the `x-kubernetes-group-version-kind` extension
and that parameter, and no schemas: kubectl then leaves validation to the server, which here accepts
any field (no schema validation, see docs/kubernetes-testing.md). Without them kubectl falls back to
`/openapi/v2` and refuses to apply anything unless run with `--validate=false`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from gpuyard.testing.apiserver.catalog import Catalog
from gpuyard.testing.apiserver.errors import ApiError

__all__ = ["group_version_document", "root_document"]


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
    for res in sorted(served, key=lambda r: r.plural):
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
        "components": {"schemas": {}},
    }
