"""The plugin registry: built-ins listed in one function, user plugins added explicitly, a name
registered once, nothing registered by importing a module."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import gpuyard.scheduler as scheduler
from gpuyard.scheduler.gangs.outcomes import Placement
from gpuyard.scheduler.placement import profiles
from gpuyard.scheduler.placement.filters import DEFAULT_FILTERS
from gpuyard.scheduler.placement.framework import ProfileSpec
from gpuyard.scheduler.placement.profiles import build_profile, builtin_registry, default_registry
from gpuyard.scheduler.placement.registry import DuplicatePluginError, PluginRegistry
from tests.unit.scheduler.helpers import make_node, place_one, podgroup, role, snap


@pytest.fixture
def user_plugins(monkeypatch: pytest.MonkeyPatch) -> PluginRegistry:
    """A fresh default user registry for the test (the module's own stays empty)."""
    fresh = PluginRegistry("user")
    monkeypatch.setattr(profiles, "USER_PLUGINS", fresh)
    return fresh


class NotOn:
    """A filter plugin: keeps pods off the node named in its arguments."""

    name = "not-on"

    def __init__(self, node: str) -> None:
        self.node = node

    def filter(self, state: Any, shape: Any) -> np.ndarray:
        names = state.snapshot.names  # may be shorter than the rows
        return np.array([i >= len(names) or names[i] != self.node for i in range(state.snapshot.n)])

    def explain(self, state: Any, shape: Any, failed: np.ndarray) -> str:
        return f"{int(failed.sum())} node is {self.node}"


class LastNode:
    """A score plugin: the highest row wins."""

    name = "last-node"

    def score(self, state: Any, shape: Any, nodes: Any, take: np.ndarray) -> np.ndarray:
        return np.arange(state.snapshot.n, dtype=np.float64)[nodes]


def test_the_builtins_are_all_there() -> None:
    reg = builtin_registry()
    assert set(reg.profiles) == {"default", "binpack", "best-fit", "spread", "first-fit", "random", "packing"}
    assert set(DEFAULT_FILTERS) <= set(reg.filters)
    assert {"packing", "packing-gpu", "topology", "topology-frag", "cpu-stranding", "gpu-binpack"} <= set(
        reg.scores
    )
    assert set(reg.choosers) == {"lowest-index", "topology", "packing-gpus"}
    for name in reg.profiles:  # every built-in profile builds from the built-ins alone
        build_profile(name, registry=reg)
    assert builtin_registry() is not reg  # a fresh one each time: changing one changes no other


def test_a_name_registered_twice_is_refused_naming_the_plugin() -> None:
    reg = PluginRegistry("mine")
    reg.register_score("last-node", lambda args: LastNode())
    with pytest.raises(
        DuplicatePluginError, match="score plugin 'last-node' is already registered in the mine"
    ):
        reg.register_score("last-node", lambda args: LastNode())
    reg.register_filter("last-node", lambda args: NotOn("a"))  # another kind: another table
    with pytest.raises(DuplicatePluginError, match="filter plugin 'node-ready'"):
        builtin_registry().register_filter("node-ready", lambda args: NotOn("a"))
    with pytest.raises(DuplicatePluginError, match="profile 'default'"):
        builtin_registry().register_profile("default", ProfileSpec(scores={"first-fit": 1}))


def test_merging_two_registries_that_share_a_name_is_refused() -> None:
    mine = PluginRegistry("mine")
    mine.register_chooser("topology", lambda args: None)
    with pytest.raises(
        DuplicatePluginError,
        match="GPU chooser 'topology' is registered in both the built-in and the mine registry",
    ):
        builtin_registry().merged(mine)


def test_the_user_registry_refuses_a_builtin_name_and_its_own_twice(user_plugins: PluginRegistry) -> None:
    with pytest.raises(DuplicatePluginError, match="score plugin 'packing' is a built-in"):
        scheduler.register_score("packing", lambda args: LastNode())
    assert len(user_plugins) == 0
    scheduler.register_score("last-node", lambda args: LastNode())
    with pytest.raises(
        DuplicatePluginError, match="score plugin 'last-node' is already registered in the user"
    ):
        scheduler.register_score("last-node", lambda args: LastNode())
    with pytest.raises(TypeError):
        scheduler.register_score("other", lambda args: LastNode(), replace=True)  # type: ignore[call-arg]


def test_a_user_plugin_registered_by_name_is_used_by_a_profile(user_plugins: PluginRegistry) -> None:
    scheduler.register_filter("not-on", lambda args: NotOn(**args))
    scheduler.register_score("last-node", lambda args: LastNode())
    scheduler.register_profile(
        "mine", ProfileSpec(scores={"last-node": 1}, filters=(*DEFAULT_FILTERS, "not-on"), fill="pack")
    )
    assert "mine" in default_registry().profiles and "default" in default_registry().profiles
    s = snap([make_node(n, gpus=8) for n in "abc"])
    one = place_one(s, podgroup("j", role(gpus=1)), profile="mine", args={"not-on": {"node": "c"}})
    assert isinstance(one, Placement)
    assert [p.node for p in one.pods] == ["b"]  # the last node, but not c
    # the configured profile of a Settings object finds it too
    settings = SimpleNamespace(
        scheduler=SimpleNamespace(profile="mine", plugins={}, plugin_args={"not-on": {"node": "b"}}, seed=0)
    )
    prof = profiles.profile_from_settings(settings)
    assert [type(f).__name__ for f in prof.filters][-1] == "NotOn"
    assert [type(p).__name__ for p, _ in prof.scores] == ["LastNode"]
    # the built-in profiles may weigh the user's score too
    assert "LastNode" in [
        type(p).__name__ for p, _ in build_profile("default", weights={"last-node": 5}).scores
    ]


def test_a_profile_is_built_from_the_registry_it_is_given(user_plugins: PluginRegistry) -> None:
    reg = builtin_registry()
    reg.register_score("last-node", lambda args: LastNode())
    reg.register_profile("last", ProfileSpec(scores={"last-node": 1}, fill="pack"))
    s = snap([make_node(n, gpus=8) for n in "abc"])
    placed = place_one(s, podgroup("j", role(gpus=1)), profile="last", registry=reg)
    assert isinstance(placed, Placement) and [p.node for p in placed.pods] == ["c"]
    with pytest.raises(ValueError, match="unknown scheduler profile 'last'"):
        build_profile("last")  # not in the default registry: `reg` is the test's own
    only = PluginRegistry("bare")
    only.register_profile("first", ProfileSpec(scores={"first-fit": 1}))
    with pytest.raises(
        ValueError, match="unknown filter plugin 'node-ready'"
    ):  # the built-ins are not implied
        build_profile("first", registry=only)


_IMPORT_EVERYTHING = """
import gc, importlib, pkgutil
import gpuyard.scheduler, gpuyard.scheduler.placement, gpuyard.sim.framework_placer
for info in pkgutil.walk_packages(gpuyard.scheduler.__path__, "gpuyard.scheduler."):
    importlib.import_module(info.name)
from gpuyard.scheduler.placement import profiles
from gpuyard.scheduler.placement.registry import PluginRegistry
live = [r for r in gc.get_objects() if isinstance(r, PluginRegistry)]
print("registries", [(r.label, len(r)) for r in live])
print("user", len(profiles.USER_PLUGINS))
print("builtins", sorted(profiles.builtin_registry().profiles))
"""


def test_importing_the_modules_registers_nothing() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_EVERYTHING], capture_output=True, text=True, check=True, timeout=120
    ).stdout.splitlines()
    assert out[0] == "registries [('user', 0)]"  # the one registry made at import: the empty user one
    assert out[1] == "user 0"
    assert out[2] == "builtins ['best-fit', 'binpack', 'default', 'first-fit', 'packing', 'random', 'spread']"
