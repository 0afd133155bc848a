"""Tiny builders for scheduler tests: PodGroups, roles, snapshots and one-call placement."""

from __future__ import annotations

import itertools
from typing import Any

from gpuyard.apis.core import Node
from gpuyard.apis.resourceclasses import ResourceClass, default_class
from gpuyard.apis.scheduling import PodGroup, Reservation
from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.gangs.outcomes import Placement, Unschedulable
from gpuyard.scheduler.gangs.requests import GangRequest, build_gang
from gpuyard.scheduler.placement.placing import place
from gpuyard.scheduler.placement.profiles import build_profile
from tests.builders import make_node

__all__ = ["assume_into", "gang_of", "make_node", "place_one", "podgroup", "reservations_of", "role", "snap"]


def role(
    name: str = "Worker",
    replicas: int = 1,
    *,
    gpus: int = 0,
    cpu: str | None = "1",
    memory: str | None = "1Gi",
    resource: str = "nvidia.com/gpu",
    min_available: int | None = None,
    host_ports: int = 0,
    node_selector: dict[str, str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    affinity: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    limits: dict[str, Any] = dict(extra or {})
    if cpu:
        limits["cpu"] = cpu
    if memory:
        limits["memory"] = memory
    if gpus:
        limits[resource] = gpus
    template: dict[str, Any] = {
        "containers": [{"name": "main", "image": "train", "resources": {"limits": limits}}]
    }
    if node_selector:
        template["nodeSelector"] = node_selector
    if tolerations:
        template["tolerations"] = tolerations
    if affinity:
        template["affinity"] = affinity
    out: dict[str, Any] = {"name": name, "replicas": replicas, "template": template, "hostPorts": host_ports}
    if min_available is not None:
        out["minAvailable"] = min_available
    return out


def podgroup(name: str, *roles: dict[str, Any], namespace: str = "default", **spec: Any) -> PodGroup:
    return PodGroup.model_validate(
        {
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "spec": {"roles": list(roles), **spec},
        }
    )


def snap(
    nodes: list[Node],
    *,
    classes: list[ResourceClass] | None = None,
    reservations: list[Reservation] = (),  # type: ignore[assignment]
    port_range: tuple[int, int] = (20000, 30000),
) -> Snapshot:
    if classes is None:
        models = sorted({n.metadata.labels.get("gpuyard.io/gpu-model", "") for n in nodes} - {""})
        classes = [default_class(m) for m in models]
    return Snapshot.build(nodes=nodes, classes=classes, reservations=reservations, port_range=port_range)


def gang_of(s: Snapshot, *pgs: PodGroup) -> GangRequest:
    placed = {
        (p.metadata.namespace, p.metadata.name): s.placed_pods((p.metadata.namespace, p.metadata.name))
        for p in pgs
    }
    return build_gang(list(pgs), placed=placed, classes=s.class_names)


def place_one(s: Snapshot, *pgs: PodGroup, profile: str = "default", **kw: Any) -> Placement | Unschedulable:
    return place(s, gang_of(s, *pgs), build_profile(profile, **kw))


def reservations_of(placement: Placement) -> list[Reservation]:
    """The Reservations the loop would create (with fake resourceVersions)."""
    from gpuyard.scheduler.cache.assuming import reservation_for

    peers = placement.local_peers()
    out = []
    for pp in placement.pods:
        r = reservation_for(pp, peers=peers[pp.pod.name])
        r.metadata.resource_version = str(next(_RV))
        out.append(r)
    return out


_RV = itertools.count(10_000)


def assume_into(s: Snapshot, placement: Placement) -> list[Reservation]:
    out = reservations_of(placement)
    for r in out:
        s.upsert_reservation(r)
    return out
