"""The elastic quota tree and its runtime quota, computed as Koordinator does.

Each quota has `min` (guaranteed), `max` (ceiling), a shared weight (its claim on spare
capacity; default: `max`) and may refuse to lend (`allowLentResource: false`). Jobs charge
*request* (pending + running demand) and *used* (admitted) to a leaf. The **runtime quota** is
what a quota may use right now; admission checks `used + request <= runtime` along the path to
the root (`admission.py`), and reclaim takes back what borrowers use above their runtime.

Runtime, per resource, top-down (Koordinator's `runtime_quota_calculator.go`):

1. bottom-up, a quota passes up its *limited request* `min(request, max)`; a parent's request is
   the sum of its children's. (gpuyard: a quota that does not lend passes up at least its
   `min`, since it keeps its min whatever its demand; so the parent accounts for it.)
2. the root's runtime is the cluster total. For every parent, its children's mins are scaled
   down proportionally when they add up to more than the parent's runtime (a shrunken cluster).
3. each child with request > min gets its min and becomes a *borrower*; the others get their
   request (or their min when they do not lend).
4. the spare (`parent runtime - sum of runtimes`) is split among borrowers in proportion to
   their weights, largest remainder first (ties by name), each capped at its request; what a
   capped borrower leaves is split again among the others until nothing is left or nobody wants
   more.

Worked example: 45 spare GPUs, borrowers B, C, D with weights 60/50/80 get 14/12/19; if B
wants only 5 more, the 9 it leaves go C +3, D +6.

Every quota takes part in every resource the cluster or any quota names: a missing `min` is 0,
a missing `max` is unlimited, a missing weight is `max` or 1 where `max` is unlimited.

The tree is plain data and incremental: requests and usage change by deltas (`add_request`,
`add_used`); runtimes are recomputed lazily, at most once per change, and only for the resources
whose requests changed (a GPU-only job leaves CPU and memory alone); within a resource, a parent's
split among its children is done again only when its runtime or a child's limited request moved.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuyard.apis.quotakinds import DEFAULT_QUOTA, ROOT_QUOTA, ElasticQuota
from gpuyard.scheduler.admission.quota.resources import Vector, to_units, vector_of

__all__ = [
    "DEFAULT_QUOTA",
    "ROOT_QUOTA",
    "QuotaSpec",
    "QuotaStatus",
    "QuotaTree",
    "largest_remainder",
    "redistribute",
    "scale_mins",
    "specs_from_quotas",
]


@dataclass(frozen=True, slots=True)
class QuotaSpec:
    """One quota's configuration in quota units (see `resources.py`)."""

    name: str
    parent: str = ROOT_QUOTA
    min: Mapping[str, int] = field(default_factory=dict)
    max: Mapping[str, int] = field(default_factory=dict)
    """A resource not named here is unlimited."""
    shared_weight: Mapping[str, int] | None = None
    """None: the weight is `max` (1 for resources without a max)."""
    allow_lent: bool = True
    is_parent: bool = False
    namespaces: tuple[str, ...] = ()
    """Namespaces whose jobs are charged here."""
    namespace: str = ""
    """The namespace the ElasticQuota object lives in."""

    def weight(self, resource: str) -> int:
        if self.shared_weight is not None:
            return self.shared_weight.get(resource, 0)
        cap = self.max.get(resource)
        return cap if cap is not None else 1


def specs_from_quotas(quotas: Iterable[ElasticQuota]) -> list[QuotaSpec]:
    """QuotaSpecs from ElasticQuota objects (the edge: pydantic in, plain data out)."""
    out = []
    for q in quotas:
        weights = q.shared_weight
        out.append(
            QuotaSpec(
                name=q.metadata.name,
                parent=q.parent_name,
                min=vector_of(q.spec.min),
                max=vector_of(q.spec.max),
                shared_weight={k: to_units(k, v) for k, v in weights.items()}
                if weights is not None
                else None,
                allow_lent=q.allow_lent_resource,
                is_parent=q.is_parent,
                namespaces=tuple(q.covered_namespaces),
                namespace=q.metadata.namespace,
            )
        )
    return out


# --- the split, per resource, as pure functions --------------------------------------------------


def largest_remainder(total: int, weights: Sequence[int], names: Sequence[str]) -> list[int]:
    """`total` split in proportion to `weights`, in integers summing to `total` (Hamilton's method).

    Each gets floor(w * total / W); the units left go one each to the largest remainders, ties
    broken by name. Zero or negative weights get nothing.
    """
    deltas = [0] * len(weights)
    wsum = sum(w for w in weights if w > 0)
    if total <= 0 or wsum <= 0:
        return deltas
    remainders = []
    given = 0
    for i, w in enumerate(weights):
        if w <= 0:
            continue
        q, r = divmod(w * total, wsum)
        deltas[i] = q
        given += q
        remainders.append((-r, names[i], i))
    remainders.sort()
    for _, _, i in remainders[: total - given]:
        deltas[i] += 1
    return deltas


