"""A job as a gang: the PodGroup the scheduler places (one per job, same namespace and name).

Per role the replicas, the minimum to place together and the *rendered* pod template (so the
scheduler sees exactly what the pods will request: code-sync and MPI init containers, host
network, node selectors, tolerations), plus the job-level minimum, queue, priority (resolved
through PriorityClass objects by the caller), gang group and suspension. The operator owns the spec; the scheduler alone owns the status (Pending / Placed /
Suspended, `evictions`) and the Reservations.

The PodGroup carries every label of the job (so a PodDisruptionBudget selector written for
the job's labels matches its gang) plus `job-name`, the quota keys (`gpuyard.io/preemptible`,
the quota name, the expected duration) and the placement annotations (`gpuyard.io/migratable`,
`gpuyard.io/checkpoint-interval`, ...); they follow the job when its labels or annotations are
patched. `scheduleTimeoutSeconds` and `minResources` of the job's scheduling policy are copied
to the spec (the scheduler enforces both).

The operator's requests to the scheduler are spec fields: `release` (pod name -> uid of a
Reservation it no longer needs) and `preferredNodes` (where a pod that must move ran). A pass
plans a :class:`PodGroupChange`; :func:`changed_pod_group` applies it to the PodGroup as it is
*now* (so a write that conflicts is re-decided on the newest object), and prunes `release`
entries whose Reservation is gone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuyard.apis.jobkinds import ANNOTATION_GANG_GROUP, PyTorchJob, TrainingJob
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.priorityclasses import ResolvedPriority
from gpuyard.apis.quotakinds import ANNOTATION_EXPECTED_DURATION, LABEL_PREEMPTIBLE, LABEL_QUOTA_NAME
from gpuyard.apis.scheduling import LABEL_JOB_NAME, GangRole, PodGroup, PodGroupSpec
from gpuyard.apis.topologypolicy import (
    ANNOTATION_TOPOLOGY_LEVEL,
    ANNOTATION_TOPOLOGY_POLICY,
    ANNOTATION_TOPOLOGY_WAIT,
    kueue_podgroup_annotations,
)
from gpuyard.controllers.materializing import owner_reference, render_template
from gpuyard.controllers.workloads.base import WorkloadPlugin

__all__ = [
    "ANNOTATION_JOB_GENERATION",
    "PodGroupChange",
    "build_pod_group",
    "changed_pod_group",
    "pod_group_metadata",
    "pod_group_spec",
    "quota_metadata",
]

ANNOTATION_JOB_GENERATION = "gpuyard.io/job-generation"
ANNOTATION_ELASTIC = "gpuyard.io/elastic"  # the scheduler's `preemption/elastic.py` reads it
_QUOTA_KEYS = (LABEL_QUOTA_NAME, LABEL_PREEMPTIBLE, ANNOTATION_EXPECTED_DURATION)
# Job annotations the scheduler reads from the PodGroup (topology and device placement).
PLACEMENT_ANNOTATIONS = (
    "gpuyard.io/device-joint-allocate",
    "gpuyard.io/topology-required",
    "gpuyard.io/topology-preferred",
    "gpuyard.io/flexible-shape",
    ANNOTATION_TOPOLOGY_POLICY,  # wait for one node/block or split (apis/topologypolicy.py)
    ANNOTATION_TOPOLOGY_LEVEL,
    ANNOTATION_TOPOLOGY_WAIT,
    "gpuyard.io/migratable",  # the rescheduler: "false" never moves
    "gpuyard.io/checkpoint-interval",  # the rescheduler: the cost of moving
)


def quota_metadata(job: TrainingJob) -> tuple[dict[str, str], dict[str, str]]:
    """The job's quota label, non-preemptible label, expected duration and placement hints,
    for its PodGroup.

    Each quota key is read from the job's labels, else its annotations, and copied to the same
    place (labels for the quota keys, annotations for the duration), as the quota core reads
    them; the placement annotations (RDMA scope, network domain, flexible shape) are copied as
    they are.
    """
    meta = job.metadata
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    for key in _QUOTA_KEYS:
        value = meta.labels.get(key, meta.annotations.get(key))
        if value is None:
            continue
        (annotations if key == ANNOTATION_EXPECTED_DURATION else labels)[key] = value
    for key in PLACEMENT_ANNOTATIONS:
        if key in meta.annotations:
            annotations[key] = meta.annotations[key]
    templates = (spec.template.metadata.get("annotations") for spec in job.replica_specs.values())
    annotations.update(kueue_podgroup_annotations(t for t in templates if isinstance(t, Mapping)))
    return labels, annotations


def _role_minimum(job: TrainingJob, role: str) -> int | None:
    """The role's `minAvailable` (per-role gang minimum); elastic PyTorch workers otherwise start
    with `elasticPolicy.minReplicas`; None: every replica."""
    explicit = job.replica_specs[role].min_available
    if explicit is not None:
        return explicit
    if isinstance(job, PyTorchJob) and role == "Worker" and job.spec.elastic_policy is not None:
        return job.spec.elastic_policy.min_replicas
    return None


def _role_labels(
    job: TrainingJob, role: str, plugin: WorkloadPlugin, first: Mapping[str, str], replicas: int
) -> dict[str, str]:
    """The labels every pod of the role carries: those its first and last replicas share, less
    the replica index (the scheduler adds each pod's own). Inter-pod affinity and topology spread
    selectors are matched against them."""
    labels = dict(first)
    if replicas > 1:
        last = render_template(job, role, replicas - 1, plugin=plugin).template.metadata.get("labels") or {}
        labels = {k: v for k, v in labels.items() if last.get(k) == v}
    return {k: v for k, v in labels.items() if not k.endswith("replica-index")}


def pod_group_spec(
    job: TrainingJob,
    plugin: WorkloadPlugin,
    *,
    cluster_domain: str = "",
    preferred_nodes: dict[str, str] | None = None,
    priority: ResolvedPriority | None = None,
) -> PodGroupSpec:
    """The PodGroup spec of `job`; `priority`: its priority resolved through the PriorityClass
    objects (`apis/priorityclasses.py`), else the scheduling policy's `priority` as written."""
    policy = job.run_policy
    sched = policy.scheduling_policy
    roles = []
    for role in job.roles():
        spec = job.replica_specs[role]
        rendered = render_template(job, role, 0, plugin=plugin, cluster_domain=cluster_domain).template
        template = rendered.spec
        roles.append(
            GangRole(
                name=role,
                replicas=spec.count,
                min_available=_role_minimum(job, role),
                template=template,
                host_ports=1 if job.host_network else 0,
                labels=_role_labels(job, role, plugin, rendered.metadata.get("labels") or {}, spec.count),
                spot_replicas=spec.spot_replicas,
            )
        )
    gang_group = [
        g.strip() for g in job.metadata.annotations.get(ANNOTATION_GANG_GROUP, "").split(",") if g.strip()
    ]
    return PodGroupSpec(
        roles=roles,
        min_available=sched.min_available if sched is not None else None,
        queue=job.queue,
        priority=priority.value
        if priority is not None
        else (sched.priority or 0)
        if sched is not None
        else 0,
        priority_class_name=priority.class_name
        if priority is not None
        else (sched.priority_class_name or sched.priority_class)
        if sched is not None
        else None,
        gang_group=gang_group,
        suspend=job.suspended,
        job_kind=job.kind,
        preferred_nodes=dict(preferred_nodes or {}),
        schedule_timeout_seconds=sched.schedule_timeout_seconds if sched is not None else None,
        min_resources=dict(sched.min_resources) if sched is not None and sched.min_resources else None,
    )


def pod_group_metadata(job: TrainingJob) -> tuple[dict[str, str], dict[str, str]]:
    """The labels and annotations the PodGroup of `job` carries (without the generation stamp):
    every label of the job, its quota keys and placement annotations, and `job-name`."""
    labels, annotations = quota_metadata(job)
    if isinstance(job, PyTorchJob) and job.spec.elastic_policy is not None:
        annotations[ANNOTATION_ELASTIC] = "true"  # replicas above the minimum may be preempted alone
    return {**job.metadata.labels, **labels, LABEL_JOB_NAME: job.metadata.name}, annotations


def build_pod_group(
    job: TrainingJob,
    plugin: WorkloadPlugin,
    *,
    cluster_domain: str = "",
    preferred_nodes: dict[str, str] | None = None,
    priority: ResolvedPriority | None = None,
) -> PodGroup:
    labels, annotations = pod_group_metadata(job)
    return PodGroup(
        metadata=ObjectMeta(
            name=job.metadata.name,
            namespace=job.metadata.namespace or "default",
            labels=labels,
            annotations={**annotations, ANNOTATION_JOB_GENERATION: str(job.metadata.generation)},
            owner_references=[owner_reference(job)],
        ),
        spec=pod_group_spec(
            job, plugin, cluster_domain=cluster_domain, preferred_nodes=preferred_nodes, priority=priority
        ),
    )


@dataclass(slots=True)
class PodGroupChange:
    """What a pass wants of the job's existing PodGroup (spec only: the status is the scheduler's).

    `spec`: the spec rebuilt from a changed job (None: the job did not change), stamped with
    `generation`; `preferred`: pod name -> node it ran on (failover); `release`: pod name ->
    Reservation uid to give back; `existing`: pod name -> uid of every Reservation that exists
    now (a `release` entry naming anything else is done and pruned; `prune`: there is one);
    `metadata`: the labels and annotations the PodGroup should carry (None: leave them).
    """

    spec: PodGroupSpec | None = None
    generation: str = ""
    preferred: dict[str, str] = field(default_factory=dict)
    release: dict[str, str] = field(default_factory=dict)
    existing: Mapping[str, str] = field(default_factory=dict)
    prune: bool = False  # some `release` entry is done
    metadata: tuple[dict[str, str], dict[str, str]] | None = None

    def __bool__(self) -> bool:
        return (
            self.spec is not None
            or self.prune
            or self.metadata is not None
            or bool(self.preferred or self.release)
        )


def changed_pod_group(pg: PodGroup, change: PodGroupChange) -> PodGroup | None:
    """`pg` with `change` applied (a copy), or None when that changes nothing."""
    release = {
        pod: uid
        for pod, uid in {**pg.spec.release, **change.release}.items()
        if change.existing.get(pod) == uid
    }
    preferred = {**pg.spec.preferred_nodes, **change.preferred}
    respec = (
        change.spec is not None
        and pg.metadata.annotations.get(ANNOTATION_JOB_GENERATION) != change.generation
    )
    labels, annotations = pg.metadata.labels, pg.metadata.annotations
    if change.metadata is not None:
        stamp = change.generation if respec else annotations.get(ANNOTATION_JOB_GENERATION)
        labels = dict(change.metadata[0])
        annotations = {**change.metadata[1]}
        if stamp is not None:
            annotations[ANNOTATION_JOB_GENERATION] = stamp
    relabel = labels != pg.metadata.labels or annotations != pg.metadata.annotations
    if not respec and not relabel and release == pg.spec.release and preferred == pg.spec.preferred_nodes:
        return None
    copy = pg.clone()
    copy.metadata.labels = dict(labels)
    copy.metadata.annotations = dict(annotations)
    if respec:
        assert change.spec is not None
        copy.spec = change.spec.model_copy()
        copy.metadata.annotations[ANNOTATION_JOB_GENERATION] = change.generation
    copy.spec.preferred_nodes = preferred
    copy.spec.release = release
    return copy
