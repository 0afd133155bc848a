"""KubeDL's dataset cache (`spec.cacheBackend`) on the fake cluster: there is no Fluid, so the mount
is simulated: every pod of the job mounts the cache's claim at `mountPath`, a Warning Event says
nothing fills it, the job's `status.cacheBackendName` names it and the job runs; a `cacheBackend`
without a mountPath fails the job, the message naming the field."""

from __future__ import annotations

from typing import Any

from gpuyard.apis.core import Event
from gpuyard.testing import Cluster

NODES = [("dgx-a100", 1)]


def pytorchjob(name: str, cache: Any) -> dict[str, Any]:
    container = {"name": "pytorch", "image": "train", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    role = {
        "replicas": 1,
        "restartPolicy": "Never",
        "template": {
            "metadata": {"annotations": {"fake.gpuyard.io/duration": "30"}},
            "spec": {"containers": [container]},
        },
    }
    return {
        "apiVersion": "training.kubedl.io/v1alpha1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"pytorchReplicaSpecs": {"Master": role, "Worker": role}, "cacheBackend": cache},
    }


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


def events(c: Cluster, job: str) -> list[Event]:
    return [e for e in c.store.list_of(Event, namespace="default") if e.involved_object.get("name") == job]


async def test_the_cache_mount_is_simulated_on_the_fake_cluster() -> None:
    async with Cluster.start(nodes=NODES) as c:
        job = await c.submit(pytorchjob("train", CACHE))
        await c.run_until(job, "Running", timeout=120)
        pods = c.pods(job)
        assert len(pods) == 2
        for pod in pods:
            volumes = (pod.spec.model_extra or {})["volumes"]
            assert {"name": "kubedl-cache", "persistentVolumeClaim": {"claimName": "train"}} in volumes
            (container,) = pod.spec.containers
            assert {"name": "kubedl-cache", "mountPath": "/data"} in (container.model_extra or {})[
                "volumeMounts"
            ]
        assert await c.until(lambda: c.job(job).status.cache_backend_name == "train", timeout=30)
        (warning,) = [e for e in events(c, "train") if e.reason == "CacheBackendSimulated"]
        assert warning.type == "Warning" and "no Fluid on the fake cluster" in warning.message
        assert "oss://bucket/imagenet" in warning.message
        await c.run_until(job, "Succeeded", timeout=600)
        assert c.store.list("Dataset") == [] and c.store.list("AlluxioRuntime") == []


async def test_a_cache_backend_without_a_mount_path_fails_the_job_naming_the_field() -> None:
    async with Cluster.start(nodes=NODES) as c:
        job = await c.submit(pytorchjob("bad", {"dataset": CACHE["dataset"]}))
        await c.run_until(job, "Failed", timeout=60)
        failed = c.job(job).status.condition("Failed")
        assert failed is not None and failed.reason == "InvalidCacheBackend"
        assert "spec.cacheBackend.mountPath" in failed.message
        # KubeDL v0.5's form naming a CacheBackend object: gpuyard has none, the data must be given
        named = await c.submit(pytorchjob("named", {"name": "test-cachebackend", "mountPath": "/data"}))
        await c.run_until(named, "Failed", timeout=60)
        why = c.job(named).status.condition("Failed")
        assert why is not None and "spec.cacheBackend.dataset.dataSources" in why.message
        assert "no CacheBackend objects" in why.message
