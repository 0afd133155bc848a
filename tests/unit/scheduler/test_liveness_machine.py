"""Safety and liveness of the scheduler's core under random histories (a hypothesis state machine).

The machine drives :class:`~gpuyard.scheduler.core.SchedulerState` on a small cluster with
plain data (`test_core.Cluster` plays the store and the writer; a few lines below play the job
operator: they stop what the scheduler evicts and release what faults killed). Its rules:
submit, delete, suspend and resume jobs, change their priority, set or remove the two teams'
ElasticQuotas, fail and recover GPUs and nodes, let time pass. Preemptions and reclaims come
from the priorities and quotas. After every step, one scheduling cycle runs and then:

* safety: `gpuyard.platform.invariants.check_store` (nothing over-allocated: GPUs, CPU, memory,
  ports; quota within max) and no partial gang (a PodGroup holds no Reservation or at least its
  minimum);
* liveness: no job stays unplaced for more than 3 cycles and 5 s while it fits now
  (`gpuyard.scheduler.liveness`).

`STEPS` counts the steps run (printed with `-s`).
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpuyard.apis.core import Node, NodeCondition
from gpuyard.apis.devicematching import ANNOTATION_UNHEALTHY_GPUS
from gpuyard.apis.meta import Resource
from gpuyard.apis.quotakinds import ElasticQuota
from gpuyard.apis.resourceclasses import default_class
from gpuyard.apis.scheduling import PodGroup, Reservation
from gpuyard.platform.invariants import check_store
from gpuyard.scheduler.core import WATCHED, SchedulerState
from gpuyard.scheduler.liveness import LivenessTracker, fitting_now
from gpuyard.scheduler.placement.profiles import build_profile
from gpuyard.state.store import Store
from tests.unit.scheduler.helpers import make_node, podgroup, role
from tests.unit.scheduler.test_core import T0, Cluster

STEPS = Counter[str]()
PORTS = (20000, 20100)
TEAMS = ("team-a", "team-b")
NODES = (("n0", 8, "v100"), ("n1", 8, "v100"), ("n2", 4, "a100"))
EXAMPLES = int(os.environ.get("GPUYARD_MACHINE_EXAMPLES", "25"))


def _of(cluster: Cluster, cls: type[Any]) -> list[Any]:
    return [o for o in cluster.objects.values() if isinstance(o, cls)]


def _store_of(objects: list[Resource]) -> Store:
    store = Store()
    for cls in (Node, Reservation, PodGroup, ElasticQuota):
        store.register(cls)
    for obj in objects:
        if obj.kind in ("Node", "Reservation", "PodGroup", "ElasticQuota"):
            store.create(
                obj.model_copy(update={"metadata": obj.metadata.model_copy(update={"resource_version": ""})})
            )
    return store


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        nodes = [make_node(name, gpus=gpus, model=model) for name, gpus, model in NODES]
        classes = [default_class(m) for m in sorted({m for _, _, m in NODES})]
        self.cluster = Cluster(*nodes, *classes)
        self.profile = build_profile("default")
        self.state = SchedulerState(profile=self.profile, port_range=PORTS, nomination_seconds=60.0)
        self.now = 0.0
        self.cycle = 0
        self.names = itertools.count()
        self.tracker = LivenessTracker()
        self.state.load(self._by_kind(), now=0.0, utcnow=T0)
        STEPS["machines"] += 1

    # --- the world ------------------------------------------------------------------------------

    def _by_kind(self) -> dict[str, list[Resource]]:
        out: dict[str, list[Resource]] = {k: [] for k in WATCHED}
        for (kind, _, _), obj in self.cluster.objects.items():
            out.setdefault(kind, []).append(obj)
        return out

    def _jobs(self) -> list[PodGroup]:
        return sorted(_of(self.cluster, PodGroup), key=lambda p: p.metadata.name)

    def _held(self, pg: PodGroup) -> list[Reservation]:
        released = set(pg.spec.release.values())
        return [
            r
            for r in _of(self.cluster, Reservation)
            if r.metadata.namespace == pg.metadata.namespace
            and r.spec.pod_group == pg.metadata.name
            and r.metadata.uid not in released
        ]

    def _release(self, pg: PodGroup, reservations: list[Reservation]) -> None:
        """The operator: these pods stopped; their Reservations go back to the scheduler."""
        if not reservations:
            return
        copy = pg.clone()
        copy.spec.release = {**copy.spec.release, **{r.metadata.name: r.metadata.uid for r in reservations}}
        self.cluster.put(copy)

    def _operator(self) -> None:
        for pg in self._jobs():
            if pg.status.evictions:  # the scheduler asked these pods to stop: they stop
                held = [r for r in self._held(pg) if r.metadata.name in pg.status.evictions]
                self._release(pg, held)

    def _fail_groups_on(self, node: str, gpus: set[int] | None = None) -> None:
        """Pods on a failed node (or GPU) fail; their jobs restart whole (failover)."""
        for pg in self._jobs():
            held = self._held(pg)
            hit = any(r.spec.node == node and (gpus is None or set(r.spec.gpus) & gpus) for r in held)
            if hit:
                self._release(pg, held)

    def _run_cycle(self) -> None:
        self.state.apply(self.cluster.take())
        for _ in range(100):
            out = self.state.step(now=self.now, utcnow=T0 + timedelta(seconds=self.now), limit=10_000)
            self.cluster.execute(out)
            if not self.state.more:
                break
        self._operator()
        self.cycle += 1

    # --- rules ----------------------------------------------------------------------------------

    @rule(
        team=st.sampled_from(TEAMS),
        replicas=st.integers(1, 3),
        gpus=st.sampled_from([0, 1, 2, 4, 8]),
        priority=st.sampled_from([0, 10, 100]),
        model=st.sampled_from([None, "nvidia.v100", "nvidia.a100"]),
    )
    def submit(self, team: str, replicas: int, gpus: int, priority: int, model: str | None) -> None:
        name = f"j{next(self.names)}"
        resource = model if (model and gpus) else "nvidia.com/gpu"
        pg = podgroup(
            name, role(replicas=replicas, gpus=gpus, resource=resource), namespace=team, priority=priority
        )
        self.cluster.put(
            pg.model_copy(
                update={
                    "metadata": pg.metadata.model_copy(
                        update={"uid": f"uid-{name}", "creation_timestamp": T0 + timedelta(seconds=self.now)}
                    )
                }
            )
        )

    @precondition(lambda self: bool(_of(self.cluster, PodGroup)))
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        pg = data.draw(st.sampled_from(self._jobs()))
        self.cluster.delete("PodGroup", pg.metadata.namespace, pg.metadata.name)

    @precondition(lambda self: bool(_of(self.cluster, PodGroup)))
    @rule(data=st.data(), priority=st.sampled_from([0, 10, 100, 1000]))
    def change_priority(self, data: st.DataObject, priority: int) -> None:
        pg = data.draw(st.sampled_from(self._jobs()))

        def change(copy: Any) -> None:
            copy.spec.priority = priority

        self.cluster.spec("PodGroup", pg.metadata.namespace, pg.metadata.name, change)

    @precondition(lambda self: bool(_of(self.cluster, PodGroup)))
    @rule(data=st.data())
    def suspend_or_resume(self, data: st.DataObject) -> None:
        pg = data.draw(st.sampled_from(self._jobs()))
        held = self._held(pg)
        if not pg.spec.suspend and held:
            self._release(pg, held)  # the operator stops a suspended job's pods

        def change(copy: Any) -> None:
            copy.spec.suspend = not copy.spec.suspend

        self.cluster.spec("PodGroup", pg.metadata.namespace, pg.metadata.name, change)

    @rule(team=st.sampled_from(TEAMS), low=st.integers(0, 12), extra=st.integers(0, 20), drop=st.booleans())
    def edit_quota(self, team: str, low: int, extra: int, drop: bool) -> None:
        if drop:
            if self.cluster.get("ElasticQuota", team, team) is not None:
                self.cluster.delete("ElasticQuota", team, team)
            return
        # a max below what the team's running jobs use would break quota-max by the edit itself
        used = sum(
            len(r.spec.gpus) for pg in self._jobs() if pg.metadata.namespace == team for r in self._held(pg)
        )
        top = max(low + extra, used)
        quota = ElasticQuota.model_validate(
            {
                "metadata": {"name": team, "namespace": team},
                "spec": {"min": {"nvidia.com/gpu": str(low)}, "max": {"nvidia.com/gpu": str(top)}},
            }
        )
        old = self.cluster.get("ElasticQuota", team, team)
        if old is not None:
            quota = quota.model_copy(update={"status": old.status})
        self.cluster.put(quota)

    @rule(index=st.integers(0, len(NODES) - 1), ready=st.booleans())
    def node_fault(self, index: int, ready: bool) -> None:
        name = NODES[index][0]
        node = self.cluster.get("Node", "", name).clone()
        node.status.conditions = [NodeCondition(type="Ready", status="True" if ready else "False")]
        self.cluster.put(node, spec_changed=False)
        if not ready:
            self._fail_groups_on(name)

    @rule(index=st.integers(0, len(NODES) - 1), gpu=st.integers(0, 3), healthy=st.booleans())
    def gpu_fault(self, index: int, gpu: int, healthy: bool) -> None:
        name = NODES[index][0]
        node = self.cluster.get("Node", "", name).clone()
        broken = {
            int(g) for g in node.metadata.annotations.get(ANNOTATION_UNHEALTHY_GPUS, "").split(",") if g
        }
        broken = broken - {gpu} if healthy else broken | {gpu}
        if broken:
            node.metadata.annotations[ANNOTATION_UNHEALTHY_GPUS] = ",".join(str(g) for g in sorted(broken))
        else:
            node.metadata.annotations.pop(ANNOTATION_UNHEALTHY_GPUS, None)
        self.cluster.put(node)
        if not healthy:
            self._fail_groups_on(name, {gpu})

    @rule(seconds=st.sampled_from([1.0, 2.0, 10.0, 61.0]))
    def wait(self, seconds: float) -> None:
        self.now += seconds

    # --- after every step -----------------------------------------------------------------------

    @invariant()
    def safe_and_live(self) -> None:
        self._run_cycle()
        self.now += 1.0
        STEPS["steps"] += 1
        objects = list(self.cluster.objects.values())
        found = check_store(_store_of(objects), settled=False, versions=False)
        assert not found, [str(v) for v in found]
        for pg in self._jobs():
            held = len(self._held(pg))
            assert held == 0 or held >= pg.spec.minimum(), f"partial gang {pg.metadata.name}: {held}"
        fitting = fitting_now(
            self._by_kind(),
            profile=self.profile,
            port_range=PORTS,
            now=self.now,
            utcnow=T0 + timedelta(seconds=self.now),
            claims=list(self.state.claims.holds.by_owner.values()),
        )
        stuck = self.tracker.observe(fitting, cycle=self.cycle, now=self.now)
        assert not stuck, [f"{s}: {self._why(s.key)}" for s in stuck]

    def teardown(self) -> None:
        if os.environ.get("GPUYARD_MACHINE_EXAMPLES"):
            print(f"state machine: {STEPS['machines']} runs, {STEPS['steps']} steps")

    def _why(self, key: tuple[str, str]) -> str:
        pg = self.cluster.get("PodGroup", *key)
        return f"{pg.status.reason}: {pg.status.message}" if pg is not None else "gone"


SchedulerMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,  # the same histories on every run: a failure is a change, not a draw
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSchedulerMachine = SchedulerMachine.TestCase


@pytest.mark.parametrize(
    "head_priority",
    [
        pytest.param(0, id="equal-priority-queue-ahead-by-fair-share"),
        pytest.param(10, id="higher-priority-head-of-a-queue-behind-in-the-walk"),
    ],
)
def test_a_backfill_hold_follows_the_walk_order_across_queues(head_priority: int) -> None:
    """Histories the machine found: team-b's 2x8 head held room after team-b's first job started;
    team-a's 1-GPU job comes first in the walk (queues by fair share, then priority), so the hold
    must not stop it while GPUs idle."""
    state = SchedulerMachine()
    try:
        for _ in range(2):
            state.safe_and_live()
            state.wait(seconds=1.0)
        state.safe_and_live()
        state.submit(gpus=1, model=None, priority=head_priority, replicas=1, team="team-b")
        state.safe_and_live()
        state.submit(gpus=8, model=None, priority=head_priority, replicas=2, team="team-b")
        state.safe_and_live()
        state.submit(gpus=1, model="nvidia.v100", priority=0, replicas=1, team="team-a")
        for _ in range(4):
            state.safe_and_live()
            state.wait(seconds=1.0)
        state.safe_and_live()
    finally:
        state.teardown()
