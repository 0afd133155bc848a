"""What preemption reads and writes of the scheduler's state, as consumer-side interfaces.

Preemption never sees the core (`core.SchedulerState`, a layer above it): its functions take an
object with the parts they use, whatever it is. The core is one; a test may pass another.

* :class:`Evicting` (`evicting.evict`): the cluster cache (objects, snapshot), admission (the
  victim is requeued), the recorder (statuses, events, the counts of stopped jobs) and the time;
* :class:`Preempting` (`priority.preempt_for`, `reclaim.Reclaimer`, `reclaim.on_nodes`): also
  preemption's own claims (held room, preemptors, reclaim), the profile and the core's epoch
  (grows when capacity or quota room may have grown: one search per state of the cluster).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpuyard.scheduler.admission.gatekeeping import Admission
    from gpuyard.scheduler.admission.recording import Recorder
    from gpuyard.scheduler.cache.cluster import ClusterCache
    from gpuyard.scheduler.placement.framework import Profile
    from gpuyard.scheduler.preemption.claims import Claims

__all__ = ["Evicting", "Preempting"]


class Evicting(Protocol):
    """What stopping a running job reads and writes."""

    @property
    def cache(self) -> ClusterCache: ...

    @property
    def admission(self) -> Admission: ...

    @property
    def recorder(self) -> Recorder: ...

    @property
    def now(self) -> float: ...

    @property
    def utcnow(self) -> datetime: ...


class Preempting(Evicting, Protocol):
    """What choosing victims (priority preemption, quota reclaim) reads and writes."""

    @property
    def claims(self) -> Claims: ...

    @property
    def profile(self) -> Profile: ...

    def epoch(self) -> int: ...
