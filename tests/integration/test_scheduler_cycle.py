"""The scheduling loop on an in-memory store and a virtual clock: assume, explain, requeue, un-assume."""

from __future__ import annotations

import asyncio

import pytest

from gpuyard.apis.scheduling import PodGroup
from gpuyard.devices.scenarios import load_scenario
from gpuyard.fakecluster import FakeCluster
from gpuyard.scheduler import SchedulerLoop, components
from gpuyard.state.clock import VirtualClock
from gpuyard.state.config import Settings
from gpuyard.state.context import Context
from gpuyard.state.kinds import register_kinds
from gpuyard.state.store import Store, StoreError
from gpuyard.state.workqueues import ControllerRunner
from tests.unit.scheduler.helpers import make_node, podgroup, role


class Running:
    """A context with the scheduler (and the default-class reconciler) running."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.loop, classes, *_ = components(ctx)
        self.tasks = [
            asyncio.create_task(self.loop.run(), name="test-scheduler"),
            asyncio.create_task(
                ControllerRunner(classes, store=ctx.store, clock=ctx.clock).run(), name="test-classes"
            ),
        ]

    async def settle(self, seconds: float = 0.01) -> None:
        await self.ctx.clock.advance(seconds)

    def pg(self, name: str, ns: str = "default") -> PodGroup:
        return self.store.must_get("PodGroup", ns, name)  # type: ignore[return-value]

    def reservations(self, name: str, ns: str = "default") -> dict[str, object]:
        return {
            r.metadata.name: r
            for r in self.store.list("Reservation", namespace=ns)
            if r.spec.pod_group == name
        }

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def release(sched: Running, group: str, *pods: str, ns: str = "default") -> None:
    """What the operator does when it no longer needs pods' Reservations: `spec.release`."""
    uids = {p: sched.store.must_get("Reservation", ns, p).metadata.uid for p in pods}
    sched.store.mutate("PodGroup", ns, group, lambda pg: pg.spec.release.update(uids))


@pytest.fixture
async def sched():
    ctx = Context.for_tests()
    for name, model in (("v1", "v100"), ("v2", "v100"), ("k1", "k80")):
        ctx.store.create(make_node(name, gpus=8, model=model))
    running = Running(ctx)
    await running.settle()
    yield running
    await running.stop()


async def test_a_job_is_placed_recorded_and_announced(sched):
    sched.store.create(podgroup("train", role(replicas=2, gpus=4, resource="nvidia.v100", host_ports=1)))
    await sched.settle()
    pg = sched.pg("train")
    assert (pg.status.phase, pg.status.reason, pg.status.placed) == ("Placed", "Placed", 2)
    assert pg.status.placed_at is not None and pg.status.queued_at is not None
    res = sched.reservations("train")
    assert sorted(res) == ["train-worker-0", "train-worker-1"]
    r0 = res["train-worker-0"]
    assert (
        r0.spec.node in ("v1", "v2")
        and len(r0.spec.gpus) == 4
        and r0.spec.gpu_ids[0].startswith(f"GPU-{r0.spec.node}-")
    )
    assert r0.metadata.labels == {"job-name": "train", "replica-type": "worker", "replica-index": "0"}
    assert r0.spec.local_peers == ["train-worker-1"] and len(r0.spec.host_ports) == 1
    assert r0.metadata.owner_references[0].kind == "PodGroup"
    event = sched.store.get("Event", "default", "train.scheduled")
    assert (
        event.reason == "Scheduled"
        and event.involved_object["name"] == "train"
        and event.message.startswith("placed 2 pods on 1 node")
    )
    assert {c.metadata.name for c in sched.store.list("ResourceClass")} == {"nvidia.v100", "nvidia.k80"}


