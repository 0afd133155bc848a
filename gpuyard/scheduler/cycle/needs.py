"""What the scheduling cycle reads and writes of the scheduler's state, as a consumer-side interface.

The cycle never sees the core (`core.SchedulerState`, a layer above it): `attempting`,
`backfilling` and `timeouts` take a :class:`Cycling` — what preemption needs (the cluster cache,
admission, the recorder, preemption's claims, the profile, the time and the epoch:
:class:`~gpuyard.scheduler.preemption.needs.Preempting`), plus the cycle's own memo, the jobs
parked by quota alone, and the count of placed gangs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from gpuyard.scheduler.preemption.needs import Preempting

if TYPE_CHECKING:
    from gpuyard.scheduler.admission.recording import QuotaParking
    from gpuyard.scheduler.cycle.memo import CycleMemo
    from gpuyard.scheduler.decisions import PlaceGang

__all__ = ["Cycling"]


class Cycling(Preempting, Protocol):
    """What one cycle's attempts, backfill and timeouts read and write."""

    @property
    def memo(self) -> CycleMemo: ...

    @property
    def parking(self) -> QuotaParking: ...

    def count_placed(self, decision: PlaceGang) -> None: ...
