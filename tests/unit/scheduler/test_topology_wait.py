"""A job's choice between waiting for one node (or block) and splitting: gpuyard.io/topology-policy,
Kueue's podset topology annotations, and the default wait of gangs of one-GPU workers.

Virtual time moves both clocks the core reads (`now` and `utcnow`) together, as the loop does.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from gpuyard.apis.jobs import JobValidationError, parse_job
from gpuyard.apis.scheduling import PodGroup, Reservation
from gpuyard.apis.topologypolicy import (
    TopologyPolicyError,
    kueue_podgroup_annotations,
    parse_topology_policy,
)
from gpuyard.scheduler.core import SchedulerState
from gpuyard.scheduler.cycle.topowait import topology_wait
from gpuyard.scheduler.decisions import PlaceGang
from gpuyard.scheduler.gangs.outcomes import Placement, Unschedulable
from gpuyard.scheduler.liveness import fitting_now
from gpuyard.scheduler.placement.placing import place
from gpuyard.scheduler.placement.profiles import build_profile
from tests.unit.scheduler.helpers import gang_of, make_node, podgroup, role, snap
from tests.unit.scheduler.test_core import T0, Cluster, of

# --- reading the annotations ---------------------------------------------------------------------


def test_policy_level_and_wait_are_read() -> None:
    got = parse_topology_policy(
        {
            "gpuyard.io/topology-policy": "required",
            "gpuyard.io/topology-level": "block",
            "gpuyard.io/topology-wait": "5m",
        }
    )
    assert (got.policy, got.level, got.wait) == ("required", "block", 300.0)
    assert parse_topology_policy({}).policy is None


def test_kueue_annotations_name_the_level_by_its_label_key() -> None:
    req = parse_topology_policy({"kueue.x-k8s.io/podset-required-topology": "kubernetes.io/hostname"})
    assert (req.policy, req.level, req.wait) == ("required", "node", None)
    pref = parse_topology_policy({"kueue.x-k8s.io/podset-preferred-topology": "topology.gpuyard.io/block"})
    assert (pref.policy, pref.level) == ("preferred", "block")
    # the job's own policy wins
    both = parse_topology_policy(
        {
            "gpuyard.io/topology-policy": "none",
            "kueue.x-k8s.io/podset-required-topology": "kubernetes.io/hostname",
        }
    )
    assert both.policy == "none"


def test_kueue_template_annotations_merge_to_the_strictest() -> None:
    templates = [
        {"kueue.x-k8s.io/podset-preferred-topology": "topology.gpuyard.io/block"},
        {"kueue.x-k8s.io/podset-required-topology": "topology.gpuyard.io/block"},
        {"kueue.x-k8s.io/podset-required-topology": "kubernetes.io/hostname"},
    ]
    assert kueue_podgroup_annotations(templates) == {
        "kueue.x-k8s.io/podset-required-topology": "kubernetes.io/hostname"
    }
    assert kueue_podgroup_annotations([{}]) == {}


@pytest.mark.parametrize(
    ("annotations", "named"),
    [
        ({"gpuyard.io/topology-policy": "maybe"}, "gpuyard.io/topology-policy"),
        ({"gpuyard.io/topology-level": "rack"}, "gpuyard.io/topology-level"),
        ({"gpuyard.io/topology-wait": "soon"}, "gpuyard.io/topology-wait"),
        ({"kueue.x-k8s.io/podset-required-topology": "rack"}, "kueue.x-k8s.io/podset-required-topology"),
    ],
)
def test_a_bad_value_names_the_annotation(annotations: dict[str, str], named: str) -> None:
    with pytest.raises(TopologyPolicyError) as err:
        parse_topology_policy(annotations)
    assert err.value.annotation == named


def _job(annotations: dict[str, str], template_annotations: dict[str, str] | None = None) -> dict[str, Any]:
    template: dict[str, Any] = {
        "spec": {
            "containers": [
                {"name": "pytorch", "image": "train", "resources": {"limits": {"nvidia.com/gpu": 1}}}
            ]
        }
    }
    if template_annotations:
        template["metadata"] = {"annotations": template_annotations}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "ddp", "namespace": "default", "annotations": annotations},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 4, "template": template}}},
    }


def test_submit_refuses_a_bad_policy_naming_the_annotation() -> None:
    with pytest.raises(JobValidationError) as err:
        parse_job(_job({"gpuyard.io/topology-policy": "always"}))
    fields = [d["field"] for d in err.value.details]
    assert "metadata.annotations.gpuyard.io/topology-policy" in fields
    with pytest.raises(JobValidationError) as err:
        parse_job(_job({}, {"kueue.x-k8s.io/podset-required-topology": "zone"}))
    fields = [d["field"] for d in err.value.details]
    assert (
        "spec.pytorchReplicaSpecs.Worker.template.metadata.annotations.kueue.x-k8s.io/podset-required-topology"
        in fields
    )


def test_submit_accepts_good_values() -> None:
    parse_job(
        _job(
            {"gpuyard.io/topology-policy": "required", "gpuyard.io/topology-wait": "10m"},
            {"kueue.x-k8s.io/podset-preferred-topology": "kubernetes.io/hostname"},
        )
    )


# --- placing at the node level -------------------------------------------------------------------


def _two_half_full_nodes() -> Any:
    s = snap([make_node("n1", gpus=8), make_node("n2", gpus=8)])
    for name in ("a", "b"):
        got = place(s, gang_of(s, podgroup(name, role(gpus=6))), build_profile("default"))
        assert isinstance(got, Placement)
        from tests.unit.scheduler.helpers import assume_into

        assume_into(s, got)
    return s


def test_required_node_level_refuses_a_split_and_says_why() -> None:
    s = _two_half_full_nodes()
    gang = gang_of(s, podgroup("ddp", role(replicas=4, gpus=1)))
    gang.topology_required = "node"
    got = place(s, gang, build_profile("default"))
    assert isinstance(got, Unschedulable)
    assert "no single node has room for the 4 pods" in got.full_message()
    gang.topology_required = None
    split = place(s, gang, build_profile("default"))
    assert isinstance(split, Placement) and len({pp.node for pp in split.pods}) == 2


# --- the wait -------------------------------------------------------------------------------------


def _pg(name: str, *roles: dict[str, Any], annotations: dict[str, str] | None = None) -> PodGroup:
    pg = podgroup(name, *roles)
    pg.metadata.creation_timestamp = T0
    pg.metadata.annotations.update(annotations or {})
    return pg


def _wait_of(pg: PodGroup, seconds: float, *, wait: float = 60.0) -> Any:
    s = snap([make_node("n1", gpus=8)])
    profile = build_profile("default")
    profile.topology_wait = wait
    return topology_wait(
        gang_of(s, pg), pg, profile=profile, snapshot=s, utcnow=T0 + timedelta(seconds=seconds)
    )


def test_one_gpu_workers_wait_by_default_and_the_wait_ends() -> None:
    pg = _pg("ddp", role(replicas=4, gpus=1))
    assert _wait_of(pg, 10).waiting and _wait_of(pg, 10).level == "node"
    assert not _wait_of(pg, 61).waiting
    assert _wait_of(pg, 10, wait=0) is None  # the setting switched off


def test_what_does_not_wait() -> None:
    assert _wait_of(_pg("one", role(gpus=4)), 1) is None  # one multi-GPU pod: never split anyway
    assert _wait_of(_pg("multi", role(replicas=2, gpus=2)), 1) is None  # not one-GPU workers
    assert _wait_of(_pg("big", role(replicas=16, gpus=1)), 1) is None  # no node could ever hold it
    for policy in ("preferred", "none"):
        pg = _pg("p", role(replicas=4, gpus=1), annotations={"gpuyard.io/topology-policy": policy})
        assert _wait_of(pg, 1) is None


def test_required_with_a_wait_applies_to_any_gang() -> None:
    pg = _pg(
        "req",
        role(replicas=2, gpus=2),
        annotations={"gpuyard.io/topology-policy": "required", "gpuyard.io/topology-wait": "30s"},
    )
    got = _wait_of(pg, 10)
    assert got.waiting and got.seconds == 30.0 and "gpuyard.io/topology-policy" in got.why


def test_required_without_a_wait_is_a_hard_level() -> None:
    s = snap([make_node("n1", gpus=8)])
    pg = _pg("hard", role(replicas=2, gpus=1), annotations={"gpuyard.io/topology-policy": "required"})
    assert gang_of(s, pg).topology_required == "node"


# --- in the scheduler core -------------------------------------------------------------------------


def _core(cluster: Cluster, wait: float) -> SchedulerState:
    profile = build_profile("default")
    profile.topology_wait = wait
    state = SchedulerState(profile=profile, port_range=(20000, 20100))
    by_kind: dict[str, list[Any]] = {k: [] for k in ("Node", "Reservation", "PodGroup", "ResourceClass")}
    for (kind, _, _), obj in cluster.objects.items():
        by_kind.setdefault(kind, []).append(obj)
    state.load(by_kind, now=0.0, utcnow=T0)
    return state


def at(state: SchedulerState, cluster: Cluster, seconds: float) -> list[Any]:
    state.apply(cluster.take())
    out = state.step(now=seconds, utcnow=T0 + timedelta(seconds=seconds), limit=10_000)
    cluster.execute(out)
    return out


def _busy() -> tuple[Cluster, SchedulerState]:
    cluster = Cluster(make_node("n1", gpus=8), make_node("n2", gpus=8))
    state = _core(cluster, wait=60.0)
    cluster.put(_pg("a", role(gpus=6)))
    at(state, cluster, 0.0)
    cluster.put(_pg("b", role(gpus=6)))
    at(state, cluster, 0.0)
    return cluster, state


def _nodes(cluster: Cluster, job: str) -> set[str]:
    return {
        o.spec.node
        for o in cluster.objects.values()
        if isinstance(o, Reservation) and o.spec.pod_group == job
    }


def test_a_gang_waits_for_one_node_then_splits_and_says_so() -> None:
    cluster, state = _busy()
    cluster.put(_pg("ddp", role(replicas=4, gpus=1)))
    assert of(PlaceGang, at(state, cluster, 1.0)) == []
    status = cluster.get("PodGroup", "default", "ddp").status
    assert status.phase == "Pending" and "waits for one node until 2026-01-01T00:01:00Z" in status.message
    ready, when = state.next_due(2.0)
    assert not ready and when is not None and when <= 60.0  # the loop wakes for it without an event
    assert of(PlaceGang, at(state, cluster, 30.0)) == []
    assert state.next_due(60.0)[0]  # its wait is over: ready again (the loop asks before a step)
    assert of(PlaceGang, at(state, cluster, 60.0))
    assert _nodes(cluster, "ddp") == {"n1", "n2"}
    status = cluster.get("PodGroup", "default", "ddp").status
    assert status.phase == "Placed" and "split: no node had room within the 60s" in status.message


def test_a_gang_gets_one_node_when_one_frees_up_within_its_wait() -> None:
    cluster, state = _busy()
    cluster.put(_pg("ddp", role(replicas=4, gpus=1)))
    at(state, cluster, 1.0)
    cluster.delete("PodGroup", "default", "a")
    for (kind, ns, name), o in list(cluster.objects.items()):
        if isinstance(o, Reservation) and o.spec.pod_group == "a":
            cluster.delete(kind, ns, name)
    assert of(PlaceGang, at(state, cluster, 10.0))
    assert len(_nodes(cluster, "ddp")) == 1
    assert "placed in one node after waiting 10s" in cluster.get("PodGroup", "default", "ddp").status.message


def test_preferred_splits_at_once() -> None:
    cluster, state = _busy()
    cluster.put(_pg("now", role(replicas=4, gpus=1), annotations={"gpuyard.io/topology-policy": "preferred"}))
    assert of(PlaceGang, at(state, cluster, 1.0))
    assert _nodes(cluster, "now") == {"n1", "n2"}


def test_the_liveness_rule_sees_the_wait_as_the_jobs_own_choice() -> None:
    """A fresh scheduler makes the same choice: within its wait the gang does not fit now (no
    liveness violation while it waits); once the wait is over it fits, and the running scheduler
    places it at once."""
    cluster, state = _busy()
    cluster.put(_pg("ddp", role(replicas=4, gpus=1)))
    at(state, cluster, 1.0)
    objects: dict[str, list[Any]] = {}
    for (kind, _, _), obj in cluster.objects.items():
        objects.setdefault(kind, []).append(obj)
    profile = build_profile("default")
    profile.topology_wait = 60.0

    def fits(seconds: float) -> set[tuple[str, str]]:
        return fitting_now(
            objects,
            profile=profile,
            port_range=(20000, 20100),
            now=seconds,
            utcnow=T0 + timedelta(seconds=seconds),
        )

    assert ("default", "ddp") not in fits(30.0)
    assert ("default", "ddp") in fits(60.0)
    assert state.next_due(60.0)[0]
    assert of(PlaceGang, at(state, cluster, 60.0))


def test_whether_one_node_could_ever_hold_the_gang_is_asked_once_until_a_node_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpuyard.scheduler.cycle import topowait

    calls = []
    real = topowait.ever_fits

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(topowait, "ever_fits", counting)
    s = snap([make_node("n1", gpus=8)])
    profile = build_profile("default")
    profile.topology_wait = 60.0
    pg = _pg("ddp", role(replicas=4, gpus=1))
    for seconds in (1, 2, 3):
        got = topology_wait(
            gang_of(s, pg), pg, profile=profile, snapshot=s, utcnow=T0 + timedelta(seconds=seconds)
        )
        assert got is not None and got.waiting
    assert len(calls) == 1
    s.refresh_node(make_node("n1", gpus=2))  # the only node shrinks: no node could ever hold 4 now
    assert topology_wait(gang_of(s, pg), pg, profile=profile, snapshot=s, utcnow=T0) is None
    assert len(calls) == 2
