"""Elastic quota, ResourceQuota admission, reclaim and fair queue ordering: the pure core.

Everything here is plain data and synchronous, called by the scheduling cycle:

* `tree` — the ElasticQuota tree and its runtime quota (Koordinator's algorithm);
* `admission` — `admit(tree, quota, request)` and the per-job books (`QuotaBook`,
  `ResourceQuotaBook`);
* `reclaim` — `plan_reclaim(...)`: which borrowers' jobs to stop for an owner's min;
* `ordering` — `FairQueue`: priority + FIFO within a queue, DRF across queues, aging,
  StrictFIFO/BestEffortFIFO, maxRunningJobs, EASY backfill;
* `resources` — quota-unit vectors and the conversions from API objects.
"""

from gpuyard.scheduler.admission.quota.admission import (
    JobCharge,
    QuotaBook,
    ResourceQuotaBook,
    admit,
    is_preemptible,
    quota_of,
    resource_quota_usage,
)
from gpuyard.scheduler.admission.quota.ordering import (
    Aging,
    Candidates,
    Explanation,
    FairQueue,
    QueueConfig,
    QueuedJob,
    queue_configs,
    queued_job,
)
from gpuyard.scheduler.admission.quota.resources import (
    capacity_of,
    podgroup_usage,
    usage_of_requests,
    vector_of,
)
from gpuyard.scheduler.admission.quota.tree import (
    DEFAULT_QUOTA,
    ROOT_QUOTA,
    QuotaSpec,
    QuotaStatus,
    QuotaTree,
    specs_from_quotas,
)
from gpuyard.scheduler.admission.quota.victims import ReclaimPlan, RunningJob, Victim, plan_reclaim

__all__ = [
    "DEFAULT_QUOTA",
    "ROOT_QUOTA",
    "Aging",
    "Candidates",
    "Explanation",
    "FairQueue",
    "JobCharge",
    "QueueConfig",
    "QueuedJob",
    "QuotaBook",
    "QuotaSpec",
    "QuotaStatus",
    "QuotaTree",
    "ReclaimPlan",
    "ResourceQuotaBook",
    "RunningJob",
    "Victim",
    "admit",
    "capacity_of",
    "is_preemptible",
    "plan_reclaim",
    "podgroup_usage",
    "queue_configs",
    "queued_job",
    "quota_of",
    "resource_quota_usage",
    "specs_from_quotas",
    "usage_of_requests",
    "vector_of",
]
