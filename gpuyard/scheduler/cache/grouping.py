"""Gang groups: PodGroups placed together (`spec.gangGroup`, KubeDL's cross-job gangs).

A PodGroup lists other PodGroups (`ns/name`, or `name` in its own namespace); the listing need
not be mutual. :class:`GangGroups` keeps the reverse index (who lists whom) from the PodGroups
the core sees, so that any member finds the whole group, and :meth:`GangGroups.members`
collects the group for one placement attempt (the members missing or suspended are named, and
the group waits for them).
"""

from __future__ import annotations

from collections.abc import Callable

from gpuyard.apis.scheduling import PodGroup

__all__ = ["GangGroups", "ref_key"]

Key = tuple[str, str]


def ref_key(ref: str, namespace: str) -> Key:
    ns, _, name = ref.rpartition("/")
    return (ns or namespace, name)


class GangGroups:
    """Who lists whom, kept current as PodGroups are seen and forgotten."""

    def __init__(self) -> None:
        self.referenced_by: dict[Key, set[Key]] = {}  # member -> PodGroups listing it
        self.refs_of: dict[Key, frozenset[Key]] = {}  # PodGroup -> the members it lists

    def clear(self) -> None:
        self.referenced_by.clear()
        self.refs_of.clear()

    def seen(self, pg: PodGroup) -> None:
        key = (pg.metadata.namespace, pg.metadata.name)
        if pg.spec.gang_group or key in self.refs_of:
            self.track(key, frozenset(ref_key(r, key[0]) for r in pg.spec.gang_group))

    def track(self, key: Key, refs: frozenset[Key]) -> None:
        old = self.refs_of.get(key, frozenset())
        if old == refs:
            return
        for target in old - refs:
            listing = self.referenced_by.get(target)
            if listing is not None:
                listing.discard(key)
                if not listing:
                    del self.referenced_by[target]
        for target in refs - old:
            self.referenced_by.setdefault(target, set()).add(key)
        if refs:
            self.refs_of[key] = refs
        else:
            self.refs_of.pop(key, None)

    def forget(self, key: Key) -> None:
        self.track(key, frozenset())

    def members(
        self, pg: PodGroup, get: Callable[[Key], PodGroup | None]
    ) -> tuple[list[PodGroup], list[str]]:
        """The PodGroups placed together with `pg` (itself first), and the members still missing."""
        lead = (pg.metadata.namespace, pg.metadata.name)
        if not pg.spec.gang_group and not self.referenced_by.get(lead):
            return [pg], []
        members: list[PodGroup] = []
        missing: list[str] = []
        seen = {lead}
        todo = [lead]
        while todo:
            key = todo.pop(0)
            obj = pg if key == lead else get(key)
            if obj is None or obj.spec.suspend:
                missing.append(f"{key[0]}/{key[1]}" + (" (suspended)" if obj is not None else ""))
                continue
            members.append(obj)
            refs = [ref_key(r, key[0]) for r in obj.spec.gang_group]
            for back in self.referenced_by.get(key, ()):
                other = get(back)
                if other is not None and key in {ref_key(r, back[0]) for r in other.spec.gang_group}:
                    refs.append(back)
            for ref in refs:
                if ref not in seen:
                    seen.add(ref)
                    todo.append(ref)
        return members, missing
