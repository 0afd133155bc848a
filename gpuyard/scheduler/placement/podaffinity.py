"""Inter-pod affinity and anti-affinity: kube-scheduler's InterPodAffinity plugin for gangs.

A pod template's `affinity.podAffinity` / `affinity.podAntiAffinity` (parsed by
`gpuyard.apis.podplacement`) are checked against every pod that holds room on a node — the
Reservations of running and placed jobs, of any job — and against the pods of the same gang
already placed in this `place()` call (their trial allocations), so two workers of one job with
required anti-affinity on `kubernetes.io/hostname` never share a node.

* :class:`RulesContext` — built once per `place()` call, only when a pod of the gang has rules or
  a running pod's required anti-affinity could concern the gang (`rules_context`); otherwise
  nothing here runs. It holds the topology domains of the node label keys the rules name (any
  node label; `kubernetes.io/hostname` falls back to the node's name), the pods already on nodes,
  the gang's trial placements, and which pod is being placed now (`pod`). While it exists,
  `placing` places the gang one pod at a time, as kube-scheduler does, so each pod sees the ones
  before it.
* :class:`InterPodAffinity` (filter `inter-pod-affinity`) — required terms, with Kubernetes'
  rules: affinity needs, for every term, a matching pod in the node's domain (a pod counts when
  it matches every term), except for the first pod of a group whose terms match itself;
  anti-affinity refuses a domain holding a matching pod; and a pod's labels matching a placed
  pod's required anti-affinity term refuse that pod's domain (symmetry).
* :class:`InterPodAffinityScore` (score `inter-pod-affinity`) — preferred terms: for each node,
  the sum of the weights of the affinity terms minus those of the anti-affinity terms, each
  times the number of matching pods in the node's domain.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from gpuyard.apis.podplacement import AffinityTerm, LabelSelector
from gpuyard.scheduler.cache.allocations import Alloc
from gpuyard.scheduler.gangs.requests import PodShape, PodSlot
from gpuyard.scheduler.placement.framework import CycleState

__all__ = [
    "RULES",
    "InterPodAffinity",
    "InterPodAffinityScore",
    "PlacedPod",
    "RulesContext",
    "rules_context",
]

RULES = "pod-rules"
"""Key of the :class:`RulesContext` in `CycleState.data` (absent: no inter-pod rule concerns the gang)."""

LABEL_HOSTNAME = "kubernetes.io/hostname"


@dataclass(slots=True)
class PlacedPod:
    """A pod on a node: a Reservation's, or one of the gang's trial placements (`alloc`)."""

    alloc: Alloc
    namespace: str
    labels: Mapping[str, str]
    anti: tuple[AffinityTerm, ...]

    @property
    def row(self) -> int:
        return self.alloc.row  # -1 once the trial allocation is undone


class RulesContext:
    """What the inter-pod plugins share during one `place()` call (see the module docstring).

    The pods already on nodes do not change during the call: which of them a term or selector
    matches is computed once per term (`_existing_rows`); the gang's trial placements, few, are
    matched on every question. Topology domains are cached in the profile until node facts change.
    """

    __slots__ = ("_anti", "_cache", "_matches", "existing", "pod", "snapshot", "trial")

    def __init__(self, state: CycleState) -> None:
        self.snapshot = state.snapshot
        self._cache = state.profile.cache
        self.pod: PodSlot | None = None
        """The pod being placed now (the fill sets it before each pod)."""
        self.existing = [
            PlacedPod(e.alloc, e.key[0], e.labels, e.anti)
            for e in self.snapshot.ledger.entries()
            if e.alloc.row >= 0
        ]
        self._anti = [p for p in self.existing if p.anti]
        self.trial: list[PlacedPod] = []
        self._matches: dict[tuple[object, ...], np.ndarray] = {}

    # --- the pods -------------------------------------------------------------------------------

    def record(self, alloc: Alloc, pod: PodSlot, shape: PodShape) -> None:
        """A trial placement of the gang (undone placements drop out by themselves)."""
        anti = shape.rules.anti_affinity if shape.rules is not None else ()
        self.trial.append(PlacedPod(alloc, pod.namespace, pod.labels, anti))

    def _trials(self) -> list[PlacedPod]:
        return [p for p in self.trial if p.alloc.row >= 0]

    def placed(self) -> list[PlacedPod]:
        """Every pod on a node now: running ones and the gang's trial placements."""
        return [p for p in self.existing if p.alloc.row >= 0] + self._trials()

    def anti_pods(self) -> list[PlacedPod]:
        """The pods on nodes that have required anti-affinity terms."""
        return [p for p in self._anti if p.alloc.row >= 0] + [p for p in self._trials() if p.anti]

    def current(self, state: CycleState) -> PodSlot | None:
        if self.pod is not None:
            return self.pod
        return state.part_pods[0] if state.part_pods else None

    def _rows(self, key: tuple[object, ...], matches: Callable[[PlacedPod], bool]) -> np.ndarray:
        """Rows of the pods on nodes (one entry per pod) that `matches` accepts."""
        base = self._matches.get(key)
        if base is None:
            base = np.asarray([p.row for p in self.existing if p.row >= 0 and matches(p)], dtype=np.int64)
            self._matches[key] = base
        extra = [p.row for p in self._trials() if matches(p)]
        if not extra:
            return base
        return np.concatenate([base, np.asarray(extra, dtype=np.int64)])

    def rows_matching(self, term: AffinityTerm) -> np.ndarray:
        """Rows of the pods a term is about."""
        return self._rows(("term", term), lambda p: term.matches(p.namespace, p.labels))

    def rows_matching_all(self, terms: tuple[AffinityTerm, ...]) -> np.ndarray:
        """Rows of the pods every term is about (required affinity counts only those)."""
        return self._rows(("all", terms), lambda p: all(t.matches(p.namespace, p.labels) for t in terms))

    def rows_selected(self, selector: LabelSelector | None, namespace: str) -> np.ndarray:
        """Rows of the pods of `namespace` a spread constraint's selector matches."""
        if selector is None:
            return np.zeros(0, dtype=np.int64)
        return self._rows(
            ("selector", selector, namespace),
            lambda p: p.namespace == namespace and selector.matches(p.labels),
        )

    # --- topology domains ---------------------------------------------------------------------

    def domains(self, key: str) -> tuple[np.ndarray, int]:
        """int64[N]: each row's domain for node label `key` (-1: the node lacks it), and how
        many distinct values there are. `kubernetes.io/hostname` falls back to the node name."""
        snap = self.snapshot
        stamp = (id(snap), snap.static_version, snap.n)
        cached = self._cache.get((RULES, key))
        if cached is not None and cached[0] == stamp:
            hit: tuple[np.ndarray, int] = cached[1]
            return hit
        labels = snap.node_rows.labels
        names = snap.node_rows.names
        n = len(snap.alive)
        out = np.full(n, -1, dtype=np.int64)
        index: dict[str, int] = {}
        for row in range(min(n, len(names))):
            name = names[row]
            if name is None:
                continue
            value = labels[row].get(key)
            if value is None and key == LABEL_HOSTNAME:
                value = name
            if value is not None:
                out[row] = index.setdefault(value, len(index))
        hit = (out, len(index))
        self._cache[(RULES, key)] = (stamp, hit)
        return hit

    def counts(self, key: str, rows: np.ndarray, *, where: np.ndarray | None = None) -> np.ndarray:
        """int64[domains]: pods (at `rows`) per domain of `key`, counting only rows in `where`."""
        dom, size = self.domains(key)
        if len(rows):
            d = dom[rows]
            keep = d >= 0
            if where is not None:
                keep &= where[rows]
            return np.bincount(d[keep], minlength=size)
        return np.zeros(size, dtype=np.int64)


