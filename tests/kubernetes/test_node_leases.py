"""Node heartbeats (`kubecluster/heartbeats.py`): a node whose Lease in `kube-node-lease` goes
unrenewed for `node_monitor_grace` is NotReady in gpuyard's view (Ready `Unknown`, reason
`NodeStatusUnknown`), so nothing new is placed there and its pods fail `NodeLost` after
`node_lost_grace`; a renewed Lease brings it back; a node without a Lease is judged by its Ready
condition as before. The Node on the API server is never changed.

The rule on plain data, the node model with a virtual clock, and the whole platform over the test
API server (`served`) with short graces.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from gpuyard.apis.core import Node
from gpuyard.apis.leases import Lease
from gpuyard.apis.resources import resource_for
from gpuyard.cli.install import manifests
from gpuyard.kubecluster.heartbeats import (
    NODE_STATUS_UNKNOWN,
    Heartbeat,
    heartbeat_seen,
    is_stale,
    stale_since,
    with_unknown_ready,
)
from gpuyard.kubecluster.nodes import NodeModel
from gpuyard.kubecluster.writing import to_json
from gpuyard.state.clock import VirtualClock
from gpuyard.state.kinds import register_kinds
from gpuyard.state.store import Store
from tests.builders import make_node
from tests.kubernetes.conftest_backend import FakeApiServerView, served
from tests.kubernetes.test_backend_platform import (
    NODES,
    TFJOBS,
    connect,
    eventually,
    job_pods,
    platform,
    play_kubelet,
    settings,
    tfjob,
)

__all__ = ["served"]

LEASES = resource_for("Lease")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def lease_body(node: str, *, renewed: datetime) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": 40,
            "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }


# --- RBAC -------------------------------------------------------------------------------------


def test_node_leases_are_readable_through_a_role_in_their_namespace_only() -> None:
    objects = manifests(namespace="ml-platform")
    roles = [o for o in objects if o["kind"] == "Role" and o["metadata"]["namespace"] == "kube-node-lease"]
    (role,) = roles
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list", "watch"]}
    ]
    (binding,) = [
        o for o in objects if o["kind"] == "RoleBinding" and o["metadata"]["namespace"] == "kube-node-lease"
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpuyard", "namespace": "ml-platform"}]
    cluster_role = next(o for o in objects if o["kind"] == "ClusterRole")
    assert not any("leases" in rule["resources"] for rule in cluster_role["rules"])
    moved = manifests(node_lease_namespace="heartbeats")
    assert any(o["kind"] == "Role" and o["metadata"]["namespace"] == "heartbeats" for o in moved)


# --- the rule ----------------------------------------------------------------------------------


def test_a_heartbeat_is_stale_after_the_grace_counted_from_when_its_renewal_was_seen() -> None:
    beat = heartbeat_seen(None, T0, now=100.0)
    assert beat == Heartbeat(renew_time=T0, seen_at=100.0)
    assert heartbeat_seen(beat, T0, now=130.0) is beat  # the same renewTime is no renewal
    assert not is_stale(beat, now=139.9, grace=40)
    assert is_stale(beat, now=140.0, grace=40)
    assert stale_since(beat, grace=40) == 140.0
    renewed = heartbeat_seen(beat, T0 + timedelta(seconds=10), now=150.0)
    assert renewed.seen_at == 150.0 and not is_stale(renewed, now=150.0, grace=40)
    # the Lease's own clock does not count: a renewTime far in the past, first seen now, is fresh
    old = heartbeat_seen(None, T0 - timedelta(days=1), now=100.0)
    assert not is_stale(old, now=100.0, grace=40)
    assert not is_stale(None, now=1e12, grace=40)  # no Lease: the Ready condition decides


def test_the_stale_copy_says_unknown_and_keeps_everything_else() -> None:
    node = make_node("gpu-0", gpus=8)
    copy = with_unknown_ready(node, message="node lease kube-node-lease/gpu-0 not renewed", since=1000.0)
    assert node.ready and not copy.ready
    (ready,) = [c for c in copy.status.conditions if c.type == "Ready"]
    assert (ready.status, ready.reason) == ("Unknown", NODE_STATUS_UNKNOWN)
    assert ready.last_transition_time == datetime.fromtimestamp(1000.0, UTC)
    assert copy.status.allocatable == node.status.allocatable
    assert copy.metadata.resource_version == node.metadata.resource_version


# --- the node model ----------------------------------------------------------------------------


def _model(clock: VirtualClock) -> tuple[NodeModel, Store]:
    store = Store(now=clock.utcnow)
    register_kinds(store)
    store.register(Lease)
    model = NodeModel(store=store, clock=clock, node_lost_grace=5.0, node_monitor_grace=40.0)
    return model, store


async def test_the_node_model_marks_a_stale_node_and_restores_a_renewed_one() -> None:
    clock = VirtualClock()
    model, store = _model(clock)
    start = clock.now()
    model.put(make_node("leased", gpus=8))
    model.put(make_node("static", gpus=8))  # no Lease
    model.lease_seen("leased", T0)
    await clock.advance(39)
    assert model.check_heartbeats() == []
    assert store.must_get_of(Node, "", "leased").ready
    await clock.advance(1)
    assert model.check_heartbeats() == ["leased"]
    model.lease_seen("leased", T0)  # seen again (another field changed), not renewed
    cached = store.must_get_of(Node, "", "leased")
    assert not cached.ready
    (ready,) = [c for c in cached.status.conditions if c.type == "Ready"]
    assert ready.reason == NODE_STATUS_UNKNOWN and "kube-node-lease/leased" in (ready.message or "")
    assert model.raw["leased"].ready  # what the API server holds is untouched
    assert model.lost_since["leased"] == start + 40
    await clock.advance(1000)
    model.check_heartbeats()
    assert store.must_get_of(Node, "", "static").ready and "static" not in model.lost_since
    model.put(make_node("leased", gpus=8))  # a Node update (still Ready) keeps it lost
    assert not store.must_get_of(Node, "", "leased").ready and "leased" in model.lost_since
    model.lease_seen("leased", T0 + timedelta(seconds=1))  # renewed
    assert store.must_get_of(Node, "", "leased").ready
    assert "leased" not in model.lost_since and not model.stale


async def test_a_stale_node_that_is_also_not_ready_stays_lost_and_a_deleted_lease_hands_back() -> None:
    clock = VirtualClock()
    model, store = _model(clock)
    model.put(make_node("gpu-0", gpus=8))
    model.lease_seen("gpu-0", T0)
    await clock.advance(40)
    model.check_heartbeats()
    since = model.lost_since["gpu-0"]
    model.put(make_node("gpu-0", gpus=8, ready=False))
    model.lease_seen("gpu-0", T0 + timedelta(seconds=5))  # renewed, but the node is NotReady
    assert not store.must_get_of(Node, "", "gpu-0").ready
    assert model.lost_since["gpu-0"] == since  # lost since the heartbeat stopped, not since now
    model.put(make_node("gpu-0", gpus=8))
    assert store.must_get_of(Node, "", "gpu-0").ready and "gpu-0" not in model.lost_since
    await clock.advance(40)
    model.check_heartbeats()
    assert not store.must_get_of(Node, "", "gpu-0").ready
    model.lease_gone("gpu-0")  # no Lease any more: judged by its Ready condition
    assert store.must_get_of(Node, "", "gpu-0").ready and "gpu-0" not in model.lost_since


# --- the platform over the API server ----------------------------------------------------------


async def test_a_node_whose_lease_goes_stale_takes_no_new_pods_and_loses_its_pods(
    served: FakeApiServerView,
) -> None:
    client = await connect(served)
    try:
        await client.create(NODES, to_json(make_node("gpu-0", gpus=8)))
        await client.create(LEASES, lease_body("gpu-0", renewed=datetime.now(UTC)))
        s = settings(served.kubeconfig, election=False, node_lost_grace=0.5, node_monitor_grace=2.0)
        async with platform(s) as p:
            assert p.store.get("Lease", "kube-node-lease", "gpu-0") is not None
            kubelet = asyncio.create_task(_heartbeats(client, "gpu-0"))  # alive until it goes quiet
            await client.create(TFJOBS, tfjob("running", workers=1, gpus=1))
            await eventually(
                lambda: any(x["spec"].get("nodeName") == "gpu-0" for x in job_pods(served, "running")),
                what="placed on gpu-0",
            )
            await play_kubelet(client, served, "running", phase="Running")
            kubelet.cancel()
            await asyncio.gather(kubelet, return_exceptions=True)
            loop = asyncio.get_running_loop()
            last_renewal = loop.time()
            renewed = datetime.now(UTC)
            await client.patch(  # the last heartbeat; then the kubelet goes quiet
                LEASES, "kube-node-lease", "gpu-0", {"spec": {"renewTime": _micro(renewed)}}
            )
            await eventually(  # gpuyard has seen it
                lambda: (
                    (lease := p.store.get_of(Lease, "kube-node-lease", "gpu-0")) is not None
                    and lease.spec.renew_time == renewed
                ),
                what="the last heartbeat in gpuyard's view",
            )
            node = await eventually(
                lambda: (n := p.store.must_get_of(Node, "", "gpu-0")) and not n.ready and n,
                what="gpu-0 NotReady in gpuyard's view",
            )
            assert loop.time() - last_renewal >= 2.0
            (ready,) = [c for c in node.status.conditions if c.type == "Ready"]
            assert (ready.status, ready.reason) == ("Unknown", "NodeStatusUnknown")
            assert "kube-node-lease/gpu-0" in (ready.message or "")
            server_node = served.get("nodes", "", "gpu-0")
            assert server_node is not None
            assert {c["type"]: c["status"] for c in server_node["status"]["conditions"]}["Ready"] == "True"
            await client.create(TFJOBS, tfjob("waiting", workers=1, gpus=1))
            pod = await eventually(
                lambda: (
                    (x := job_pods(served, "running"))
                    and x[0].get("status", {}).get("reason") == "NodeLost"
                    and x[0]
                ),
                what="NodeLost",
            )
            assert pod["status"]["phase"] == "Failed"
            assert loop.time() - last_renewal >= 2.5  # the monitor grace, then the lost grace
            assert not any(x["spec"].get("nodeName") for x in job_pods(served, "waiting"))
            await client.patch(LEASES, "kube-node-lease", "gpu-0", {"spec": {"renewTime": _now_micro()}})
            await eventually(lambda: p.store.must_get_of(Node, "", "gpu-0").ready, what="gpu-0 Ready again")
            await eventually(
                lambda: any(x["spec"].get("nodeName") == "gpu-0" for x in job_pods(served, "waiting")),
                what="the waiting job placed once the Lease is renewed",
            )
    finally:
        await client.close()


async def _heartbeats(client: Any, node: str) -> None:
    """A live kubelet: renews its node's Lease every 0.2 s."""
    while True:
        await client.patch(LEASES, "kube-node-lease", node, {"spec": {"renewTime": _now_micro()}})
        await asyncio.sleep(0.2)


