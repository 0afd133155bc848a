"""Named profiles (plugin sets), the plugin registries, and how a configured profile is built.

`settings.scheduler.profile` picks a profile by name; `settings.scheduler.plugins` (score plugin
name -> weight) overrides or adds score weights (0 switches a plugin off). Plugin arguments come
from `settings.scheduler.plugin_args` (name -> keyword arguments) when the config has it.

Built-in profiles:

* `default` — GPU binpacking, exact fit for multi-GPU pods, CPU-only pods spread and kept out of
  GPU nodes' reserve, GPU-type preference, failover to the previous node, topology (NVLink
  bandwidth/locality of the GPUs a node would give, fragmentation tie-break); packs GPU pods and
  spreads CPU-only pods; GPUs chosen by the `topology` chooser (best-subset tables). Spot
  replicas go to spot nodes and other pods stay off them while other room exists (`spot`, below
  failover, above topology; also in `binpack` and `spread`).
* `binpack` / `best-fit` — most-allocated over every resource plus the topology scores, packed,
  `topology` chooser;
* `spread` — least-allocated, one pod per node round-robin;
* `first-fit` — the first node (in node order) that fits;
* `random` — a random node that fits (seeded: runs are reproducible);
* `packing` — a GPU packing policy (FGD, gpuyard's, ...; `packing/plugins.py`).

Registries (`registry.PluginRegistry`) are explicit; importing a module registers nothing:

* :func:`builtin_registry` — every built-in filter, score, GPU chooser and profile, listed here
  and nowhere else (a fresh registry per call);
* :data:`USER_PLUGINS` — the default user registry: `register_filter` / `register_score` /
  `register_chooser` / `register_profile` add to it, refusing a name it or the built-ins have;
* :func:`default_registry` — the built-ins merged with the user registry: what
  `build_profile` and `profile_from_settings` use unless given `registry=`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from gpuyard.scheduler.placement.choosing import LowestIndexChooser
from gpuyard.scheduler.placement.filters import (
    DEFAULT_FILTERS,
    GPUClass,
    GPUNodeReserve,
    HeldRoom,
    HostPorts,
    NodeAffinity,
    NodeReady,
    NodeResources,
    NodeUnschedulable,
    TaintToleration,
    gpu_node_reserve,
)
from gpuyard.scheduler.placement.framework import Profile, ProfileSpec, no_args
from gpuyard.scheduler.placement.packing.plugins import (
    PACKING_PROFILE,
    CPUStranding,
    PackingChooser,
    PackingScore,
    packing_score_factory,
)
from gpuyard.scheduler.placement.podaffinity import InterPodAffinity, InterPodAffinityScore
from gpuyard.scheduler.placement.registry import (
    DuplicatePluginError,
    PluginFactory,
    PluginKind,
    PluginRegistry,
)
from gpuyard.scheduler.placement.scores import (
    CPUSpread,
    ExactFit,
    Failover,
    FirstFit,
    GPUBinpack,
    GPUTypePreference,
    LeastAllocated,
    MostAllocated,
    RandomScore,
)
from gpuyard.scheduler.placement.spot import SpotAffinity
from gpuyard.scheduler.placement.spreading import TopologySpread, TopologySpreadScore
from gpuyard.scheduler.placement.topology import FragmentationScore, TopologyChooser, TopologyScore

__all__ = [
    "USER_PLUGINS",
    "build_profile",
    "builtin_registry",
    "default_registry",
    "profile_from_settings",
    "register_chooser",
    "register_filter",
    "register_profile",
    "register_score",
]

DEFAULT_PROFILE = ProfileSpec(
    scores={  # failover > topology > packing > GPU-type preference > tie-breaks
        "failover": 400,
        "spot": 300,  # spot replicas on spot nodes, the other pods off them (`spot.py`)
        "topology": 200,
        "inter-pod-affinity": 100,  # the user's own preferences: above packing
        "pod-topology-spread": 100,
        "packing": 50,
        "exact-fit": 30,  # multi-GPU pods and gangs on the node they fill best: whole nodes stay free
        "gpu-type": 20,
        "cpu-stranding": 5,  # CPU-only pods: strand no GPU, then spread
        "topology-frag": 2,
        "cpu-spread": 1,
    },
    fill="auto",
    chooser="packing-gpus",
    description="binpack GPU pods, exact fit for multi-GPU pods, spread CPU-only pods; "
    "NVLink-aware GPU choice",
)
BINPACK_PROFILE = ProfileSpec(
    scores={"most-allocated": 10, "failover": 100, "spot": 50, "topology": 20, "topology-frag": 2},
    fill="pack",
    chooser="topology",
    description="most-allocated, packed; NVLink-aware GPU choice",
)
SPREAD_PROFILE = ProfileSpec(
    scores={"least-allocated": 10, "failover": 100, "spot": 50},
    fill="spread",
    description="least-allocated, one per node",
)
FIRST_FIT_PROFILE = ProfileSpec(scores={"first-fit": 10}, fill="pack", description="first node that fits")
RANDOM_PROFILE = ProfileSpec(scores={"random": 10}, fill="pack", description="a random node that fits")


def builtin_registry() -> PluginRegistry:
    """A fresh registry of every built-in plugin and profile (the one list of them)."""
    reg = PluginRegistry("built-in")
    # filters (their order in a profile is DEFAULT_FILTERS', not this one)
    reg.register_filter(NodeReady.name, no_args(NodeReady, "filter plugin"))
    reg.register_filter(NodeUnschedulable.name, no_args(NodeUnschedulable, "filter plugin"))
    reg.register_filter(NodeAffinity.name, no_args(NodeAffinity, "filter plugin"))
    reg.register_filter(TaintToleration.name, no_args(TaintToleration, "filter plugin"))
    reg.register_filter(GPUClass.name, no_args(GPUClass, "filter plugin"))
    reg.register_filter(NodeResources.name, no_args(NodeResources, "filter plugin"))
    reg.register_filter(HostPorts.name, no_args(HostPorts, "filter plugin"))
    reg.register_filter(GPUNodeReserve.name, gpu_node_reserve)
    reg.register_filter(HeldRoom.name, no_args(HeldRoom, "filter plugin"))
    reg.register_filter(InterPodAffinity.name, no_args(InterPodAffinity, "filter plugin"))
    reg.register_filter(TopologySpread.name, no_args(TopologySpread, "filter plugin"))
    # scores
    reg.register_score(GPUBinpack.name, no_args(GPUBinpack, "score plugin"))
    reg.register_score(ExactFit.name, no_args(ExactFit, "score plugin"))
    reg.register_score(CPUSpread.name, no_args(CPUSpread, "score plugin"))
    reg.register_score(GPUTypePreference.name, no_args(GPUTypePreference, "score plugin"))
    reg.register_score(Failover.name, no_args(Failover, "score plugin"))
    reg.register_score(MostAllocated.name, no_args(MostAllocated, "score plugin"))
    reg.register_score(LeastAllocated.name, no_args(LeastAllocated, "score plugin"))
    reg.register_score(FirstFit.name, no_args(FirstFit, "score plugin"))
    reg.register_score(RandomScore.name, no_args(RandomScore, "score plugin"))
    reg.register_score(TopologyScore.name, no_args(TopologyScore, "score plugin"))
    reg.register_score(FragmentationScore.name, no_args(FragmentationScore, "score plugin"))
    reg.register_score(PackingScore.name, packing_score_factory(PackingScore.name, gpu_only=False))
    reg.register_score("packing-gpu", packing_score_factory("packing-gpu", gpu_only=True))
    reg.register_score(CPUStranding.name, no_args(CPUStranding, "score plugin"))
    reg.register_score(SpotAffinity.name, no_args(SpotAffinity, "score plugin"))
    reg.register_score(InterPodAffinityScore.name, no_args(InterPodAffinityScore, "score plugin"))
    reg.register_score(TopologySpreadScore.name, no_args(TopologySpreadScore, "score plugin"))
    # GPU choosers
    reg.register_chooser(LowestIndexChooser.name, no_args(LowestIndexChooser, "GPU chooser"))
    reg.register_chooser(TopologyChooser.name, no_args(TopologyChooser, "GPU chooser"))
    reg.register_chooser(PackingChooser.name, no_args(PackingChooser, "GPU chooser"))
    # profiles
    reg.register_profile("default", DEFAULT_PROFILE)
    reg.register_profile("binpack", BINPACK_PROFILE)
    reg.register_profile("best-fit", BINPACK_PROFILE)
    reg.register_profile("spread", SPREAD_PROFILE)
    reg.register_profile("first-fit", FIRST_FIT_PROFILE)
    reg.register_profile("random", RANDOM_PROFILE)
    reg.register_profile("packing", PACKING_PROFILE)
    return reg


def _refuse_builtin(kind: PluginKind, name: str) -> None:
    builtin = builtin_registry()
    names: dict[PluginKind, Mapping[str, object]] = {
        "filter plugin": builtin.filters,
        "score plugin": builtin.scores,
        "GPU chooser": builtin.choosers,
        "profile": builtin.profiles,
    }
    if name in names[kind]:
        raise DuplicatePluginError(kind, name, "a built-in")


USER_PLUGINS = PluginRegistry("user")
"""The default user registry (empty until a `register_*` call): merged with the built-ins by
:func:`default_registry`."""


def register_filter(name: str, factory: PluginFactory) -> None:
    """Add a filter plugin to the default user registry; a built-in or taken name is refused."""
    _refuse_builtin("filter plugin", name)
    USER_PLUGINS.register_filter(name, factory)


def register_score(name: str, factory: PluginFactory) -> None:
    """Add a score plugin to the default user registry; a built-in or taken name is refused."""
    _refuse_builtin("score plugin", name)
    USER_PLUGINS.register_score(name, factory)


def register_chooser(name: str, factory: PluginFactory) -> None:
    """Add a GPU chooser to the default user registry; a built-in or taken name is refused."""
    _refuse_builtin("GPU chooser", name)
    USER_PLUGINS.register_chooser(name, factory)


def register_profile(name: str, spec: ProfileSpec) -> None:
    """Add a profile to the default user registry; a built-in or taken name is refused."""
    _refuse_builtin("profile", name)
    USER_PLUGINS.register_profile(name, spec)


def default_registry() -> PluginRegistry:
    """The built-ins and the default user registry's plugins, as one (new) registry."""
    return builtin_registry().merged(USER_PLUGINS, label="default")