async def test_a_gang_that_does_not_fit_holds_nothing_explains_and_is_placed_when_room_appears(sched):
    sched.store.create(podgroup("big", role(replicas=3, gpus=8, resource="nvidia.v100")))
    await sched.settle()
    pg = sched.pg("big")
    assert pg.status.phase == "Pending" and pg.status.reason == "Unschedulable"
    assert pg.status.message == (
        "can never fit: asks 24 nvidia.v100, the cluster has 16; "
        "Worker: 3 pods of 8 GPUs of class nvidia.v100, 1 CPU, 1Gi memory must be placed together; "
        "at most 2 of 3 fit now on 2 nodes (the most on one node: 1, limited by node-resources); "
        "the other nodes: 1 node has no GPUs of class nvidia.v100."
    )
    assert sched.reservations("big") == {}
    warning = sched.store.get("Event", "default", "big.failedscheduling")
    assert warning.type == "Warning" and warning.count == 1
    await sched.settle(5)
    assert (
        sched.store.get("Event", "default", "big.failedscheduling").count == 1
    )  # parked: not retried for nothing
    sched.store.create(make_node("v3", gpus=8, model="v100"))
    await sched.settle()
    assert sched.pg("big").status.phase == "Placed"
    assert sorted(r.spec.node for r in sched.reservations("big").values()) == ["v1", "v2", "v3"]


async def test_a_failed_write_un_assumes_and_retries_after_a_backoff(sched, monkeypatch):
    real_create = sched.store.create
    calls = {"n": 0}

    def flaky(obj):
        if obj.kind == "Reservation":
            calls["n"] += 1
            if calls["n"] == 2:
                raise StoreError("disk full")
        return real_create(obj)

    monkeypatch.setattr(sched.store, "create", flaky)
    sched.store.create(podgroup("j", role(replicas=2, gpus=4)))
    await sched.settle()
    pg = sched.pg("j")
    assert pg.status.reason == "AssumeFailed" and "disk full" in pg.status.message
    assert sched.reservations("j") == {}  # the first reservation was deleted again
    assert sched.loop.snapshot.reservation_count == 0
    await sched.settle(1)  # the backoff (0.5 s) ends
    assert sched.pg("j").status.phase == "Placed" and len(sched.reservations("j")) == 2


async def test_released_reservations_are_placed_again_with_a_new_port(sched):
    sched.store.create(podgroup("hn", role(replicas=2, gpus=1, host_ports=1)))
    await sched.settle()
    old = sched.reservations("hn")["hn-worker-1"]
    release(sched, "hn", "hn-worker-1")  # the operator: this pod must move
    await sched.settle()
    new = sched.reservations("hn")["hn-worker-1"]
    assert new.metadata.uid != old.metadata.uid
    if new.spec.node == old.spec.node:
        assert new.spec.host_ports != old.spec.host_ports
    assert sched.pg("hn").status.phase == "Placed" and sched.pg("hn").status.placed == 2


async def test_all_reservations_deleted_sends_the_job_back_to_pending_until_placed(sched):
    sched.store.create(podgroup("j", role(replicas=1, gpus=8)))
    await sched.settle()
    for name in list(sched.reservations("j")):  # gone without a release (deleted by hand)
        sched.store.delete("Reservation", "default", name)
    await sched.settle()
    assert sched.pg("j").status.phase == "Placed" and len(sched.reservations("j")) == 1


async def test_a_suspended_job_keeps_nothing_once_released_and_is_placed_again_on_resume(sched):
    sched.store.create(podgroup("s", role(replicas=2, gpus=4)))
    await sched.settle()
    sched.store.mutate("PodGroup", "default", "s", lambda pg: setattr(pg.spec, "suspend", True))
    await sched.settle()
    assert sched.pg("s").status.phase == "Suspended"
    assert len(sched.reservations("s")) == 2  # the operator releases them, not the scheduler
    release(sched, "s", "s-worker-0", "s-worker-1")
    await sched.settle()
    assert sched.reservations("s") == {} and sched.loop.snapshot.reservation_count == 0
    sched.store.mutate("PodGroup", "default", "s", lambda pg: setattr(pg.spec, "suspend", False))
    await sched.settle()
    assert sched.pg("s").status.phase == "Placed" and len(sched.reservations("s")) == 2


