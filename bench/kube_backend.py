"""Kubernetes backend figures; prints one JSON object.

`--control-plane dev` (the default) runs over the in-process development API server:

* `sync_seconds`: from `run()` to `synced` for an API server holding `--nodes` GPU nodes and
  `--pods` foreign (DaemonSet-like) pods, one per node and then round-robin (LIST + mirror of every
  watched resource, foreign capacity applied).
* `gang_bound_seconds`: from creating a TFJob of `--workers` one-GPU workers through the API
  server to every pod bound by gpuyard (create + `pods/binding` each), one platform, no election.

    python bench/kube_backend.py --nodes 200 --pods 2000 --workers 32   (--small: the CI size)

`--control-plane real` runs on the real control plane (`make k8s-bin`; without it the JSON says it
was skipped): gpuyard binding gangs against kube-scheduler binding the same number of pods, on one
API server and the same `--nodes` nodes (16 GPUs, 128 CPU each; no kubelets: a bound pod stays
bound), one after the other in one run. kube-scheduler gets pods created by the bench (one GPU
each, 16 requests in flight); gpuyard gets TFJobs of `--gang` one-GPU workers and creates their pods
itself. Each figure is pods bound per second, from the first create to the last binding (counted
by the API server: `spec.nodeName!=`). Client rate limits: gpuyard has none; kube-scheduler's is set
to `--qps`/`--burst` (default 5000/10000, so neither is held back by its client).

    python bench/kube_backend.py --control-plane real --nodes 1000 --pods 10000 --gang 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from gpuyard.apis.core import GPU_RESOURCE, Container, Node, NodeCondition, NodeStatus, Pod, PodSpec
from gpuyard.apis.core import ResourceRequirements as Requirements
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.quantity import parse_quantity
from gpuyard.kubecluster.writing import to_json
from gpuyard.platform.runtime import Platform
from gpuyard.state.clock import RealClock
from gpuyard.state.config import Settings
from gpuyard.testing.apiserver.server import FakeApiServer


def _node(name: str, *, gpus: int = 8, cpu: str = "64", memory: str = "512Gi") -> dict[str, Any]:
    cap = {
        "cpu": parse_quantity(cpu),
        "memory": parse_quantity(memory),
        "pods": parse_quantity(110),
        GPU_RESOURCE: parse_quantity(gpus),
    }
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "kubernetes.io/hostname": name}
    node = Node(
        metadata=ObjectMeta(name=name, labels=labels),
        status=NodeStatus(
            capacity=cap, allocatable=dict(cap), conditions=[NodeCondition(type="Ready", status="True")]
        ),
    )
    return to_json(node)


def _foreign_pod(i: int, node: str) -> dict[str, Any]:
    limits = {"cpu": parse_quantity("100m"), "memory": parse_quantity("128Mi")}
    pod = Pod(
        metadata=ObjectMeta(name=f"agent-{i}", namespace="kube-system"),
        spec=PodSpec(
            node_name=node,
            scheduler_name="default-scheduler",
            containers=[Container(name="a", image="x", resources=Requirements(limits=limits))],
        ),
    )
    return to_json(pod)


def _tfjob(workers: int) -> dict[str, Any]:
    container = {"name": "tensorflow", "image": "tf:1", "resources": {"limits": {GPU_RESOURCE: 1}}}
    spec = {
        "Worker": {
            "replicas": workers,
            "restartPolicy": "Never",
            "template": {"spec": {"containers": [container]}},
        }
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "bench", "namespace": "default"},
        "spec": {"tfReplicaSpecs": spec},
    }


async def main(nodes: int, pods: int, workers: int) -> dict[str, Any]:
    server = FakeApiServer(port=0, bookmark_interval=1.0)
    await server.start()
    try:
        server.install_gpuyard_crds()
        catalog = server.catalog
        node_res = catalog.get("", "v1", "nodes")
        pod_res = catalog.get("", "v1", "pods")
        for i in range(nodes):
            server.objects.create(node_res, _node(f"n{i:04d}"))
        for i in range(pods):
            server.objects.create(pod_res, _foreign_pod(i, f"n{i % nodes:04d}"), namespace="kube-system")
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = server.write_kubeconfig(Path(tmp) / "kc.yaml")
            settings = Settings(
                server={"port": 0},
                backend={
                    "kind": "kubernetes",
                    "data_dir": None,
                    "kubernetes": {"kubeconfig": str(kubeconfig), "leader_election": {"enabled": False}},
                },
            )
            platform = Platform(settings, clock=RealClock(), serve_http=False)
            started = time.perf_counter()
            task = asyncio.create_task(platform.run())
            await platform.backend.synced.wait()
            sync_seconds = time.perf_counter() - started
            jobs = catalog.get("kubeflow.org", "v1", "tfjobs")
            started = time.perf_counter()
            server.objects.create(jobs, _tfjob(workers), namespace="default")
            while True:
                items = server.objects.list(pod_res, namespace="default")["items"]
                if len([p for p in items if p["spec"].get("nodeName")]) >= workers:
                    break
                await asyncio.sleep(0.005)
            gang_seconds = time.perf_counter() - started
            platform.stop()
            await task
    finally:
        await server.stop()
    return {
        "nodes": nodes,
        "foreign_pods": pods,
        "workers": workers,
        "sync_seconds": round(sync_seconds, 3),
        "gang_bound_seconds": round(gang_seconds, 3),
    }


def _plain_pod(i: int) -> dict[str, Any]:
    limits = {GPU_RESOURCE: 1, "cpu": "1", "memory": "1Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"plain-{i:05d}", "namespace": "default"},
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [{"name": "c", "image": "x", "resources": {"limits": limits, "requests": limits}}],
            "tolerations": [{"operator": "Exists"}],
        },
    }


class _Binding:
    """Counts the pods of namespace `default` bound now, from one WATCH (a LIST of 10,000 pods
    every poll would load the API server the figures are about)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.bound: set[str] = set()
        self.changed = asyncio.Event()

    async def run(self) -> None:
        from gpuyard.apis.resources import resource_for

        pods = resource_for("Pod")
        _, rv = await self.client.list(pods, namespace="default")
        while True:
            async for event in self.client.watch(
                pods, resource_version=rv, timeout_seconds=3600, inactivity=3600, namespace="default"
            ):
                obj = event.get("object") or {}
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if event.get("type") == "BOOKMARK":
                    continue
                name = (obj.get("metadata") or {}).get("name", "")
                if event.get("type") != "DELETED" and (obj.get("spec") or {}).get("nodeName"):
                    self.bound.add(name)
                else:
                    self.bound.discard(name)
                self.changed.set()

    async def until(self, check: Any, *, limit: float) -> float:
        started = time.perf_counter()
        while not check(len(self.bound)):
            self.changed.clear()
            try:
                await asyncio.wait_for(
                    self.changed.wait(), timeout=max(0.1, limit - (time.perf_counter() - started))
                )
            except TimeoutError:
                raise TimeoutError(f"{len(self.bound)} pods bound after {limit:.0f} s") from None
        return time.perf_counter() - started


