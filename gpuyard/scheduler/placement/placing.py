"""`place(snapshot, gang, profile)`: the pure, all-or-nothing gang placement decision.

No event loop, no store: plain data in, a :class:`Placement` or an :class:`Unschedulable` out.
The snapshot is used as scratch space while trying and is exactly as it was when `place`
returns (every trial allocation is undone), so the caller decides whether to assume the result.

The algorithm, per gang:

1. job-level PreFilter plugins may reject the gang outright;
2. a gang of several whole-GPU pods is first tried as one pod would be (`_place_together`): the
   GPU roles' pods summed into one shape, filtered and scored once, the node's best GPU subset for
   the sum chosen by the GPU chooser (NVLink quad, partition, NICs), and every pod's GPUs then taken
   from that subset. So 1 Master + 3 Workers of one GPU each land on one node's NVLinked quad, like
   one 4-GPU pod. CPU-only roles (PS, launcher) do not count and are placed afterwards. Only when
   no single node can take the GPU pods does the gang fall back to step 3;
3. the *required* pods of every role part, part by part: the pods of a part share one shape, so
   the filters run once per part and give, per node, how many pods of the shape fit (integer
   arithmetic on the free arrays); the score plugins rank the candidates once; then the part is
   *filled*: "pack" puts the whole part on the best node that can take all of it, otherwise on the
   node that can take the most (in the tightest network block that can hold the rest), and so on
   — fewest nodes first; "spread" places one pod at a time on the best node, scoring again after
   each (so least-allocated moves on), or for large groups deals one pod per node round-robin.
   Pods with a failover preference are filled as their own group so the preference can win. If
   any part falls short, nothing is placed and the reason is explained;
4. the *optional* pods (above the minimum), best effort, in the same way;
5. GPUs inside each chosen node come from the profile's GPU chooser, host ports round-robin from
   the configured range.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gpuyard.scheduler.cache.snapshot import Alloc, Snapshot
from gpuyard.scheduler.gangs.outcomes import Placement, PodPlacement, Unschedulable
from gpuyard.scheduler.gangs.requests import GPU_MILLI, GangRequest, PodShape, PodSlot, RolePart
from gpuyard.scheduler.placement.capacity import gpu_totals_short
from gpuyard.scheduler.placement.filtering import breakdown, capacity, explain
from gpuyard.scheduler.placement.framework import ALL, CycleState, Profile
from gpuyard.scheduler.placement.podaffinity import RULES, RulesContext, rules_context
from gpuyard.scheduler.placement.scores import normalize
from gpuyard.scheduler.placement.topology import best_split, colocated_set

__all__ = ["place", "score_candidates"]

_Undo = list[tuple[Alloc, int]]  # applied allocation, the node's port cursor before it


def place(
    snapshot: Snapshot, gang: GangRequest, profile: Profile, *, state: CycleState | None = None
) -> Placement | Unschedulable:
    """Place every required pod of `gang` or none; optional pods where they fit. Pure (see module doc).

    `state`: a CycleState the caller made (plugins' per-attempt scratch); a fresh one by default.
    """
    state = state or CycleState(snapshot, gang, profile)
    context = rules_context(state)  # inter-pod affinity, topology spread: None on the fast path
    if context is not None:
        state.data[RULES] = context
    reset = getattr(profile.chooser, "reset", None)
    if reset is not None:
        reset()
    undo: _Undo = []
    result: Placement | Unschedulable
    try:
        result = _place(state, undo)
    finally:
        _rollback(snapshot, undo, 0)
    if isinstance(result, Unschedulable):
        short = gpu_totals_short(state.snapshot, state.gang)  # cheap; the cycle asks `ever_fits` in full
        if short:
            result.message = f"can never fit: {short[0].describe()}; {result.message}"
            result.never = True
        failed = state.data.get("failed_part")
        if failed is not None:
            result.notes.extend(_topology_notes(state, failed))
    return result


def _place(state: CycleState, undo: _Undo) -> Placement | Unschedulable:
    together, placed = _place_together(state, undo)
    for part in state.gang.parts:
        if part.required == 0 or any(part is p for p in together):
            continue
        mark = len(undo)
        got = _place_part(state, part, part.pods[: part.required], undo, required=True)
        if got is None:
            state.data["failed_part"] = part
            _rollback(state.snapshot, undo, mark)  # explain the part on what the gang holds before it
            state.data["gang_allocs"] = [alloc for alloc, _ in undo]
            try:
                failure = explain(state, part, placed_before=len(placed))
            finally:
                state.data.pop("gang_allocs", None)
            each = state.data.pop("each_failure", None)  # placed pod by pod: why the last one failed
            if each:
                failure.message = f"{failure.message.rstrip('.')}; {each}."
            return failure
        placed.extend(got)
    deferred: list[PodSlot] = []
    for part in state.gang.parts:
        optional = part.optional
        if not optional:
            continue
        got = _place_part(state, part, optional, undo, required=False) or []
        placed.extend(got)
        done = {p.pod.name for p in got}
        deferred.extend(p for p in optional if p.name not in done)
    return Placement(state.gang, placed, deferred)


def _together_shape(parts: list[RolePart]) -> PodShape | None:
    """The one-pod shape of the required pods of `parts` summed, or None when they cannot be
    treated as one pod (shares, GPU classes or node constraints that differ, spot and on-demand
    replicas together, failover preferences)."""
    first = parts[0].shape
    for part in parts:
        shape = part.shape
        if (
            shape.shared
            or shape.gpu_class != first.gpu_class
            or shape.constraints != first.constraints
            or shape.nic_scope != first.nic_scope
            or shape.spot != first.spot  # spot replicas go to spot nodes, the others elsewhere
            or any(pod.preferred_node is not None for pod in part.pods[: part.required])
        ):
            return None
    ext: dict[str, int] = {}
    for part in parts:
        for name, amount in part.shape.ext:
            ext[name] = ext.get(name, 0) + amount * part.required
    return replace(
        first,
        cpu_milli=sum(p.shape.cpu_milli * p.required for p in parts),
        mem_mib=sum(p.shape.mem_mib * p.required for p in parts),
        gpus=sum(p.shape.gpus * p.required for p in parts),
        gpu_milli=GPU_MILLI,
        ext=tuple(sorted(ext.items())),
        host_ports=sum(p.shape.host_ports * p.required for p in parts),
        rdma=any(p.shape.rdma for p in parts),
        flexible=False,
        pods=sum(p.required for p in parts),
    )


_TOGETHER_TRIES = 3  # nodes tried (best score first) before falling back to part-by-part


def _place_together(state: CycleState, undo: _Undo) -> tuple[list[RolePart], list[PodPlacement]]:
    """The required pods of the gang's whole-GPU roles on one node inside one GPU set, chosen as
    for one pod of their summed shape (see the module docstring); [] when that does not apply or no
    node takes them (nothing then stays allocated). Returns the parts placed and their pods."""
    parts = [p for p in state.gang.parts if p.required and p.shape.gpus]
    if sum(p.required for p in parts) < 2 or RULES in state.data:  # inter-pod rules: pod by pod
        return [], []
    shape = _together_shape(parts)
    if shape is None or state.profile.fill_for(shape) == "spread":
        return [], []
    state.want = 1
    cap = capacity(state, shape).astype(np.int64)
    if state.gang.topology_required is not None:
        cap = _required_domain(state, cap, 1)
    n_cand = int(np.count_nonzero(cap))
    if not n_cand:
        return [], []
    if 4 * n_cand >= len(cap):  # most nodes are candidates: score whole arrays (views), as `_fill`
        valid = cap > 0
        total = np.where(
            valid, score_candidates(state, shape, ALL, valid.astype(np.int64), valid=valid), -np.inf
        )
        cand = _rows(len(cap))
    else:
        cand = np.flatnonzero(cap)
        total = score_candidates(state, shape, cand, np.ones(n_cand, dtype=np.int64))
    snap = state.snapshot
    total = np.array(total, dtype=np.float64)  # our own copy: tried nodes are marked -inf
    for _ in range(min(_TOGETHER_TRIES, n_cand)):
        i = int(np.argmax(total))  # the best score, the lowest row among equals (as `_fill`)
        if total[i] == -np.inf:
            break
        total[i] = -np.inf
        row = int(cand[i])
        choice = state.profile.chooser.choose(snap, row, shape)
        if choice is None or len(choice.gpus) != shape.gpus:
            continue
        within = 0
        for g in choice.gpus:
            within |= 1 << g
        mark = len(undo)
        out: list[PodPlacement] = []
        for part in parts:
            pods = part.pods[: part.required]
            if _assign(state, part, row, pods, undo, out, within=within) < len(pods):
                break
        else:
            if state.gang.topology_required is not None and "domain" not in state.data:
                state.data["domain"] = int(_level(snap, state.gang.topology_required)[row])
            return parts, out
        _rollback(snap, undo, mark)
    return [], []


def _rollback(snapshot: Snapshot, undo: _Undo, mark: int) -> None:
    """Undo the trial allocations made since `undo` had `mark` entries."""
    while len(undo) > mark:
        alloc, cursor = undo.pop()
        row = alloc.row
        snapshot.unapply(alloc)
        snapshot.port_cursor[row] = cursor


def _place_part(
    state: CycleState, part: RolePart, pods: tuple[PodSlot, ...], undo: _Undo, *, required: bool
) -> list[PodPlacement] | None:
    """Place `pods` of one part; None if `required` and not all of them fit (partial work stays in `undo`)."""
    groups: dict[str | None, list[PodSlot]] = {}
    for pod in pods:
        groups.setdefault(pod.preferred_node, []).append(pod)
    out: list[PodPlacement] = []
    # pods with a preferred node (failover) first, so the plain ones do not take their place
    for preferred in sorted(groups, key=lambda p: (p is None, p or "")):
        state.preferred_node = preferred
        state.part_pods = tuple(groups[preferred])
        got = _fill(state, part, state.part_pods, undo, required=required)
        if got is None:
            return None
        out.extend(got)
    state.preferred_node = None
    return out


def score_candidates(
    state: CycleState,
    shape: PodShape,
    nodes: np.ndarray | slice,
    take: np.ndarray,
    *,
    valid: np.ndarray | None = None,
) -> np.ndarray:
    """Weighted sum of the normalised scores of every score plugin (0 where none has an opinion).

    `nodes` are candidate rows, or `ALL` (every row; `valid` then marks the real candidates,
    over which scores are normalised).
    """
    if len(take) < 2:
        return np.zeros(len(take), dtype=np.float64)
    opinions = []
    for plugin, weight in state.profile.scores:
        raw = plugin.score(state, shape, nodes, take)
        if raw is not None:
            opinions.append((plugin, weight, raw))
    if len(opinions) == 1 and (
        not hasattr(opinions[0][0], "normalize") or getattr(opinions[0][0], "normalize_keeps_order", False)
    ):
        return np.asarray(opinions[0][2], dtype=np.float64)  # one opinion: its order is the answer
    total = np.zeros(len(take), dtype=np.float64)
    for plugin, weight, raw in opinions:
        scale = getattr(plugin, "normalize", normalize)  # a plugin may bring its own (NormalizeScore)
        total += weight * scale(np.asarray(raw, dtype=np.float64), valid=valid)
    return total


_ROWS: dict[int, np.ndarray] = {}


def _rows(n: int) -> np.ndarray:
    rows = _ROWS.get(n)
    if rows is None:
        if len(_ROWS) > 16:
            _ROWS.clear()
        rows = _ROWS[n] = np.arange(n)
    return rows


def _fill(
    state: CycleState, part: RolePart, pods: tuple[PodSlot, ...], undo: _Undo, *, required: bool
) -> list[PodPlacement] | None:
    rules = state.data.get(RULES)
    if rules is not None:
        return _fill_each(state, rules, part, pods, undo, required=required)
    shape = part.shape
    want = len(pods)
    state.want = want
    cap_all = capacity(state, shape)
    if cap_all.dtype == bool:  # the filters answered "can take one" (state.want == 1)
        cap_all = cap_all.astype(np.int64)
    if state.gang.topology_required is not None:
        cap_all = _required_domain(state, cap_all, want)
    n_cand = int(np.count_nonzero(cap_all))
    if n_cand == 0:
        return None if required else []
    if required and want > 1 and int(cap_all.sum()) < want:
        return None
    if 4 * n_cand >= len(cap_all):
        # most nodes are candidates: work on whole arrays (views), not gathered copies
        cand = _rows(len(cap_all))
        nodes: np.ndarray | slice = ALL
        caps = cap_all
        take = np.minimum(caps, want)
        valid = caps > 0
        total = np.where(valid, score_candidates(state, shape, ALL, take, valid=valid), -np.inf)
    else:
        cand = nodes = np.flatnonzero(cap_all)
        caps = cap_all[cand]
        take = np.minimum(caps, want)
        total = score_candidates(state, shape, cand, take)
    out: list[PodPlacement] = []
    if state.profile.fill_for(shape) == "spread":
        _spread(state, part, pods, cand, caps, total, undo, out, nodes=nodes)
    elif shape.flexible and want > 1:
        _pack_flexible(state, part, pods, cand, caps, total, undo, out)
    else:
        _pack(state, part, pods, cand, caps, total, undo, out)
    if required and len(out) < want:
        return None
    if state.gang.topology_required is not None and out and "domain" not in state.data:
        state.data["domain"] = int(_level(state.snapshot, state.gang.topology_required)[out[0].row])
    return out


_EACH_TRIES = 3  # nodes tried (best score first) per pod when the GPU chooser refuses one
_DOMAIN_TRIES = 8  # required network domains tried (tightest first) for a part placed pod by pod


def _fill_each(
    state: CycleState,
    rules: RulesContext,
    part: RolePart,
    pods: tuple[PodSlot, ...],
    undo: _Undo,
    *,
    required: bool,
) -> list[PodPlacement] | None:
    """`_fill_one_by_one`, inside the gang's required network domain when it has one: a part that
    chooses it tries the domains with room for it, tightest first, until the rules let it in."""
    level = state.gang.topology_required
    if level is None or "domain" in state.data:
        return _fill_one_by_one(state, rules, part, pods, undo, required=required)
    want = len(pods)
    state.want = want
    room = capacity(state, part.shape).astype(np.int64)
    state.want = 1
    domains = _level(state.snapshot, level)
    labelled = domains >= 0
    sums = np.bincount(domains[labelled], weights=np.minimum(room[labelled], want), minlength=1)
    fitting = np.flatnonzero(sums >= (want if required else 1))
    if not len(fitting):
        _required_domain(state, room, want)  # notes why no domain can hold the part
        return None if required else []
    mark = len(undo)
    for domain in fitting[np.argsort(sums[fitting], kind="stable")][:_DOMAIN_TRIES].tolist():
        state.data["domain"] = int(domain)
        got = _fill_one_by_one(state, rules, part, pods, undo, required=required)
        if got is not None and (got or not required):
            return got
        _rollback(state.snapshot, undo, mark)
    state.data.pop("domain", None)
    return None if required else []


def _fill_one_by_one(
    state: CycleState,
    rules: RulesContext,
    part: RolePart,
    pods: tuple[PodSlot, ...],
    undo: _Undo,
    *,
    required: bool,
) -> list[PodPlacement] | None:
    """One pod at a time, filters and scores run again for each (kube-scheduler's order), so the
    inter-pod rules see the gang's pods placed before it; the best-scored node that passes."""
    shape = part.shape
    out: list[PodPlacement] = []
    state.want = 1
    try:
        for pod in pods:
            rules.pod = pod
            cap = capacity(state, shape).astype(np.int64)
            if state.gang.topology_required is not None:
                cap = _required_domain(state, cap, 1)  # inside the domain `_fill_each` chose
            cand = np.flatnonzero(cap)
            if len(cand):
                total = score_candidates(state, shape, cand, np.ones(len(cand), dtype=np.int64))
                order = np.argsort(-np.asarray(total, dtype=np.float64), kind="stable")[:_EACH_TRIES]
                if any(_assign(state, part, int(cand[i]), (pod,), undo, out) for i in order):
                    continue
            if required:  # say why while the pods before it still hold their trial places
                why = "; ".join(f.explain(state, shape, failed) for f, failed, _ in breakdown(state, shape))
                state.data["each_failure"] = (
                    f"pod {len(out) + 1} of {len(pods)} ({pod.name}) fits no node once the "
                    f"{len(out)} before it {'is' if len(out) == 1 else 'are'} placed"
                    + (f": {why}" if why else "")
                )
            break
    finally:
        rules.pod = None
    if required and len(out) < len(pods):
        return None
    return out


def _pack(
    state: CycleState,
    part: RolePart,
    pods: tuple[PodSlot, ...],
    cand: np.ndarray,
    caps: np.ndarray,
    total: np.ndarray,
    undo: _Undo,
    out: list[PodPlacement],
) -> None:
    caps = caps.copy()
    remaining = len(pods)
    block_chosen = False
    if remaining == 1:  # every candidate fits one pod: the best score wins
        i = int(np.argmax(total))
        if _assign(state, part, int(cand[i]), pods, undo, out):
            return
        caps[i] = 0  # the GPU chooser refused this node: go on with the others
    while remaining > 0:
        fit_all = np.flatnonzero(caps >= remaining)
        if len(fit_all):
            i = int(fit_all[np.argmax(total[fit_all])])  # among the nodes that take all (even at -inf)
        else:
            if not block_chosen:
                block_chosen = True
                _restrict_to_block(state, cand, caps, remaining)
            if not caps.any():
                return
            # the node that takes the most; among equals the best score
            i = int(np.lexsort((-total, -caps))[0])
        n = int(min(caps[i], remaining))
        start = len(pods) - remaining
        got = _assign(state, part, int(cand[i]), pods[start : start + n], undo, out)
        remaining -= got
        caps[i] = 0
        if not caps.any():
            return


def _level(snap: Snapshot, level: str) -> np.ndarray:
    """Each row's domain at `level`: its spine, its block, or (`node`) the row itself."""
    if level == "node":
        return _rows(len(snap.block))
    return snap.spine if level == "spine" else snap.block


def _restrict_to_block(state: CycleState, cand: np.ndarray, caps: np.ndarray, remaining: int) -> None:
    """When the group spans nodes, keep it inside the smallest network domain that can hold it all:
    the tightest block, else the tightest spine (`topology-preferred: spine` skips blocks)."""
    snap = state.snapshot
    levels = ("spine",) if state.gang.topology_preferred == "spine" else ("block", "spine")
    for level in levels:
        names = snap.spine_names if level == "spine" else snap.block_names
        if not names:
            continue
        domains = _level(snap, level)[cand]
        labelled = domains >= 0
        if not labelled.any():
            continue
        sums = np.bincount(domains[labelled], weights=caps[labelled], minlength=len(names))
        fitting = np.flatnonzero(sums >= remaining)
        if not len(fitting):
            continue
        chosen = int(fitting[np.argmin(sums[fitting])])  # the tightest domain that holds the rest
        if state.preferred_node is not None:
            row = snap.index.get(state.preferred_node)
            dom = _level(snap, level)
            if row is not None and dom[row] >= 0 and sums[dom[row]] >= remaining:
                chosen = int(dom[row])
        caps[domains != chosen] = 0
        return


def _required_domain(state: CycleState, cap_all: np.ndarray, want: int) -> np.ndarray:
    """Zero the nodes outside the gang's required domain (chosen by its first part: the tightest
    domain that can hold that part); notes why when no single domain can."""
    level = state.gang.topology_required or "block"
    domains = _level(state.snapshot, level)
    chosen = state.data.get("domain")
    if chosen is not None:
        return np.where(domains == chosen, cap_all, 0)
    cap_all = np.where(domains >= 0, cap_all, 0)
    if int(cap_all.max(initial=0)) >= want:
        return cap_all  # one node holds the part: its domain becomes the gang's
    labelled = domains >= 0
    sums = np.bincount(domains[labelled], weights=np.minimum(cap_all[labelled], want), minlength=1)
    fitting = np.flatnonzero(sums >= want)
    if not len(fitting):
        most = int(sums.max(initial=0))
        state.data["topology_note"] = (
            f"topology-required {level}: no single {level} has room for the {want} pods "
            f"(the most one {level} can take now: {most})"
        )
        return np.zeros_like(cap_all)
    chosen = int(fitting[np.argmin(sums[fitting])])
    return np.where(domains == chosen, cap_all, 0)


def _pack_flexible(
    state: CycleState,
    part: RolePart,
    pods: tuple[PodSlot, ...],
    cand: np.ndarray,
    caps: np.ndarray,
    total: np.ndarray,
    undo: _Undo,
    out: list[PodPlacement],
) -> None:
    """One-GPU data-parallel workers in any split: one node if one can take them all, else the
    two-node split with the best modelled all-reduce bandwidth, else fewest nodes; the workers
    co-located on a node share one best GPU set (table pick for the count placed there)."""
    snap = state.snapshot
    shape = part.shape
    want = len(pods)
    caps = caps.copy()
    fit_all = caps >= want
    plan: list[tuple[int, int]] = []
    if fit_all.any():
        i = int(np.argmax(np.where(fit_all, total, -np.inf)))
        plan = [(int(cand[i]), want)]
    else:
        _restrict_to_block(state, cand, caps, want)
        found = best_split(snap, shape, rows=cand, caps=caps, scores=total, want=want)
        if found is not None:
            plan = found[0]
            state.data["split_gbps"] = found[1]
    if not plan:
        order = np.lexsort((-total, -caps))
        left = want
        for i in order.tolist():
            if left <= 0 or caps[i] <= 0:
                break
            n = int(min(caps[i], left))
            plan.append((int(cand[i]), n))
            left -= n
    pos = 0
    for row, n in plan:
        within = colocated_set(snap, row, shape, n)
        got = _assign(state, part, row, pods[pos : pos + n], undo, out, within=within)
        pos += got
        if got < n:
            return


def _topology_notes(state: CycleState, part: RolePart) -> list[str]:
    """Why topology rules refused nodes, and whether a flexible split would fit now (on the
    snapshot as it is, every trial allocation undone)."""
    notes = []
    note = state.data.get("topology_note")
    if note:
        notes.append(f"{note}.")
    refusals = getattr(state.profile.chooser, "refusals", {}).get(part.shape)
    if refusals:
        shown = "; ".join(f"{node}: {why}" for node, why in sorted(refusals.items())[:4])
        notes.append(f"Topology refused {len(refusals)} node{'s' if len(refusals) != 1 else ''}: {shown}.")
    shape = part.shape
    if shape.gpus > 1 and not shape.shared and part.required > 1:
        split = _flexible_alternative(state, part)
        if split:
            notes.append(
                f"As {part.required * shape.gpus} one-GPU workers it would fit now as "
                f"{'+'.join(str(n) for n in split)}; annotate the job "
                f'gpuyard.io/flexible-shape: "true" with one-GPU workers to allow such splits.'
            )
    return notes


def _flexible_alternative(state: CycleState, part: RolePart) -> list[int] | None:
    shape = part.shape
    total = part.required * shape.gpus
    one = replace(
        shape,
        gpus=1,
        cpu_milli=-(-shape.cpu_milli // shape.gpus),
        mem_mib=-(-shape.mem_mib // shape.gpus),
        ext=tuple((name, -(-amount // shape.gpus)) for name, amount in shape.ext),
        flexible=True,
    )
    state.want = total
    cap = capacity(state, one)
    cap = np.sort(np.minimum(cap.astype(np.int64), total))[::-1]
    used = np.cumsum(cap)
    enough = np.flatnonzero(used >= total)
    if not len(enough) or int(enough[0]) + 1 > part.required:
        return None
    split = [int(c) for c in cap[: int(enough[0]) + 1]]
    split[-1] -= int(used[enough[0]]) - total
    return sorted(split)


_RESCORE_LIMIT = 64


def _spread(
    state: CycleState,
    part: RolePart,
    pods: tuple[PodSlot, ...],
    cand: np.ndarray,
    caps: np.ndarray,
    total: np.ndarray,
    undo: _Undo,
    out: list[PodPlacement],
    *,
    nodes: np.ndarray | slice,
) -> None:
    """One pod at a time on the best node, scores recomputed after each (least-allocated moves);
    for large groups, one pod per node round-robin in the first ranking."""
    caps = caps.copy()
    if len(pods) > _RESCORE_LIMIT:
        _deal(state, part, pods, cand, caps, total, undo, out)
        return
    shape = part.shape
    valid = caps > 0
    pos = 0
    while pos < len(pods) and valid.any():
        if pos:
            take = valid.astype(np.int64)
            scores = score_candidates(state, shape, nodes, take, valid=valid if nodes is ALL else None)
            total = np.where(valid, scores, -np.inf)
        i = int(np.argmax(np.where(valid, total, -np.inf)))
        got = _assign(state, part, int(cand[i]), pods[pos : pos + 1], undo, out)
        caps[i] -= 1
        if not got or caps[i] <= 0:
            valid[i] = False
        pos += got


def _deal(
    state: CycleState,
    part: RolePart,
    pods: tuple[PodSlot, ...],
    cand: np.ndarray,
    caps: np.ndarray,
    total: np.ndarray,
    undo: _Undo,
    out: list[PodPlacement],
) -> None:
    order = np.argsort(-total, kind="stable")
    want = len(pods)
    counts = np.zeros(len(cand), dtype=np.int64)
    left = caps[order].copy()
    dealt = 0
    while dealt < want and left.any():
        room = np.flatnonzero(left > 0)
        room = room[: want - dealt]
        counts[order[room]] += 1
        left[room] -= 1
        dealt += len(room)
    pos = 0
    for i in order:
        n = int(counts[i])
        if n:
            got = _assign(state, part, int(cand[i]), pods[pos : pos + n], undo, out)
            pos += got
            if got < n:  # the chooser refused: later nodes cannot make up in this simple deal
                break


def _assign(
    state: CycleState,
    part: RolePart,
    row: int,
    pods: tuple[PodSlot, ...],
    undo: _Undo,
    out: list[PodPlacement],
    *,
    within: int | None = None,
) -> int:
    """Give each pod GPUs (chooser) and host ports on `row`, applying it to the snapshot; return how many.

    `within` (a GPU mask) keeps the pods' GPUs inside one set, for choosers that support it.
    """
    snap = state.snapshot
    shape = part.shape
    chooser = state.profile.chooser
    node = snap.names[row] or ""
    done = 0
    for pod in pods:
        choice = (
            chooser.choose(snap, row, shape)
            if within is None
            else chooser.choose(snap, row, shape, within=within)
        )
        if choice is None:
            break
        ports: tuple[int, ...] = ()
        if shape.host_ports:
            got = snap.take_ports(row, shape.host_ports)
            if got is None:
                break
            ports = got
        gpu_mem = 0
        if shape.shared and choice.gpus:
            gpu_mem = int(snap.share_memory(row, shape)[choice.gpus[0]])
        alloc = Alloc(
            node=node,
            cpu=shape.cpu_milli,
            mem=shape.mem_mib,
            gpus=choice.gpus,
            gpu_milli=shape.gpu_milli if choice.gpus else 0,
            gpu_mem=gpu_mem,
            ext=shape.ext,
            ports=ports,
            nics=choice.nics,
        )
        cursor = int(snap.port_cursor[row])
        snap.apply(alloc, row=row)
        undo.append((alloc, cursor))
        rules = state.data.get(RULES)
        if rules is not None:  # later pods of the gang see this one (inter-pod rules)
            rules.record(alloc, pod, shape)
        out.append(
            PodPlacement(
                pod=pod,
                node=node,
                row=row,
                gpus=choice.gpus,
                gpu_ids=tuple(snap.gpu_id(row, g) for g in choice.gpus),
                gpu_milli=alloc.gpu_milli,
                nics=choice.nics,
                host_ports=ports,
                shape=shape,
                requests=part.requests,
            )
        )
        done += 1
    return done
