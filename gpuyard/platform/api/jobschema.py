"""The OpenAPI schema of a job document, generated from the job models (`apis/jobkinds.py`).

`POST /api/v1/jobs` takes one job of any kind; its request body is documented as `oneOf` the
kinds, each the kind's pydantic model (spec, replica specs, pod templates, run policy) with
`kind` and `apiVersion` narrowed to what that kind accepts, the replica-spec map keyed by the
kind's roles and metadata as the API requires it, so a client generator (or a fuzzer such as
schemathesis) can build real jobs from the document. `status` is left out: it is the
operator's, and a submitted one is ignored.
"""

from __future__ import annotations

from typing import Any

from gpuyard.apis.jobkinds import KIND_INFO
from gpuyard.apis.jobs import MAX_NAME
from gpuyard.apis.jobspecs import MAX_REPLICAS
from gpuyard.platform.api.openapi import register_model

__all__ = ["job_document_schema"]


_NAME = {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": MAX_NAME}
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
# What the API requires of a job's metadata (`apis/jobs.py`): a DNS-label name, an optional namespace.
METADATA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": _NAME,
        "namespace": {**_NAME, "maxLength": 63},
        "labels": _STRINGS,
        "annotations": _STRINGS,
    },
}


def _ref_name(ref: dict[str, Any]) -> str:
    return str(ref["$ref"]).rsplit("/", 1)[-1]


def _bound_replica_spec(components: dict[str, Any], replica: dict[str, Any]) -> None:
    """What the validators check but the models' schemas cannot say: replicas 0..MAX_REPLICAS,
    and a pod template with at least one container (as Kubernetes requires of every pod)."""
    spec = components[_ref_name(replica)]
    spec["properties"]["replicas"] = {
        "type": "integer",
        "minimum": 0,
        "maximum": MAX_REPLICAS,
        "nullable": True,
    }
    spec["required"] = sorted({*spec.get("required", []), "template"})
    template = components.get("PodTemplateSpec")
    if template is not None:
        template["required"] = sorted({*template.get("required", []), "spec"})
    pod = components.get("PodSpec")
    if pod is not None:
        pod["required"] = sorted({*pod.get("required", []), "containers"})
        pod["properties"]["containers"] = {**pod["properties"]["containers"], "minItems": 1}


def job_document_schema(components: dict[str, Any]) -> dict[str, Any]:
    """`{"oneOf": [<TFJob document>, ...]}`, each kind registered in `components`.

    Per kind: `kind` and `apiVersion` are the kind's, the replica-spec map's keys are the roles
    the kind allows (of either project), and metadata is what the API requires of a job.
    """
    options: list[dict[str, Any]] = []
    for kind, info in sorted(KIND_INFO.items()):
        name = f"{kind}Document"
        if name not in components:
            base = components[_ref_name(register_model(info.cls, components))]
            spec_name = _ref_name(base["properties"]["spec"])
            spec = components[spec_name]
            replica = spec["properties"][info.replica_field]["additionalProperties"]
            _bound_replica_spec(components, replica)
            roles = sorted({role for flavor in info.flavors.values() for role in flavor.roles})
            components[f"{kind}DocumentSpec"] = {
                **spec,
                "title": f"{kind}DocumentSpec",
                "required": [info.replica_field],
                "properties": {
                    **spec["properties"],
                    info.replica_field: {
                        "type": "object",
                        "minProperties": 1,
                        "additionalProperties": False,
                        "properties": dict.fromkeys(roles, replica),
                    },
                },
            }
            properties = {k: v for k, v in base.get("properties", {}).items() if k != "status"}
            properties["kind"] = {"type": "string", "enum": [kind]}
            properties["apiVersion"] = {"type": "string", "enum": sorted(info.flavors)}
            properties["metadata"] = METADATA_SCHEMA
            properties["spec"] = {"$ref": f"#/components/schemas/{kind}DocumentSpec"}
            components[name] = {
                **{k: v for k, v in base.items() if k != "properties"},
                "title": name,
                "required": ["apiVersion", "kind", "metadata", "spec"],
                "properties": properties,
            }
        options.append({"$ref": f"#/components/schemas/{name}"})
    return {"oneOf": options}
