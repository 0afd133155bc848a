"""The simulated kubelet: runs the pods bound to the fake cluster's nodes on the clock.

A reconciler over Pods, level-triggered like everything else: for a pod bound to a Ready node
it computes where the pod should be now and writes that, or asks to be called again when the
next transition is due (`Requeue(after=...)` on the clock):

    Pending --(start delay)--> Running --(duration)--> Succeeded | Failed(exit code)

Per pod, annotations override the scenario defaults: `fake.gpuyard.io/duration` (seconds or a
Go-style duration such as `40s` or `1h30m`; `inf` runs forever), `fake.gpuyard.io/exit-code`,
`fake.gpuyard.io/start-delay`, read by `gpuyard.devices.fakepods` (which `gpuyard fake-nodes`
shares). Because the
decision depends only on the stored pod and the clock, a restarted process resumes every pod
exactly where it was. The kubelet is the only writer of pod status, and it writes it through
the fake cluster's writer (`patch_status`, on the resourceVersion it read).

Logs: a fake container prints nothing of its own, so the kubelet keeps the short log a person
wants from it (`container_logs` of `gpuyard.devices.fakepods`, shared with `gpuyard fake-nodes`;
what `gpuyard logs` shows): when and where it started, the distributed-training environment it
was given (ranks, world size, master address, TF_CONFIG's task, visible GPUs), and how it exited.
The log is read from what the kubelet wrote in the pod's status, so a restarted process shows the
same log, and it goes with the pod.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from datetime import datetime
from typing import cast

from gpuyard.apis.core import ContainerState, ContainerStatus, Node, Pod
from gpuyard.devices.fakepods import container_logs, exit_reason, pod_script
from gpuyard.devices.scenarios import KubeletDefaults
from gpuyard.state.clock import Clock
from gpuyard.state.store import Conflict, NotFound, Store
from gpuyard.state.workqueues import ObjectKey, Requeue, Watch
from gpuyard.state.writing import Writer

__all__ = ["FakeKubelet", "container_logs", "terminate"]


def terminate(
    pod: Pod, *, exit_code: int | None, reason: str | None, message: str | None, now: datetime
) -> None:
    """Put a (copied) pod into its terminal phase with the container's exit code and reason."""
    failed = (reason is not None and exit_code is None) or (exit_code is not None and exit_code != 0)
    pod.status.phase = "Failed" if failed else "Succeeded"
    pod.status.reason = reason
    pod.status.message = message
    terminated: dict[str, object] = {"finishedAt": now.isoformat()}
    if exit_code is not None:
        terminated["exitCode"] = exit_code
    if reason:
        terminated["reason"] = reason
    names = [c.name for c in pod.spec.containers] or ["main"]
    pod.status.container_statuses = [
        ContainerStatus(name=n, ready=False, exit_code=exit_code, state=ContainerState(terminated=terminated))
        for n in names
    ]


class FakeKubelet:
    """Reconciles pods bound to fake nodes through their simulated lifecycle."""

    name = "fake-kubelet"
    concurrency = 1

    def __init__(self, *, store: Store, writer: Writer, clock: Clock, defaults: KubeletDefaults) -> None:
        self.store = store
        self.writer = writer
        self.clock = clock
        self.defaults = defaults
        self.watches: Sequence[Watch] = (Watch("Pod"), Watch("Node", self._pending_pods_on))
        # node name -> its Pending pods, in list order; built by one pass over the pods and kept
        # while no pod is written (a re-list maps every node in a row: one pass, not one per node)
        self._pending: dict[str, list[ObjectKey]] = {}
        self._pending_at: tuple[int, ...] | None = None

    def _pending_pods_on(self, node: Node) -> list[ObjectKey]:
        """A node that turns Ready again starts the pods waiting on it."""
        if not node.ready:
            return []
        mark = self.store.changed(Pod.KIND)
        if mark != self._pending_at:
            pending: dict[str, list[ObjectKey]] = {}
            for p in self.store.in_order(Pod):
                if p.spec.node_name and p.status.phase == "Pending":
                    pending.setdefault(p.spec.node_name, []).append((p.metadata.namespace, p.metadata.name))
            self._pending, self._pending_at = pending, mark
        return list(self._pending.get(node.metadata.name, ()))

    def container_logs(self, pod: Pod) -> dict[str, list[str]]:
        """Each container's log lines of a pod this kubelet runs (`container_logs`)."""
        return container_logs(pod)

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        try:
            return await self._step(key)
        except Conflict:
            return Requeue(after=0.0)  # someone wrote the pod in between: look again
        except NotFound:
            return None  # deleted in between

    async def _write_status(self, pod: Pod, changed: Pod) -> Pod:
        status = changed.status
        stored = await self.writer.patch_status(
            "Pod",
            pod.metadata.namespace,
            pod.metadata.name,
            {name: getattr(status, name) for name in type(status).model_fields},
            resource_version=pod.metadata.resource_version,
        )
        return cast(Pod, stored)  # patch_status returns the stored object of the kind it patched

    async def _step(self, key: ObjectKey) -> Requeue | None:
        pod = self.store.get_of(Pod, *key)
        if pod is None or pod.status.phase in ("Succeeded", "Failed") or not pod.spec.node_name:
            return None
        node = self.store.get_of(Node, "", pod.spec.node_name)
        if node is None or not node.ready:
            return None  # the node controller fails pods of lost nodes
        now = self.clock.now()
        script = pod_script(pod.metadata.annotations, self.defaults)
        if pod.status.phase == "Pending":
            delay = script.start_delay
            created = pod.metadata.creation_timestamp.timestamp() if pod.metadata.creation_timestamp else now
            due = created + delay
            if now < due:
                return Requeue(after=due - now)
            running = pod.clone()
            running.status.phase = "Running"
            running.status.start_time = self.clock.utcnow()
            running.status.host_ip = _node_ip(node)
            running.status.pod_ip = running.status.host_ip if pod.spec.host_network else _pod_ip(key)
            running.status.container_statuses = [
                ContainerStatus(
                    name=c.name,
                    ready=True,
                    state=ContainerState(running={"startedAt": running.status.start_time.isoformat()}),
                )
                for c in pod.spec.containers
            ]
            pod = await self._write_status(pod, running)
        duration = script.duration
        if duration is None:
            return None  # runs until deleted or crashed
        started = pod.status.start_time.timestamp() if pod.status.start_time else now
        due = started + duration
        if now < due:
            return Requeue(after=due - now)
        exit_code = script.exit_code
        done = pod.clone()
        terminate(
            done,
            exit_code=exit_code,
            reason=exit_reason(exit_code),
            message=None,
            now=self.clock.utcnow(),
        )
        await self._write_status(pod, done)
        return None


def _node_ip(node: Node) -> str:
    h = zlib.crc32(node.metadata.name.encode()) & 0xFFFF
    return f"172.16.{h >> 8}.{(h & 0xFF) or 1}"


def _pod_ip(key: ObjectKey) -> str:
    h = zlib.crc32("/".join(key).encode()) & 0xFFFF
    return f"10.244.{h >> 8}.{(h & 0xFF) or 1}"
