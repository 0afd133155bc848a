"""The operator's observe and apply steps on an in-memory store: what is read, what is written, in which order."""

from __future__ import annotations

import pytest

from gpuyard.apis.meta import OwnerReference
from gpuyard.apis.scheduling import GROUP, PodGroup
from gpuyard.controllers.applying import Applier
from gpuyard.controllers.metrics import job_metrics
from gpuyard.controllers.observing import observe
from gpuyard.controllers.planning import plan
from gpuyard.controllers.podgroups import build_pod_group
from gpuyard.controllers.workloads.registry import plugin_for
from gpuyard.fakecluster.kubelet import terminate
from gpuyard.state.context import Context
from gpuyard.state.store import Conflict
from tests.unit.controllers.fakes import ScriptedWriter, reserve, tf_job
from tests.unit.controllers.test_planning import NOW, pod


def test_observed_keeps_only_the_current_pod_groups_reservations() -> None:

    ctx = Context.for_tests()
    job = ctx.store.create(tf_job())
    pg = ctx.store.create(build_pod_group(job, plugin_for(job.kind)))
    ours, theirs = reserve(job)["tf-ps-0"], reserve(job)["tf-worker-0"]
    ours.metadata.owner_references = [
        OwnerReference(api_version=GROUP, kind="PodGroup", name="tf", uid=pg.metadata.uid)
    ]
    theirs.metadata.owner_references = [
        OwnerReference(api_version=GROUP, kind="PodGroup", name="tf", uid="old")
    ]
    ctx.store.create(ours)
    ctx.store.create(theirs)
    failed = pod(job, ours)
    terminate(failed, exit_code=137, reason=None, message=None, now=NOW)
    ctx.store.create(failed)
    obs = observe(ctx.store, job)
    assert list(obs.reservations) == ["tf-ps-0"] and obs.leftovers == 1
    assert obs.replicas[0].pod is not None and obs.replicas[0].reservation is not None
    assert obs.unusable == {"tf-ps-0"}  # its node is not in the store: the restart must move
    ctx.store.close()


async def test_a_refused_create_releases_the_podless_reservations_and_keeps_pending_releases() -> None:
    ctx = Context.for_tests()
    store = ctx.store
    writer = ScriptedWriter(store)
    job = tf_job()
    job.replica_specs["Worker"].depends_on = []  # every pod at once
    job.status.start_time = NOW  # running: the PS is being moved (failover)
    job = store.create(job)
    pg = store.create(build_pod_group(job, plugin_for(job.kind)))
    uids = {}
    for name, res in reserve(job).items():
        res.metadata.owner_references = [
            OwnerReference(api_version=GROUP, kind="PodGroup", name="tf", uid=pg.metadata.uid)
        ]
        uids[name] = store.create(res).metadata.uid

    def placed_with_a_pending_release(p: PodGroup) -> None:
        p.status.phase = "Placed"
        p.spec.release = {"tf-ps-0": uids["tf-ps-0"]}  # asked for, not done yet

    store.mutate("PodGroup", "team-a", "tf", placed_with_a_pending_release)
    decided = plan(job, plugin=plugin_for(job.kind), observed=observe(store, job), now=NOW)
    assert [p.metadata.name for p in decided.create_pods] == ["tf-worker-0", "tf-worker-1"]
    writer.fail_creates = 1
    applier = Applier(store=store, writer=writer, metrics=job_metrics(ctx.registry))
    requeue = await applier.apply(job, decided)
    assert requeue is not None and requeue.after == 0.5
    pg = store.must_get("PodGroup", "team-a", "tf")  # type: ignore[assignment]
    assert pg.spec.release == uids  # the pending one kept, the two pod-less ones added
    assert pg.status.phase == "Placed"  # the scheduler's field: untouched
    assert not writer.foreign_writes()
    store.close()


async def test_a_status_decided_on_a_stale_job_is_not_written_and_nothing_else_happens() -> None:
    ctx = Context.for_tests()
    store = ctx.store
    writer = ScriptedWriter(store)
    job = store.create(tf_job())
    decided = plan(job, plugin=plugin_for(job.kind), observed=observe(store, job), now=NOW)
    assert decided.status and decided.create_pod_group is not None
    store.mutate("TFJob", "team-a", "tf", lambda j: setattr(j.spec, "suspend", True))  # the user, meanwhile
    metrics = job_metrics(ctx.registry)
    with pytest.raises(Conflict):  # the runner looks again at once, at the newest job
        await Applier(store=store, writer=writer, metrics=metrics).apply(job, decided)
    assert store.get("PodGroup", "team-a", "tf") is None and not store.list("Event")
    assert not metrics.counts["created"]
    store.close()