async def test_a_recreated_podgroup_does_not_inherit_the_old_reservations(sched):
    sched.store.create(podgroup("r", role(gpus=8)))
    await sched.settle()
    old = sched.reservations("r")["r-worker-0"]
    sched.store.delete("PodGroup", "default", "r")
    sched.store.create(
        podgroup("r", role(gpus=8)).model_copy(
            update={"metadata": podgroup("r").metadata.model_copy(update={"uid": "second"})}
        )
    )
    await sched.settle(1)
    new = sched.reservations("r")["r-worker-0"]
    assert new.metadata.uid != old.metadata.uid and new.metadata.owner_references[0].uid == "second"


async def test_optional_pods_are_placed_later_without_blocking(sched):
    sched.store.create(podgroup("fill", role(replicas=2, gpus=8)))
    await sched.settle()
    sched.store.create(podgroup("elastic", role(replicas=3, gpus=8, min_available=1)))
    await sched.settle()
    assert len(sched.reservations("fill")) == 2
    elastic = sched.pg("elastic")
    assert elastic.status.phase == "Placed" and elastic.status.placed == 1
    assert "2 optional pods wait for room" in elastic.status.message
    sched.store.delete("PodGroup", "default", "fill")  # the job ended: its Reservations are collected
    await sched.settle()
    assert sched.pg("elastic").status.placed == 3


async def test_suspend_and_resume(sched):
    sched.store.create(podgroup("s", role(gpus=1), suspend=True))
    await sched.settle()
    assert sched.pg("s").status.phase == "Suspended" and sched.reservations("s") == {}
    sched.store.mutate("PodGroup", "default", "s", lambda pg: setattr(pg.spec, "suspend", False))
    await sched.settle()
    assert sched.pg("s").status.phase == "Placed"


async def test_gang_group_waits_for_its_members(sched):
    sched.store.create(podgroup("a", role(gpus=8), gang_group=["default/b"]))
    await sched.settle()
    a = sched.pg("a")
    assert a.status.reason == "WaitingForGangGroup" and "default/b" in a.status.message
    sched.store.create(podgroup("b", role(gpus=8)))  # b does not list a: the group is still known
    await sched.settle()
    assert sched.pg("a").status.phase == "Placed" and sched.pg("b").status.phase == "Placed"
    (ra,), (rb,) = sched.reservations("a").values(), sched.reservations("b").values()
    assert ra.spec.node != rb.spec.node and len(ra.spec.gpus) == len(rb.spec.gpus) == 8


async def test_cycle_metrics_are_exported(sched):
    from prometheus_client import generate_latest

    sched.store.create(podgroup("m", role(gpus=1)))
    await sched.settle()
    text = generate_latest(sched.ctx.registry).decode()
    assert 'gpuyard_scheduler_cycle_seconds_count{result="placed"} 1.0' in text
    assert "gpuyard_scheduler_placed_pods_total 1.0" in text


async def test_an_invalid_request_is_explained(sched):
    sched.store.create(podgroup("bad", role(gpus=1, resource="nvidia.h200")))
    await sched.settle()
    pg = sched.pg("bad")
    assert (
        pg.status.reason == "InvalidRequest" and "unknown resource class 'nvidia.h200'" in pg.status.message
    )


async def test_priority_goes_first():
    ctx = Context.for_tests()
    ctx.store.create(make_node("only", gpus=8))
    ctx.store.create(podgroup("low", role(gpus=8), priority=0))
    ctx.store.create(podgroup("high", role(gpus=8), priority=10))
    running = Running(ctx)
    try:
        await running.settle()
        assert running.pg("high").status.phase == "Placed" and running.pg("low").status.phase == "Pending"
    finally:
        await running.stop()


