"""The scheduler's synchronous core driven with plain data: changes in, decisions out, no event loop.

:class:`Cluster` plays the store and the writer: it applies the decisions as the API server would
(uids, resourceVersions, generation only on spec changes) and hands back the changes the watch
would deliver.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

from gpuyard.apis.core import GPU_RESOURCE
from gpuyard.apis.meta import Resource
from gpuyard.apis.quotakinds import ElasticQuota
from gpuyard.scheduler.core import SchedulerState
from gpuyard.scheduler.decisions import (
    Change,
    CreateFailed,
    DeleteReservation,
    PatchStatus,
    PlaceGang,
    RecordEvent,
    RescheduleRequested,
    WriteFailed,
)
from gpuyard.scheduler.placement.profiles import build_profile
from tests.unit.scheduler.helpers import make_node, podgroup, role

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PREFIX = "quota.scheduling.koordinator.sh"


class Cluster:
    """Objects as a store holds them, and a writer over them that reports changes."""

    def __init__(self, *objects: Resource) -> None:
        self.objects: dict[tuple[str, str, str], Resource] = {}
        self.rv = itertools.count(1)
        self.changes: list[Change] = []
        for obj in objects:
            self.put(obj)
        self.changes.clear()

    def put(self, obj: Resource, *, spec_changed: bool = True) -> Resource:
        key = (obj.kind, obj.metadata.namespace, obj.metadata.name)
        old = self.objects.get(key)
        meta = obj.metadata.model_copy(
            update={
                "uid": old.metadata.uid if old is not None else (obj.metadata.uid or f"uid-{next(self.rv)}"),
                "resource_version": str(next(self.rv)),
                "generation": (old.metadata.generation + spec_changed) if old is not None else 1,
            }
        )
        stored = obj.model_copy(update={"metadata": meta})
        self.objects[key] = stored
        self.changes.append(Change("MODIFIED" if old is not None else "ADDED", stored))
        return stored

    def get(self, kind: str, ns: str, name: str) -> Any:
        return self.objects.get((kind, ns, name))

    def delete(self, kind: str, ns: str, name: str) -> None:
        old = self.objects.pop((kind, ns, name))
        self.changes.append(Change("DELETED", old))

    def take(self) -> list[Change]:
        out, self.changes = self.changes, []
        return out

    def execute(self, decisions: list) -> None:
        for d in decisions:
            if isinstance(d, PlaceGang):
                for res in d.reservations:
                    self.put(res)
                self.execute(d.then)
            elif isinstance(d, PatchStatus):
                obj = self.get(d.kind, d.namespace, d.name)
                status = obj.status.model_copy(update=d.changes)
                self.put(obj.model_copy(update={"status": status}), spec_changed=False)
            elif isinstance(d, DeleteReservation):
                res = self.get("Reservation", d.namespace, d.name)
                if res is not None and (not d.uid or res.metadata.uid == d.uid):
                    self.delete("Reservation", d.namespace, d.name)

    def spec(self, kind: str, ns: str, name: str, change) -> None:  # type: ignore[no-untyped-def]
        copy = self.get(kind, ns, name).clone()
        change(copy)
        self.put(copy)


def core(cluster: Cluster, **options: Any) -> SchedulerState:
    state = SchedulerState(profile=build_profile("default"), port_range=(20000, 20100), **options)
    by_kind: dict[str, list[Resource]] = {k: [] for k in ("Node", "Reservation", "PodGroup", "ResourceClass")}
    for (kind, _, _), obj in cluster.objects.items():
        by_kind.setdefault(kind, []).append(obj)
    state.load(by_kind, now=0.0, utcnow=T0)
    return state


def step(state: SchedulerState, cluster: Cluster, *, now: float = 0.0) -> list:
    """Changes in, one full walk, decisions out (and written)."""
    state.apply(cluster.take())
    out = state.step(now=now, utcnow=T0, limit=10_000)
    cluster.execute(out)
    return out


def of(kind: type, decisions: list) -> list:
    flat = []
    for d in decisions:
        flat.append(d)
        if isinstance(d, PlaceGang):
            flat.extend(d.then)
    return [d for d in flat if isinstance(d, kind)]


def test_a_gang_is_assumed_when_decided_so_the_next_job_sees_the_gpus_taken() -> None:
    cluster = Cluster(
        make_node("n1", gpus=8), podgroup("a", role(replicas=2, gpus=4)), podgroup("b", role(gpus=4))
    )
    state = core(cluster)
    out = state.step(now=0.0, utcnow=T0, limit=10_000)
    (placed,) = of(PlaceGang, out)
    assert placed.key == ("default", "a") and [r.metadata.name for r in placed.reservations] == [
        "a-worker-0",
        "a-worker-1",
    ]
    assert state.cache.snapshot.reservation_count == 2  # assumed before anything was written
    (status,) = [p for p in of(PatchStatus, placed.then) if p.name == "a"]
    assert status.changes["phase"] == "Placed" and status.changes["placed"] == 2
    assert [e.reason for e in of(RecordEvent, placed.then)] == ["Scheduled"]
    b = [p for p in of(PatchStatus, out) if p.name == "b"]
    assert b and b[0].changes["reason"] == "Unschedulable"


def test_the_echo_of_its_own_writes_decides_nothing() -> None:
    cluster = Cluster(make_node("n1", gpus=8), podgroup("a", role(gpus=4)))
    state = core(cluster)
    step(state, cluster)
    assert step(state, cluster) == []  # the Reservation ADDED and the status-only PodGroup write
    assert state.cache.snapshot.reservation_count == 1 and state.placed_jobs == 1


def test_a_failed_create_is_un_assumed_and_backed_off() -> None:
    cluster = Cluster(make_node("n1", gpus=8), podgroup("a", role(replicas=2, gpus=4)))
    state = core(cluster)
    (placed,) = of(PlaceGang, state.step(now=0.0, utcnow=T0))
    out = state.apply([CreateFailed(placed, "disk full")])
    assert state.cache.snapshot.reservation_count == 0 and state.placed_jobs == 0
    (status,) = of(PatchStatus, out)
    assert status.changes["reason"] == "AssumeFailed" and "disk full" in status.changes["message"]
    assert state.queue.is_held(("default", "a"))
    ready, due = state.next_due(0.0)
    assert not ready and due == 0.5
    assert state.next_due(0.5)[0]  # the backoff ended: ready again
    assert of(PlaceGang, state.step(now=0.5, utcnow=T0))


def test_a_release_deletes_exactly_that_reservation_and_the_pod_is_placed_again() -> None:
    cluster = Cluster(make_node("n1", gpus=8), podgroup("a", role(replicas=2, gpus=4)))
    state = core(cluster)
    step(state, cluster)
    step(state, cluster)
    old = cluster.get("Reservation", "default", "a-worker-1")
    cluster.spec("PodGroup", "default", "a", lambda pg: pg.spec.release.update({"a-worker-0": "not-its-uid"}))
    assert of(DeleteReservation, step(state, cluster)) == []  # another uid: not that Reservation
    cluster.spec(
        "PodGroup", "default", "a", lambda pg: pg.spec.release.update({"a-worker-1": old.metadata.uid})
    )
    out = step(state, cluster)
    # the room is free when the deletion is decided and the replica is still wanted: it is
    # placed again, written after the deletion
    assert out[0] == DeleteReservation("default", "a-worker-1", old.metadata.uid)
    (again,) = of(PlaceGang, out)
    assert [r.metadata.name for r in again.reservations] == ["a-worker-1"]
    step(state, cluster)
    new = cluster.get("Reservation", "default", "a-worker-1")
    assert new.metadata.uid != old.metadata.uid
    assert step(state, cluster) == []  # the stale release entry names the old uid: nothing to do


def test_the_reservations_of_a_deleted_podgroup_are_collected() -> None:
    cluster = Cluster(make_node("n1", gpus=8), podgroup("a", role(replicas=2, gpus=4)))
    state = core(cluster)
    step(state, cluster)
    cluster.delete("PodGroup", "default", "a")
    assert sorted(d.name for d in of(DeleteReservation, step(state, cluster))) == ["a-worker-0", "a-worker-1"]
    step(state, cluster)
    assert (
        state.cache.snapshot.reservation_count == 0
        and cluster.get("Reservation", "default", "a-worker-0") is None
    )


def test_orphans_found_at_start_are_collected() -> None:
    cluster = Cluster(make_node("n1", gpus=8), podgroup("a", role(gpus=4)))
    state = core(cluster)
    step(state, cluster)
    cluster.delete("PodGroup", "default", "a")
    cluster.take()
    state = core(cluster)  # a restart while the PodGroup was gone
    assert [d.name for d in of(DeleteReservation, step(state, cluster))] == ["a-worker-0"]


def test_a_suspended_podgroup_gets_no_placement() -> None:
    cluster = Cluster(make_node("n1", gpus=8), podgroup("s", role(gpus=1), suspend=True))
    state = core(cluster)
    out = step(state, cluster)
    assert of(PlaceGang, out) == []
    assert cluster.get("PodGroup", "default", "s").status.phase == "Suspended"
    cluster.spec("PodGroup", "default", "s", lambda pg: setattr(pg.spec, "suspend", False))
    assert of(PlaceGang, step(state, cluster))


def _quota(name: str, gmin: int, gmax: int) -> ElasticQuota:
    return ElasticQuota.model_validate(
        {
            "metadata": {
                "name": name,
                "namespace": name,
                "labels": {f"{PREFIX}/allow-lent-resource": "true"},
            },
            "spec": {
                "min": {GPU_RESOURCE: str(gmin)},
                "max": {GPU_RESOURCE: str(gmax)},
                "namespaces": [name],
            },
        }
    )


def test_reclaim_asks_for_evictions_and_keeps_the_room_until_released() -> None:
    cluster = Cluster(
        make_node("n1", gpus=8),
        make_node("n2", gpus=8),
        _quota("a", 8, 16),
        _quota("b", 8, 16),
        podgroup("b0", role(gpus=8, cpu=None, memory=None), namespace="b"),
    )
    state = core(cluster)
    out = step(state, cluster)
    quota_b = [d for d in of(PatchStatus, out) if d.kind == "ElasticQuota" and d.name == "b"]
    assert quota_b and quota_b[0].changes["used"] == {GPU_RESOURCE: 8}  # statuses are decisions too
    cluster.put(podgroup("b1", role(gpus=8, cpu=None, memory=None), namespace="b"))
    step(state, cluster, now=1.0)
    step(state, cluster, now=1.0)
    assert state.cache.snapshot.reservation_count == 2  # b borrows a's idle min
    cluster.put(podgroup("a0", role(gpus=8, cpu=None, memory=None), namespace="a"))
    out = step(state, cluster, now=2.0)
    assert of(DeleteReservation, out) == [] and of(PlaceGang, out) == []  # the victim keeps its room
    b1 = cluster.get("PodGroup", "b", "b1")
    assert b1.status.evictions == {"b1-worker-0": b1.status.message}
    assert (b1.status.phase, b1.status.reason) == ("Pending", "Preempted")
    assert {e.reason for e in of(RecordEvent, out)} >= {"Preempted", "Reclaiming"}
    out = step(state, cluster, now=3.0)
    assert of(PlaceGang, out) == [] and not [d for d in of(PatchStatus, out) if d.name == "b1"]
    # the operator stopped the pod and releases its Reservation
    uid = cluster.get("Reservation", "b", "b1-worker-0").metadata.uid
    cluster.spec("PodGroup", "b", "b1", lambda pg: pg.spec.release.update({"b1-worker-0": uid}))
    out = step(state, cluster, now=4.0)
    assert of(DeleteReservation, out) == [DeleteReservation("b", "b1-worker-0", uid)]
    assert [g.key for g in of(PlaceGang, out)] == [("a", "a0")]  # the room went to the owner
    assert cluster.get("PodGroup", "b", "b1").status.evictions == {}
    step(state, cluster, now=5.0)
    assert state.cache.snapshot.reservation_count == 2


def test_a_failed_deletion_holds_the_room_again_and_is_retried() -> None:
    cluster = Cluster(make_node("n1", gpus=8), podgroup("a", role(replicas=2, gpus=4)))
    state = core(cluster)
    step(state, cluster)
    step(state, cluster)
    old = cluster.get("Reservation", "default", "a-worker-1")
    cluster.spec(
        "PodGroup", "default", "a", lambda pg: pg.spec.release.update({"a-worker-1": old.metadata.uid})
    )
    state.apply(cluster.take())
    delete, place_again, *_ = state.step(now=0.0, utcnow=T0)
    assert isinstance(delete, DeleteReservation) and isinstance(place_again, PlaceGang)
    state.apply(  # the deletion was refused, so the name is still taken
        [WriteFailed(delete), CreateFailed(place_again, "a-worker-1 already exists")]
    )
    assert state.cache.snapshot.reservation_count == 2  # the old Reservation holds its room again
    out = state.step(now=1.0, utcnow=T0)
    assert of(DeleteReservation, out) == [DeleteReservation("default", "a-worker-1", old.metadata.uid)]


def test_quota_used_is_left_to_a_gang_scheduler_that_maintains_it() -> None:
    """Delegate mode to Koordinator or scheduler-plugins: their controller writes ElasticQuota
    `status.used`; gpuyard writes runtime and request only (one writer per field)."""
    from gpuyard.scheduler.running import quota_used_elsewhere
    from gpuyard.state.config import SchedulerConfig

    assert quota_used_elsewhere(SchedulerConfig(mode="delegate", gang_scheduler="koordinator"))
    assert quota_used_elsewhere(SchedulerConfig(mode="delegate", gang_scheduler="coscheduling"))
    assert not quota_used_elsewhere(SchedulerConfig(mode="delegate", gang_scheduler="volcano"))
    assert not quota_used_elsewhere(SchedulerConfig())
    for writes_used in (True, False):
        cluster = Cluster(
            make_node("n1", gpus=8),
            _quota("b", 8, 16),
            podgroup("b0", role(gpus=8, cpu=None, memory=None), namespace="b"),
        )
        out = step(core(cluster, writes_quota_used=writes_used), cluster)
        (status,) = [d for d in of(PatchStatus, out) if d.kind == "ElasticQuota" and d.name == "b"]
        assert ("used" in status.changes) is writes_used
        assert "runtime" in status.changes and "request" in status.changes


def _moving(gpu_failed: bool) -> tuple[SchedulerState, Cluster]:
    """Job a's two 8-GPU pods fill n1 and n2; then a-worker-0 must move off its node (released,
    with that node as its preferred node), either because GPU 3 of it failed (then it cannot be
    placed: 7 healthy GPUs there, the other node full) or, with the node healthy, for another
    reason (e.g. its host ports)."""
    cluster = Cluster(
        make_node("n1", gpus=8), make_node("n2", gpus=8), podgroup("a", role(replicas=2, gpus=8))
    )
    state = core(cluster)
    step(state, cluster)
    step(state, cluster)
    placed = cluster.get("Reservation", "default", "a-worker-0")
    node = placed.spec.node
    if gpu_failed:
        cluster.spec(
            "Node", "", node, lambda n: n.metadata.annotations.update({"gpuyard.io/unhealthy-gpus": "3"})
        )

    def move(pg: Any) -> None:
        pg.spec.release["a-worker-0"] = placed.metadata.uid
        pg.spec.preferred_nodes["a-worker-0"] = node

    cluster.spec("PodGroup", "default", "a", move)
    return state, cluster


def test_a_job_moving_off_a_failed_gpu_says_so_before_any_other_reason() -> None:
    """The most fundamental reason wins: the failed GPU its pod must move off, not the room."""
    state, cluster = _moving(gpu_failed=True)
    node = cluster.get("PodGroup", "default", "a").spec.preferred_nodes["a-worker-0"]
    out = step(state, cluster)
    (status,) = [p for p in of(PatchStatus, out) if p.name == "a" and "reason" in p.changes]
    assert status.changes["reason"] == "NodeFault"
    assert status.changes["message"].startswith(f"pod a-worker-0 must move off {node} (GPU 3 unhealthy); ")
    assert status.changes["phase"] == "Placed" and status.changes["placed"] == 1  # the other pod runs on


def test_a_pod_moving_off_a_healthy_node_is_no_fault() -> None:
    """Moving for another reason (host ports), off a healthy node: placed again, its room free."""
    state, cluster = _moving(gpu_failed=False)
    out = step(state, cluster)
    (again,) = of(PlaceGang, out)
    assert [r.metadata.name for r in again.reservations] == ["a-worker-0"]
    (status,) = [p for p in of(PatchStatus, out) if p.name == "a" and "reason" in p.changes]
    assert status.changes["reason"] == "Placed" and "must move" not in status.changes["message"]


def test_a_reschedule_request_is_a_stimulus_answered_at_the_next_step() -> None:
    """Without a rescheduler the request is answered at once; with one, at the next step."""
    cluster = Cluster(make_node("n1", gpus=8), podgroup("a", role(gpus=4)))
    state = core(cluster)
    answers: list[dict[str, Any]] = []
    assert state.apply([RescheduleRequested(True, answers.append)]) == []
    assert answers and "error" in answers[0]
    from gpuyard.scheduler.rescheduling.rescheduler import Rescheduler
    from gpuyard.state.config import Settings

    state.rescheduler = Rescheduler(Settings().scheduler.rescheduler)
    answers.clear()
    state.apply([RescheduleRequested(True, answers.append)])
    assert answers == []  # not yet: the core acts on stimuli when stepped
    step(state, cluster)
    assert len(answers) == 1 and "error" not in answers[0]


def test_a_bug_in_placement_is_never_reported_as_the_jobs_invalid_request(monkeypatch: Any) -> None:
    """Only a request error (`RequestError`) is the job's fault; a ValueError from a bug is
    logged and the job backed off, its status never saying "InvalidRequest"."""
    import gpuyard.scheduler.cycle.attempting as attempting

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("a bug in a plugin")

    monkeypatch.setattr(attempting, "place", broken)
    cluster = Cluster(make_node("n1", gpus=8), podgroup("a", role(gpus=4)))
    state = core(cluster)
    out = step(state, cluster)
    assert [p for p in of(PatchStatus, out) if p.changes.get("reason") == "InvalidRequest"] == []
    assert state.queue.is_held(("default", "a"))  # backed off, tried again later
