"""Which fault a waiting job is moving away from: the node or GPUs its pods ran on.

When a pod must be placed again because its node or a GPU of it failed (NodeLost,
DeviceUnhealthy), the operator releases its Reservation and names the node it ran on in
`PodGroup.spec.preferredNodes[pod]`. While such a job waits, the fault is the most fundamental
reason after "can never fit": it comes before quota ("used + requested > runtime", a runtime the
lost GPUs shrank) and before room held for others, so a person reads what happened first.
"""

from __future__ import annotations

from gpuyard.apis.scheduling import PodGroup
from gpuyard.scheduler.cache.snapshot import Snapshot

__all__ = ["FAULT_REASON", "fault_of"]

FAULT_REASON = "NodeFault"
"""The PodGroup status reason of a job waiting to move off a failed node or GPU."""


def fault_of(snapshot: Snapshot, pg: PodGroup) -> str | None:
    """ "pod w-0 must move off hgx-0 (the node is not ready)" for the first pod (by name) of `pg`
    that waits to move off a node that is gone, not ready, or has unhealthy GPUs; else None (a
    pod moving for another reason, e.g. host-network ports, off a healthy node)."""
    for pod, node in sorted(pg.spec.preferred_nodes.items()):
        row = snapshot.index.get(node)
        if row is None or not snapshot.alive[row]:
            why = "the node is gone"
        elif not snapshot.ready[row]:
            why = "the node is not ready"
        else:
            count, healthy = int(snapshot.gpu_count[row]), int(snapshot.gpu_healthy_count[row])
            if healthy >= count:
                continue
            broken = [i for i in range(count) if not snapshot.gpu_healthy[row, i]]
            listed = ", ".join(str(i) for i in broken[:8]) + (" ..." if len(broken) > 8 else "")
            why = f"GPU{'s' if len(broken) != 1 else ''} {listed} unhealthy"
        return f"pod {pod} must move off {node} ({why})"
    return None
