"""Gang requests as plain data: what `place()` is asked to place, built once from PodGroups.

The operator writes a PodGroup per job (pydantic, at the edge); the scheduler turns one PodGroup,
or the several PodGroups of a gang group, into a :class:`GangRequest`: per role the pods that
still lack a Reservation (:class:`PodSlot`), how many of them are *required* (the gang minimum
less what is already placed) and one :class:`PodShape` they all share. `place()` and every
plugin work on these frozen, hashable values only, so identical pods are placed as a group and
per-shape results can be cached.

Minimum rules: every replica, unless the role's `minAvailable` or the job's `minAvailable` says
less. With a job-wide minimum, roles without their own minimum contribute pods in role order
(the operator lists roles in start order: Master/PS before Worker) until the minimum is reached.
Pods above the minimum are *optional*: placed when they fit, otherwise left for a later cycle.

Also here: testing a :class:`Constraints` against one node (`selector_ok`, `affinity_ok`,
`taints_ok`), with Kubernetes' semantics — node-selector terms ORed, requirements of a term ANDed,
an empty term matches nothing; `NotIn`/`DoesNotExist` match a node without the label; `Gt`/`Lt`
compare the label as an integer; `matchFields` knows `metadata.name`; a NoSchedule/NoExecute
taint must be tolerated. The snapshot runs them once per node for each *distinct* constraint set
and caches the mask, so they are never on the per-pod path.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import ROUND_CEILING, Decimal
from typing import Any

from gpuyard.apis.core import NodeSelectorRequirement, NodeSelectorTerm, PodSpec
from gpuyard.apis.podplacement import PodRules, has_rules, rules_of
from gpuyard.apis.resourceclasses import (
    KOORD_CORE,
    KOORD_MEMORY,
    KOORD_MEMORY_RATIO,
    SHARE_MEMORY_MIB,
    SHARE_MILLI,
    SHARE_RESOURCES,
    RequestError,
    parse_gpu_request,
)
from gpuyard.apis.scheduling import LABEL_REPLICA_INDEX, PodGroup, pod_name
from gpuyard.apis.topologypolicy import TopologyPolicy, TopologyPolicyError, parse_topology_policy
from gpuyard.devices.subsets import NICScope

__all__ = [
    "GPU_MILLI",
    "MIB",
    "SHARE_RESOURCES",
    "Constraints",
    "GangRequest",
    "PodShape",
    "PodSlot",
    "RolePart",
    "TopologyHints",
    "affinity_ok",
    "build_gang",
    "constraints_of",
    "parse_share",
    "requirement_ok",
    "selector_ok",
    "shape_of",
    "taints_ok",
    "tolerates",
    "topology_hints",
]

GPU_MILLI = 1000
MIB = 1 << 20

# The share resource names live with the other request vocabulary in `apis.resourceclasses`
# (the submit-time checks there must know them too).
"""Resources that ask for part of one GPU (see `parse_share`); never node extended resources."""

ANNOTATION_JOINT_ALLOCATE = "gpuyard.io/device-joint-allocate"
ANNOTATION_TOPOLOGY_REQUIRED = "gpuyard.io/topology-required"
ANNOTATION_TOPOLOGY_PREFERRED = "gpuyard.io/topology-preferred"
ANNOTATION_FLEXIBLE_SHAPE = "gpuyard.io/flexible-shape"
LABEL_KUBEFLOW_REPLICA_INDEX = "training.kubeflow.org/replica-index"
RDMA_RESOURCE = "rdma/hca"
TOPOLOGY_LEVELS = ("block", "spine")
NIC_SCOPES = ("SamePCIe", "SameNUMA", "None")

Term = tuple[tuple[tuple[str, str, tuple[str, ...]], ...], tuple[tuple[str, str, tuple[str, ...]], ...]]
"""A node-selector term: (matchExpressions, matchFields), each (key, operator, values)."""


@dataclass(frozen=True, slots=True)
class Constraints:
    """Where a pod may run: nodeSelector, required node affinity (terms ORed), tolerations."""

    node_selector: tuple[tuple[str, str], ...] = ()
    affinity: tuple[Term, ...] = ()
    tolerations: tuple[tuple[str | None, str, str | None, str | None], ...] = ()

    @property
    def selects(self) -> bool:
        return bool(self.node_selector or self.affinity)


NO_CONSTRAINTS = Constraints()


@dataclass(frozen=True, slots=True)
class PodShape:
    """One pod's request in scheduler units; identical pods share one shape.

    `cpu_milli` thousandths of a CPU, `mem_mib` MiB (rounded up), `gpus` devices of `gpu_class`
    (None: any GPU) with `gpu_milli` of each (1000: whole GPUs; less: a share of one GPU),
    `ext` extended resources in thousandths, `host_ports` ports handed out per pod.
    `preferences` are preferred node-affinity terms (weight, term) for the GPU-type score.
    """

    cpu_milli: int = 0
    mem_mib: int = 0
    gpus: int = 0
    gpu_milli: int = 0
    gpu_class: str | None = None
    ext: tuple[tuple[str, int], ...] = ()
    host_ports: int = 0
    constraints: Constraints = NO_CONSTRAINTS
    preferences: tuple[tuple[int, Term], ...] = ()
    rdma: bool = False
    """Joint GPU + RDMA allocation: the pod gets NICs near its GPUs (`rdma/hca` or the annotation)."""
    nic_scope: NICScope = None
    """Required NIC scope of the joint allocation: SamePCIe | SameNUMA | None (best effort)."""
    flexible: bool = False
    """One-GPU data-parallel workers whose split across nodes may be chosen freely (auto-aggregation)."""
    required_level: str | None = None
    """The gang's required network level (a copy of `GangRequest.topology_required`, so gangs
    that differ only in it never share a cached "does not fit")."""
    gpu_mem_mib: int = 0
    """A share's GPU memory in MiB (`koordinator.sh/gpu-memory`, `gpuyard.io/gpu-memory-mib`)."""
    gpu_mem_permille: int = 0
    """A share's GPU memory as thousandths of the chosen GPU's memory (used when `gpu_mem_mib` is 0)."""
    spot: bool = False
    """Spot replicas (KubeDL's spotReplicaSpec): the `spot` score prefers spot nodes for them and
    keeps the others off spot nodes while other room exists."""
    pods: int = 1
    """How many pods this shape stands for: more than one for the summed shape `place()` tries a
    gang's whole-GPU pods as (no pod of the workload has it; plugins learning the workload skip it)."""
    rules: PodRules | None = None
    """Inter-pod (anti-)affinity and topology spread the pod template asks for (None: none)."""

    def __post_init__(self) -> None:
        if min(self.cpu_milli, self.mem_mib, self.gpus, self.gpu_milli, self.host_ports) < 0:
            raise ValueError("a pod shape has no negative amounts")
        if self.gpus and not 0 < self.gpu_milli <= GPU_MILLI:
            raise ValueError(f"gpu_milli must be within 1..{GPU_MILLI} for a GPU pod, got {self.gpu_milli}")
        if self.gpus > 1 and self.gpu_milli < GPU_MILLI:
            raise ValueError("a GPU share (gpu_milli < 1000) is one GPU per pod")
        if min(self.gpu_mem_mib, self.gpu_mem_permille) < 0 or self.gpu_mem_permille > GPU_MILLI:
            raise ValueError("a share's GPU memory is 0..1000 permille or a non-negative MiB amount")

    @property
    def shared(self) -> bool:
        return self.gpus == 1 and self.gpu_milli < GPU_MILLI

    def describe(self) -> str:
        """`4 GPUs of class nvidia.v100, 8 CPU, 64Gi memory` — for explanations."""
        parts = []
        if self.gpus:
            kind = f" of class {self.gpu_class}" if self.gpu_class else ""
            if self.shared:
                parts.append(f"{self.gpu_milli}m of 1 GPU{kind}")
            else:
                parts.append(f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}{kind}")
        if self.cpu_milli:
            cpu = self.cpu_milli / 1000
            parts.append(f"{cpu:g} CPU")
        if self.mem_mib:
            mem = f"{self.mem_mib // 1024}Gi" if self.mem_mib % 1024 == 0 else f"{self.mem_mib}Mi"
            parts.append(f"{mem} memory")
        parts.extend(f"{amount / 1000:g} {name}" for name, amount in self.ext)
        if self.host_ports:
            parts.append(f"{self.host_ports} host port{'s' if self.host_ports != 1 else ''}")
        return ", ".join(parts) or "nothing"


