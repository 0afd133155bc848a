"""The job reconciler against a scripted backend and a tiny gang scheduler, on a virtual clock."""

from __future__ import annotations

import json
from typing import Any

from gpuyard.apis.core import NodeCondition
from gpuyard.apis.scheduling import ANNOTATION_DEVICES
from tests.unit.controllers.conftest import OperatorEnv
from tests.unit.controllers.fakes import evict, job_from, load_job, tf_job


def conditions(env: OperatorEnv, ns: str, name: str) -> list[tuple[str, str]]:
    return [(c.type, c.status) for c in env.job(ns, name).status.conditions]


async def start(env: OperatorEnv, job: Any) -> None:
    """Submit, let PS start, then workers: the job is Running."""
    env.submit(job)
    await env.settle()
    for _ in range(3):
        env.backend.run_all(job.metadata.namespace, job.metadata.name)
        await env.settle()
    assert env.job(job.metadata.namespace, job.metadata.name).status.phase == "Running"


# --- gang, start order, services --------------------------------------------------------------


async def test_gang_is_reserved_whole_then_pods_follow_start_order(env: OperatorEnv) -> None:
    env.submit(tf_job(ps=2, workers=3))
    await env.settle()
    pg = env.pod_group("team-a", "tf")
    assert pg is not None and [r.name for r in pg.spec.roles] == ["PS", "Worker"]
    assert pg.spec.queue == "team-a" and pg.spec.job_kind == "TFJob"
    assert len(env.reservations("team-a")) == 5  # the whole gang placed up front
    assert sorted(env.pods("team-a")) == ["tf-ps-0", "tf-ps-1"]  # workers wait for PS Running
    assert len(env.store.list("Service", namespace="team-a")) == 5
    assert env.job("team-a", "tf").status.phase == "Queuing"
    env.backend.set_phase("team-a", "tf-ps-0", "Running")
    await env.settle()
    assert sorted(env.pods("team-a")) == ["tf-ps-0", "tf-ps-1"]  # one PS is not enough
    env.backend.set_phase("team-a", "tf-ps-1", "Running")
    await env.settle()
    assert sorted(env.pods("team-a")) == ["tf-ps-0", "tf-ps-1", "tf-worker-0", "tf-worker-1", "tf-worker-2"]
    worker = env.pods("team-a")["tf-worker-0"]
    devices = json.loads(worker.metadata.annotations[ANNOTATION_DEVICES])  # type: ignore[attr-defined]
    assert devices["gpus"] == [0] and worker.spec.node_name  # type: ignore[attr-defined]
    assert env.job("team-a", "tf").status.phase == "Running"
    assert ("Created", "True") in conditions(env, "team-a", "tf")


async def test_depends_on_override_starts_everything_at_once(env: OperatorEnv) -> None:
    job = tf_job(ps=1, workers=2)
    job.replica_specs["Worker"].depends_on = []
    env.submit(job)
    await env.settle()
    assert sorted(env.pods("team-a")) == ["tf-ps-0", "tf-worker-0", "tf-worker-1"]


async def test_depends_on_succeeded_waits_for_upstream_to_finish(env: OperatorEnv) -> None:
    job = tf_job(ps=1, workers=1)
    from gpuyard.apis.jobspecs import DAGCondition

    job.replica_specs["Worker"].depends_on = [DAGCondition(upstream="PS", on_phase="Succeeded")]
    env.submit(job)
    await env.settle()
    env.backend.run_all("team-a", "tf")
    await env.settle()
    assert sorted(env.pods("team-a")) == ["tf-ps-0"]  # Running is not enough
    env.backend.finish("team-a", "tf-ps-0", exit_code=0)
    await env.settle()
    assert "tf-worker-0" in env.pods("team-a")
    assert env.job("team-a", "tf").status.phase not in ("Succeeded", "Failed")


