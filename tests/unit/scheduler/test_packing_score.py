"""The packing policies inside the scheduling framework: the `packing` score, chooser and profile."""

from __future__ import annotations

import numpy as np
import pytest

from gpuyard.scheduler.cache.snapshot import Alloc
from gpuyard.scheduler.gangs.outcomes import Placement
from gpuyard.scheduler.gangs.requests import PodShape
from gpuyard.scheduler.placement.framework import CycleState
from gpuyard.scheduler.placement.packing import PodRequest
from gpuyard.scheduler.placement.packing.plugins import PackingChooser, PackingScore
from gpuyard.scheduler.placement.profiles import build_profile
from tests.unit.scheduler.helpers import assume_into, make_node, place_one, podgroup, role, snap


def share(name: str, milli: int, *, cpu: str = "1") -> object:
    return podgroup(name, role("Worker", gpus=0, cpu=cpu, extra={"gpuyard.io/gpu-milli": milli}))


def packing(policy: str, **kw: object) -> dict:
    return {"args": {"packing": {"policy": policy, **kw}}}


def test_gpu_kinds_count_pods_per_kind_and_follow_apply_and_unapply() -> None:
    s = snap([make_node("n0", gpus=4)])
    whole = Alloc(node="n0", gpus=(0, 1), gpu_milli=1000)
    part = Alloc(node="n0", gpus=(2,), gpu_milli=300)
    s.apply(whole, row=0)
    s.apply(part, row=0)
    assert s.gpu_kinds[0].tolist() == [1, 0, 1, 0, 0]
    s.unapply(whole)
    assert s.gpu_kinds[0].tolist() == [1, 0, 0, 0, 0]
    placed = place_one(s, share("a", 500))
    assert isinstance(placed, Placement)
    assume_into(s, placed)
    assert s.gpu_kinds[0, 0] == 2
    assert PackingScore(policy="fgd").mirror(s).gpu_pods[0].tolist() == [2, 0, 0, 0, 0]


def test_chooser_puts_a_share_on_the_policys_gpu() -> None:
    # GPU 0 idle, GPU 1 half used: first-fit's GPU is 0; the plain chooser's tightest fit is GPU 1
    s = snap([make_node("n0", gpus=2)])
    s.apply(Alloc(node="n0", gpus=(1,), gpu_milli=500), row=0)
    first = place_one(s, share("a", 400), profile="packing", **packing("first-fit"))
    best = place_one(s, share("a", 400), profile="packing", **packing("best-fit"))
    plain = place_one(s, share("a", 400), profile="first-fit")
    assert isinstance(first, Placement) and isinstance(best, Placement) and isinstance(plain, Placement)
    assert first.pods[0].gpus == (0,)
    assert best.pods[0].gpus == (1,) and plain.pods[0].gpus == (1,)


def test_fgd_keeps_whole_gpus_free_for_the_workload() -> None:
    # n0 has one GPU with 600m free, n1 is idle: a 500m share on n1 would break a whole GPU that
    # the workload's 1-GPU pods need, so FGD puts it on n0's partly used GPU
    s = snap([make_node("n0", gpus=2), make_node("n1", gpus=2)])
    s.apply(Alloc(node="n0", gpus=(0,), gpu_milli=400), row=0)
    s.apply(Alloc(node="n0", gpus=(1,), gpu_milli=1000), row=0)
    profile = build_profile("packing", args={"packing": {"policy": "fgd"}})
    score = next(p for p, _ in profile.scores if isinstance(p, PackingScore))
    score.prepare(
        [PodRequest(name="w", cpu_milli=1000, memory_mib=0, num_gpu=1, gpu_milli=1000)] * 3
        + [PodRequest(name="s", cpu_milli=1000, memory_mib=0, num_gpu=1, gpu_milli=500)]
    )
    from gpuyard.scheduler.placement.placing import place
    from tests.unit.scheduler.helpers import gang_of

    placed = place(s, gang_of(s, share("a", 500)), profile)
    assert isinstance(placed, Placement)
    assert (placed.pods[0].node, placed.pods[0].gpus) == ("n0", (0,))