async def test_a_watch_that_falls_behind_re_lists():
    clock = VirtualClock()
    store = Store(history=4, now=clock.utcnow)
    register_kinds(store)
    ctx = Context(store=store, clock=clock, settings=Settings(backend={"data_dir": None, "clock": "virtual"}))
    loop = SchedulerLoop(ctx)
    task = asyncio.create_task(loop.run())
    try:
        await clock.advance(0.01)
        for i in range(10):  # no await: the watcher falls more than 4 events behind
            store.create(make_node(f"n{i}", gpus=1))
        store.create(podgroup("j", role(replicas=10, gpus=1)))
        await clock.advance(0.01)
        assert loop.snapshot.node_count == 10
        assert store.must_get("PodGroup", "default", "j").status.phase == "Placed"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_demo_cluster_v100_class_and_a_gang_that_does_not_fit():
    """The issue's "done when": 4 GPUs of the V100 default class land on V100s; an 8-pod gang too big holds nothing."""
    ctx = Context.for_tests()
    fake = FakeCluster(ctx, load_scenario("configs/clusters/demo.yaml"))
    ctx.backend = fake
    fake_task = asyncio.create_task(fake.run())
    await fake.synced.wait()
    running = Running(ctx)
    try:
        await running.settle(1)
        assert running.store.get("ResourceClass", "", "nvidia.v100") is not None
        running.store.create(podgroup("v", role(gpus=4, resource="nvidia.v100")))
        running.store.create(podgroup("huge", role(replicas=8, gpus=8)))
        await running.settle(1)
        res = list(running.reservations("v").values())
        assert len(res) == 1 and res[0].spec.node.startswith("dgx1-")
        node = running.store.get("Node", "", res[0].spec.node)
        assert node.metadata.labels["gpuyard.io/gpu-model"] == "v100"
        topo = running.store.get("NodeTopology", "", res[0].spec.node)
        if topo is not None and topo.spec.gpus:
            assert res[0].spec.gpu_ids == [
                topo.spec.gpus[i].uuid or f"GPU-{node.metadata.name}-{i}" for i in res[0].spec.gpus
            ]
        huge = running.pg("huge")
        assert huge.status.phase == "Pending" and running.reservations("huge") == {}
        assert "8 pods of 8 GPUs" in huge.status.message and "at most" in huge.status.message
    finally:
        await running.stop()
        fake_task.cancel()
        await asyncio.gather(fake_task, return_exceptions=True)


async def test_an_error_in_one_cycle_does_not_stop_the_scheduler(sched, monkeypatch):
    from gpuyard.scheduler.cycle import attempting as running

    real_place = running.place
    failures = {"boom": 1}

    def flaky_place(snapshot, gang, profile, **kw):
        if failures.get(gang.key[1]):
            failures[gang.key[1]] -= 1
            raise RuntimeError("a plugin bug")
        return real_place(snapshot, gang, profile, **kw)

    monkeypatch.setattr(running, "place", flaky_place)
    sched.store.create(podgroup("boom", role(gpus=1)))
    sched.store.create(podgroup("fine", role(gpus=1)))
    await sched.settle()
    assert sched.pg("fine").status.phase == "Placed" and sched.pg("boom").status.phase == "Pending"
    assert not any(t.done() for t in sched.tasks)
    await sched.settle(1)
    assert sched.pg("boom").status.phase == "Placed"


async def test_a_job_whose_minimum_is_zero_waits_quietly_until_a_pod_fits(sched):
    sched.store.create(podgroup("hog", role(replicas=2, gpus=8)))
    sched.store.create(podgroup("small-hog", role(replicas=1, gpus=8)))
    await sched.settle()
    sched.store.create(podgroup("zero", role(replicas=2, gpus=8, min_available=0)))
    await sched.settle(2)
    zero = sched.pg("zero")
    assert zero.status.phase == "Pending" and "above the minimum fits now" in zero.status.message
    rv = zero.metadata.resource_version
    await sched.settle(5)
    assert sched.pg("zero").metadata.resource_version == rv  # no status flapping
    sched.store.delete("PodGroup", "default", "small-hog")  # that job ended: its Reservation is collected
    await sched.settle()
    assert sched.pg("zero").status.phase == "Placed" and sched.pg("zero").status.placed == 1


