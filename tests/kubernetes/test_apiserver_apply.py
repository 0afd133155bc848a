"""Server-side apply and `kubectl explain` on the development API server.

`kubectl apply --server-side` of gpuyard's CRDs and of a job file (create, re-apply, conflicts with
another manager or with `kubectl label`, `--force-conflicts`, a field the applier drops) and
`kubectl explain` of a custom resource's fields, with the real kubectl (skipped where it is not
installed); the same rules over plain HTTP (`applying.py`, `openapi.py`) run without it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml

from gpuyard.apis.crds import crds
from gpuyard.testing.apiserver.fixture import RunningApiServer
from gpuyard.testing.apiserver.openapi import OBJECT_META
from tests.kubernetes.test_apiserver_kubectl import KUBECTL, Kubectl

ROOT = Path(__file__).resolve().parents[2]
TFJOB = ROOT / "configs" / "jobs" / "tf-dist-mnist.yaml"
JOB = "dist-mnist-for-e2e-test"
JOBS = "/apis/kubeflow.org/v1/namespaces/default/tfjobs"
APPLY = "application/apply-patch+yaml"

needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (not on PATH)")


class Rest:
    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url = http, url

    async def __call__(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        async with self.http.request(
            method, self.url + path, data=data, headers={"Content-Type": content_type}
        ) as resp:
            return resp.status, await resp.json(content_type=None)


@pytest_asyncio.fixture
async def rest(fake_apiserver: RunningApiServer) -> AsyncIterator[Rest]:
    fake_apiserver.server.install_crds(crds())
    async with aiohttp.ClientSession() as http:
        yield Rest(http, fake_apiserver.url)


def tfjob(workers: int | None = None, **labels: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "j"}}
    if labels:
        doc["metadata"]["labels"] = labels
    spec: dict[str, Any] = {"tfReplicaSpecs": {"Worker": {"restartPolicy": "Never"}}}
    if workers is not None:
        spec["tfReplicaSpecs"]["Worker"]["replicas"] = workers
    doc["spec"] = spec
    return doc


def managers(obj: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(e["manager"], e["operation"]): e["fieldsV1"] for e in obj["metadata"].get("managedFields", [])}


# --- over HTTP --------------------------------------------------------------------------------------


async def test_apply_creates_then_merges_and_keeps_a_noop_a_noop(rest: Rest) -> None:
    code, created = await rest(
        "PATCH", f"{JOBS}/j?fieldManager=alice", tfjob(2, team="a"), content_type=APPLY
    )
    assert code == 201, created
    assert created["spec"]["tfReplicaSpecs"]["Worker"] == {"restartPolicy": "Never", "replicas": 2}
    assert managers(created) == {
        ("alice", "Apply"): {
            "f:metadata": {"f:labels": {"f:team": {}}},
            "f:spec": {"f:tfReplicaSpecs": {"f:Worker": {"f:replicas": {}, "f:restartPolicy": {}}}},
        }
    }
    assert created["metadata"]["managedFields"][0]["fieldsType"] == "FieldsV1"
    code, again = await rest("PATCH", f"{JOBS}/j?fieldManager=alice", tfjob(2, team="a"), content_type=APPLY)
    assert code == 200 and again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    # alice drops her label and the replicas: both go; what she still applies stays
    code, dropped = await rest("PATCH", f"{JOBS}/j?fieldManager=alice", tfjob(), content_type=APPLY)
    assert code == 200
    assert "labels" not in dropped["metadata"]
    assert dropped["spec"]["tfReplicaSpecs"]["Worker"] == {"restartPolicy": "Never"}
    assert dropped["metadata"]["generation"] == 2


async def test_conflicts_force_and_shared_fields(rest: Rest) -> None:
    await rest("PATCH", f"{JOBS}/j?fieldManager=alice", tfjob(2), content_type=APPLY)
    code, conflict = await rest("PATCH", f"{JOBS}/j?fieldManager=bob", tfjob(4), content_type=APPLY)
    assert code == 409 and conflict["reason"] == "Conflict"
    assert conflict["message"] == (
        'Apply failed with 1 conflict: conflict with "alice" using kubeflow.org/v1: '
        ".spec.tfReplicaSpecs.Worker.replicas"
    )
    assert conflict["details"]["causes"] == [
        {
            "type": "FieldManagerConflict",
            "message": 'conflict with "alice" using kubeflow.org/v1',
            "field": ".spec.tfReplicaSpecs.Worker.replicas",
        }
    ]
    # the same value is no conflict: bob co-owns restartPolicy and replicas
    code, shared = await rest("PATCH", f"{JOBS}/j?fieldManager=bob", tfjob(2), content_type=APPLY)
    assert code == 200, shared
    code, forced = await rest(
        "PATCH", f"{JOBS}/j?fieldManager=carol&force=true", tfjob(8), content_type=APPLY
    )
    assert code == 200 and forced["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] == 8
    owners = managers(forced)
    assert "f:replicas" in owners[("carol", "Apply")]["f:spec"]["f:tfReplicaSpecs"]["f:Worker"]
    for name in ("alice", "bob"):
        assert "f:replicas" not in owners[(name, "Apply")]["f:spec"]["f:tfReplicaSpecs"]["f:Worker"]
    # carol leaves replicas out: alice and bob no longer own it, so it goes with carol's ownership
    code, left = await rest("PATCH", f"{JOBS}/j?fieldManager=carol", tfjob(), content_type=APPLY)
    assert code == 200 and "replicas" not in left["spec"]["tfReplicaSpecs"]["Worker"]


async def test_an_update_takes_the_fields_it_changes(rest: Rest) -> None:
    await rest("PATCH", f"{JOBS}/j?fieldManager=alice", tfjob(2, team="a"), content_type=APPLY)
    patch = {"metadata": {"labels": {"team": "b"}}}
    code, patched = await rest(
        "PATCH", f"{JOBS}/j?fieldManager=relabel", patch, content_type="application/merge-patch+json"
    )
    assert code == 200
    owners = managers(patched)
    assert owners[("relabel", "Update")] == {"f:metadata": {"f:labels": {"f:team": {}}}}
    assert "f:metadata" not in owners[("alice", "Apply")]
    code, conflict = await rest(
        "PATCH", f"{JOBS}/j?fieldManager=alice", tfjob(2, team="a"), content_type=APPLY
    )
    assert code == 409 and 'conflict with "relabel"' in conflict["message"]
    # without a fieldManager, the manager is the User-Agent up to its first '/'
    code, by_agent = await rest(
        "PATCH",
        f"{JOBS}/j",
        {"spec": {"runPolicy": {"suspend": True}}},
        content_type="application/merge-patch+json",
    )
    assert code == 200 and any(m.startswith("Python") for m, _ in managers(by_agent))


async def test_apply_to_status_and_the_requests_it_refuses(rest: Rest) -> None:
    code, _ = await rest("PATCH", f"{JOBS}/j/status?fieldManager=op", tfjob(), content_type=APPLY)
    assert code == 404  # /status applies to an existing object only
    await rest("PATCH", f"{JOBS}/j?fieldManager=alice", tfjob(2), content_type=APPLY)
    status = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "j"}}
    status["status"] = {"conditions": [{"type": "Running", "status": "True"}]}
    code, body = await rest("PATCH", f"{JOBS}/j/status?fieldManager=op", status, content_type=APPLY)
    assert code == 200 and body["status"]["conditions"][0]["type"] == "Running"
    entry = next(e for e in body["metadata"]["managedFields"] if e["manager"] == "op")
    assert entry["subresource"] == "status" and entry["fieldsV1"] == {"f:status": {"f:conditions": {}}}
    code, main = await rest(
        "PATCH", f"{JOBS}/j?fieldManager=alice", {**tfjob(2), **status}, content_type=APPLY
    )
    assert code == 200 and main["status"] == body["status"]  # the main resource's apply leaves status
    bad = [
        (f"{JOBS}/j", tfjob(2), "fieldManager is required for apply requests"),
        (f"{JOBS}/j?fieldManager=a", {"metadata": {"name": "j"}}, "apiVersion and kind must be set"),
        (
            f"{JOBS}/j?fieldManager=a",
            {**tfjob(2), "metadata": {"name": "j", "managedFields": []}},
            "metadata.managedFields must be nil",
        ),
        (f"{JOBS}/k?fieldManager=a", tfjob(2), "does not match the name on the URL"),
    ]
    for path, doc, message in bad:
        code, refused = await rest("PATCH", path, doc, content_type=APPLY)
        assert code == 400 and message in refused["message"], (path, refused)


async def test_openapi_v3_carries_the_crd_schemas(rest: Rest) -> None:
    code, root = await rest("GET", "/openapi/v3")
    assert code == 200
    url = root["paths"]["apis/kubeflow.org/v1"]["serverRelativeURL"]
    code, doc = await rest("GET", url)
    schemas = doc["components"]["schemas"]
    tf = schemas["org.kubeflow.v1.TFJob"]
    assert tf["x-kubernetes-group-version-kind"] == [
        {"group": "kubeflow.org", "kind": "TFJob", "version": "v1"}
    ]
    ref = tf["properties"]["metadata"]["allOf"][0]["$ref"]
    assert ref == f"#/components/schemas/{OBJECT_META}" and "labels" in schemas[OBJECT_META]["properties"]
    crd = next(c for c in crds() if c["metadata"]["name"] == "tfjobs.kubeflow.org")
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    assert tf["properties"]["spec"] == version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    code, kubedl = await rest("GET", "/openapi/v3/apis/training.kubedl.io/v1alpha1")
    assert "io.kubedl.training.v1alpha1.TFJob" in kubedl["components"]["schemas"]


# --- with kubectl -----------------------------------------------------------------------------------


def _crds_file(tmp: Path) -> Path:
    path = tmp / "crds.yaml"
    path.write_text(yaml.safe_dump_all(crds()))
    return path


@needs_kubectl
async def test_kubectl_server_side_apply_and_explain(
    fake_apiserver: RunningApiServer, tmp_path: Path
) -> None:
    assert KUBECTL is not None
    kubectl = Kubectl(KUBECTL, fake_apiserver, tmp_path)
    out = await kubectl("apply", "--server-side", "-f", str(_crds_file(tmp_path)))
    assert "customresourcedefinition.apiextensions.k8s.io/tfjobs.kubeflow.org serverside-applied" in out

    explained = await kubectl("explain", "tfjob.spec.runPolicy", "--api-version", "kubeflow.org/v1")
    assert "KIND:       TFJob" in explained and "FIELD: runPolicy <Object>" in explained
    assert "schedulingPolicy\t<Object>" in explained and "Gang/queue settings" in explained
    labels = await kubectl("explain", "tfjob.metadata.labels", "--api-version", "kubeflow.org/v1")
    assert "FIELD: labels <map[string]string>" in labels

    assert f"tfjob.kubeflow.org/{JOB} serverside-applied" in await kubectl(
        "apply", "--server-side", "-f", str(TFJOB)
    )
    first = yaml.safe_load(await kubectl("get", "tfjob", JOB, "-o", "yaml", "--show-managed-fields"))
    assert [(e["manager"], e["operation"]) for e in first["metadata"]["managedFields"]] == [
        ("kubectl", "Apply")
    ]
    await kubectl("apply", "--server-side", "-f", str(TFJOB))  # unchanged: no new version
    again = yaml.safe_load(await kubectl("get", "tfjob", JOB, "-o", "yaml"))
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]

    other = tmp_path / "other.yaml"
    doc = yaml.safe_load(TFJOB.read_text())
    doc["spec"] = {"tfReplicaSpecs": {"Worker": {"replicas": 6}}}
    doc["metadata"]["labels"] = {"team": "b"}
    other.write_text(yaml.safe_dump(doc))
    refused = await kubectl("apply", "--server-side", "--field-manager", "other", "-f", str(other), ok=False)
    assert (
        'Apply failed with 1 conflict: conflict with "kubectl" using kubeflow.org/v1: '
        ".spec.tfReplicaSpecs.Worker.replicas" in refused
    )
    await kubectl("apply", "--server-side", "--field-manager", "other", "--force-conflicts", "-f", str(other))
    assert await kubectl("get", "tfjob", JOB, "-o", "jsonpath={.spec.tfReplicaSpecs.Worker.replicas}") == "6"
    await kubectl("label", "tfjob", JOB, "team=c", "--overwrite")
    refused = await kubectl("apply", "--server-side", "--field-manager", "other", "-f", str(other), ok=False)
    assert 'conflict with "kubectl-label" using kubeflow.org/v1: .metadata.labels.team' in refused
    # "other" gives up its label: kubectl-label's value stays, "other"'s replicas too
    del doc["metadata"]["labels"]
    other.write_text(yaml.safe_dump(doc))
    await kubectl("apply", "--server-side", "--field-manager", "other", "-f", str(other))
    got = yaml.safe_load(await kubectl("get", "tfjob", JOB, "-o", "yaml"))
    assert got["metadata"]["labels"] == {"team": "c"}
    assert got["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] == 6
    assert f'tfjob.kubeflow.org "{JOB}" deleted' in await kubectl("delete", "-f", str(TFJOB))
