"""The CRDs: generated from the pydantic models, structural, and the files shipped are up to date."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from pydantic import BaseModel, Field

from gpuyard.apis.core import PodTemplateSpec
from gpuyard.apis.crds import crds, structural, write_crds
from gpuyard.apis.jobkinds import KIND_INFO
from gpuyard.apis.quantity import Quantity
from gpuyard.apis.resources import API_RESOURCES

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "configs" / "deploy" / "crds"
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
BY_NAME = {c["metadata"]["name"]: c for c in crds()}


def schema_of(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_shipped_files_are_the_generated_ones(tmp_path: Path) -> None:
    write_crds(tmp_path)
    generated = {p.name: p.read_text() for p in tmp_path.iterdir()}
    shipped = {p.name: p.read_text() for p in SHIPPED.iterdir()}
    assert sorted(shipped) == sorted(generated), "run `make deploy` (gpuyard install --write-crds ...)"
    stale = [name for name in generated if generated[name] != shipped[name]]
    assert not stale, f"{stale} differ from the models: run `make deploy`"


def test_one_crd_per_custom_resource_of_the_table() -> None:
    expected = {r.crd_name for r in API_RESOURCES if r.crd}
    assert set(BY_NAME) == expected
    assert "tfjobs.kubeflow.org" in expected and "tfjobs.training.kubedl.io" in expected
    assert "elasticquotas.scheduling.sigs.k8s.io" in expected


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_crd_validates_against_the_kubernetes_schema(name: str, version: str) -> None:
    kubernetes_validate.validate(BY_NAME[name], version, strict=True)


def _walk(node: dict[str, Any], path: str) -> list[str]:
    """Structural-schema rule violations under `node` (Kubernetes' rules for CRD schemas)."""
    bad = [
        f"{path}: {k}" for k in ("$ref", "anyOf", "oneOf", "allOf", "const", "title", "default") if k in node
    ]
    free = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
    if "type" not in node and not free:
        bad.append(f"{path}: no type")
    if "properties" in node and "additionalProperties" in node:
        bad.append(f"{path}: both properties and additionalProperties")
    if node.get("type") != "object" and ("properties" in node or "additionalProperties" in node):
        bad.append(f"{path}: properties on a non-object")
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if key in node and not isinstance(node[key], bool):
            bad.append(f"{path}: {key} is not a boolean")
    for name, sub in (node.get("properties") or {}).items():
        bad += _walk(sub, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        bad += _walk(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        bad += _walk(node["items"], f"{path}[]")
    return bad


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_schema_is_structural(name: str) -> None:
    assert _walk(schema_of(BY_NAME[name]), name) == []


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_small_enough_for_client_side_apply(name: str) -> None:
    # `kubectl apply` (client side) stores the object in an annotation limited to 256 KiB
    assert len(json.dumps(BY_NAME[name])) < 256 * 1024 // 4


def test_job_crds_have_status_subresource_columns_names_and_free_form_templates() -> None:
    for name, crd in BY_NAME.items():
        kind = crd["spec"]["names"]["kind"]
        if kind not in KIND_INFO:
            continue
        version = crd["spec"]["versions"][0]
        assert version["subresources"]["status"] == {}
        columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
        assert columns[:2] == ["State", "Age"], name  # as training-operator and KubeDL print them
        assert [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority")] == ["Phase"]
        assert "trainingjobs" in crd["spec"]["names"]["categories"]
        assert "all" not in crd["spec"]["names"]["categories"]
        specs = schema_of(crd)["properties"]["spec"]["properties"]
        replicas = next(v for k, v in specs.items() if k.endswith("ReplicaSpecs"))
        template = replicas["additionalProperties"]["properties"]["template"]
        assert template == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}, name


def test_kubeflow_crds_keep_training_operators_scale_and_mpi_operators_stored_version() -> None:
    for kind, field in (("pytorchjobs", "pytorch"), ("jaxjobs", "jax"), ("paddlejobs", "paddle")):
        scale = BY_NAME[f"{kind}.kubeflow.org"]["spec"]["versions"][0]["subresources"]["scale"]
        assert scale["specReplicasPath"] == f".spec.{field}ReplicaSpecs.Worker.replicas"
        assert scale["statusReplicasPath"] == ".status.replicaStatuses.Worker.active"
    assert "scale" not in BY_NAME["tfjobs.kubeflow.org"]["spec"]["versions"][0]["subresources"]
    mpi = BY_NAME["mpijobs.kubeflow.org"]["spec"]["versions"]
    assert [(v["name"], v["served"], v["storage"]) for v in mpi] == [
        ("v1", True, False),
        ("v2beta1", True, True),
    ]
    assert mpi[0]["schema"] == mpi[1]["schema"]  # no conversion webhook: the same fields at both


def test_podgroup_and_cluster_scoped_kinds() -> None:
    pg = BY_NAME["podgroups.scheduling.gpuyard.io"]
    version = pg["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]][:2] == ["Phase", "Placed"]
    assert pg["spec"]["names"]["shortNames"] == ["pg"] and pg["spec"]["scope"] == "Namespaced"
    for name in ("nodetopologies.gpuyard.io", "queues.gpuyard.io", "resourceclasses.gpuyard.io"):
        assert BY_NAME[name]["spec"]["scope"] == "Cluster"
    # kinds without a status have no status subresource
    for name in ("reservations.scheduling.gpuyard.io", "nodetopologies.gpuyard.io"):
        assert "subresources" not in BY_NAME[name]["spec"]["versions"][0]


class _Sample(BaseModel):
    maybe: int | None = Field(default=None, gt=0, description="a positive number or nothing")
    counts: dict[str, int] = Field(default_factory=dict)
    free: dict[str, Any] = Field(default_factory=dict)
    port: int | str = 80
    request: Quantity = 1
    template: PodTemplateSpec = Field(default_factory=PodTemplateSpec)
    pair: tuple[int, int] = (1, 2)


def test_structural_rewrites_each_json_schema_construct() -> None:
    schema = _Sample.model_json_schema(by_alias=True)
    out = structural(schema, schema["$defs"])
    props = out["properties"]
    assert props["maybe"] == {
        "description": "a positive number or nothing",
        "minimum": 0,
        "exclusiveMinimum": True,
        "type": "integer",
        "nullable": True,
    }
    assert props["counts"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["free"] == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert props["port"] == {"x-kubernetes-int-or-string": True}
    assert props["request"]["x-kubernetes-int-or-string"] is True and "type" not in props["request"]
    assert props["template"] == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert props["pair"] == {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}
    assert "x-kubernetes-preserve-unknown-fields" not in out  # _Sample forbids nothing, keeps nothing


# --- the CRDs accept what users apply -------------------------------------------------------------


def _json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI v3 structural schema as JSON Schema (what the API server checks, near enough)."""
    out: dict[str, Any] = {}
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    elif "type" in node:
        out["type"] = [node["type"], "null"] if node.get("nullable") else node["type"]
    for key in ("enum", "pattern", "minLength", "maxLength", "minItems", "maxItems", "required"):
        if key in node:
            out[key] = node[key] + [None] if key == "enum" and node.get("nullable") else node[key]
    for bound in ("minimum", "maximum"):
        if bound in node:
            exclusive = node.get("exclusive" + bound.capitalize())
            out[("exclusive" + bound.capitalize()) if exclusive else bound] = node[bound]
    if "properties" in node:
        out["properties"] = {k: _json_schema(v) for k, v in node["properties"].items()}
        if not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False  # the API server prunes them: a user's typo is lost
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _json_schema(node["additionalProperties"])
    if "items" in node:
        out["items"] = _json_schema(node["items"])
    return out


def _user_files() -> list[Path]:
    return sorted(
        p
        for folder in ("jobs", "demo", "quotas", "resourceclasses")
        for p in (ROOT / "configs" / folder).glob("*.yaml")
    )


@pytest.mark.parametrize("path", _user_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shipped_objects_are_accepted_by_their_crd(path: Path) -> None:
    import jsonschema
    import yaml

    by_kind = {(c["spec"]["group"], c["spec"]["names"]["kind"]): c for c in BY_NAME.values()}
    checked = 0
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        if "/" not in doc["apiVersion"]:  # a built-in kind (ResourceQuota): the real schema
            kubernetes_validate.validate(doc, VERSIONS[0], strict=True)
            checked += 1
            continue
        group = doc["apiVersion"].split("/")[0]
        crd = by_kind[(group, doc["kind"])]
        assert crd["spec"]["versions"][0]["name"] == doc["apiVersion"].split("/")[1]
        jsonschema.validate(doc, _json_schema(schema_of(crd)))
        checked += 1
    assert checked, f"{path}: no object in it"


def test_the_crd_schema_rejects_what_the_models_reject() -> None:
    import jsonschema

    schema = _json_schema(schema_of(BY_NAME["tfjobs.kubeflow.org"]))
    job = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "x"}, "spec": {}}
    jsonschema.validate(job, schema)
    bad = {**job, "spec": {"runPolicy": {"backoffLimit": -1}}}
    with pytest.raises(jsonschema.ValidationError, match="minimum"):
        jsonschema.validate(bad, schema)
    wrong = {**job, "spec": {"runPolicy": {"cleanPodPolicy": "Sometimes"}}}
    with pytest.raises(jsonschema.ValidationError, match="Sometimes"):
        jsonschema.validate(wrong, schema)


async def test_crds_install_on_an_api_server_and_serve_the_shipped_jobs(fake_apiserver: Any) -> None:
    """The CRDs register (names, scope, status subresource) and serve every job file of configs/jobs."""
    import yaml
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(fake_apiserver.kubeconfig), client_configuration=configuration
    )
    async with client.ApiClient(configuration) as api:
        extensions = client.ApiextensionsV1Api(api)
        for crd in crds():
            await extensions.create_custom_resource_definition(body=crd)
        custom = client.CustomObjectsApi(api)
        created = 0
        for path in sorted((ROOT / "configs" / "jobs").glob("*.yaml")):
            (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
            group, version = doc["apiVersion"].split("/")
            plural = doc["kind"].lower() + "s"
            doc["metadata"]["namespace"] = "ml"
            await custom.create_namespaced_custom_object(group, version, "ml", plural, body=doc)
            stored = await custom.get_namespaced_custom_object_status(
                group, version, "ml", plural, doc["metadata"]["name"]
            )
            assert stored["kind"] == doc["kind"]
            created += 1
        assert created == len(list((ROOT / "configs" / "jobs").glob("*.yaml")))
