"""Assertion helpers of the test harness, with failure messages a person can act on.

Each helper raises `AssertionError` with what was expected, what is, and the evidence: the
job's placement table, the link matrix of its GPUs, the scheduler's reason, or the quota
arithmetic. `__tracebackhide__` keeps pytest's traceback on the user's line, not ours.

The helpers read only the store (through `gpuyard.testing.observing`), so they hold nothing but
the store; :class:`gpuyard.testing.cluster.Cluster` offers them as its `assert_*` methods.
"""

from __future__ import annotations

from decimal import Decimal

from gpuyard.apis.quantity import format_quantity
from gpuyard.apis.quotakinds import ElasticQuota, ResourceQuota
from gpuyard.apis.scheduling import Reservation
from gpuyard.scheduler.admission.quota import usage_of_requests, vector_of
from gpuyard.state.store import Store
from gpuyard.testing.observing import JobPlacement, JobRef, explanation_of, job_key, phase_of, placement_of

__all__ = ["Assertions"]


def _fmt(name: str, amount: int) -> str:
    if name == "cpu":
        return format_quantity(Decimal(amount) / 1000)
    return format_quantity(Decimal(amount)) if name in ("memory", "ephemeral-storage") else str(amount)


class Assertions:
    """`assert_*` helpers; every one names the job and shows why it failed."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def _placed(self, job: JobRef) -> JobPlacement:
        __tracebackhide__ = True
        placed = placement_of(self.store, job)
        if not placed:
            ns, name = job_key(job)
            raise AssertionError(f"job {ns}/{name} is not placed ({explanation_of(self.store, job)})")
        return placed

    def assert_phase(self, job: JobRef, phase: str) -> None:
        __tracebackhide__ = True
        now = phase_of(self.store, job)
        if now != phase:
            ns, name = job_key(job)
            raise AssertionError(
                f"job {ns}/{name} is {now or 'missing'}, expected {phase}\n  scheduler: {explanation_of(self.store, job)}"
            )

    def assert_on_model(self, job: JobRef, model: str) -> None:
        """Every GPU pod of the job is on a node whose GPU model or product contains `model`."""
        __tracebackhide__ = True
        placed = self._placed(job)
        want = model.lower()
        wrong = [
            p
            for p in placed.pods
            if p.gpus and want not in p.gpu_model.lower() and want not in p.gpu_product.lower()
        ]
        if wrong:
            what = ", ".join(
                f"{p.pod} on {p.node} ({p.gpu_product or p.gpu_model or 'no GPU'})" for p in wrong
            )
            raise AssertionError(
                f"job {placed.namespace}/{placed.name} expected on {model} GPUs, but {what}\n{placed}"
            )
        if not any(p.gpus for p in placed.pods):
            raise AssertionError(
                f"job {placed.namespace}/{placed.name} holds no GPU, expected {model}\n{placed}"
            )

    def assert_nvlink_connected(self, job: JobRef) -> None:
        """On every node, each pair of the job's GPUs there is joined by NVLink (NV#)."""
        __tracebackhide__ = True
        placed = self._placed(job)
        bad = {node: link for node, link in placed.links.items() if not link.startswith(("NV", "X"))}
        if bad:
            parts = [
                f"on {node} the weakest link between its GPUs is {link}:\n{placed.matrices[node]}"
                for node, link in sorted(bad.items())
            ]
            raise AssertionError(
                f"job {placed.namespace}/{placed.name} is not NVLink-connected: "
                + "\n".join(parts)
                + f"\n{placed}"
            )
        if not placed.links:
            raise AssertionError(
                f"job {placed.namespace}/{placed.name} holds no GPU on a node with a known topology\n{placed}"
            )

    def assert_on_one_node(self, job: JobRef) -> None:
        __tracebackhide__ = True
        placed = self._placed(job)
        if len(placed.nodes) != 1:
            raise AssertionError(
                f"job {placed.namespace}/{placed.name} spans {len(placed.nodes)} nodes, expected one\n{placed}"
            )

    def assert_pending_because(self, job: JobRef, text: str) -> None:
        """The job holds no placement and the scheduler's reason mentions `text` (case-insensitive)."""
        __tracebackhide__ = True
        ns, name = job_key(job)
        placed = placement_of(self.store, job)
        why = explanation_of(self.store, job)
        if placed:
            raise AssertionError(
                f"job {ns}/{name} is placed ({phase_of(self.store, job)}), expected pending because of {text!r}\n{placed}"
            )
        if text.lower() not in why.text.lower():
            raise AssertionError(
                f"job {ns}/{name} is pending, but not because of {text!r}\n  scheduler: {why}"
            )

    def assert_within_quota(self, quota: str) -> None:
        """What placed jobs use in the quota's namespaces is within its max (ElasticQuota) / hard (ResourceQuota).

        `quota` is the quota's name, or `namespace/name`.
        """
        __tracebackhide__ = True
        obj = self._quota(quota)
        limits, namespaces = _limits_of(obj)
        used: dict[str, int] = {}
        users: dict[str, int] = {}
        for r in self.store.list_of(Reservation):
            if r.metadata.namespace not in namespaces:
                continue
            for k, v in usage_of_requests(r.spec.requests).items():
                used[k] = used.get(k, 0) + v
            key = f"{r.metadata.namespace}/{r.spec.pod_group}"
            users[key] = users.get(key, 0) + len(r.spec.gpus)
        over = [
            f"{res}: {_fmt(res, used.get(res, 0))} used of {_fmt(res, limit)}"
            for res, limit in sorted(limits.items())
            if used.get(res, 0) > limit
        ]
        if over:
            jobs = ", ".join(f"{k} ({g} GPUs)" for k, g in sorted(users.items()))
            raise AssertionError(
                f"{obj.KIND} {obj.metadata.namespace}/{obj.metadata.name} is exceeded: "
                + "; ".join(over)
                + f"\n  placed jobs in {', '.join(sorted(namespaces))}: {jobs}"
            )

    def _quota(self, quota: str) -> ElasticQuota | ResourceQuota:
        __tracebackhide__ = True
        ns, _, name = quota.rpartition("/")
        quotas: list[ElasticQuota | ResourceQuota] = [
            *self.store.list_of(ElasticQuota),
            *self.store.list_of(ResourceQuota),
        ]
        for q in quotas:
            if q.metadata.name == name and (not ns or q.metadata.namespace == ns):
                return q
        known = sorted(f"{q.metadata.namespace}/{q.metadata.name}" for q in quotas)
        raise AssertionError(f"no quota {quota!r}; quotas: {', '.join(known) or 'none (pass quotas=...)'}")


def _limits_of(obj: ElasticQuota | ResourceQuota) -> tuple[dict[str, int], set[str]]:
    """Limits in quota units keyed by plain resource name, and the namespaces the quota covers."""
    if isinstance(obj, ElasticQuota):
        namespaces = set(obj.covered_namespaces) or {obj.metadata.namespace}
        values = obj.spec.max
    else:
        namespaces = {obj.metadata.namespace}
        values = {
            k.removeprefix("requests.").removeprefix("limits."): v
            for k, v in obj.spec.hard.items()
            if not k.startswith("count/") and k != "pods"
        }
    return vector_of(values), namespaces
