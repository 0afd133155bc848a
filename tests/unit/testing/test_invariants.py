"""The invariant checker (`gpuyard.platform.invariants`) over hand-built stores, and its harness hook."""

from __future__ import annotations

import json

import pytest

from gpuyard.apis.core import ContainerPort
from gpuyard.apis.jobs import parse_job
from gpuyard.apis.meta import ObjectMeta, OwnerReference
from gpuyard.apis.quantity import parse_quantity
from gpuyard.apis.quotakinds import ElasticQuota, ElasticQuotaSpec, ElasticQuotaStatus
from gpuyard.apis.scheduling import (
    ANNOTATION_DEVICES,
    GangRole,
    PodGroup,
    PodGroupSpec,
    PodGroupStatus,
    Reservation,
    ReservationSpec,
)
from gpuyard.platform.invariants import InvariantChecker, check_store
from gpuyard.state.store import Store
from gpuyard.testing import Cluster, InvariantViolation
from tests.builders import make_context, make_node, make_pod


def _store() -> Store:
    store = make_context().store
    store.create(make_node("n0", gpus=8, cpu="16", memory="64Gi"))
    store.create(make_node("n1", gpus=8, cpu="16", memory="64Gi"))
    return store


def _group(store: Store, name: str = "job", *, replicas: int = 2, phase: str = "Placed") -> PodGroup:
    pg = PodGroup(
        metadata=ObjectMeta(name=name, namespace="default"),
        spec=PodGroupSpec(roles=[GangRole(name="Worker", replicas=replicas)]),
        status=PodGroupStatus.model_validate({"phase": phase}),
    )
    return store.create(pg)


def _reserve(
    store: Store,
    name: str,
    *,
    node: str = "n0",
    gpus: tuple[int, ...] = (),
    cpu: str = "1",
    group: str = "job",
    ports: tuple[int, ...] = (),
    index: int = 0,
    milli: int = 0,
) -> Reservation:
    pg = store.get_of(PodGroup, "default", group)
    owners = [OwnerReference(api_version="x", kind="PodGroup", name=group, uid=pg.metadata.uid)] if pg else []
    res = Reservation(
        metadata=ObjectMeta(name=name, namespace="default", owner_references=owners),
        spec=ReservationSpec(
            pod_group=group,
            role="Worker",
            index=index,
            node=node,
            gpus=list(gpus),
            gpu_milli=milli,
            host_ports=list(ports),
            requests={"cpu": parse_quantity(cpu), "memory": parse_quantity("1Gi")},
        ),
    )
    return store.create(res)


def _names(store: Store, *, settled: bool = True) -> list[str]:
    return sorted(v.invariant for v in check_store(store, settled=settled))


def test_a_consistent_store_has_no_violation() -> None:
    store = _store()
    _group(store)
    _reserve(store, "job-worker-0", gpus=(0, 1), index=0)
    _reserve(store, "job-worker-1", gpus=(2, 3), index=1)
    assert check_store(store) == []


def test_a_gpu_held_twice_is_named_with_both_holders() -> None:
    store = _store()
    _group(store)
    _reserve(store, "job-worker-0", gpus=(0, 1), index=0)
    _reserve(store, "job-worker-1", gpus=(1, 2), index=1)
    found = check_store(store)
    assert [v.invariant for v in found] == ["gpu"]
    assert "GPU 1 is allocated 2000/1000" in found[0].message
    assert set(found[0].objects) >= {"Reservation/default/job-worker-0", "Reservation/default/job-worker-1"}


def test_gpu_shares_may_add_up_to_one_gpu_but_not_more() -> None:
    store = _store()
    _group(store, replicas=3)
    _reserve(store, "job-worker-0", gpus=(0,), milli=500, index=0)
    _reserve(store, "job-worker-1", gpus=(0,), milli=500, index=1)
    assert check_store(store, settled=False) == []
    _reserve(store, "job-worker-2", gpus=(0,), milli=100, index=2)
    assert _names(store) == ["gpu"]


def test_a_gpu_index_the_node_does_not_have() -> None:
    store = _store()
    _group(store, replicas=1)
    _reserve(store, "job-worker-0", gpus=(8,))
    found = check_store(store)
    assert [v.invariant for v in found] == ["gpu"]
    assert "GPUs 0..7" in found[0].message


