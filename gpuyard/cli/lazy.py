"""Command groups that import their commands only when one is run, and kubectl's resource names.

`gpuyard version` must not pay for the simulator, the platform or NumPy: the root group and the
`get` / `describe` / ... groups name each sub-command by `"module:attribute"` and import that
module the first time the command is looked up (`LazyGroup`). Commands added the ordinary way
(`add_command`, as the modules' `register(root)` functions do for tests that build their own root)
are found first.

Every group resolves kubectl's names for a resource: singular and plural (`job` / `jobs`) and
the short names Kubernetes has (`po`, `no`, `pc`), see `RESOURCE_ALIASES`.

This module imports nothing but click.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from typing import Any

import click

__all__ = ["RESOURCE_ALIASES", "LazyGroup", "canonical_resource"]

RESOURCE_ALIASES: Mapping[str, str] = {
    "job": "jobs",
    "pod": "pods",
    "po": "pods",
    "node": "nodes",
    "no": "nodes",
    "queue": "queues",
    "quota": "quotas",
    "elasticquota": "quotas",
    "elasticquotas": "quotas",
    "priorityclass": "priorityclasses",
    "pc": "priorityclasses",
    "resourceclass": "resourceclasses",
}
"""kubectl's other names of each resource -> the name gpuyard's commands use (plural)."""


def canonical_resource(name: str) -> str:
    """`job` -> `jobs`, `po` -> `pods`; a name without an alias as it is (lower-cased)."""
    lowered = name.lower()
    return RESOURCE_ALIASES.get(lowered, lowered)


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


class LazyGroup(click.Group):
    """A group whose commands are imported when first looked up, answering to resource aliases.

    `lazy` maps a command name to `"package.module:attribute"`. A name is looked up as given,
    then under its plural (`job` -> `jobs`) and, where the group has a singular command only (as
    `describe job`), under the singular of a plural (`jobs` -> `job`)."""

    def __init__(self, *args: Any, lazy: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy: dict[str, str] = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command, but not one whose module this installation lacks (help lists what runs)."""
        present = {name for name, target in self.lazy.items() if _module_exists(target.partition(":")[0])}
        return sorted(set(self.commands) | present)

    def _names(self, name: str) -> list[str]:
        plural = canonical_resource(name)
        singulars = [alias for alias, target in RESOURCE_ALIASES.items() if target == plural]
        return [name, plural, *singulars]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        for name in self._names(cmd_name):
            if name in self.commands:
                return self.commands[name]
            target = self.lazy.get(name)
            if target is not None:
                return self._load(name, target)
        return None

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        # kubectl's `get job/NAME` and `get jobs NAME` are handled by the command; here only the
        # name is resolved, so `gpuyard get job` runs `get jobs`.
        _, cmd, rest = super().resolve_command(ctx, args)
        return (cmd.name if cmd is not None else None), cmd, rest

    def _load(self, name: str, target: str) -> click.Command:
        module_name, _, attribute = target.partition(":")
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):  # pragma: no cover - a wrong table entry
            raise TypeError(f"{target} is not a click command")
        self.add_command(command, name)
        return command