def _make(table: Mapping[str, Any], kind: str, name: str, args: Mapping[str, Mapping[str, Any]]) -> Any:
    factory = table.get(name)
    if factory is None:
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}")
    return factory(dict(args.get(name, {})))


def build_profile(
    name: str = "default",
    *,
    weights: Mapping[str, float] | None = None,
    args: Mapping[str, Mapping[str, Any]] | None = None,
    seed: int = 0,
    registry: PluginRegistry | None = None,
) -> Profile:
    """The profile `name` of `registry` (default: :func:`default_registry`) with score `weights`
    overriding its own; ValueError names unknown plugins."""
    reg = default_registry() if registry is None else registry
    profiles, scores = reg.profiles, reg.scores
    spec = profiles.get(name)
    if spec is None:
        raise ValueError(f"unknown scheduler profile {name!r}; known: {', '.join(sorted(profiles))}")
    args = args or {}
    merged = dict(spec.scores)
    for plugin, weight in (weights or {}).items():
        if plugin not in scores:
            raise ValueError(
                f"unknown score plugin {plugin!r} in scheduler.plugins; known: {', '.join(sorted(scores))}"
            )
        if weight < 0:
            raise ValueError(f"scheduler.plugins.{plugin}: weight must not be negative, got {weight}")
        merged[plugin] = weight
    filters = [_make(reg.filters, "filter plugin", f, args) for f in (spec.filters or DEFAULT_FILTERS)]
    scored = [(_make(scores, "score plugin", s, args), float(w)) for s, w in merged.items() if w > 0]
    profile = Profile(
        name=name,
        filters=filters,
        scores=scored,
        chooser=_make(reg.choosers, "GPU chooser", spec.chooser, args),
        fill=spec.fill,
        rng=np.random.default_rng(seed),
    )
    link = getattr(profile.chooser, "link", None)
    if link is not None:  # a chooser that follows a score plugin's decisions (packing)
        link([plugin for plugin, _ in scored])
    return profile


def profile_from_settings(settings: Any, *, registry: PluginRegistry | None = None) -> Profile:
    """The profile a `Settings` object configures (`scheduler.profile`, `.plugins`, `.plugin_args`),
    from `registry` (default: :func:`default_registry`)."""
    sched = settings.scheduler
    profile = build_profile(
        sched.profile,
        weights=sched.plugins,
        args=getattr(sched, "plugin_args", None) or {},
        seed=int(getattr(sched, "seed", 0) or 0),
        registry=registry,
    )
    profile.topology_wait = float(getattr(sched, "topology_wait_seconds", 0.0) or 0.0)
    return profile
