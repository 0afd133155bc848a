"""Can this gang ever fit on this cluster, were it empty? And if not, why (as data).

The one answer to "can never fit", used by `place()` (its message then starts "can never fit:
asks 32 nvidia.a100, the cluster has 8"), by the cycle's backfill (`cycle.backfilling.never_fits`:
such a gang holds nothing and its demand leaves its quota) and by the HTTP API at submit (a
`Warning` header: the job is accepted, as the cluster may grow). Pure: a snapshot, a gang and a
profile in, a :class:`Verdict` out; whatever the snapshot's reservations, the nodes count as
empty.

The checks are necessary conditions only, so "never" is never said of a gang that could fit:

* :class:`PartShort` — a required part (one role's pods of one shape) needs more pods than the
  nodes that may run it (the profile's static filters: node state, selectors, affinity, taints,
  GPU class) could hold even empty: their healthy GPUs of the class, allocatable CPU and memory.
  This is also what a pod larger than every node gets ("could hold 0");
* :class:`GPUTotalShort` — the gang's required whole GPUs of a class exceed every GPU of that
  class on the cluster's nodes (a class no node has is a `PartShort`: no node may run it);
* :class:`DomainShort` — the gang requires one network domain (`gpuyard.io/topology-required:
  block|spine`) and no single domain could hold every required part, even empty.

Vectorised over the nodes: the static masks come from the profile's cache, the rest is a few
array operations per part.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.gangs.requests import GangRequest, PodShape, RolePart
from gpuyard.scheduler.placement.choosing import LowestIndexChooser
from gpuyard.scheduler.placement.filtering import static_mask
from gpuyard.scheduler.placement.filters import DEFAULT_FILTERS
from gpuyard.scheduler.placement.framework import CycleState, Profile
from gpuyard.scheduler.placement.profiles import builtin_registry

__all__ = [
    "NEVER",
    "DomainShort",
    "GPUTotalShort",
    "NeverFit",
    "PartShort",
    "Verdict",
    "ever_fits",
    "gpu_totals_short",
    "static_profile",
]

NEVER = "can never fit on this cluster"
"""How a person is told (the cycle's and the API's messages start with it)."""

_BIG = np.iinfo(np.int64).max // 4


def _pods(n: int) -> str:
    return f"{n} pod{'s' if n != 1 else ''}"


@dataclass(frozen=True, slots=True)
class PartShort:
    """A required part the nodes that may run it could not hold, even empty.

    `nodes`: how many nodes may run it (static filters); `could_hold`: how many of its pods
    those nodes could hold empty; `largest`: per limiting resource, the most one of those nodes
    has (`("GPUs of class nvidia.a100", 8)`, `("CPU", 64000)` milli-CPU, `("memory", 524288)`
    MiB), in the order GPUs, CPU, memory.
    """

    role: str
    required: int
    shape: PodShape
    nodes: int
    could_hold: int
    largest: tuple[tuple[str, int], ...] = ()

    def describe(self) -> str:
        """`Worker needs 1 pod of 9 GPUs, 1 CPU; the 2 nodes that may run it could hold 0 even
        empty (the largest: 8 GPUs, 64 CPU, 524288Mi memory)`."""
        if self.nodes == 0:
            why = "no node may run it (node selector, affinity, taints, GPU class or node state)"
        else:
            most = []
            for what, top in self.largest:
                if what == "CPU":
                    most.append(f"{top / 1000:g} CPU")
                elif what == "memory":
                    most.append(f"{top}Mi memory")
                else:
                    most.append(f"{top} {what}")
            why = (
                f"the {self.nodes} node{'s' if self.nodes != 1 else ''} that may run it could hold "
                f"{self.could_hold} even empty" + (f" (the largest: {', '.join(most)})" if most else "")
            )
        together = " placed together" if self.required > 1 else ""
        return f"{self.role} needs {_pods(self.required)} of {self.shape.describe()}{together}; {why}"


@dataclass(frozen=True, slots=True)
class GPUTotalShort:
    """The gang's required whole GPUs of `gpu_class` (None: any GPU) exceed the cluster's `have`."""

    gpu_class: str | None
    asked: int
    have: int

    def describe(self) -> str:
        """`asks 32 nvidia.a100, the cluster has 8`."""
        return f"asks {self.asked} {self.gpu_class or 'GPUs'}, the cluster has {self.have}"


@dataclass(frozen=True, slots=True)
class DomainShort:
    """The gang must stay inside one `level` domain and none could hold it, even empty.

    `domains`: how many domains of the level the nodes name; `most`: per required part, (role,
    pods required, the most pods of it one domain could hold).
    """

    level: str
    domains: int
    most: tuple[tuple[str, int, int], ...] = ()

    def describe(self) -> str:
        """`topology-required block: none of the 2 blocks could hold the gang even empty (the
        most one block could hold: Worker 2 of 3 pods)`."""
        head = f"topology-required {self.level}"
        if self.domains == 0:
            return f"{head}: no node is in a {self.level} (label topology.gpuyard.io/{self.level})"
        most = ", ".join(f"{role} {got} of {_pods(need)}" for role, need, got in self.most)
        return (
            f"{head}: none of the {self.domains} {self.level}{'s' if self.domains != 1 else ''} "
            f"could hold the gang even empty (the most one {self.level} could hold: {most})"
        )


NeverFit = PartShort | GPUTotalShort | DomainShort
"""One reason a gang can never fit."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a gang can ever fit on the cluster; `reasons` say why not (empty: it may fit)."""

    reasons: tuple[NeverFit, ...] = ()

    @property
    def never(self) -> bool:
        return bool(self.reasons)

    def describe(self) -> str:
        """The reasons, `; `-joined ("" when it may fit)."""
        return "; ".join(r.describe() for r in self.reasons)


