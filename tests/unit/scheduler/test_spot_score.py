"""The `spot` score: spot replicas on spot nodes, other pods off them while other room exists."""

from __future__ import annotations

import numpy as np
import pytest

from gpuyard.apis.core import Node
from gpuyard.scheduler.gangs.outcomes import Placement
from gpuyard.scheduler.gangs.requests import PodShape
from gpuyard.scheduler.placement.framework import ALL, CycleState
from gpuyard.scheduler.placement.profiles import build_profile
from gpuyard.scheduler.placement.spot import LABEL_LIFECYCLE, SpotAffinity
from tests.unit.scheduler.helpers import gang_of, make_node, place_one, podgroup, role, snap

SPOT = {LABEL_LIFECYCLE: "spot"}


def spot_node(name: str, **kw: object) -> Node:
    return make_node(name, labels=SPOT, **kw)  # type: ignore[arg-type]


def workers(replicas: int, spot: int, *, gpus: int = 4, **kw: object) -> dict[str, object]:
    out = role("Worker", replicas, gpus=gpus, **kw)  # type: ignore[arg-type]
    out["spotReplicas"] = spot
    return out


def nodes_of(placement: object) -> dict[int, str]:
    assert isinstance(placement, Placement), placement
    return {p.pod.index: p.node for p in placement.pods}


@pytest.mark.parametrize("profile", ["default", "binpack", "spread"])
def test_the_last_replicas_go_to_spot_nodes_and_the_others_stay_off_them(profile: str) -> None:
    # spot nodes come first in node order, so without the score they would be taken first
    s = snap([spot_node("spot-a"), spot_node("spot-b"), make_node("od-a"), make_node("od-b")])
    got = nodes_of(place_one(s, podgroup("j", workers(4, 2)), profile=profile))
    assert {got[0], got[1]} <= {"od-a", "od-b"}
    assert {got[2], got[3]} <= {"spot-a", "spot-b"}


def test_without_the_score_the_spot_nodes_are_taken_first() -> None:
    s = snap([spot_node("spot-a"), spot_node("spot-b"), make_node("od-a"), make_node("od-b")])
    got = nodes_of(place_one(s, podgroup("j", workers(4, 0)), weights={"spot": 0}))
    assert set(got.values()) == {"spot-a", "spot-b"}  # the score, not node order, keeps them off
    got = nodes_of(place_one(s, podgroup("j", workers(4, 0))))
    assert set(got.values()) == {"od-a", "od-b"}


def test_other_pods_use_spot_nodes_when_nothing_else_has_room() -> None:
    s = snap([make_node("od-a"), spot_node("spot-a")])
    got = nodes_of(place_one(s, podgroup("j", workers(3, 0))))
    assert sorted(got.values()) == ["od-a", "od-a", "spot-a"]
    s = snap([make_node("od-a"), make_node("od-b")])  # spot replicas without spot nodes still run
    got = nodes_of(place_one(s, podgroup("j", workers(2, 2))))
    assert len(got) == 2


def test_spot_pods_are_their_own_part_and_the_lowest_indices_stay_required() -> None:
    s = snap([make_node("od-a"), spot_node("spot-a")])
    gang = gang_of(s, podgroup("j", workers(4, 2, min_available=3)))
    parts = [(p.shape.spot, [pod.index for pod in p.pods], p.required) for p in gang.parts]
    assert parts == [(False, [0, 1], 2), (True, [2, 3], 1)]
    gang = gang_of(s, podgroup("j", workers(2, 2, min_available=1)))
    assert [(p.shape.spot, p.required) for p in gang.parts] == [(True, 1)]


def test_no_opinion_on_a_cluster_without_spot_nodes() -> None:
    s = snap([make_node("od-a"), make_node("od-b")])
    gang = gang_of(s, podgroup("j", workers(1, 1)))
    state = CycleState(s, gang, build_profile())
    take = np.ones(s.n, dtype=np.int64)
    assert SpotAffinity().score(state, PodShape(gpus=1, gpu_milli=1000, spot=True), ALL, take) is None
    s = snap([make_node("od-a"), spot_node("spot-a")])
    state = CycleState(s, gang, build_profile())
    spot = SpotAffinity().score(state, PodShape(gpus=1, gpu_milli=1000, spot=True), ALL, take)
    other = SpotAffinity().score(state, PodShape(gpus=1, gpu_milli=1000), ALL, take)
    assert spot is not None and other is not None
    assert spot.tolist() == [0.0, 1.0] and other.tolist() == [1.0, 0.0]
