"""Admission: runtime along the path, non-preemptible within min, job -> quota, ResourceQuota."""

from __future__ import annotations

from decimal import Decimal

from gpuyard.apis.devicematching import ANNOTATION_UNHEALTHY_GPUS
from gpuyard.apis.quotakinds import LABEL_PREEMPTIBLE, LABEL_QUOTA_NAME, ResourceQuota
from gpuyard.apis.resourceclasses import default_class
from gpuyard.scheduler.admission.quota.admission import (
    QuotaBook,
    ResourceQuotaBook,
    admit,
    is_preemptible,
    quota_of,
    resource_quota_usage,
)
from gpuyard.scheduler.admission.quota.resources import capacity_of, quantities_of, usage_of_requests
from gpuyard.scheduler.admission.quota.tree import DEFAULT_QUOTA, ROOT_QUOTA, QuotaSpec, QuotaTree
from tests.builders import make_node

G = "nvidia.com/gpu"


def two_teams(total: int = 32) -> QuotaTree:
    return QuotaTree(
        [
            QuotaSpec("team-a", min={G: 8}, max={G: 16}, namespaces=("ns-a",)),
            QuotaSpec("team-b", min={G: 8}, max={G: 32}, namespace="ns-b"),
        ],
        total={G: total, "cpu": 64_000},
    )


def test_admitted_within_runtime_and_rejected_above_with_a_readable_reason() -> None:
    tree = two_teams(total=24)
    book = QuotaBook(tree)
    book.track("a1", quota="team-a", usage={G: 12})
    book.track("a2", quota="team-a", usage={G: 8})
    book.track("b1", quota="team-b", usage={G: 8})
    # team-a wants 20 -> limited by max 16; team-b 8: runtime a = 16, b = 8
    assert book.admit("a1") is None
    reason = book.admit("a2")
    assert reason == "quota team-a: nvidia.com/gpu used 12 + requested 8 > runtime 16 (min 8, borrowing 8)"
    assert tree.used("team-a")[G] == 12
    assert book.admit("b1") is None


def test_request_larger_than_max_can_never_run() -> None:
    tree = two_teams()
    assert admit(tree, "team-a", {G: 17}) == (
        "quota team-a: nvidia.com/gpu requested 17 > max 16 (the job can never run in this quota)"
    )


def test_runtime_follows_demand_not_arrival_order() -> None:
    tree = QuotaTree(
        [
            QuotaSpec("org", min={G: 8}, max={G: 10}, is_parent=True),
            QuotaSpec("a", parent="org", min={G: 4}, max={G: 10}),
            QuotaSpec("b", parent="org", min={G: 4}, max={G: 10}),
        ],
        total={G: 100},
    )
    book = QuotaBook(tree)
    book.track("a1", quota="a", usage={G: 5})
    book.track("a2", quota="a", usage={G: 1})
    book.track("b1", quota="b", usage={G: 6})
    # org holds at most 10; a and b both borrow 2 over their mins of 4: 5 each
    assert book.admit("a1") is None
    assert book.admit("a2") == "quota a: nvidia.com/gpu used 5 + requested 1 > runtime 5 (min 4, borrowing 1)"
    assert book.admit("b1") == "quota b: nvidia.com/gpu used 0 + requested 6 > runtime 5 (min 4, borrowing 1)"


def test_every_quota_on_the_path_is_checked() -> None:
    tree = QuotaTree(
        [
            QuotaSpec("org", min={G: 8}, max={G: 10}, is_parent=True),
            QuotaSpec("a", parent="org", min={G: 4}, max={G: 10}),
            QuotaSpec("b", parent="org", min={G: 4}, max={G: 10}),
        ],
        total={G: 100},
    )
    book = QuotaBook(tree)
    book.track("a1", quota="a", usage={G: 10})
    assert book.admit("a1") is None  # b wants nothing yet: a borrows all of org
    book.track("b1", quota="b", usage={G: 4})
    # b is within its own runtime (its min) but org is full of a's borrowed jobs
    assert tree.runtime("b")[G] == 4
    assert (
        book.admit("b1")
        == "quota org: nvidia.com/gpu used 10 + requested 4 > runtime 10 (min 8, borrowing 2)"
    )
    assert tree.path("b") == ["b", "org", ROOT_QUOTA]


