"""The `ClusterBackend` protocol: what the fake cluster and the Kubernetes backend both offer.

A backend is where the cluster's objects really live; the store is its cache. It offers:

* `writer` — the one write path (:class:`~gpuyard.state.writing.Writer`) every component uses
  (`Context.writer`). Pods are created through it already bound to `spec.nodeName` (the
  scheduler placed them); the backend refuses a pod it cannot run with :class:`BackendError`,
  and the caller then un-assumes the placement and requeues (Kueue's admit pattern). Services,
  jobs, quotas and every other object go through the same writer.
* `run()` — syncs the cluster's nodes (and, for Kubernetes, every watched kind) into the store,
  sets `synced` once the first sync is complete (`/readyz`), keeps them current, and runs the
  pods the store says should run. Pod phases, exit codes and reasons, and node status and
  device health, are written by the backend only (the fake or the real kubelet).
* `healthy()` — whether the backend's view is current now (every watch of the store of record
  open and synced): `/readyz` answers ready only after `synced` and while `healthy()`.
* `leadership` — a :class:`Leadership` where several replicas share one store of record (the
  Kubernetes backend: a Lease), or None (the fake cluster: this process always leads). The
  runtime runs the reconcilers (operator, scheduler) only while this replica leads; every
  replica keeps its store current and serves the read-only API.
* `faults` — a :class:`FaultInjector` where the backend can inject faults (the fake cluster),
  or None (a real cluster): the HTTP fault routes and the test harness ask it, never a class.
* `pod_log()` — optional (:class:`PodLogs`): a pod container's log, read where the backend keeps
  it (the fake cluster: its kubelet's short log; Kubernetes: the API server's `pods/log`).

Which backend runs is decided once, by the factory in `gpuyard.platform.backends`; nothing
above the backend imports one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from gpuyard.apis.core import Pod
from gpuyard.state.writing import Writer

__all__ = ["BackendError", "ClusterBackend", "FaultError", "FaultInjector", "Leadership", "PodLogs"]


class BackendError(Exception):
    """A backend write that failed (the caller un-assumes and retries). `status`: the HTTP status
    the cluster's API server answered (0: no answer, or a refusal of the backend's own, such as a
    standby's)."""

    status: int = 0


class FaultError(ValueError):
    """A fault that cannot be injected as asked (e.g. crashing a pod that already finished)."""


@runtime_checkable
class FaultInjector(Protocol):
    """Faults a backend can inject, each reported exactly as the real failure would be.

    A lost node turns NotReady and its pods fail (`NodeLost`); a failed GPU turns unhealthy and
    the pods using it fail (`DeviceUnhealthy`); a crashed pod fails with an exit code or reason.
    Methods raise :class:`~gpuyard.state.store.NotFound` for an unknown node or pod and
    :class:`FaultError` for a fault that does not apply.
    """

    async def fail_node(self, name: str, *, reason: str = "NodeLost") -> int:
        """Turn the node NotReady and fail its running pods; return how many pods failed."""
        ...

    async def recover_node(self, name: str) -> None: ...

    async def fail_gpu(self, node: str, index: int) -> int:
        """Mark one GPU unhealthy and fail the pods using it; return how many pods failed."""
        ...

    async def recover_gpu(self, node: str, index: int) -> None: ...

    async def crash_pod(
        self, namespace: str, name: str, *, exit_code: int | None = None, reason: str | None = None
    ) -> Pod:
        """Fail a running pod now; return it as stored."""
        ...

    def fail_next_creates(self, count: int = 1) -> None:
        """Make the next `count` pod creations fail with :class:`BackendError`."""
        ...


@runtime_checkable
class Leadership(Protocol):
    """Which replica of several leads (reconciles and writes); see the module docstring."""

    def is_leader(self) -> bool: ...

    @property
    def holder(self) -> str | None:
        """The identity of the leader as last seen (None while no one holds the lease)."""
        ...

    async def wait_leading(self) -> None:
        """Return once this replica leads."""
        ...

    async def wait_lost(self) -> None:
        """Return once this replica, which led, has lost the lead."""
        ...


@runtime_checkable
class PodLogs(Protocol):
    """A backend that reads its pods' logs (`GET .../pods/{name}/log`, `gpuyard logs`)."""

    async def pod_log(
        self, pod: Pod, *, container: str, follow: bool = False, tail_lines: int | None = None
    ) -> AsyncIterator[str]:
        """Open the log of `container` of `pod`: its lines (without line ends; the last
        `tail_lines` only, when given), then, with `follow`, each new one until the container has
        finished. Raises :class:`BackendError` when it cannot be opened (`status`: 400 the
        container has not started, 404 no such pod, else what the cluster answered)."""
        ...


@runtime_checkable
class ClusterBackend(Protocol):
    name: str
    synced: asyncio.Event

    @property
    def writer(self) -> Writer:
        """The one write path every component uses (Context.writer)."""
        ...

    @property
    def faults(self) -> FaultInjector | None:
        """None where the backend cannot inject faults."""
        ...

    @property
    def leadership(self) -> Leadership | None:
        """None where this process always leads (one replica)."""
        ...

    def healthy(self) -> bool:
        """Whether the store is being kept current now (False while a watch is broken)."""
        ...

    async def run(self) -> None:
        """Sync into the store, set `synced`, then run until cancelled."""
        ...
