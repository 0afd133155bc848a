"""Elastic victims in the scheduler core: only replicas above an elastic job's minimum are
evicted when that frees enough room; the job stays placed and admitted."""

from __future__ import annotations

from typing import Any

from gpuyard.apis.scheduling import PodGroup
from gpuyard.scheduler.decisions import PlaceGang
from gpuyard.scheduler.preemption.elastic import ANNOTATION_ELASTIC, surplus_pods
from tests.unit.scheduler.helpers import make_node, podgroup, role
from tests.unit.scheduler.test_core import Cluster, core, of, step
from tests.unit.scheduler.test_preemption import evicted, release, urgent


def elastic(name: str, *, replicas: int, minimum: int, gpus: int, flag: bool = True) -> Any:
    pg = podgroup(name, role(replicas=replicas, gpus=gpus, min_available=minimum), namespace="t")
    if flag:
        pg.metadata.annotations[ANNOTATION_ELASTIC] = "true"
    return pg


def test_surplus_pods_are_the_highest_indices_above_the_minimum() -> None:
    pg = elastic("e", replicas=4, minimum=2, gpus=1)
    held = {f"e-worker-{i}": "n1" for i in range(4)}
    assert surplus_pods(pg, held) == ["e-worker-3", "e-worker-2"]
    assert surplus_pods(pg, {"e-worker-0": "n1", "e-worker-1": "n1"}) == []
    not_elastic = PodGroup.model_validate(pg.model_dump(by_alias=True))
    not_elastic.metadata.annotations.clear()
    assert surplus_pods(not_elastic, held) == []


def test_an_elastic_job_loses_only_its_surplus_and_keeps_running() -> None:
    cluster = Cluster(make_node("n1", gpus=8))
    state = core(cluster)
    cluster.put(elastic("e", replicas=4, minimum=2, gpus=2))
    step(state, cluster)
    cluster.put(urgent(gpus=4))
    step(state, cluster, now=10.0)
    assert set(evicted(cluster, "t", "e")) == {"e-worker-2", "e-worker-3"}
    status = cluster.get("PodGroup", "t", "e").status
    assert (status.phase, status.reason, status.placed) == ("Placed", "Shrunk", 2)
    assert state.queue.is_running(("t", "e"))  # still admitted
    release(cluster, "t", "e")
    out = step(state, cluster, now=11.0) + step(state, cluster, now=12.0)
    assert ("u", "urgent") in [g.key for g in of(PlaceGang, out)]
    assert set(state.cache.snapshot.placed_pods(("t", "e"))) == {"e-worker-0", "e-worker-1"}
    assert state.queue.is_running(("t", "e"))


def test_without_the_elastic_mark_the_job_is_preempted_whole() -> None:
    cluster = Cluster(make_node("n1", gpus=8))
    state = core(cluster)
    cluster.put(elastic("e", replicas=4, minimum=2, gpus=2, flag=False))
    step(state, cluster)
    cluster.put(urgent(gpus=4))
    step(state, cluster, now=10.0)
    assert len(evicted(cluster, "t", "e")) == 4


def test_when_the_surplus_is_not_enough_whole_gangs_go() -> None:
    cluster = Cluster(make_node("n1", gpus=8))
    state = core(cluster)
    cluster.put(elastic("e", replicas=4, minimum=3, gpus=2))
    step(state, cluster)
    cluster.put(urgent(gpus=4))  # the surplus (one replica, 2 GPUs) does not free 4 GPUs
    step(state, cluster, now=10.0)
    assert len(evicted(cluster, "t", "e")) == 4
    assert cluster.get("PodGroup", "t", "e").status.reason == "Preempted"