def test_parent_quotas_take_no_jobs() -> None:
    tree = QuotaTree([QuotaSpec("org", is_parent=True), QuotaSpec("a", parent="org")], total={G: 4})
    tree.add_request("org", {G: 1})
    assert admit(tree, "org", {G: 1}) == "quota org: is a parent quota; jobs are charged to its leaf quotas"


def test_unknown_and_detached_quotas_are_refused() -> None:
    tree = QuotaTree([QuotaSpec("lost", parent="nowhere")], total={G: 4})
    assert admit(tree, "ghost", {G: 1}) == "quota ghost: no such ElasticQuota"
    assert "detached" in (admit(tree, "lost", {G: 1}) or "")


def test_cluster_total_bounds_everything() -> None:
    tree = QuotaTree([], total={G: 4})
    book = QuotaBook(tree)
    book.track("j", quota=DEFAULT_QUOTA, usage={G: 5})
    assert book.admit("j") == (
        "quota koordinator-default-quota: nvidia.com/gpu used 0 + requested 5 > runtime 4 (min 0, borrowing 4)"
    )


def test_non_preemptible_jobs_only_within_min() -> None:
    tree = two_teams(total=32)
    book = QuotaBook(tree)
    book.track("np1", quota="team-a", usage={G: 6}, preemptible=False)
    book.track("np2", quota="team-a", usage={G: 4}, preemptible=False)
    book.track("p1", quota="team-a", usage={G: 4})
    assert book.admit("np1") is None
    assert book.admit("np2") == (
        "quota team-a: non-preemptible jobs run only within min; nvidia.com/gpu non-preemptible used 6 "
        "+ requested 4 > min 8"
    )
    assert book.admit("p1") is None  # preemptible jobs may borrow
    assert tree.non_preemptible_used("team-a")[G] == 6


def test_book_release_and_forget_undo_charges() -> None:
    tree = two_teams()
    book = QuotaBook(tree)
    book.track("j", quota="team-a", usage={G: 4, "cpu": 2000})
    assert tree.request("team-a")[G] == 4
    assert book.admit("j") is None
    assert book.admit("j") is None  # idempotent
    assert tree.used("team-a") == {G: 4, "cpu": 2000}
    book.release("j")
    assert tree.used("team-a") == {G: 0, "cpu": 0}
    assert tree.request("team-a")[G] == 4
    book.track("j", quota="team-b", usage={G: 2}, admitted=True)  # moved and found running
    assert tree.request("team-a")[G] == 0 and tree.used("team-b")[G] == 2
    book.forget("j")
    assert tree.used("team-b")[G] == 0 and tree.request("team-b")[G] == 0 and "j" not in book


def test_quota_of_label_then_namespace_then_default() -> None:
    tree = two_teams()
    assert quota_of({LABEL_QUOTA_NAME: "team-b"}, "ns-a", tree=tree) == "team-b"
    assert quota_of({}, "ns-a", tree=tree) == "team-a"  # listed in the quota's namespaces
    assert quota_of({}, "ns-b", tree=tree) == "team-b"  # the one quota living in the namespace
    assert quota_of({}, "elsewhere", tree=tree) == DEFAULT_QUOTA
    assert is_preemptible({}) and is_preemptible({LABEL_PREEMPTIBLE: "true"})
    assert not is_preemptible({LABEL_PREEMPTIBLE: "false"})


def test_gpu_classes_count_as_gpus_too() -> None:
    usage = usage_of_requests(
        {"nvidia.v100": Decimal(4), "cpu": Decimal("1.5"), "memory": Decimal(2**30)}, count=2
    )
    assert usage == {"nvidia.v100": 8, G: 8, "cpu": 3000, "memory": 2**31}
    assert quantities_of(usage)["cpu"] == Decimal(3) and quantities_of(usage)["memory"] == Decimal(2**31)
    tree = QuotaTree(
        [QuotaSpec("a", min={"nvidia.v100": 4}, max={"nvidia.v100": 4, G: 16})],
        total={G: 16, "nvidia.v100": 8},
    )
    tree.add_request("a", usage)
    assert admit(tree, "a", usage) == (
        "quota a: nvidia.v100 requested 8 > max 4 (the job can never run in this quota)"
    )