# --- the checks ----------------------------------------------------------------------------------


def gpu_totals_short(snapshot: Snapshot, gang: GangRequest) -> list[GPUTotalShort]:
    """The GPU classes whose every GPU on the cluster's nodes, free or not, is fewer than the
    gang's required whole GPUs of the class (by class name; a class no node has is not listed)."""
    asked: dict[str | None, int] = {}
    for part in gang.parts:
        shape = part.shape
        if part.required and shape.gpus and not shape.shared:
            asked[shape.gpu_class] = asked.get(shape.gpu_class, 0) + part.required * shape.gpus
    out = []
    for gpu_class, n in sorted(asked.items(), key=lambda kv: kv[0] or ""):
        if gpu_class is None:
            have = int(snapshot.gpu_count[snapshot.alive].sum())
        else:
            cm = snapshot.class_mask(gpu_class)
            have = int(cm.count[snapshot.alive].sum()) if cm is not None else 0
        if 0 < have < n:  # none at all: the part's check says "no node may run it"
            out.append(GPUTotalShort(gpu_class, n, have))
    return out


def _empty_capacity(
    cycle: CycleState, part: RolePart
) -> tuple[np.ndarray, np.ndarray, list[tuple[str, np.ndarray]]]:
    """int64[N]: pods of the part's shape each node could hold empty (0 where a static filter
    refuses it); the mask of nodes that may run it; the per-node limits that were applied."""
    snap = cycle.snapshot
    shape = part.shape
    # the nodes that may run it whatever their GPU count (the GPU-class filter also asks for
    # the count, which is what is measured here)
    mask = static_mask(cycle, replace(shape, gpus=1) if shape.gpus and not shape.shared else shape)
    cap = np.where(mask, _BIG, 0).astype(np.int64)
    limits: list[tuple[str, np.ndarray]] = []
    if shape.gpus and not shape.shared:
        if shape.gpu_class is None:
            have = snap.gpu_healthy_count.astype(np.int64)
        else:
            cm = snap.class_mask(shape.gpu_class)
            have = cm.count.astype(np.int64) if cm is not None else np.zeros(snap.n, np.int64)
        limits.append(("GPUs" if shape.gpu_class is None else f"GPUs of class {shape.gpu_class}", have))
        np.minimum(cap, have // shape.gpus, out=cap)
    if shape.cpu_milli:
        limits.append(("CPU", snap.cpu_alloc.astype(np.int64)))
        np.minimum(cap, snap.cpu_alloc // shape.cpu_milli, out=cap)
    if shape.mem_mib:
        limits.append(("memory", snap.mem_alloc.astype(np.int64)))
        np.minimum(cap, snap.mem_alloc // shape.mem_mib, out=cap)
    return cap, mask, limits


def _domain_short(
    snapshot: Snapshot, level: str, parts: list[tuple[RolePart, np.ndarray]]
) -> DomainShort | None:
    """None when some `level` domain could hold every required part, even empty."""
    if level == "node":  # every node is its own domain
        domains = np.arange(len(snapshot.block))
    else:
        domains = snapshot.spine if level == "spine" else snapshot.block
    labelled = domains >= 0
    present = np.unique(domains[labelled])
    if not len(present):
        return DomainShort(level, 0)
    ok = np.ones(int(present.max()) + 1, dtype=bool)
    most = []
    for part, cap in parts:
        sums = np.bincount(
            domains[labelled], weights=np.minimum(cap[labelled], part.required), minlength=len(ok)
        )
        ok &= sums >= part.required
        most.append((part.role, part.required, int(sums.max(initial=0))))
    if ok[present].any():
        return None
    return DomainShort(level, len(present), tuple(most))


def ever_fits(snapshot: Snapshot, gang: GangRequest, profile: Profile | None = None) -> Verdict:
    """Could `gang` fit on the snapshot's nodes were they empty? `profile` gives the static
    filters (default: the built-in ones, :func:`static_profile`). The reasons it could not come
    in the order: each short part (in role order), the short GPU classes, the required domain."""
    cycle = CycleState(snapshot, gang, profile if profile is not None else static_profile())
    reasons: list[NeverFit] = []
    caps: list[tuple[RolePart, np.ndarray]] = []
    for part in gang.parts:
        if not part.required:
            continue
        cap, mask, limits = _empty_capacity(cycle, part)
        caps.append((part, cap))
        total = int(np.minimum(cap, part.required).sum())
        if total >= part.required:
            continue
        nodes = int(mask.sum())
        largest = tuple((what, int(arr[mask].max())) for what, arr in limits) if nodes else ()
        reasons.append(PartShort(part.role, part.required, part.shape, nodes, total, largest))
    reasons.extend(gpu_totals_short(snapshot, gang))
    if gang.topology_required is not None and caps:
        short = _domain_short(snapshot, gang.topology_required, caps)
        if short is not None:
            reasons.append(short)
    return Verdict(tuple(reasons))


_STATIC: list[Profile] = []


def static_profile() -> Profile:
    """A profile of the built-in filters only (all a capacity check reads: the static ones),
    made once; for callers without a scheduler profile at hand (the HTTP API)."""
    if not _STATIC:
        factories = builtin_registry().filters
        _STATIC.append(
            Profile(
                name="capacity",
                filters=[factories[name]({}) for name in DEFAULT_FILTERS],
                scores=[],
                chooser=LowestIndexChooser(),
            )
        )
    return _STATIC[0]
