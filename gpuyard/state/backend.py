"""The `ClusterBackend` protocol: what the fake cluster and the Kubernetes backend both do.

A backend runs pods and services and reports what really happened:

* `run()` syncs the cluster's nodes (and, for Kubernetes, existing pods and services) into the
  store, sets `synced` once the first sync is complete (`/readyz`), and keeps them current.
* `create_pod(pod)` creates a pod already bound to `spec.nodeName` (the scheduler placed it) and
  writes it into the store; it raises :class:`BackendError` if the cluster refuses, and then the
  caller un-assumes the placement and requeues (Kueue's admit pattern).
* Pod phases, exit codes and reasons come back into each pod's `status` in the store, written by
  the backend only (the fake kubelet, or the Kubernetes informer).
* `delete_pod` stops a pod and removes it; services are created, updated and deleted likewise.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable

from gpuyard.apis.core import Pod, Service
from gpuyard.state.writing import Writer

__all__ = ["BackendError", "ClusterBackend"]


class BackendError(Exception):
    """A backend write that failed (the caller un-assumes and retries)."""


@runtime_checkable
class ClusterBackend(Protocol):
    name: str
    synced: asyncio.Event
    writer: Writer  # the one write path every component uses (Context.writer)

    async def run(self) -> None:
        """Sync into the store, set `synced`, then run until cancelled."""
        ...

    async def create_pod(self, pod: Pod) -> Pod:
        """Create the bound pod in the cluster and the store; return the stored object."""
        ...

    async def delete_pod(self, namespace: str, name: str) -> None:
        """Stop the pod (terminal phase) and remove it from the cluster and the store."""
        ...

    async def apply_service(self, service: Service) -> Service:
        """Create or replace a service in the cluster and the store."""
        ...

    async def delete_service(self, namespace: str, name: str) -> None: ...
