"""The platform's invariants, checked from the store alone: what must hold whatever happened.

A pure reader of the object store (no writes, no clock, no event loop), used by `gpuyard check`
(through `GET /api/v1/check`), by the test harness after every scheduling cycle, by the fault
suite and by the chaos soak. :func:`check_store` returns a list of :class:`Violation` (plain
data: which invariant, a message naming the objects); an empty list means all hold.

Two families:

* **safety** invariants hold at every instant, between any two writes:
  - no node is over-allocated: per node, the Reservations that hold room (those the operator
    released through `spec.release`, or of a PodGroup that is gone, wait only for the
    scheduler's delete: their pods have stopped) plus the active pods that hold no such
    Reservation fit its allocatable CPU, memory, pods and extended resources; each GPU is held
    whole by one pod or shared within 1000 milli (and within its memory for shares); each NIC
    and host port by one pod; GPU indices exist on the node;
  - every Reservation names an existing node, and the pod made from it runs on that node;
  - resourceVersions: every object's version is at most the store's, no two objects share
    one, and (across calls of one :class:`InvariantChecker`) neither the store's version nor
    an object's version ever goes back;
  - a quota's use is within its `max`.
* **settled** invariants hold once the components have caught up with a change (the operator
  collected a deleted job's pods, the scheduler wrote its statuses); a change in flight may
  break them for a moment, so the harness checks them when the virtual clock has run
  everything due, and `gpuyard check` reports only those still broken after a grace period:
  - every pod and PodGroup is owned by a live job, every Reservation by a live PodGroup;
  - every placed gang of a Running job holds at least its minimum per role (and job-wide);
  - a quota's use is within its runtime, unless a reclaim is under way (a PodGroup's
    `status.evictions` says "reclaimed by quota") or a job waits (the reclaim grace period,
    `scheduler.reclaim_delay`, may be running for it).
* the **liveness** invariant holds over time, so it needs a checker that remembers
  (:meth:`InvariantChecker.check_liveness`, called by the test harness and the soak): no job
  stays unplaced for more than 3 scheduling cycles and 5 s while it fits now — a fresh scheduler
  built from the store's objects would place it (`gpuyard.scheduler.liveness`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Literal

from gpuyard.apis.core import GPU_RESOURCE, Node, Pod
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.jobkinds import KIND_INFO
from gpuyard.apis.meta import Resource
from gpuyard.apis.quantity import format_quantity, to_milli
from gpuyard.apis.quotakinds import ElasticQuota
from gpuyard.apis.scheduling import PodGroup, Reservation, pod_devices, pod_gpus
from gpuyard.scheduler.cache.holds import Hold
from gpuyard.scheduler.core import WATCHED
from gpuyard.scheduler.liveness import LivenessTracker, fitting_now
from gpuyard.scheduler.placement.framework import Profile
from gpuyard.state.store import Store

__all__ = [
    "INVARIANTS",
    "InvariantChecker",
    "Violation",
    "check_store",
]

Family = Literal["safety", "settled", "liveness"]

INVARIANTS: dict[str, Family] = {
    "capacity": "safety",
    "gpu": "safety",
    "nic": "safety",
    "host-port": "safety",
    "placement": "safety",
    "resource-version": "safety",
    "quota-max": "safety",
    "owner": "settled",
    "gang-minimum": "settled",
    "quota-runtime": "settled",
    "liveness": "liveness",
}
"""Every invariant's name and its family (see the module docstring)."""

