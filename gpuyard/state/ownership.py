"""Who writes what: the components' identities and the ownership table, as data.

Every object and field has one writer (`docs/architecture.md`, "Ownership: one writer per object
and field", is this table in words: a test checks the two agree). A write carries the identity of
the component that makes it (`gpuyard.state.writing.identified`, `acting_as`): the Kubernetes
writer sends it as `fieldManager`, the in-memory writer hands it to its audit hook. The ownership
tests run a whole scenario and check every write against :data:`OWNERSHIP` with :func:`allowed`.

A rule names a kind (`Job` for every training-job kind), a part of it and the one identity that
writes it there:

* `create`, `delete` — the object itself (on Kubernetes a pod's `binding` is part of its create);
* `update` — metadata and spec (the object minus `status`: a PUT or `writer.update`);
* `status` — the status subresource (`writer.patch_status`).

A few rules hold on one backend only (`backends`): what the Kubernetes backend writes because a
real cluster makes it necessary (an object gpuyard cannot read, a pod a dead leader left unbound,
a node whose kubelet is gone), and what only the fake cluster plays (nodes, their GPUs' health).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from gpuyard.apis.jobkinds import KIND_INFO

__all__ = [
    "BACKEND",
    "BACKENDS",
    "IDENTITIES",
    "JOB",
    "NODE_AGENT",
    "OPERATOR",
    "OWNERSHIP",
    "PARTS",
    "SCHEDULER",
    "USER",
    "Part",
    "Rule",
    "allowed",
    "owners",
]

OPERATOR = "gpuyard-job-operator"
"""The job operator (`controllers/`): job status, PodGroups, pods, Services, a job's Events."""
SCHEDULER = "gpuyard-scheduler"
"""The gang scheduler (`scheduler/`): Reservations, PodGroup and quota status, default classes."""
BACKEND = "gpuyard-backend"
"""What a backend writes itself: the fake cluster's nodes, kubelet, device health and injected
faults; the Kubernetes backend's lost-node and unhealthy-GPU pod failures, orphan sweep, DRA
claims and reports of job objects that fail validation."""
NODE_AGENT = "gpuyard-node-agent"
"""`gpuyard agent` writing its node's NodeTopology straight to a Kubernetes API server."""
USER = "gpuyard-api"
"""Users' writes through gpuyard: the HTTP API (and so the CLI), the test harness, the simulator.
On Kubernetes users also write with kubectl, under kubectl's own field managers."""

IDENTITIES = (OPERATOR, SCHEDULER, BACKEND, NODE_AGENT, USER)
BACKENDS = ("fake", "kubernetes")
JOB = "Job"  # every training-job kind (TFJob, PyTorchJob, ...)

Part = Literal["create", "update", "status", "delete"]
PARTS: tuple[Part, ...] = ("create", "update", "status", "delete")


@dataclass(frozen=True, slots=True)
class Rule:
    """`writer` writes `part` of `kind` on `backends` (`what`: which of it, in words)."""

    kind: str
    part: Part
    writer: str
    what: str = ""
    backends: tuple[str, ...] = BACKENDS


def _rules(
    kind: str, parts: Iterable[Part], writer: str, what: str = "", **kw: tuple[str, ...]
) -> list[Rule]:
    return [Rule(kind, part, writer, what, **kw) for part in parts]


_CUD: tuple[Part, ...] = ("create", "update", "delete")
_KUBE = ("kubernetes",)
_FAKE = ("fake",)

