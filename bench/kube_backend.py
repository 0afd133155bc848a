"""Kubernetes backend figures; prints one JSON object.

`--control-plane dev` (the default) runs over the development API server, in a child process
(so each process's memory is its own):

* `sync_seconds`: from `run()` to `synced` for an API server holding `--nodes` GPU nodes and
  `--pods` foreign pods (DaemonSet-like, as a real cluster's agents are: env, volume mounts,
  probes, an owner, conditions and container statuses; the server adds `managedFields`), one per
  node and then round-robin (LIST in pages + mirror of every watched resource, foreign capacity
  applied).
* `gpuyard_rss_mib` (after the sync and a garbage collection: what the cache holds),
  `gpuyard_peak_rss_mib` (VmHWM: the sync's peak), `apiserver_rss_mib` (the server's, after the
  sync), `list_pages` (pages read by every informer).
* `gang_bound_seconds`: from creating a TFJob of `--workers` one-GPU workers through the API
  server to every pod bound by gpuyard (create + `pods/binding` each), one platform, no election.

    python bench/kube_backend.py --nodes 2000 --pods 20000   (--small: the CI size; --scale: 10,000 / 100,000)

`--control-plane real --sync` measures the same sync on the real control plane: the bench creates
`--nodes` nodes and `--pods` foreign pods (bound to them with `nodeName`; no kubelets) through the
API server, then starts gpuyard and reports `sync_seconds` and its RSS.

    python bench/kube_backend.py --control-plane real --sync --nodes 2000 --pods 20000

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
import gc
import json
import multiprocessing
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from gpuyard.apis.core import GPU_RESOURCE, Node, NodeCondition, NodeStatus
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.quantity import parse_quantity
from gpuyard.kubecluster.writing import to_json
from gpuyard.platform.runtime import Platform
from gpuyard.state.clock import RealClock
from gpuyard.state.config import Settings
from gpuyard.testing.apiserver.server import FakeApiServer

SCALE = (10_000, 100_000)


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
    """A DaemonSet's pod as a real cluster holds it (what gpuyard reads of it is a small part)."""
    env = [{"name": f"AGENT_SETTING_{k}", "value": f"value-{k}-{i}"} for k in range(6)]
    mounts = [{"name": v, "mountPath": f"/var/lib/{v}", "readOnly": True} for v in ("config", "logs", "run")]
    probe = {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10, "failureThreshold": 3}
    container = {
        "name": "agent",
        "image": "registry.example.com/monitoring/agent:v1.2.3",
        "args": ["--node=$(NODE_NAME)", "--interval=10s"],
        "env": env,
        "volumeMounts": mounts,
        "livenessProbe": probe,
        "readinessProbe": probe,
        "securityContext": {"privileged": True, "runAsUser": 0},
        "resources": {
            "limits": {"cpu": "100m", "memory": "128Mi"},
            "requests": {"cpu": "100m", "memory": "128Mi"},
        },
        "terminationMessagePath": "/dev/termination-log",
        "imagePullPolicy": "IfNotPresent",
    }
    since = "2026-01-01T00:00:00Z"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"agent-{i}",
            "namespace": "kube-system",
            "labels": {
                "app": "agent",
                "controller-revision-hash": "6d9f8b7c5",
                "pod-template-generation": "1",
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "name": "agent",
                    "uid": "ds-1",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeName": node,
            "schedulerName": "default-scheduler",
            "containers": [container],
            "volumes": [
                {"name": v, "hostPath": {"path": f"/var/lib/{v}"}} for v in ("config", "logs", "run")
            ],
            "tolerations": [{"operator": "Exists"}],
            "serviceAccountName": "agent",
            "dnsPolicy": "ClusterFirst",
            "restartPolicy": "Always",
        },
        "status": {
            "phase": "Running",
            "hostIP": "10.0.0.1",
            "podIP": f"10.1.{i // 250 % 250}.{i % 250}",
            "startTime": since,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": since}
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": "agent",
                    "ready": True,
                    "restartCount": 0,
                    "image": "registry.example.com/monitoring/agent:v1.2.3",
                    "imageID": "registry.example.com/monitoring/agent@sha256:" + "0" * 64,
                    "containerID": f"containerd://{i:064d}",
                    "state": {"running": {"startedAt": since}},
                }
            ],
        },
    }


