"""Inter-pod affinity / anti-affinity and topology spread: parsing, the filters and the scores.

Kubernetes' semantics (kube-scheduler's InterPodAffinity and PodTopologySpread plugins), held
within a gang (its pods see each other's trial placement) and against pods already on nodes.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuyard.apis.core import PodSpec
from gpuyard.apis.podplacement import anti_terms_from_json, anti_terms_to_json, rules_of
from gpuyard.apis.resourceclasses import RequestError
from gpuyard.scheduler.gangs.outcomes import Placement, Unschedulable
from gpuyard.scheduler.gangs.requests import build_gang
from gpuyard.scheduler.placement.framework import CycleState
from gpuyard.scheduler.placement.podaffinity import RULES, rules_context
from gpuyard.scheduler.placement.profiles import build_profile
from tests.unit.scheduler.helpers import assume_into, gang_of, make_node, place_one, podgroup, role, snap

HOST = "kubernetes.io/hostname"
BLOCK = "topology.gpuyard.io/block"


def ruled(
    name: str = "Worker",
    replicas: int = 1,
    *,
    labels: dict[str, str] | None = None,
    anti: list[dict[str, Any]] | None = None,
    affinity: list[dict[str, Any]] | None = None,
    preferred: list[dict[str, Any]] | None = None,
    preferred_anti: list[dict[str, Any]] | None = None,
    spread: list[dict[str, Any]] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    aff: dict[str, Any] = {}
    if anti or preferred_anti:
        aff["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": anti or [],
            "preferredDuringSchedulingIgnoredDuringExecution": preferred_anti or [],
        }
    if affinity or preferred:
        aff["podAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": affinity or [],
            "preferredDuringSchedulingIgnoredDuringExecution": preferred or [],
        }
    out = role(name, replicas, affinity=aff or None, **kw)
    if spread:
        out["template"]["topologySpreadConstraints"] = spread
    out["labels"] = labels or {}
    return out


def term(key: str = HOST, **match: str) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": match}, "topologyKey": key}


def nodes_of(result: Placement | Unschedulable) -> dict[str, str]:
    assert isinstance(result, Placement), result.message  # type: ignore[union-attr]
    return {p.pod.name: p.node for p in result.pods}


# --- parsing -------------------------------------------------------------------------------


def test_rules_are_parsed_with_kubernetes_defaults():
    spec = PodSpec.model_validate(
        {
            "affinity": {
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {
                                "matchExpressions": [{"key": "app", "operator": "In", "values": ["a"]}]
                            },
                            "topologyKey": HOST,
                        }
                    ]
                }
            },
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": BLOCK,
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchLabels": {"app": "a"}},
                    "matchLabelKeys": ["run"],
                }
            ],
        }
    )
    rules = rules_of(spec, namespace="team", labels={"app": "a", "run": "7"})
    assert rules is not None
    (t,) = rules.anti_affinity
    assert t.namespace_ok("team") and not t.namespace_ok("other")  # default: the pod's namespace
    assert t.matches("team", {"app": "a"}) and not t.matches("team", {"app": "b"})
    (c,) = rules.soft_spread
    assert c.matches({"app": "a", "run": "7"}) and not c.matches({"app": "a", "run": "8"})  # matchLabelKeys
    assert anti_terms_from_json(anti_terms_to_json(rules.anti_affinity)) == rules.anti_affinity


def test_namespace_selector_empty_means_every_namespace():
    spec = PodSpec.model_validate(
        {
            "affinity": {
                "podAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {**term(app="a"), "namespaceSelector": {}},
                        {**term(app="a"), "namespaces": ["x"]},
                        {
                            **term(app="a"),
                            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}},
                        },
                    ]
                }
            }
        }
    )
    rules = rules_of(spec, namespace="team", labels={})
    assert rules is not None
    every, listed, selected = rules.affinity
    assert every.namespace_ok("anything")
    assert listed.namespace_ok("x") and not listed.namespace_ok("team")
    assert selected.namespace_ok("y") and not selected.namespace_ok("team")


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (
            {
                "topologySpreadConstraints": [
                    {"maxSkew": 0, "topologyKey": HOST, "whenUnsatisfiable": "DoNotSchedule"}
                ]
            },
            "spec.topologySpreadConstraints[0].maxSkew",
        ),
        (
            {
                "topologySpreadConstraints": [
                    {"maxSkew": 1, "topologyKey": HOST, "whenUnsatisfiable": "Sometimes"}
                ]
            },
            "spec.topologySpreadConstraints[0].whenUnsatisfiable",
        ),
        (
            {
                "affinity": {
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"labelSelector": {"matchLabels": {"a": "b"}}}
                        ]
                    }
                }
            },
            "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey",
        ),
        (
            {
                "affinity": {
                    "podAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 500, "podAffinityTerm": term(a="b")}
                        ]
                    }
                }
            },
            "spec.affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
        ),
        (
            {
                "affinity": {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "topologyKey": HOST,
                                "labelSelector": {"matchExpressions": [{"key": "a", "operator": "Gt"}]},
                            }
                        ]
                    }
                }
            },
            "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector"
            ".matchExpressions[0].operator",
        ),
    ],
)
def test_bad_rules_name_the_field(raw, field):
    with pytest.raises(RequestError) as err:
        rules_of(PodSpec.model_validate(raw), namespace="default", labels={})
    assert err.value.resource == field
    assert field in err.value.reason


# --- the fast path ------------------------------------------------------------------------


def test_no_rules_no_context():
    s = snap([make_node("a", gpus=8)])
    gang = gang_of(s, podgroup("j", role(replicas=2, gpus=1)))
    assert rules_context(CycleState(s, gang, build_profile())) is None


# --- required anti-affinity -----------------------------------------------------------------


def test_two_workers_with_hostname_anti_affinity_land_on_different_nodes():
    s = snap([make_node("a", gpus=8), make_node("b", gpus=8)])
    pg = podgroup("j", ruled(replicas=2, gpus=1, labels={"app": "j"}, anti=[term(app="j")]))
    placed = nodes_of(place_one(s, pg))
    assert len(set(placed.values())) == 2
    # without the rule the default profile packs both on one node
    assert len(set(nodes_of(place_one(s, podgroup("k", role(replicas=2, gpus=1)))).values())) == 1


def test_anti_affinity_refuses_a_gang_that_cannot_spread_and_says_why():
    s = snap([make_node("a", gpus=8), make_node("b", gpus=8)])
    pg = podgroup("j", ruled(replicas=3, gpus=1, labels={"app": "j"}, anti=[term(app="j")]))
    result = place_one(s, pg)
    assert isinstance(result, Unschedulable)
    assert "anti-affinity" in result.message


def test_anti_affinity_holds_against_running_pods_both_ways():
    s = snap([make_node("a", gpus=8), make_node("b", gpus=8)])
    first = place_one(s, podgroup("db", ruled(gpus=1, labels={"app": "db"}, node_selector={HOST: "a"})))
    assume_into(s, first)  # type: ignore[arg-type]
    # the incoming pod refuses the node of a pod its term matches
    pg = podgroup("j", ruled(gpus=1, labels={"app": "j"}, anti=[term(app="db")]))
    assert nodes_of(place_one(s, pg)) == {"j-worker-0": "b"}
    # a running pod's required anti-affinity keeps matching pods off its node (symmetry)
    s2 = snap([make_node("a", gpus=8), make_node("b", gpus=8)])
    guard = place_one(
        s2,
        podgroup("g", ruled(gpus=1, labels={"app": "g"}, anti=[term(app="web")], node_selector={HOST: "a"})),
    )
    assume_into(s2, guard)  # type: ignore[arg-type]
    web = place_one(s2, podgroup("w", ruled(replicas=2, gpus=1, labels={"app": "web"})))
    assert set(nodes_of(web).values()) == {"b"}
    other = place_one(s2, podgroup("o", ruled(gpus=1, labels={"app": "other"}, node_selector={HOST: "a"})))
    assert isinstance(other, Placement)


# --- required affinity ---------------------------------------------------------------------


def test_affinity_to_a_running_pods_labels_follows_it():
    nodes = [make_node(n, gpus=8, labels={BLOCK: blk}) for n, blk in (("a", "b1"), ("b", "b1"), ("c", "b2"))]
    s = snap(nodes)
    cache = place_one(s, podgroup("cache", ruled(gpus=1, labels={"app": "cache"}, node_selector={HOST: "a"})))
    assume_into(s, cache)  # type: ignore[arg-type]
    pg = podgroup("j", ruled(replicas=2, gpus=4, labels={"app": "j"}, affinity=[term(BLOCK, app="cache")]))
    assert set(nodes_of(place_one(s, pg)).values()) <= {"a", "b"}  # block b1, where the cache runs
    # on the node itself (hostname): both must share a's 7 free GPUs, which they cannot
    pg = podgroup("h", ruled(replicas=2, gpus=4, labels={"app": "h"}, affinity=[term(HOST, app="cache")]))
    result = place_one(s, pg)
    assert isinstance(result, Unschedulable) and "affinity" in result.message


def test_affinity_without_any_matching_pod_refuses_unless_the_pod_matches_itself():
    s = snap([make_node("a", gpus=8), make_node("b", gpus=8)])
    lonely = place_one(s, podgroup("j", ruled(gpus=1, labels={"app": "j"}, affinity=[term(app="nothing")])))
    assert isinstance(lonely, Unschedulable) and "affinity" in lonely.message
    # workers with affinity to each other: the first goes anywhere, the rest follow it
    pg = podgroup("k", ruled(replicas=3, gpus=1, labels={"app": "k"}, affinity=[term(app="k")]))
    assert len(set(nodes_of(place_one(s, pg)).values())) == 1


# --- topology spread ---------------------------------------------------------------------------


def _blocks() -> list:
    return [make_node(f"n{i}", gpus=8, labels={BLOCK: f"b{i // 2}"}) for i in range(6)]  # 3 blocks of 2 nodes


def test_do_not_schedule_spreads_a_gang_over_blocks():
    s = snap(_blocks())
    spread = [
        {
            "maxSkew": 1,
            "topologyKey": BLOCK,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "j"}},
        }
    ]
    pg = podgroup("j", ruled(replicas=6, gpus=1, labels={"app": "j"}, spread=spread))
    placed = nodes_of(place_one(s, pg))
    per_block: dict[str, int] = {}
    for node in placed.values():
        blk = f"b{int(node[1:]) // 2}"
        per_block[blk] = per_block.get(blk, 0) + 1
    assert per_block == {"b0": 2, "b1": 2, "b2": 2}


def test_do_not_schedule_counts_running_pods_and_min_domains():
    nodes = [make_node("a", gpus=8, labels={BLOCK: "b0"}), make_node("b", gpus=8, labels={BLOCK: "b1"})]
    s = snap(nodes)
    old = place_one(
        s, podgroup("old", ruled(replicas=2, gpus=1, labels={"app": "x"}, node_selector={HOST: "a"}))
    )
    assume_into(s, old)  # type: ignore[arg-type]
    spread = [
        {
            "maxSkew": 1,
            "topologyKey": BLOCK,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "x"}},
        }
    ]
    # b0 already has 2 matching pods: the next two must both go to b1 (skew 2 - 0 > 1 on b0)
    pg = podgroup("new", ruled(replicas=2, gpus=1, labels={"app": "x"}, spread=spread))
    assert set(nodes_of(place_one(s, pg)).values()) == {"b"}
    # minDomains 3 with 2 blocks: the least count is taken as 0, so each block holds at most 1 more
    s2 = snap(nodes)
    spread3 = [{**spread[0], "minDomains": 3}]
    three = place_one(s2, podgroup("m", ruled(replicas=3, gpus=1, labels={"app": "x"}, spread=spread3)))
    assert isinstance(three, Unschedulable) and "maxSkew" in three.message
    two = place_one(s2, podgroup("m", ruled(replicas=2, gpus=1, labels={"app": "x"}, spread=spread3)))
    assert set(nodes_of(two).values()) == {"a", "b"}


def test_a_node_without_the_key_fails_a_hard_constraint():
    s = snap([make_node("a", gpus=8), make_node("b", gpus=8, labels={"zone": "z1"})])
    spread = [
        {
            "maxSkew": 1,
            "topologyKey": "zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "j"}},
        }
    ]
    pg = podgroup("j", ruled(replicas=2, gpus=1, labels={"app": "j"}, spread=spread))
    result = place_one(s, pg)
    # one zone: the skew stays 0 against itself, so both go to b; a lacks the key
    assert set(nodes_of(result).values()) == {"b"}


# --- scores -------------------------------------------------------------------------------------


def test_schedule_anyway_prefers_the_emptier_domain_but_never_refuses():
    s = snap([make_node("a", gpus=2), make_node("b", gpus=8)])
    spread = [
        {
            "maxSkew": 1,
            "topologyKey": HOST,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app": "j"}},
        }
    ]
    pg = podgroup("j", ruled(replicas=4, gpus=1, labels={"app": "j"}, spread=spread))
    placed = nodes_of(place_one(s, pg))
    counts = {n: list(placed.values()).count(n) for n in ("a", "b")}
    assert counts == {"a": 2, "b": 2}
    big = podgroup("k", ruled(replicas=9, gpus=1, labels={"app": "k"}, spread=spread))
    assert isinstance(place_one(s, big), Placement)  # a soft constraint never blocks


def test_preferred_affinity_and_anti_affinity_weigh_nodes():
    s = snap([make_node("a", gpus=8), make_node("b", gpus=8), make_node("c", gpus=8)])
    ps = place_one(s, podgroup("ps", ruled(gpus=1, labels={"app": "ps"}, node_selector={HOST: "b"})))
    assume_into(s, ps)  # type: ignore[arg-type]
    near = podgroup(
        "n",
        ruled(gpus=1, labels={"app": "n"}, preferred=[{"weight": 100, "podAffinityTerm": term(app="ps")}]),
    )
    assert nodes_of(place_one(s, near)) == {"n-worker-0": "b"}
    away = podgroup(
        "f",
        ruled(
            gpus=1, labels={"app": "f"}, preferred_anti=[{"weight": 100, "podAffinityTerm": term(app="ps")}]
        ),
    )
    assert nodes_of(place_one(s, away))["f-worker-0"] != "b"


def test_reservation_carries_labels_and_anti_affinity():
    s = snap([make_node("a", gpus=8), make_node("b", gpus=8)])
    pg = podgroup("j", ruled(gpus=1, labels={"app": "j", "team": "t"}, anti=[term(app="j")]))
    (res,) = assume_into(s, place_one(s, pg))  # type: ignore[arg-type]
    assert res.metadata.labels["app"] == "j" and res.metadata.labels["replica-index"] == "0"
    assert "gpuyard.io/pod-anti-affinity" in res.metadata.annotations
    gang = build_gang([pg], placed={}, classes=s.class_names)
    assert gang.parts[0].pods[0].labels["team"] == "t"
    state = CycleState(s, gang, build_profile())
    ctx = rules_context(state)
    assert ctx is not None
    state.data[RULES] = ctx
    assert len(ctx.placed()) == 1 and ctx.placed()[0].anti


def test_bad_rules_are_refused_at_submit_naming_the_field():
    from gpuyard.apis.resourceclasses import validate_gang_request

    spec = PodSpec.model_validate(
        {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": HOST, "whenUnsatisfiable": "Never"}]}
    )
    problems = validate_gang_request({"spec.tfReplicaSpecs.Worker.template.spec": spec})
    assert [p[0] for p in problems] == [
        "spec.tfReplicaSpecs.Worker.template.spec.topologySpreadConstraints[0].whenUnsatisfiable"
    ]
    assert "DoNotSchedule, ScheduleAnyway" in problems[0][1]
    good = PodSpec.model_validate(
        {
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": HOST, "whenUnsatisfiable": "DoNotSchedule"}
            ]
        }
    )
    assert validate_gang_request({"spec": good}) == []


def test_a_required_block_holds_the_pods_placed_one_by_one():
    nodes = [make_node(f"s{i}", gpus=8, labels={BLOCK: "small"}) for i in range(2)]
    nodes += [make_node(f"l{i}", gpus=8, labels={BLOCK: "large"}) for i in range(4)]
    s = snap(nodes)
    pg = podgroup("j", ruled(replicas=4, gpus=1, labels={"app": "j"}, anti=[term(app="j")]))
    pg.metadata.annotations["gpuyard.io/topology-required"] = "block"
    placed = nodes_of(place_one(s, pg))
    assert len(set(placed.values())) == 4  # one per node, all in the one block with 4 nodes
    assert all(node.startswith("l") for node in placed.values())


def test_the_defragmenter_does_not_move_pods_the_rules_concern():
    from gpuyard.scheduler.rescheduling.inputs import movable_jobs
    from tests.unit.scheduler.test_core import T0, Cluster, core, step

    cluster = Cluster(
        make_node("n1", gpus=8),
        make_node("n2", gpus=8),
        podgroup("plain", role(gpus=1)),
        podgroup("ruled", ruled(gpus=1, labels={"app": "r"}, anti=[term(app="r")])),
        podgroup("guard", ruled(gpus=1, labels={"app": "g"}, anti=[term(app="web")])),
        podgroup("web", ruled(gpus=1, labels={"app": "web"})),
    )
    state = core(cluster)
    step(state, cluster)
    state.apply(cluster.take())
    assert len(state.cache.snapshot.placed_pods(("default", "web"))) == 1
    movers = movable_jobs(
        state.cache, state.recorder, utcnow=T0, moved_too_often=lambda key: False, moved_at={}
    )
    # its own rules (ruled, guard), or a running pod's anti-affinity is about it (web): left alone
    assert sorted(mover.key[1] for mover, _ in movers) == ["plain"]
