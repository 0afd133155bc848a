"""The Kubernetes backend's pieces that need no API server: the store's mirror API, the status
merge patch, the node model (foreign pods, topology), the backend settings check."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import pytest

from gpuyard.apis.core import Node
from gpuyard.apis.devices import NodeTopology
from gpuyard.devices.presets import get_preset
from gpuyard.kubecluster.nodes import ANNOTATION_DERIVED, NodeModel
from gpuyard.kubecluster.writing import merge_diff
from gpuyard.platform.backends import plan_backend
from gpuyard.state.clock import VirtualClock
from gpuyard.state.config import ConfigError, Settings
from gpuyard.state.kinds import register_kinds
from gpuyard.state.store import Store
from gpuyard.state.writing import Writer
from tests.builders import make_node, make_pod


def new_store() -> Store:
    store = Store()
    register_kinds(store)
    return store


def with_rv(node: Node, rv: str) -> Node:
    node.metadata.resource_version = rv
    node.metadata.uid = "u-" + node.metadata.name
    return node


async def test_observe_keeps_server_versions_and_ignores_older() -> None:
    store = new_store()
    seen: list[tuple[str, str]] = []

    async def watch() -> None:
        async for ev in store.watch("Node", since=0):
            seen.append((ev.type, ev.object.metadata.resource_version))

    task = asyncio.create_task(watch())
    assert store.observe(with_rv(make_node("n"), "500"))
    assert store.must_get_of(Node, "", "n").metadata.resource_version == "500"
    assert not store.observe(with_rv(make_node("n"), "500"))  # the watch echo of a write: no-op
    assert not store.observe(with_rv(make_node("n"), "499"))  # older: ignored
    assert store.observe(with_rv(make_node("n", cpu="8"), "501"))
    assert store.observe(with_rv(make_node("n", cpu="4"), "501"), force=True)
    assert store.forget("Node", "", "n") and not store.forget("Node", "", "n")
    await asyncio.sleep(0)
    store.close()
    await task
    assert seen == [("ADDED", "500"), ("MODIFIED", "501"), ("MODIFIED", "501"), ("DELETED", "501")]


def test_merge_diff_turns_old_into_new() -> None:
    old = {"phase": "Placed", "evictions": {"a": "preempted", "b": "reclaim"}, "placed": 2}
    new = {"phase": "Placed", "evictions": {"b": "reclaim", "c": "migration"}, "placed": 2}
    assert merge_diff(old, new) == {"evictions": {"a": None, "c": "migration"}}
    assert merge_diff([1, 2], [3]) == [3]  # lists are replaced whole


def model(store: Store, clock: VirtualClock, grace: float = 300.0) -> NodeModel:
    return NodeModel(store=store, clock=clock, node_lost_grace=grace)


def test_foreign_pods_take_capacity_and_give_it_back() -> None:
    store, clock = new_store(), VirtualClock()
    nodes = model(store, clock)
    pods = nodes.pod_mirror()
    nodes.put(with_rv(make_node("n", gpus=8, cpu="64"), "10"))
    ours = make_pod("ours", node="n", gpus=2, annotations={"gpuyard.io/devices": '{"gpus": [6, 7]}'})
    ours.spec.scheduler_name = "gpuyard"
    ours.metadata.resource_version = "11"
    pods.put(ours)
    assert "gpuyard.io/foreign-usage" not in store.must_get_of(Node, "", "n").metadata.annotations
    daemon = make_pod("daemon", node="n", gpus=2, cpu="4")
    daemon.metadata.resource_version = "12"
    pods.put(daemon)
    node = store.must_get_of(Node, "", "n")
    assert node.status.allocatable["cpu"] == 60
    assert node.metadata.annotations["gpuyard.io/unhealthy-gpus"] == "4,5"  # not gpuyard's 6, 7
    assert node.metadata.resource_version == "10"  # still the server's version
    done = daemon.clone()
    done.status.phase = "Succeeded"
    done.metadata.resource_version = "13"
    pods.put(done)
    node = store.must_get_of(Node, "", "n")
    assert (
        node.status.allocatable["cpu"] == 64 and "gpuyard.io/unhealthy-gpus" not in node.metadata.annotations
    )


def test_topology_from_object_else_preset_label_else_none() -> None:
    store, clock = new_store(), VirtualClock()
    nodes = model(store, clock)
    topologies = nodes.topology_mirror()
    nodes.put(with_rv(make_node("flat", gpus=8), "1"))
    assert store.get_of(NodeTopology, "", "flat") is None  # flat: the scheduler reads the labels
    nodes.put(
        with_rv(
            make_node("dgx", gpus=8, model="a100", labels={"gpuyard.io/topology-preset": "dgx-a100"}), "2"
        )
    )
    derived = store.must_get_of(NodeTopology, "", "dgx")
    assert derived.metadata.annotations[ANNOTATION_DERIVED] == "preset:dgx-a100" and derived.gpu_count == 8
    own = get_preset("dgx-a100", node_name="dgx")
    own.metadata.resource_version = "3"
    topologies.put(own)  # the server's NodeTopology wins
    assert ANNOTATION_DERIVED not in store.must_get_of(NodeTopology, "", "dgx").metadata.annotations
    topologies.drop("NodeTopology", "", "dgx")  # and when it goes, the preset comes back
    assert (
        store.must_get_of(NodeTopology, "", "dgx").metadata.annotations[ANNOTATION_DERIVED]
        == "preset:dgx-a100"
    )


async def test_lost_node_waits_for_the_grace_period() -> None:
    store, clock = new_store(), VirtualClock()
    nodes = model(store, clock, grace=60)
    failed: list[str] = []

    class Recorder:
        async def patch_status(
            self, kind: str, namespace: str, name: str, changes: dict, **_: object
        ) -> None:
            failed.append(f"{name}:{changes['reason']}")

    nodes.writer = cast(Writer, Recorder())  # only patch_status is used
    nodes.put(with_rv(make_node("n"), "1"))
    pod = make_pod("p", node="n")
    pod.status.phase = "Running"
    pod.metadata.resource_version = "2"
    nodes.pod_mirror().put(pod)
    nodes.drop("Node", "", "n")
    assert await nodes.fail_lost() == 0
    await clock.advance(59)
    assert await nodes.fail_lost() == 0
    await clock.advance(2)
    assert await nodes.fail_lost() == 1 and failed == ["p:NodeLost"]


async def test_a_pod_evicted_after_it_was_failed_is_still_deleted_at_once() -> None:
    """The taint manager's eviction (a graceful delete) may reach the cache only after gpuyard failed
    the pod: with the kubelet gone nobody finishes it, so a later pass deletes it (grace 0, by uid)."""
    from datetime import UTC, datetime

    store, clock = new_store(), VirtualClock()
    nodes = model(store, clock, grace=5)
    calls: list[str] = []

    class Recorder:
        async def patch_status(
            self, kind: str, namespace: str, name: str, changes: dict, **_: object
        ) -> None:
            calls.append(f"fail {name}:{changes['reason']}")

        async def delete(self, kind: str, namespace: str, name: str, **options: object) -> None:
            calls.append(f"delete {name} uid={options['uid']} grace={options['grace_period']}")

    nodes.writer = cast(Writer, Recorder())
    nodes.put(with_rv(make_node("n"), "1"))
    pod = make_pod("p", node="n")
    pod.metadata.uid = "uid-1"
    pod.status.phase = "Running"
    pod.metadata.resource_version = "2"
    mirror = nodes.pod_mirror()
    mirror.put(pod)
    nodes.drop("Node", "", "n")
    await clock.advance(6)
    assert await nodes.fail_lost() == 1 and calls == ["fail p:NodeLost"]
    failed = pod.clone()
    failed.status.phase = "Failed"
    failed.metadata.resource_version = "3"
    mirror.put(failed)
    assert await nodes.fail_lost() == 0 and calls == ["fail p:NodeLost"]  # nothing left to do
    evicted = failed.clone()
    evicted.metadata.deletion_timestamp = datetime.now(UTC)
    evicted.metadata.resource_version = "4"
    mirror.put(evicted)
    assert await nodes.fail_lost() == 0
    assert calls == ["fail p:NodeLost", "delete p uid=uid-1 grace=0"]


def test_kubernetes_plan_checks_the_kubeconfig(tmp_path: Path) -> None:
    missing = Settings(
        backend={"kind": "kubernetes", "kubernetes": {"kubeconfig": str(tmp_path / "nope.yaml")}}
    )
    with pytest.raises(ConfigError, match=r"backend\.kubernetes\.kubeconfig: .*nope\.yaml is not a file"):
        plan_backend(missing)
    (tmp_path / "kc.yaml").write_text("apiVersion: v1\n")
    ok = Settings(backend={"kind": "kubernetes", "kubernetes": {"kubeconfig": str(tmp_path / "kc.yaml")}})
    assert plan_backend(ok).kind == "kubernetes" and plan_backend(ok).scenario is None


def test_only_the_configured_job_groups_are_watched() -> None:
    from gpuyard.kubecluster.cluster import watched_resources

    kinds = new_store().kinds()
    both = {
        (r.kind, r.group) for r in watched_resources(kinds, job_groups=["training.kubedl.io", "kubeflow.org"])
    }
    assert {
        ("TFJob", "training.kubedl.io"),
        ("TFJob", "kubeflow.org"),
        ("Node", ""),
        ("PodGroup", "scheduling.gpuyard.io"),
    } <= both
    kubeflow = {(r.kind, r.group) for r in watched_resources(kinds, job_groups=["kubeflow.org"])}
    assert ("TFJob", "kubeflow.org") in kubeflow
    assert not any(group == "training.kubedl.io" for _, group in kubeflow)
    assert ("Event", "") in both  # scoped to label job-name (informer_scope)