async def test_job_queues_with_the_schedulers_reason(env: OperatorEnv) -> None:
    env.scheduler.hold = True
    env.submit(tf_job())
    await env.settle()
    env.store.mutate(
        "PodGroup", "team-a", "tf", lambda pg: setattr(pg.status, "message", "needs 2 nodes x 1 GPU")
    )
    await env.settle()
    job = env.job("team-a", "tf")
    assert job.status.phase == "Queuing"
    assert job.status.condition("Queuing").message == "TFJob tf is queuing: needs 2 nodes x 1 GPU"  # type: ignore[union-attr]
    assert not env.pods("team-a")


async def test_a_settled_job_is_planned_again_only_when_it_or_what_it_owns_changes(env: OperatorEnv) -> None:
    env.scheduler.hold = True
    env.submit(tf_job())
    await env.settle()
    skipped = env.operator.skipped
    env.store.mutate("PodGroup", "team-a", "tf", lambda pg: setattr(pg.status, "message", "no room"))
    await env.settle()
    assert env.job("team-a", "tf").status.condition("Queuing").message == "TFJob tf is queuing: no room"  # type: ignore[union-attr]
    # planned for the PodGroup's change; its own status write came back and was skipped (the
    # fixture plans each skipped pass anyway and checks that nothing would have been written)
    assert env.operator.skipped == skipped + 1 and env.operator.checked == env.operator.skipped
    env.store.mutate("TFJob", "team-a", "tf", lambda j: j.metadata.labels.update({"x": "y"}))
    await env.settle()  # the job changed (a label): planned again, the PodGroup's labels follow
    assert env.pod_group("team-a", "tf").metadata.labels.get("x") == "y"  # type: ignore[union-attr]


async def test_the_queuing_condition_turned_false_does_not_keep_saying_it_is_queuing(
    env: OperatorEnv,
) -> None:
    await start(env, tf_job())
    status = env.job("team-a", "tf").status
    assert status.phase == "Running"
    queuing = status.condition("Queuing")
    assert queuing is not None and queuing.status == "False"
    assert "is queuing" not in queuing.message
    assert queuing.message == "No longer queuing: TFJob tf is running."


# --- completion, cleanPodPolicy, TTL, deadline -------------------------------------------------


async def test_success_stops_running_pods_and_frees_resources(env: OperatorEnv) -> None:
    job = tf_job()
    await start(env, job)
    for i in range(2):
        env.backend.finish("team-a", f"tf-worker-{i}", exit_code=0)
    await env.settle()
    status = env.job("team-a", "tf").status
    assert status.phase == "Succeeded" and status.completion_time is not None
    assert sorted(env.pods("team-a")) == ["tf-worker-0", "tf-worker-1"]  # Running policy: PS stopped
    assert not env.reservations("team-a")
    assert env.pod_group("team-a", "tf") is None


async def test_worker_zero_completing_succeeds_a_tfjob(env: OperatorEnv) -> None:
    await start(env, tf_job())
    env.backend.finish("team-a", "tf-worker-0", exit_code=0)
    await env.settle()
    assert env.job("team-a", "tf").status.phase == "Succeeded"
    assert "tf-worker-1" not in env.pods("team-a")  # still-running worker stopped


async def test_clean_pod_policy_all_and_none(env: OperatorEnv) -> None:
    await start(env, tf_job("all", cleanPodPolicy="All"))
    env.backend.finish("team-a", "all-worker-0", exit_code=0)
    await env.settle()
    assert not [p for p in env.pods("team-a") if p.startswith("all-")]
    await start(env, tf_job("keep", cleanPodPolicy="None"))
    env.backend.finish("team-a", "keep-worker-0", exit_code=0)
    await env.settle()
    assert env.job("team-a", "keep").status.phase == "Succeeded"
    assert sorted(p for p in env.pods("team-a") if p.startswith("keep-")) == [
        "keep-ps-0",
        "keep-worker-0",
        "keep-worker-1",
    ]
    assert not [
        r for r in env.reservations("team-a") if r.startswith("keep-")
    ]  # resources freed all the same


