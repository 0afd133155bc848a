"""A PyTorchJob's HorizontalPodAutoscaler, from `elasticPolicy.metrics`.

As training-operator's `pkg/controller.v1/pytorch/hpa.go` does: a PyTorchJob whose elastic
policy has `metrics` gets an `autoscaling/v2` HorizontalPodAutoscaler named like the job, owned by
it (a controller reference), targeting the job's `scale` subresource (`scaleTargetRef`: the job's
apiVersion, kind and name; the Worker replicas), with `minReplicas` and `maxReplicas` from the
elastic policy (unset ones as training-operator defaults them: the other bound, else the
Worker replicas) and the `metrics` as written. Its spec is written back when the job's differs
(training-operator's update). gpuyard also labels it `job-name` (its Kubernetes backend watches
only those) and deletes it once the job has finished or drops its metrics, so nothing scales a
finished job.

On Kubernetes the cluster's autoscaler (kube-controller-manager) reads the metrics and writes
the Worker replicas through the `scale` subresource of `kubeflow.org` PyTorchJobs; on the fake
cluster the backend plays it with the scenario's `hpaMetrics` (`fakecluster/autoscaling.py`).
Either way the operator then scales the job as for any change of its replicas.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from gpuyard.apis.addons import HorizontalPodAutoscaler, covers
from gpuyard.apis.jobkinds import PyTorchJob
from gpuyard.apis.meta import ObjectMeta, Resource
from gpuyard.apis.scheduling import LABEL_JOB_NAME
from gpuyard.controllers.addonwriting import AddonWriter
from gpuyard.controllers.materializing import owner_reference
from gpuyard.controllers.tensorboards import job_owner_uid_of
from gpuyard.state.context import Context
from gpuyard.state.ownership import OPERATOR
from gpuyard.state.workqueues import ObjectKey, Requeue, Watch
from gpuyard.state.writing import identified

__all__ = ["ElasticAutoscalerReconciler", "desired_hpa", "replica_bounds"]

SCALED_ROLE = "Worker"


def _job_key(obj: Resource) -> Iterable[ObjectKey]:
    job = obj.metadata.labels.get(LABEL_JOB_NAME)
    return ((obj.metadata.namespace, job),) if job else ()


def replica_bounds(job: PyTorchJob) -> tuple[int, int]:
    """(minReplicas, maxReplicas) of the elastic policy, defaulted as training-operator does."""
    ep = job.spec.elastic_policy
    workers = job.replica_specs[SCALED_ROLE].count if SCALED_ROLE in job.replica_specs else 1
    low = ep.min_replicas if ep is not None else None
    high = ep.max_replicas if ep is not None else None
    low = low if low is not None else (high if high is not None else workers)
    high = high if high is not None else max(low, workers)
    return max(low, 1), max(high, 1)


def desired_hpa(job: PyTorchJob) -> HorizontalPodAutoscaler | None:
    """The job's HorizontalPodAutoscaler (None: it has no metrics, or has finished)."""
    ep = job.spec.elastic_policy
    if ep is None or not ep.metrics or job.status.finished:
        return None
    low, high = replica_bounds(job)
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": job.api_version, "kind": job.kind, "name": job.metadata.name},
        "minReplicas": low,
        "maxReplicas": high,
        "metrics": [dict(m) for m in ep.metrics],
    }
    return HorizontalPodAutoscaler(
        metadata=ObjectMeta(
            name=job.metadata.name,
            namespace=job.metadata.namespace,
            labels={LABEL_JOB_NAME: job.metadata.name},
            owner_references=[owner_reference(job)],
        ),
        spec=spec,
    )


def _same(current: Resource, desired: Resource) -> bool:
    return covers(current.metadata.labels, desired.metadata.labels) and covers(
        getattr(current, "spec", None), getattr(desired, "spec", None)
    )


class ElasticAutoscalerReconciler:
    """See the module docstring."""

    name = "elastic-autoscaler"
    needs_leader = True  # creates, updates and deletes HorizontalPodAutoscalers
    concurrency = 2

    def __init__(self, ctx: Context) -> None:
        if ctx.writer is None:  # pragma: no cover - Context always sets one
            raise RuntimeError("the elastic autoscaler reconciler needs a writer (ctx.writer)")
        self.store = ctx.store
        self.out = AddonWriter(store=ctx.store, writer=identified(ctx.writer, OPERATOR))
        self.watches: Sequence[Watch] = (
            Watch(PyTorchJob.KIND),
            Watch(HorizontalPodAutoscaler.KIND, _job_key),
        )

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        namespace, name = key
        job = self.store.get_of(PyTorchJob, namespace, name)
        desired = desired_hpa(job) if job is not None else None
        if desired is None or job is None:
            await self.out.remove(
                HorizontalPodAutoscaler.KIND, namespace, name, owned=lambda o: job_owner_uid_of(o) is not None
            )
            return None
        uid = job.metadata.uid
        return await self.out.ensure(desired, same=_same, owned=lambda o: job_owner_uid_of(o) == uid)