# --- ResourceQuota -------------------------------------------------------------------------------


def rq(name: str, namespace: str, hard: dict[str, str]) -> ResourceQuota:
    return ResourceQuota.model_validate(
        {"metadata": {"name": name, "namespace": namespace}, "spec": {"hard": hard}}
    )


def test_resource_quota_per_gpu_class() -> None:
    book = ResourceQuotaBook(
        [rq("gpu-quota", "ns", {"nvidia.tesla.k80": "5", "requests.nvidia.com/gpu": "8"})]
    )
    k80 = resource_quota_usage(
        usage_of_requests({"nvidia.tesla.k80": Decimal(1)}, count=5), pods=5, kind="TFJob"
    )
    assert book.check("ns", k80) is None
    book.charge("j1", "ns", k80)
    one_more = resource_quota_usage(usage_of_requests({"nvidia.tesla.k80": Decimal(1)}), pods=1)
    assert (
        book.check("ns", one_more)
        == "ResourceQuota ns/gpu-quota: nvidia.tesla.k80 5 of 5 used, the job needs 1"
    )
    # any GPU counts against requests.nvidia.com/gpu: 5 used of 8
    plain = resource_quota_usage(usage_of_requests({G: Decimal(4)}))
    assert (
        book.check("ns", plain)
        == "ResourceQuota ns/gpu-quota: requests.nvidia.com/gpu 5 of 8 used, the job needs 4"
    )
    assert book.check("other-ns", plain) is None
    assert book.used("ns", "gpu-quota") == {"nvidia.tesla.k80": 5, "requests.nvidia.com/gpu": 5}
    book.uncharge("j1")
    assert book.check("ns", one_more) is None


def test_resource_quota_cpu_memory_counts_and_limits() -> None:
    book = ResourceQuotaBook(
        [
            rq(
                "compute",
                "ns",
                {
                    "cpu": "4",
                    "limits.memory": "8Gi",
                    "count/jobs": "1",
                    "count/tfjobs.training.kubedl.io": "1",
                    "pods": "3",
                },
            )
        ]
    )
    job = resource_quota_usage({"cpu": 3000}, limits={"memory": 4 * 2**30}, pods=2, kind="TFJob")
    assert book.check("ns", job) is None
    book.charge("j1", "ns", job)
    assert (
        book.check("ns", {"requests.cpu": 2000})
        == "ResourceQuota ns/compute: cpu 3 of 4 used, the job needs 2"
    )
    assert (
        book.check("ns", resource_quota_usage({}, kind="PyTorchJob"))
        == "ResourceQuota ns/compute: count/jobs 1 of 1 used, the job needs 1"
    )
    book.set_quotas([rq("compute", "ns", {"count/jobs": "5", "limits.memory": "6Gi"})])  # usage carried over
    assert book.check("ns", resource_quota_usage({}, limits={"memory": 4 * 2**30})) == (
        "ResourceQuota ns/compute: limits.memory 4Gi of 6Gi used, the job needs 4Gi"
    )


def test_scoped_resource_quotas_are_not_enforced() -> None:
    scoped = ResourceQuota.model_validate(
        {
            "metadata": {"name": "s", "namespace": "ns"},
            "spec": {"hard": {"pods": "0"}, "scopes": ["BestEffort"]},
        }
    )
    assert ResourceQuotaBook([scoped]).check("ns", resource_quota_usage({}, pods=1)) is None


def test_cluster_capacity_counts_ready_nodes_and_gpus_per_class() -> None:
    v100 = make_node("v1", gpus=8, model="v100", cpu="64", memory="512Gi")
    v100.metadata.annotations[ANNOTATION_UNHEALTHY_GPUS] = "3"
    a100 = make_node("a1", gpus=4, model="a100", cpu="32", memory="256Gi")
    down = make_node("gone", gpus=8, ready=False)
    total = capacity_of([v100, a100, down], classes=[default_class("v100"), default_class("a100")])
    total.pop("ephemeral-storage", None)  # the node builder may add it; the tree counts it like any resource
    assert total == {"cpu": 96_000, "memory": 768 * 2**30, G: 12, "nvidia.v100": 7, "nvidia.a100": 4}
