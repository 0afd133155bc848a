"""Workload variants of an openb pod list, derived the way the FGD paper (ATC'23, section 6) does.

A packing policy tuned on one trace is no result: it has to hold on workloads with another mix
of GPU-sharing, multi-GPU, GPU-model-constrained and CPU-only pods. Each variant here is derived
from a given pod list (normally openb's default one) by a documented recipe, seeded, so a policy
can be validated on traces it was not tuned on:

* ``share-P``: P % of the GPU pods ask for a share of one GPU (``gpu_milli`` < 1000);
* ``multi-P``: multi-GPU pods carry P % of the GPU pods' whole GPU request;
* ``spec-P``: P % of the GPU pods require one GPU model, drawn in proportion to the model's GPUs
  in the cluster (``gpu_spec``);
* ``cpu-P``: P % of all pods are CPU-only.

Recipe for the mix variants: keep the number of pods; draw each pod's class (CPU-only, GPU share,
one whole GPU, several GPUs) with the target probabilities — the classes the variant does not
name keep their relative weights from the source — then draw the pod itself uniformly (with
replacement) among the source pods of that class. ``spec-P`` keeps the pods and constrains a
random P % of the GPU pods. The source's pods are never changed otherwise, so request sizes, CPU
and memory stay realistic.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from gpuyard.scheduler.placement.packing import GPU_MILLI
from gpuyard.sim.traces import NodeTrace, PodTrace

__all__ = ["KINDS", "VALIDATION_SET", "make_variant", "parse_variant"]

KINDS = ("share", "multi", "spec", "cpu")
VALIDATION_SET = (
    "share-20",
    "share-60",
    "share-80",
    "multi-20",
    "multi-40",
    "spec-10",
    "spec-33",
    "cpu-25",
    "cpu-40",
)
"""The variants `bench/packing_variants.py` validates packing policies on."""

_NAME = re.compile(r"^(share|multi|spec|cpu)-(\d{1,3})$")
_CPU, _SHARE, _ONE, _MULTI = range(4)


def parse_variant(name: str) -> tuple[str, float]:
    """``"share-40"`` -> ("share", 0.4); ValueError naming the allowed forms."""
    m = _NAME.match(name.strip())
    if not m or not 0 <= int(m.group(2)) <= 100:
        raise ValueError(
            f"bad variant {name!r}: use KIND-PERCENT with KIND one of {', '.join(KINDS)} and PERCENT 0..100"
        )
    return m.group(1), int(m.group(2)) / 100


def _classes(pods: PodTrace) -> np.ndarray:
    cls = np.full(len(pods), _ONE, dtype=np.int64)
    cls[pods.num_gpu == 0] = _CPU
    cls[(pods.num_gpu == 1) & (pods.gpu_milli < GPU_MILLI)] = _SHARE
    cls[pods.num_gpu > 1] = _MULTI
    return cls


def _class_weights(pods: PodTrace, cls: np.ndarray, kind: str, p: float) -> np.ndarray:
    """Target probability of each class for a mix variant."""
    counts = np.bincount(cls, minlength=4).astype(np.float64)
    w = counts / counts.sum()
    gpu = w[[_SHARE, _ONE, _MULTI]].sum()
    if kind == "cpu":
        rest = w[1:] / w[1:].sum()
        return np.array([p, *((1 - p) * rest)])
    if kind == "share":
        others = w[[_ONE, _MULTI]] / w[[_ONE, _MULTI]].sum()
        return np.array([w[_CPU], gpu * p, *(gpu * (1 - p) * others)])
    # multi: solve q (multi-GPU share of GPU pods by count) for a GPU-request share p
    milli = pods.total_gpu_milli.astype(np.float64)
    m_multi = milli[cls == _MULTI].mean()
    single = (cls == _SHARE) | (cls == _ONE)
    m_single = milli[single].mean()
    q = p * m_single / (m_multi * (1 - p) + p * m_single) if p < 1 else 1.0
    singles = w[[_SHARE, _ONE]] / w[[_SHARE, _ONE]].sum()
    return np.array([w[_CPU], *(gpu * (1 - q) * singles), gpu * q])


def _take(pods: PodTrace, idx: np.ndarray, name: str) -> PodTrace:
    return PodTrace(
        path=name,
        names=[f"{name}-{i}" for i in range(len(idx))],
        cpu_milli=pods.cpu_milli[idx].copy(),
        memory_mib=pods.memory_mib[idx].copy(),
        num_gpu=pods.num_gpu[idx].copy(),
        gpu_milli=pods.gpu_milli[idx].copy(),
        gpu_spec=[pods.gpu_spec[i] for i in idx.tolist()],
    )


def make_variant(pods: PodTrace, nodes: NodeTrace, *, name: str, seed: int = 0) -> PodTrace:
    """The variant `name` (see the module docstring) of `pods`, for the cluster `nodes`."""
    kind, p = parse_variant(name)
    rng = np.random.default_rng(seed)
    cls = _classes(pods)
    if kind == "spec":
        out = _take(pods, np.arange(len(pods)), f"{name}-s{seed}")
        gpu_pods = np.flatnonzero(cls != _CPU)
        chosen = rng.choice(gpu_pods, size=round(p * len(gpu_pods)), replace=False)
        models = sorted(set(nodes.models))
        per_model = np.array(
            [nodes.gpus[[m == model for m in nodes.models]].sum() for model in models], float
        )
        picks = rng.choice(len(models), size=len(chosen), p=per_model / per_model.sum())
        spec = list(out.gpu_spec)
        for pod, model in zip(chosen.tolist(), picks.tolist(), strict=True):
            spec[pod] = models[model]
        return replace(out, gpu_spec=spec)
    weights = _class_weights(pods, cls, kind, p)
    members = [np.flatnonzero(cls == c) for c in range(4)]
    for c, m in enumerate(members):
        if weights[c] > 0 and not len(m):
            raise ValueError(f"variant {name}: the source has no pods of the class it needs to draw from")
    drawn = rng.choice(4, size=len(pods), p=weights / weights.sum())
    idx = np.empty(len(pods), dtype=np.int64)
    for c in range(4):
        where = np.flatnonzero(drawn == c)
        if len(where):
            idx[where] = rng.choice(members[c], size=len(where), replace=True)
    return _take(pods, idx, f"{name}-s{seed}")
