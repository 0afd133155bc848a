"""KubeDL's models on Kubernetes (the development API server and the real control plane): a KubeDL
TFJob with `spec.modelVersion` that succeeds leaves a ModelVersion (KubeDL's name, `createdBy` the job,
the chief's node for local storage, named in the job's `status.modelVersionName`), the Model it names
(its owner), the namespace's Dockerfile and KubeDL's kaniko image-build pod over the job's output
path; the ModelVersion's status follows that pod to `ImageBuildSucceeded` (and `ImageBuildFailed`)."""

from __future__ import annotations

from typing import Any

from gpuyard.apis.resources import resource_for
from gpuyard.kubecluster.writing import to_json
from tests.builders import make_node
from tests.kubernetes.conftest_backend import FakeApiServerView, served
from tests.kubernetes.test_backend_platform import (
    PODS,
    connect,
    eventually,
    job_pods,
    platform,
    play_kubelet,
    settings,
)

__all__ = ["served"]

NODES = resource_for("Node")
KUBEDL_TFJOBS = resource_for("TFJob", "training.kubedl.io/v1alpha1")
MODEL_VERSIONS = resource_for("ModelVersion")


def tfjob(name: str, *, model: str) -> dict[str, Any]:
    container = {"name": "tensorflow", "image": "tf:2", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    role = {"replicas": 1, "restartPolicy": "Never", "template": {"spec": {"containers": [container]}}}
    return {
        "apiVersion": KUBEDL_TFJOBS.api_version,
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "tfReplicaSpecs": {"Chief": role},
            "modelVersion": {
                "modelName": model,
                "imageRepo": f"modelhub/{model}",
                "storage": {
                    "localStorage": {"path": f"/models/{model}", "mountPath": "/output", "nodeName": "x"}
                },
            },
        },
    }


def build_phase(served: FakeApiServerView, name: str) -> str:
    mv = served.get("modelversions", "default", name) or {}
    return str(mv.get("status", {}).get("imageBuildPhase", ""))


