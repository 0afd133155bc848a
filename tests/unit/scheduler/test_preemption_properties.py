"""A hypothesis state machine over the scheduler core with priority preemption: small clusters,
random submits (gangs of 1-2 pods, 1-8 GPUs, priorities 0-3), finishes, and the operator
releasing evicted pods. Invariants after every step: no GPU is held twice and no node holds
more than it has; no gang is left partly placed (a gang's pods hold Reservations all or none,
evictions included: a gang is never partly preempted); every eviction names every pod the victim
holds."""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.unit.scheduler.helpers import make_node, podgroup, role
from tests.unit.scheduler.test_core import Cluster, core, step


class PreemptionMachine(RuleBasedStateMachine):
    @initialize(sizes=st.lists(st.sampled_from([4, 8]), min_size=1, max_size=3))
    def build(self, sizes: list[int]) -> None:
        self.capacity = {f"n{i}": g for i, g in enumerate(sizes)}
        self.cluster = Cluster(*(make_node(n, gpus=g) for n, g in self.capacity.items()))
        self.state = core(self.cluster)
        self.now = 0.0
        self.names = itertools.count()
        self.jobs: dict[tuple[str, str], int] = {}  # -> pods

    def _step(self) -> None:
        self.now += 1.0
        step(self.state, self.cluster, now=self.now)

    @rule(
        replicas=st.integers(1, 2),
        gpus=st.sampled_from([1, 2, 4, 8]),
        priority=st.integers(0, 3),
        ns=st.sampled_from(["a", "b"]),
    )
    def submit(self, replicas: int, gpus: int, priority: int, ns: str) -> None:
        name = f"j{next(self.names)}"
        self.cluster.put(podgroup(name, role(replicas=replicas, gpus=gpus), namespace=ns, priority=priority))
        self.jobs[(ns, name)] = replicas
        self._step()

    @rule(data=st.data())
    def finish(self, data: Any) -> None:
        if not self.jobs:
            return
        key = data.draw(st.sampled_from(sorted(self.jobs)))
        del self.jobs[key]
        self.cluster.delete("PodGroup", *key)
        self._step()

    @rule()
    def operator_releases_evicted_pods(self) -> None:
        for ns, name in list(self.jobs):
            pg = self.cluster.get("PodGroup", ns, name)
            rel = {}
            for pod in pg.status.evictions:
                res = self.cluster.get("Reservation", ns, pod)
                if res is not None:
                    rel[pod] = res.metadata.uid
            if rel:
                self.cluster.spec("PodGroup", ns, name, lambda x, r=rel: x.spec.release.update(r))
        self._step()

    @rule()
    def tick(self) -> None:
        self._step()

    def _reservations(self) -> list[Any]:
        return [o for (kind, _, _), o in self.cluster.objects.items() if kind == "Reservation"]

    @invariant()
    def no_gpu_is_over_allocated(self) -> None:
        if not hasattr(self, "cluster"):
            return
        used: dict[str, list[int]] = defaultdict(list)
        for res in self._reservations():
            used[res.spec.node].extend(res.spec.gpus)
        for node, gpus in used.items():
            assert len(gpus) == len(set(gpus)), (node, gpus)
            assert len(gpus) <= self.capacity[node]

    @invariant()
    def no_gang_is_partly_placed_or_partly_preempted(self) -> None:
        if not hasattr(self, "cluster"):
            return
        held: dict[tuple[str, str], set[str]] = defaultdict(set)
        for res in self._reservations():
            held[(res.metadata.namespace, res.spec.pod_group)].add(res.metadata.name)
        for key, pods in self.jobs.items():
            have = held.get(key, set())
            assert len(have) in (0, pods), (key, have)
            evictions = set(self.cluster.get("PodGroup", *key).status.evictions)
            if evictions:
                event("a gang is being preempted")
                assert have <= evictions, (key, have, evictions)  # every pod it holds is asked to stop


TestPreemptionMachine = PreemptionMachine.TestCase
TestPreemptionMachine.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