def scale_mins(capacity: int, mins: Sequence[int]) -> list[int]:
    """Mins scaled down proportionally (rounded down) when they add up to more than `capacity`."""
    total = sum(mins)
    if total <= capacity:
        return list(mins)
    if capacity <= 0:
        return [0] * len(mins)
    return [m * capacity // total for m in mins]


def redistribute(
    total: int,
    *,
    requests: Sequence[int],
    mins: Sequence[int],
    weights: Sequence[int],
    lend: Sequence[bool],
    names: Sequence[str],
) -> list[int]:
    """The runtime of each child of a parent whose runtime is `total` (one resource).

    `requests` are the children's limited requests and `mins` their (scaled) mins.
    """
    runtime = [0] * len(requests)
    borrowers: list[int] = []
    spare = total
    for i, (req, lo) in enumerate(zip(requests, mins, strict=True)):
        if req > lo:
            runtime[i] = lo
            borrowers.append(i)
        else:
            runtime[i] = req if lend[i] else lo
        spare -= runtime[i]
    while spare > 0 and borrowers:
        deltas = largest_remainder(spare, [weights[i] for i in borrowers], [names[i] for i in borrowers])
        if not any(deltas):
            break
        spare = 0
        still: list[int] = []
        for i, d in zip(borrowers, deltas, strict=True):
            runtime[i] += d
            if runtime[i] < requests[i]:
                still.append(i)
            else:
                spare += runtime[i] - requests[i]
                runtime[i] = requests[i]
        borrowers = still
    return runtime


# --- the tree ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QuotaStatus:
    """A quota's numbers now, for explanations and status writes."""

    name: str
    parent: str
    min: Vector
    scaled_min: Vector
    max: Vector
    request: Vector
    used: Vector
    non_preemptible_used: Vector
    runtime: Vector
    attached: bool


class _Node:
    __slots__ = (
        "children",
        "contrib",
        "depth",
        "drop",
        "min_eff",
        "name",
        "np_used",
        "parent",
        "request",
        "runtime",
        "spec",
        "split",
        "used",
    )

    def __init__(self, spec: QuotaSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.parent: _Node | None = None
        self.children: list[_Node] = []
        self.depth = 0
        self.drop = 0
        """When some usage of this quota last went down (`QuotaTree.marks`)."""
        self.used: Vector = {}
        self.np_used: Vector = {}
        self.request: Vector = {}
        self.contrib: Vector = {}
        self.min_eff: Vector = {}
        self.runtime: Vector = {}
        self.split: dict[str, tuple[int, list[int]]] = {}
        """Per resource, the inputs of the last split among the children: (runtime, their
        limited requests); the same inputs give the same split."""


_IMPLICIT_DEFAULT = QuotaSpec(name=DEFAULT_QUOTA, shared_weight=None)


class QuotaTree:
    """The quota tree: structure, per-quota request and used, and lazily computed runtimes.

    Usage and requests are kept per quota name independently of the structure, so replacing the
    quota set (`set_quotas`) keeps every job's charge. A quota whose parent chain does not reach
    the root (unknown parent, cycle) is *detached*: it gets no runtime, so nothing is admitted
    to it. A default quota (`koordinator-default-quota`: min 0, no max, weight 1) exists unless
    defined explicitly.
    """

    def __init__(self, quotas: Iterable[QuotaSpec] = (), *, total: Mapping[str, int] | None = None) -> None:
        self._specs: dict[str, QuotaSpec] = {}
        self._total: Vector = dict(total or {})
        self._self_request: dict[str, Vector] = {}
        self._self_used: dict[str, Vector] = {}
        self._self_np_used: dict[str, Vector] = {}
        self._nodes: dict[str, _Node] = {}
        self._order: list[_Node] = []  # attached nodes, parents before children (root first)
        self._attached: set[str] = set()
        self._root = _Node(QuotaSpec(name=ROOT_QUOTA, parent=""))
        self._ns_index: dict[str, str] = {}
        self._resources: set[str] = set()
        self._dirty = True
        self._stale: set[str] | None = None
        """Resources whose runtimes need recomputing; None: all of them (structure or total changed)."""
        self.version = 0
        """Bumped whenever runtimes are recomputed."""
        self.limits = 0
        """Bumped whenever a runtime or a min in force changes value (or the structure does)."""
        self._drops = 0
        self._touched: set[str] | None = None  # quotas whose vectors may have changed; None: all
        self.notes: tuple[int, dict[tuple[str, str], str]] | None = None
        """How each runtime came about, per (quota, resource), as of a version (`admit`'s messages)."""
        self.set_quotas(quotas)

    # --- structure ---------------------------------------------------------------------------

    def set_quotas(self, quotas: Iterable[QuotaSpec]) -> None:
        """Replace the whole quota set (keeps every quota's request and used)."""
        self._specs = {q.name: q for q in quotas if q.name != ROOT_QUOTA}
        self._rebuild()

    def upsert(self, spec: QuotaSpec) -> None:
        self._specs[spec.name] = spec
        self._rebuild()

    def remove(self, name: str) -> None:
        if self._specs.pop(name, None) is not None:
            self._rebuild()

    def set_total(self, total: Mapping[str, int]) -> None:
        """The cluster total (the root's runtime)."""
        new = {k: v for k, v in total.items() if v}
        if new != {k: v for k, v in self._total.items() if v}:
            self._total = new
            self._resources.update(new)
            self._dirty = True
            self._stale = None

    @property
    def total(self) -> Vector:
        return dict(self._total)

    def _rebuild(self) -> None:
        specs = dict(self._specs)
        specs.setdefault(DEFAULT_QUOTA, _IMPLICIT_DEFAULT)
        nodes = {name: _Node(spec) for name, spec in specs.items()}
        root = _Node(QuotaSpec(name=ROOT_QUOTA, parent=""))
        for node in nodes.values():
            parent = root if node.spec.parent == ROOT_QUOTA else nodes.get(node.spec.parent)
            if parent is not None and parent is not node:
                node.parent = parent
        for node in nodes.values():
            if node.parent is not None:
                node.parent.children.append(node)
        for node in nodes.values():
            node.children.sort(key=lambda n: n.name)
        root.children.sort(key=lambda n: n.name)
        order = [root]
        i = 0
        while i < len(order):  # breadth first from the root: only attached nodes, no cycles
            for child in order[i].children:
                child.depth = order[i].depth + 1
                order.append(child)
            i += 1
        self._root, self._nodes, self._order = root, nodes, order
        self._attached = {n.name for n in order[1:]}
        self._ns_index = {}
        living: dict[str, list[str]] = {}
        for spec in sorted(specs.values(), key=lambda s: s.name):
            for ns in spec.namespaces:
                self._ns_index.setdefault(ns, spec.name)
            if spec.namespace and not spec.is_parent and spec.name in self._specs:
                living.setdefault(spec.namespace, []).append(spec.name)
        for ns, names in living.items():
            if len(names) == 1:  # the one quota living in a namespace covers it (scheduler-plugins)
                self._ns_index.setdefault(ns, names[0])
        resources = set(self._total)
        for spec in specs.values():
            resources.update(spec.min, spec.max)
            if spec.shared_weight:
                resources.update(spec.shared_weight)
        for vectors in (self._self_request, self._self_used):
            for v in vectors.values():
                resources.update(v)
        self._resources = resources
        for name, v in self._self_used.items():
            self._charge_path(name, v, self._self_np_used.get(name, {}), sign=1)
        self._dirty = True
        self._stale = None
        self._touched = None

    def _path_nodes(self, name: str) -> list[_Node]:
        """The quota and its ancestors (the root last for an attached quota)."""
        if name == ROOT_QUOTA:
            return [self._root]
        if name in self._attached:
            out = []
            node = self._nodes.get(name)
            while node is not None:
                out.append(node)
                node = node.parent
            return out
        return [self._nodes[name]] if name in self._nodes else []

    def _charge_path(
        self, name: str, delta: Mapping[str, int], np_delta: Mapping[str, int], *, sign: int
    ) -> None:
        path = self._path_nodes(name)
        if not path or path[-1] is not self._root:
            path.append(self._root)  # the cluster is used whatever the quota's state
        dropped = any(sign * v < 0 for v in delta.values()) or any(sign * v < 0 for v in np_delta.values())
        if dropped:
            self._drops += 1
        touched = self._touched
        for node in path:
            if touched is not None:
                touched.add(node.name)
            _add(node.used, delta, sign)
            _add(node.np_used, np_delta, sign)
            if dropped:
                node.drop = self._drops

    # --- demand and usage --------------------------------------------------------------------

    def add_request(self, name: str, delta: Mapping[str, int], *, sign: int = 1) -> None:
        """Pending + running demand charged to quota `name` changes by `sign * delta`."""
        if not any(delta.values()):
            return
        _add(self._self_request.setdefault(name, {}), delta, sign)
        stale = self._stale
        for k, v in delta.items():
            if v:
                if k not in self._resources:  # a new resource: every quota gets it, in order
                    self._resources.add(k)
                    stale = None
                elif stale is not None:
                    stale.add(k)
        self._stale = stale
        self._dirty = True

    def add_used(
        self, name: str, delta: Mapping[str, int], *, preemptible: bool = True, sign: int = 1
    ) -> None:
        """Admitted usage of quota `name` changes by `sign * delta` (and its ancestors')."""
        if not any(delta.values()):
            return
        _add(self._self_used.setdefault(name, {}), delta, sign)
        np_delta = {} if preemptible else delta
        if np_delta:
            _add(self._self_np_used.setdefault(name, {}), np_delta, sign)
        self._resources.update(k for k, v in delta.items() if v)
        self._charge_path(name, delta, np_delta, sign=sign)

    # --- queries -----------------------------------------------------------------------------

    def __contains__(self, name: object) -> bool:
        return name == ROOT_QUOTA or name in self._nodes

    def names(self) -> list[str]:
        return sorted(self._nodes)

    def spec(self, name: str) -> QuotaSpec:
        return self._root.spec if name == ROOT_QUOTA else self._nodes[name].spec

    def guaranteed(self, name: str) -> set[str]:
        """Resources `name`'s `min` names (its guarantee is configured for them). Reclaim is
        owed only within these; others (CPU, memory of a GPU-only quota) count against the
        runtime alone."""
        if name == ROOT_QUOTA or name not in self._nodes:
            return set()
        return set(self._nodes[name].spec.min)

    def children_of(self, name: str) -> list[str]:
        node = self._root if name == ROOT_QUOTA else self._nodes.get(name)
        return [c.name for c in node.children] if node is not None else []

    def has_children(self, name: str) -> bool:
        node = self._root if name == ROOT_QUOTA else self._nodes.get(name)
        return node is not None and bool(node.children)

    def is_attached(self, name: str) -> bool:
        """Whether the quota's parent chain reaches the root (else it gets no runtime)."""
        return name == ROOT_QUOTA or name in self._attached

    def path(self, name: str) -> list[str]:
        """`name`, its parent, ..., the root (for an attached quota; else just `name`)."""
        return [n.name for n in self._path_nodes(name)]

    def quota_for_namespace(self, namespace: str) -> str | None:
        """The quota covering `namespace`: named in its namespaces, else the one quota living there."""
        return self._ns_index.get(namespace)

    @property
    def resources(self) -> list[str]:
        return sorted(self._resources)

    def _node(self, name: str) -> _Node:
        if name == ROOT_QUOTA:
            return self._root
        return self._nodes[name]

    def runtime(self, name: str) -> Vector:
        self.refresh()
        return dict(self._node(name).runtime)

    def used(self, name: str) -> Vector:
        return dict(self._node(name).used)

    def non_preemptible_used(self, name: str) -> Vector:
        return dict(self._node(name).np_used)

    def request(self, name: str) -> Vector:
        self.refresh()
        return dict(self._node(name).request)

    def min(self, name: str) -> Vector:
        """The min in force (scaled down when the cluster is smaller than the mins)."""
        self.refresh()
        return dict(self._node(name).min_eff)

    def excess(self, name: str, request: Mapping[str, int]) -> tuple[str, str, int, int] | None:
        """The first quota on `name`'s path (leaf first) and resource, in `request`'s order, where
        `used + request > runtime`: (quota, resource, used, runtime); None if it fits everywhere.

        The admission hot path: no copies, one dict lookup per quota and resource.
        """
        self.refresh()
        path = self._path_nodes(name)
        for node in path:
            runtime, used = node.runtime, node.used
            for res, amount in request.items():
                if amount > 0:
                    have = used.get(res, 0)
                    if have + amount > runtime.get(res, 0):
                        return node.name, res, have, runtime.get(res, 0)
        return None

    def owed(self, name: str, request: Mapping[str, int]) -> bool:
        """Whether `request` fits in `name`'s min (in force) for every resource its min names, and
        in its runtime for every resource; False when it asks for nothing its min names (reclaim
        is owed only within the guarantee). No copies: the reclaim and parking hot path."""
        if name == ROOT_QUOTA or name not in self._nodes:
            return False
        self.refresh()
        node = self._nodes[name]
        guaranteed, used, lo, rt = node.spec.min, node.used, node.min_eff, node.runtime
        wanted = [(r, a) for r, a in request.items() if a > 0]
        if not any(r in guaranteed for r, _ in wanted):
            return False
        return all(
            (r not in guaranteed or used.get(r, 0) + a <= lo.get(r, 0)) and used.get(r, 0) + a <= rt.get(r, 0)
            for r, a in wanted
        )

    def marks(self, *names: str) -> tuple[int, ...]:
        """What admission answers about these quotas depend on, as far as they can turn to yes:
        (`limits`, when each quota's usage last went down). While the marks stay the same, a
        request that found no room in one of them still finds none (usage only grew there, no
        runtime or min changed), and one not within a quota's min is still not."""
        self.refresh()
        return (self.limits, *(self._node(n).drop for n in names))

    def take_touched(self) -> set[str] | None:
        """The quotas whose runtime, used or request may have changed since the last call (at
        least those that did); None: any of them (the structure, the total or the tree is new)."""
        touched, self._touched = self._touched, set()
        return touched

    def vectors(self, name: str) -> tuple[Vector, Vector, Vector]:
        """(runtime, used, request) of `name`: the tree's own vectors, not copies (read, never
        keep or change them); runtimes as of the last `refresh`."""
        node = self._node(name)
        return node.runtime, node.used, node.request

    def status(self, name: str) -> QuotaStatus:
        self.refresh()
        node = self._node(name)
        return QuotaStatus(
            name=name,
            parent=node.spec.parent,
            min=dict(node.spec.min),
            scaled_min=dict(node.min_eff),
            max=dict(node.spec.max),
            request=dict(node.request),
            used=dict(node.used),
            non_preemptible_used=dict(node.np_used),
            runtime=dict(node.runtime),
            attached=self.is_attached(name),
        )

    # --- the computation ---------------------------------------------------------------------

    def refresh(self) -> bool:
        """Recompute runtimes if anything changed; True if it did."""
        if not self._dirty:
            return False
        if self._stale is None:
            self._compute()
            self.limits += 1
        else:
            for res in sorted(self._stale):
                self._compute_resource(res)
        self._stale = set()
        self._dirty = False
        self.version += 1
        return True

    def _compute(self) -> None:
        """Every resource from scratch."""
        self._touched = None
        for node in self._nodes.values():
            node.request, node.contrib, node.min_eff, node.runtime = {}, {}, {}, {}
            node.split = {}
        root = self._root
        root.request, root.contrib, root.min_eff, root.runtime = {}, {}, {}, {}
        root.split = {}
        for res in sorted(self._resources):
            self._compute_resource(res)
        for node in self._nodes.values():
            if node.name not in self._attached:
                node.runtime = dict.fromkeys(self._resources, 0)
                node.min_eff = dict.fromkeys(self._resources, 0)

    def _compute_resource(self, res: str) -> None:
        """One resource's requests (bottom-up) and runtimes (top-down) of the attached quotas."""
        order, root = self._order, self._root
        # bottom-up: requests and what each quota passes to its parent
        for node in reversed(order):
            req = self._self_request.get(node.name, {}).get(res, 0)
            for child in node.children:
                req += child.contrib.get(res, 0)
            req = max(req, 0)
            if self._touched is not None and node.request.get(res) != req:
                self._touched.add(node.name)
            node.request[res] = req
            cap = node.spec.max.get(res)
            limited = req if cap is None else min(req, cap)
            if not node.spec.allow_lent:
                lo = node.spec.min.get(res, 0)
                limited = max(limited, lo if cap is None else min(lo, cap))
            node.contrib[res] = limited
        # top-down: runtimes
        root.runtime[res] = self._total.get(res, 0)
        root.min_eff[res] = self._total.get(res, 0)
        for node in order:
            kids = node.children
            if not kids:
                continue
            total = node.runtime[res]
            requests = [k.contrib[res] for k in kids]
            inputs = (total, requests)
            if node.split.get(res) == inputs:
                continue  # the children's runtimes and mins stand
            node.split[res] = inputs
            mins = scale_mins(total, [k.spec.min.get(res, 0) for k in kids])
            shares = redistribute(
                total,
                requests=requests,
                mins=mins,
                weights=[k.spec.weight(res) for k in kids],
                lend=[k.spec.allow_lent for k in kids],
                names=[k.name for k in kids],
            )
            for k, lo, share in zip(kids, mins, shares, strict=True):
                if k.runtime.get(res) != share or k.min_eff.get(res) != lo:
                    self.limits += 1
                    if self._touched is not None:
                        self._touched.add(k.name)
                k.min_eff[res] = lo
                k.runtime[res] = share


def _add(into: Vector, delta: Mapping[str, int], sign: int) -> None:
    for k, v in delta.items():
        if v:
            into[k] = into.get(k, 0) + sign * v
