"""The `spot` score: spot replicas on spot nodes, the other pods off them while other room exists.

Spot nodes carry `node.kubernetes.io/lifecycle: spot` (the label cluster autoscalers and cloud
node pools set; scenario node groups get it from `spot: true`). A pod shape marked `spot` (the
last `spotReplicaNumber` replicas of a role, KubeDL's spotReplicaSpec) scores 1 on spot nodes and
0 elsewhere; every other pod scores the reverse, so it avoids spot nodes as a preference, never as
a filter: when only spot nodes have room, the pod runs there rather than wait (what kube-scheduler
does for a preferred node affinity, and what Koordinator users get from a preferred
`node.kubernetes.io/lifecycle NotIn [spot]` term). A pod that must never run on spot capacity says
so itself, with a required node affinity.

The spot-node mask is the snapshot's cached node-selector mask for the label (computed once, then
patched row by row as nodes change), looked up once per placement attempt; on a cluster without
spot nodes the score has no opinion.
"""

from __future__ import annotations

import numpy as np

from gpuyard.apis.devicematching import LABEL_LIFECYCLE
from gpuyard.scheduler.gangs.requests import PodShape, Term
from gpuyard.scheduler.placement.framework import CycleState

__all__ = ["LABEL_LIFECYCLE", "SPOT", "SPOT_TERM", "SpotAffinity"]

SPOT = "spot"
SPOT_TERM: Term = (((LABEL_LIFECYCLE, "In", (SPOT,)),), ())
"""`node.kubernetes.io/lifecycle In [spot]` as a node-selector term (the snapshot caches its mask)."""


class SpotAffinity:
    name = "spot"

    def score(
        self, state: CycleState, shape: PodShape, nodes: np.ndarray | slice, take: np.ndarray
    ) -> np.ndarray | None:
        data = state.data
        if "spot.nodes" in data:  # one look per attempt: node labels do not change within one
            spot = data["spot.nodes"]
        else:
            mask = state.snapshot.term_mask(SPOT_TERM)
            spot = data["spot.nodes"] = mask if mask.any() else None
        if spot is None:
            return None
        on_spot = spot[nodes]
        result: np.ndarray = (on_spot if shape.spot else ~on_spot).astype(np.float64)
        return result
