"""Submit-time warnings for jobs that can never fit on the cluster as it is now.

A job whose gang could not fit on the stored nodes even were they empty is still created —
nodes may join, as Kubernetes accepts a pod no node can run yet — but the answer carries one
Kubernetes-style `Warning: 299 - "can never fit on this cluster: <Kind> <ns>/<name>: <why>"`
header per reason (`gpuyard submit` prints them on stderr, as kubectl does).

The job is turned into its gang the way the operator and the scheduler do it
(`controllers.podgroups.build_pod_group`, then `scheduler.gangs.requests.build_gang`) and asked
of the scheduler's own capacity module (`scheduler.placement.capacity.ever_fits`, with the
built-in static filters) against a snapshot of the stored nodes, NodeTopologies and
ResourceClasses with no reservations: the empty cluster. The default class `nvidia.<model>` of a
GPU model the nodes have counts even before the scheduler has created it.

The snapshot is kept per store and brought up to date before each check: only the nodes whose
stored object (or NodeTopology) changed are reloaded, so a bulk submit costs one pass over the
node list, not a snapshot per job. It runs on the event loop (the check is a few vectorised
array operations per job part).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import structlog

from gpuyard.apis.core import Node
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.resourceclasses import ResourceClass, default_class, default_class_name
from gpuyard.controllers.podgroups import build_pod_group
from gpuyard.controllers.workloads.registry import plugin_for
from gpuyard.platform.api.fields import MAX_WARNINGS, warning_header
from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.gangs.requests import build_gang
from gpuyard.scheduler.placement.capacity import NEVER, NeverFit, ever_fits
from gpuyard.state.store import Store

__all__ = ["EmptyCluster", "never_fit_reasons", "never_fit_warnings"]

log = structlog.get_logger(__name__)


class EmptyCluster:
    """A :class:`Snapshot` of a store's nodes, topologies and classes, without reservations."""

    def __init__(self) -> None:
        self.snapshot = Snapshot()
        self._loaded: dict[str, tuple[Node, NodeTopology | None]] = {}
        self._classes: tuple[tuple[str, str], ...] | None = None

    def current(self, store: Store) -> Snapshot:
        """The snapshot, with the nodes, topologies and classes `store` holds now."""
        snap = self.snapshot
        kinds = set(store.kinds())
        topologies = (
            {t.metadata.name: t for t in store.list_of(NodeTopology)} if "NodeTopology" in kinds else {}
        )
        seen: set[str] = set()
        for node in store.list_of(Node):
            name = node.metadata.name
            seen.add(name)
            topology = topologies.get(name)
            loaded = self._loaded.get(name)
            if loaded is None or loaded[0] is not node or loaded[1] is not topology:
                snap.refresh_node(node, topology)
                self._loaded[name] = (node, topology)
        for name in [n for n in self._loaded if n not in seen]:
            snap.remove_node(name)
            del self._loaded[name]
        stored = store.list_of(ResourceClass) if "ResourceClass" in kinds else []
        classes = {c.metadata.name: c for c in stored}
        for model in snap.model_names:  # created by the scheduler moments after a node appears
            if model:
                classes.setdefault(default_class_name(model), default_class(model))
        key = tuple(sorted((name, c.metadata.resource_version or "") for name, c in classes.items()))
        if key != self._classes:
            snap.set_classes(classes.values())
            self._classes = key
        return snap


_CLUSTERS: weakref.WeakKeyDictionary[Store, EmptyCluster] = weakref.WeakKeyDictionary()


def never_fit_reasons(store: Store, job: TrainingJob) -> list[NeverFit]:
    """Why `job` could never fit on the stored nodes, even empty ([]: it may fit, or no node is
    known yet, or its requests cannot be read: submit validation says so)."""
    cluster = _CLUSTERS.get(store)
    if cluster is None:
        cluster = _CLUSTERS[store] = EmptyCluster()
    snap = cluster.current(store)
    if not snap.node_count:
        return []
    try:
        pg = build_pod_group(job, plugin_for(job.kind))
        gang = build_gang([pg], placed={}, classes=snap.class_names)
    except ValueError:  # RequestError: a request no class can satisfy (a 422 before this)
        return []
    if not gang.parts:
        return []
    return list(ever_fits(snap, gang).reasons)


def never_fit_warnings(store: Store, jobs: Iterable[TrainingJob]) -> list[str]:
    """The `Warning` header values for the jobs that can never fit (see the module docstring).
    A failure here is logged and answers no warning: it never fails a submit."""
    texts: list[str] = []
    for job in jobs:
        ref = f"{job.kind} {job.metadata.namespace or 'default'}/{job.metadata.name}"
        try:
            reasons = never_fit_reasons(store, job)
        except Exception:  # a warning is advice: the job is stored whatever happens here
            log.exception("api.never_fit_check_failed", job=ref)
            continue
        texts += [f"{NEVER}: {ref}: {reason.describe()}" for reason in reasons]
    shown = [warning_header(t) for t in texts[:MAX_WARNINGS]]
    if len(texts) > MAX_WARNINGS:
        shown.append(warning_header(f"and {len(texts) - MAX_WARNINGS} more reasons jobs can never fit"))
    return shown
