"""The object store: versions, conflicts, selectors, watch order, Gone, journal reload."""

from __future__ import annotations

import asyncio

import pytest

from gpuyard.apis.core import Node, Pod
from gpuyard.state.journal import Journal
from gpuyard.state.kinds import register_kinds
from gpuyard.state.store import AlreadyExists, Conflict, Gone, NotFound, Store
from tests.builders import make_node, make_pod


def new_store(**kw) -> Store:
    store = Store(**kw)
    register_kinds(store)
    return store


def test_create_assigns_versions_uid_and_default_namespace():
    store = new_store()
    a = store.create(make_pod("a", namespace=""))
    b = store.create(make_pod("b"))
    assert a.metadata.namespace == "default"
    assert (a.resource_version, b.resource_version) == (1, 2)
    assert a.metadata.uid and a.metadata.uid != b.metadata.uid
    assert a.metadata.generation == 1 and a.metadata.creation_timestamp is not None
    with pytest.raises(AlreadyExists):
        store.create(make_pod("a"))


def test_update_with_stale_version_conflicts_and_changes_nothing():
    store = new_store()
    pod = store.create(make_pod("a"))
    first = pod.clone()
    first.metadata.labels["x"] = "1"
    stored = store.update(first)
    assert stored.resource_version == 2
    stale = pod.clone()  # still at version 1
    stale.metadata.labels["x"] = "2"
    with pytest.raises(Conflict):
        store.update(stale)
    assert store.get("Pod", "default", "a").metadata.labels["x"] == "1"
    assert store.resource_version == 2


def test_generation_bumps_on_spec_change_only():
    store = new_store()
    pod = store.create(make_pod("a"))
    status_only = pod.clone()
    status_only.status.phase = "Running"
    pod = store.update(status_only)
    assert pod.metadata.generation == 1
    spec_change = pod.clone()
    spec_change.spec.node_name = "n1"
    assert store.update(spec_change).metadata.generation == 2


def test_store_never_shares_callers_metadata():
    store = new_store()
    mine = make_pod("a")
    stored = store.create(mine)
    mine.metadata.labels["late"] = "change"
    assert "late" not in stored.metadata.labels


def test_list_with_selectors_and_namespaces():
    store = new_store()
    store.create(make_pod("a", labels={"app": "web", "tier": "front"}))
    store.create(make_pod("b", labels={"app": "web", "tier": "back"}))
    store.create(make_pod("c", namespace="other", labels={"app": "db"}))
    names = lambda objs: [o.metadata.name for o in objs]  # noqa: E731
    assert names(store.list("Pod", selector={"app": "web"})) == ["a", "b"]
    assert names(store.list("Pod", selector="app=web,tier!=front")) == ["b"]
    assert names(store.list("Pod", selector="app in (db, web),!missing")) == ["a", "b", "c"]
    assert names(store.list("Pod", namespace="other")) == ["c"]
    # the label index follows label changes and deletes
    b = store.get("Pod", "default", "b").clone()
    b.metadata.labels["app"] = "api"
    store.update(b)
    store.delete("Pod", "default", "a")
    assert names(store.list("Pod", selector={"app": "web"})) == []
    assert names(store.list("Pod", selector={"app": "api"})) == ["b"]