async def test_ttl_deletes_the_finished_job_on_the_clock(env: OperatorEnv) -> None:
    await start(env, tf_job(ttlSecondsAfterFinished=60))
    env.backend.finish("team-a", "tf-worker-0", exit_code=0)
    await env.settle()
    assert env.job("team-a", "tf").status.phase == "Succeeded"
    await env.settle(59)
    assert env.store.get("TFJob", "team-a", "tf") is not None
    await env.settle(2)
    assert env.store.get("TFJob", "team-a", "tf") is None
    assert not env.pods("team-a") and not env.store.list("Service", namespace="team-a")
    assert not env.store.list("Event", namespace="team-a")


async def test_active_deadline_fails_the_job_on_the_clock(env: OperatorEnv) -> None:
    await start(env, tf_job(activeDeadlineSeconds=300))
    await env.settle(299)
    assert env.job("team-a", "tf").status.phase == "Running"
    await env.settle(2)
    job = env.job("team-a", "tf")
    assert job.status.phase == "Failed"
    assert job.status.condition("Failed").reason == "DeadlineExceeded"  # type: ignore[union-attr]
    assert not env.pods("team-a") and not env.reservations("team-a")


# --- restart policy ---------------------------------------------------------------------------


async def test_exit_code_137_restarts_on_the_same_node_and_devices(env: OperatorEnv) -> None:
    await start(env, tf_job())
    before = env.pods("team-a")["tf-worker-1"]
    env.backend.finish("team-a", "tf-worker-1", exit_code=137)
    await env.settle()
    job = env.job("team-a", "tf")
    assert job.status.phase == "Restarting" and job.status.restarts == 1
    assert job.status.replica_statuses["Worker"].restarts == 1
    after = env.pods("team-a")["tf-worker-1"]
    assert after.metadata.uid != before.metadata.uid  # type: ignore[attr-defined]
    assert after.spec.node_name == before.spec.node_name  # type: ignore[attr-defined]
    assert after.metadata.annotations[ANNOTATION_DEVICES] == before.metadata.annotations[ANNOTATION_DEVICES]  # type: ignore[attr-defined]
    assert env.scheduler.placements == 1  # no re-placement
    env.backend.run_all("team-a", "tf")
    await env.settle()
    assert env.job("team-a", "tf").status.phase == "Running"
    assert ("ExitedWithCode", "Pod: team-a.tf-worker-1 exited with code 137") in env.events("team-a", "tf")


async def test_exit_code_1_fails_the_job_under_exit_code_policy(env: OperatorEnv) -> None:
    await start(env, tf_job())
    env.backend.finish("team-a", "tf-worker-1", exit_code=1)
    await env.settle()
    job = env.job("team-a", "tf")
    assert job.status.phase == "Failed"
    assert job.status.condition("Failed").message == "TFJob tf is failed because 1 Worker replica(s) failed."  # type: ignore[union-attr]
    assert sorted(env.pods("team-a")) == ["tf-worker-1"]  # running pods stopped, the failed one kept for logs


async def test_backoff_limit_counts_exit_code_restarts(env: OperatorEnv) -> None:
    await start(env, tf_job(backoffLimit=1))
    env.backend.finish("team-a", "tf-worker-0", exit_code=143)
    await env.settle()
    assert env.job("team-a", "tf").status.restarts == 1
    env.backend.run_all("team-a", "tf")
    await env.settle()
    env.backend.finish("team-a", "tf-worker-1", exit_code=137)
    await env.settle()
    job = env.job("team-a", "tf")
    assert job.status.phase == "Failed"
    assert job.status.condition("Failed").reason == "BackoffLimitExceeded"  # type: ignore[union-attr]
    assert job.status.restarts == 1