def rules_context(state: CycleState) -> RulesContext | None:
    """The context for `state.gang`, or None when no inter-pod rule concerns it (the fast path):
    none of its pods has rules, and no running pod's required anti-affinity matches one of them."""
    gang = state.gang
    if any(part.shape.rules is not None for part in gang.parts):
        return RulesContext(state)
    anti = state.snapshot.ledger.anti_entries()
    if not anti:
        return None
    terms = {t for e in anti for t in e.anti}
    for part in gang.parts:
        for pod in part.pods:
            labels = pod.labels
            if any(t.matches(pod.namespace, labels) for t in terms):
                return RulesContext(state)
    return None


def _nodes(n: int) -> str:
    return f"{n} node{'s' if n != 1 else ''}"


class InterPodAffinity:
    """Required pod affinity and anti-affinity, both ways (see the module docstring)."""

    name = "inter-pod-affinity"
    static = False

    def _masks(self, state: CycleState, shape: PodShape) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(existing pods' anti-affinity ok, the pod's anti-affinity ok, the pod's affinity ok)."""
        ctx: RulesContext | None = state.data.get(RULES)
        if ctx is None:
            return None
        pod = ctx.current(state)
        n = len(state.snapshot.alive)
        symmetric = np.ones(n, dtype=bool)
        if pod is not None:
            labels = pod.labels
            for placed in ctx.anti_pods():
                for term in placed.anti:
                    if term.matches(pod.namespace, labels):
                        dom, _ = ctx.domains(term.topology_key)
                        value = dom[placed.row]
                        if value >= 0:
                            symmetric &= dom != value
        anti = np.ones(n, dtype=bool)
        affinity = np.ones(n, dtype=bool)
        rules = shape.rules
        if rules is None:
            return symmetric, anti, affinity
        for term in rules.anti_affinity:
            dom, _ = ctx.domains(term.topology_key)
            taken = ctx.counts(term.topology_key, ctx.rows_matching(term)) > 0
            anti &= ~np.where(dom >= 0, taken[np.maximum(dom, 0)] if len(taken) else False, False)
        if rules.affinity:
            rows = ctx.rows_matching_all(rules.affinity)
            first = not len(rows)
            if first and not (
                pod is not None and all(t.matches(pod.namespace, pod.labels) for t in rules.affinity)
            ):
                affinity[:] = False  # nothing to be near, and the pod is not one of its own group
            for term in rules.affinity:
                dom, _ = ctx.domains(term.topology_key)
                if first:
                    affinity &= dom >= 0  # every topology key must be on the node
                    continue
                near = ctx.counts(term.topology_key, rows) > 0
                affinity &= np.where(dom >= 0, near[np.maximum(dom, 0)] if len(near) else False, False)
        return symmetric, anti, affinity

    def filter(self, state: CycleState, shape: PodShape) -> np.ndarray | None:
        masks = self._masks(state, shape)
        if masks is None:
            return None
        symmetric, anti, affinity = masks
        result: np.ndarray = symmetric & anti & affinity
        return result

    def explain(self, state: CycleState, shape: PodShape, failed: np.ndarray) -> str:
        masks = self._masks(state, shape)
        n = int(failed.sum())
        if masks is None:
            return f"{_nodes(n)} didn't satisfy inter-pod affinity rules"
        symmetric, anti, affinity = masks
        texts = []
        for mask, what in (
            (affinity, "didn't match the pod's affinity rules"),
            (anti, "didn't match the pod's anti-affinity rules"),
            (symmetric, "didn't satisfy existing pods' anti-affinity rules"),
        ):
            k = int((failed & ~mask).sum())
            if k:
                texts.append(f"{_nodes(k)} {what}")
        return "; ".join(texts) or f"{_nodes(n)} didn't satisfy inter-pod affinity rules"


class InterPodAffinityScore:
    """Preferred pod affinity (+weight) and anti-affinity (-weight) per matching pod in the domain."""

    name = "inter-pod-affinity"

    def score(
        self, state: CycleState, shape: PodShape, nodes: np.ndarray | slice, take: np.ndarray
    ) -> np.ndarray | None:
        rules = shape.rules
        if rules is None or not (rules.preferred_affinity or rules.preferred_anti_affinity):
            return None
        ctx: RulesContext | None = state.data.get(RULES)
        if ctx is None:
            return None
        total = np.zeros(len(state.snapshot.alive), dtype=np.float64)
        for terms, sign in ((rules.preferred_affinity, 1.0), (rules.preferred_anti_affinity, -1.0)):
            for term in terms:
                counts = ctx.counts(term.topology_key, ctx.rows_matching(term))
                if not counts.any():
                    continue
                dom, _ = ctx.domains(term.topology_key)
                total += sign * term.weight * np.where(dom >= 0, counts[np.maximum(dom, 0)], 0)
        result: np.ndarray = total[nodes]
        return result
