"""The orphan sweeper: a gpuyard pod left unbound (its leader died between create and binding) is
bound where its Reservation still holds room, or deleted; never on the first sight, never one
being created now, never another scheduler's, and only on the leader."""

from __future__ import annotations

from typing import Any, cast

from gpuyard.apis.core import Pod
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.scheduling import Reservation, ReservationSpec
from gpuyard.kubecluster.orphans import OrphanSweeper
from gpuyard.kubecluster.writing import ANNOTATION_ASSIGNED_NODE, KubeWriter
from gpuyard.state.clock import VirtualClock
from gpuyard.state.store import Store
from tests.builders import make_pod


class Writer:
    """What the sweeper uses of the writer: its scheduler name, the pods in flight, bind, delete."""

    scheduler_name = "gpuyard"

    def __init__(self) -> None:
        self.in_flight: set[tuple[str, str]] = set()
        self.bound: list[tuple[str, str]] = []
        self.deleted: list[str] = []

    async def bind(self, pod: Pod, node: str) -> None:
        self.bound.append((pod.metadata.name, node))

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        self.deleted.append(name)


def pod(
    name: str, *, scheduler: str = "gpuyard", node: str | None = None, assigned: str | None = None
) -> Pod:
    p = make_pod(name, node=node, annotations={ANNOTATION_ASSIGNED_NODE: assigned} if assigned else None)
    p.spec.scheduler_name = scheduler
    p.status.phase = "Pending"
    return p


def reservation(name: str, node: str) -> Reservation:
    return Reservation(
        metadata=ObjectMeta(name=name, namespace="default"),
        spec=ReservationSpec(pod_group="j", role="Worker", index=0, node=node),
    )


def sweeper(store: Store, writer: Writer, *, leader: list[bool]) -> OrphanSweeper:
    return OrphanSweeper(
        store=store, writer=cast(KubeWriter, writer), clock=VirtualClock(), is_leader=lambda: leader[0]
    )


def store_with(*objects: Any) -> Store:
    store = Store()
    store.register(Pod)
    store.register(Reservation)
    for obj in objects:
        store.create(obj)
    return store


async def test_an_orphan_is_bound_where_its_reservation_holds_room_else_deleted_on_the_second_sweep() -> None:
    store = store_with(
        pod("kept", assigned="n1"),
        reservation("kept", "n1"),
        pod("moved", assigned="n1"),
        reservation("moved", "n2"),  # placed elsewhere since: the pod's placement is gone
        pod("bare"),  # no node written at create
        pod("bound", node="n3"),
        pod("foreign", scheduler="default-scheduler"),
    )
    writer = Writer()
    sweep = sweeper(store, writer, leader=[True])
    assert await sweep.sweep() == 0  # first sight: only suspected
    assert await sweep.sweep() == 3
    assert writer.bound == [("kept", "n1")]
    assert sorted(writer.deleted) == ["bare", "moved"]
    assert (sweep.bound, sweep.deleted) == (1, 2)


async def test_a_pod_being_created_and_a_follower_touch_nothing() -> None:
    store = store_with(pod("creating", assigned="n1"), pod("bare"))
    writer = Writer()
    writer.in_flight.add(("default", "creating"))
    leader = [False]
    sweep = sweeper(store, writer, leader=leader)
    assert await sweep.sweep() == 0
    leader[0] = True
    assert await sweep.sweep() == 0  # the follower suspected nothing: first sight now
    assert await sweep.sweep() == 1
    assert writer.deleted == ["bare"] and writer.bound == []


async def test_a_pod_bound_between_two_sweeps_is_no_orphan() -> None:
    orphan = pod("late", assigned="n1")
    store = store_with(orphan)
    writer = Writer()
    sweep = sweeper(store, writer, leader=[True])
    assert await sweep.sweep() == 0
    bound = store.must_get_of(Pod, "default", "late").clone()
    bound.spec.node_name = "n1"
    store.update(bound)
    assert await sweep.sweep() == 0
    assert writer.bound == [] and writer.deleted == []
