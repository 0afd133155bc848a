"""What the rescheduler reads and writes of the scheduler's state, as a consumer-side interface.

The rescheduler never sees the core (`core.SchedulerState`, a layer above it): its runs and its
promotions take a :class:`Rescheduling` — the cluster cache (objects, snapshot, the Reservations
it assumes and deletes), the recorder (statuses, events, the count of moved jobs) and the time.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpuyard.scheduler.admission.recording import Recorder
    from gpuyard.scheduler.cache.cluster import ClusterCache

__all__ = ["Rescheduling"]


class Rescheduling(Protocol):
    """What a rescheduler run and a promotion read and write."""

    @property
    def cache(self) -> ClusterCache: ...

    @property
    def recorder(self) -> Recorder: ...

    @property
    def now(self) -> float: ...

    @property
    def utcnow(self) -> datetime: ...
