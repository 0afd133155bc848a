"""Topology spread constraints: kube-scheduler's PodTopologySpread plugin for gangs.

A pod template's `topologySpreadConstraints` (parsed by `gpuyard.apis.podplacement`) over any
node label key (`kubernetes.io/hostname`, `topology.gpuyard.io/block`, a zone, ...). The pods
counted are those of the pod's namespace its `labelSelector` (and `matchLabelKeys`) matches:
every pod holding room on a node and the pods of the same gang already placed in this `place()`
call, so the gang spreads as it is placed (the shared :class:`~gpuyard.scheduler.placement.
podaffinity.RulesContext`; without it nothing here runs).

* :class:`TopologySpread` (filter `pod-topology-spread`, `whenUnsatisfiable: DoNotSchedule`) — as
  Kubernetes defines it: the domains are the values of the key on the nodes that may count
  (having every constraint's key; passing the pod's node selector and required node affinity
  unless `nodeAffinityPolicy: Ignore`; tolerated taints only with `nodeTaintsPolicy: Honor`); a
  node passes when `pods in its domain + (1 if the pod matches the selector) - the fewest in any
  domain <= maxSkew`, the fewest being 0 while there are fewer domains than `minDomains`. A node
  without the key fails.
* :class:`TopologySpreadScore` (score `pod-topology-spread`, `ScheduleAnyway`) — per constraint
  `(pods in the node's domain + maxSkew - 1) x log(domains + 2)`, summed, fewer is better; nodes
  lacking a key score lowest.
"""

from __future__ import annotations

import math

import numpy as np

from gpuyard.apis.podplacement import SpreadConstraint
from gpuyard.scheduler.gangs.requests import PodShape
from gpuyard.scheduler.placement.framework import CycleState
from gpuyard.scheduler.placement.podaffinity import RULES, RulesContext

__all__ = ["TopologySpread", "TopologySpreadScore"]


def _counting_nodes(
    state: CycleState, ctx: RulesContext, shape: PodShape, constraints: tuple[SpreadConstraint, ...]
) -> np.ndarray:
    """bool[N]: the nodes whose pods and domains count (see the module docstring)."""
    snap = state.snapshot
    ok = snap.alive.copy()
    for c in constraints:
        dom, _ = ctx.domains(c.topology_key)
        ok &= dom >= 0
    first = constraints[0]
    if first.honor_affinity:
        selected = snap.selector_mask(shape.constraints)
        if selected is not None:
            ok &= selected
    if first.honor_taints:
        ok &= snap.taint_mask(shape.constraints)
    return ok


def _skew_ok(
    state: CycleState, ctx: RulesContext, shape: PodShape, constraints: tuple[SpreadConstraint, ...]
) -> list[tuple[SpreadConstraint, np.ndarray]]:
    """Per hard constraint, bool[N]: placing the current pod there keeps the skew within maxSkew."""
    pod = ctx.current(state)
    labels = pod.labels if pod is not None else {}
    namespace = pod.namespace if pod is not None else state.gang.key[0]
    counting = _counting_nodes(state, ctx, shape, constraints)
    out = []
    for c in constraints:
        dom, size = ctx.domains(c.topology_key)
        counts = ctx.counts(c.topology_key, ctx.rows_selected(c.selector, namespace), where=counting)
        present = np.unique(dom[counting & (dom >= 0)])
        if len(present) < c.min_domains or not len(present):
            least = 0
        else:
            least = int(counts[present].min())
        own = 1 if c.matches(labels) else 0
        skew = np.where(dom >= 0, counts[np.maximum(dom, 0)] if size else 0, 0) + own - least
        out.append((c, (dom >= 0) & (skew <= c.max_skew)))
    return out


class TopologySpread:
    """`whenUnsatisfiable: DoNotSchedule` constraints as a filter (see the module docstring)."""

    name = "pod-topology-spread"
    static = False

    def filter(self, state: CycleState, shape: PodShape) -> np.ndarray | None:
        rules = shape.rules
        if rules is None:
            return None
        hard = rules.hard_spread
        ctx: RulesContext | None = state.data.get(RULES)
        if not hard or ctx is None:
            return None
        mask = np.ones(len(state.snapshot.alive), dtype=bool)
        for _, ok in _skew_ok(state, ctx, shape, hard):
            mask &= ok
        return mask

    def explain(self, state: CycleState, shape: PodShape, failed: np.ndarray) -> str:
        n = int(failed.sum())
        ctx: RulesContext | None = state.data.get(RULES)
        if ctx is None or shape.rules is None or not shape.rules.hard_spread:
            return f"{n} node{'s' if n != 1 else ''} didn't match pod topology spread constraints"
        texts = []
        for c, ok in _skew_ok(state, ctx, shape, shape.rules.hard_spread):
            dom, _ = ctx.domains(c.topology_key)
            missing = int((failed & (dom < 0)).sum())
            skewed = int((failed & (dom >= 0) & ~ok).sum())
            if missing:
                texts.append(f"{missing} node{'s' if missing != 1 else ''} lack the label {c.topology_key}")
            if skewed:
                texts.append(
                    f"{skewed} node{'s' if skewed != 1 else ''} would put more than maxSkew={c.max_skew} "
                    f"pods over the least-used {c.topology_key} domain"
                )
        return (
            "; ".join(texts)
            or f"{n} node{'s' if n != 1 else ''} didn't match pod topology spread constraints"
        )


class TopologySpreadScore:
    """`whenUnsatisfiable: ScheduleAnyway` constraints as a score (see the module docstring)."""

    name = "pod-topology-spread"

    def score(
        self, state: CycleState, shape: PodShape, nodes: np.ndarray | slice, take: np.ndarray
    ) -> np.ndarray | None:
        rules = shape.rules
        if rules is None:
            return None
        soft = rules.soft_spread
        ctx: RulesContext | None = state.data.get(RULES)
        if not soft or ctx is None:
            return None
        pod = ctx.current(state)
        namespace = pod.namespace if pod is not None else state.gang.key[0]
        counting = _counting_nodes(state, ctx, shape, soft)
        total = np.zeros(len(state.snapshot.alive), dtype=np.float64)
        for c in soft:
            dom, size = ctx.domains(c.topology_key)
            counts = ctx.counts(c.topology_key, ctx.rows_selected(c.selector, namespace), where=counting)
            domains = len(np.unique(dom[counting & (dom >= 0)]))
            weight = math.log(domains + 2)
            per_node = np.where(dom >= 0, counts[np.maximum(dom, 0)] if size else 0, 0)
            total += weight * (per_node + c.max_skew - 1)
        raw = -total
        if counting.any():
            raw = np.where(counting, raw, raw[counting].min() - 1.0)  # lacking a key: the lowest
        result: np.ndarray = raw[nodes]
        return result
