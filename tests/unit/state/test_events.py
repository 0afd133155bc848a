"""The one Event recorder (`state/events.py`) and writer identities (`state/writing.py`)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from gpuyard.apis.core import Event
from gpuyard.apis.meta import ObjectMeta
from gpuyard.state.events import MAX_MESSAGE, EventRecorder, event_name
from gpuyard.state.kinds import register_kinds
from gpuyard.state.store import AlreadyExists, Store
from gpuyard.state.writing import (
    StoreWriter,
    WriteRecord,
    acting_as,
    create_all,
    identified,
    writer_identity,
)
from tests.builders import make_pod

T0 = datetime(2026, 1, 1, tzinfo=UTC)
JOB = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "namespace": "team-a", "name": "tf", "uid": "u1"}


def new_writer() -> StoreWriter:
    store = Store()
    register_kinds(store)
    return StoreWriter(store)


def recorder(writer: StoreWriter, component: str = "gpuyard-job-operator") -> EventRecorder:
    return EventRecorder(component=component, store=writer.store, writer=writer)


async def test_one_event_per_object_and_reason_counts_repeats_and_keeps_the_latest_message() -> None:
    writer = new_writer()
    events = recorder(writer)
    first = await events.record(
        JOB, reason="Restarting", message="pod 0 failed", at=T0, labels={"job-name": "tf"}
    )
    later = T0 + timedelta(minutes=5)
    again = await events.record(JOB, reason="Restarting", message="pod 1 failed", type="Warning", at=later)
    other = await events.record(JOB, reason="Running", message="all pods run", at=later)
    assert first is not None and again is not None and other is not None
    assert again.metadata.name == first.metadata.name != other.metadata.name
    assert (again.count, again.message, again.type) == (2, "pod 1 failed", "Warning")
    assert (again.first_timestamp, again.last_timestamp) == (T0, later)
    assert again.metadata.labels == {"job-name": "tf"}  # kept from the create
    assert again.source == {"component": "gpuyard-job-operator"}
    assert again.reporting_component == "gpuyard-job-operator"
    assert len(writer.store.list("Event", namespace="team-a")) == 2
    # the stored Event of the first write is never changed in place (objects in the store are shared)
    assert (first.count, first.message, first.type, first.last_timestamp) == (1, "pod 0 failed", "Normal", T0)
    assert first.source == {"component": "gpuyard-job-operator"} and first.metadata.labels == {
        "job-name": "tf"
    }


async def test_components_and_kinds_never_share_an_event_and_names_are_valid() -> None:
    writer = new_writer()
    a = await recorder(writer, "gpuyard-job-operator").record(JOB, reason="Preempted", message="m", at=T0)
    b = await recorder(writer, "gpuyard-scheduler").record(JOB, reason="Preempted", message="m", at=T0)
    pg = await recorder(writer).record({**JOB, "kind": "PodGroup"}, reason="Preempted", message="m", at=T0)
    assert a is not None and b is not None and pg is not None
    assert len({a.metadata.name, b.metadata.name, pg.metadata.name}) == 3
    long = event_name({"name": "x" * 300, "kind": "Node"}, reason="Odd Reason!", component="c")
    assert len(long) <= 253 and ".odd-reason-" in long


async def test_a_message_is_cut_to_the_api_servers_limit() -> None:
    event = await recorder(new_writer()).record(JOB, reason="Failed", message="x" * 5000, at=T0)
    assert event is not None and len(event.message) == MAX_MESSAGE and event.message.endswith("...")


async def test_an_event_about_an_earlier_object_of_that_name_starts_again() -> None:
    writer = new_writer()
    events = recorder(writer)
    await events.record(JOB, reason="Running", message="m", at=T0)
    await events.record(JOB, reason="Running", message="m", at=T0)
    again = await events.record(
        {**JOB, "uid": "u2"}, reason="Running", message="m", at=T0 + timedelta(hours=1)
    )
    assert again is not None and again.count == 1 and again.involved_object["uid"] == "u2"
    assert again.first_timestamp == T0 + timedelta(hours=1)


async def test_another_components_event_of_a_given_name_is_left_alone() -> None:
    writer = new_writer()
    await recorder(writer, "gpuyard-scheduler").record(
        JOB, reason="Scheduled", message="m", name="tf.scheduled", at=T0
    )
    taken = await recorder(writer).record(JOB, reason="Scheduled", message="n", name="tf.scheduled", at=T0)
    assert taken is None
    held = writer.store.get_of(Event, "team-a", "tf.scheduled")
    assert held is not None and held.count == 1 and held.message == "m"


async def test_an_event_created_meanwhile_elsewhere_is_found_and_counted() -> None:
    """The create's 409 (a backend that does not cache such Events brings the stored one into the
    store with the answer) is followed by an update of what holds the name."""
    writer = new_writer()
    name = event_name(JOB, reason="Running", component="gpuyard-job-operator")
    earlier = Event(
        metadata=ObjectMeta(name=name, namespace="team-a"),
        involved_object=JOB,
        reason="Running",
        count=3,
        source={"component": "gpuyard-job-operator"},
    )

    class Late(StoreWriter):
        async def create(self, obj):
            if obj.kind == "Event" and self.store.get("Event", "team-a", name) is None:
                self.store.create(earlier)
                raise AlreadyExists("taken meanwhile")
            return await super().create(obj)

    late = Late(writer.store)
    event = await recorder(late).record(JOB, reason="Running", message="m", at=T0)
    assert event is not None and event.count == 4


async def test_without_a_clock_a_time_must_be_given() -> None:
    with pytest.raises(ValueError, match="no time"):
        await recorder(new_writer()).record(JOB, reason="Running", message="m")


async def test_every_write_carries_its_components_identity_innermost_first() -> None:
    writer = new_writer()
    seen: list[WriteRecord] = []
    writer.audit = seen.append
    operator = identified(writer, "gpuyard-job-operator")
    assert identified(operator, "gpuyard-api").inner is writer  # re-identified, not nested
    pod = await operator.create(make_pod("a"))
    with acting_as("gpuyard-backend"):
        running = await writer.patch_status("Pod", pod.metadata.namespace, "a", {"phase": "Running"})
        labelled = running.clone()
        labelled.metadata.labels["x"] = "1"
        await operator.update(labelled)  # the innermost identity wins
    assert writer_identity() == ""
    await create_all(identified(writer, "gpuyard-api"), [make_pod("b"), make_pod("c")])
    await writer.delete("Pod", pod.metadata.namespace, "b")
    got = [(r.identity, r.verb, r.name) for r in seen]
    assert got == [
        ("gpuyard-job-operator", "create", "a"),
        ("gpuyard-backend", "patch_status", "a"),
        ("gpuyard-job-operator", "update", "a"),
        ("gpuyard-api", "create", "b"),
        ("gpuyard-api", "create", "c"),
        ("", "delete", "b"),
    ]
    assert seen[1].parts == {"status", "status.phase"}
    assert seen[2].parts == {"metadata"}  # status is never an update's
    assert {"metadata", "spec"} <= seen[0].parts


async def test_an_identity_does_not_leak_into_other_tasks() -> None:
    writer = new_writer()
    seen: list[WriteRecord] = []
    writer.audit = seen.append
    started = asyncio.Event()

    async def other() -> None:
        await started.wait()
        await writer.create(make_pod("plain"))

    task = asyncio.create_task(other())
    with acting_as("gpuyard-scheduler"):
        started.set()
        await asyncio.sleep(0)
        await writer.create(make_pod("mine"))
    await task
    assert {(r.name, r.identity) for r in seen} == {("mine", "gpuyard-scheduler"), ("plain", "")}
