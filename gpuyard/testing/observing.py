"""What a test reads back from a running harness cluster: where a job landed, and why it waits.

Pure functions of the store: :func:`placement_of` turns a job's Reservations (the scheduler's
ledger) into per-pod rows (node, GPU model, GPU indices, NICs) plus the `nvidia-smi topo -m`
link between the job's GPUs on each node (`gpuyard.devices.tiers.gpu_link` on the node's
NodeTopology); :func:`explanation_of` collects the PodGroup's status and the job's current
condition into one readable line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

from gpuyard.apis.core import Node
from gpuyard.apis.devicematching import LABEL_GPU_MODEL, LABEL_GPU_PRODUCT
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.jobkinds import TrainingJob, find_job
from gpuyard.apis.scheduling import PodGroup, Reservation
from gpuyard.devices.tiers import Link, LinkTier, gpu_link
from gpuyard.state.store import Store

__all__ = [
    "Explanation",
    "JobPlacement",
    "PodPlacement",
    "explanation_of",
    "job_key",
    "link_table",
    "phase_of",
    "placement_of",
]

JobRef = TrainingJob | str | tuple[str, str]


def job_key(job: JobRef) -> tuple[str, str]:
    """`(namespace, name)` of a job object, `"ns/name"`, `"name"` (namespace default) or a tuple."""
    if isinstance(job, TrainingJob):
        return job.metadata.namespace or "default", job.metadata.name
    if isinstance(job, tuple):
        return job
    ns, _, name = job.rpartition("/")
    return ns or "default", name


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """One pod of a placed job."""

    pod: str
    role: str
    index: int
    node: str
    gpu_model: str  # the node's model key (`v100`)
    gpu_product: str  # the node's product label (`Tesla-V100-SXM2-32GB`)
    gpus: tuple[int, ...]
    gpu_ids: tuple[str, ...]
    nics: tuple[str, ...]
    link: str  # the weakest link between this pod's GPUs (`NV1`, `SYS`, `X` for one GPU, `` for none)


@dataclass(slots=True)
class JobPlacement:
    """Where a job's pods are: one row per reserved pod, and per node the link between its GPUs."""

    namespace: str
    name: str
    pods: list[PodPlacement] = field(default_factory=list)
    links: dict[str, str] = field(default_factory=dict)  # node -> weakest link among the job's GPUs there
    matrices: dict[str, str] = field(default_factory=dict)  # node -> `topo -m` style table of those GPUs

    @property
    def nodes(self) -> list[str]:
        return sorted({p.node for p in self.pods})

    @property
    def gpus(self) -> int:
        return sum(len(p.gpus) for p in self.pods)

    def __bool__(self) -> bool:
        return bool(self.pods)

    def __str__(self) -> str:
        if not self.pods:
            return f"{self.namespace}/{self.name}: not placed"
        rows = [f"{self.namespace}/{self.name}: {len(self.pods)} pod(s) on {', '.join(self.nodes)}"]
        for p in self.pods:
            nics = f" nics={','.join(p.nics)}" if p.nics else ""
            rows.append(
                f"  {p.pod}: {p.node} {p.gpu_model or '-'} gpus={list(p.gpus)} link={p.link or '-'}{nics}"
            )
        return "\n".join(rows)


def link_table(topology: NodeTopology, gpus: list[int]) -> tuple[Link | None, str]:
    """The weakest link among `gpus` and a small `nvidia-smi topo -m` style matrix of them."""
    if not gpus:
        return None, ""
    worst = Link(LinkTier.X)
    for a, b in combinations(gpus, 2):
        link = gpu_link(topology, a, b)
        if link.rank > worst.rank:
            worst = link
    header = "      " + " ".join(f"GPU{g:<3}" for g in gpus)
    lines = [header]
    for a in gpus:
        cells = " ".join(f"{gpu_link(topology, a, b).label:<6}" for b in gpus)
        lines.append(f"GPU{a:<3}" + cells)
    return worst, "\n".join(lines)