def _rss_mib(field: str = "VmRSS", pid: str = "self") -> float:
    """This process's resident memory (VmRSS) or its peak (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


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


async def _serve(nodes: int, pods: int, folder: str, conn: Connection) -> None:
    """The development API server of the dev mode, in its own process: holds `nodes` nodes and
    `pods` foreign pods, sends its kubeconfig's path, answers `rss` and stops on `stop`."""
    server = FakeApiServer(port=0, bookmark_interval=1.0)
    await server.start()
    try:
        server.install_gpuyard_crds()
        catalog = server.catalog
        node_res = catalog.get("", "v1", "nodes")
        pod_res = catalog.get("", "v1", "pods")
        for i in range(nodes):
            server.objects.create(node_res, _node(f"n{i:05d}"))
        for i in range(pods):
            server.objects.create(pod_res, _foreign_pod(i, f"n{i % nodes:05d}"), namespace="kube-system")
        conn.send(str(server.write_kubeconfig(Path(folder) / "kc.yaml")))
        loop = asyncio.get_running_loop()
        while (ask := await loop.run_in_executor(None, conn.recv)) != "stop":
            conn.send(_rss_mib("VmRSS") if ask == "rss" else None)
    finally:
        await server.stop()


def _serve_process(nodes: int, pods: int, folder: str, conn: Connection) -> None:
    asyncio.run(_serve(nodes, pods, folder, conn))


async def main(nodes: int, pods: int, workers: int, *, transform: bool = True) -> dict[str, Any]:
    from gpuyard.apis.resources import resource_for
    from gpuyard.kubecluster.client import KubeClient

    gc.collect()
    rss_start = _rss_mib()
    ours, theirs = multiprocessing.get_context("fork").Pipe()
    with tempfile.TemporaryDirectory() as tmp:
        child = multiprocessing.get_context("fork").Process(
            target=_serve_process, args=(nodes, pods, tmp, theirs)
        )
        child.start()
        try:
            kubeconfig = await asyncio.to_thread(ours.recv)
            settings = Settings(
                server={"port": 0},
                backend={
                    "kind": "kubernetes",
                    "data_dir": None,
                    "kubernetes": {"kubeconfig": str(kubeconfig), "leader_election": {"enabled": False}},
                },
            )
            platform = Platform(settings, clock=RealClock(), serve_http=False)
            backend: Any = platform.backend
            if not transform:  # the figures before the transform: every object whole
                backend.trimmer = None
            started = time.perf_counter()
            task = asyncio.create_task(platform.run())
            await backend.synced.wait()
            sync_seconds = time.perf_counter() - started
            gc.collect()
            rss, peak = _rss_mib(), _rss_mib("VmHWM")
            ours.send("rss")
            server_rss = await asyncio.to_thread(ours.recv)
            cached_pods = platform.ctx.store.count("Pod")
            pages = sum(getattr(i, "pages", 0) for i in backend.informers)
            client = await KubeClient.connect(kubeconfig=str(kubeconfig))
            try:
                pod_res = resource_for("Pod")
                started = time.perf_counter()
                await client.create(resource_for("TFJob", "kubeflow.org/v1"), _tfjob(workers))
                while True:
                    items, _ = await client.list(pod_res, namespace="default")
                    if len([p for p in items if p["spec"].get("nodeName")]) >= workers:
                        break
                    await asyncio.sleep(0.02)
                gang_seconds = time.perf_counter() - started
            finally:
                await client.close()
            platform.stop()
            await task
        finally:
            ours.send("stop")
            await asyncio.to_thread(child.join, 60)
    return {
        "control_plane": "dev",
        "nodes": nodes,
        "foreign_pods": pods,
        "pods_cached": cached_pods,
        "transform": transform,
        "workers": workers,
        "sync_seconds": round(sync_seconds, 3),
        "list_pages": pages,
        "gpuyard_rss_mib": rss,
        "gpuyard_rss_before_sync_mib": rss_start,
        "gpuyard_peak_rss_mib": peak,
        "apiserver_rss_mib": server_rss,
        "gang_bound_seconds": round(gang_seconds, 3),
    }


def _quiet_nodes() -> Any:
    """Control-plane timings under which no node goes NotReady during a run (no kubelets here)."""
    from gpuyard.testing.controlplane.running import Timings

    return Timings(node_monitor_grace_period=3600, not_ready_toleration=3600, unreachable_toleration=3600)


async def _apply_crds(client: Any) -> None:
    """gpuyard's CRDs on the real control plane (server-side apply, forced)."""
    from gpuyard.apis.crds import crds

    for crd in crds():
        await client.request(
            "PATCH",
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}",
            query={"fieldManager": "bench", "force": "true"},
            body=crd,
            content_type="application/apply-patch+yaml",
        )