def test_live_mode_learns_the_workload_from_the_reservations() -> None:
    s = snap([make_node("n0", gpus=2), make_node("n1", gpus=2, model="t4")])
    placed = place_one(s, podgroup("w", role("Worker", gpus=1)), profile="packing", **packing("fgd"))
    assert isinstance(placed, Placement)
    assume_into(s, placed)
    plugin = PackingScore(policy="fgd")
    profile = build_profile("packing", args={"packing": {"policy": "fgd"}})
    state = CycleState(s, placed.gang, profile)
    shape = PodShape(cpu_milli=1000, gpus=1, gpu_milli=300)
    raw = plugin.score(state, shape, slice(None), np.array([1, 1] + [0] * (s.n - 2)))
    assert raw is not None and np.isfinite(raw[:2]).all() and np.isneginf(raw[2:]).all()
    assert plugin.policy.model is not None and plugin.policy.model.C > 0


def test_model_constrained_pods_see_their_models_only() -> None:
    s = snap([make_node("v", gpus=2, model="v100"), make_node("t", gpus=2, model="t4")])
    plugin = PackingScore(policy="gpuyard")
    profile = build_profile("packing")
    pg = podgroup(
        "p",
        role(
            "Worker",
            gpus=1,
            affinity={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "gpuyard.io/gpu-model", "operator": "In", "values": ["t4"]}
                                ]
                            }
                        ]
                    }
                }
            },
        ),
    )
    from tests.unit.scheduler.helpers import gang_of

    gang = gang_of(s, pg)
    state = CycleState(s, gang, profile)
    req = plugin.request(state, gang.parts[0].shape)
    assert req.allowed_models == (s.model_names.index("t4"),)
    assert plugin.request(state, PodShape(cpu_milli=1, gpus=1, gpu_milli=1000)).allowed_models is None
    placed = place_one(s, pg, profile="packing")
    assert isinstance(placed, Placement) and placed.pods[0].node == "t"


def test_cpu_only_pods_are_left_to_other_plugins_by_packing_gpu() -> None:
    s = snap([make_node("n0", gpus=2)])
    profile = build_profile("first-fit", weights={"packing-gpu": 30})
    plugin = next(p for p, _ in profile.scores if isinstance(p, PackingScore))
    assert plugin.gpu_only
    state = CycleState(s, gang_of_nothing(s), profile)
    assert plugin.score(state, PodShape(cpu_milli=1000), slice(None), np.ones(s.n, dtype=np.int64)) is None


def gang_of_nothing(s):  # type: ignore[no-untyped-def]
    from tests.unit.scheduler.helpers import gang_of

    return gang_of(s, podgroup("cpu", role("Worker")))


def test_chooser_links_to_the_profiles_packing_score() -> None:
    profile = build_profile("packing", **packing("best-fit"))
    assert isinstance(profile.chooser, PackingChooser)
    assert profile.chooser.score is profile.scores[0][0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"policy": "tetris"}, "packing: unknown policy 'tetris'; known: random, first-fit"),
        ({"coverage": 0}, "packing: coverage must be within (0, 1], got 0.0"),
        ({"colour": "red"}, "score plugin 'packing' takes policy, coverage and seed; got ['colour']"),
    ],
)
def test_bad_plugin_arguments_are_named(args: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        build_profile("packing", args={"packing": args})
    assert message in str(err.value)


def test_coverage_reaches_the_fgd_policy() -> None:
    profile = build_profile("packing", **packing("fgd", coverage=0.5))
    plugin = profile.scores[0][0]
    assert isinstance(plugin, PackingScore) and plugin.policy.coverage == 0.5  # type: ignore[attr-defined]
    assert build_profile("packing", **packing("fgd")).scores[0][0].policy.coverage == 0.95  # type: ignore[attr-defined]
