"""KubeDL's dataset cache on Kubernetes (the development API server and the real control plane),
against Fluid's own CRDs (`github.com/fluid-cloudnative/fluid`, read from its Go module as the
operators' CRDs are, `peers.py`): without them a job with `spec.cacheBackend` fails, the reason
naming `datasets.data.fluid.io` and `alluxioruntimes.data.fluid.io`; with them the job gets Fluid's
Dataset and AlluxioRuntime (owned by the job) and its pods mount the cache's claim."""

from __future__ import annotations

from typing import Any

from gpuyard.apis.resources import resource_for
from gpuyard.kubecluster.writing import to_json
from tests.builders import make_node
from tests.kubernetes.conftest_backend import FakeApiServerView, served
from tests.kubernetes.peers import Peer
from tests.kubernetes.test_backend_platform import connect, eventually, job_pods, platform, settings

__all__ = ["served"]

FLUID = Peer("github.com/fluid-cloudnative/fluid", "v0.9.3", "charts/fluid/fluid/crds/data.fluid.io_*.yaml")
NODES = resource_for("Node")
KUBEDL_PYTORCHJOBS = resource_for("PyTorchJob", "training.kubedl.io/v1alpha1")
CACHE = {
    "mountPath": "/data",
    "dataset": {"dataSources": [{"location": "oss://bucket/imagenet", "subDirName": "imagenet"}]},
    "cacheEngine": {
        "fluid": {
            "alluxioRuntime": {
                "replicas": 1,
                "tieredStorage": [{"cachePath": "/dev/shm", "quota": "2Gi", "mediumType": "MEM"}],
            }
        }
    },
}


def fluid_crds() -> list[dict[str, Any]]:
    wanted = {"datasets.data.fluid.io", "alluxioruntimes.data.fluid.io"}
    return [c for c in FLUID.crd_docs() if c["metadata"]["name"] in wanted]


def pytorchjob(name: str) -> dict[str, Any]:
    container = {"name": "pytorch", "image": "train", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    role = {"replicas": 1, "restartPolicy": "Never", "template": {"spec": {"containers": [container]}}}
    return {
        "apiVersion": KUBEDL_PYTORCHJOBS.api_version,
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"pytorchReplicaSpecs": {"Master": role}, "cacheBackend": CACHE},
    }


def failed(served: FakeApiServerView, name: str) -> dict[str, Any] | None:
    job = served.get("pytorchjobs", "default", name) or {}
    for c in job.get("status", {}).get("conditions", []):
        if c["type"] == "Failed" and c["status"] == "True":
            return dict(c)
    return None


async def test_a_cache_backend_needs_fluid_and_gets_its_dataset_runtime_and_claim(
    served: FakeApiServerView,
) -> None:
    crds = fluid_crds()
    assert len(crds) == 2
    client = await connect(served)
    try:
        await client.create(NODES, to_json(make_node("gpu-0", gpus=8)))
        async with platform(settings(served.kubeconfig, election=False)):
            # no Fluid on the cluster: the job fails, naming Fluid's CRDs
            await client.create(KUBEDL_PYTORCHJOBS, pytorchjob("nofluid"))
            condition = await eventually(lambda: failed(served, "nofluid"), what="nofluid failed")
            assert condition["reason"] == "CacheBackendUnavailable"
            assert "datasets.data.fluid.io" in condition["message"]
            assert "alluxioruntimes.data.fluid.io" in condition["message"]
            # Fluid's CRDs installed: the job's Dataset and AlluxioRuntime, owned by it
            served.install_crds(crds)
            await client.create(KUBEDL_PYTORCHJOBS, pytorchjob("train"))
            await eventually(
                lambda: (
                    served.get("datasets", "default", "train")
                    and served.get("alluxioruntimes", "default", "train")
                ),
                what="the Dataset and AlluxioRuntime",
            )
            uid = served.get("pytorchjobs", "default", "train")["metadata"]["uid"]
            dataset = served.get("datasets", "default", "train")
            runtime = served.get("alluxioruntimes", "default", "train")
            assert dataset is not None and runtime is not None
            assert dataset["spec"]["mounts"] == [{"mountPoint": "oss://bucket/imagenet", "name": "imagenet"}]
            assert runtime["spec"]["replicas"] == 1
            (level,) = runtime["spec"]["tieredstore"]["levels"]  # (Fluid's CRD defaults volumeType)
            assert {k: level[k] for k in ("mediumtype", "path", "quota")} == {
                "mediumtype": "MEM",
                "path": "/dev/shm",
                "quota": "2Gi",
            }
            for obj in (dataset, runtime):
                owner = obj["metadata"]["ownerReferences"][0]
                assert (owner["kind"], owner["name"], owner["uid"]) == ("PyTorchJob", "train", uid)
            (pod,) = await eventually(lambda: job_pods(served, "train"), what="train's pod")
            volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
            assert volumes["kubedl-cache"]["persistentVolumeClaim"]["claimName"] == "train"
            mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
            assert mounts["kubedl-cache"] == "/data"
            await eventually(
                lambda: (
                    served.get("pytorchjobs", "default", "train")["status"].get("cacheBackendName") == "train"
                ),
                what="the job's cacheBackendName",
            )
            assert failed(served, "train") is None
    finally:
        await client.close()
