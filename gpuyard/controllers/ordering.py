"""Start order: a DAG over replica types, checked before each pod is created.

The whole gang is placed and reserved up front by the scheduler; start order only decides when
each *pod* is created from its reservation. A downstream role's pods are created once every pod
of each upstream role exists and has reached the condition's phase (Running, or Succeeded), so
start order can never deadlock with gang scheduling: nothing waits for resources that an
unstarted upstream holds.

A replica spec's `dependsOn` overrides the plugin's defaults for that role (an empty list means
"no dependencies"). Phases compare as KubeDL's phaseComparator does: Pending < Running <
Succeeded = Failed.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.jobspecs import DAGCondition
from gpuyard.controllers.workloads.base import WorkloadPlugin

__all__ = ["PHASE_RANK", "can_start", "dependencies_of"]

PHASE_RANK = {"Pending": 0, "Running": 1, "Succeeded": 2, "Failed": 2, "Unknown": -1}


def dependencies_of(job: TrainingJob, plugin: WorkloadPlugin) -> dict[str, list[DAGCondition]]:
    """Role -> the conditions it waits for (explicit `dependsOn`, else the plugin's defaults)."""
    defaults = plugin.default_dependencies(job)
    lower = {r.lower(): r for r in job.replica_specs}
    out: dict[str, list[DAGCondition]] = {}
    for role, spec in job.replica_specs.items():
        conds = spec.depends_on if spec.depends_on is not None else defaults.get(role, [])
        resolved = []
        for c in conds:
            up = lower.get(c.upstream.lower())
            if up is not None and up != role:
                resolved.append(DAGCondition(upstream=up, on_phase=c.on_phase))
        if resolved:
            out[role] = resolved
    return out


def upstream_ready(cond: DAGCondition, replicas: int, phases: Mapping[int, str]) -> bool:
    """Every one of the upstream's `replicas` pods exists and is at least at `cond.on_phase`."""
    if len([i for i in phases if i < replicas]) < replicas:
        return False
    need = PHASE_RANK[cond.on_phase]
    return all(PHASE_RANK.get(phases[i], -1) >= need for i in range(replicas))


def can_start(
    role: str,
    *,
    deps: Mapping[str, list[DAGCondition]],
    replicas: Mapping[str, int],
    phases: Mapping[str, Mapping[int, str]],
) -> bool:
    """May pods of `role` be created now? `phases`: role -> index -> phase of existing pods."""
    for cond in deps.get(role, []):
        if cond.upstream not in replicas:
            continue  # an upstream the job does not have is treated as ready (KubeDL)
        if not upstream_ready(cond, replicas[cond.upstream], phases.get(cond.upstream, {})):
            return False
    return True
