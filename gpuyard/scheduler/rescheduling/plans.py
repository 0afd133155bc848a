"""The rescheduler's pure planner: which running jobs to move so a waiting multi-GPU job fits.

Plain data in, a :class:`DefragPlan` out; no store, no snapshot, no clock (the caller,
`rescheduling.py`, reads those). A waiting job asks for `pods` pods of `gpus` whole GPUs each,
every pod on one node. It is *blocked only by fragmentation* when the free GPUs of the nodes it
may use add up to what it needs but fewer than `pods` of them have `gpus` free GPUs each (and
the CPU and memory to go with them).

For each pod that does not fit, every node big enough is a candidate *target*: the cheapest set
of movable jobs on it (all of a mover's pods on that node) whose GPUs, with the node's free
ones, make `gpus` free, such that every pod of those movers finds a *destination*: another node,
not a target, with as many free GPUs and enough CPU and memory (best fit: the node with the
fewest free GPUs that still fit, so moving does not fragment more). The target with the
cheapest such set wins (ties: fewer movers, then the node name); its room and the destinations'
are then taken, and the next pod is planned the same way.

The cost of moving a job is :func:`migration_cost`: its GPUs x the hours since its last
checkpoint (`checkpoint_interval`: the time since the last multiple of it; without it, its whole
run so far), i.e. the GPU-hours of work the move throws away.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import combinations

__all__ = [
    "DefragPlan",
    "Move",
    "Mover",
    "MoverPod",
    "NodeRoom",
    "Waiting",
    "blocked_by_fragmentation",
    "migration_cost",
    "plan_defrag",
]

Key = tuple[str, str]
EXACT_LIMIT = 12
"""Movers on one node up to which every subset is tried; above it, cheapest per GPU first."""


def migration_cost(*, gpus: int, runtime_s: float, checkpoint_interval_s: float | None = None) -> float:
    """GPU-hours lost by restarting a job of `gpus` GPUs that has run `runtime_s` seconds."""
    runtime_s = max(0.0, runtime_s)
    lost = runtime_s % checkpoint_interval_s if checkpoint_interval_s else runtime_s
    return gpus * lost / 3600.0


@dataclass(frozen=True, slots=True)
class NodeRoom:
    """A node as the planner sees it: its free GPU indices, CPU (milli) and memory (MiB) free."""

    name: str
    free: tuple[int, ...]
    gpus: int  # healthy GPUs in all
    cpu_free: int = 0
    mem_free: int = 0


@dataclass(frozen=True, slots=True)
class MoverPod:
    name: str
    node: str
    gpus: tuple[int, ...]
    cpu: int = 0
    mem: int = 0


@dataclass(frozen=True, slots=True)
class Mover:
    """A running job that may be moved (every pod on one node), and what moving it costs."""

    key: Key
    pods: tuple[MoverPod, ...]
    cost: float  # GPU-hours lost

    @property
    def node(self) -> str:
        return self.pods[0].node

    @property
    def gpus(self) -> int:
        return sum(len(p.gpus) for p in self.pods)


@dataclass(frozen=True, slots=True)
class Waiting:
    """A waiting job: `pods` pods of `gpus` GPUs each (CPU milli and memory MiB per pod)."""

    key: Key
    gpus: int
    pods: int = 1
    cpu: int = 0
    mem: int = 0
    nodes: frozenset[str] | None = None  # the nodes it may use (None: every node)


@dataclass(frozen=True, slots=True)
class Move:
    job: Key
    pod: str
    from_node: str
    from_gpus: tuple[int, ...]
    to_node: str
    to_gpus: tuple[int, ...]
    cost: float  # the mover's cost, on its first pod's move (0 on the others)


@dataclass(slots=True)
class DefragPlan:
    """Moves that free room for `beneficiary` on `targets` (one target node per pod that did not fit)."""

    beneficiary: Key
    targets: list[str] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)

    @property
    def cost(self) -> float:
        return sum(m.cost for m in self.moves)

    @property
    def movers(self) -> list[Key]:
        return list(dict.fromkeys(m.job for m in self.moves))


class _Room:
    """Free GPUs, CPU and memory per node while a plan is built."""

    def __init__(self, nodes: Iterable[NodeRoom]) -> None:
        self.free = {n.name: set(n.free) for n in nodes}
        self.cpu = {n.name: n.cpu_free for n in nodes}
        self.mem = {n.name: n.mem_free for n in nodes}
        self.size = {n.name: n.gpus for n in nodes}

    def fits(self, node: str, gpus: int, cpu: int, mem: int) -> bool:
        return len(self.free[node]) >= gpus and self.cpu[node] >= cpu and self.mem[node] >= mem

    def copy(self) -> _Room:
        out = _Room(())
        out.free = {k: set(v) for k, v in self.free.items()}
        out.cpu, out.mem, out.size = dict(self.cpu), dict(self.mem), dict(self.size)
        return out


def _usable(w: Waiting, names: Iterable[str], room: _Room) -> list[str]:
    return sorted(n for n in names if (w.nodes is None or n in w.nodes) and room.size[n] >= w.gpus)


def blocked_by_fragmentation(w: Waiting, nodes: Sequence[NodeRoom]) -> bool:
    """Enough GPUs free in all on the nodes `w` may use, but not `gpus` of them on enough nodes."""
    room = _Room(nodes)
    usable = _usable(w, room.free, room)
    fitting = sum(1 for n in usable if room.fits(n, w.gpus, w.cpu, w.mem))
    total = sum(len(room.free[n]) for n in usable)
    return w.gpus > 1 and fitting < w.pods and total >= w.gpus * w.pods


def _destinations(
    movers: Sequence[Mover], room: _Room, *, avoid: set[str]
) -> list[tuple[MoverPod, str, tuple[int, ...]]] | None:
    """A destination for every pod of `movers` (best fit), taken from `room`; None if one has none."""
    out = []
    for mover in movers:
        for pod in mover.pods:
            k = len(pod.gpus)
            options = [
                n for n in room.free if n not in avoid and n != pod.node and room.fits(n, k, pod.cpu, pod.mem)
            ]
            if not options:
                return None
            best = min(options, key=lambda n: (len(room.free[n]), n))
            gpus = tuple(sorted(room.free[best])[:k])
            room.free[best] -= set(gpus)
            room.cpu[best] -= pod.cpu
            room.mem[best] -= pod.mem
            out.append((pod, best, gpus))
    return out


def _subsets(local: list[Mover], deficit: int) -> Iterable[tuple[Mover, ...]]:
    """Sets of movers with at least `deficit` GPUs, cheapest first (then fewest)."""
    if len(local) <= EXACT_LIMIT:
        found = [
            combo
            for size in range(1, len(local) + 1)
            for combo in combinations(local, size)
            if sum(m.gpus for m in combo) >= deficit
        ]
        found.sort(key=lambda c: (sum(m.cost for m in c), len(c), [m.key for m in c]))
        return found
    greedy: list[Mover] = []
    for m in sorted(local, key=lambda m: (m.cost / max(1, m.gpus), m.key)):
        greedy.append(m)
        if sum(x.gpus for x in greedy) >= deficit:
            return [tuple(greedy)]
    return []


def _one_target(
    w: Waiting, room: _Room, movers: Sequence[Mover], *, taken: set[str], max_movers: int
) -> tuple[str, tuple[Mover, ...], list[tuple[MoverPod, str, tuple[int, ...]]], _Room] | None:
    """The cheapest node to free for one pod of `w`, with its movers and their destinations."""
    by_node: dict[str, list[Mover]] = {}
    for m in movers:
        by_node.setdefault(m.node, []).append(m)
    best: (
        tuple[
            tuple[float, int, str], str, tuple[Mover, ...], list[tuple[MoverPod, str, tuple[int, ...]]], _Room
        ]
        | None
    ) = None
    for node in _usable(w, room.free, room):
        if node in taken:
            continue
        deficit = w.gpus - len(room.free[node])
        local = by_node.get(node, [])
        if deficit <= 0 or not local:
            continue
        for combo in _subsets(local, deficit):
            if len(combo) > max_movers:
                continue
            cost = sum(m.cost for m in combo)
            if best is not None and (cost, len(combo), node) >= best[0]:
                break  # cheapest first: nothing later on this node beats the best
            trial = room.copy()
            for m in combo:  # their GPUs are free once they moved (the destinations are elsewhere)
                for pod in m.pods:
                    trial.free[node] |= set(pod.gpus)
                    trial.cpu[node] += pod.cpu
                    trial.mem[node] += pod.mem
            if not trial.fits(node, w.gpus, w.cpu, w.mem):
                continue
            dests = _destinations(combo, trial, avoid=taken | {node})
            if dests is None:
                continue
            best = ((cost, len(combo), node), node, combo, dests, trial)
            break
    if best is None:
        return None
    return best[1], best[2], best[3], best[4]


def plan_defrag(
    w: Waiting, nodes: Sequence[NodeRoom], movers: Sequence[Mover], *, max_movers: int = 8
) -> DefragPlan | None:
    """The cheapest moves that let `w` start (None when it is not blocked by fragmentation alone,
    or no plan within `max_movers` moved jobs exists); see the module docstring."""
    if not blocked_by_fragmentation(w, nodes):
        return None
    room = _Room(nodes)
    usable = _usable(w, room.free, room)
    taken: set[str] = set()
    plan = DefragPlan(beneficiary=w.key)
    fits_now = [n for n in usable if room.fits(n, w.gpus, w.cpu, w.mem)]
    for node in fits_now[: w.pods]:  # the pods that fit as things are
        taken.add(node)
        room.free[node] = set(sorted(room.free[node])[w.gpus :])
    left = [m for m in movers if m.key != w.key]
    for _ in range(w.pods - min(len(fits_now), w.pods)):
        budget = max_movers - len(plan.movers)
        found = _one_target(w, room, left, taken=taken, max_movers=budget)
        if found is None:
            return None
        node, combo, dests, room = found
        taken.add(node)
        room.free[node] = set(sorted(room.free[node])[w.gpus :])
        plan.targets.append(node)
        for m in combo:
            first = True
            for pod, to, gpus in (d for d in dests if d[0] in m.pods):
                plan.moves.append(
                    Move(
                        job=m.key,
                        pod=pod.name,
                        from_node=pod.node,
                        from_gpus=pod.gpus,
                        to_node=to,
                        to_gpus=gpus,
                        cost=m.cost if first else 0.0,
                    )
                )
                first = False
        moved = {m.key for m in combo}
        left = [m for m in left if m.key not in moved and m.node not in taken]
    return plan if plan.moves else None
