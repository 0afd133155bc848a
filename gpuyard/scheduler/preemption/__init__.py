"""The one preemption engine: victims for priority preemption and quota reclaim, and the
"does the gang fit on the real nodes if these jobs were gone" check every such decision (and
the rescheduler, and backfill) asks. Pure functions over the snapshot and the running jobs.
"""

from gpuyard.scheduler.preemption.fitting import fits_without, room_needed, without

__all__ = ["fits_without", "room_needed", "without"]
