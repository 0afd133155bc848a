"""The fake cluster's pod logs: its kubelet's short log per container, read from the store.

A fake container prints nothing, so its log is what the simulated kubelet wrote in the pod's
status, rendered by :func:`gpuyard.devices.fakepods.container_logs` (start, training environment,
exit). It only ever grows, so following it is watching the pod in the store and sending the lines
past those already sent, until the pod has finished or is deleted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from gpuyard.apis.core import Pod
from gpuyard.devices.fakepods import container_logs
from gpuyard.state.backend import BackendError
from gpuyard.state.store import Gone, Store

__all__ = ["StorePodLogs"]

FINISHED = ("Succeeded", "Failed")


def _error(message: str, status: int) -> BackendError:
    err = BackendError(message)
    err.status = status
    return err


class StorePodLogs:
    """`pod_log` of :class:`~gpuyard.state.backend.PodLogs` over the pods of a store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def pod_log(
        self, pod: Pod, *, container: str, follow: bool = False, tail_lines: int | None = None
    ) -> AsyncIterator[str]:
        ns, name = pod.metadata.namespace, pod.metadata.name
        since = self.store.resource_version  # the watch of `follow` starts after what is read now
        current = self.store.get_of(Pod, ns, name)
        if current is None:
            raise _error(f'pods "{name}" not found in namespace {ns}', 404)
        lines = container_logs(current).get(container)
        if lines is None:
            raise _error(f"container {container} is not valid for pod {name}", 400)
        return self._lines(current, container, lines, since=since, follow=follow, tail_lines=tail_lines)

    async def _lines(
        self,
        pod: Pod,
        container: str,
        lines: list[str],
        *,
        since: int,
        follow: bool,
        tail_lines: int | None,
    ) -> AsyncIterator[str]:
        first = 0 if tail_lines is None else max(0, len(lines) - tail_lines)
        for line in lines[first:]:
            yield line
        sent = len(lines)
        if not follow or pod.status.phase in FINISHED:
            return
        ns, name = pod.metadata.namespace, pod.metadata.name
        while True:
            try:
                async for event in self.store.watch("Pod", since=since, namespace=ns):
                    if event.object.metadata.name != name:
                        continue
                    if event.type == "DELETED":
                        return
                    changed = event.object
                    assert isinstance(changed, Pod)
                    now = container_logs(changed).get(container, [])
                    for line in now[sent:]:
                        yield line
                    sent = max(sent, len(now))
                    if changed.status.phase in FINISHED:
                        return
                return  # the store closed
            except Gone:  # fell behind the store's history: read the pod again and watch on
                since = self.store.resource_version
                again = self.store.get_of(Pod, ns, name)
                if again is None:
                    return
                now = container_logs(again).get(container, [])
                for line in now[sent:]:
                    yield line
                sent = max(sent, len(now))
                if again.status.phase in FINISHED:
                    return