def test_in_order_walks_every_object_in_list_order_from_a_key_and_follows_creates_and_deletes():
    store = new_store()
    for ns, name in [("b", "x"), ("a", "z"), ("b", "a"), ("a", "b")]:
        store.create(make_pod(name, namespace=ns))
    keys = lambda objs: [(o.metadata.namespace, o.metadata.name) for o in objs]  # noqa: E731
    assert (
        keys(store.in_order(Pod))
        == keys(store.list("Pod"))
        == [("a", "b"), ("a", "z"), ("b", "a"), ("b", "x")]
    )
    assert keys(store.in_order(Pod, after=("a", "z"))) == [("b", "a"), ("b", "x")]
    assert keys(store.in_order(Pod, after=("a", "c"))) == [("a", "z"), ("b", "a"), ("b", "x")]
    pod = store.get("Pod", "a", "z").clone()
    pod.metadata.labels["x"] = "y"
    store.update(pod)  # an update keeps the order
    store.create(make_pod("m", namespace="a"))
    store.delete("Pod", "b", "a")
    store.observe(make_pod("c", namespace="c").model_copy(update={"kind": "Pod"}))  # mirrored
    store.forget("Pod", "a", "b")
    assert (
        keys(store.in_order(Pod))
        == keys(store.list("Pod"))
        == [("a", "m"), ("a", "z"), ("b", "x"), ("c", "c")]
    )
    assert keys(store.list("Pod", namespace="a")) == [("a", "m"), ("a", "z")]
    assert keys(store.list("Pod", namespace="")) == keys(store.list("Pod", namespace="aa")) == []
    assert keys(store.list("Pod", selector="!missing", namespace="b")) == [("b", "x")]
    walk = store.in_order(Pod)
    assert keys([next(walk)]) == [("a", "m")]
    store.delete("Pod", "a", "z")  # deleted while a walk is under way: skipped
    assert keys(walk) == [("b", "x"), ("c", "c")]


def test_delete_missing_raises_not_found():
    store = new_store()
    with pytest.raises(NotFound):
        store.delete("Pod", "default", "nope")


def test_mutate_reads_copies_and_writes_back():
    store = new_store()
    store.create(make_node("n1"))
    updated = store.mutate("Node", "", "n1", lambda n: n.metadata.annotations.update(a="b"))
    assert updated.metadata.annotations == {"a": "b"}
    assert updated.resource_version == 2


async def test_watch_delivers_every_change_in_order():
    store = new_store()
    seen: list[tuple[str, str, int]] = []

    async def follow() -> None:
        async for ev in store.watch("Pod", since=0):
            seen.append((ev.type, ev.object.metadata.name, ev.rv))

    task = asyncio.create_task(follow())
    await asyncio.sleep(0)
    store.create(make_node("n1"))  # another kind: filtered out
    pod = store.create(make_pod("a"))
    changed = pod.clone()
    changed.status.phase = "Running"
    store.update(changed)
    store.delete("Pod", "default", "a")
    store.create(make_pod("b"))
    await asyncio.sleep(0)
    store.close()
    await task
    assert seen == [("ADDED", "a", 2), ("MODIFIED", "a", 3), ("DELETED", "a", 4), ("ADDED", "b", 5)]


async def test_cancelling_one_watcher_leaves_the_others_watching():
    store = new_store()
    seen: list[str] = []

    async def follow() -> None:
        async for ev in store.watch("Pod", since=0):
            seen.append(ev.object.metadata.name)

    quitter = asyncio.create_task(follow())
    stayer = asyncio.create_task(follow())
    await asyncio.sleep(0)  # both wait on the store's next write
    quitter.cancel()
    await asyncio.sleep(0)
    store.create(make_pod("a"))
    await asyncio.sleep(0)
    assert quitter.cancelled() and not stayer.done()
    store.close()
    await stayer
    assert seen == ["a"]


async def test_watch_from_a_version_replays_then_follows():
    store = new_store()
    for i in range(5):
        store.create(make_pod(f"p{i}"))
    got = []

    async def follow() -> None:
        async for ev in store.watch("Pod", since=3):
            got.append(ev.rv)

    task = asyncio.create_task(follow())
    await asyncio.sleep(0)
    store.create(make_pod("p5"))
    store.close()
    await task
    assert got == [4, 5, 6]


async def test_watch_too_old_or_falling_behind_is_gone():
    store = new_store(history=4)
    for i in range(10):
        store.create(make_pod(f"p{i}"))
    with pytest.raises(Gone):
        async for _ in store.watch("Pod", since=1):
            pass
    # a watcher that stops reading falls behind and gets Gone instead of holding memory
    it = store.watch("Pod", since=store.resource_version).__aiter__()
    pending = asyncio.ensure_future(it.__anext__())
    await asyncio.sleep(0)
    assert not pending.done()
    store.create(make_pod("x"))
    first = await pending
    assert first.object.metadata.name == "x"
    for i in range(10):
        store.create(make_pod(f"late{i}"))
    with pytest.raises(Gone):
        await it.__anext__()
    await it.aclose()