@dataclass(frozen=True, slots=True)
class PodSlot:
    """One pod to place: its name (also its Reservation's), PodGroup, role and replica index."""

    namespace: str
    group: str
    role: str
    index: int
    name: str
    preferred_node: str | None = None
    role_labels: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)
    """The labels every pod of the role carries (`GangRole.labels`, shared, never copied)."""

    @property
    def labels(self) -> dict[str, str]:
        """The pod's labels: its role's plus its replica index (as the operator labels it)."""
        index = str(self.index)
        return {**self.role_labels, LABEL_REPLICA_INDEX: index, LABEL_KUBEFLOW_REPLICA_INDEX: index}


@dataclass(slots=True)
class RolePart:
    """The pods of one role of one PodGroup that need placing; the first `required` must all fit."""

    namespace: str
    group: str
    role: str
    shape: PodShape
    pods: tuple[PodSlot, ...]
    required: int
    requests: Mapping[str, Decimal] = field(default_factory=dict)

    @property
    def optional(self) -> tuple[PodSlot, ...]:
        return self.pods[self.required :]


@dataclass(slots=True)
class GangRequest:
    """Everything `place()` needs about one gang (one job, or a gang group placed together)."""

    key: tuple[str, str]
    members: tuple[tuple[str, str], ...]
    parts: list[RolePart]
    priority: int = 0
    placed: dict[str, str] = field(default_factory=dict)
    """Pods of the gang that already hold a Reservation: pod name -> node (failover, local peers)."""
    topology_required: str | None = None
    """Network level ("block" | "spine") the whole gang must stay inside."""
    topology_preferred: str | None = None
    """Network level the gang should stay inside when it can (blocks are always preferred)."""
    topology_policy: TopologyPolicy | None = None
    """The job's `gpuyard.io/topology-policy` (or Kueue's annotations): whether it waits for one
    node or block before it splits (`cycle/topowait.py`); None or policy None: the default."""

    @property
    def required(self) -> int:
        return sum(p.required for p in self.parts)

    @property
    def wanted(self) -> int:
        return sum(len(p.pods) for p in self.parts)


