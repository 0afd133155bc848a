"""What preemption has claimed: room held for waiting gangs, preemptors and their victims.

:class:`Claims` owns

* the held room (:class:`~gpuyard.scheduler.cache.holds.Holds`): a preemptor's nomination
  (`priority.preempt_for`, for `nomination_seconds`) and the backfill head's planned room
  (`cycle.backfilling.plan_head`, for `backfill_hold_seconds`);
* `preempting`: each preemptor's victims whose pods still stop (no new plan for it meanwhile);
* `preempt_tried`: the state of the cluster (the core's epoch) a preemptor last looked for a
  plan in;
* the :class:`~gpuyard.scheduler.preemption.reclaim.Reclaimer` (quota reclaim's delays and the
  quotas whose victims still stop).

A job placed, timed out or gone gives up what it claimed; a victim whose evicted Reservations
are all gone is no longer waited for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuyard.scheduler.cache.holds import Holds
from gpuyard.scheduler.preemption.reclaim import Reclaimer

__all__ = ["Claims"]

Key = tuple[str, str]


@dataclass(slots=True)
class Claims:
    """Held room, preemptors and their victims, quota reclaim (see the module docstring)."""

    reclaimer: Reclaimer = field(default_factory=Reclaimer)
    nomination_seconds: float = 300.0
    backfill_hold_seconds: float = 3600.0
    holds: Holds = field(default_factory=Holds)  # room held for nominated preemptors and the head
    preempting: dict[Key, set[Key]] = field(default_factory=dict)  # preemptor -> victims still stopping
    preempt_tried: dict[Key, int] = field(default_factory=dict)  # preemptor -> epoch of its last search

    def clear(self) -> None:
        """A re-list: nothing is held, no preemptor waits (the reclaim delays run on)."""
        self.holds = Holds()
        self.preempting.clear()
        self.preempt_tried.clear()

    def placed(self, key: Key) -> None:
        """`key` was placed: its nomination or backfill hold is used now."""
        self.holds.drop(key)
        self.preempting.pop(key, None)

    def given_up(self, key: Key) -> None:
        """`key` no longer waits (timed out): it holds and waits for nothing."""
        self.holds.drop(key)
        self.preempting.pop(key, None)
        self.preempt_tried.pop(key, None)

    def released(self, victim: Key) -> None:
        """A victim's evicted Reservations are all gone (or it is gone)."""
        self.reclaimer.released(victim)
        for owner, victims in list(self.preempting.items()):
            victims.discard(victim)
            if not victims:
                del self.preempting[owner]

    def forget(self, key: Key) -> None:
        """The PodGroup is gone: every claim of it, and on it."""
        self.given_up(key)
        self.released(key)
        self.reclaimer.forget(key)

    def next_due(self, now: float) -> float | None:
        """When the next reclaim delay ends or hold runs out, if any (the loop wakes then)."""
        times = [t for t in (self.reclaimer.next_due(now), self.holds.next_due()) if t is not None]
        return min(times) if times else None
