"""PodDisruptionBudget violations of a victim plan (the first key of the plan order).

A budget (namespaced) matches the pods of running jobs in its namespace whose labels — the job's
(PodGroup's) labels plus `job-name` — its selector matches; every pod of a matching job counts
(the scheduler sees a job's pods as its Reservations). `disruptionsAllowed` follows Kubernetes
(`apis.disruption.resolve_budget`); a plan violates a budget by the matching pods it stops beyond
that number. Violations only order plans (as in kube-scheduler): a plan that violates is chosen
only when every plan does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from gpuyard.apis.disruption import PodDisruptionBudget, resolve_budget
from gpuyard.apis.scheduling import LABEL_JOB_NAME
from gpuyard.scheduler.preemption.victims import Candidate

__all__ = ["violation_counter"]

Key = tuple[str, str]


def violation_counter(
    budgets: Iterable[PodDisruptionBudget], running: Mapping[Key, tuple[Mapping[str, str], int]]
) -> Callable[[Sequence[Candidate]], int] | None:
    """A function counting a plan's violations; `running`: job -> (labels, pods). None when no
    budget matches any running job (every plan then has 0)."""
    matched: list[tuple[int, set[Key]]] = []  # (disruptions allowed, jobs it covers)
    for pdb in budgets:
        ns = pdb.metadata.namespace
        jobs: set[Key] = set()
        pods = 0
        for key, (labels, n) in running.items():
            if key[0] != ns:
                continue
            if pdb.spec.selector.matches({**labels, LABEL_JOB_NAME: key[1]}):
                jobs.add(key)
                pods += n
        if jobs:
            matched.append((resolve_budget(pdb.spec, pods), jobs))
    if not matched:
        return None
    sizes = {key: n for key, (_, n) in running.items()}

    def count(victims: Sequence[Candidate]) -> int:
        keys = {v.key for v in victims}
        total = 0
        for allowed, jobs in matched:
            stopped = sum(sizes[k] for k in jobs & keys)
            total += max(0, stopped - allowed)
        return total

    return count