# --- building from the API --------------------------------------------------------------------


def _term(term: NodeSelectorTerm) -> Term:
    def reqs(items: Sequence[NodeSelectorRequirement]) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
        return tuple((r.key, r.operator, tuple(r.values)) for r in items)

    return (reqs(term.match_expressions), reqs(term.match_fields))


def _dict_term(raw: Mapping[str, Any]) -> Term:
    """A preferred-affinity term as the API keeps it: plain JSON (`dict[str, Any]`)."""

    def reqs(items: Iterable[Mapping[str, Any]] | None) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
        out = []
        for r in items or []:
            out.append(
                (
                    str(r.get("key", "")),
                    str(r.get("operator", "")),
                    tuple(str(v) for v in r.get("values") or []),
                )
            )
        return tuple(out)

    return (reqs(raw.get("matchExpressions")), reqs(raw.get("matchFields")))


def constraints_of(spec: PodSpec) -> tuple[Constraints, tuple[tuple[int, Term], ...]]:
    """The pod's hard constraints and its preferred node-affinity terms, as hashable tuples."""
    terms: tuple[Term, ...] = ()
    preferences: list[tuple[int, Term]] = []
    na = spec.affinity.node_affinity if spec.affinity is not None else None
    if na is not None:
        required = na.required_during_scheduling_ignored_during_execution
        if required is not None:
            terms = tuple(_term(t) for t in required.node_selector_terms)
        for pref in na.preferred_during_scheduling_ignored_during_execution:
            weight = int(pref.get("weight", 1))
            preference = pref.get("preference") or {}
            if weight and isinstance(preference, Mapping):
                preferences.append((weight, _dict_term(preference)))
    tolerations = tuple((t.key, t.operator, t.value, t.effect) for t in spec.tolerations)
    constraints = Constraints(tuple(sorted(spec.node_selector.items())), terms, tolerations)
    return (NO_CONSTRAINTS if constraints == NO_CONSTRAINTS else constraints), tuple(preferences)


