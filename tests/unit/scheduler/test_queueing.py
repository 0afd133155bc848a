"""The scheduling queue: priority then FIFO, parking until capacity changes, backoff."""

from __future__ import annotations

from gpuyard.scheduler.queueing import PriorityFIFOQueue


def drain(q: PriorityFIFOQueue) -> list[str]:
    out = []
    while (key := q.pop()) is not None:
        out.append(key[1])
    return out


def test_priority_then_creation_then_name():
    q = PriorityFIFOQueue()
    q.add(("ns", "late-low"), priority=0, created=20)
    q.add(("ns", "early-low"), priority=0, created=10)
    q.add(("ns", "high"), priority=5, created=30)
    q.add(("ns", "b-tie"), priority=0, created=10)
    assert drain(q) == ["high", "b-tie", "early-low", "late-low"]


def test_adding_twice_keeps_one_entry_and_a_priority_change_reorders():
    q = PriorityFIFOQueue()
    q.add(("ns", "a"), priority=0, created=1)
    q.add(("ns", "b"), priority=0, created=2)
    q.add(("ns", "a"), priority=0, created=1)
    q.add(("ns", "b"), priority=9, created=2)
    assert len(q) == 2
    assert drain(q) == ["b", "a"]


def test_parked_keys_wait_for_a_newer_epoch():
    q = PriorityFIFOQueue()
    q.park(("ns", "a"), epoch=3, priority=0, created=1)
    assert q.pop() is None and q.is_held(("ns", "a")) and q.waiting() == 1
    assert q.wake_parked(3) == 0
    assert q.wake_parked(4) == 1
    assert drain(q) == ["a"] and q.waiting() == 0


def test_backoff_releases_at_its_time_and_discard_forgets():
    q = PriorityFIFOQueue()
    q.backoff(("ns", "a"), until=10.0, priority=0, created=1)
    q.backoff(("ns", "b"), until=20.0, priority=0, created=2)
    assert q.release_due(5.0) == 10.0 and len(q) == 0
    assert q.release_due(10.0) == 20.0 and drain(q) == ["a"]
    q.discard(("ns", "b"))
    assert q.release_due(30.0) is None and q.waiting() == 0
    q.add(("ns", "c"), priority=0, created=1)
    q.park(("ns", "c"), epoch=1, priority=0, created=1)
    assert q.pop() is None  # parking removes it from the active heap
