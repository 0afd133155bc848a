"""Node heartbeats: when a node's Lease in the node-lease namespace says the node is gone.

A kubelet renews the Lease named after its node (namespace `kube-node-lease`,
`backend.kubernetes.node_lease_namespace`) every ~10 s. kube-controller-manager's node lifecycle
controller marks a node whose Lease was not renewed for `--node-monitor-grace-period` (40 s) as
`Ready=Unknown` (reason `NodeStatusUnknown`); gpuyard applies the same rule to its own view of
the node, with `backend.kubernetes.node_monitor_grace`:

* the clock that counts is gpuyard's own: a :class:`Heartbeat` records when gpuyard *saw* the
  Lease's `renewTime` change (the controller's `probeTimestamp`), so clock skew between the
  nodes and gpuyard does not matter; a Lease seen for the first time counts as renewed then;
* a node whose heartbeat is older than the grace is stale (:func:`is_stale`) since the moment
  the grace ran out (:func:`stale_since`), and published into the store as a copy whose Ready
  condition is `Unknown` (:func:`with_unknown_ready`); the Node on the API server is never changed;
* a node with no Lease is judged by its Ready condition alone (static nodes, older clusters).

The rules here are pure functions; :class:`LeaseMirror` is the Lease informer's mirror, which
hands each Lease to the node model (`nodes.py`) and keeps it in the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from gpuyard.apis.core import Node, NodeCondition
from gpuyard.apis.leases import Lease
from gpuyard.apis.meta import Resource

if TYPE_CHECKING:
    from gpuyard.kubecluster.nodes import NodeModel

__all__ = [
    "NODE_STATUS_UNKNOWN",
    "Heartbeat",
    "LeaseMirror",
    "heartbeat_seen",
    "is_stale",
    "stale_message",
    "stale_since",
    "with_unknown_ready",
]

NODE_STATUS_UNKNOWN = "NodeStatusUnknown"  # the Ready condition's reason, as kube-controller-manager's


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The last `renewTime` of a node's Lease and when gpuyard first saw it (its clock's seconds)."""

    renew_time: datetime | None
    seen_at: float


def heartbeat_seen(previous: Heartbeat | None, renew_time: datetime | None, *, now: float) -> Heartbeat:
    """The heartbeat after a Lease with `renew_time` was observed at `now`: the same one while
    `renewTime` stays the same (an unrelated change of the Lease is no renewal), else a new one."""
    if previous is not None and previous.renew_time == renew_time:
        return previous
    return Heartbeat(renew_time=renew_time, seen_at=now)


def is_stale(beat: Heartbeat | None, *, now: float, grace: float) -> bool:
    """Not renewed for `grace` seconds (False without a Lease: the Ready condition decides)."""
    return beat is not None and now - beat.seen_at >= grace


def stale_since(beat: Heartbeat, *, grace: float) -> float:
    """When the heartbeat went stale: its last renewal seen plus the grace."""
    return beat.seen_at + grace


def stale_message(*, namespace: str, name: str, beat: Heartbeat, grace: float) -> str:
    renewed = beat.renew_time.isoformat() if beat.renew_time is not None else "never"
    return (
        f"node lease {namespace}/{name} not renewed for {grace:g}s (last renewTime {renewed}): "
        "the kubelet stopped posting its heartbeat"
    )


def with_unknown_ready(node: Node, *, message: str, since: float) -> Node:
    """A copy of `node` whose Ready condition is `Unknown` (reason `NodeStatusUnknown`), as the
    node lifecycle controller would write it; every other field is the node's own."""
    copy = node.clone()
    conditions = [c for c in copy.status.conditions if c.type != "Ready"]
    conditions.append(
        NodeCondition(
            type="Ready",
            status="Unknown",
            reason=NODE_STATUS_UNKNOWN,
            message=message,
            last_transition_time=datetime.fromtimestamp(since, UTC),
        )
    )
    copy.status.conditions = conditions
    return copy


class LeaseMirror:
    """Mirror of the node-lease informer: the Lease into the store, its renewal to the node model."""

    def __init__(self, model: NodeModel) -> None:
        self.model = model

    def put(self, obj: Resource) -> None:
        if not isinstance(obj, Lease):
            raise TypeError(f"LeaseMirror mirrors Leases, not {obj.kind}")
        self.model.store.observe(obj)
        self.model.lease_seen(obj.metadata.name, obj.spec.renew_time)

    def drop(self, kind: str, namespace: str, name: str) -> None:
        self.model.store.forget(kind, namespace, name)
        self.model.lease_gone(name)