async def real_sync(*, nodes: int, pods: int) -> dict[str, Any]:
    """The sync on the real control plane: `nodes` nodes and `pods` foreign pods created through the
    API server, then gpuyard started; its sync time and RSS."""
    from gpuyard.kubecluster.client import KubeClient
    from gpuyard.testing.controlplane.binaries import BinariesMissing, find_binaries

    try:
        find_binaries()
    except BinariesMissing as exc:
        return {"control_plane": "real", "sync": True, "skipped": str(exc)}
    from gpuyard.apis.resources import resource_for
    from gpuyard.testing.controlplane.running import ControlPlane

    gc.collect()
    rss_start = _rss_mib()
    timings = _quiet_nodes()
    plane = ControlPlane(timings=timings)
    await asyncio.to_thread(plane.start)
    try:
        client = await KubeClient.connect(kubeconfig=str(plane.admin_kubeconfig), request_timeout=120.0)
        await _apply_crds(client)
        node_res, pod_res = resource_for("Node"), resource_for("Pod")
        sem = asyncio.Semaphore(32)

        async def create(res: Any, body: dict[str, Any]) -> None:
            async with sem:
                await client.create(res, body)

        started = time.perf_counter()
        await asyncio.gather(*(create(node_res, _node(f"n{i:05d}")) for i in range(nodes)))
        bodies = []
        for i in range(pods):
            body = _foreign_pod(i, f"n{i % nodes:05d}")
            del body["status"]  # the kubelet's to write; the pod stays Pending on its node
            del body["spec"]["serviceAccountName"]  # none such here
            del body["metadata"]["ownerReferences"]  # no DaemonSet: the garbage collector would delete them
            bodies.append(body)
        await asyncio.gather(*(create(pod_res, b) for b in bodies))
        create_seconds = time.perf_counter() - started
        await client.close()
        settings = Settings(
            server={"port": 0},
            backend={
                "kind": "kubernetes",
                "data_dir": None,
                "kubernetes": {
                    "kubeconfig": str(plane.admin_kubeconfig),
                    "leader_election": {"enabled": False},
                    "request_timeout": 120.0,
                },
            },
        )
        platform = Platform(settings, clock=RealClock(), serve_http=False)
        backend: Any = platform.backend
        started = time.perf_counter()
        task = asyncio.create_task(platform.run())
        await backend.synced.wait()
        sync_seconds = time.perf_counter() - started
        gc.collect()
        rss, peak = _rss_mib(), _rss_mib("VmHWM")
        cached = platform.ctx.store.count("Pod")
        pages = sum(getattr(i, "pages", 0) for i in backend.informers)
        platform.stop()
        await task
    finally:
        await asyncio.to_thread(plane.stop)
    return {
        "control_plane": "real",
        "sync": True,
        "kubernetes": "v1.37.2",
        "nodes": nodes,
        "foreign_pods": pods,
        "pods_cached": cached,
        "create_seconds": round(create_seconds, 1),
        "sync_seconds": round(sync_seconds, 3),
        "list_pages": pages,
        "gpuyard_rss_mib": rss,
        "gpuyard_rss_before_sync_mib": rss_start,
        "gpuyard_peak_rss_mib": peak,
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
    from gpuyard.apis.resources import resource_for
    from gpuyard.testing.controlplane.running import ControlPlane

    jobs = pods // gang
    pods = jobs * gang
    timings = _quiet_nodes()
    plane = ControlPlane(timings=timings, scheduler_config={"clientConnection": {"qps": qps, "burst": burst}})
    await asyncio.to_thread(plane.start)
    try:
        client = await KubeClient.connect(kubeconfig=str(plane.admin_kubeconfig), request_timeout=60.0)
        await _apply_crds(client)
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
    parser.add_argument("--scale", action="store_true", help="10,000 nodes and 100,000 foreign pods.")
    parser.add_argument("--sync", action="store_true", help="real: the sync's time and RSS (no scheduling).")
    parser.add_argument(
        "--no-transform", action="store_true", help="dev: keep every object whole (the figures before it)."
    )
    parser.add_argument("--control-plane", choices=("dev", "real"), default="dev")
    parser.add_argument("--gang", type=int, default=8, help="real: one-GPU workers per TFJob")
    parser.add_argument("--qps", type=int, default=5000, help="real: kube-scheduler's client QPS")
    parser.add_argument("--burst", type=int, default=10000, help="real: kube-scheduler's client burst")
    args = parser.parse_args()
    if args.scale:
        args.nodes, args.pods = SCALE
    if args.control_plane == "real" and args.sync:
        if args.small:
            args.nodes, args.pods = 10, 100
        print(json.dumps(asyncio.run(real_sync(nodes=args.nodes, pods=args.pods))))
        raise SystemExit(0)
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
    print(json.dumps(asyncio.run(main(args.nodes, args.pods, args.workers, transform=not args.no_transform))))
