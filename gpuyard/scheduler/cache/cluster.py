"""The scheduler's view of the cluster: the watched objects, the snapshot, and keeping it current.

:class:`ClusterCache` owns the scheduler's copy of the watched objects
(:class:`~gpuyard.scheduler.cache.objects.ObjectCache`), the NumPy
:class:`~gpuyard.scheduler.cache.snapshot.Snapshot` of free capacity, the gang groups
(:class:`~gpuyard.scheduler.cache.grouping.GangGroups`), the pod-shape cache, and the bookkeeping
that keeps the snapshot in step with the store:

* `load` (a full LIST) rebuilds everything; `apply` (watch events) only notes what changed
  (a PodGroup event that changes neither generation, uid, labels nor annotations is a
  status-only write, usually the scheduler's own, and is ignored; so is the store's echo of a
  Reservation it assumed); `sync` applies the noted changes to the snapshot and says what the
  rest of the scheduler must look at again (:class:`Synced`);
* *assumed* Reservations (`assumed`: recorded in the snapshot when decided, before the store
  has them) and Reservations *being deleted* (`forget_reservation`: freed in the snapshot when
  the deletion is decided): their echoes are not news, and a failed write puts the room back
  (`unassume`, `delete_failed`);
* garbage: a Reservation whose PodGroup is gone (or was created again under the same name) is
  deleted, as are those a PodGroup releases (`spec.release`) and every Reservation of a
  PodGroup that is deleted (`forget`).

Deletions are decisions (:class:`~gpuyard.scheduler.decisions.DeleteReservation`) appended to
the outbox the cache shares with the Recorder, so they keep their order among the statuses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuyard.apis.core import Node
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.meta import Resource
from gpuyard.apis.resourceclasses import ResourceClass
from gpuyard.apis.scheduling import PodGroup, Reservation
from gpuyard.scheduler.cache.grouping import GangGroups
from gpuyard.scheduler.cache.objects import ObjectCache
from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.decisions import ChangeLike, DeleteReservation, Outbox
from gpuyard.scheduler.gangs.requests import ShapeCache

__all__ = ["QUOTA_KINDS", "WATCHED", "ClusterCache", "Synced"]

Key = tuple[str, str]

WATCHED = (
    "Node",
    "NodeTopology",
    "Reservation",
    "ResourceClass",
    "PodGroup",
    "ElasticQuota",
    "ResourceQuota",
    "Queue",
    "PodDisruptionBudget",
)
QUOTA_KINDS = ("ElasticQuota", "ResourceQuota", "Queue")
"""The kinds admission keeps (`Admission.sync_quotas`, `sync_resource_quotas`, `sync_queues`)."""

Signature = tuple[int, str, tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]


@dataclass(slots=True)
class Synced:
    """What `ClusterCache.sync` applied that the rest of the scheduler must act on."""

    quotas: list[tuple[str, set[Key]]]  # per quota kind that changed (`QUOTA_KINDS`): the objects
    classes: list[ResourceClass] | None  # every ResourceClass, when one changed
    nodes: list[tuple[str, Node | None, NodeTopology | None]]  # nodes changed (None: gone)
    gone: set[Key]  # PodGroups deleted (and maybe created again since)
    groups: set[Key]  # PodGroups to look at again: changed, or lost a Reservation


class ClusterCache:
    """The watched objects, the snapshot and the bookkeeping that keeps it current (see the
    module docstring)."""

    def __init__(self, *, port_range: tuple[int, int], out: Outbox) -> None:
        self.port_range = port_range
        self.objects = ObjectCache(WATCHED)
        self.snapshot = Snapshot(port_range=port_range)
        self.groups = GangGroups()
        self.shapes: ShapeCache = {}
        self._out = out
        self._sigs: dict[Key, Signature] = {}  # PodGroup: (generation, uid, labels, annotations) last seen
        self._dirty: dict[str, set[Key]] = {k: set() for k in WATCHED}
        self._assumed: dict[Key, Reservation] = {}  # assumed, not yet seen back from the store
        self._deleting: dict[Key, str] = {}  # Reservation -> uid, deletion decided
        self._gone: set[Key] = set()  # PodGroups deleted since the last sync
        self._uids: dict[Key, str] = {}  # PodGroup -> the uid whose Reservations it holds

    # --- input -----------------------------------------------------------------------------------

    def load(self, objects: Mapping[str, Iterable[Resource]]) -> None:
        """Start over from a full LIST: `objects` per watched kind the cluster knows. Orphaned
        Reservations are deleted."""
        cache = self.objects
        cache.reset(k for k in WATCHED if k in objects)
        for items in objects.values():
            for obj in items:
                cache.put(obj)
        self.snapshot = Snapshot.build(
            nodes=cache.list_of(Node),
            reservations=cache.list_of(Reservation),
            topologies={t.metadata.name: t for t in cache.list_of(NodeTopology)},
            classes=cache.list_of(ResourceClass),
            port_range=self.port_range,
        )
        self.groups.clear()
        self._sigs.clear()
        self._gone.clear()
        self._uids.clear()
        self._assumed.clear()
        self._deleting.clear()
        for d in self._dirty.values():
            d.clear()
        for res in cache.list_of(Reservation):
            self._collect_if_orphan(res)
        for pg in cache.list_of(PodGroup):
            self._sigs[(pg.metadata.namespace, pg.metadata.name)] = _signature_of(pg)
            self.groups.seen(pg)

    def apply(self, changes: Iterable[ChangeLike]) -> None:
        """Note watch events (anything with `type` and `object`); `sync` acts on them."""
        cache, dirty = self.objects, self._dirty
        for change in changes:
            obj = change.object
            kind = obj.kind
            meta = obj.metadata
            key = (meta.namespace, meta.name)
            if change.type == "DELETED":
                cache.pop(kind, key)
                if kind == "PodGroup":
                    self._gone.add(key)
            else:
                cache.put(obj)
                if kind == "PodGroup":
                    sig = _signature_of(obj)
                    if self._sigs.get(key) == sig:
                        continue  # a status-only write: nothing the scheduler decides on changed
                    self._sigs[key] = sig
                elif kind == "Reservation" and self._assumed.pop(key, None) is not None:
                    continue  # the echo of our own create: the snapshot holds it already
            if kind in dirty:
                dirty[kind].add(key)

    def recheck(self, key: Key) -> None:
        """Look at the PodGroup `key` again at the next `sync` (its status write failed)."""
        self._dirty["PodGroup"].add(key)

    # --- keeping the snapshot current ------------------------------------------------------------

    def sync(self) -> Synced:
        """Apply what changed since the last call to the snapshot (classes, nodes,
        Reservations); what the rest of the scheduler must act on."""
        cache, snap, dirty = self.objects, self.snapshot, self._dirty
        quotas: list[tuple[str, set[Key]]] = []
        for kind in QUOTA_KINDS:
            if dirty[kind]:
                quotas.append((kind, dirty[kind]))
                dirty[kind] = set()
        classes = None
        if dirty["ResourceClass"]:
            dirty["ResourceClass"].clear()
            classes = cache.list_of(ResourceClass)
            if snap.set_classes(classes):
                self.shapes.clear()
        topo_changed = dirty["NodeTopology"]
        names = dirty["Node"] | {("", name) for _, name in topo_changed}
        dirty["Node"], dirty["NodeTopology"] = set(), set()
        nodes: list[tuple[str, Node | None, NodeTopology | None]] = []
        for _, name in names:
            node = cache.get_of(Node, "", name)
            if node is None:
                snap.remove_node(name)
                nodes.append((name, None, None))
                continue
            if snap.node_obj.get(name) is node and ("", name) not in topo_changed:
                continue
            topology = cache.get_of(NodeTopology, "", name)
            snap.refresh_node(node, topology)
            nodes.append((name, node, topology))
        reservations, dirty["Reservation"] = dirty["Reservation"], set()
        freed: set[Key] = set()  # PodGroups that lost a reservation: look at them again
        for key in reservations:
            res = cache.get_of(Reservation, *key)
            if isinstance(res, Reservation):
                if self._deleting.get(key) == res.metadata.uid:
                    continue  # freed when its deletion was decided
                snap.upsert_reservation(res)
                self._collect_if_orphan(res)
            else:
                self._deleting.pop(key, None)
                if key in self._assumed:
                    continue  # the old one under a name given again: the snapshot holds the new one
                entry = snap.remove_reservation(key)
                if entry is not None:
                    freed.add(entry.group)
        groups, dirty["PodGroup"] = dirty["PodGroup"] | freed, set()
        gone, self._gone = self._gone, set()
        return Synced(quotas=quotas, classes=classes, nodes=nodes, gone=gone, groups=groups)

    def note(self, pg: PodGroup) -> dict[str, str]:
        """Note the PodGroup as it is now (its gang group, the uid whose Reservations it holds);
        Reservations an earlier PodGroup of its name held, and those it releases
        (`spec.release`), are deleted. The pods it holds now (pod -> node)."""
        key = (pg.metadata.namespace, pg.metadata.name)
        self.groups.seen(pg)
        held = self.snapshot.placed_pods(key)
        if held and self._uids.get(key) != pg.metadata.uid:
            self._collect_stale(pg, held)  # an earlier PodGroup of this name held them
        self._uids[key] = pg.metadata.uid
        for pod, uid in pg.spec.release.items():
            res = self.objects.get_of(Reservation, key[0], pod)
            if pod in held and res is not None and res.metadata.uid == uid:
                self._delete(key[0], pod, uid)
        return self.snapshot.placed_pods(key)

    def forget(self, key: Key) -> None:
        """The PodGroup is gone: its Reservations go too, and the cache's records of it."""
        for pod in self.snapshot.placed_pods(key):
            res = self.objects.get_of(Reservation, key[0], pod)
            self._delete(key[0], pod, res.metadata.uid if res is not None else "")
        self._sigs.pop(key, None)
        self._uids.pop(key, None)
        self.groups.forget(key)

    # --- assumed and deleted Reservations ----------------------------------------------------------

    def assumed(self, reservations: list[Reservation]) -> None:
        """These were recorded in the snapshot when decided; their store echo is not news."""
        for res in reservations:
            self._assumed[(res.metadata.namespace, res.metadata.name)] = res

    def forget_reservation(self, ns: str, name: str, uid: str) -> None:
        """Decide to delete a Reservation of the scheduler's own (the rescheduler's moves)."""
        self._delete(ns, name, uid)

    def unassume(self, reservations: list[Reservation]) -> None:
        """Creating these failed (those created were deleted again): the snapshot forgets them;
        a Reservation of the same name the store still has keeps its room."""
        for res in reservations:
            key = (res.metadata.namespace, res.metadata.name)
            self._assumed.pop(key, None)
            self.snapshot.remove_reservation(key)
            current = self.objects.get_of(Reservation, *key)
            if isinstance(current, Reservation) and self._deleting.get(key) != current.metadata.uid:
                self.snapshot.upsert_reservation(current)  # its deletion failed: it holds the room

    def delete_failed(self, ns: str, name: str) -> None:
        """Deleting the Reservation did not happen: if it still exists, it holds its room again
        and its PodGroup is looked at again (the deletion is decided again)."""
        key = (ns, name)
        self._deleting.pop(key, None)
        res = self.objects.get_of(Reservation, *key)
        if isinstance(res, Reservation):  # it still holds its room: decided again next step
            if key not in self._assumed:  # else the create under its name fails: `unassume`
                self.snapshot.upsert_reservation(res)
            self._dirty["PodGroup"].add((ns, res.spec.pod_group))

    def _collect_if_orphan(self, res: Reservation) -> None:
        """A Reservation whose PodGroup is gone (or was recreated) is deleted."""
        ns = res.metadata.namespace
        pg = self.objects.get_of(PodGroup, ns, res.spec.pod_group)
        owners = [r.uid for r in res.metadata.owner_references if r.kind == "PodGroup"]
        if pg is not None and (not owners or pg.metadata.uid in owners):
            return
        self._delete(ns, res.metadata.name, res.metadata.uid)

    def _collect_stale(self, pg: PodGroup, held: Mapping[str, str]) -> None:
        """Collect Reservations of `pg`'s name that an earlier PodGroup owned."""
        ns = pg.metadata.namespace
        for pod in held:
            res = self.objects.get_of(Reservation, ns, pod)
            owners = [r.uid for r in res.metadata.owner_references if r.kind == "PodGroup"] if res else []
            if res is not None and owners and pg.metadata.uid not in owners:
                self._delete(ns, pod, res.metadata.uid)

    def _delete(self, ns: str, name: str, uid: str) -> None:
        """Decide to delete a Reservation: its room is free in the snapshot at once (as a
        placement is assumed when decided); if the deletion fails, it is held again."""
        if (ns, name) in self._deleting and self._deleting[(ns, name)] in (uid, ""):
            return
        self._deleting[(ns, name)] = uid
        self._out.append(DeleteReservation(ns, name, uid))
        self.snapshot.remove_reservation((ns, name))


def _signature_of(pg: Resource) -> Signature:
    """What a PodGroup event must change for the scheduler to look at it again (only its
    metadata is read, so any object will do)."""
    meta = pg.metadata
    return (meta.generation, meta.uid, tuple(meta.labels.items()), tuple(meta.annotations.items()))
