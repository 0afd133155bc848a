"""Named profiles (plugin sets) and how a configured profile is built.

`settings.scheduler.profile` picks a profile by name; `settings.scheduler.plugins` (score plugin
name -> weight) overrides or adds score weights (0 switches a plugin off). Plugin arguments come
from `settings.scheduler.plugin_args` (name -> keyword arguments) when the config has it.

Built-in profiles:

* `default` — GPU binpacking, exact fit for multi-GPU pods, CPU-only pods spread and kept out of
  GPU nodes' reserve, GPU-type preference, failover to the previous node, topology (NVLink
  bandwidth/locality of the GPUs a node would give, fragmentation tie-break); packs GPU pods and
  spreads CPU-only pods; GPUs chosen by the `topology` chooser (best-subset tables).
* `binpack` / `best-fit` — most-allocated over every resource plus the topology scores, packed,
  `topology` chooser;
* `spread` — least-allocated, one pod per node round-robin;
* `first-fit` — the first node (in node order) that fits;
* `random` — a random node that fits (seeded: runs are reproducible).

The GPU-sharing and topology issues register more (`fgd`, `packing`, ...) with `register_profile`
and `register_score`/`register_chooser` in `framework`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from gpuyard.scheduler.placement import choosing as _choosing  # noqa: F401  (registers the GPU choosers)
from gpuyard.scheduler.placement import filters as _filters  # noqa: F401  (registers the filters)
from gpuyard.scheduler.placement import scores as _scores  # noqa: F401  (registers the scores)
from gpuyard.scheduler.placement import topology as _topology  # noqa: F401  (registers the topology plugins)
from gpuyard.scheduler.placement.filters import DEFAULT_FILTERS
from gpuyard.scheduler.placement.framework import (
    CHOOSERS,
    FILTERS,
    PROFILES,
    SCORES,
    Profile,
    ProfileSpec,
    register_profile,
)
from gpuyard.scheduler.placement.packing import plugins as _packing  # noqa: F401  (registers the packing plugins)

__all__ = ["build_profile", "profile_from_settings"]

register_profile(
    "default",
    ProfileSpec(
        scores={  # failover > topology > packing > GPU-type preference > tie-breaks
            "failover": 400,
            "topology": 200,
            "packing": 50,
            "gpu-type": 20,
            "cpu-stranding": 5,  # CPU-only pods: strand no GPU, then spread
            "topology-frag": 2,
            "cpu-spread": 1,
        },
        fill="auto",
        chooser="packing-gpus",
        description="binpack GPU pods, exact fit for multi-GPU pods, spread CPU-only pods; "
        "NVLink-aware GPU choice",
    ),
    replace=True,
)
for _name in ("binpack", "best-fit"):
    register_profile(
        _name,
        ProfileSpec(
            scores={"most-allocated": 10, "failover": 100, "topology": 20, "topology-frag": 2},
            fill="pack",
            chooser="topology",
            description="most-allocated, packed; NVLink-aware GPU choice",
        ),
        replace=True,
    )
register_profile(
    "spread",
    ProfileSpec(
        scores={"least-allocated": 10, "failover": 100},
        fill="spread",
        description="least-allocated, one per node",
    ),
    replace=True,
)
register_profile(
    "first-fit",
    ProfileSpec(scores={"first-fit": 10}, fill="pack", description="first node that fits"),
    replace=True,
)
register_profile(
    "random",
    ProfileSpec(scores={"random": 10}, fill="pack", description="a random node that fits"),
    replace=True,
)


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
) -> Profile:
    """The profile `name` with score `weights` overriding its own; ValueError names unknown plugins."""
    spec = PROFILES.get(name)
    if spec is None:
        raise ValueError(f"unknown scheduler profile {name!r}; known: {', '.join(sorted(PROFILES))}")
    args = args or {}
    merged = dict(spec.scores)
    for plugin, weight in (weights or {}).items():
        if plugin not in SCORES:
            raise ValueError(
                f"unknown score plugin {plugin!r} in scheduler.plugins; known: {', '.join(sorted(SCORES))}"
            )
        if weight < 0:
            raise ValueError(f"scheduler.plugins.{plugin}: weight must not be negative, got {weight}")
        merged[plugin] = weight
    filters = [_make(FILTERS, "filter plugin", f, args) for f in (spec.filters or DEFAULT_FILTERS)]
    scores = [(_make(SCORES, "score plugin", s, args), float(w)) for s, w in merged.items() if w > 0]
    profile = Profile(
        name=name,
        filters=filters,
        scores=scores,
        chooser=_make(CHOOSERS, "GPU chooser", spec.chooser, args),
        fill=spec.fill,
        rng=np.random.default_rng(seed),
    )
    link = getattr(profile.chooser, "link", None)
    if link is not None:  # a chooser that follows a score plugin's decisions (packing)
        link([plugin for plugin, _ in scores])
    return profile


def profile_from_settings(settings: Any) -> Profile:
    """The profile a `Settings` object configures (`scheduler.profile`, `.plugins`, `.plugin_args`)."""
    sched = settings.scheduler
    return build_profile(
        sched.profile,
        weights=sched.plugins,
        args=getattr(sched, "plugin_args", None) or {},
        seed=int(getattr(sched, "seed", 0) or 0),
    )
