"""The operator's planning step with plain data: an Observed snapshot in, a Plan out (no store, no loop)."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuyard.apis.core import Pod
from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.meta import OwnerReference
from gpuyard.apis.scheduling import GROUP, PodGroup, Reservation
from gpuyard.controllers.judging import Replica
from gpuyard.controllers.materializing import build_pod
from gpuyard.controllers.observing import Observed
from gpuyard.controllers.planning import Plan, plan
from gpuyard.controllers.podgroups import PodGroupChange, build_pod_group, changed_pod_group
from gpuyard.controllers.workloads.registry import plugin_for
from gpuyard.fakecluster.kubelet import terminate
from tests.unit.controllers.fakes import reserve, tf_job

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def stored(job: TrainingJob) -> TrainingJob:
    """The job as the store holds it: a uid and a generation."""
    job.metadata.uid = "job-uid"
    job.metadata.generation = 1
    job.metadata.resource_version = "7"
    return job


def gang(job: TrainingJob, *, phase: str = "Placed") -> tuple[PodGroup, dict[str, Reservation]]:
    pg = build_pod_group(job, plugin_for(job.kind))
    pg.metadata.uid = "pg-uid"
    pg.status.phase = phase  # type: ignore[assignment]
    held = reserve(job)
    for name, res in held.items():
        res.metadata.uid = f"uid-{name}"
        res.metadata.owner_references = [
            OwnerReference(api_version=GROUP, kind="PodGroup", name=pg.metadata.name, uid="pg-uid")
        ]
    return pg, held


def pod(job: TrainingJob, res: Reservation, phase: str = "Running") -> Pod:
    p = build_pod(job, res.spec.role, res.spec.index, plugin=plugin_for(job.kind), reservation=res)
    p.metadata.uid = f"pod-{res.metadata.name}"
    p.status.phase = phase  # type: ignore[assignment]
    return p


def observed(
    job: TrainingJob,
    *,
    pg: PodGroup | None,
    held: dict[str, Reservation],
    pods: dict[str, Pod] | None = None,
    unusable: frozenset[str] = frozenset(),
    leftovers: int = 0,
) -> Observed:
    pods = pods or {}
    replicas = []
    for role in job.roles():
        for index in range(job.replica_specs[role].count):
            name = f"{job.metadata.name}-{role.lower()}-{index}"
            replicas.append(Replica(role, index, name, pods.get(name), held.get(name)))
    return Observed(
        replicas=replicas,
        extra_pods=[],
        stale_pods=[],
        reservations=held,
        services={},
        pod_group=pg,
        leftovers=leftovers,
        unusable=unusable,
    )


def decide(job: TrainingJob, obs: Observed) -> Plan:
    return plan(job, plugin=plugin_for(job.kind), observed=obs, now=NOW)


def running(job: TrainingJob) -> tuple[PodGroup, dict[str, Reservation], dict[str, Pod]]:
    """A job whose gang is placed and whose every pod runs."""
    job.status.start_time = NOW
    job.status.phase = "Running"
    pg, held = gang(job)
    return pg, held, {name: pod(job, res) for name, res in held.items()}


def test_a_new_job_creates_its_pod_group_and_queues() -> None:
    job = stored(tf_job())
    out = decide(job, observed(job, pg=None, held={}))
    assert out.create_pod_group is not None and out.create_pod_group.spec.job_kind == "TFJob"
    assert [e.reason for e in out.report.events] == ["JobCreated", "JobQueuing"]
    assert out.status["phase"] == "Queuing" and not out.create_pods


def test_no_pod_group_while_an_earlier_gangs_reservations_are_collected() -> None:
    job = stored(tf_job())
    out = decide(job, observed(job, pg=None, held={}, leftovers=2))
    assert out.create_pod_group is None


def test_pods_wait_for_the_pod_group_to_be_placed_then_follow_start_order() -> None:
    job = stored(tf_job())
    pg, held = gang(job, phase="Pending")
    out = decide(job, observed(job, pg=pg, held=held))
    assert not out.create_pods
    assert [s.metadata.name for s in out.services] == ["tf-ps-0", "tf-worker-0", "tf-worker-1"]
    pg.status.phase = "Placed"
    out = decide(job, observed(job, pg=pg, held=held))
    assert [p.metadata.name for p in out.create_pods] == ["tf-ps-0"]  # workers wait for PS Running
    assert out.create_pods[0].spec.node_name == held["tf-ps-0"].spec.node
    assert out.held == {name: f"uid-{name}" for name in held}


def test_a_released_reservation_is_not_used_again() -> None:
    job = stored(tf_job())
    pg, held = gang(job)
    pg.spec.release = {"tf-ps-0": "uid-tf-ps-0"}
    out = decide(job, observed(job, pg=pg, held=held))
    assert not out.create_pods and "tf-ps-0" not in out.held
    assert not out.pod_group.release  # already asked for: nothing new to write
    assert not out.pod_group


def test_exit_137_restarts_in_place_from_the_same_reservation() -> None:
    job = stored(tf_job())
    pg, held, pods = running(job)
    failed = pods["tf-worker-1"]
    terminate(failed, exit_code=137, reason=None, message=None, now=NOW)
    out = decide(job, observed(job, pg=pg, held=held, pods=pods))
    assert out.status["restarts"] == 1 and out.status["phase"] == "Restarting"
    assert [p.metadata.name for p in out.delete_pods] == ["tf-worker-1"]
    assert [p.metadata.name for p in out.create_pods] == ["tf-worker-1"]
    assert not out.pod_group.release and not out.pod_group.preferred


def test_node_lost_releases_the_reservation_and_asks_for_the_same_node() -> None:
    job = stored(tf_job())
    pg, held, pods = running(job)
    terminate(pods["tf-worker-0"], exit_code=None, reason="NodeLost", message=None, now=NOW)
    out = decide(job, observed(job, pg=pg, held=held, pods=pods, unusable=frozenset({"tf-worker-0"})))
    assert out.status["restarts"] == 1
    assert out.pod_group.release == {"tf-worker-0": "uid-tf-worker-0"}
    assert out.pod_group.preferred == {"tf-worker-0": held["tf-worker-0"].spec.node}
    assert not out.create_pods  # placed again by the scheduler first
    new = changed_pod_group(pg, out.pod_group)
    assert new is not None and new.spec.release == {"tf-worker-0": "uid-tf-worker-0"}
    assert new.status == pg.status  # the spec only: the status is the scheduler's


def test_an_unhealthy_gpu_moves_a_pod_that_failed_for_another_reason() -> None:
    job = stored(tf_job())
    pg, held, pods = running(job)
    terminate(pods["tf-worker-0"], exit_code=137, reason=None, message=None, now=NOW)
    out = decide(job, observed(job, pg=pg, held=held, pods=pods, unusable=frozenset({"tf-worker-0"})))
    assert out.pod_group.release == {"tf-worker-0": "uid-tf-worker-0"}


def test_evicted_pods_stop_uncounted_and_their_reservations_are_released() -> None:
    job = stored(tf_job())
    pg, held, pods = running(job)
    pg.status.phase = "Pending"
    pg.status.evictions = {"tf-worker-0": "preempted by team-a/big (priority 100)"}
    out = decide(job, observed(job, pg=pg, held=held, pods=pods))
    assert [p.metadata.name for p in out.delete_pods] == ["tf-worker-0"]
    assert out.pod_group.release == {"tf-worker-0": "uid-tf-worker-0"}
    assert "restarts" not in out.status  # not a restart against backoffLimit
    assert out.status["phase"] == "Restarting"
    message = out.report.status.condition("Restarting").message  # type: ignore[union-attr]
    assert message == (
        "TFJob tf is restarting because 1 replica(s) were preempted "
        "(preempted by team-a/big (priority 100)): tf-worker-0."
    )
    assert not out.create_pods


def test_a_running_pod_whose_reservation_vanished_is_stopped() -> None:
    job = stored(tf_job())
    pg, held, pods = running(job)
    del held["tf-worker-1"]  # a lost node, a recreated PodGroup: no release was asked for
    out = decide(job, observed(job, pg=pg, held=held, pods=pods))
    assert [p.metadata.name for p in out.delete_pods] == ["tf-worker-1"]
    assert "lost their placement: tf-worker-1" in out.report.status.condition("Restarting").message  # type: ignore[union-attr]
    assert not out.pod_group.release


def test_scaled_in_replicas_give_their_reservations_back() -> None:
    job = stored(tf_job(workers=2))
    pg, held, pods = running(job)
    job.replica_specs["Worker"].replicas = 1
    job.metadata.generation = 2
    extra = pods.pop("tf-worker-1")
    obs = observed(job, pg=pg, held=held, pods=pods)
    obs.extra_pods = [extra]
    out = decide(job, obs)
    assert extra in out.delete_pods
    assert out.pod_group.release == {"tf-worker-1": "uid-tf-worker-1"}
    assert out.pod_group.spec is not None and [r.replicas for r in out.pod_group.spec.roles] == [1, 1]


def test_suspend_stops_every_pod_and_releases_every_reservation() -> None:
    job = stored(tf_job())
    pg, held, pods = running(job)
    job.spec.suspend = True  # type: ignore[attr-defined]
    job.metadata.generation = 2
    out = decide(job, observed(job, pg=pg, held=held, pods=pods))
    assert sorted(p.metadata.name for p in out.delete_pods) == sorted(pods)
    assert out.pod_group.release == {name: f"uid-{name}" for name in held}
    new = changed_pod_group(pg, out.pod_group)
    assert new is not None and new.spec.suspend and new.spec.release == out.pod_group.release
    assert out.status["phase"] == "Suspended"


def test_a_finished_job_deletes_its_pod_group_and_stops_running_pods() -> None:
    job = stored(tf_job())
    pg, held, pods = running(job)
    terminate(pods["tf-worker-0"], exit_code=0, reason=None, message=None, now=NOW)
    out = decide(job, observed(job, pg=pg, held=held, pods=pods))
    assert out.status["phase"] == "Succeeded"
    assert out.delete_pod_group is pg  # the scheduler collects its Reservations
    assert sorted(p.metadata.name for p in out.delete_pods) == ["tf-ps-0", "tf-worker-1"]
    assert not out.pod_group and not out.create_pods


def test_pod_group_change_prunes_done_releases_and_keeps_the_rest() -> None:
    job = stored(tf_job())
    pg, _ = gang(job)
    pg.metadata.annotations["gpuyard.io/job-generation"] = "1"
    pg.spec.release = {"tf-ps-0": "old", "tf-worker-0": "uid-w0"}
    change = PodGroupChange(generation="1", existing={"tf-ps-0": "new", "tf-worker-0": "uid-w0"}, prune=True)
    new = changed_pod_group(pg, change)
    assert new is not None and new.spec.release == {"tf-worker-0": "uid-w0"}
    assert changed_pod_group(new, change) is None  # nothing left to change


def test_a_respec_keeps_the_requests_to_the_scheduler() -> None:
    job = stored(tf_job())
    pg, _ = gang(job)
    pg.spec.release = {"tf-ps-0": "uid-tf-ps-0"}
    pg.spec.preferred_nodes = {"tf-ps-0": "node-a"}
    spec = build_pod_group(job, plugin_for(job.kind)).spec
    spec.roles[1].replicas = 5
    change = PodGroupChange(spec=spec, generation="2", existing={"tf-ps-0": "uid-tf-ps-0"})
    new = changed_pod_group(pg, change)
    assert new is not None and new.spec.roles[1].replicas == 5
    assert new.spec.release == {"tf-ps-0": "uid-tf-ps-0"} and new.spec.preferred_nodes == {
        "tf-ps-0": "node-a"
    }
    assert new.metadata.annotations["gpuyard.io/job-generation"] == "2"