async def real_main(*, nodes: int, pods: int, gang: int, qps: int, burst: int) -> dict[str, Any]:
    from gpuyard.kubecluster.client import KubeClient
    from gpuyard.testing.controlplane.binaries import BinariesMissing, find_binaries

    try:
        find_binaries()
    except BinariesMissing as exc:
        return {"control_plane": "real", "skipped": str(exc)}
    from gpuyard.apis.crds import crds
    from gpuyard.apis.resources import resource_for
    from gpuyard.testing.controlplane.running import ControlPlane, Timings

    jobs = pods // gang
    pods = jobs * gang
    timings = Timings(node_monitor_grace_period=3600, not_ready_toleration=3600, unreachable_toleration=3600)
    plane = ControlPlane(timings=timings, scheduler_config={"clientConnection": {"qps": qps, "burst": burst}})
    await asyncio.to_thread(plane.start)
    try:
        client = await KubeClient.connect(kubeconfig=str(plane.admin_kubeconfig), request_timeout=60.0)
        for crd in crds():
            await client.request(
                "PATCH",
                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}",
                query={"fieldManager": "bench", "force": "true"},
                body=crd,
                content_type="application/apply-patch+yaml",
            )
        await client.request(
            "POST",
            "/api/v1/namespaces",
            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpuyard-system"}},
        )
        node_res = resource_for("Node")
        pod_res = resource_for("Pod")
        sem = asyncio.Semaphore(16)

        async def create(res: Any, body: dict[str, Any]) -> None:
            async with sem:
                await client.create(res, body)

        await asyncio.gather(
            *(create(node_res, _node(f"n{i:04d}", gpus=16, cpu="128", memory="1Ti")) for i in range(nodes))
        )
        await asyncio.sleep(2.0)  # the node lifecycle controller takes the not-ready taint off

        binding = _Binding(client)
        counter = asyncio.create_task(binding.run())
        started = time.perf_counter()
        creating = asyncio.gather(*(create(pod_res, _plain_pod(i)) for i in range(pods)))
        await binding.until(lambda n: n >= pods, limit=1800)
        await creating
        kube_seconds = time.perf_counter() - started
        await client.request(
            "DELETE",
            "/api/v1/namespaces/default/pods",
            body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
        )
        await binding.until(lambda n: n == 0, limit=600)

        settings = Settings(
            server={"port": 0},
            backend={
                "kind": "kubernetes",
                "data_dir": None,
                "kubernetes": {
                    "kubeconfig": str(plane.admin_kubeconfig),
                    "leader_election": {"enabled": False},
                    "gpu_resource": "nvidia.com/gpu",
                },
            },
        )
        platform = Platform(settings, clock=RealClock(), serve_http=False)
        task = asyncio.create_task(platform.run())
        await platform.backend.synced.wait()
        tfjobs = resource_for("TFJob", "kubeflow.org/v1")
        started = time.perf_counter()
        for j in range(jobs):
            body = _tfjob(gang)
            body["metadata"]["name"] = f"bench-{j:05d}"
            await client.create(tfjobs, body)
        await binding.until(lambda n: n >= pods, limit=1800)
        gpuyard_seconds = time.perf_counter() - started
        platform.stop()
        await task
        counter.cancel()
        await client.close()
    finally:
        await asyncio.to_thread(plane.stop)
    kube_rate, gpuyard_rate = pods / kube_seconds, pods / gpuyard_seconds
    return {
        "control_plane": "real",
        "kubernetes": "v1.37.2",
        "nodes": nodes,
        "pods": pods,
        "gang": gang,
        "kube_scheduler_client": {"qps": qps, "burst": burst},
        "gpuyard_client": "no client-side rate limit",
        "kube_scheduler_pods_per_second": round(kube_rate, 1),
        "gpuyard_pods_per_second": round(gpuyard_rate, 1),
        "gpuyard_to_kube_scheduler": round(gpuyard_rate / kube_rate, 3),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--small", action="store_true", help="CI size: 20 nodes, 100 pods, 4 workers.")
    parser.add_argument("--control-plane", choices=("dev", "real"), default="dev")
    parser.add_argument("--gang", type=int, default=8, help="real: one-GPU workers per TFJob")
    parser.add_argument("--qps", type=int, default=5000, help="real: kube-scheduler's client QPS")
    parser.add_argument("--burst", type=int, default=10000, help="real: kube-scheduler's client burst")
    args = parser.parse_args()
    if args.control_plane == "real":
        if args.small:
            args.nodes, args.pods, args.gang = 10, 80, 4
        result = asyncio.run(
            real_main(nodes=args.nodes, pods=args.pods, gang=args.gang, qps=args.qps, burst=args.burst)
        )
        print(json.dumps(result))
        raise SystemExit(0)
    if args.small:
        args.nodes, args.pods, args.workers = 20, 100, 4
    print(json.dumps(asyncio.run(main(args.nodes, args.pods, args.workers))))
