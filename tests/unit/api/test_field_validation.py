"""Unknown fields in job and apply bodies: ?fieldValidation=Strict|Warn|Ignore, Kubernetes style."""

from __future__ import annotations

import pytest

from gpuyard.apis.jobkinds import PyTorchJob
from gpuyard.platform.api.app import make_app
from gpuyard.platform.api.fields import unknown_fields, warning_header
from gpuyard.state.context import Context

JOB = """apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: NAME, namespace: team-a}
spec:
  bogusField: 1
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          containers: [{name: pytorch, image: x, resources: {limits: {cpu: 1}}}]
"""
YAML = {"Content-Type": "application/yaml"}


@pytest.fixture
async def client(aiohttp_client):
    ctx = Context.for_tests()
    return await aiohttp_client(make_app(ctx)), ctx


async def test_warn_is_the_default_and_names_the_field(client):
    http, ctx = client
    r = await http.post("/api/v1/jobs", data=JOB.replace("NAME", "j"), headers=YAML)
    assert r.status == 201
    assert r.headers.getall("Warning") == ['299 - "unknown field \\"spec.bogusField\\""']
    assert ctx.store.get("PyTorchJob", "team-a", "j") is not None


async def test_strict_refuses_naming_the_field(client):
    http, ctx = client
    r = await http.post("/api/v1/jobs?fieldValidation=Strict", data=JOB.replace("NAME", "j"), headers=YAML)
    assert r.status == 422
    assert (await r.json())["error"]["details"] == [{"field": "spec.bogusField", "reason": "unknown field"}]
    assert ctx.store.get("PyTorchJob", "team-a", "j") is None


async def test_ignore_is_silent(client):
    http, _ = client
    r = await http.post("/api/v1/jobs?fieldValidation=ignore", data=JOB.replace("NAME", "j"), headers=YAML)
    assert r.status == 201 and "Warning" not in r.headers


async def test_a_clean_job_gets_no_warning_even_when_strict(client):
    http, _ = client
    body = JOB.replace("NAME", "j").replace("  bogusField: 1\n", "")
    r = await http.post("/api/v1/jobs?fieldValidation=Strict", data=body, headers=YAML)
    assert r.status == 201 and "Warning" not in r.headers


async def test_a_bad_mode_is_400_naming_the_parameter(client):
    http, _ = client
    r = await http.post("/api/v1/jobs?fieldValidation=Loud", data=JOB.replace("NAME", "j"), headers=YAML)
    assert r.status == 400
    assert (await r.json())["error"]["details"][0]["field"] == "fieldValidation"


async def test_apply_warns_about_unknown_fields(client):
    http, _ = client
    body = "apiVersion: scheduling.sigs.k8s.io/v1alpha1\nkind: ElasticQuota\nmetadata: {name: q}\nspec:\n  mni: {cpu: 1}\n"
    r = await http.post("/api/v1/apply", data=body, headers=YAML)
    assert r.status == 200, await r.text()
    assert r.headers.getall("Warning") == ['299 - "unknown field \\"documents[0].spec.mni\\""']
    r = await http.post("/api/v1/apply?fieldValidation=Strict", data=body, headers=YAML)
    assert r.status == 422


def test_kubernetes_pod_fields_the_models_do_not_model_are_not_unknown():
    doc = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "j", "managedFields": []},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "None", "managedBy": "kueue"},
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": 2,
                    "template": {
                        "metadata": {"labels": {"a": "b"}},
                        "spec": {
                            "volumes": [{"name": "v", "emptyDir": {"anything": 1}}],
                            "securityContext": {"runAsUser": 1000},
                            "containers": [
                                {
                                    "name": "c",
                                    "volumeMounts": [{"name": "v", "mountPath": "/v"}],
                                    "livenessProbe": {"exec": {"command": ["true"]}},
                                    "env": [{"name": "A", "valueFrom": {"fieldRef": {}}}],
                                }
                            ],
                        },
                    },
                }
            },
        },
    }
    assert unknown_fields(PyTorchJob, doc) == []


def test_misspelt_fields_are_found_at_every_level():
    doc = {
        "spec": {
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replica": 2,
                    "template": {
                        "spec": {"containers": [{"name": "c", "imagePullPolice": "x"}], "nodeSelecter": {}}
                    },
                }
            },
            "elasticPolicy": {"minReplica": 1},
        },
        "metadata": {"lables": {}},
        "bogus": 1,
    }
    assert sorted(unknown_fields(PyTorchJob, doc)) == [
        "bogus",
        "metadata.lables",
        "spec.elasticPolicy.minReplica",
        "spec.pytorchReplicaSpecs.Worker.replica",
        "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].imagePullPolice",
        "spec.pytorchReplicaSpecs.Worker.template.spec.nodeSelecter",
    ]


def test_warning_header_escapes_quotes():
    assert warning_header('unknown field "a\\b"') == '299 - "unknown field \\"a\\\\b\\""'


async def test_a_field_name_with_control_characters_is_warned_about_in_printable_ascii(client):
    """Found by schemathesis: a raw control character in the Warning header made aiohttp drop the
    connection (and would be header injection)."""
    http, _ = client
    body = JOB.replace("NAME", "j").replace("bogusField", '"bad\\x16\\u00e9\\r\\nX-Injected: 1"')
    r = await http.post("/api/v1/jobs", data=body, headers=YAML)
    assert r.status == 201
    (warning,) = r.headers.getall("Warning")
    assert warning == '299 - "unknown field \\"spec.bad\\\\u0016\\\\u00e9\\\\u000d\\\\u000aX-Injected: 1\\""'
    assert "X-Injected" not in r.headers
    assert len(warning_header("x" * 10_000)) < 300
