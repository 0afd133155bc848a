"""Fault injection of the test API server, from Python (`server.faults.fail_next(3)`) or over HTTP
(`POST /_gpuyard/faults` with one of the JSON bodies of `FaultRequest`, `GET /_gpuyard/faults` for the
current state). The faults model what a real control plane does to its clients: watch streams cut,
5xx answers, slowness, streams that hang (open, nothing sent, not even bookmarks), compaction (older
versions answer 410 Gone), and conflicts on writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from gpuyard.testing.apiserver.storage import Storage

__all__ = ["FaultRequest", "Faults", "RequestFault"]

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass
class RequestFault:
    """Answer the next `count` matching requests with `code`."""

    count: int
    code: int = 500
    path_prefix: str = ""
    verb: str | None = None

    def matches(self, path: str, verb: str) -> bool:
        return path.startswith(self.path_prefix) and (self.verb is None or self.verb == verb)


@dataclass
class Faults:
    """The faults in force; the HTTP layer consults it on every request."""

    storage: Storage
    failures: list[RequestFault] = field(default_factory=list)
    conflicts: int = 0
    delay: float = 0.0
    silent: bool = False
    dropped: int = 0  # watch streams ended by drop_watches, in total

    def drop_watches(self) -> int:
        """End every open watch stream now (clients see the stream close); the number ended."""
        n = self.storage.close_watchers()
        self.dropped += n
        return n

    def fail_next(
        self, count: int = 1, *, code: int = 500, path_prefix: str = "", verb: str | None = None
    ) -> None:
        """Answer the next `count` requests (under `path_prefix`, of `verb` when given) with `code`."""
        if verb is not None and verb not in VERBS:
            raise ValueError(f"verb: {verb!r} is not one of {', '.join(VERBS)}")
        self.failures.append(RequestFault(count, code, path_prefix, verb))

    def slow(self, seconds: float) -> None:
        """Delay every answer by `seconds` (0 to stop)."""
        self.delay = max(0.0, seconds)

    def go_silent(self, on: bool = True) -> None:
        """Open watch streams (and those opened while silent) send nothing more, not even bookmarks,
        and stay open until the client gives up; `go_silent(False)` lets new streams work again."""
        self.silent = on
        if on:
            for watcher in self.storage.watchers:
                watcher.silenced = True

    def compact(self) -> int:
        """Forget the event history: watches and paged lists from older versions answer 410 Gone."""
        return self.storage.compact()

    def conflict_next(self, count: int = 1) -> None:
        """Answer the next `count` writes (create/update/patch/delete) with 409 Conflict."""
        self.conflicts += count

    def clear(self) -> None:
        """No more injected failures, conflicts, delay or silence."""
        self.failures.clear()
        self.conflicts = 0
        self.delay = 0.0
        self.silent = False

    # --- consulted by the HTTP layer ------------------------------------------------------------

    def take_failure(self, path: str, verb: str) -> int | None:
        for fault in self.failures:
            if fault.matches(path, verb):
                fault.count -= 1
                if fault.count <= 0:
                    self.failures.remove(fault)
                return fault.code
        return None

    def take_conflict(self, verb: str) -> bool:
        if self.conflicts > 0 and verb in WRITE_VERBS:
            self.conflicts -= 1
            return True
        return False

    def state(self) -> dict[str, Any]:
        return {
            "failures": [vars(f) for f in self.failures],
            "conflicts": self.conflicts,
            "delay": self.delay,
            "silent": self.silent,
            "dropped": self.dropped,
            "openWatches": len(self.storage.watchers),
            "resourceVersion": str(self.storage.rv),
            "compactedAt": str(self.storage.compacted),
        }

    def apply(self, request: FaultRequest) -> dict[str, Any]:
        """Carry out one HTTP fault request; what it did."""
        spec = request.root
        if isinstance(spec, DropWatches):
            return {"dropped": self.drop_watches()}
        if isinstance(spec, Fail):
            self.fail_next(spec.count, code=spec.code, path_prefix=spec.path_prefix, verb=spec.verb)
            return {"failing": spec.count}
        if isinstance(spec, Slow):
            self.slow(spec.seconds)
            return {"delay": self.delay}
        if isinstance(spec, Silent):
            self.go_silent(spec.on)
            return {"silent": self.silent}
        if isinstance(spec, Compact):
            return {"compactedAt": str(self.compact())}
        if isinstance(spec, Conflict):
            self.conflict_next(spec.count)
            return {"conflicts": self.conflicts}
        self.clear()
        return {"cleared": True}


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DropWatches(_Spec):
    action: Literal["drop-watches"]


class Fail(_Spec):
    action: Literal["fail"]
    count: int = Field(1, ge=1)
    code: int = Field(500, ge=400, le=599)
    path_prefix: str = ""
    verb: (
        Literal["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"] | None
    ) = None


class Slow(_Spec):
    action: Literal["slow"]
    seconds: float = Field(ge=0, le=600)


class Silent(_Spec):
    action: Literal["silent"]
    on: bool = True


class Compact(_Spec):
    action: Literal["compact"]


class Conflict(_Spec):
    action: Literal["conflict"]
    count: int = Field(1, ge=1)


class Clear(_Spec):
    action: Literal["clear"]


FaultSpec = Annotated[
    DropWatches | Fail | Slow | Silent | Compact | Conflict | Clear, Field(discriminator="action")
]


class FaultRequest(RootModel[FaultSpec]):
    """The body of `POST /_gpuyard/faults`: `{"action": ...}` and that action's fields."""
