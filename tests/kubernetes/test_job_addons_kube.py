"""What a job has beside its pods, on a Kubernetes API server (the development server and the real
control plane): KubeDL's Tensorboard (`kubedl.io/tensorboard-config`: Deployment, Service,
Ingress), a MarsJob's web UI Ingress (`webHost`) and a PyTorchJob's HorizontalPodAutoscaler
(`elasticPolicy.metrics`) on the job's `scale` subresource. The real API server validates and
defaults each object gpuyard writes; its garbage collector takes them with their owner."""

from __future__ import annotations

import json
from typing import Any

from gpuyard.apis.resources import resource_for
from gpuyard.kubecluster.writing import to_json
from tests.builders import make_node
from tests.kubernetes.conftest_backend import FakeApiServerView, served
from tests.kubernetes.test_backend_platform import connect, eventually, platform, settings

__all__ = ["served"]

NODES = resource_for("Node")
TFJOBS = resource_for("TFJob", "training.kubedl.io/v1alpha1")
PYTORCHJOBS = resource_for("PyTorchJob", "kubeflow.org/v1")
MARSJOBS = resource_for("MarsJob", "training.kubedl.io/v1alpha1")
CPU_80 = {
    "type": "Resource",
    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
}


def template(container: str, *, gpus: int = 0) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": gpus} if gpus else {"cpu": 1, "memory": "1Gi"}
    return {"spec": {"containers": [{"name": container, "image": "img:1", "resources": {"limits": limits}}]}}


def tfjob(config: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": TFJOBS.api_version,
        "kind": "TFJob",
        "metadata": {
            "name": "board",
            "namespace": "default",
            "annotations": {"kubedl.io/tensorboard-config": json.dumps(config)},
        },
        "spec": {"tfReplicaSpecs": {"Worker": {"replicas": 1, "template": template("tensorflow", gpus=1)}}},
    }


def elastic() -> dict[str, Any]:
    worker = {"replicas": 2, "restartPolicy": "OnFailure", "template": template("pytorch", gpus=1)}
    return {
        "apiVersion": PYTORCHJOBS.api_version,
        "kind": "PyTorchJob",
        "metadata": {"name": "elastic", "namespace": "default"},
        "spec": {
            "elasticPolicy": {"minReplicas": 1, "maxReplicas": 3, "rdzvBackend": "c10d", "metrics": [CPU_80]},
            "pytorchReplicaSpecs": {"Worker": worker},
        },
    }


def mars() -> dict[str, Any]:
    roles = {
        role: {"replicas": 1, "template": template("mars")} for role in ("Scheduler", "WebService", "Worker")
    }
    return {
        "apiVersion": MARSJOBS.api_version,
        "kind": "MarsJob",
        "metadata": {"name": "mars", "namespace": "default"},
        "spec": {"webHost": "mars.example.com", "marsReplicaSpecs": roles},
    }


def owner(obj: dict[str, Any]) -> tuple[str, str, str]:
    (ref,) = obj["metadata"]["ownerReferences"]
    return ref["kind"], ref["name"], ref["uid"]


async def test_tensorboard_mars_web_and_autoscaler_objects_on_the_api_server(
    served: FakeApiServerView,
) -> None:
    client = await connect(served)
    try:
        for i in range(2):
            await client.create(NODES, to_json(make_node(f"gpu-{i}", gpus=8)))
        config = {"logDir": "/logs", "ingressSpec": {"host": "tb.example.com", "pathPrefix": "tb"}}
        async with platform(settings(served.kubeconfig, election=False)):
            await client.create(TFJOBS, tfjob(config))
            await client.create(PYTORCHJOBS, elastic())
            await client.create(MARSJOBS, mars())
            name = "board-tensorboard-0"
            made = await eventually(
                lambda: (
                    [
                        o
                        for o in (
                            served.get(p, "default", name) for p in ("deployments", "services", "ingresses")
                        )
                        if o
                    ]
                    if all(served.get(p, "default", name) for p in ("deployments", "services", "ingresses"))
                    else None
                ),
                timeout=30,
                what="the Tensorboard's Deployment, Service and Ingress",
            )
            job_uid = served.get("tfjobs", "default", "board")["metadata"]["uid"]  # type: ignore[index]
            deployment, service, ingress = made
            for obj in made:
                assert owner(obj) == ("TFJob", "board", job_uid)
                assert obj["metadata"]["labels"]["job-name"] == "board"
            (container,) = deployment["spec"]["template"]["spec"]["containers"]
            assert container["name"] == "tensorboard" and container["ports"][0]["containerPort"] == 6006
            assert "--path_prefix /tb/default/board" in container["command"][-1]
            assert service["spec"]["clusterIP"] == "None" and service["spec"]["ports"][0]["port"] == 6006
            (rule,) = ingress["spec"]["rules"]
            assert (
                rule["host"] == "tb.example.com" and rule["http"]["paths"][0]["path"] == "/tb/default/board/"
            )

            hpa = await eventually(
                lambda: served.get("horizontalpodautoscalers", "default", "elastic"),
                timeout=30,
                what="the HPA",
            )
            pt_uid = served.get("pytorchjobs", "default", "elastic")["metadata"]["uid"]  # type: ignore[index]
            assert owner(hpa) == ("PyTorchJob", "elastic", pt_uid)
            spec = hpa["spec"]
            assert spec["scaleTargetRef"] == {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "name": "elastic",
            }
            assert (spec["minReplicas"], spec["maxReplicas"], spec["metrics"]) == (1, 3, [CPU_80])
            selector = "training.kubeflow.org/job-name=elastic,training.kubeflow.org/replica-type=worker"
            await eventually(
                lambda: (
                    (served.get("pytorchjobs", "default", "elastic") or {})
                    .get("status", {})
                    .get("replicaStatuses", {})
                    .get("Worker", {})
                    .get("selector")
                    == selector
                ),
                timeout=30,
                what="the Worker's selector in the job's status",
            )
            if served.real:  # the `scale` subresource the autoscaler reads and writes
                path = PYTORCHJOBS.path(namespace="default", name="elastic", sub="scale")
                scale = served.http.get(path).json()  # type: ignore[attr-defined]
                assert scale["spec"]["replicas"] == 2 and scale["status"]["selector"] == selector

            web = await eventually(
                lambda: served.get("ingresses", "default", "mars-webservice-0"),
                timeout=60,
                what="Mars' Ingress",
            )
            svc = served.get("services", "default", "mars-webservice-0")
            assert svc is not None and owner(web) == ("Service", "mars-webservice-0", svc["metadata"]["uid"])
            (rule,) = web["spec"]["rules"]
            assert rule["host"] == "mars.example.com"
            assert [p["path"] for p in rule["http"]["paths"]] == [
                "/mars/default/mars-webservice-0/(.*)",
                "/mars/default/mars-webservice-0",
            ]
    finally:
        await client.close()
