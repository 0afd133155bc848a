"""Quota/queue objects at the edge: Koordinator YAML accepted as written, bad input named by object and field."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuyard.apis.durations import parse_duration
from gpuyard.apis.quota import (
    QuotaValidationError,
    parse_quota_document,
    validate_quota_deletion,
    validate_quotas,
    validate_resource_quota,
)
from gpuyard.apis.quotakinds import (
    ANNOTATION_QUOTA_NAMESPACES,
    ANNOTATION_SHARED_WEIGHT,
    LABEL_ALLOW_LENT_RESOURCE,
    LABEL_QUOTA_IS_PARENT,
    LABEL_QUOTA_PARENT,
    QUOTA_KINDS,
    ROOT_QUOTA,
    ElasticQuota,
    Queue,
    ResourceQuota,
)
from gpuyard.scheduler.admission.quota import QuotaTree, specs_from_quotas
from gpuyard.state.context import Context

CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "quotas"
G = "nvidia.com/gpu"


def eq(
    name: str,
    *,
    parent: str | None = None,
    is_parent: bool = False,
    lo: Any = None,
    hi: Any = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> ElasticQuota:
    lab = dict(labels or {})
    if parent:
        lab[LABEL_QUOTA_PARENT] = parent
    if is_parent:
        lab[LABEL_QUOTA_IS_PARENT] = "true"
    spec: dict[str, Any] = {}
    if lo is not None:
        spec["min"] = lo if isinstance(lo, dict) else {G: lo}
    if hi is not None:
        spec["max"] = hi if isinstance(hi, dict) else {G: hi}
    return ElasticQuota.model_validate(
        {
            "metadata": {"name": name, "namespace": "ns", "labels": lab, "annotations": annotations or {}},
            "spec": spec,
        }
    )


def load(name: str) -> list[dict[str, Any]]:
    with open(CONFIGS / name) as fh:
        return [d for d in yaml.safe_load_all(fh) if d]


# --- the example files -----------------------------------------------------------------------------


def test_example_quota_tree_is_accepted_and_builds_the_tree() -> None:
    accepted: list[ElasticQuota] = []
    for doc in load("elastic-quotas.yaml"):
        obj = parse_quota_document(doc, current_quotas=accepted)
        assert isinstance(obj, ElasticQuota)
        accepted.append(obj)
    a = next(q for q in accepted if q.name == "team-a")
    b = next(q for q in accepted if q.name == "team-b")
    assert a.parent_name == "research" and a.allow_lent_resource and not a.is_parent
    assert a.shared_weight == {"cpu": Decimal(200), "memory": Decimal(2 * 2**40), G: Decimal(60)}
    assert a.covered_namespaces == ["team-a", "team-a-dev"]
    assert not b.allow_lent_resource and b.covered_namespaces == ["team-b"] and b.shared_weight is not None
    assert validate_quotas(accepted) == []
    tree = QuotaTree(
        specs_from_quotas(accepted), total={G: 64, "cpu": 512_000, "memory": 4 * 2**40, "nvidia.v100": 8}
    )
    assert tree.path("team-a") == ["team-a", "research", ROOT_QUOTA]
    assert tree.quota_for_namespace("team-a-dev") == "team-a"
    assert tree.runtime("team-b")[G] == 8  # keeps its min although idle: it does not lend
    assert tree.runtime("team-a")[G] == 0
    # round trip: the objects serialise as Koordinator writes them
    assert a.to_dict()["apiVersion"] == "scheduling.sigs.k8s.io/v1alpha1"
    assert a.to_dict()["spec"]["min"][G] == "8"


def test_example_resource_quota_and_queues_are_accepted() -> None:
    (doc,) = load("resource-quota.yaml")
    rq = parse_quota_document(doc)
    assert isinstance(rq, ResourceQuota) and rq.spec.hard["nvidia.tesla.k80"] == Decimal(5)
    queues = [parse_quota_document(d) for d in load("queues.yaml")]
    assert all(isinstance(q, Queue) for q in queues)
    team_a = queues[0]
    assert isinstance(team_a, Queue)
    assert team_a.spec.weight == 2 and team_a.spec.max_running_jobs == 20
    assert team_a.spec.aging is not None and team_a.spec.aging.reserve_after_seconds == 14400
    assert [q.spec.queueing_strategy for q in queues if isinstance(q, Queue)] == [
        "BestEffortFIFO",
        "StrictFIFO",
        "BestEffortFIFO",
    ]


def test_quota_kinds_register_in_the_store() -> None:
    ctx = Context.for_tests()
    for cls, journaled in QUOTA_KINDS:
        if cls.KIND not in ctx.store.kinds():
            ctx.store.register(cls, journaled=journaled)
    q = eq("team-a", lo=4, hi=8)
    ctx.store.create(q)
    assert ctx.store.get("ElasticQuota", "ns", "team-a") is not None


# --- tree checks: (object, field, reason) --------------------------------------------------------------


def test_children_mins_exceeding_the_parent_min() -> None:
    current = [eq("org", is_parent=True, lo=10, hi=20), eq("a", parent="org", lo=6, hi=10)]
    assert validate_quotas(current) == []
    problems = validate_quotas(current, eq("b", parent="org", lo=5, hi=10))
    assert problems == [
        (
            "b",
            "spec.min.nvidia.com/gpu",
            "with this quota, the children's min add up to 11 nvidia.com/gpu (a, b); org's min is 10",
        )
    ]
    # shrinking the parent's min below its children's is the parent's problem
    problems = validate_quotas(
        [*current, eq("b", parent="org", lo=4)], eq("org", is_parent=True, lo=8, hi=20)
    )
    assert problems == [
        (
            "org",
            "spec.min.nvidia.com/gpu",
            "the children's min add up to 10 nvidia.com/gpu (a, b); org's min is 8",
        )
    ]


def test_cycle_in_the_parent_chain() -> None:
    current = [eq("x", parent="y", is_parent=True), eq("y", is_parent=True)]
    problems = validate_quotas(current, eq("y", parent="x", is_parent=True))
    assert (
        "y",
        f"metadata.labels.{LABEL_QUOTA_PARENT}",
        "the parent chain forms a cycle: y -> x -> y",
    ) in problems


def test_unknown_parent_and_parent_not_marked() -> None:
    assert validate_quotas([], eq("a", parent="ghost")) == [
        ("a", f"metadata.labels.{LABEL_QUOTA_PARENT}", "unknown parent quota 'ghost'")
    ]
    assert validate_quotas([eq("leaf")], eq("a", parent="leaf")) == [
        (
            "a",
            f"metadata.labels.{LABEL_QUOTA_PARENT}",
            f"parent quota 'leaf' is not marked {LABEL_QUOTA_IS_PARENT}: \"true\"",
        )
    ]


def test_max_below_min_and_negative_quantities() -> None:
    problems = validate_quotas([], eq("a", lo={G: 8, "cpu": "-1"}, hi={G: 4}))
    assert ("a", "spec.max.nvidia.com/gpu", "max 4 is less than min 8") in problems
    assert ("a", "spec.min.cpu", "must not be negative, got -1") in problems


def test_bad_annotations_and_labels() -> None:
    quota = eq(
        "a",
        annotations={ANNOTATION_SHARED_WEIGHT: "60", ANNOTATION_QUOTA_NAMESPACES: '"team-a"'},
        labels={LABEL_ALLOW_LENT_RESOURCE: "nope"},
    )
    problems = validate_quotas([], quota)
    assert problems == [
        ("a", f"metadata.labels.{LABEL_ALLOW_LENT_RESOURCE}", 'must be "true" or "false", got \'nope\''),
        (
            "a",
            f"metadata.annotations.{ANNOTATION_SHARED_WEIGHT}",
            'must be a JSON resource list, e.g. {"nvidia.com/gpu": "60"}',
        ),
        (
            "a",
            f"metadata.annotations.{ANNOTATION_QUOTA_NAMESPACES}",
            'must be a JSON list of namespaces, e.g. ["team-a"]',
        ),
    ]
    bad_weight = eq("w", annotations={ANNOTATION_SHARED_WEIGHT: json.dumps({G: "lots", "cpu": "-2"})})
    problems = validate_quotas([], bad_weight)
    assert problems[0][:2] == ("w", f"metadata.annotations.{ANNOTATION_SHARED_WEIGHT}.{G}")
    assert "'lots' is not a quantity" in problems[0][2]
    assert problems[1] == (
        "w",
        f"metadata.annotations.{ANNOTATION_SHARED_WEIGHT}.cpu",
        "must not be negative, got -2",
    )


def test_names_namespaces_and_the_root() -> None:
    other_ns = ElasticQuota.model_validate({"metadata": {"name": "a", "namespace": "elsewhere"}})
    assert validate_quotas([eq("a")], other_ns) == [
        ("a", "metadata.name", "quota names are cluster-wide; 'a' already exists in namespace 'ns'")
    ]
    assert validate_quotas([], eq(ROOT_QUOTA)) == [
        (
            ROOT_QUOTA,
            "metadata.name",
            f"{ROOT_QUOTA} is the implicit root (the whole cluster) and cannot be defined",
        )
    ]
    covering = eq("b", annotations={ANNOTATION_QUOTA_NAMESPACES: '["team"]'})
    taken = eq("a", annotations={ANNOTATION_QUOTA_NAMESPACES: '["team"]'})
    assert validate_quotas([taken], covering) == [
        ("b", "spec.namespaces", "namespace 'team' is already covered by quota 'a'")
    ]


def test_rejection_leaves_the_tree_in_force_unchanged() -> None:
    current = [eq("org", is_parent=True, lo=10), eq("a", parent="org", lo=6)]
    before = [q.to_dict() for q in current]
    with pytest.raises(QuotaValidationError) as info:
        parse_quota_document(eq("a", parent="org", lo=11).to_dict(), current_quotas=current)
    assert info.value.details == [
        {
            "field": "spec.min.nvidia.com/gpu",
            "reason": "with this quota, the children's min add up to 11 nvidia.com/gpu (a); org's min is 10",
        }
    ]
    assert [q.to_dict() for q in current] == before
    # an update that is fine replaces the old object in the check
    assert (
        parse_quota_document(eq("a", parent="org", lo=9).to_dict(), current_quotas=current).spec.min[G] == 9
    )


def test_an_existing_problem_is_not_blamed_on_an_unrelated_candidate() -> None:
    broken = [eq("x", parent="ghost")]
    assert validate_quotas(broken, eq("fine", lo=1, hi=2)) == []


def test_deleting_a_parent_with_children() -> None:
    current = [eq("org", is_parent=True, lo=4), eq("a", parent="org", lo=2)]
    assert validate_quota_deletion(current, "org") == [
        ("org", "metadata.name", "quota 'org' still has children: a; delete or move them first")
    ]
    assert validate_quota_deletion(current, "a") == []


# --- documents -------------------------------------------------------------------------------------


def test_parse_errors_name_the_field() -> None:
    with pytest.raises(QuotaValidationError) as info:
        parse_quota_document(
            {
                "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
                "kind": "ElasticQuota",
                "metadata": {"name": "a"},
                "spec": {"max": {G: "8x"}},
            }
        )
    (detail,) = info.value.details
    assert detail["field"] == "spec.max.nvidia.com/gpu" and "'8x' is not a quantity" in detail["reason"]
    with pytest.raises(QuotaValidationError) as info:
        parse_quota_document(
            {
                "kind": "Queue",
                "metadata": {"name": "q"},
                "spec": {"weight": 0, "queueingStrategy": "LIFO", "extra": 1},
            }
        )
    fields = {d["field"]: d["reason"] for d in info.value.details}
    assert set(fields) == {"spec.weight", "spec.queueingStrategy", "spec.extra"}
    assert "'StrictFIFO' or 'BestEffortFIFO'" in fields["spec.queueingStrategy"]
    assert fields["spec.extra"] == "unknown field"
    with pytest.raises(QuotaValidationError) as info:
        parse_quota_document({"kind": "Quota"})
    assert info.value.details == [
        {"field": "kind", "reason": "unknown kind 'Quota'; allowed: ElasticQuota, Queue, ResourceQuota"}
    ]
    with pytest.raises(QuotaValidationError) as info:
        parse_quota_document({"kind": "Queue", "apiVersion": "v1", "metadata": {"name": "q"}})
    assert info.value.details[0]["field"] == "apiVersion"


def test_resource_quota_checks() -> None:
    rq = ResourceQuota.model_validate(
        {
            "metadata": {"name": "rq", "namespace": "ns"},
            "spec": {
                "hard": {
                    "nvidia.tesla.k80": "2.5",
                    "requests.cpu": "-1",
                    "count/": "3",
                    "limits.memory": "1.5Gi",
                },
                "scopes": ["BestEffort"],
            },
        }
    )
    assert validate_resource_quota(rq) == [
        ("rq", "spec.hard.nvidia.tesla.k80", "nvidia.tesla.k80 is counted in whole units, got 2500m"),
        ("rq", "spec.hard.requests.cpu", "must not be negative, got -1"),
        ("rq", "spec.hard.count/", "object counts are written count/<resource>, e.g. count/jobs"),
        (
            "rq",
            "spec.scopes",
            "scopes and scopeSelector are not supported; the quota would apply to every job",
        ),
    ]
    doc = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "rq"},
        "spec": {"hard": {"pods": "4"}},
    }
    assert parse_quota_document(doc).metadata.namespace == "default"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("3600", 3600),
        ("90s", 90),
        ("45m", 2700),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1.5h", 5400),
        ("1d", 86400),
        ("250ms", 0.25),
        (120, 120),
    ],
)
def test_parse_duration(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "1h 30m", "h", "-5", "5x", "1h30"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)