OWNERSHIP: tuple[Rule, ...] = (
    *_rules(JOB, _CUD, USER),
    Rule(JOB, "status", OPERATOR, "conditions, phase, replica statuses, restarts"),
    Rule(
        JOB,
        "status",
        BACKEND,
        "only the `Failed` condition (reason `InvalidSpec`) of a job object gpuyard cannot read: it "
        "never reaches the store, so the operator never sees it (`kubecluster/invalid.py`)",
        backends=_KUBE,
    ),
    *_rules("PodGroup", _CUD, OPERATOR, "spec, incl. `spec.release` (the requests to the scheduler)"),
    Rule("PodGroup", "status", SCHEDULER, "phase, placement, attempts, `evictions`"),
    *_rules(
        "Reservation",
        ("create", "delete"),
        SCHEDULER,
        "exactly the ones released, or of a PodGroup that is gone",
    ),
    *_rules("Pod", ("create", "delete"), OPERATOR, "bound to the reserved node at create"),
    Rule("Pod", "status", BACKEND, "phase, exit code, reason (the fake or the real kubelet)"),
    Rule(
        "Pod",
        "create",
        BACKEND,
        "only the binding of a pod a leader created but never bound (`kubecluster/orphans.py`)",
        backends=_KUBE,
    ),
    Rule(
        "Pod",
        "delete",
        BACKEND,
        "only a pod a leader created but never bound whose placement is gone (`orphans.py`), and "
        "the final delete of a pod evicted from a node whose kubelet is gone (`nodes.py`)",
        backends=_KUBE,
    ),
    *_rules("Service", _CUD, OPERATOR),
    *_rules("Deployment", _CUD, OPERATOR, "a job's Tensorboard (`kubedl.io/tensorboard-config`)"),
    *_rules("Ingress", _CUD, OPERATOR, "a job's Tensorboard, a MarsJob's web UI (`webHost`)"),
    *_rules("HorizontalPodAutoscaler", _CUD, OPERATOR, "a PyTorchJob's `elasticPolicy.metrics`"),
    Rule(
        "HorizontalPodAutoscaler",
        "status",
        BACKEND,
        "the fake cluster plays the autoscaler (on Kubernetes: kube-controller-manager)",
        backends=_FAKE,
    ),
    Rule(
        JOB,
        "update",
        BACKEND,
        "only the scaled replicas of an autoscaled job (the fake cluster's autoscaler, as the "
        "`scale` subresource on Kubernetes)",
        backends=_FAKE,
    ),
    *_rules("GangPodGroup", _CUD, OPERATOR, "delegate mode; its status is the gang scheduler's"),
    *_rules(
        "Node",
        ("create", "update", "status"),
        BACKEND,
        "the scenario's nodes, faults, GPU health",
        backends=_FAKE,
    ),
    *_rules(
        "NodeTopology", ("create", "update"), BACKEND, "the scenario's, GPU health faults", backends=_FAKE
    ),
    *_rules("NodeTopology", ("create", "update", "delete"), USER, "by hand, or `gpuyard agent --server`"),
    *_rules("NodeTopology", ("create", "update"), NODE_AGENT, "`gpuyard agent --kubeconfig`", backends=_KUBE),
    *_rules("Event", ("create", "update"), OPERATOR, "about jobs (`source.component` is the writer)"),
    Rule("Event", "delete", OPERATOR, "a job's Events, whoever wrote them, once the job is gone"),
    *_rules("Event", ("create", "update"), SCHEDULER, "about the jobs it places, preempts, reclaims"),
    *_rules(
        "Event",
        ("create", "update"),
        BACKEND,
        "about nodes (DRA), and jobs that fail validation",
        backends=_KUBE,
    ),
    *_rules("PriorityClass", _CUD, USER),
    *_rules("Cron", _CUD, USER),
    *_rules("Cron", ("create", "update"), OPERATOR, "the Cron of a job with `spec.cronPolicy`"),
    Rule("Cron", "status", OPERATOR, "active, history, lastScheduleTime (`controllers/cronrunning.py`)"),
    *_rules(
        JOB,
        ("create", "delete"),
        OPERATOR,
        "a Cron's runs: created on schedule; deleted when replaced, beyond `historyLimit` or with their Cron",
    ),
    *_rules("ResourceClass", _CUD, USER),
    Rule("ResourceClass", "create", SCHEDULER, "the default classes (`nvidia.<model>`)"),
    *_rules("ElasticQuota", _CUD, USER),
    Rule("ElasticQuota", "status", SCHEDULER),
    *_rules("Queue", _CUD, USER),
    Rule("Queue", "status", SCHEDULER),
    *_rules("ResourceQuota", _CUD, USER),
    Rule(
        "ResourceQuota",
        "status",
        SCHEDULER,
        "on Kubernetes the cluster's quota controller writes it (the writer leaves it alone)",
        backends=_FAKE,
    ),
    *_rules("PodDisruptionBudget", _CUD, USER, "its status is the cluster's disruption controller's"),
    *_rules(
        "ResourceClaim",
        ("create", "status", "delete"),
        BACKEND,
        "DRA mode: a placed pod's claim (deleted only to replace a claim left by an earlier pod)",
        backends=_KUBE,
    ),
    *_rules("Model", _CUD, USER),
    Rule("Model", "create", OPERATOR, "the Model a ModelVersion names, when it is missing"),
    Rule("Model", "status", OPERATOR, "`latestVersion` (`controllers/imagebuilding.py`)"),
    *_rules("ModelVersion", _CUD, USER),
    *_rules(
        "ModelVersion",
        ("create", "update"),
        OPERATOR,
        "a succeeded job's (`spec.modelVersion`); its Model as owner, the model-name label, the build pod's annotation",
    ),
    Rule(
        "ModelVersion", "status", OPERATOR, "image, imageBuildPhase, finishTime, message (from its build pod)"
    ),
    Rule("ConfigMap", "create", OPERATOR, "a namespace's `dockerfile` of model image builds (on Kubernetes)"),
    Rule("Dataset", "create", OPERATOR, "Fluid's, of a job's `cacheBackend` (on Kubernetes)"),
    Rule("AlluxioRuntime", "create", OPERATOR, "Fluid's, of a job's `cacheBackend` (on Kubernetes)"),
    *_rules("Lease", ("create", "update"), BACKEND, "the leader election's Lease", backends=_KUBE),
)
"""The ownership table (see the module docstring); `docs/architecture.md` mirrors it."""


def _kind_of(kind: str) -> str:
    return JOB if kind in KIND_INFO else kind


def owners(kind: str, part: Part, *, backend: str) -> frozenset[str]:
    """The identities that may write `part` of `kind` on `backend`."""
    k = _kind_of(kind)
    return frozenset(r.writer for r in OWNERSHIP if r.kind == k and r.part == part and backend in r.backends)


def allowed(identity: str, kind: str, part: Part, *, backend: str) -> bool:
    """Whether the table lets `identity` write `part` of `kind` on `backend`."""
    return identity in owners(kind, part, backend=backend)
