"""KubeDL's models on the fake cluster, through the whole platform on the virtual clock: a TFJob with
`spec.modelVersion` that succeeds leaves a ModelVersion (KubeDL's name, `createdBy` the job, the
node of its chief pod for local storage) and the Model it names (its owner); the fake cluster builds
no image, which the ModelVersion's status, a Warning Event and `describe job` say; a job that fails
leaves none, and a `modelVersion` that does not parse is a Warning Event naming the field. The job's
pods get the storage mounted and `KUBEDL_MODEL_PATH`, as KubeDL wires them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpuyard.apis.core import Event
from gpuyard.apis.models import LABEL_MODEL_NAME, Model, ModelVersion
from gpuyard.cli import main
from gpuyard.testing import Cluster
from tests.integration.serving import clean_cli_env

NODES = [("dgx-a100", 2)]
STORAGE = {"localStorage": {"path": "/models/mnist", "mountPath": "/output", "nodeName": "any"}}


def tfjob(name: str, *, exit_code: int = 0, model_version: Any = None) -> dict[str, Any]:
    def role(replicas: int) -> dict[str, Any]:
        annotations = {"fake.gpuyard.io/duration": "30", "fake.gpuyard.io/exit-code": str(exit_code)}
        container = {"name": "tensorflow", "image": "tf:2", "resources": {"limits": {"nvidia.com/gpu": 1}}}
        return {
            "replicas": replicas,
            "restartPolicy": "Never",
            "template": {"metadata": {"annotations": annotations}, "spec": {"containers": [container]}},
        }

    spec: dict[str, Any] = {"tfReplicaSpecs": {"Chief": role(1), "Worker": role(2)}}
    if model_version is not None:
        spec["modelVersion"] = model_version
    return {
        "apiVersion": "training.kubedl.io/v1alpha1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def warnings(c: Cluster, job: str) -> list[Event]:
    return [
        e
        for e in c.store.list_of(Event, namespace="default")
        if e.involved_object.get("name") == job and e.type == "Warning"
    ]


async def test_a_succeeded_job_leaves_a_model_version_and_its_model_but_no_image_on_the_fake_cluster(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_cli_env(monkeypatch, tmp_path)
    async with Cluster.start(nodes=NODES, serve_http=True) as c:
        doc = tfjob(
            "mnist", model_version={"modelName": "mnist", "imageRepo": "modelhub/mnist", "storage": STORAGE}
        )
        job = await c.submit(doc)
        await c.run_until(job, "Running", timeout=120)
        chief_node = next(p.spec.node_name for p in c.pods(job) if "chief" in p.metadata.name)
        for pod in c.pods(job):  # KubeDL's wiring: the storage at its mountPath, KUBEDL_MODEL_PATH
            (container,) = pod.spec.containers
            assert container.env_dict()["KUBEDL_MODEL_PATH"] == "/output"
            assert {"name": "kubedl-model", "mountPath": "/output"} in (container.model_extra or {})[
                "volumeMounts"
            ]
            volumes = (pod.spec.model_extra or {})["volumes"]
            assert {"name": "kubedl-model", "hostPath": {"path": "/models/mnist"}} in volumes
        assert c.store.list_of(ModelVersion) == []  # only once it succeeds
        await c.run_until(job, "Succeeded", timeout=600)
        name = f"mv-mnist-{job.metadata.uid[:5]}"
        assert await c.until(
            lambda: (mv := c.store.get_of(ModelVersion, "default", name)) is not None and mv.status.message,
            timeout=30,
        )
        mv = c.store.must_get_of(ModelVersion, "default", name)
        assert mv.spec.created_by == "mnist" and mv.spec.model_name == "mnist"
        assert mv.spec.image_repo == "modelhub/mnist"
        assert mv.spec.storage is not None and mv.spec.storage.local_storage is not None
        assert mv.spec.storage.local_storage.node_name == chief_node  # where the chief wrote the model
        # the Model it names, made its owner, its latest version this one
        model = c.store.must_get_of(Model, "default", "mnist")
        assert model.status.latest_version is not None and model.status.latest_version.model_version == name
        owner = mv.metadata.owner_references[0]
        assert (owner.kind, owner.name, owner.uid) == ("Model", "mnist", model.metadata.uid)
        assert mv.metadata.labels[LABEL_MODEL_NAME] == "mnist"
        # no image build on the fake cluster: the status says why, and so does a Warning Event
        assert mv.status.image_build_phase == "" and mv.status.image == ""
        assert "fake cluster runs no containers" in mv.status.message
        assert "modelhub/mnist:" in mv.status.message and "/models/mnist" in mv.status.message
        assert await c.until(lambda: c.job(job).status.model_version_name == name, timeout=30)
        reasons = {e.reason for e in warnings(c, "mnist")}
        assert "ImageBuildUnavailable" in reasons
        # describe job shows it
        argv = ["describe", "job", "mnist", "--server", c.url]
        result = await asyncio.to_thread(CliRunner().invoke, main, argv, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert "ImageBuildUnavailable" in result.output and "no image build" in result.output
        assert "ModelVersionCreated" in result.output


async def test_a_failed_job_leaves_none_and_a_bad_model_version_is_a_warning_naming_the_field() -> None:
    async with Cluster.start(nodes=NODES) as c:
        failed = await c.submit(
            tfjob(
                "broken",
                exit_code=1,
                model_version={"modelName": "m", "imageRepo": "r/m", "storage": STORAGE},
            )
        )
        bad = await c.submit(tfjob("bad", model_version={"modelName": "m", "storage": "not-a-mapping"}))
        await c.run_until(failed, "Failed", timeout=600)
        await c.run_until(bad, "Succeeded", timeout=600)
        assert await c.until(lambda: bool(warnings(c, "bad")), timeout=30)
        (warning,) = warnings(c, "bad")
        assert warning.reason == "InvalidModelVersion" and "spec.modelVersion.storage" in warning.message
        await c.advance(30)
        assert c.store.list_of(ModelVersion) == [] and c.store.list_of(Model) == []