def _now_micro() -> str:
    return _micro(datetime.now(UTC))


def _micro(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def test_a_renewed_lease_and_a_node_without_one_keep_their_nodes_ready(
    served: FakeApiServerView,
) -> None:
    client = await connect(served)

    async def kubelet(stop: asyncio.Event) -> None:
        while not stop.is_set():
            await client.patch(LEASES, "kube-node-lease", "leased", {"spec": {"renewTime": _now_micro()}})
            await asyncio.sleep(0.2)

    stop = asyncio.Event()
    renewing: asyncio.Task[None] | None = None
    try:
        await client.create(NODES, to_json(make_node("leased", gpus=8)))
        await client.create(NODES, to_json(make_node("static", gpus=8)))
        await client.create(LEASES, lease_body("leased", renewed=datetime.now(UTC)))
        s = settings(served.kubeconfig, election=False, node_lost_grace=0.5, node_monitor_grace=1.5)
        async with platform(s) as p:
            renewing = asyncio.create_task(kubelet(stop))
            await asyncio.sleep(3.2)  # more than twice the monitor grace
            assert p.store.must_get_of(Node, "", "leased").ready
            assert p.store.must_get_of(Node, "", "static").ready
            assert not p.backend.nodes.lost_since
            # a node without a Lease is lost as before: by its Ready condition
            await client.create(TFJOBS, tfjob("job", workers=2, gpus=8))
            await eventually(
                lambda: sum(1 for x in job_pods(served, "job") if x["spec"].get("nodeName")) == 2,
                what="both workers placed",
            )
            await play_kubelet(client, served, "job", phase="Running")
            not_ready = to_json(make_node("static", gpus=8, ready=False))["status"]["conditions"]
            await client.patch(NODES, "", "static", {"status": {"conditions": not_ready}}, sub="status")
            await eventually(
                lambda: any(
                    x["spec"].get("nodeName") == "static" and x.get("status", {}).get("reason") == "NodeLost"
                    for x in job_pods(served, "job")
                ),
                what="the static node's pod NodeLost",
            )
            assert all(
                x.get("status", {}).get("phase") == "Running"
                for x in job_pods(served, "job")
                if x["spec"].get("nodeName") == "leased"
            )
    finally:
        stop.set()
        if renewing is not None:
            await renewing
        await client.close()
