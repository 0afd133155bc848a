"""Room held for one waiting gang, so that no other job takes it: nomination and backfill.

Two decisions of the cycle set room aside for a gang that cannot start yet:

* **nomination** (kube-scheduler's `nominatedNodeName`, at gang level): after preempting victims
  for a gang, the room its planned placement takes on each node is held for it until it is
  placed or `scheduler.nomination_seconds` pass. The victims' pods are still stopping, so the
  room frees only gradually; without the hold a smaller job would take it first;
* **backfill** (EASY, with a time-bounded reservation): the protected head of the queue that
  does not fit on the real nodes now holds, on the nodes of its *planned placement* (where it
  would run once the jobs there end), the free room that placement needs; other jobs may use
  any other room (they "backfill"), and a job expected to end before the head's shadow time may
  use the held room too. The hold lasts while the job stays the head, at most
  `scheduler.backfill_hold_seconds` after it was last planned.

A :class:`Hold` is plain data: per node the GPUs, milli-CPU and MiB it keeps free. The cycle
turns the holds of every *other* gang into three int arrays over the snapshot's rows (`arrays`)
and the `held-room` filter subtracts them from the free room (`filter_plugins.HeldRoom`), so a
gang never sees room held for another, and its own holds never stand in its way.

Room is held only against jobs *behind* its owner: a hold whose owner has a lower priority than
the job being placed, or the same priority and a later submit time, does not apply to it
(kube-scheduler considers only nominated pods of equal or higher priority; a job failed over
keeps its submit time, so a head chosen while it ran does not stand in its way). Without that rule two holds can block each other for good: a preempted
job that became its queue's head holds the room its preemptor was nominated to, and each waits
for the other.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["HeldArrays", "Hold", "Holds"]

Key = tuple[str, str]
HeldArrays = tuple[np.ndarray, np.ndarray, np.ndarray]
"""int64[N] each: GPUs, milli-CPU and MiB of memory held on every row."""


@dataclass(slots=True)
class Hold:
    """Room kept free for `owner` (see the module docstring)."""

    owner: Key
    cause: str  # "nomination" | "backfill"
    nodes: dict[str, tuple[int, int, int]]  # node -> (GPUs, milli-CPU, MiB)
    until: float
    shadow: float | None = None  # backfill: a job expected to end by then may use the room
    message: str = ""
    priority: int = 0  # the owner's: the hold applies only to jobs of this priority or lower
    submitted: float = 0.0  # the owner's submit time: at equal priority, only to later jobs
    queue: str = ""  # the owner's queue: at equal priority, a job of a queue ahead by fair share passes

    def describe(self) -> str:
        """ "3 GPUs on n1" — what is held, for the owner's own status message."""
        parts = [
            f"{g} GPU{'s' if g != 1 else ''} on {node}" for node, (g, _, _) in sorted(self.nodes.items()) if g
        ]
        if not parts:
            parts = [f"CPU/memory on {', '.join(sorted(self.nodes))}"]
        return ", ".join(parts)


@dataclass(slots=True)
class Holds:
    """Every gang's held room; `released` grows whenever room is given back (the core's epoch)."""

    by_owner: dict[Key, Hold] = field(default_factory=dict)
    released: int = 0
    version: int = 0

    def __len__(self) -> int:
        return len(self.by_owner)

    def get(self, owner: Key) -> Hold | None:
        return self.by_owner.get(owner)

    def set(self, hold: Hold) -> None:
        old = self.by_owner.get(hold.owner)
        if (
            old is not None
            and old.nodes == hold.nodes
            and old.cause == hold.cause
            and old.priority == hold.priority
            and old.submitted == hold.submitted
        ):
            old.until = max(old.until, hold.until)
            old.shadow, old.message = hold.shadow, hold.message
            return
        self.by_owner[hold.owner] = hold
        self.version += 1
        if old is not None:
            self.released += 1

    def drop(self, owner: Key) -> Hold | None:
        hold = self.by_owner.pop(owner, None)
        if hold is not None:
            self.version += 1
            self.released += 1
        return hold

    def drop_cause(self, cause: str, *, keep: Key | None = None) -> None:
        """Give back every hold of `cause` but `keep`'s (a new head replaces the old one)."""
        for owner in [o for o, h in self.by_owner.items() if h.cause == cause and o != keep]:
            self.drop(owner)

    def expire(self, now: float) -> list[Hold]:
        gone = [h for h in self.by_owner.values() if h.until <= now]
        for hold in gone:
            self.drop(hold.owner)
        return gone

    def next_due(self) -> float | None:
        return min((h.until for h in self.by_owner.values()), default=None)

    def arrays(
        self,
        rows: Mapping[str, int],
        n: int,
        *,
        exclude: Collection[Key],
        ends_at: float | None = None,
        priority: int | None = None,
        submitted: float | None = None,
        queue: str | None = None,
        share: Callable[[str], float] | None = None,
    ) -> HeldArrays | None:
        """The room held for gangs other than `exclude`, per row; None when nothing is held.

        `ends_at`: when the job being placed is expected to end; backfill holds whose shadow
        time it ends before do not apply to it (EASY backfill). `priority`, `submitted` and
        `queue`: the job's; holds of owners not ahead of it in the queue order (lower priority; at
        equal priority, another queue behind by fair share, `share`; in the same queue, submitted
        later) do not apply to it."""
        out: HeldArrays | None = None
        for owner, hold in self.by_owner.items():
            if owner in exclude:
                continue
            if priority is not None and not _ahead(hold, priority, submitted, queue=queue, share=share):
                continue
            if hold.shadow is not None and ends_at is not None and ends_at <= hold.shadow:
                continue
            for node, (gpus, cpu, mem) in hold.nodes.items():
                row = rows.get(node)
                if row is None or row >= n:
                    continue
                if out is None:
                    out = (np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64))
                out[0][row] += gpus
                out[1][row] += cpu
                out[2][row] += mem
        return out


def _ahead(
    hold: Hold,
    priority: int,
    submitted: float | None,
    *,
    queue: str | None = None,
    share: Callable[[str], float] | None = None,
) -> bool:
    """Whether the hold's owner is ahead of a job of `priority`, submitted at `submitted` to
    `queue`. A backfill hold follows the order the queues are walked (`FairQueue.order`: the
    queues by fair share, then priority, then submit time); a nomination after preemption
    follows priority first (its victims were evicted for it: a lower-priority job of a queue
    ahead by fair share must not take their room)."""
    other_queue = share is not None and queue is not None and bool(hold.queue) and hold.queue != queue
    if hold.cause == "backfill" and other_queue:
        assert share is not None and queue is not None
        return (share(hold.queue), hold.queue) <= (share(queue), queue)
    if hold.priority != priority:
        return hold.priority > priority
    if other_queue:
        assert share is not None and queue is not None
        return (share(hold.queue), hold.queue) <= (share(queue), queue)
    return submitted is None or hold.submitted <= submitted
