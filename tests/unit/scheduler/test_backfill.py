"""No head-of-line blocking: backfill against the head's planned placement on real nodes.

The issue's measured cases: two 8-GPU nodes with 3 + 5 GPUs free. A waiting 2 x 4-GPU gang (or
a 1 x 6-GPU job) is the head; a 1-GPU (or 3-GPU) job of another namespace fits elsewhere and must
start at once, while the room the head's planned placement needs stays held for it. Held room is
taken only by a job ahead of the head in the queue order (priority, then fair share across
queues, then submit time), and only when it fits nowhere else.
"""

from __future__ import annotations

from gpuyard.scheduler.core import SchedulerState
from gpuyard.scheduler.decisions import PlaceGang
from tests.unit.scheduler.helpers import make_node, podgroup, role
from tests.unit.scheduler.test_core import Cluster, core, of, step


def on(node: str) -> dict[str, str]:
    return {"kubernetes.io/hostname": node}


def busy_cluster() -> Cluster:
    """n1 with 3 GPUs free, n2 with 5 free."""
    return Cluster(
        make_node("n1", gpus=8),
        make_node("n2", gpus=8),
        podgroup("f1", role(gpus=5, node_selector=on("n1"))),
        podgroup("f2", role(gpus=3, node_selector=on("n2"))),
    )


def held_for_a_2x4_head(cluster: Cluster) -> tuple[SchedulerState, str]:
    """The cluster's jobs placed, then a 2 x 4-GPU head that waits: the state and the one node
    where room is held for it."""
    state = core(cluster)
    step(state, cluster)
    cluster.put(podgroup("head", role(replicas=2, gpus=4)))
    step(state, cluster, now=1.0)
    hold = state.claims.holds.get(("default", "head"))
    assert hold is not None
    (node,) = hold.nodes
    return state, node


def placed(decisions: list) -> list[tuple[str, str]]:
    return [g.key for g in of(PlaceGang, decisions)]


def test_a_2x4_head_does_not_block_a_1_gpu_job_of_another_namespace() -> None:
    cluster = busy_cluster()
    state = core(cluster)
    assert placed(step(state, cluster)) == [("default", "f1"), ("default", "f2")]
    cluster.put(podgroup("head", role(replicas=2, gpus=4)))
    assert placed(step(state, cluster, now=1.0)) == []
    head = cluster.get("PodGroup", "default", "head").status
    assert head.phase == "Pending" and "room is held for it" in head.message
    cluster.put(podgroup("small", role(gpus=1), namespace="other"))
    assert placed(step(state, cluster, now=2.0)) == [("other", "small")]
    # it went where the head's planned placement does not need the room
    res = cluster.get("Reservation", "other", "small-worker-0")
    held = state.claims.holds.get(("default", "head"))
    assert held is not None and res.spec.node not in held.nodes


def test_a_1x6_head_does_not_block_a_3_gpu_job() -> None:
    cluster = busy_cluster()
    state = core(cluster)
    step(state, cluster)
    cluster.put(podgroup("head", role(gpus=6)))
    assert placed(step(state, cluster, now=1.0)) == []
    assert "room is held for it" in cluster.get("PodGroup", "default", "head").status.message
    cluster.put(podgroup("three", role(gpus=3), namespace="other"))
    assert placed(step(state, cluster, now=2.0)) == [("other", "three")]


def test_a_job_that_would_take_the_heads_room_waits_and_says_why() -> None:
    """A job behind the head in the queue order (here: of a namespace that already uses more
    than the head's, so behind it by fair share) may not take its held room."""
    cluster = busy_cluster()
    cluster.put(make_node("n3", gpus=16))
    cluster.put(podgroup("o1", role(gpus=16, node_selector=on("n3")), namespace="other"))
    state, node = held_for_a_2x4_head(cluster)
    cluster.put(podgroup("thief", role(gpus=1, node_selector=on(node)), namespace="other"))
    assert placed(step(state, cluster, now=2.0)) == []
    message = cluster.get("PodGroup", "other", "thief").status.message
    assert "free room for a job that waits ahead" in message
    assert "head" not in message.split("waits ahead")[0]  # another namespace's job is not named
    # once the running job there ends, the head starts on its planned node
    blocker = "f1" if node == "n1" else "f2"
    cluster.delete("PodGroup", "default", blocker)
    out = step(state, cluster, now=3.0)
    assert ("default", "head") in placed(out)
    assert state.claims.holds.get(("default", "head")) is None


def test_a_job_of_a_queue_ahead_by_fair_share_takes_held_room_only_when_nothing_else_fits() -> None:
    cluster = busy_cluster()
    state, node = held_for_a_2x4_head(cluster)
    # "other" uses nothing: it is ahead of the head's namespace, and this job fits only there
    cluster.put(podgroup("pinned", role(gpus=1, node_selector=on(node)), namespace="other"))
    assert placed(step(state, cluster, now=2.0)) == [("other", "pinned")]


def test_a_gang_no_empty_cluster_could_hold_says_it_can_never_fit() -> None:
    cluster = Cluster(make_node("n1", gpus=8), make_node("n2", gpus=8))
    state = core(cluster)
    cluster.put(
        podgroup("big", role(gpus=8), role("PS", replicas=1, gpus=8), role("Extra", replicas=1, gpus=4))
    )
    step(state, cluster)
    cluster.put(podgroup("nine", role(gpus=9)))
    step(state, cluster, now=1.0)
    message = cluster.get("PodGroup", "default", "nine").status.message
    assert message.startswith("can never fit on this cluster: Worker needs 1 pod of 9 GPUs")
    assert "(the largest: 8 GPUs" in message
    assert state.claims.holds.get(("default", "nine")) is None
    cluster.put(podgroup("small", role(gpus=2)))
    assert placed(step(state, cluster, now=2.0)) == [("default", "small")]


def test_a_job_that_can_never_fit_is_tried_once_until_the_cluster_or_the_job_changes(monkeypatch) -> None:
    import gpuyard.scheduler.cycle.attempting as attempting

    tries: list[tuple[str, str]] = []
    real = attempting.schedule_one

    def counted(state, key, **kw):  # type: ignore[no-untyped-def]
        tries.append(key)
        return real(state, key, **kw)

    monkeypatch.setattr(attempting, "schedule_one", counted)
    cluster = Cluster(make_node("n1", gpus=8))
    state = core(cluster)
    cluster.put(podgroup("nine", role(gpus=9)))
    now = 1.0
    for i in range(3):  # other jobs start and end meanwhile: room frees, parked jobs are woken
        cluster.put(podgroup(f"small-{i}", role(gpus=1)))
        assert placed(step(state, cluster, now=now)) == [("default", f"small-{i}")]
        cluster.delete("PodGroup", "default", f"small-{i}")
        step(state, cluster, now=now + 0.5)
        now += 1
    assert tries.count(("default", "nine")) == 1
    assert cluster.get("PodGroup", "default", "nine").status.message.startswith("can never fit")
    cluster.put(make_node("n2", gpus=16))  # a node that could hold it joins: tried again, placed
    assert placed(step(state, cluster, now=now)) == [("default", "nine")]
    assert tries.count(("default", "nine")) == 2
    cluster.put(podgroup("ten", role(gpus=17)))
    step(state, cluster, now=now + 1)
    cluster.put(podgroup("ten", role(gpus=4)))  # the job itself changes: tried again, placed
    assert placed(step(state, cluster, now=now + 2)) == [("default", "ten")]
    assert tries.count(("default", "ten")) == 2
