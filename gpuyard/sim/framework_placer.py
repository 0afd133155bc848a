"""The openb experiment through the live scheduler: Node objects, the Snapshot, `place()`, plugins.

`FrameworkPlacer` is the `Placer` that `gpuyard simulate openb --engine scheduler` (the default)
uses. It does what `gpuyard serve` does for each pod, minus the store and the event loop:

1. the trace's nodes become `Node` objects as the fake cluster makes them (capacity, allocatable,
   Ready, the GPU model label) and one :class:`~gpuyard.scheduler.cache.snapshot.Snapshot` is built
   from them, rows in node-name order (so the framework's "lowest row wins a tie" is the paper's
   "the name that sorts first wins");
2. each pod becomes a `PodSpec` (requests ``cpu``/``memory``/``nvidia.com/gpu``, a share as
   ``gpuyard.io/gpu-milli``, ``gpu_spec`` as a required node affinity on ``gpuyard.io/gpu-model``),
   parsed by the scheduler's own `shape_of`, and a one-pod gang goes through `place()` with the
   ``packing`` profile (filters, the ``packing`` score with the named policy, the packing GPU
   chooser);
3. the placement is recorded the way the assume records it: a `Reservation` per pod
   (`reservation_for`) upserted into the snapshot.

The run's own ledger (`gpuyard.sim.openb`) replays every placement and raises if the scheduler
ever over-commits a node or mixes whole and shared use of a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any

from gpuyard.apis.core import GPU_RESOURCE, Node, NodeCondition, NodeStatus, PodSpec
from gpuyard.apis.devicematching import LABEL_GPU_MODEL
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.resourceclasses import RequestError
from gpuyard.scheduler.cache.assuming import reservation_for, share_memory_of
from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.gangs.outcomes import Placement
from gpuyard.scheduler.gangs.requests import GangRequest, PodShape, PodSlot, RolePart, shape_of
from gpuyard.scheduler.placement.packing import ClusterState, PodRequest
from gpuyard.scheduler.placement.packing.plugins import PackingScore
from gpuyard.scheduler.placement.placing import place
from gpuyard.scheduler.placement.profiles import build_profile

__all__ = ["FrameworkPlacer", "framework_placer", "node_objects", "pod_spec"]

_NS = "openb"
_MIB = 2**20

_ShapeKey = tuple[int, int, int, tuple[int, ...] | None, int]
"""A pod's request shape (`PodRequest.shape`) and its memory: pods alike in it share one `PodShape`."""


def node_objects(state: ClusterState, order: Sequence[int]) -> list[Node]:
    """The ledger's nodes (in `order`) as Ready `Node` objects with the fake cluster's GPU labels."""
    out = []
    for i in order:
        name = state.node_names[i]
        capacity = {
            "cpu": Decimal(int(state.cpu_capacity[i])) / 1000,
            "memory": Decimal(int(state.mem_capacity[i]) * _MIB),
        }
        labels = {"kubernetes.io/hostname": name}
        gpus = int(state.gpu_count[i])
        if gpus:
            capacity[GPU_RESOURCE] = Decimal(gpus)
            model = int(state.gpu_model[i])
            if model >= 0:
                labels[LABEL_GPU_MODEL] = state.model_names[model]
        out.append(
            Node(
                metadata=ObjectMeta(name=name, labels=labels),
                status=NodeStatus(
                    capacity=capacity,
                    allocatable=dict(capacity),
                    conditions=[NodeCondition(type="Ready", status="True")],
                ),
            )
        )
    return out


def pod_spec(pod: PodRequest, model_names: Sequence[str]) -> PodSpec:
    """The pod a user would submit for this request (see the module docstring)."""
    requests: dict[str, str] = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    if pod.shared:
        requests["gpuyard.io/gpu-milli"] = str(pod.gpu_milli)
    elif pod.num_gpu:
        requests[GPU_RESOURCE] = str(pod.num_gpu)
    raw: dict[str, Any] = {
        "containers": [{"name": "main", "image": "trace", "resources": {"requests": requests}}]
    }
    if pod.allowed_models is not None:
        models = sorted(model_names[m] for m in pod.allowed_models)
        raw["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": LABEL_GPU_MODEL, "operator": "In", "values": models}]}
                    ]
                }
            }
        }
    return PodSpec.model_validate(raw)


class FrameworkPlacer:
    """Places each pod with `place()` on a `Snapshot` (see the module docstring)."""

    def __init__(
        self,
        *,
        state: ClusterState,
        workload: Sequence[PodRequest],
        policy: str,
        seed: int,
        profile: str = "packing",
    ) -> None:
        order = sorted(range(state.n_nodes), key=state.node_names.__getitem__)
        self.snapshot = Snapshot.build(nodes=node_objects(state, order))
        snap = self.snapshot
        self.ledger_index = {name: i for i, name in enumerate(state.node_names)}
        self.model_names = list(state.model_names)
        args = {name: {"policy": policy, "seed": seed} for name in ("packing", "packing-gpu")}
        self.profile = build_profile(profile, args=args, seed=seed)
        to_snapshot = {
            i: snap.model_names.index(m) for i, m in enumerate(self.model_names) if m in snap.model_names
        }
        remapped = [
            replace(
                p, allowed_models=tuple(sorted(to_snapshot[m] for m in p.allowed_models if m in to_snapshot))
            )
            if p.allowed_models is not None
            else p
            for p in workload
        ]
        for plugin, _ in self.profile.scores:
            if isinstance(plugin, PackingScore):  # the policy measures fragmentation against the trace
                plugin.prepare(remapped)
        self._shapes: dict[_ShapeKey, tuple[PodShape, dict[str, Decimal]]] = {}
        self._count = 0

    def _shape(self, pod: PodRequest) -> tuple[PodShape, dict[str, Decimal]]:
        key: _ShapeKey = (*pod.shape, pod.memory_mib)
        got = self._shapes.get(key)
        if got is None:
            try:
                got = shape_of(pod_spec(pod, self.model_names), classes={})
            except RequestError as err:  # the trace loader validates requests; this is a bug
                raise ValueError(f"pod {pod.name}: {err}") from err
            self._shapes[key] = got
        return got

    def place(self, pod: PodRequest) -> tuple[int, tuple[int, ...]] | None:
        shape, requests = self._shape(pod)
        self._count += 1
        name = f"{pod.name}-{self._count}"
        slot = PodSlot(namespace=_NS, group=name, role="pod", index=0, name=name)
        gang = GangRequest(
            key=(_NS, name),
            members=((_NS, name),),
            parts=[RolePart(_NS, name, "pod", shape, (slot,), 1, requests)],
        )
        result = place(self.snapshot, gang, self.profile)
        if not isinstance(result, Placement) or not result.pods:
            return None
        pp = result.pods[0]
        res = reservation_for(pp, peers=[], gpu_memory_mib=share_memory_of(self.snapshot, pp))
        self.snapshot.upsert_reservation(res)
        return self.ledger_index[pp.node], tuple(pp.gpus)


def framework_placer(
    *, state: ClusterState, workload: Sequence[PodRequest], policy: str, seed: int, profile: str = "packing"
) -> FrameworkPlacer:
    """`PlacerFactory` for `FrameworkPlacer` (`profile`: the scheduler profile; its packing
    plugins, if any, run `policy`)."""
    return FrameworkPlacer(state=state, workload=workload, policy=policy, seed=seed, profile=profile)
