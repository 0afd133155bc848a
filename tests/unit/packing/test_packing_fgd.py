"""FGD: typical pods, fragmentation values worked by hand, the vectorised model against a naive one,
FGD's choices, and what gpuyard adds (room for model-constrained pods, CPU stranding)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuyard.scheduler.placement.packing import (
    ClusterState,
    FgdPolicy,
    FragmentationModel,
    GpuyardPolicy,
    PodRequest,
    TypicalPods,
    TypicalShape,
    fgd_scores,
)


def cluster(*specs: tuple[str, int, list[int], str]) -> ClusterState:
    """specs: (name, free cpu, free milli per GPU, model)."""
    width = max(len(s[2]) for s in specs)
    return ClusterState(
        node_names=[s[0] for s in specs],
        model_names=sorted({s[3] for s in specs if s[3]}),
        cpu_free=[s[1] for s in specs],
        mem_free=[10**6] * len(specs),
        gpu_free=[s[2] + [0] * (width - len(s[2])) for s in specs],
        gpu_count=[len(s[2]) for s in specs],
        gpu_model=[sorted({x[3] for x in specs if x[3]}).index(s[3]) if s[3] else -1 for s in specs],
    )


# Two typical shapes: 500m shares (cpu 1000) x3 and whole GPUs (cpu 2000) x1, so p = 0.75 / 0.25.
TYPICAL = TypicalPods([TypicalShape(1000, 1, 500, None, 3), TypicalShape(2000, 1, 1000, None, 1)])


def naive_frag(cpu: int, gpus: list[int], model: int, typical: TypicalPods) -> float:
    """F_n exactly as the notes state it, one typical pod at a time."""
    G = sum(gpus)
    total = 0.0
    for shape, p in zip(typical.shapes, typical.probabilities, strict=True):
        if shape.num_gpu == 0 or shape.gpu_milli == 0:
            f = G
        elif shape.allowed_models is not None and model not in shape.allowed_models:
            f = G
        elif sum(g >= shape.gpu_milli for g in gpus) >= shape.num_gpu and cpu >= shape.cpu_milli:
            f = sum(g for g in gpus if g < shape.gpu_milli)
        else:
            f = G
        total += p * f
    return total


def test_typical_pods_keep_the_popular_shapes_until_95_percent():
    pods = (
        [PodRequest(name="a", cpu_milli=1000, memory_mib=1, num_gpu=1, gpu_milli=500)] * 60
        + [PodRequest(name="b", cpu_milli=2000, memory_mib=1, num_gpu=1, gpu_milli=1000)] * 30
        + [PodRequest(name="c", cpu_milli=4000, memory_mib=1, num_gpu=0, gpu_milli=0)] * 6
        + [PodRequest(name="d", cpu_milli=8000, memory_mib=1, num_gpu=2, gpu_milli=1000)] * 4
    )
    typical = TypicalPods.from_workload(pods)
    assert [(s.cpu_milli, s.num_gpu, s.gpu_milli, s.count) for s in typical.shapes] == [
        (1000, 1, 500, 60),
        (2000, 1, 1000, 30),
        (4000, 0, 0, 6),  # 90% -> 96%: the shape that crosses 95% is kept, the rest dropped
    ]
    assert typical.probabilities.tolist() == pytest.approx([60 / 96, 30 / 96, 6 / 96])
    # equal counts: the larger shape first, as the simulator's reverse sort
    tie = TypicalPods.from_workload(
        [
            PodRequest(name="x", cpu_milli=1000, memory_mib=1, num_gpu=1, gpu_milli=200),
            PodRequest(name="y", cpu_milli=3000, memory_mib=1, num_gpu=1, gpu_milli=200),
        ],
        coverage=0.5,
    )
    assert [s.cpu_milli for s in tie.shapes] == [3000]


def test_fragmentation_worked_by_hand():
    s = cluster(
        ("n", 8000, [1000, 300], "T4"), ("m", 1500, [1000, 1000], "T4"), ("k", 8000, [200, 100], "T4")
    )
    model = FragmentationModel(TYPICAL)
    frag = model.node_frag(s)
    # n: both shapes fit; GPUs below 500m: the 300 -> 300; below 1000m: the 300 -> 300. F = 300.
    # m: the share fits (frag 0); the whole pod lacks CPU (1500 < 2000) -> G = 2000. F = .25 * 2000.
    # k: nothing fits -> F = G = 300.
    assert frag.tolist() == pytest.approx([300.0, 500.0, 300.0])
    assert model.cluster_frag(s) == pytest.approx(1100.0)


def test_fgd_score_is_truncated_sigmoid_of_the_decrease_and_picks_the_best_gpu():
    s = cluster(("n", 8000, [1000, 600], "T4"))
    model = FragmentationModel(TYPICAL)
    # before: F = .25 * 600 = 150. A 500m pod on GPU 0 -> [500, 600]: the whole pod no longer fits,
    # F = .25 * 1100 = 275 (decrease -125 -> 46); on GPU 1 -> [1000, 100]: F = 100 (decrease 50 -> 51).
    score, gpu, dec = fgd_scores(
        model,
        s,
        pod=PodRequest(name="p", cpu_milli=1000, memory_mib=1, num_gpu=1, gpu_milli=500),
        nodes=np.array([0]),
    )
    assert score.tolist() == [math.floor(100 / (1 + math.exp(-0.05)))] == [51]
    assert gpu.tolist() == [1]
    assert dec.tolist() == [50 * model.C]
    policy = FgdPolicy()
    policy.model = model
    assert policy.place(s, PodRequest(name="p", cpu_milli=1000, memory_mib=1, num_gpu=1, gpu_milli=500)) == (
        0,
        (1,),
    )


def test_a_placement_that_changes_nothing_scores_exactly_50():
    s = cluster(("n", 64000, [1000, 1000], "T4"))
    score, _, dec = fgd_scores(
        FragmentationModel(TYPICAL),
        s,
        pod=PodRequest(name="cpu", cpu_milli=1000, memory_mib=1, num_gpu=0, gpu_milli=0),
        nodes=np.array([0]),
    )
    assert dec.tolist() == [0] and score.tolist() == [50]


def test_fgd_breaks_ties_by_node_name():
    s = cluster(
        ("z", 8000, [1000, 1000], "T4"), ("b", 8000, [1000, 1000], "T4"), ("c", 8000, [1000, 1000], "T4")
    )
    policy = FgdPolicy()
    policy.model = FragmentationModel(TYPICAL)
    assert policy.place(s, PodRequest(name="w", cpu_milli=1000, memory_mib=1, num_gpu=1, gpu_milli=1000)) == (
        1,
        (0,),
    )


@settings(max_examples=40, deadline=None)
@given(
    nodes=st.lists(
        st.tuples(
            st.integers(0, 20000),
            st.lists(st.sampled_from([0, 100, 190, 300, 500, 530, 700, 1000]), min_size=1, max_size=4),
            st.sampled_from(["A", "B", ""]),
        ),
        min_size=1,
        max_size=6,
    ),
    pod=st.sampled_from([(0, 0, 3000), (1, 300, 1000), (1, 500, 2500), (1, 1000, 1000), (2, 1000, 4000)]),
)
def test_vectorised_fragmentation_matches_the_naive_formula(nodes, pod):
    specs = [(f"n{i}", cpu, gpus, model if gpus else "") for i, (cpu, gpus, model) in enumerate(nodes)]
    s = cluster(*specs)
    model_b = s.model_names.index("B") if "B" in s.model_names else 99
    typical = TypicalPods(
        [
            TypicalShape(1000, 1, 500, None, 5),
            TypicalShape(2000, 1, 1000, None, 3),
            TypicalShape(4000, 2, 1000, (model_b,), 2),
            TypicalShape(500, 1, 200, None, 2),
            TypicalShape(3000, 0, 0, None, 1),
        ]
    )
    fm = FragmentationModel(typical)
    got = fm.node_frag(s)
    for i, (_, cpu, gpus, _) in enumerate(specs):
        assert got[i] == pytest.approx(naive_frag(cpu, gpus, int(s.gpu_model[i]), typical))
    num, milli, cpu = pod
    req = PodRequest(name="p", cpu_milli=cpu, memory_mib=1, num_gpu=num, gpu_milli=milli)
    from gpuyard.scheduler.placement.packing import fits

    cand = np.flatnonzero(fits(s, req))
    score, gpu, dec = fgd_scores(fm, s, pod=req, nodes=cand)
    for k, n in enumerate(cand):
        gpus = list(s.gpu_free[n, : s.gpu_count[n]])
        before = naive_frag(int(s.cpu_free[n]), gpus, int(s.gpu_model[n]), typical)
        options = []
        if req.shared:
            for g, free in enumerate(gpus):
                if free >= milli:
                    after = gpus.copy()
                    after[g] -= milli
                    options.append(
                        (
                            g,
                            before
                            - naive_frag(int(s.cpu_free[n]) - cpu, after, int(s.gpu_model[n]), typical),
                        )
                    )
        else:
            after, left = gpus.copy(), num
            for g, free in enumerate(after):
                if left and free == 1000:
                    after[g], left = 0, left - 1
            options.append(
                (0, before - naive_frag(int(s.cpu_free[n]) - cpu, after, int(s.gpu_model[n]), typical))
            )
        ints = [(math.floor(100 / (1 + math.exp(-d / 1000))), g) for g, d in options]
        best = max(v for v, _ in ints)
        assert score[k] == best
        if req.shared:
            assert gpu[k] == min(g for v, g in ints if v == best)
        assert dec[k] / fm.C == pytest.approx(dict(options)[int(gpu[k]) if req.shared else 0])


def test_fragmentation_cache_follows_allocations():
    s = cluster(("n", 8000, [1000, 1000], "T4"), ("m", 8000, [1000, 1000], "T4"))
    fm = FragmentationModel(TYPICAL)
    assert fm.node_frag(s).tolist() == [0.0, 0.0]
    s.allocate(0, (0,), PodRequest(name="p", cpu_milli=1000, memory_mib=1, num_gpu=1, gpu_milli=700))
    assert fm.node_frag(s).tolist() == pytest.approx([naive_frag(7000, [300, 1000], 0, TYPICAL), 0.0])
    s.release(0, (0,), PodRequest(name="p", cpu_milli=1000, memory_mib=1, num_gpu=1, gpu_milli=700))
    assert fm.node_frag(s).tolist() == [0.0, 0.0]


def test_fgd_scores_refuse_a_node_the_pod_does_not_fit():
    s = cluster(("n", 8000, [1000, 200], "T4"), ("m", 8000, [100, 100], "T4"))
    pod = PodRequest(name="p", cpu_milli=1000, memory_mib=1, num_gpu=1, gpu_milli=500)
    with pytest.raises(ValueError, match="does not fit"):
        fgd_scores(FragmentationModel(TYPICAL), s, pod=pod, nodes=np.array([0, 1]))
    assert [len(a) for a in fgd_scores(FragmentationModel(TYPICAL), s, pod=pod, nodes=np.array([], int))] == [
        0,
        0,
        0,
    ]


def test_fgd_needs_prepare():
    s = cluster(("n", 8000, [1000], "T4"))
    with pytest.raises(RuntimeError, match="prepare"):
        FgdPolicy().place(s, PodRequest(name="p", cpu_milli=1, memory_mib=1, num_gpu=1, gpu_milli=1000))


def gpu_workload() -> list[PodRequest]:
    # GPU pods asking 12 cores per GPU, plus a few CPU-only pods.
    return [
        PodRequest(name=f"g{i}", cpu_milli=12000, memory_mib=1, num_gpu=1, gpu_milli=1000) for i in range(20)
    ] + [PodRequest(name=f"c{i}", cpu_milli=32000, memory_mib=1, num_gpu=0, gpu_milli=0) for i in range(2)]


def test_gpuyard_keeps_cpu_for_the_gpus_that_need_it():
    # "a" has 12 cores per GPU, exactly what its GPUs' pods need; "b" has CPU to spare.
    s = cluster(("a", 96000, [1000] * 8, "G2"), ("b", 200000, [1000] * 2, "T4"))
    heavy = PodRequest(name="heavy", cpu_milli=40000, memory_mib=1, num_gpu=1, gpu_milli=1000)
    fgd, ours = FgdPolicy(), GpuyardPolicy()
    fgd.prepare(gpu_workload())
    ours.prepare(gpu_workload())
    assert ours.cpu_per_gpu == 12000 * 20 * 1000 // 20000
    # 40 cores for one GPU on a would leave its other 7 GPUs 28 cores short
    assert ours.deficit_increase(s, heavy, np.array([0, 1])).tolist() == [28000 * 1000, 0]
    assert fgd.place(s, heavy)[0] == 0  # FGD: a sorts first and no typical pod stops fitting once
    assert ours.place(s, heavy)[0] == 1
    # a CPU-only pod is FGD's to place (FGD already counts the GPU pods it would stop fitting)
    cpu_pod = PodRequest(name="cpu", cpu_milli=32000, memory_mib=1, num_gpu=0, gpu_milli=0)
    assert ours.place(s, cpu_pod)[0] == fgd.place(s, cpu_pod)[0]
    # a GPU-heavy, CPU-light pod is welcome where CPU is short
    s.allocate(0, (), cpu_pod)
    light = PodRequest(name="light", cpu_milli=1000, memory_mib=1, num_gpu=1, gpu_milli=1000)
    assert ours.place(s, light)[0] == 0


def test_gpuyard_keeps_scarce_models_for_constrained_pods():
    s = cluster(("a-v100", 64000, [1000, 1000], "V100"), ("b-t4", 64000, [1000, 1000], "T4"))
    v100 = s.model_ids("V100")
    workload = [
        PodRequest(name=f"s{i}", cpu_milli=1000, memory_mib=1, num_gpu=1, gpu_milli=500) for i in range(100)
    ] + [
        PodRequest(name=f"v{i}", cpu_milli=1000, memory_mib=1, num_gpu=1, gpu_milli=1000, allowed_models=v100)
        for i in range(2)
    ]
    fgd, ours = FgdPolicy(), GpuyardPolicy()
    fgd.prepare(workload)
    ours.prepare(workload)
    pod = PodRequest(name="any", cpu_milli=1000, memory_mib=1, num_gpu=1, gpu_milli=500)
    assert fgd.place(s, pod)[0] == 0
    assert ours.place(s, pod)[0] == 1
    # the V100-only pods still need both V100 GPUs: a share there would leave them short
    assert ours.leaves_room(s, pod, np.array([0, 1])).tolist() == [False, True]
    # a pod that needs V100 still gets it
    assert (
        ours.place(
            s,
            PodRequest(
                name="v", cpu_milli=1000, memory_mib=1, num_gpu=1, gpu_milli=1000, allowed_models=v100
            ),
        )[0]
        == 0
    )


def test_gpuyard_matches_fgd_when_cpu_is_plentiful_and_nothing_is_constrained():
    s = cluster(*[(f"n{i}", 10**6, [1000, 1000, 1000, 1000], "T4") for i in range(6)])
    workload = [
        PodRequest(name=f"p{i}", cpu_milli=1000, memory_mib=1, num_gpu=1, gpu_milli=m)
        for i, m in enumerate([300, 500, 700, 1000] * 5)
    ]
    fgd, ours = FgdPolicy(), GpuyardPolicy()
    fgd.prepare(workload)
    ours.prepare(workload)
    t = s.copy()
    for pod in workload:
        a, b = fgd.place(s, pod), ours.place(t, pod)
        assert a == b
        s.allocate(*a, pod)
        t.allocate(*b, pod)


def test_fgd_gpu_choice_is_recomputed_when_the_node_changed_after_scoring():
    s = cluster(("n", 8000, [1000, 600], "T4"))
    policy = FgdPolicy()
    policy.model = FragmentationModel(TYPICAL)
    pod = PodRequest(name="p", cpu_milli=1000, memory_mib=1, num_gpu=1, gpu_milli=500)
    policy.score(s, pod, np.array([0]))
    assert policy.choose_gpus(s, 0, pod) == (1,)  # from the cache
    s.allocate(0, (1,), PodRequest(name="q", cpu_milli=1, memory_mib=1, num_gpu=1, gpu_milli=200))
    assert policy.choose_gpus(s, 0, pod) == (0,)  # GPU 1 has 400m left now: it no longer fits