def test_journal_reload_keeps_objects_and_versions(tmp_path):
    path = tmp_path / "journal.db"
    store = new_store()
    journal = Journal(path)
    store.attach_journal(journal)
    store.create(make_node("n1"))
    pod = store.create(make_pod("a", labels={"app": "x"}))
    store.create(make_pod("gone"))
    running = pod.clone()
    running.status.phase = "Running"
    store.update(running)
    store.delete("Pod", "default", "gone")
    store.create(Pod.model_validate({"metadata": {"name": "svc-owner"}}))
    journal.close()

    again = new_store()
    journal2 = Journal(path)
    assert journal2.load_into(again) == 3
    again.attach_journal(journal2)
    a = again.get("Pod", "default", "a")
    assert a.status.phase == "Running" and a.resource_version == 4
    assert again.get("Pod", "default", "gone") is None
    assert again.list("Pod", selector={"app": "x"})[0].metadata.name == "a"
    assert isinstance(again.get("Node", "", "n1"), Node)
    # numbering continues above every version that may have been issued (the last write was
    # version 6): versions are reserved in blocks, so a restart may skip some, never reuse one
    assert again.resource_version >= 6
    assert again.create(make_pod("new")).resource_version > 6
    journal2.close()


def test_versions_of_unjournaled_kinds_are_never_reused_after_a_crash(tmp_path):
    """Events are not journaled but consume versions a watcher may have seen; the journal is
    never flushed (a crash), yet a reloaded store numbers above every version handed out."""
    from gpuyard.apis.core import Event

    path = tmp_path / "journal.db"
    store = new_store()
    journal = Journal(path)
    store.attach_journal(journal)
    store.create(make_pod("a"))
    journal.flush()
    seen = 0
    for i in range(2500):  # crosses several reservation blocks
        seen = store.create(
            Event(metadata={"name": f"e{i}", "namespace": "default"}, reason="x")
        ).resource_version
    # no flush, no close: the process dies here
    again = new_store()
    Journal(path).load_into(again)
    assert again.resource_version >= seen
    assert again.create(make_pod("b")).resource_version > seen


async def test_watch_from_a_version_the_store_never_issued_is_gone():
    store = new_store()
    store.create(make_pod("a"))
    it = store.watch("Pod", since=store.resource_version + 5).__aiter__()
    with pytest.raises(Gone):
        await asyncio.wait_for(it.__anext__(), 1)  # not a wait for versions already handed out
    await it.aclose()


async def test_restored_store_answers_gone_for_an_older_version_and_continues_from_the_newest(tmp_path):
    path = tmp_path / "journal.db"
    store = new_store()
    journal = Journal(path)
    store.attach_journal(journal)
    store.create(make_pod("a"))
    store.create(make_pod("b"))
    journal.close()
    again = new_store()
    journal2 = Journal(path)
    journal2.load_into(again)
    again.attach_journal(journal2)
    old = again.watch("Pod", since=1).__aiter__()
    with pytest.raises(Gone):
        await old.__anext__()
    await old.aclose()
    newest = again.watch("Pod", since=again.resource_version).__aiter__()
    created = again.create(make_pod("c"))
    ev = await newest.__anext__()
    assert ev.rv == created.resource_version and ev.object.metadata.name == "c"
    await newest.aclose()
    journal2.close()


def test_changed_moves_with_every_write_of_its_kind_and_no_other():
    s = new_store()
    assert s.changed("Node", "Pod", "NoSuchKind") == (0, 0, 0)
    s.create(make_node("n1"))
    first = s.changed("Node", "Pod")
    assert first[0] > 0 and first[1] == 0
    s.create(make_pod("p"))
    assert s.changed("Node") == first[:1]  # a pod written: the nodes' figure stays
    node = s.must_get_of(Node, "", "n1").clone()
    node.metadata.labels["x"] = "1"
    mirrored = make_node("n2")
    mirrored.metadata.resource_version = "900"
    seen = {first[0]}
    for write in (
        lambda: s.update(node),
        lambda: s.observe(mirrored),
        lambda: s.forget("Node", "", "n2"),
        lambda: s.load(make_node("n3")),
        lambda: s.delete("Node", "", "n1"),
    ):
        write()
        now = s.changed("Node")[0]
        assert now not in seen
        seen.add(now)