ACTIVE_POD_PHASES = ("Pending", "Running")
GPU_MILLI = 1000
RECLAIM_MARK = "reclaimed by quota"
_SKIP_CAPACITY = frozenset({GPU_RESOURCE, "ephemeral-storage", "storage"})


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant: its name, family and a message naming the objects."""

    invariant: str
    message: str
    objects: tuple[str, ...] = ()

    @property
    def family(self) -> Family:
        return INVARIANTS[self.invariant]

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["objects"] = list(self.objects)
        out["family"] = self.family
        return out

    def __str__(self) -> str:
        return f"{self.invariant}: {self.message}"


@dataclass(slots=True)
class _Use:
    """What one holder (a Reservation, or an active pod without one) takes on its node."""

    holder: str
    requests: Mapping[str, Decimal]
    gpus: tuple[int, ...] = ()
    gpu_milli: int = GPU_MILLI
    gpu_memory_mib: int = 0
    nics: tuple[str, ...] = ()
    host_ports: tuple[int, ...] = ()


@dataclass(slots=True)
class InvariantChecker:
    """:func:`check_store` plus the version checks across calls (store and objects never go back)."""

    last_store_rv: int = 0
    last_object_rv: dict[str, int] = field(default_factory=dict)
    liveness: LivenessTracker = field(default_factory=LivenessTracker)

    def check_liveness(
        self,
        store: Store,
        *,
        profile: Profile,
        port_range: tuple[int, int],
        cycle: int,
        now: float,
        utcnow: datetime,
        claims: Iterable[Hold] = (),
    ) -> list[Violation]:
        """The jobs that have fitted now (a fresh scheduler over the store's objects places them,
        with the scheduler's `profile` and `port_range`) for more than 3 cycles and 5 s, as of
        scheduling cycle `cycle` at `now` seconds; each call extends what this checker saw."""
        known = set(store.kinds())
        objects = {kind: store.list(kind) for kind in WATCHED if kind in known}
        fitting = fitting_now(
            objects, profile=profile, port_range=port_range, now=now, utcnow=utcnow, claims=claims
        )
        return [
            Violation("liveness", str(stuck), (f"PodGroup/{stuck.key[0]}/{stuck.key[1]}",))
            for stuck in self.liveness.observe(fitting, cycle=cycle, now=now)
        ]

    def check(self, store: Store, *, settled: bool = True, versions: bool = True) -> list[Violation]:
        found = check_store(store, settled=settled, versions=versions)
        if versions:
            found += self._versions(store)
        return found

    def _versions(self, store: Store) -> list[Violation]:
        out: list[Violation] = []
        now = store.resource_version
        if now < self.last_store_rv:
            out.append(
                Violation(
                    "resource-version",
                    f"the store's resourceVersion went back from {self.last_store_rv} to {now}",
                )
            )
        self.last_store_rv = max(now, self.last_store_rv)
        seen: dict[str, int] = {}
        for kind in store.kinds():
            for obj in store.list(kind):
                uid = obj.metadata.uid
                if not uid:
                    continue
                rv = obj.resource_version
                before = self.last_object_rv.get(uid)
                if before is not None and rv < before:
                    name = _name(obj)
                    out.append(
                        Violation(
                            "resource-version",
                            f"{name}'s resourceVersion went back from {before} to {rv}",
                            (name,),
                        )
                    )
                seen[uid] = max(rv, before or 0)
        self.last_object_rv = seen
        return out


def check_store(
    store: Store, *, settled: bool = True, versions: bool = True, delegated_to: str | None = None
) -> list[Violation]:
    """Every broken invariant in the store now; `settled=False`: the safety ones only;
    `versions=False`: not the version scan (it reads every object of every kind). `delegated_to`
    (delegate mode: the gang scheduler's schedulerName): a pod of that scheduler that has a
    Reservation is counted through it wherever the gang scheduler bound it."""
    known = set(store.kinds())
    nodes = {n.metadata.name: n for n in store.list_of(Node)}
    reservations = store.list_of(Reservation) if "Reservation" in known else []
    pods = store.list_of(Pod) if "Pod" in known else []
    groups = store.list_of(PodGroup) if "PodGroup" in known else []
    quotas = store.list_of(ElasticQuota) if "ElasticQuota" in known else []
    topologies = {t.metadata.name: t for t in store.list_of(NodeTopology)} if "NodeTopology" in known else {}
    out = _versions(store) if versions else []
    out += _allocation(nodes, topologies, _holding(reservations, groups), pods, delegated_to=delegated_to)
    out += _quota_max(quotas)
    if settled:
        jobs = _jobs(store, known)
        out += _owners(jobs, pods, groups, reservations)
        out += _gangs(groups, reservations, running=_running_jobs(store, known))
        out += _quota_runtime(quotas, groups)
    return out


# --- versions -------------------------------------------------------------------------------------


def _versions(store: Store) -> list[Violation]:
    top = store.resource_version
    holders: dict[int, list[str]] = defaultdict(list)
    out: list[Violation] = []
    for kind in store.kinds():
        for obj in store.list(kind):
            rv = obj.resource_version
            holders[rv].append(_name(obj))
            if rv > top:
                out.append(
                    Violation(
                        "resource-version",
                        f"{_name(obj)} has resourceVersion {rv}, above the store's {top}",
                        (_name(obj),),
                    )
                )
    for rv, names in sorted(holders.items()):
        if len(names) > 1:
            out.append(
                Violation(
                    "resource-version",
                    f"resourceVersion {rv} is held by {len(names)} objects: {', '.join(sorted(names))}",
                    tuple(sorted(names)),
                )
            )
    return out


# --- allocation -----------------------------------------------------------------------------------


def _holding(reservations: list[Reservation], groups: list[PodGroup]) -> list[Reservation]:
    """The Reservations that still hold their room: not released by the operator (`spec.release`
    names the uid: the pod has stopped) and of a PodGroup that exists. A released one is only
    waiting for the scheduler's delete; should its pod still be active, the pod is counted."""
    released: dict[tuple[str, str], set[str]] = {
        (g.metadata.namespace, g.metadata.name): set(g.spec.release.values()) for g in groups
    }
    out = []
    for res in reservations:
        gone = released.get((res.metadata.namespace, res.spec.pod_group))
        if gone is not None and res.metadata.uid not in gone:
            out.append(res)
    return out


def _allocation(
    nodes: Mapping[str, Node],
    topologies: Mapping[str, NodeTopology],
    reservations: list[Reservation],
    pods: list[Pod],
    *,
    delegated_to: str | None = None,
) -> list[Violation]:
    out: list[Violation] = []
    uses: dict[str, list[_Use]] = defaultdict(list)
    reserved: dict[tuple[str, str], Reservation] = {}
    for res in reservations:
        reserved[(res.metadata.namespace, res.metadata.name)] = res
        spec = res.spec
        if spec.node not in nodes:
            out.append(
                Violation(
                    "placement",
                    f"{_name(res)} holds room on node {spec.node!r}, which does not exist",
                    (_name(res),),
                )
            )
            continue
        uses[spec.node].append(
            _Use(
                holder=_name(res),
                requests=spec.requests,
                gpus=tuple(spec.gpus),
                gpu_milli=(spec.gpu_milli or GPU_MILLI) if spec.gpus else 0,
                gpu_memory_mib=spec.gpu_memory_mib,
                nics=tuple(spec.nics),
                host_ports=tuple(spec.host_ports),
            )
        )
    for pod in pods:
        node = pod.spec.node_name
        if not node or pod.status.phase not in ACTIVE_POD_PHASES:
            continue
        held = reserved.get((pod.metadata.namespace, pod.metadata.name))
        if held is not None:
            if held.spec.node != node and not (delegated_to and pod.spec.scheduler_name == delegated_to):
                out.append(
                    Violation(
                        "placement",
                        f"{_name(pod)} runs on node {node} but its Reservation holds node {held.spec.node}",
                        (_name(pod), _name(held)),
                    )
                )
            else:
                continue  # counted through its Reservation
        if node not in nodes:
            continue  # a pod of a node that is gone: the backend fails it
        uses[node].append(_pod_use(pod))
    for name, node_uses in sorted(uses.items()):
        topology = topologies.get(name)
        out += _node_allocation(nodes[name], topology, node_uses)
    return out


def _pod_use(pod: Pod) -> _Use:
    gpus: tuple[int, ...] = ()
    nics: tuple[str, ...] = ()
    milli = GPU_MILLI
    devices = pod_devices(pod)
    gpus = tuple(pod_gpus(pod))
    nics = tuple(str(n) for n in devices.get("nics", []))
    if isinstance(devices.get("gpuMilli"), int):
        milli = int(devices["gpuMilli"]) or GPU_MILLI
    ports = tuple(
        p.host_port
        for c in pod.spec.containers
        for p in c.ports
        if p.host_port is not None and p.host_port > 0
    )
    return _Use(
        holder=_name(pod),
        requests=pod.spec.requests(),
        gpus=gpus,
        gpu_milli=milli if gpus else 0,
        nics=nics,
        host_ports=ports,
    )


def _node_allocation(node: Node, topology: NodeTopology | None, uses: list[_Use]) -> list[Violation]:
    name = node.metadata.name
    alloc = node.status.allocatable
    out: list[Violation] = []
    totals: dict[str, Decimal] = defaultdict(Decimal)
    for use in uses:
        for resource, amount in use.requests.items():
            totals[resource] += amount
    holders = sorted(u.holder for u in uses)
    for resource, total in sorted(totals.items()):
        if resource in _SKIP_CAPACITY or ("/" in resource and resource not in alloc):
            continue  # GPUs are checked per device; a class request is counted through its GPUs
        limit = alloc.get(resource)
        if limit is None:
            if total > 0 and resource in ("cpu", "memory"):
                limit = Decimal(0)
            else:
                continue
        if to_milli(total) > to_milli(limit):
            out.append(
                Violation(
                    "capacity",
                    f"node {name}: {resource} {format_quantity(total)} requested by {len(uses)} pods, "
                    f"allocatable {format_quantity(limit)}",
                    (f"Node/{name}", *holders),
                )
            )
    pods_limit = alloc.get("pods")
    if pods_limit is not None and len(uses) > int(pods_limit):
        out.append(
            Violation(
                "capacity",
                f"node {name}: {len(uses)} pods, allocatable pods {int(pods_limit)}",
                (f"Node/{name}", *holders),
            )
        )
    out += _devices(name, alloc, topology, uses)
    return out


def _devices(
    name: str, alloc: Mapping[str, Decimal], topology: NodeTopology | None, uses: list[_Use]
) -> list[Violation]:
    out: list[Violation] = []
    count = int(alloc.get(GPU_RESOURCE, Decimal(0)))
    if topology is not None:
        count = max(count, topology.gpu_count)
    memory = {g.index: g.memory_mib for g in topology.spec.gpus} if topology is not None else {}
    milli: dict[int, int] = Counter()
    share_mem: dict[int, int] = Counter()
    by_gpu: dict[int, list[str]] = defaultdict(list)
    for use in uses:
        for gpu in use.gpus:
            if not 0 <= gpu < count:
                out.append(
                    Violation(
                        "gpu",
                        f"node {name}: {use.holder} holds GPU {gpu}, the node has GPUs 0..{count - 1}",
                        (f"Node/{name}", use.holder),
                    )
                )
                continue
            milli[gpu] += use.gpu_milli
            if use.gpu_milli < GPU_MILLI:
                share_mem[gpu] += use.gpu_memory_mib
            by_gpu[gpu].append(use.holder)
    for gpu, total in sorted(milli.items()):
        if total > GPU_MILLI:
            out.append(
                Violation(
                    "gpu",
                    f"node {name}: GPU {gpu} is allocated {total}/1000 to {', '.join(sorted(by_gpu[gpu]))}",
                    (f"Node/{name}", *sorted(by_gpu[gpu])),
                )
            )
        cap = memory.get(gpu, 0)
        if cap and share_mem[gpu] > cap:
            out.append(
                Violation(
                    "gpu",
                    f"node {name}: GPU {gpu}'s shares hold {share_mem[gpu]} MiB of its {cap} MiB "
                    f"({', '.join(sorted(by_gpu[gpu]))})",
                    (f"Node/{name}", *sorted(by_gpu[gpu])),
                )
            )
    out += _exclusive(name, "nic", "NIC", ((u.holder, u.nics) for u in uses))
    out += _exclusive(name, "host-port", "host port", ((u.holder, u.host_ports) for u in uses))
    return out


def _exclusive(
    node: str, invariant: str, what: str, held: Iterable[tuple[str, Iterable[object]]]
) -> list[Violation]:
    owners: dict[object, list[str]] = defaultdict(list)
    for holder, items in held:
        for item in items:
            owners[item].append(holder)
    return [
        Violation(
            invariant,
            f"node {node}: {what} {item} is held by {len(names)} pods: {', '.join(sorted(names))}",
            (f"Node/{node}", *sorted(names)),
        )
        for item, names in sorted(owners.items(), key=lambda kv: str(kv[0]))
        if len(names) > 1
    ]


# --- quotas ---------------------------------------------------------------------------------------


def _over(quota: ElasticQuota, bound: Mapping[str, Decimal]) -> list[tuple[str, str, str]]:
    """(resource, used, bound) of each resource the quota uses beyond `bound`, formatted."""
    return [
        (resource, format_quantity(amount), format_quantity(bound[resource]))
        for resource, amount in sorted(quota.status.used.items())
        if resource in bound and amount > bound[resource]
    ]


def _quota_max(quotas: list[ElasticQuota]) -> list[Violation]:
    return [
        Violation(
            "quota-max",
            f"quota {quota.metadata.name} uses {used} {resource}, max {top}",
            (_name(quota),),
        )
        for quota in quotas
        for resource, used, top in _over(quota, quota.spec.max)
    ]


def _quota_runtime(quotas: list[ElasticQuota], groups: list[PodGroup]) -> list[Violation]:
    reclaiming = any(RECLAIM_MARK in why for g in groups for why in g.status.evictions.values())
    waiting = any(g.status.phase == "Pending" and not g.spec.suspend for g in groups)
    if reclaiming or waiting:
        return []  # a reclaim is under way, or may be once its grace period ends
    return [
        Violation(
            "quota-runtime",
            f"quota {quota.metadata.name} uses {used} {resource}, runtime {top}, and no reclaim is under way",
            (_name(quota),),
        )
        for quota in quotas
        for resource, used, top in _over(quota, quota.status.runtime)
    ]


# --- owners and gangs -----------------------------------------------------------------------------


def _jobs(store: Store, known: set[str]) -> dict[tuple[str, str], set[str]]:
    """(namespace, name) -> the uids of the jobs of that name (one per kind at most)."""
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    for kind in KIND_INFO:
        if kind in known:
            for job in store.list(kind):
                out[(job.metadata.namespace, job.metadata.name)].add(job.metadata.uid)
    return out


def _owners(
    jobs: Mapping[tuple[str, str], set[str]],
    pods: list[Pod],
    groups: list[PodGroup],
    reservations: list[Reservation],
) -> list[Violation]:
    out: list[Violation] = []
    for obj in (*pods, *groups):
        refs = [r for r in obj.metadata.owner_references if r.kind in KIND_INFO]
        if not refs:
            continue  # not made by the operator (a user's bare pod)
        ns = obj.metadata.namespace
        if not any(r.uid in jobs.get((ns, r.name), ()) for r in refs):
            owner = refs[0]
            out.append(
                Violation(
                    "owner",
                    f"{_name(obj)} belongs to {owner.kind} {ns}/{owner.name} (uid {owner.uid}), which is gone",
                    (_name(obj),),
                )
            )
    live_groups = {(g.metadata.namespace, g.metadata.name): g.metadata.uid for g in groups}
    for res in reservations:
        ns = res.metadata.namespace
        uid = live_groups.get((ns, res.spec.pod_group))
        group_uids = [r.uid for r in res.metadata.owner_references if r.kind == "PodGroup"]
        if uid is None or (group_uids and uid not in group_uids):
            out.append(
                Violation(
                    "owner",
                    f"{_name(res)} belongs to PodGroup {ns}/{res.spec.pod_group}, which is gone",
                    (_name(res),),
                )
            )
    return out


def _running_jobs(store: Store, known: set[str]) -> set[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for kind in KIND_INFO:
        if kind in known:
            for job in store.list(kind):
                if getattr(getattr(job, "status", None), "phase", None) == "Running":
                    out.add((job.metadata.namespace, job.metadata.name))
    return out


def _gangs(
    groups: list[PodGroup], reservations: list[Reservation], *, running: set[tuple[str, str]]
) -> list[Violation]:
    """A running job's placed gang holds at least its minimum (a job restarting after a lost
    node or a failed GPU may wait, below it, for room to place the lost pods again)."""
    held: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for res in reservations:
        held[(res.metadata.namespace, res.spec.pod_group)][res.spec.role.lower()] += 1
    out: list[Violation] = []
    for group in groups:
        key = (group.metadata.namespace, group.metadata.name)
        if group.status.phase != "Placed" or group.spec.suspend or key not in running:
            continue
        roles = held.get(key, Counter())
        leaving = len(group.spec.release) + len(group.status.evictions)
        short = [
            f"{role.name} {roles[role.name.lower()]}/{role.minimum}"
            for role in group.spec.roles
            if roles[role.name.lower()] < role.minimum
        ]
        total = sum(roles.values())
        if leaving:
            continue  # pods on their way out (failover, eviction): the scheduler places them again
        if short or total < group.spec.minimum():
            detail = ", ".join(short) or f"{total}/{group.spec.minimum()} pods"
            out.append(
                Violation(
                    "gang-minimum",
                    f"PodGroup {key[0]}/{key[1]} is Placed but holds fewer than its minimum: {detail}",
                    (_name(group),),
                )
            )
    return out


def _name(obj: Resource) -> str:
    ns = obj.metadata.namespace
    return f"{obj.kind}/{ns}/{obj.metadata.name}" if ns else f"{obj.kind}/{obj.metadata.name}"