@dataclass(frozen=True, slots=True)
class ShareRequest:
    """A pod's GPU share: `milli` of one GPU and its memory (MiB, or permille of the GPU's memory)."""

    milli: int = 0
    mem_mib: int = 0
    mem_permille: int = 0

    @property
    def asked(self) -> bool:
        return bool(self.milli or self.mem_mib or self.mem_permille)


def _whole(name: str, q: Decimal, *, lo: int, hi: int, unit: str) -> int:
    if q != q.to_integral_value() or not lo <= q <= hi:
        raise RequestError(name, f"{name} must be a whole number of {unit} within {lo}..{hi}, got {q}")
    return int(q)


def parse_share(requests: Mapping[str, Decimal]) -> ShareRequest:
    """The GPU share a pod asks for; raises `RequestError` naming the resource and allowed values.

    * `gpuyard.io/gpu-milli` 1..1000 thousandths of one GPU, or `koordinator.sh/gpu-core`
      1..100 percent of its compute (x 10 -> milli); not both.
    * memory: `gpuyard.io/gpu-memory-mib` (MiB), `koordinator.sh/gpu-memory` (bytes, rounded up
      to MiB) or `koordinator.sh/gpu-memory-ratio` 1..100 percent of the chosen GPU's memory;
      at most one of them. Without one the share gets its compute fraction of the GPU's memory.
    * a memory-only share (ratio alone) takes the same fraction of the compute; an absolute
      memory amount needs a compute share too (the GPU's size is unknown before placement).
    """
    got = {name: requests[name] for name in SHARE_RESOURCES if name in requests and requests[name] > 0}
    if not got:
        return ShareRequest()
    milli = 0
    if SHARE_MILLI in got and KOORD_CORE in got:
        raise RequestError(KOORD_CORE, f"ask for {SHARE_MILLI} or {KOORD_CORE}, not both")
    if SHARE_MILLI in got:
        milli = _whole(SHARE_MILLI, got[SHARE_MILLI], lo=1, hi=GPU_MILLI, unit="thousandths of a GPU")
    elif KOORD_CORE in got:
        milli = 10 * _whole(KOORD_CORE, got[KOORD_CORE], lo=1, hi=100, unit="percent")
    memory = [n for n in (SHARE_MEMORY_MIB, KOORD_MEMORY, KOORD_MEMORY_RATIO) if n in got]
    if len(memory) > 1:
        raise RequestError(memory[1], f"ask for GPU memory one way only, got {' and '.join(memory)}")
    mem_mib = permille = 0
    if SHARE_MEMORY_MIB in got:
        mem_mib = _whole(SHARE_MEMORY_MIB, got[SHARE_MEMORY_MIB], lo=1, hi=1 << 30, unit="MiB")
    elif KOORD_MEMORY in got:
        mem_mib = -(-int(got[KOORD_MEMORY].to_integral_value(rounding=ROUND_CEILING)) // MIB)
    elif KOORD_MEMORY_RATIO in got:
        permille = 10 * _whole(KOORD_MEMORY_RATIO, got[KOORD_MEMORY_RATIO], lo=1, hi=100, unit="percent")
    if not milli:
        if not permille:
            raise RequestError(
                memory[0],
                f"a GPU memory amount needs a compute share too: add {SHARE_MILLI} (1..1000) or "
                f"{KOORD_CORE} (1..100)",
            )
        milli = permille
    return ShareRequest(milli, mem_mib, permille or (0 if mem_mib else milli))


def shape_of(
    spec: PodSpec, *, classes: Mapping[str, object], host_ports: int = 0
) -> tuple[PodShape, dict[str, Decimal]]:
    """A pod template's shape and its total request; raises `RequestError` for a bad request.

    A GPU share (`parse_share`) is one GPU: of any model alone, or of a ResourceClass when the
    pod also asks for exactly one GPU of that class (`nvidia.v100: 1`, or `nvidia.com/gpu: 1`).
    """
    requests = spec.requests()
    for name, amount in sorted(requests.items()):
        if amount < 0:  # admission refuses these; one written past it is this job's error
            raise RequestError(name, f"a request must not be negative, got {name}: {amount}")
    share = parse_share(requests)
    plain = {k: v for k, v in requests.items() if k not in SHARE_RESOURCES} if share.asked else requests
    req = parse_gpu_request(plain, classes)
    gpus, milli = req.gpus, GPU_MILLI if req.gpus else 0
    if share.asked:
        if req.gpus > 1:
            name = req.gpu_class or "nvidia.com/gpu"
            raise RequestError(name, f"a GPU share is one GPU: ask for {name}: 1 with it, got {req.gpus}")
        gpus, milli = 1, share.milli
    shared = gpus == 1 and milli < GPU_MILLI
    constraints, preferences = constraints_of(spec)
    shape = PodShape(
        cpu_milli=req.cpu_milli,
        mem_mib=-(-req.memory // MIB),
        gpus=gpus,
        gpu_milli=milli,
        gpu_class=req.gpu_class,
        ext=req.other,
        host_ports=host_ports,
        constraints=constraints,
        preferences=preferences,
        gpu_mem_mib=share.mem_mib if shared else 0,
        gpu_mem_permille=share.mem_permille if shared else 0,
    )
    return shape, requests


ShapeCache = dict[tuple[str, int, int], tuple[PodShape, dict[str, Decimal]]]


def _member_parts(
    pg: PodGroup,
    placed: Mapping[str, str],
    *,
    classes: Mapping[str, object],
    cache: ShapeCache | None,
) -> list[RolePart]:
    ns, name = pg.metadata.namespace, pg.metadata.name
    spec = pg.spec
    job_min = spec.min_available
    missing: list[list[int]] = []
    role_required: list[int] = []
    existing_total = 0
    for role in spec.roles:
        have = [i for i in range(role.replicas) if pod_name(name, role.name, i) in placed]
        existing_total += len(have)
        missing.append([i for i in range(role.replicas) if pod_name(name, role.name, i) not in placed])
        if role.min_available is not None:
            floor = min(role.min_available, role.replicas)
        else:
            floor = role.replicas if job_min is None else 0
        role_required.append(max(0, floor - len(have)))
    if job_min is not None:
        short = min(job_min, spec.total_replicas()) - existing_total - sum(role_required)
        for pos, miss in enumerate(missing):
            if short <= 0:
                break
            extra = min(short, len(miss) - role_required[pos])
            role_required[pos] += extra
            short -= extra
    parts: list[RolePart] = []
    shapes = cache if pg.metadata.uid else None  # shapes of objects with a uid are cached
    for pos, role in enumerate(spec.roles):
        if not missing[pos]:
            continue
        key = (pg.metadata.uid, pg.metadata.generation, pos)
        hit = shapes.get(key) if shapes is not None else None
        if hit is None:
            hit = shape_of(role.template, classes=classes, host_ports=role.host_ports)
            if has_rules(role.template):
                labels = {**role.labels, LABEL_REPLICA_INDEX: "0", LABEL_KUBEFLOW_REPLICA_INDEX: "0"}
                rules = rules_of(role.template, namespace=ns, labels=labels, where=f"roles[{role.name}]")
                if rules is not None:
                    hit = (replace(hit[0], rules=rules), hit[1])
            if shapes is not None:
                if len(shapes) > 50_000:
                    shapes.clear()
                shapes[key] = hit
        shape, requests = hit
        pods = []
        for i in missing[pos]:
            pname = pod_name(name, role.name, i)
            pods.append(PodSlot(ns, name, role.name, i, pname, spec.preferred_nodes.get(pname), role.labels))
        part = RolePart(ns, name, role.name, shape, tuple(pods), role_required[pos], requests)
        parts.extend(_spot_split(part, role.replicas - role.spot_replicas) if role.spot_replicas else (part,))
    return parts


def _spot_split(part: RolePart, first_spot: int) -> tuple[RolePart, ...]:
    """The role's pods as its on-demand part and its spot part (replicas `first_spot` and up,
    with a shape marked `spot`); the required pods are still the lowest indices."""
    spot = tuple(p for p in part.pods if p.index >= first_spot)
    if not spot:
        return (part,)
    normal = part.pods[: len(part.pods) - len(spot)]
    kept = min(part.required, len(normal))
    spot_part = replace(part, shape=replace(part.shape, spot=True), pods=spot, required=part.required - kept)
    return (replace(part, pods=normal, required=kept), spot_part) if normal else (spot_part,)


@dataclass(frozen=True, slots=True)
class TopologyHints:
    """What a PodGroup's annotations ask of the topology (parsed once per PodGroup)."""

    joint_rdma: bool = False
    nic_scope: NICScope = None
    flexible: bool = False
    required: str | None = None
    preferred: str | None = None
    policy: TopologyPolicy | None = None


def topology_hints(pg: PodGroup) -> TopologyHints:
    """Parse the topology annotations of a PodGroup (the operator copies them from the job).

    Raises `RequestError` naming the annotation and the allowed values for a bad one.
    """
    ann = pg.metadata.annotations
    joint = False
    scope: NICScope = None
    raw = ann.get(ANNOTATION_JOINT_ALLOCATE)
    if raw:
        field_name = f"metadata.annotations[{ANNOTATION_JOINT_ALLOCATE}]"
        try:
            doc = json.loads(raw)
        except ValueError:
            raise RequestError(field_name, f"must be JSON like {_JOINT_EXAMPLE}, got {raw!r}") from None
        if not isinstance(doc, dict):
            raise RequestError(field_name, f"must be a JSON object like {_JOINT_EXAMPLE}")
        types = doc.get("deviceTypes") or []
        if not isinstance(types, list) or not set(types) <= {"gpu", "rdma"}:
            raise RequestError(field_name, f"deviceTypes must list gpu and/or rdma, got {types!r}")
        joint = "rdma" in types
        got = doc.get("requiredScope", "None")
        if got not in NIC_SCOPES:
            raise RequestError(
                field_name, f"requiredScope must be one of {', '.join(NIC_SCOPES)}, got {got!r}"
            )
        scope = None if got == "None" else got
    levels = []
    for key in (ANNOTATION_TOPOLOGY_REQUIRED, ANNOTATION_TOPOLOGY_PREFERRED):
        level = ann.get(key) or None
        if level is not None and level not in TOPOLOGY_LEVELS:
            raise RequestError(
                f"metadata.annotations[{key}]",
                f"must be one of {', '.join(TOPOLOGY_LEVELS)}, got {level!r}",
            )
        levels.append(level)
    flexible_raw = ann.get(ANNOTATION_FLEXIBLE_SHAPE, "").strip().lower()
    if flexible_raw not in ("", "true", "false"):
        raise RequestError(
            f"metadata.annotations[{ANNOTATION_FLEXIBLE_SHAPE}]",
            f'must be "true" or "false", got {flexible_raw!r}',
        )
    flexible = flexible_raw == "true" or (flexible_raw == "" and pg.spec.job_kind == "PyTorchJob")
    try:
        policy = parse_topology_policy(ann)
    except TopologyPolicyError as exc:
        raise RequestError(f"metadata.annotations[{exc.annotation}]", exc.reason) from None
    if policy.policy == "required" and policy.wait is None and levels[0] is None:
        levels[0] = policy.level  # required without a bound: a hard level, as topology-required
    return TopologyHints(joint, scope, flexible, levels[0], levels[1], policy)


_JOINT_EXAMPLE = '{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}'


def _with_hints(shape: PodShape, hints: TopologyHints) -> PodShape:
    gpus = bool(shape.gpus)
    rdma = gpus and (hints.joint_rdma or any(name == RDMA_RESOURCE for name, _ in shape.ext))
    scope = hints.nic_scope if hints.joint_rdma and gpus else None
    flexible = hints.flexible and shape.gpus == 1 and not shape.shared
    wanted = (rdma, scope, flexible, hints.required)
    if wanted == (shape.rdma, shape.nic_scope, shape.flexible, shape.required_level):
        return shape
    return replace(shape, rdma=rdma, nic_scope=scope, flexible=flexible, required_level=hints.required)


_NO_HINTS = TopologyHints()


def build_gang(
    podgroups: Sequence[PodGroup],
    *,
    placed: Mapping[tuple[str, str], Mapping[str, str]],
    classes: Mapping[str, object],
    cache: ShapeCache | None = None,
) -> GangRequest:
    """The gang request of one PodGroup or a gang group (the first is the one the queue chose).

    `placed` maps each member (namespace, name) to its pods that already hold a Reservation
    (pod name -> node). Raises `RequestError` for a request no class can satisfy.
    """
    parts: list[RolePart] = []
    already: dict[str, str] = {}
    lead_hints = None
    for pg in podgroups:
        member_placed = placed.get((pg.metadata.namespace, pg.metadata.name), {})
        already.update(member_placed)
        hints = topology_hints(pg)
        lead_hints = lead_hints or hints
        for part in _member_parts(pg, member_placed, classes=classes, cache=cache):
            part.shape = _with_hints(part.shape, hints)
            parts.append(part)
    lead = podgroups[0]
    hints = lead_hints or _NO_HINTS
    return GangRequest(
        key=(lead.metadata.namespace, lead.metadata.name),
        members=tuple((p.metadata.namespace, p.metadata.name) for p in podgroups),
        parts=parts,
        priority=lead.spec.priority,
        placed=already,
        topology_required=hints.required,
        topology_preferred=hints.preferred,
        topology_policy=hints.policy,
    )


# --- testing constraints against a node ---------------------------------------------------------


def selector_ok(node_selector: tuple[tuple[str, str], ...], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in node_selector)


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def requirement_ok(key: str, op: str, values: tuple[str, ...], labels: Mapping[str, str]) -> bool:
    """One `matchExpressions` entry against a node's labels."""
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and len(values) == 1:
        have, bound = _int(labels.get(key)), _int(values[0])
        if have is None or bound is None:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def term_ok(term: Term, labels: Mapping[str, str], name: str) -> bool:
    expressions, fields = term
    if not expressions and not fields:
        return False
    for key, op, values in expressions:
        if not requirement_ok(key, op, values, labels):
            return False
    for key, op, values in fields:
        if key != "metadata.name" or not requirement_ok(key, op, values, {"metadata.name": name}):
            return False
    return True


def affinity_ok(terms: tuple[Term, ...], labels: Mapping[str, str], name: str) -> bool:
    """Required node affinity: at least one term matches (no terms: no constraint)."""
    if not terms:
        return True
    return any(term_ok(t, labels, name) for t in terms)


Toleration = tuple[str | None, str, str | None, str | None]  # key, operator, value, effect


def tolerates(tol: Toleration, taint: tuple[str, str | None, str]) -> bool:
    key, op, value, effect = tol
    t_key, t_value, t_effect = taint
    if effect is not None and effect != t_effect:
        return False
    if key is None or key == "":
        return op == "Exists"
    if key != t_key:
        return False
    return op == "Exists" or (value or "") == (t_value or "")


def taints_ok(taints: tuple[tuple[str, str | None, str], ...], tolerations: tuple[Toleration, ...]) -> bool:
    """Every blocking taint of the node is tolerated by one of the pod's tolerations."""
    return all(any(tolerates(tol, taint) for tol in tolerations) for taint in taints)
