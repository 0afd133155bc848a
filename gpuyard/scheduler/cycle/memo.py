"""What the scheduling cycle remembers between attempts: the walk under way and its answers.

:class:`CycleMemo` owns

* the :class:`Walk` under way (a cycle's walk over the queues' candidates, taken in slices of
  `step`) and each candidate's position in its queue this cycle (`positions`, for its status);
* answers cached while what they depend on stays as it is: "does not fit" per gang shape
  (`no_fit`, per snapshot epoch and holds version), "can never fit on this cluster" per gang
  shape (`never_fit`) and per job (`never_jobs`, per generation and node set, and whether its
  status says so already: a job woken by a change that cannot help it is set aside again without
  another attempt), the backfill
  head's planned placement (`head_plans`);
* per job: the generation at its last attempt (`generation`: an event that changes nothing it
  depends on does not send a parked job through a cycle again), running jobs with pods still to
  place and the epoch they were last tried in (`partial`), and waiting gangs'
  scheduleTimeoutSeconds (`deadlines`).

A re-list clears the answers; a job gone, or failed for its timeout, is forgotten.
"""

from __future__ import annotations

from typing import Any

from gpuyard.scheduler.admission.gatekeeping import JobShape
from gpuyard.scheduler.cycle.timeouts import Deadlines
from gpuyard.scheduler.gangs.outcomes import Refusal, Unschedulable
from gpuyard.scheduler.gangs.requests import PodShape

__all__ = ["CycleMemo", "GangSignature", "Walk"]

Key = tuple[str, str]
GangSignature = tuple[tuple[str, PodShape, int, int], ...]
"""Per part of a gang: (role, shape, required, pods); equal ones fit or not alike in one epoch."""


class Walk:
    """One cycle's walk over the queues' candidates."""

    __slots__ = ("candidates", "seen", "verdicts")

    def __init__(self, candidates: Any) -> None:
        self.candidates = candidates
        self.seen: dict[str, int] = {}  # per queue: candidates so far this cycle
        # Quota answers per job shape (quota, demand, namespace) while the quota state stays as it
        # is: many waiting jobs of few shapes cost one check (and one `owed`) per shape. Cleared
        # whenever the state may change (a placement, a reclaim, new changes).
        self.verdicts: dict[JobShape, tuple[Refusal, bool]] = {}


class CycleMemo:
    """The walk under way and the cycle's cached answers (see the module docstring)."""

    def __init__(self) -> None:
        self.walk: Walk | None = None
        self.positions: dict[Key, int] = {}  # this cycle: a candidate's position in its queue
        self.no_fit: dict[GangSignature, tuple[tuple[int, int], Unschedulable]] = {}
        self.never_fit: dict[object, tuple[tuple[int, int], str | None]] = {}  # per shape and nodes
        # per job: (generation and node set, the verdict, whether its status was written for it)
        self.never_jobs: dict[Key, tuple[tuple[int, int, int], Unschedulable | None, bool]] = {}
        self.head_plans: dict[Key, tuple[tuple[int, int], str, float]] = {}  # head's plan, state, time
        self.generation: dict[Key, int] = {}  # generation at the last attempt
        self.partial: dict[Key, int] = {}  # running jobs with pods still to place -> epoch last tried
        self.deadlines = Deadlines()  # waiting gangs' scheduleTimeoutSeconds (`timeouts`)

    def clear(self) -> None:
        """A re-list: no walk under way, no cached answer, no deadline, no partial job."""
        self.walk = None
        self.no_fit.clear()
        self.never_fit.clear()
        self.never_jobs.clear()
        self.head_plans.clear()
        self.deadlines.clear()
        self.partial.clear()

    def given_up(self, key: Key) -> None:
        """`key` failed for its scheduleTimeoutSeconds: no plan, no attempt to remember."""
        self.deadlines.drop(key)
        self.head_plans.pop(key, None)
        self.generation.pop(key, None)

    def forget(self, key: Key) -> None:
        """The PodGroup is gone: every record of it."""
        self.given_up(key)
        self.never_jobs.pop(key, None)
        self.partial.pop(key, None)