async def test_on_failure_restarts_any_exit_code_and_never_restarts_none(env: OperatorEnv) -> None:
    await start(env, tf_job("onf", policy="OnFailure"))
    env.backend.finish("team-a", "onf-worker-0", exit_code=1)
    await env.settle()
    assert env.job("team-a", "onf").status.phase == "Restarting"
    await start(env, tf_job("nev", policy="Never"))
    env.backend.finish("team-a", "nev-worker-0", exit_code=137)
    await env.settle()
    assert env.job("team-a", "nev").status.phase == "Failed"


async def test_always_restarts_a_replica_that_exited_successfully(env: OperatorEnv) -> None:
    doc = {
        "apiVersion": "training.kubedl.io/v1alpha1",
        "kind": "MarsJob",
        "metadata": {"name": "mars", "namespace": "ml"},
        "spec": {
            "marsReplicaSpecs": {
                "Scheduler": {"template": {"spec": {"containers": [{"name": "mars", "image": "m"}]}}},
                "WebService": {"template": {"spec": {"containers": [{"name": "mars", "image": "m"}]}}},
            }
        },
    }
    await start(env, job_from(doc))  # WebService defaults to Always
    env.backend.finish("ml", "mars-webservice-0", exit_code=0)
    await env.settle()
    job = env.job("ml", "mars")
    assert job.status.phase == "Restarting" and job.status.pod_restarts["mars-webservice-0"].count == 1
    assert env.pods("ml")["mars-webservice-0"].status.phase == "Pending"  # type: ignore[attr-defined]


async def test_a_restart_is_counted_once_even_if_seen_twice(env: OperatorEnv) -> None:
    await start(env, tf_job())
    pod = env.pods("team-a")["tf-worker-0"]
    env.backend.finish("team-a", "tf-worker-0", exit_code=137)
    status = env.job("team-a", "tf").status.model_copy(deep=True)
    # simulate a crash after the restart was recorded but before the pod was deleted
    from gpuyard.apis.jobspecs import PodRestart

    status.pod_restarts["tf-worker-0"] = PodRestart(count=1, last_uid=pod.metadata.uid)  # type: ignore[attr-defined]
    status.restarts = 1
    env.store.mutate("TFJob", "team-a", "tf", lambda j: setattr(j, "status", status))
    await env.settle()
    assert env.job("team-a", "tf").status.restarts == 1


# --- failover ---------------------------------------------------------------------------------


async def test_host_network_failover_gets_a_new_port_and_retargets_the_service(env: OperatorEnv) -> None:
    job = load_job("tf-mnist-hostnetwork")
    await start(env, job)
    old = env.pods("kubedl")["mnist-worker-1"]
    old_port = old.spec.containers[0].ports[0].host_port  # type: ignore[attr-defined]
    svc = env.store.get("Service", "kubedl", "mnist-worker-1")
    assert svc.spec.ports[0].port == 2222 and svc.spec.ports[0].target_port == old_port  # type: ignore[union-attr]
    assert svc.spec.cluster_ip is None  # type: ignore[union-attr]
    env.backend.finish("kubedl", "mnist-worker-1", exit_code=137)
    await env.settle()
    pg = env.pod_group("kubedl", "mnist")
    assert pg is not None and pg.spec.preferred_nodes == {"mnist-worker-1": old.spec.node_name}  # type: ignore[attr-defined]
    new = env.pods("kubedl")["mnist-worker-1"]
    new_port = new.spec.containers[0].ports[0].host_port  # type: ignore[attr-defined]
    assert new_port != old_port
    assert new.spec.node_name == old.spec.node_name  # the scheduler honoured the preference  # type: ignore[attr-defined]
    svc = env.store.get("Service", "kubedl", "mnist-worker-1")
    assert svc.spec.ports[0].target_port == new_port  # type: ignore[union-attr]
    tf_config = json.loads(new.spec.containers[0].env_dict()["TF_CONFIG"])  # type: ignore[attr-defined]
    assert tf_config["cluster"]["worker"][1] == f"mnist-worker-1.kubedl.svc:{new_port}"
    assert env.job("kubedl", "mnist").status.restarts == 1