async def test_with_a_journal_a_placement_is_written_once_durable(tmp_path):
    from gpuyard.state.journal import Journal

    ctx = Context.for_tests()
    journal = Journal(tmp_path / "journal.db")
    ctx.store.attach_journal(journal)
    ctx = Context(store=ctx.store, clock=ctx.clock, settings=ctx.settings, journal=journal)
    ctx.store.create(make_node("n1", gpus=8))
    running = Running(ctx)
    try:
        await running.settle()
        for i in range(3):
            running.store.create(podgroup(f"j{i}", role(replicas=2, gpus=1)))
        running.store.create(podgroup("big", role(replicas=2, gpus=8)))
        await running.settle()
        assert all(running.pg(f"j{i}").status.phase == "Placed" for i in range(3))
        assert sum(len(running.reservations(f"j{i}")) for i in range(3)) == 6
        assert running.pg("big").status.reason == "Unschedulable"
        assert journal.pending == 0
    finally:
        await running.stop()
        journal.close()


class SuspendingWriter:
    """A writer that answers later, like an API server, and refuses chosen creates once."""

    def __init__(self, inner, refuse: set[str]) -> None:  # type: ignore[no-untyped-def]
        self.inner, self.refuse = inner, refuse

    async def create(self, obj):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        if obj.metadata.name in self.refuse:
            self.refuse.discard(obj.metadata.name)
            raise StoreError("admission webhook said no")
        return await self.inner.create(obj)

    async def update(self, obj):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        return await self.inner.update(obj)

    async def patch_status(self, kind, namespace, name, changes, *, resource_version=None):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        return await self.inner.patch_status(
            kind, namespace, name, changes, resource_version=resource_version
        )

    async def delete(self, kind, namespace, name, *, resource_version=None):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        return await self.inner.delete(kind, namespace, name, resource_version=resource_version)


async def test_with_a_writer_that_waits_gangs_are_written_together_and_a_refused_one_backs_off():
    ctx = Context.for_tests()
    ctx.writer = SuspendingWriter(ctx.writer, refuse={"b-worker-1"})
    for name in ("n1", "n2"):
        ctx.store.create(make_node(name, gpus=8))
    running = Running(ctx)
    try:
        await running.settle()
        running.store.create(podgroup("a", role(replicas=2, gpus=4)))
        running.store.create(podgroup("b", role(replicas=2, gpus=4)))
        await running.settle()
        assert running.pg("a").status.phase == "Placed" and len(running.reservations("a")) == 2
        b = running.pg("b")
        assert b.status.reason == "AssumeFailed" and "admission webhook said no" in b.status.message
        assert running.reservations("b") == {} and running.loop.snapshot.reservation_count == 2
        await running.settle(1)  # the backoff ends
        assert running.pg("b").status.phase == "Placed" and len(running.reservations("b")) == 2
    finally:
        await running.stop()


async def test_the_placed_message_after_a_failover_describes_the_whole_gang(sched):
    sched.store.create(podgroup("fo", role(replicas=4, gpus=4)))
    await sched.settle()
    assert sched.pg("fo").status.message == "placed 4 pods on 2 nodes"
    release(sched, "fo", "fo-worker-3")  # the operator: this pod moves (failover)
    await sched.settle()
    pg = sched.pg("fo")
    assert pg.status.phase == "Placed" and pg.status.placed == 4
    assert pg.status.message.startswith("placed 4 pods on ") and pg.status.message.endswith("(1 just now)")


async def test_a_request_the_scheduler_cannot_read_fails_that_job_not_the_loop(sched):
    """A PodGroup written past validation with a negative CPU request: the scheduler reports it
    on that PodGroup (InvalidRequest) once and goes on placing the others; it does not retry it
    every cycle."""
    from decimal import Decimal

    bad = podgroup("neg", role(gpus=1))
    bad.spec.roles[0].template.containers[0].resources.limits["cpu"] = Decimal(-1)
    sched.store.create(bad)
    sched.store.create(podgroup("good", role(gpus=1)))
    await sched.settle()
    pg = sched.pg("neg")
    assert pg.status.reason == "InvalidRequest" and "negative" in pg.status.message, pg.status
    assert sched.pg("good").status.phase == "Placed"
    await sched.settle()  # parked, not retried on a backoff
    assert sched.pg("neg").status.reason == "InvalidRequest"
