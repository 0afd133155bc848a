"""The one write path: API-server semantics of StoreWriter and FakeWriter, and journal durability."""

from __future__ import annotations

import pytest

from gpuyard.apis.core import PodStatus
from gpuyard.apis.quotakinds import Queue
from gpuyard.fakecluster.writing import FakeWriter
from gpuyard.state.backend import BackendError
from gpuyard.state.journal import Journal
from gpuyard.state.kinds import register_kinds
from gpuyard.state.store import AlreadyExists, Conflict, NotFound, Store
from gpuyard.state.writing import StoreWriter, create_all, retry_on_conflict
from tests.builders import make_node, make_pod


def new_store() -> Store:
    store = Store()
    register_kinds(store)
    return store


def queue(name: str) -> Queue:
    return Queue.model_validate({"metadata": {"name": name}})


@pytest.fixture
def writer() -> StoreWriter:
    return StoreWriter(new_store())


async def test_a_stale_update_conflicts_and_changes_nothing(writer):
    pod = await writer.create(make_pod("a"))
    fresh = pod.clone()
    fresh.metadata.labels["x"] = "1"
    await writer.update(fresh)
    stale = pod.clone()
    stale.metadata.labels["x"] = "2"
    with pytest.raises(Conflict, match="stale"):
        await writer.update(stale)
    assert writer.store.get("Pod", "default", "a").metadata.labels["x"] == "1"


async def test_update_keeps_the_stored_status_and_bumps_generation_only_for_spec(writer):
    pod = await writer.create(make_pod("a"))
    running = await writer.patch_status("Pod", "default", "a", {"phase": "Running", "pod_ip": "10.0.0.1"})
    assert running.metadata.generation == pod.metadata.generation, "status writes keep the generation"
    change = running.clone()
    change.metadata.labels["team"] = "a"
    change.status = PodStatus(phase="Failed")  # ignored: status is a subresource
    labelled = await writer.update(change)
    assert (labelled.status.phase, labelled.status.pod_ip) == ("Running", "10.0.0.1")
    assert labelled.metadata.generation == pod.metadata.generation, "no spec change"
    respec = labelled.clone()
    respec.spec.scheduler_name = "other"
    assert (await writer.update(respec)).metadata.generation == pod.metadata.generation + 1


async def test_patch_status_merges_only_its_fields_and_rejects_unknown_ones(writer):
    await writer.create(make_pod("a"))
    await writer.patch_status("Pod", "default", "a", {"phase": "Running", "host_ip": "172.16.0.1"})
    after = await writer.patch_status("Pod", "default", "a", {"reason": "Evicted"})
    assert (after.status.phase, after.status.host_ip, after.status.reason) == (
        "Running",
        "172.16.0.1",
        "Evicted",
    )
    rv = after.metadata.resource_version
    with pytest.raises(ValueError, match=r"Pod\.status has no field colour"):
        await writer.patch_status("Pod", "default", "a", {"colour": "red", "phase": "Failed"})
    unchanged = writer.store.get("Pod", "default", "a")
    assert (unchanged.metadata.resource_version, unchanged.status.phase) == (rv, "Running")
    with pytest.raises(Conflict):
        await writer.patch_status("Pod", "default", "a", {"phase": "Failed"}, resource_version="1")
    with pytest.raises(NotFound):
        await writer.patch_status("Pod", "default", "ghost", {"phase": "Failed"})


async def test_create_and_delete_report_taken_and_missing_names(writer):
    await writer.create(queue("q"))
    with pytest.raises(AlreadyExists):
        await writer.create(queue("q"))
    await writer.delete("Queue", "", "q")
    with pytest.raises(NotFound):
        await writer.delete("Queue", "", "q")


async def test_a_write_is_durable_when_it_is_answered(tmp_path):
    """No flush, no close: a second process opening the journal sees exactly what was answered."""
    store = new_store()
    journal = Journal(tmp_path / "journal.db")
    store.attach_journal(journal)
    writer = StoreWriter(store, journal=journal)
    await writer.create(queue("kept"))
    await writer.create(queue("gone"))
    await writer.delete("Queue", "", "gone")

    reopened = new_store()
    Journal(tmp_path / "journal.db").load_into(reopened)
    assert [q.metadata.name for q in reopened.list("Queue")] == ["kept"], "a DELETE stays deleted"
    journal.close()


async def test_create_all_is_all_or_nothing(writer):
    await writer.create(queue("taken"))
    with pytest.raises(AlreadyExists):
        await create_all(writer, [queue("a"), queue("taken"), queue("b")])
    assert [q.metadata.name for q in writer.store.list("Queue")] == ["taken"]
    created = await create_all(writer, [queue("a"), queue("b")])
    assert [int(q.metadata.resource_version) for q in created] == sorted(
        int(q.metadata.resource_version) for q in created
    ), "written in the order given"


async def test_retry_on_conflict_re_reads_and_retries(writer):
    await writer.create(queue("q"))
    attempts = []

    async def relabel():
        current = writer.store.get("Queue", "", "q").clone()
        attempts.append(current.metadata.resource_version)
        if len(attempts) == 1:  # someone else writes in between
            other = current.clone()
            other.metadata.labels["other"] = "1"
            await writer.update(other)
        current.metadata.labels["mine"] = "1"
        return await writer.update(current)

    done = await retry_on_conflict(relabel)
    assert len(attempts) == 2 and done.metadata.labels == {"other": "1", "mine": "1"}
    assert await retry_on_conflict(lambda: writer.delete("Queue", "", "ghost"), on_missing="gone") == "gone"


async def test_fake_writer_admits_only_bound_pods_and_starts_them_pending():
    store = new_store()
    store.create(make_node("n-0"))
    fake = FakeWriter(store)
    pod = make_pod("p", node="n-0")
    pod.status.phase = "Running"
    created = await fake.create(pod)
    assert created.status.phase == "Pending", "only the kubelet moves a pod on"
    with pytest.raises(BackendError, match="already exists"):
        await fake.create(make_pod("p", node="n-0"))
    with pytest.raises(BackendError, match=r"spec\.nodeName is required"):
        await fake.create(make_pod("unbound"))
    fake.fail_creates = 1
    with pytest.raises(BackendError, match="injected"):
        await fake.create(make_pod("q", node="n-0"))
    await fake.create(make_pod("q", node="n-0"))
    assert fake.pods_created == 2
    stale = created.clone()
    await fake.update(created.clone())
    with pytest.raises(Conflict):
        await fake.update(stale)
