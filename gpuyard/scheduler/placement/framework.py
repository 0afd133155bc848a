"""The scheduling framework: extension points, the per-attempt state, profiles and plugin registries.

After kube-scheduler's framework, per pod *shape* (identical pods of a role are handled
together): `Filter` (vectorised: a bool mask over nodes, or how many pods of the shape each node
can take), `Score` (one number per candidate node, normalised to 0..100, weighted) and the GPU
chooser (which GPUs of the chosen node: a best-subset table lookup). Gang-level decisions are
not plugins: quota and queue admission come before placement (`gatekeeping`), preemption and
reclaim after it (`preempting`).

A :class:`Profile` is one configured set of plugins. Plugins and profiles are looked up by name
in a :class:`~gpuyard.scheduler.placement.registry.PluginRegistry` (the built-ins are listed in
`profiles.builtin_registry`; nothing registers itself on import), and `profiles.build_profile`
assembles a profile from its name, the configured weights and a registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, TypeVar, runtime_checkable

import numpy as np

from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.gangs.requests import GangRequest, PodShape, PodSlot

__all__ = [
    "ALL",
    "CycleState",
    "Fill",
    "FilterPlugin",
    "GPUChoice",
    "GPUChooser",
    "N",
    "Named",
    "Profile",
    "ProfileSpec",
    "ScorePlugin",
    "no_args",
]

Fill = Literal["pack", "spread"]

ALL = slice(None)
"""Passed as `nodes` to score plugins when every row is a candidate: `arr[nodes]` is then a view."""


class CycleState:
    """Per-attempt scratch shared by the plugins of one `place()` call.

    `part_pods` are the pods of the group being placed now (for plugins that look at pod names,
    e.g. failover's preferred node); `data` is free-form plugin storage for this attempt.
    """

    __slots__ = ("data", "gang", "part_pods", "preferred_node", "profile", "rng", "snapshot", "want")

    def __init__(self, snapshot: Snapshot, gang: GangRequest, profile: Profile) -> None:
        self.snapshot = snapshot
        self.gang = gang
        self.profile = profile
        self.rng = profile.rng
        self.data: dict[str, Any] = {}
        self.part_pods: tuple[PodSlot, ...] = ()
        self.preferred_node: str | None = None
        self.want = 1
        """How many pods of the current shape are being placed: a filter may answer a plain mask
        when it is 1 (cheaper than counting)."""


# --- pod-level plugins ------------------------------------------------------------------------


@runtime_checkable
class FilterPlugin(Protocol):
    """Which nodes can host pods of `shape` now.

    `filter` returns a bool[N] mask (node passes), an int[N] count (how many pods of the shape
    the node can take, exact integer arithmetic), or None (no opinion for this shape). `explain`
    says in words why the `failed` nodes (bool[N], those this filter was first to reject) fail.
    """

    name: str

    def filter(self, state: CycleState, shape: PodShape) -> np.ndarray | None: ...

    def explain(self, state: CycleState, shape: PodShape, failed: np.ndarray) -> str: ...


@runtime_checkable
class ScorePlugin(Protocol):
    """A raw score per candidate node (higher is better), or None when the plugin has no opinion.

    `nodes` are candidate rows (an index array) or `ALL` (every row, when most rows are
    candidates): index snapshot arrays with it (`snap.cpu_free[nodes]`) and use `len(take)` for
    the number of scores to return. `take` is how many pods of the group each would receive.
    Raw scores are min-max normalised to 0..100 over the candidates and multiplied by the weight;
    a plugin with a method `normalize(raw, *, valid=None) -> float[...]` (kube-scheduler's
    NormalizeScore) scales its own scores instead (`valid` marks the real candidates when
    `nodes` is `ALL`).
    """

    name: str

    def score(
        self, state: CycleState, shape: PodShape, nodes: np.ndarray | slice, take: np.ndarray
    ) -> np.ndarray | None: ...


@dataclass(frozen=True, slots=True)
class GPUChoice:
    gpus: tuple[int, ...]
    nics: tuple[str, ...] = ()


@runtime_checkable
class GPUChooser(Protocol):
    """Which GPUs (and NICs) of node `row` one pod of `shape` gets; None if it cannot be served there."""

    name: str

    def choose(
        self, snapshot: Snapshot, row: int, shape: PodShape, *, within: int | None = None
    ) -> GPUChoice | None:
        """`within`: a bit mask the pod's GPUs must come from (a gang's chosen set), or None."""
        ...


# --- profiles ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    """A named recipe: score plugins with weights, how groups are filled, the chooser.

    `fill` is "pack" (as many pods on the best node as fit, then the next: fewest nodes),
    "spread" (one pod per node round-robin by score), or "auto" (pack GPU pods, spread CPU-only
    pods).
    """

    scores: Mapping[str, float]
    fill: Literal["pack", "spread", "auto"] = "auto"
    filters: tuple[str, ...] = ()
    chooser: str = "lowest-index"
    description: str = ""


@dataclass(slots=True)
class Profile:
    """A ready-to-use plugin set (built by `profiles.build_profile`)."""

    name: str
    filters: list[FilterPlugin]
    scores: list[tuple[ScorePlugin, float]]
    chooser: GPUChooser
    fill: Literal["pack", "spread", "auto"] = "auto"
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    cache: dict[Any, Any] = field(default_factory=dict)
    """Per-profile cache of static filter masks (see `filtering`)."""
    topology_wait: float = 0.0
    """Seconds a gang of one-GPU workers with no topology policy waits for one node before it
    is split (`scheduler.topology_wait_seconds`; 0: it never waits; `cycle/topowait.py`)."""

    def fill_for(self, shape: PodShape) -> Fill:
        if self.fill == "auto":
            return "pack" if shape.gpus else "spread"
        return self.fill


class Named(Protocol):
    """A plugin class with its registered name as a class attribute."""

    name: ClassVar[str]


N = TypeVar("N", bound=Named)


def no_args(cls: type[N], what: str = "plugin") -> Callable[[Mapping[str, Any]], N]:
    """A factory for a plugin class that takes no arguments (`what` names it in the error)."""

    def make(args: Mapping[str, Any]) -> N:
        if args:
            raise ValueError(f"{what} {cls.name!r} takes no arguments, got {sorted(args)}")
        return cls()

    return make
