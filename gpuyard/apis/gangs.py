"""The PodGroup objects of other gang schedulers, which gpuyard writes in delegate mode.

With `scheduler.mode: delegate` (`controllers/delegating.py`) another gang scheduler places the
pods of gpuyard's jobs, and reads the gang's minimum from its own PodGroup kind:

* ``volcano``: `scheduling.volcano.sh/v1beta1` PodGroup;
* ``coscheduling`` (scheduler-plugins): `scheduling.x-k8s.io/v1alpha1` PodGroup;
* ``koordinator``: `scheduling.sigs.k8s.io/v1alpha1` PodGroup.

All three are called `PodGroup` on the API server, like gpuyard's own
(`scheduling.gpuyard.io/v1alpha1`, `apis/scheduling.py`). The store keys objects by kind, so these
are kept under the kind :data:`GANG_KIND` (`GangPodGroup`) and carry `PodGroup` only on the wire:
`apis/resources.py` maps each of them to its REST resource with `wire_kind="PodGroup"`. Their
CRDs come with the gang scheduler; gpuyard ships none.

The operator owns the spec (it creates, updates and deletes the object: the job's gang minimum
and, where the scheduler has them, per-role minimums, queue, priority class, minimum resources,
schedule timeout); the status is the gang scheduler's, kept as it reports it.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field

from gpuyard.apis.meta import K8sModel, Resource

__all__ = [
    "DEFAULT_SCHEDULER_NAMES",
    "GANG_API_VERSIONS",
    "GANG_KIND",
    "GANG_SCHEDULERS",
    "GangPodGroup",
    "GangPodGroupSpec",
    "GangPodGroupStatus",
    "GangScheduler",
]

GangScheduler = Literal["volcano", "coscheduling", "koordinator"]
GANG_SCHEDULERS: tuple[str, ...] = get_args(GangScheduler)
GANG_KIND = "GangPodGroup"
GANG_API_VERSIONS: dict[str, str] = {
    "volcano": "scheduling.volcano.sh/v1beta1",
    "coscheduling": "scheduling.x-k8s.io/v1alpha1",
    "koordinator": "scheduling.sigs.k8s.io/v1alpha1",
}

DEFAULT_SCHEDULER_NAMES: dict[str, str] = {  # the schedulerName each one's own charts deploy
    "volcano": "volcano",
    "coscheduling": "scheduler-plugins-scheduler",
    "koordinator": "koord-scheduler",
}


class GangPodGroupSpec(K8sModel):
    """The fields of the three PodGroup kinds gpuyard sets (a field a kind lacks stays unset)."""

    min_member: int = Field(ge=0)
    min_task_member: dict[str, int] | None = None  # volcano: per task (role, lower-cased)
    queue: str | None = None  # volcano
    priority_class_name: str | None = None  # volcano
    min_resources: dict[str, str] | None = None  # volcano, coscheduling
    schedule_timeout_seconds: int | None = None  # coscheduling, koordinator


class GangPodGroupStatus(K8sModel):
    """What the gang scheduler reports (Volcano: Pending, Inqueue, Running, Unknown; scheduler-plugins:
    Pending, PreScheduling, Scheduling, Scheduled, Running, Finished, Failed), kept as it is."""

    phase: str | None = None
    conditions: list[dict[str, Any]] | None = None
    running: int | None = None
    succeeded: int | None = None
    failed: int | None = None


class GangPodGroup(Resource):
    """One job's PodGroup for the gang scheduler of delegate mode (same namespace and name as the job)."""

    KIND = GANG_KIND
    API_VERSION = GANG_API_VERSIONS["volcano"]

    spec: GangPodGroupSpec = Field(default_factory=lambda: GangPodGroupSpec(min_member=0))
    status: GangPodGroupStatus = Field(default_factory=GangPodGroupStatus)
