"""scheduleTimeoutSeconds in the scheduler core: a gang not placed in time is failed.

Virtual time moves both clocks the core reads (`now` and `utcnow`) together, as the loop does.
"""

from __future__ import annotations

from datetime import timedelta

from gpuyard.scheduler.core import SchedulerState
from gpuyard.scheduler.decisions import PlaceGang, RecordEvent
from tests.unit.scheduler.helpers import make_node, podgroup, role
from tests.unit.scheduler.test_core import T0, Cluster, core, of


def at(state: SchedulerState, cluster: Cluster, seconds: float) -> list:
    state.apply(cluster.take())
    out = state.step(now=seconds, utcnow=T0 + timedelta(seconds=seconds), limit=10_000)
    cluster.execute(out)
    return out


def full_cluster() -> Cluster:
    """One 8-GPU node, all of it taken by `big`."""
    return Cluster(make_node("n1", gpus=8), podgroup("big", role(gpus=8)))


def test_a_gang_not_placed_in_time_fails_naming_the_timeout_and_why_it_waited() -> None:
    cluster = full_cluster()
    state = core(cluster)
    at(state, cluster, 0.0)
    cluster.put(podgroup("late", role(gpus=4), scheduleTimeoutSeconds=60))
    at(state, cluster, 1.0)
    pg = cluster.get("PodGroup", "default", "late")
    assert pg.status.phase == "Pending" and pg.status.queued_at == T0 + timedelta(seconds=1)
    ready, when = state.next_due(2.0)
    assert not ready and when is not None and when <= 61.0  # the loop wakes for it without an event
    assert state.next_due(61.0)[0]
    at(state, cluster, 30.0)
    assert cluster.get("PodGroup", "default", "late").status.phase == "Pending"
    out = at(state, cluster, 61.0)
    status = cluster.get("PodGroup", "default", "late").status
    assert (status.phase, status.reason) == ("Failed", "ScheduleTimeout")
    assert "scheduleTimeoutSeconds=60" in status.message and "GPU" in status.message
    assert [e.reason for e in of(RecordEvent, out)] == ["ScheduleTimeout"]
    # room freed later does not place a failed gang
    cluster.delete("PodGroup", "default", "big")
    for res in [o for (k, _, _), o in list(cluster.objects.items()) if k == "Reservation"]:
        cluster.delete("Reservation", res.metadata.namespace, res.metadata.name)
    assert of(PlaceGang, at(state, cluster, 62.0)) == []
    assert ("default", "late") not in state.admission.jobs


def test_a_gang_placed_in_time_is_unaffected() -> None:
    cluster = Cluster(make_node("n1", gpus=8))
    state = core(cluster)
    cluster.put(podgroup("quick", role(gpus=4), scheduleTimeoutSeconds=5))
    assert of(PlaceGang, at(state, cluster, 0.0))
    at(state, cluster, 100.0)
    status = cluster.get("PodGroup", "default", "quick").status
    assert status.phase == "Placed"
    assert not state.memo.deadlines.at


def test_without_a_timeout_a_gang_waits_for_ever() -> None:
    cluster = full_cluster()
    state = core(cluster)
    at(state, cluster, 0.0)
    cluster.put(podgroup("patient", role(gpus=4)))
    at(state, cluster, 1.0)
    at(state, cluster, 100_000.0)
    assert cluster.get("PodGroup", "default", "patient").status.phase == "Pending"


def test_a_suspended_gangs_clock_restarts_on_resume() -> None:
    cluster = full_cluster()
    state = core(cluster)
    at(state, cluster, 0.0)
    cluster.put(podgroup("s", role(gpus=4), scheduleTimeoutSeconds=60))
    at(state, cluster, 1.0)
    cluster.spec("PodGroup", "default", "s", lambda pg: setattr(pg.spec, "suspend", True))
    at(state, cluster, 50.0)
    assert cluster.get("PodGroup", "default", "s").status.phase == "Suspended"
    at(state, cluster, 200.0)  # suspended past its timeout: nothing happens
    assert cluster.get("PodGroup", "default", "s").status.phase == "Suspended"
    cluster.spec("PodGroup", "default", "s", lambda pg: setattr(pg.spec, "suspend", False))
    at(state, cluster, 300.0)
    status = cluster.get("PodGroup", "default", "s").status
    assert status.phase == "Pending" and status.queued_at == T0 + timedelta(seconds=300)
    at(state, cluster, 350.0)
    assert cluster.get("PodGroup", "default", "s").status.phase == "Pending"
    at(state, cluster, 361.0)
    assert cluster.get("PodGroup", "default", "s").status.reason == "ScheduleTimeout"


def test_the_deadline_survives_a_relist() -> None:
    cluster = full_cluster()
    state = core(cluster)
    at(state, cluster, 0.0)
    cluster.put(podgroup("late", role(gpus=4), scheduleTimeoutSeconds=60))
    at(state, cluster, 1.0)
    # a new leader lists everything 40 s later: the gang keeps its queuedAt, not a fresh minute
    fresh = core(cluster)
    cluster.take()
    fresh.step(now=41.0, utcnow=T0 + timedelta(seconds=41), limit=10_000)
    out = fresh.step(now=62.0, utcnow=T0 + timedelta(seconds=62), limit=10_000)
    cluster.execute(out)
    assert cluster.get("PodGroup", "default", "late").status.phase == "Failed"