async def test_service_is_retargeted_before_the_new_pod_is_created(env: OperatorEnv) -> None:
    await start(env, load_job("tf-mnist-hostnetwork"))
    order: list[str] = []
    writer = env.backend.writer
    real_create, real_update = writer.create, writer.update

    def note(obj) -> None:  # type: ignore[no-untyped-def]
        if obj.kind == "Service":
            order.append(f"service:{obj.metadata.name}:{obj.spec.ports[0].target_port}")
        elif obj.kind == "Pod":
            order.append(f"pod:{obj.metadata.name}:{obj.spec.containers[0].ports[0].host_port}")

    async def create(obj):  # type: ignore[no-untyped-def]
        note(obj)
        return await real_create(obj)

    async def update(obj):  # type: ignore[no-untyped-def]
        note(obj)
        return await real_update(obj)

    writer.create, writer.update = create, update  # type: ignore[method-assign]
    env.backend.finish("kubedl", "mnist-worker-2", exit_code=137)
    await env.settle()
    assert (
        len(order) == 2
        and order[0].startswith("service:mnist-worker-2:")
        and order[1].startswith("pod:mnist-worker-2:")
    )
    assert order[0].rsplit(":", 1)[1] == order[1].rsplit(":", 1)[1]


async def test_node_loss_moves_the_pod_elsewhere(env: OperatorEnv) -> None:
    await start(env, tf_job())
    victim = env.pods("team-a")["tf-worker-0"]
    lost = victim.spec.node_name  # type: ignore[attr-defined]

    def not_ready(node):  # type: ignore[no-untyped-def]
        node.status.conditions = [NodeCondition(type="Ready", status="False", reason="NodeLost")]

    env.store.mutate("Node", "", lost, not_ready)
    env.backend.finish("team-a", "tf-worker-0", exit_code=None, reason="NodeLost")
    await env.settle()
    moved = env.pods("team-a")["tf-worker-0"]
    assert moved.spec.node_name != lost  # type: ignore[attr-defined]
    assert env.job("team-a", "tf").status.restarts == 1
    assert env.pod_group("team-a", "tf").spec.preferred_nodes["tf-worker-0"] == lost  # type: ignore[union-attr]


async def test_unhealthy_gpu_moves_the_pod(env: OperatorEnv) -> None:
    await start(env, tf_job())
    victim = env.pods("team-a")["tf-worker-1"]
    node = victim.spec.node_name  # type: ignore[attr-defined]
    gpu = json.loads(victim.metadata.annotations[ANNOTATION_DEVICES])["gpus"][0]  # type: ignore[attr-defined]
    env.store.mutate(
        "Node", "", node, lambda n: n.metadata.annotations.__setitem__("gpuyard.io/unhealthy-gpus", str(gpu))
    )
    env.backend.finish("team-a", "tf-worker-1", exit_code=None, reason="DeviceUnhealthy")
    await env.settle()
    moved = env.pods("team-a")["tf-worker-1"]
    devices = json.loads(moved.metadata.annotations[ANNOTATION_DEVICES])  # type: ignore[attr-defined]
    assert (moved.spec.node_name, devices["gpus"]) != (node, [gpu])  # type: ignore[attr-defined]


async def test_an_oom_kill_and_an_unhealthy_gpu_are_named_in_the_jobs_events(env: OperatorEnv) -> None:
    await start(env, tf_job())
    env.backend.finish("team-a", "tf-worker-0", exit_code=137, reason="OOMKilled")
    env.backend.finish("team-a", "tf-worker-1", exit_code=None, reason="DeviceUnhealthy")
    await env.settle()
    events = env.events("team-a", "tf")
    assert ("ExitedWithCode", "Pod: team-a.tf-worker-0 exited with code 137 (OOMKilled)") in events
    assert ("DeviceUnhealthy", "Pod: team-a.tf-worker-1 failed: DeviceUnhealthy") in events


