"""The `coordination.k8s.io/v1` Lease, as the Kubernetes backend reads it.

Every kubelet renews a Lease named after its node in the node-lease namespace (`kube-node-lease`)
every few seconds: the node's heartbeat, far cheaper than a Node status update. The Kubernetes
backend watches those Leases (`kubecluster/heartbeats.py`) and treats a node whose Lease stops
being renewed as NotReady, as kube-controller-manager's node lifecycle controller does. gpuyard's
own leader-election Lease is read and written as plain JSON by `kubecluster/leading.py`, not
through this model. The kind is known to the store only in Kubernetes mode (the fake backend's
journal never holds one).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from gpuyard.apis.meta import K8sModel, Resource

__all__ = ["Lease", "LeaseSpec"]


class LeaseSpec(K8sModel):
    """`spec` of a Lease; the times are RFC 3339 micro times (`2026-01-01T10:00:00.123456Z`)."""

    holder_identity: str | None = None
    lease_duration_seconds: int | None = Field(default=None, ge=0)
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    lease_transitions: int | None = Field(default=None, ge=0)


class Lease(Resource):
    KIND = "Lease"
    API_VERSION = "coordination.k8s.io/v1"

    spec: LeaseSpec = Field(default_factory=LeaseSpec)