def test_cpu_over_allocated_counts_reservations_and_pods_without_one() -> None:
    store = _store()
    _group(store, replicas=2)
    _reserve(store, "job-worker-0", cpu="10", index=0)
    _reserve(store, "job-worker-1", cpu="4", index=1)
    assert check_store(store) == []
    bare = make_pod("bare", node="n0", cpu="3")
    bare.status.phase = "Running"
    store.create(bare)
    found = check_store(store)
    assert [v.invariant for v in found] == ["capacity"]
    assert "cpu 17 requested by 3 pods, allocatable 16" in found[0].message


def test_a_pod_made_from_its_reservation_is_not_counted_twice() -> None:
    store = _store()
    _group(store, replicas=1)
    _reserve(store, "job-worker-0", cpu="10", gpus=(0, 1, 2, 3, 4, 5, 6, 7))
    pod = make_pod(
        "job-worker-0",
        node="n0",
        cpu="10",
        gpus=8,
        annotations={ANNOTATION_DEVICES: json.dumps({"gpus": list(range(8))})},
    )
    pod.status.phase = "Running"
    store.create(pod)
    assert check_store(store) == []


def test_a_pod_on_another_node_than_its_reservation() -> None:
    store = _store()
    _group(store, replicas=1)
    _reserve(store, "job-worker-0", node="n0")
    pod = make_pod("job-worker-0", node="n1")
    pod.status.phase = "Running"
    store.create(pod)
    assert _names(store) == ["placement"]


def test_finished_pods_hold_nothing() -> None:
    store = _store()
    _group(store, replicas=1)
    _reserve(store, "job-worker-0", gpus=(0,))
    done = make_pod("old", node="n0", annotations={ANNOTATION_DEVICES: json.dumps({"gpus": [0]})})
    done.status.phase = "Succeeded"
    store.create(done)
    assert check_store(store) == []
    running = make_pod("other", node="n0", annotations={ANNOTATION_DEVICES: json.dumps({"gpus": [0]})})
    running.status.phase = "Running"
    store.create(running)
    assert _names(store) == ["gpu"]


def test_a_host_port_held_twice_on_one_node() -> None:
    store = _store()
    _group(store)
    _reserve(store, "job-worker-0", ports=(20000,), index=0)
    _reserve(store, "job-worker-1", ports=(20000,), node="n1", index=1)
    assert check_store(store) == []  # other node
    pod = make_pod("bare", node="n0")
    pod.spec.containers[0].ports = [ContainerPort(container_port=80, host_port=20000)]
    pod.status.phase = "Running"
    store.create(pod)
    assert _names(store) == ["host-port"]


def test_a_reservation_on_a_node_that_does_not_exist() -> None:
    store = _store()
    _group(store, replicas=1)
    _reserve(store, "job-worker-0", node="gone")
    found = check_store(store)
    assert [v.invariant for v in found] == ["placement"]
    assert "'gone'" in found[0].message


def test_reservations_of_a_podgroup_that_is_gone_are_settled_violations() -> None:
    store = _store()
    _reserve(store, "job-worker-0", group="ghost")
    assert check_store(store, settled=False) == []
    found = check_store(store)
    assert [v.invariant for v in found] == ["owner"]
    assert "PodGroup default/ghost" in found[0].message


def test_a_pod_whose_job_is_gone() -> None:
    store = _store()
    pod = make_pod("orphan-worker-0")
    pod.metadata.owner_references = [
        OwnerReference(api_version="kubeflow.org/v1", kind="PyTorchJob", name="orphan", uid="u-1")
    ]
    store.create(pod)
    store.create(make_pod("users-own-pod"))  # no owner: not the operator's
    found = check_store(store)
    assert [v.invariant for v in found] == ["owner"]
    assert "PyTorchJob default/orphan" in found[0].message


def _job(store: Store, *, phase: str) -> None:
    job = parse_job(
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "job", "namespace": "default"},
            "spec": {
                "pytorchReplicaSpecs": {
                    "Worker": {
                        "replicas": 2,
                        "template": {"spec": {"containers": [{"name": "pytorch", "image": "x"}]}},
                    }
                }
            },
        }
    )
    job.status.phase = phase
    store.create(job)


