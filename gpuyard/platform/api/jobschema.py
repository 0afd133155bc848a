"""The OpenAPI schema of a job document, generated from the job models (`apis/jobkinds.py`).

`POST /api/v1/jobs` takes one job of any kind; its request body is documented as `oneOf` the
kinds, each the kind's pydantic model (spec, replica specs, pod templates, run policy) with
`kind` and `apiVersion` narrowed to what that kind accepts, so a client generator (or a fuzzer
such as schemathesis) can build real jobs from the document. `status` is left out: it is the
operator's, and a submitted one is ignored.
"""

from __future__ import annotations

from typing import Any

from gpuyard.apis.jobkinds import KIND_INFO
from gpuyard.platform.api.openapi import register_model

__all__ = ["job_document_schema"]


def job_document_schema(components: dict[str, Any]) -> dict[str, Any]:
    """`{"oneOf": [<TFJob document>, ...]}`, each kind registered in `components`."""
    options: list[dict[str, Any]] = []
    for kind, info in sorted(KIND_INFO.items()):
        ref = register_model(info.cls, components)
        name = f"{kind}Document"
        if name not in components:
            base = components[ref["$ref"].rsplit("/", 1)[-1]]
            properties = {k: v for k, v in base.get("properties", {}).items() if k != "status"}
            properties["kind"] = {"type": "string", "enum": [kind]}
            properties["apiVersion"] = {"type": "string", "enum": sorted(info.flavors)}
            components[name] = {
                **{k: v for k, v in base.items() if k != "properties"},
                "title": name,
                "required": ["apiVersion", "kind", "metadata", "spec"],
                "properties": properties,
            }
        options.append({"$ref": f"#/components/schemas/{name}"})
    return {"oneOf": options}