async def test_a_succeeded_job_s_model_version_builds_its_image_with_kaniko(
    served: FakeApiServerView,
) -> None:
    client = await connect(served)
    try:
        await client.create(NODES, to_json(make_node("gpu-0", gpus=8)))
        async with platform(settings(served.kubeconfig, election=False)):
            await client.create(KUBEDL_TFJOBS, tfjob("mnist", model="mnist"))
            await eventually(
                lambda: [p for p in job_pods(served, "mnist") if p["spec"].get("nodeName")],
                what="mnist placed",
            )
            (chief,) = job_pods(served, "mnist")  # KubeDL's wiring: the storage at its mountPath
            volumes = {v["name"]: v for v in chief["spec"]["volumes"]}
            assert volumes["kubedl-model"]["hostPath"]["path"] == "/models/mnist"
            assert {"name": "KUBEDL_MODEL_PATH", "value": "/output"} in chief["spec"]["containers"][0]["env"]
            await play_kubelet(client, served, "mnist", phase="Running")
            await play_kubelet(client, served, "mnist", phase="Succeeded")
            uid = served.get("tfjobs", "default", "mnist")["metadata"]["uid"]
            name = f"mv-mnist-{uid[:5]}"
            await eventually(
                lambda: build_phase(served, name) == "ImageBuilding", what="the image build started"
            )
            mv = served.get("modelversions", "default", name)
            assert mv is not None
            model = served.get("models", "default", "mnist")
            assert model is not None
            tag = mv["metadata"]["uid"][:5]
            image = f"modelhub/mnist:{tag}"
            pod_name = f"image-build-mnist-{tag}"
            assert mv["spec"]["createdBy"] == "mnist" and mv["spec"]["modelName"] == "mnist"
            assert mv["spec"]["storage"]["localStorage"]["nodeName"] == "gpu-0"  # where the chief ran
            assert mv["status"]["image"] == image and mv["status"]["message"] == "Image building started."
            assert mv["metadata"]["labels"]["model.kubedl.io/model-name"] == "mnist"
            assert mv["metadata"]["annotations"]["model.kubedl.io/img-build-pod-name"] == pod_name
            owner = mv["metadata"]["ownerReferences"][0]
            assert (owner["kind"], owner["name"], owner["uid"]) == (
                "Model",
                "mnist",
                model["metadata"]["uid"],
            )
            await eventually(
                lambda: (
                    (served.get("models", "default", "mnist") or {}).get("status", {}).get("latestVersion")
                    == {"modelVersion": name, "imageName": image}
                ),
                what="the Model's latest version",
            )
            await eventually(
                lambda: served.get("tfjobs", "default", "mnist")["status"].get("modelVersionName") == name,
                what="the job's modelVersionName",
            )
            # KubeDL's Dockerfile and kaniko pod over the job's output path
            dockerfile = served.get("configmaps", "default", "dockerfile")
            assert dockerfile is not None
            assert dockerfile["data"]["dockerfile"] == "FROM busybox\nCOPY build/ /kubedl-model\n"
            pod = served.get("pods", "default", pod_name)
            assert pod is not None
            (container,) = pod["spec"]["containers"]
            assert container["image"] == "gcr.io/kaniko-project/executor:latest"
            assert container["args"] == [
                "--dockerfile=/workspace/dockerfile",
                "--context=dir:///workspace/",
                f"--destination={image}",
            ]
            # (a real API server adds the service account token's mount)
            mounts = {
                m["name"]: m["mountPath"] for m in container["volumeMounts"] if "kube-api" not in m["name"]
            }
            assert mounts == {
                "kaniko-secret": "/kaniko/.docker",
                "build-source": "/workspace/build",
                "dockerfile": "/workspace/",
            }
            volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
            assert volumes["build-source"]["hostPath"]["path"] == "/models/mnist"
            assert volumes["dockerfile"]["configMap"]["name"] == "dockerfile"
            assert volumes["kaniko-secret"]["secret"]["secretName"] == "regcred"
            assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "gpu-0"}
            assert pod["spec"]["restartPolicy"] == "Never"
            assert pod["metadata"]["ownerReferences"][0]["kind"] == "ModelVersion"
            assert pod["metadata"]["ownerReferences"][0]["uid"] == mv["metadata"]["uid"]
            # the kubelet runs the build: the status follows
            await client.patch(PODS, "default", pod_name, {"status": {"phase": "Succeeded"}}, sub="status")
            await eventually(
                lambda: build_phase(served, name) == "ImageBuildSucceeded", what="the image build succeeded"
            )
            done = served.get("modelversions", "default", name)
            assert done is not None
            assert done["status"]["message"] == "Image build succeeded." and done["status"]["finishTime"]
            # a ModelVersion made by hand (NFS storage, its own tag) whose build fails
            by_hand = {
                "apiVersion": MODEL_VERSIONS.api_version,
                "kind": "ModelVersion",
                "metadata": {"name": "mnist-v2", "namespace": "default"},
                "spec": {
                    "modelName": "mnist",
                    "imageRepo": "modelhub/mnist",
                    "imageTag": "v2",
                    "storage": {"nfs": {"server": "nas.example", "path": "/exports/mnist"}},
                },
            }
            await client.create(MODEL_VERSIONS, by_hand)
            await eventually(
                lambda: served.get("pods", "default", "image-build-mnist-v2"), what="the second build"
            )
            pod = served.get("pods", "default", "image-build-mnist-v2")
            assert pod is not None and not pod["spec"].get("nodeSelector")
            source = {v["name"]: v for v in pod["spec"]["volumes"]}["build-source"]
            assert source["nfs"] == {"server": "nas.example", "path": "/exports/mnist"}
            failed = {"phase": "Failed", "reason": "Error", "message": "push denied"}
            await client.patch(PODS, "default", "image-build-mnist-v2", {"status": failed}, sub="status")
            await eventually(
                lambda: build_phase(served, "mnist-v2") == "ImageBuildFailed", what="the build failed"
            )
            mv2 = served.get("modelversions", "default", "mnist-v2")
            assert mv2 is not None and mv2["status"]["image"] == "modelhub/mnist:v2"
            assert mv2["status"]["message"] == "Image build failed. push denied"
            assert (served.get("models", "default", "mnist") or {})["status"]["latestVersion"][
                "modelVersion"
            ] == "mnist-v2"
    finally:
        await client.close()