def test_a_running_jobs_placed_gang_below_its_minimum() -> None:
    store = _store()
    _job(store, phase="Running")
    _group(store, replicas=2)
    _reserve(store, "job-worker-0", index=0)
    found = check_store(store)
    assert [v.invariant for v in found] == ["gang-minimum"]
    assert "Worker 1/2" in found[0].message
    assert check_store(store, settled=False) == []


def test_a_restarting_job_may_wait_below_its_minimum_for_room() -> None:
    store = _store()
    _job(store, phase="Restarting")
    _group(store, replicas=2)
    _reserve(store, "job-worker-0", index=0)
    assert check_store(store) == []


def test_a_gang_releasing_a_pod_for_failover_is_not_below_its_minimum() -> None:
    store = _store()
    _job(store, phase="Running")
    pg = _group(store, replicas=2)
    _reserve(store, "job-worker-0", index=0)
    pg.spec.release = {"job-worker-1": "uid-of-the-old-reservation"}
    store.update(pg)
    assert check_store(store) == []


def _quota(store: Store, *, used: str, runtime: str, top: str) -> None:
    gpu = "nvidia.com/gpu"
    store.create(
        ElasticQuota(
            metadata=ObjectMeta(name="team-a", namespace="default"),
            spec=ElasticQuotaSpec(max={gpu: parse_quantity(top)}),
            status=ElasticQuotaStatus(
                used={gpu: parse_quantity(used)}, runtime={gpu: parse_quantity(runtime)}
            ),
        )
    )


def test_quota_use_above_max_is_always_a_violation() -> None:
    store = _store()
    _quota(store, used="9", runtime="9", top="8")
    assert _names(store, settled=False) == ["quota-max"]


def test_quota_use_above_runtime_only_while_no_reclaim_is_under_way() -> None:
    store = _store()
    _quota(store, used="6", runtime="4", top="8")
    assert _names(store) == ["quota-runtime"]
    pg = _group(store, replicas=1)
    _reserve(store, "job-worker-0")
    pg.status.evictions = {"job-worker-0": "reclaimed by quota team-b (min 4) for default/b: borrowed"}
    store.update(pg)
    assert check_store(store) == []


def test_the_checker_sees_versions_going_back() -> None:
    store = _store()
    checker = InvariantChecker()
    assert checker.check(store) == []
    older = make_context().store  # a store restarted from an older version
    older.create(make_node("n0"))
    found = checker.check(older)
    assert [v.invariant for v in found] == ["resource-version"]
    assert "went back" in found[0].message


JOB = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: ddp, namespace: default}
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: 2
      template:
        metadata: {annotations: {fake.gpuyard.io/duration: "600"}}
        spec: {containers: [{name: pytorch, image: x, resources: {limits: {nvidia.com/gpu: 4}}}]}
"""


def _steal_gpus(c: Cluster) -> None:
    """A pod the platform did not place, on GPUs a Reservation holds (written past the writer)."""
    res = c.store.list_of(Reservation)[0]
    pod = make_pod(
        "intruder", node=res.spec.node, annotations={ANNOTATION_DEVICES: json.dumps({"gpus": res.spec.gpus})}
    )
    pod.status.phase = "Running"
    c.store.create(pod)


async def test_the_harness_fails_a_test_when_an_invariant_breaks() -> None:
    async with Cluster.start(nodes=[("dgx1-v100", 1)]) as c:
        assert c.invariants is not None and c.invariants.attached
        job = await c.submit(JOB)
        await c.run_until(job, "Running")
        assert c.invariants.cycles >= 1
        _steal_gpus(c)
        with pytest.raises(InvariantViolation, match=r"after advancing to t=.*GPU \d is allocated 2000/1000"):
            await c.advance(1)


@pytest.mark.gpuyard_no_invariants
async def test_the_marker_turns_the_checks_off() -> None:
    async with Cluster.start(nodes=[("dgx1-v100", 1)]) as c:
        assert c.invariants is None
        job = await c.submit(JOB)
        await c.run_until(job, "Running")
        _steal_gpus(c)
        await c.advance(1)
