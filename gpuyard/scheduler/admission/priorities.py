"""The running jobs indexed by priority (overall and per quota), kept up to date as jobs start,
stop and change.

Preemption asks two questions per attempt: the lowest priority any running job has (the cheap
test that ends most attempts: "nobody may be preempted"), and which running jobs of the
preemptor's quota have a priority at most the preemptor's (its candidates). Walking every
running job (or every tracked one) per attempt made an attempt cost the size of the cluster;
:class:`RunningPriorities` answers both from an index that
:class:`~gpuyard.scheduler.admission.gatekeeping.Admission` updates at the points where a job
starts or stops running (the FairQueue tells it) and where a tracked job is replaced or moves to
another quota (a new generation may carry a new priority).

A job counts as running here exactly when the FairQueue runs it and Admission tracks it, with
the priority and quota of its tracked job: the set `preempt_for` walked before.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["RunningPriorities"]

Key = tuple[str, str]
_ByPriority = dict[int, dict[Key, None]]  # priority -> its keys


def _add(by: _ByPriority, key: Key, priority: int) -> None:
    by.setdefault(priority, {})[key] = None


def _drop(by: _ByPriority, key: Key, priority: int) -> None:
    keys = by[priority]
    del keys[key]
    if not keys:
        del by[priority]


class RunningPriorities:
    """Running jobs by priority and quota: `set(key, priority, quota)` (priority None: not
    running), `lowest`, `at_most`."""

    __slots__ = ("_by", "_in", "_of")

    def __init__(self) -> None:
        self._of: dict[Key, tuple[int, str]] = {}  # key -> (priority, quota)
        self._by: _ByPriority = {}
        self._in: dict[str, _ByPriority] = {}  # per quota

    def __len__(self) -> int:
        return len(self._of)

    def __contains__(self, key: object) -> bool:
        return key in self._of

    def set(self, key: Key, priority: int | None, quota: str = "") -> None:
        """`key` runs with `priority` in `quota` now, or (priority None) does not run."""
        old = self._of.get(key)
        new = (priority, quota) if priority is not None else None
        if old == new:
            return
        if old is not None:
            del self._of[key]
            _drop(self._by, key, old[0])
            _drop(self._in[old[1]], key, old[0])
            if not self._in[old[1]]:
                del self._in[old[1]]
        if new is not None:
            self._of[key] = new
            _add(self._by, key, new[0])
            _add(self._in.setdefault(new[1], {}), key, new[0])

    def clear(self) -> None:
        self._of.clear()
        self._by.clear()
        self._in.clear()

    def lowest(self) -> int | None:
        """The lowest priority among running jobs; None when none runs."""
        return min(self._by) if self._by else None

    def at_most(self, priority: int, *, equal: bool = True, quota: str | None = None) -> Iterator[Key]:
        """Running jobs (of `quota` only, when given) with a priority below `priority`, or equal
        to it with `equal`; lowest priority first."""
        by = self._by if quota is None else self._in.get(quota, {})
        for p in sorted(by):
            if p > priority or (p == priority and not equal):
                break
            yield from list(by[p])

    def items(self) -> Iterator[tuple[Key, tuple[int, str]]]:
        """(key, (priority, quota)) of every running job."""
        return iter(self._of.items())