async def test_backend_refusal_releases_the_reservations_and_requeues(env: OperatorEnv) -> None:
    env.backend.writer.fail_creates = 1
    env.scheduler.max_placements = 1
    env.submit(tf_job())
    await env.settle()
    assert not env.reservations("team-a") and not env.pods("team-a")  # released: nothing held
    pg = env.pod_group("team-a", "tf")
    assert pg is not None and not pg.spec.release  # the scheduler took them back: releases pruned
    refused = [m for reason, m in env.events("team-a", "tf") if reason == "FailedCreatePod"]
    assert refused and "admission webhook denied" in refused[0] and "released 3 reservation(s)" in refused[0]
    env.scheduler.max_placements = None
    env.store.mutate(
        "PodGroup", "team-a", "tf", lambda p: setattr(p.status, "attempts", 1)
    )  # wake the scheduler
    await env.settle(1.0)  # the operator's requeue fires too
    assert env.scheduler.placements == 2
    assert "tf-ps-0" in env.pods("team-a")


# --- suspend, delete --------------------------------------------------------------------------


async def test_suspend_releases_everything_and_resume_requeues(env: OperatorEnv) -> None:
    await start(env, tf_job())
    env.store.mutate("TFJob", "team-a", "tf", lambda j: setattr(j.spec, "suspend", True))
    await env.settle()
    job = env.job("team-a", "tf")
    assert job.status.phase == "Suspended" and job.status.is_true("Suspended")
    assert not env.pods("team-a") and not env.reservations("team-a")  # released, the scheduler freed them
    pg = env.pod_group("team-a", "tf")
    assert pg is not None and pg.spec.suspend and pg.status.phase == "Suspended"
    assert not pg.spec.release  # done: pruned
    env.store.mutate("TFJob", "team-a", "tf", lambda j: setattr(j.spec, "suspend", False))
    await env.settle()
    job = env.job("team-a", "tf")
    assert not job.status.is_true("Suspended")
    assert sorted(env.pods("team-a")) == ["tf-ps-0"]  # placed again, start order again
    env.backend.run_all("team-a", "tf")
    await env.settle()
    env.backend.run_all("team-a", "tf")
    await env.settle()
    assert env.job("team-a", "tf").status.phase == "Running"


async def test_deleting_the_job_deletes_everything_it_owns(env: OperatorEnv) -> None:
    await start(env, tf_job())
    env.store.delete("TFJob", "team-a", "tf")
    await env.settle()
    assert not env.pods("team-a")
    assert not env.reservations("team-a")
    assert env.pod_group("team-a", "tf") is None
    assert not env.store.list("Service", namespace="team-a")
    assert not env.store.list("Event", namespace="team-a")


async def test_preempted_pod_is_stopped_when_its_reservation_goes(env: OperatorEnv) -> None:
    await start(env, tf_job())
    env.scheduler.hold = True
    env.store.delete("Reservation", "team-a", "tf-worker-1")
    await env.settle()
    assert "tf-worker-1" not in env.pods("team-a")
    assert env.job("team-a", "tf").status.phase == "Restarting"
    env.scheduler.hold = False
    env.store.mutate("PodGroup", "team-a", "tf", lambda pg: setattr(pg.status, "phase", "Pending"))
    await env.settle()
    assert "tf-worker-1" in env.pods("team-a")


