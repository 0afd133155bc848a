"""`gpuyard fake-nodes`: a scenario's GPU nodes and their kubelets, played on any API server.

KWOK does this for plain nodes; these nodes carry GPUs and RDMA NICs. :class:`FakeNodes`

1. registers the scenario's Node objects (created, or their status replaced when they exist), a
   `NodeTopology` per node (skipped, with a warning, where the CRD is not installed) and, where the
   server serves `resource.k8s.io/v1`, a `gpu.nvidia.com` ResourceSlice per node (pool = node name,
   owned by the Node, so it goes with it) for gpuyard's DRA mode;
2. renews each node's heartbeat Lease in `kube-node-lease` and its Ready condition;
3. plays the kubelet of every pod bound to one of its nodes (`spec.nodeName`): it lists then
   watches pods, admits each new one as a kubelet does (`admission.py`: a pod that does not fit
   the node's allocatable beside the pods admitted there before it fails at once, `OutOfcpu`,
   `OutOfnvidia.com/gpu`, ...), and for each admitted one runs the script of its `fake.gpuyard.io/*`
   annotations on the real clock (`gpuyard.devices.fakepods`, shared with the embedded fake
   cluster), writing the pod status through the `status` subresource: Pending -> Running ->
   Succeeded | Failed with the exit code;
4. takes fault injection: :meth:`FakeNodes.fail_node` (NotReady, its pods fail with `NodeLost`),
   :meth:`FakeNodes.recover_node`, :meth:`FakeNodes.fail_gpu` (the GPU's health in the node's
   NodeTopology and its `gpuyard.io/unhealthy-gpus` annotation; the pods holding that GPU fail
   with `DeviceUnhealthy`);
5. with `kubelet` (a :class:`KubeletEndpoint`), serves the kubelet port the API server reads pod
   logs from (`kubeletserver.py`: `/containerLogs/...`, the same short log per container as the
   fake cluster's kubelet), started before the nodes register so that each names its address and
   port; where it cannot be served (the address taken, no `cryptography`) the nodes run without
   it, with a warning, and `kubectl logs` fails for them.

It speaks the API server through `kubernetes_asyncio` and nothing else; the CLI
(`gpuyard/cli/fakenodes.py`) adds the admin HTTP port for faults.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

import structlog
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from gpuyard.apis.core import Pod
from gpuyard.apis.devicematching import ANNOTATION_UNHEALTHY_GPUS, format_unhealthy
from gpuyard.apis.scheduling import pod_gpus
from gpuyard.devices.fakepods import exit_reason, pod_script
from gpuyard.devices.scenarios import Scenario
from gpuyard.kubecluster.fakenodes.admission import Rejection, admit, rejected_status
from gpuyard.kubecluster.fakenodes.kubeletserver import KubeletEndpoint, KubeletServer
from gpuyard.kubecluster.fakenodes.objects import (
    NODE_LEASE_NAMESPACE,
    node_lease,
    node_objects,
    ready_condition,
    running_status,
    slice_objects,
    terminated_status,
    topology_objects,
)

__all__ = ["FakeNodes"]

log = structlog.get_logger(__name__)
DRA_GROUP, DRA_VERSION = "resource.k8s.io", "v1"
MERGE_PATCH = "application/merge-patch+json"
TERMINAL = ("Succeeded", "Failed")


def _utcnow() -> datetime:
    return datetime.now(UTC)


class FakeNodes:
    """The scenario's nodes and their kubelets on the API server `api` talks to."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        scenario: Scenario,
        heartbeat: float = 10.0,
        now: Callable[[], datetime] = _utcnow,
        kubelet: KubeletEndpoint | None = None,
    ) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.leases = client.CoordinationV1Api(api)
        self.scenario = scenario
        self.heartbeat = heartbeat
        self.now = now
        self.allocatable = {n.metadata.name: dict(n.status.allocatable) for n in scenario.nodes()}
        self.names = set(self.allocatable)
        self.ready = dict.fromkeys(self.names, True)
        self.unhealthy: dict[str, set[int]] = {name: set() for name in self.names}
        self.playing: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.pods: dict[tuple[str, str], Pod] = {}
        self.admitted: set[tuple[str, str]] = set()  # pods admitted to their node (and not rejected)
        self.rejected = 0
        self.registered = asyncio.Event()
        self.kubelet = kubelet
        self.kubelet_server: KubeletServer | None = None  # serving, once run() has started it
        self._changed = asyncio.Event()  # set (and replaced) at every change of a pod seen

    # --- nodes -----------------------------------------------------------------------------------

    def kubelet_location(self) -> tuple[str, int] | None:
        """(address, port) of the kubelet port being served, or None."""
        server = self.kubelet_server
        return None if server is None else (server.endpoint.address, server.port)

    async def register(self) -> None:
        """Create the nodes (or refresh the status of those that exist) and their topologies."""
        kubelet = self.kubelet_location()
        for node in node_objects(self.scenario, now=self.now(), kubelet=kubelet):
            name = node["metadata"]["name"]
            body: Any = node  # the client takes plain dicts as well as its models
            try:
                await self.core.create_node(body=body)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                await self.core.patch_node_status(name, body={"status": body["status"]})
                if kubelet is not None:  # a strategic merge keeps old addresses: replace them
                    addresses: Any = [
                        {"op": "add", "path": "/status/addresses", "value": body["status"]["addresses"]}
                    ]
                    await self.core.patch_node_status(name, body=addresses)
        for body in topology_objects(self.scenario):
            try:
                await self.custom.create_cluster_custom_object(
                    "gpuyard.io", "v1alpha1", "nodetopologies", body=body
                )
            except ApiException as exc:
                if exc.status == 404:
                    log.warning("fakenodes.no_topology_crd", hint="gpuyard install --print --crds-only")
                    break
                if exc.status != 409:
                    raise
        await self.publish_slices()
        self.registered.set()
        log.info("fakenodes.registered", nodes=len(self.names), scenario=self.scenario.name)

    async def _serves_dra(self) -> bool:
        groups = await client.ApisApi(self.api).get_api_versions()
        return any(
            g.name == DRA_GROUP and any(v.version == DRA_VERSION for v in g.versions) for g in groups.groups
        )

    async def publish_slices(self) -> int:
        """One ResourceSlice per node for its GPUs when the server serves `resource.k8s.io/v1`,
        owned by the node (the garbage collector deletes it with the node). Returns how many."""
        if not await self._serves_dra():
            log.info("fakenodes.no_dra", hint=f"the server does not serve {DRA_GROUP}/{DRA_VERSION}")
            return 0
        published = 0
        for body in slice_objects(self.scenario):
            node = await self.core.read_node(body["spec"]["nodeName"])
            body["metadata"]["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": node.metadata.name, "uid": node.metadata.uid}
            ]
            name = body["metadata"]["name"]
            try:
                await self.custom.create_cluster_custom_object(
                    DRA_GROUP, DRA_VERSION, "resourceslices", body=body
                )
            except ApiException as exc:
                if exc.status != 409:
                    raise
                merge: dict[str, Any] = {"_content_type": MERGE_PATCH}  # else a dict goes as a JSON patch
                await self.custom.patch_cluster_custom_object(
                    DRA_GROUP, DRA_VERSION, "resourceslices", name, {"spec": body["spec"]}, **merge
                )
            published += 1
        return published

    async def _renew(self, name: str) -> None:
        lease: Any = node_lease(name, now=self.now())
        try:
            await self.leases.patch_namespaced_lease(name, NODE_LEASE_NAMESPACE, body={"spec": lease["spec"]})
        except ApiException as exc:
            if exc.status != 404:
                raise
            await self.leases.create_namespaced_lease(NODE_LEASE_NAMESPACE, body=lease)
        if self.ready[name]:
            await self._set_ready(name, ready=True)

    async def _set_ready(self, name: str, *, ready: bool, reason: str = "", message: str = "") -> None:
        condition = ready_condition(ready=ready, now=self.now(), reason=reason, message=message)
        await self.core.patch_node_status(name, body={"status": {"conditions": [condition]}})

    async def heartbeats(self) -> None:
        """Renew every node's Lease (and Ready condition) every `heartbeat` seconds."""
        while True:
            for name in sorted(self.names):
                try:
                    await self._renew(name)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the API server is away: try again at the next beat
                    log.warning("fakenodes.heartbeat_failed", node=name, error=str(exc)[:200])
            await asyncio.sleep(self.heartbeat)

    # --- kubelets --------------------------------------------------------------------------------

    async def watch_pods(self) -> None:
        """Play every pod bound to one of the nodes: LIST, then WATCH from the list's version; on
        any end or error, list again (pods deleted meanwhile are forgotten, freeing their node)."""
        while True:
            stream = watch.Watch()
            try:
                version = await self._relist()
                async for event in stream.stream(
                    self.core.list_pod_for_all_namespaces, resource_version=version, timeout_seconds=300
                ):
                    if event["type"] not in ("ADDED", "MODIFIED", "DELETED"):
                        continue
                    raw = self.api.sanitize_for_serialization(event["object"])
                    self._seen(event["type"], Pod.model_validate(raw))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a broken stream, a refused connection, 410: list again shortly
                log.warning("fakenodes.watch_failed", error=str(exc)[:200])
                await asyncio.sleep(1.0)
            finally:
                stream.stop()
                with contextlib.suppress(Exception):
                    await stream.close()  # its own ApiClient, else left open

    async def _relist(self) -> str:
        """List every pod (in pages); forget those gone; see the rest oldest first, as a kubelet
        admits them. Returns the list's resourceVersion."""
        items: list[Pod] = []
        page_args: dict[str, Any] = {"limit": 500}
        while True:
            page = await self.core.list_pod_for_all_namespaces(**page_args)
            items.extend(Pod.model_validate(self.api.sanitize_for_serialization(p)) for p in page.items)
            version = str(page.metadata.resource_version)
            if not page.metadata._continue:
                break
            page_args["_continue"] = page.metadata._continue
        present = {(p.metadata.namespace, p.metadata.name) for p in items}
        for key in [k for k in self.pods if k not in present]:
            self._seen("DELETED", self.pods[key])
        for pod in sorted(items, key=lambda p: (str(p.metadata.creation_timestamp or ""), p.metadata.name)):
            self._seen("ADDED", pod)
        return version

    def pod_changes(self) -> asyncio.Event:
        """An event set at the next change of any pod seen (the kubelet port's follow waits on it)."""
        return self._changed

    def played_pod(self, namespace: str, name: str) -> Pod | None:
        """The pod as last seen, if it is bound to one of these nodes."""
        pod = self.pods.get((namespace, name))
        return pod if pod is not None and pod.spec.node_name in self.names else None

    def _seen(self, kind: str, pod: Pod) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        key = (pod.metadata.namespace, pod.metadata.name)
        if kind == "DELETED" or pod.spec.node_name not in self.names:
            task = self.playing.pop(key, None)
            self.pods.pop(key, None)
            self.admitted.discard(key)
            if task is not None:
                task.cancel()
            return
        self.pods[key] = pod
        if pod.status.phase in TERMINAL:
            self.admitted.discard(key)
            return
        if key in self.playing:
            return
        node = pod.spec.node_name or ""
        if not self.ready[node]:
            return
        if key not in self.admitted:
            if pod.status.phase == "Pending" and pod.status.start_time is None:
                admitted = [self.pods[k] for k in self.admitted if self.pods[k].spec.node_name == node]
                rejection = admit(pod, allocatable=self.allocatable[node], admitted=admitted)
                if rejection is not None:
                    self._start(key, self._reject(pod, rejection), what="fake-kubelet reject")
                    return
            self.admitted.add(key)  # a pod found running was admitted before
        self._start(key, self._play(pod), what="fake-kubelet")

    def _start(self, key: tuple[str, str], work: Coroutine[Any, Any, None], *, what: str) -> None:
        task = asyncio.create_task(work, name=f"{what} {key[0]}/{key[1]}")
        self.playing[key] = task
        task.add_done_callback(functools.partial(self._done, key))

    async def _reject(self, pod: Pod, rejection: Rejection) -> None:
        """Fail a pod the node cannot fit, as the kubelet's admission does."""
        self.rejected += 1
        log.warning(
            "fakenodes.pod_rejected",
            pod=f"{pod.metadata.namespace}/{pod.metadata.name}",
            node=pod.spec.node_name,
            reason=rejection.reason,
            message=rejection.message,
        )
        try:
            await self._status(pod, rejected_status(rejection))
        except ApiException as exc:
            if exc.status != 404:
                log.warning("fakenodes.status_failed", pod=pod.metadata.name, status=exc.status)

    def _done(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self.playing.get(key) is task:
            del self.playing[key]

    async def _status(self, pod: Pod, status: dict[str, Any]) -> None:
        await self.core.patch_namespaced_pod_status(
            pod.metadata.name, pod.metadata.namespace, body={"status": status}
        )

    async def _play(self, pod: Pod) -> None:
        """Pending -> Running -> Succeeded | Failed, on the clock of the pod's script."""
        script = pod_script(pod.metadata.annotations, self.scenario.kubelet)
        try:
            if pod.status.phase == "Pending":
                await asyncio.sleep(script.start_delay)
                await self._status(pod, running_status(pod, now=self.now()))
            if script.duration is None:
                return  # runs until deleted or failed
            started = pod.status.start_time  # a pod seen again (a new watch) runs only what is left
            elapsed = (self.now() - started).total_seconds() if started is not None else 0.0
            await asyncio.sleep(max(0.0, script.duration - elapsed))
            code = script.exit_code
            await self._status(
                pod, terminated_status(pod, exit_code=code, reason=exit_reason(code), now=self.now())
            )
        except ApiException as exc:
            if exc.status != 404:  # deleted meanwhile: nothing to report
                log.warning("fakenodes.status_failed", pod=pod.metadata.name, status=exc.status)

    async def _fail(self, pods: list[Pod], *, reason: str, message: str) -> int:
        for pod in pods:
            task = self.playing.pop((pod.metadata.namespace, pod.metadata.name), None)
            if task is not None:
                task.cancel()
            with contextlib.suppress(ApiException):
                await self._status(
                    pod, terminated_status(pod, exit_code=137, reason=reason, message=message, now=self.now())
                )
        return len(pods)

    def _active_on(self, node: str) -> list[Pod]:
        return [p for p in self.pods.values() if p.spec.node_name == node and p.status.phase not in TERMINAL]

    # --- faults ----------------------------------------------------------------------------------

    def _known(self, node: str) -> None:
        if node not in self.names:
            raise KeyError(
                f"node {node!r} is not one of the fake nodes; nodes: {', '.join(sorted(self.names))}"
            )

    async def fail_node(self, node: str) -> int:
        """The node turns NotReady and its pods fail (`NodeLost`). Returns the pods failed."""
        self._known(node)
        self.ready[node] = False
        await self._set_ready(node, ready=False, reason="NodeLost", message="fault injected")
        failed = await self._fail(self._active_on(node), reason="NodeLost", message=f"node {node} failed")
        log.info("fakenodes.node_failed", node=node, pods_failed=failed)
        return failed

    async def recover_node(self, node: str) -> None:
        self._known(node)
        self.ready[node] = True
        await self._set_ready(node, ready=True)
        for pod in list(self.pods.values()):
            if pod.spec.node_name == node:
                self._seen("MODIFIED", pod)

    async def fail_gpu(self, node: str, index: int) -> int:
        """GPU `index` of `node` turns unhealthy; the pods holding it fail (`DeviceUnhealthy`)."""
        self._known(node)
        self.unhealthy[node].add(index)
        annotations = {ANNOTATION_UNHEALTHY_GPUS: format_unhealthy(self.unhealthy[node])}
        await self.core.patch_node(node, body={"metadata": {"annotations": annotations}})
        await self._topology_health(node)
        victims = [p for p in self._active_on(node) if index in pod_gpus(p)]
        return await self._fail(victims, reason="DeviceUnhealthy", message=f"GPU {index} of {node} failed")

    async def recover_gpu(self, node: str, index: int) -> None:
        """GPU `index` of `node` is healthy again."""
        self._known(node)
        self.unhealthy[node].discard(index)
        annotations = {ANNOTATION_UNHEALTHY_GPUS: format_unhealthy(self.unhealthy[node]) or None}
        await self.core.patch_node(node, body={"metadata": {"annotations": annotations}})
        await self._topology_health(node)

    async def _topology_health(self, node: str) -> None:
        """The node's NodeTopology says which GPUs are unhealthy (where the CRD and object exist)."""
        try:
            topo = await self.custom.get_cluster_custom_object(
                "gpuyard.io", "v1alpha1", "nodetopologies", node
            )
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        for gpu in topo.get("spec", {}).get("gpus", []):
            gpu["health"] = "Unhealthy" if gpu.get("index") in self.unhealthy[node] else "Healthy"
        await self.custom.replace_cluster_custom_object(
            "gpuyard.io", "v1alpha1", "nodetopologies", node, topo
        )

    # --- the whole ---------------------------------------------------------------------------------

    async def serve_kubelet(self) -> bool:
        """Start the kubelet port of `kubelet` (once); whether it is served."""
        if self.kubelet is None or self.kubelet_server is not None:
            return self.kubelet_server is not None
        server = KubeletServer(self.kubelet, pod=self.played_pod, changes=self.pod_changes)
        try:
            await server.start()
        except (OSError, ImportError) as exc:
            log.warning(
                "fakenodes.no_kubelet_port",
                address=self.kubelet.address,
                port=self.kubelet.port,
                error=str(exc)[:200],
                hint="pod logs (kubectl logs, gpuyard logs) fail for these nodes; "
                "pick another --kubelet-port, or install the kubernetes extra",
            )
            return False
        self.kubelet_server = server
        return True

    async def run(self) -> None:
        """Serve the kubelet port (if asked), register the nodes, then keep their heartbeats and
        kubelets going until cancelled."""
        await self.serve_kubelet()
        try:
            await self.register()
            async with asyncio.TaskGroup() as group:
                group.create_task(self.heartbeats(), name="fake-nodes heartbeats")
                group.create_task(self.watch_pods(), name="fake-nodes kubelets")
        finally:
            for task in list(self.playing.values()):
                task.cancel()
            if self.kubelet_server is not None:
                server, self.kubelet_server = self.kubelet_server, None
                await server.stop()
