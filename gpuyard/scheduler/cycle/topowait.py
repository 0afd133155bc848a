"""A gang's wait for one node (or one network block) before it is split: its topology policy.

A job chooses between waiting and splitting (`gpuyard.apis.topologypolicy`):

* `gpuyard.io/topology-policy: required` with `gpuyard.io/topology-wait`: placed only inside one
  domain of `gpuyard.io/topology-level` (node or block) until the wait is over, then as
  `preferred`; without a wait it is a hard level (`GangRequest.topology_required`, never here);
* `preferred` and `none`: never wait;
* no policy: a gang whose GPU pods are all one-GPU pods (DDP workers, Master + Workers, PS +
  Workers) waits for one node for the profile's `topology_wait` seconds
  (`scheduler.topology_wait_seconds`), then splits.

The wait counts from the PodGroup's creation (its `creationTimestamp`, on the object and fixed,
so a fresh scheduler (the liveness rule's `fitting_now`) makes the same choice at the same time),
and a job within its wait does not "fit now" — it waits by its own choice. A gang that no single
domain could hold even on an empty cluster does not wait. The cycle
(`attempting.schedule_one`) places a waiting gang with the level required, parks it until the
cluster changes or the wait ends (whichever comes first), and says in its status which happened.

Whether one domain could ever hold the gang (`ever_fits` at the required level) depends only on the
gang's parts and the snapshot's static facts, so it is asked once per gang shape and level and
kept until a node or class changes (`snapshot.static_version`); a waiting gang is tried again at
every change of the cluster, and was re-checked against every node each time.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from gpuyard.apis.scheduling import PodGroup
from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.gangs.requests import GangRequest
from gpuyard.scheduler.placement.capacity import ever_fits
from gpuyard.scheduler.placement.framework import Profile

__all__ = ["TopologyWait", "one_gpu_workers", "topology_wait"]

_DOMAIN_MEMO_SIZE = 1024
_domain_memo: weakref.WeakKeyDictionary[Snapshot, tuple[int, Profile, dict[tuple[object, ...], bool]]] = (
    weakref.WeakKeyDictionary()
)
"""Per snapshot: its static version and the profile the verdicts are for, and per (level, the
gang's parts) whether one domain could ever hold the gang."""


def _one_domain_ever(snapshot: Snapshot, gang: GangRequest, profile: Profile, level: str) -> bool:
    """Whether one `level` domain could hold `gang` on the empty cluster (`ever_fits`), memoised
    until the snapshot's static facts change (see the module docstring)."""
    entry = _domain_memo.get(snapshot)
    if (
        entry is None
        or entry[0] != snapshot.static_version
        or entry[1] is not profile
        or len(entry[2]) >= _DOMAIN_MEMO_SIZE
    ):
        entry = _domain_memo[snapshot] = (snapshot.static_version, profile, {})
    verdicts = entry[2]
    key = (level, tuple((p.role, p.shape, p.required) for p in gang.parts))
    got = verdicts.get(key)
    if got is None:
        got = verdicts[key] = not ever_fits(snapshot, replace(gang, topology_required=level), profile).never
    return got


@dataclass(frozen=True, slots=True)
class TopologyWait:
    """A gang's wait for one `level` domain: until `until`; `why` names the policy."""

    level: str
    until: datetime
    seconds: float
    why: str
    waiting: bool
    """Still within the wait (placed only inside one domain); False: the wait is over."""

    def note(self, *, split: bool, waited: float) -> str:
        """What the status says once the gang is placed."""
        where = f"one {self.level}"
        if not split:
            return f"placed in {where} after waiting {waited:.0f}s ({self.why})"
        return (
            f"split: no {self.level} had room within the {self.seconds:g}s it waited for {where} ({self.why})"
        )

    def waiting_note(self) -> str:
        return (
            f"waits for {'one node' if self.level == 'node' else 'one ' + self.level} until "
            f"{self.until.strftime('%Y-%m-%dT%H:%M:%SZ')} ({self.why}), then it is placed split if it must"
        )


def one_gpu_workers(gang: GangRequest) -> bool:
    """Whether every GPU pod the gang still needs asks for one whole GPU, and there are several."""
    gpu_parts = [p for p in gang.parts if p.required and p.shape.gpus]
    if not gpu_parts or any(p.shape.gpus != 1 or p.shape.shared for p in gpu_parts):
        return False
    return sum(p.required for p in gpu_parts) >= 2


def topology_wait(
    gang: GangRequest, pg: PodGroup, *, profile: Profile, snapshot: Snapshot, utcnow: datetime
) -> TopologyWait | None:
    """The gang's wait for one domain (see the module docstring); None when it does not wait."""
    if gang.topology_required is not None or snapshot.placed_pods(gang.key):
        return None  # a hard level already; or partly placed: its pods go where they fit
    policy = gang.topology_policy
    if policy is not None and policy.policy in ("none", "preferred"):
        return None
    if policy is not None and policy.policy == "required" and policy.wait is not None:
        level, seconds = policy.level, policy.wait
        why = f"{policy.source}: required, gpuyard.io/topology-wait: {seconds:g}s"
    else:
        seconds = float(getattr(profile, "topology_wait", 0.0) or 0.0)
        if seconds <= 0 or not one_gpu_workers(gang):
            return None
        if any(part.shape.rules is not None for part in gang.parts):
            return None  # the pods' own affinity / spread rules say where they go (placement/podaffinity.py)
        level = "node"
        why = f"the default for gangs of one-GPU workers, scheduler.topology_wait_seconds: {seconds:g}"
    start = pg.metadata.creation_timestamp  # fixed for the object's life: every scheduler agrees
    if start is None:  # no time on the object to count from: waiting could never end
        return None
    until = start + timedelta(seconds=seconds)
    if utcnow >= until:
        return TopologyWait(level, until, seconds, why, waiting=False)
    if not _one_domain_ever(snapshot, gang, profile, level):
        return None  # no single domain could ever hold it: waiting cannot help
    return TopologyWait(level, until, seconds, why, waiting=True)
