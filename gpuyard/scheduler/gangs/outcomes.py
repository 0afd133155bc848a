"""What `place()` returns: a :class:`Placement` (every required pod has a node) or :class:`Unschedulable`;
and what quota admission answers when it refuses a job (:class:`Refusal`).

Plain data, so the loop can assume a placement (one Reservation per placed pod) and a test can
check it without an event loop. The cycle decides on the typed fields (`Unschedulable.reason`
and `.never`, `Refusal.code`), never on the text a person reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from gpuyard.scheduler.gangs.requests import GangRequest, PodShape, PodSlot

__all__ = ["FilterCount", "Placement", "PodPlacement", "Refusal", "Unschedulable"]


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """One pod's decision: node, GPU indices and ids (with the share of each), NICs, host ports."""

    pod: PodSlot
    node: str
    row: int
    gpus: tuple[int, ...]
    gpu_ids: tuple[str, ...]
    gpu_milli: int
    nics: tuple[str, ...]
    host_ports: tuple[int, ...]
    shape: PodShape
    requests: Mapping[str, Decimal]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


@dataclass(slots=True)
class Placement:
    """A gang's placement: the pods placed now and the optional pods left for later."""

    gang: GangRequest = field(repr=False)
    pods: list[PodPlacement] = field(default_factory=list)
    deferred: list[PodSlot] = field(default_factory=list)

    @property
    def nodes(self) -> list[str]:
        return sorted({p.node for p in self.pods})

    def local_peers(self) -> dict[str, list[str]]:
        """Pod name -> the other pods of the gang on the same node (placed now or before)."""
        by_node: dict[str, list[str]] = {}
        for name, node in self.gang.placed.items():
            by_node.setdefault(node, []).append(name)
        for p in self.pods:
            by_node.setdefault(p.node, []).append(p.pod.name)
        return {p.pod.name: sorted(n for n in by_node[p.node] if n != p.pod.name) for p in self.pods}

    def summary(self, held: Mapping[str, str] | None = None, new: int = 0) -> str:
        """ "placed 4 pods on 2 nodes": the pods placed now; or, with `held` (pod -> node: every pod
        of one job that holds a Reservation, the `new` ones placed now included), that whole job,
        saying how many are new when not all ("placed 4 pods on 2 nodes (1 just now)": a failover)."""
        nodes = self.nodes
        count = len(self.pods)
        if held:
            text = f"placed {_count(len(held), 'pod')} on {_count(len(set(held.values())), 'node')}"
            if new < len(held):
                text += f" ({new} just now)"
        else:
            text = f"placed {_count(count, 'pod')} on {_count(len(nodes), 'node')}"
        if self.deferred:
            text += (
                f"; {len(self.deferred)} optional pod{'s' if len(self.deferred) != 1 else ''} wait for room"
            )
        return text


@dataclass(frozen=True, slots=True)
class FilterCount:
    """How many nodes a filter was first to reject, and why in words."""

    name: str
    failed: int
    text: str


@dataclass(slots=True)
class Unschedulable:
    """Why a gang cannot be placed now; `message` is what a person reads on the PodGroup."""

    reason: str
    message: str
    never: bool = False
    """It can never be placed on this cluster as it is, whatever runs (no preemption or held room
    helps; it holds nothing and its demand does not count in its quota's request)."""
    role: str = ""
    needed: int = 0
    fits: int = 0
    most_on_one_node: int = 0
    filters: list[FilterCount] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def full_message(self) -> str:
        return " ".join([self.message, *self.notes]) if self.notes else self.message


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why quota admission refuses a waiting job now: `QuotaExceeded` (its elastic quota) or
    `ResourceQuotaExceeded` (a namespace ResourceQuota), and the message a person reads."""

    code: str
    message: str

    def __str__(self) -> str:
        return self.message