def _reservations(store: Store, namespace: str, name: str) -> list[Reservation]:
    found = [r for r in store.list_of(Reservation, namespace=namespace) if r.spec.pod_group == name]
    return sorted(found, key=lambda r: (r.spec.role, r.spec.index))


def phase_of(store: Store, job: JobRef) -> str:
    """The job's phase (`Created`, `Queuing`, `Running`, ...), or "" if it does not exist."""
    ns, name = job_key(job)
    found = find_job(store, ns, name)
    return (found.status.phase or "Created") if found is not None else ""


def placement_of(store: Store, job: JobRef) -> JobPlacement:
    """The job's current placement (empty when it holds no reservation)."""
    ns, name = job_key(job)
    out = JobPlacement(namespace=ns, name=name)
    by_node: dict[str, list[int]] = {}
    topologies: dict[str, NodeTopology | None] = {}
    for r in _reservations(store, ns, name):
        node = store.get_of(Node, "", r.spec.node)
        labels = node.metadata.labels if node is not None else {}
        topo = topologies.get(r.spec.node)
        if r.spec.node not in topologies:
            topo = topologies[r.spec.node] = store.get_of(NodeTopology, "", r.spec.node)
        link = ""
        model, product = labels.get(LABEL_GPU_MODEL, ""), labels.get(LABEL_GPU_PRODUCT, "")
        if r.spec.gpus and topo is not None:
            worst, _ = link_table(topo, list(r.spec.gpus))
            link = worst.label if worst is not None else ""
            held = [g for g in topo.spec.gpus if g.index in r.spec.gpus]
            if held:  # the GPUs' own model: a node may hold several models
                model = "/".join(sorted({g.model_key for g in held if g.model_key})) or model
                product = "/".join(sorted({g.model for g in held if g.model})) or product
        out.pods.append(
            PodPlacement(
                pod=r.metadata.name,
                role=r.spec.role,
                index=r.spec.index,
                node=r.spec.node,
                gpu_model=model,
                gpu_product=product,
                gpus=tuple(r.spec.gpus),
                gpu_ids=tuple(r.spec.gpu_ids),
                nics=tuple(r.spec.nics),
                link=link,
            )
        )
        by_node.setdefault(r.spec.node, []).extend(r.spec.gpus)
    for node_name, gpus in by_node.items():
        topo = topologies.get(node_name)
        if topo is None or not gpus:
            continue
        worst, table = link_table(topo, sorted(set(gpus)))
        out.links[node_name] = worst.label if worst is not None else ""
        out.matrices[node_name] = table
    return out


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a job is (not) placed: its PodGroup status and the job's current condition."""

    job_phase: str
    phase: str  # the PodGroup's: Pending | Placed | Suspended, or "" before the operator made one
    reason: str
    message: str
    condition: str  # the job's latest condition: "Queuing: reason: message"

    @property
    def text(self) -> str:
        """Everything above in one line (what `assert_pending_because` searches)."""
        parts = [p for p in (self.reason, self.message, self.condition) if p]
        return "; ".join(parts)

    def __str__(self) -> str:
        if not self.phase:
            return f"job is {self.job_phase or 'not found'}; no PodGroup yet"
        return (
            f"job is {self.job_phase or 'Created'}; PodGroup {self.phase}: {self.text or 'no reason given'}"
        )


def explanation_of(store: Store, job: JobRef) -> Explanation:
    ns, name = job_key(job)
    found = find_job(store, ns, name)
    job_phase = (found.status.phase or "Created") if found is not None else ""
    condition = ""
    if found is not None and found.status.conditions:
        last = found.status.conditions[-1]
        condition = ": ".join(x for x in (last.type, last.reason or "", last.message or "") if x)
    pg = store.get_of(PodGroup, ns, name)
    if pg is None:
        return Explanation(job_phase, "", "", "", condition)
    return Explanation(job_phase, pg.status.phase, pg.status.reason, pg.status.message, condition)
