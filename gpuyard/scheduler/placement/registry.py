"""`PluginRegistry`: the filters, scores, GPU choosers and profiles a profile may be built from.

A registry is a plain value: nothing is registered by importing a module. The built-in plugins
and profiles are listed in one place, `profiles.builtin_registry()`; a user's own plugins go into
a registry of their own (or the default user registry, `profiles.register_*`), and
`profiles.build_profile(..., registry=...)` assembles a profile from one.

A name is registered once per registry: registering it again (or merging two registries that
both have it) raises :class:`DuplicatePluginError` naming the plugin. There is no "replace".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal

from gpuyard.scheduler.placement.framework import ProfileSpec

__all__ = ["DuplicatePluginError", "PluginFactory", "PluginKind", "PluginRegistry"]

PluginFactory = Callable[[Mapping[str, Any]], Any]
"""Makes one plugin from its arguments (`settings.scheduler.plugin_args[name]`, {} by default)."""

PluginKind = Literal["filter plugin", "score plugin", "GPU chooser", "profile"]


class DuplicatePluginError(ValueError):
    """A name registered twice in one registry (or in both of two merged registries)."""

    def __init__(self, kind: PluginKind, name: str, where: str = "already registered") -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"{kind} {name!r} is {where}; a name is registered once: choose another name")


class PluginRegistry:
    """Filter, score and GPU-chooser factories and profile specs, by name.

    `label` names the registry in errors ("built-in", "user"). Iterate the tables through the
    read-only views `filters`, `scores`, `choosers`, `profiles`.
    """

    __slots__ = ("_choosers", "_filters", "_profiles", "_scores", "label")

    def __init__(self, label: str = "") -> None:
        self.label = label
        self._filters: dict[str, PluginFactory] = {}
        self._scores: dict[str, PluginFactory] = {}
        self._choosers: dict[str, PluginFactory] = {}
        self._profiles: dict[str, ProfileSpec] = {}

    # --- registering ---------------------------------------------------------------------------

    def _tables(self) -> list[tuple[PluginKind, dict[str, Any]]]:
        return [
            ("filter plugin", self._filters),
            ("score plugin", self._scores),
            ("GPU chooser", self._choosers),
            ("profile", self._profiles),
        ]

    def _add(self, table: dict[str, Any], kind: PluginKind, name: str, value: Any) -> None:
        if not name:
            raise ValueError(f"a {kind} needs a non-empty name, got {name!r}")
        if name in table:
            where = f"already registered in the {self.label} registry" if self.label else "already registered"
            raise DuplicatePluginError(kind, name, where)
        table[name] = value

    def register_filter(self, name: str, factory: PluginFactory) -> None:
        """Add filter plugin `name`, made by `factory(args)`; a name already here is refused."""
        self._add(self._filters, "filter plugin", name, factory)

    def register_score(self, name: str, factory: PluginFactory) -> None:
        """Add score plugin `name`, made by `factory(args)`; a name already here is refused."""
        self._add(self._scores, "score plugin", name, factory)

    def register_chooser(self, name: str, factory: PluginFactory) -> None:
        """Add GPU chooser `name`, made by `factory(args)`; a name already here is refused."""
        self._add(self._choosers, "GPU chooser", name, factory)

    def register_profile(self, name: str, spec: ProfileSpec) -> None:
        """Add profile `name`; a name already here is refused."""
        self._add(self._profiles, "profile", name, spec)

    # --- reading -------------------------------------------------------------------------------

    @property
    def filters(self) -> Mapping[str, PluginFactory]:
        return MappingProxyType(self._filters)

    @property
    def scores(self) -> Mapping[str, PluginFactory]:
        return MappingProxyType(self._scores)

    @property
    def choosers(self) -> Mapping[str, PluginFactory]:
        return MappingProxyType(self._choosers)

    @property
    def profiles(self) -> Mapping[str, ProfileSpec]:
        return MappingProxyType(self._profiles)

    def __len__(self) -> int:
        return len(self._filters) + len(self._scores) + len(self._choosers) + len(self._profiles)

    def __repr__(self) -> str:
        return (
            f"PluginRegistry({self.label!r}: {len(self._filters)} filters, {len(self._scores)} scores, "
            f"{len(self._choosers)} choosers, {len(self._profiles)} profiles)"
        )

    # --- combining -----------------------------------------------------------------------------

    def merged(self, *others: PluginRegistry, label: str = "") -> PluginRegistry:
        """A new registry holding this one's entries and those of `others`; a name two of them
        register is refused (DuplicatePluginError naming it and both registries)."""
        out = PluginRegistry(label or self.label)
        origin: dict[tuple[PluginKind, str], str] = {}
        for reg in (self, *others):
            for (kind, mine), (_, theirs) in zip(out._tables(), reg._tables(), strict=True):
                for name, value in theirs.items():
                    if name in mine:
                        first = origin[kind, name] or "another"
                        raise DuplicatePluginError(
                            kind,
                            name,
                            f"registered in both the {first} and the {reg.label or 'other'} registry",
                        )
                    mine[name] = value
                    origin[kind, name] = reg.label
        return out