async def test_evicted_pods_stop_without_a_restart_and_come_back_once_placed_again(env: OperatorEnv) -> None:
    await start(env, tf_job())
    before = env.reservations("team-a")["tf-worker-0"]
    env.scheduler.hold = True  # the preemptor holds the devices for now
    evict(env.store, "team-a", "tf", {"tf-worker-0": "preempted by team-b/urgent (priority 1000)"})
    await env.settle()
    assert "tf-worker-0" not in env.pods("team-a") and "tf-worker-1" in env.pods("team-a")
    job = env.job("team-a", "tf")
    assert job.status.phase == "Restarting" and job.status.restarts == 0  # not counted against backoffLimit
    assert "were preempted (preempted by team-b/urgent (priority 1000)): tf-worker-0" in (
        job.status.condition("Restarting").message  # type: ignore[union-attr]
    )
    assert "tf-worker-0" not in env.reservations("team-a")  # released, then deleted by the scheduler
    pg = env.pod_group("team-a", "tf")
    assert pg is not None and not pg.status.evictions and not pg.spec.release
    env.scheduler.hold = False
    env.store.mutate("PodGroup", "team-a", "tf", lambda p: setattr(p.status, "attempts", 1))  # wake it
    await env.settle()
    after = env.reservations("team-a")["tf-worker-0"]
    assert after.metadata.uid != before.metadata.uid  # type: ignore[attr-defined]
    assert "tf-worker-0" in env.pods("team-a")
    env.backend.run_all("team-a", "tf")
    await env.settle()
    assert env.job("team-a", "tf").status.phase == "Running"


async def test_scaling_in_stops_the_extra_pods_and_gives_their_reservations_back(env: OperatorEnv) -> None:
    await start(env, tf_job(workers=3))

    def scale_in(job):  # type: ignore[no-untyped-def]
        job.replica_specs["Worker"].replicas = 1

    env.store.mutate("TFJob", "team-a", "tf", scale_in)
    await env.settle()
    assert sorted(env.pods("team-a")) == ["tf-ps-0", "tf-worker-0"]
    assert sorted(env.reservations("team-a")) == ["tf-ps-0", "tf-worker-0"]  # released, then freed
    pg = env.pod_group("team-a", "tf")
    assert pg is not None and [r.replicas for r in pg.spec.roles] == [1, 1] and not pg.spec.release
    assert env.job("team-a", "tf").status.phase == "Running"


async def test_a_new_job_of_the_same_name_does_not_inherit_the_old_gang(env: OperatorEnv) -> None:
    await start(env, tf_job())
    old_pg = env.pod_group("team-a", "tf")
    env.scheduler.hold = True
    env.store.delete("TFJob", "team-a", "tf")
    env.submit(tf_job(workers=1))  # re-created before the operator saw the deletion
    await env.settle()
    pg = env.pod_group("team-a", "tf")
    assert pg is not None and pg.metadata.uid != old_pg.metadata.uid  # type: ignore[union-attr]
    assert [r.replicas for r in pg.spec.roles] == [1, 1]
    assert not env.reservations("team-a") and not env.pods("team-a")


async def test_gpu_marked_unhealthy_in_the_topology_moves_a_retried_pod(env: OperatorEnv) -> None:
    from gpuyard.devices.presets import get_preset

    await start(env, tf_job())
    victim = env.pods("team-a")["tf-worker-0"]
    node = victim.spec.node_name  # type: ignore[attr-defined]
    gpu = json.loads(victim.metadata.annotations[ANNOTATION_DEVICES])["gpus"][0]  # type: ignore[attr-defined]
    old_reservation = env.reservations("team-a")["tf-worker-0"]
    env.store.create(get_preset("dgx1-v100", node_name=node, unhealthy=[gpu]))  # NodeTopology health only
    env.backend.finish("team-a", "tf-worker-0", exit_code=137)  # an ordinary OOM kill, not a device error
    await env.settle()
    pg = env.pod_group("team-a", "tf")
    assert pg is not None and pg.spec.preferred_nodes == {"tf-worker-0": node}  # re-placed, not reused
    new_reservation = env.reservations("team-a")["tf-worker-0"]
    assert new_reservation.metadata.uid != old_reservation.metadata.uid  # type: ignore[attr-defined]
