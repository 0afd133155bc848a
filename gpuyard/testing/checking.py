"""Invariants checked while a test runs: after every scheduling cycle and whenever time settles.

:class:`InvariantWatch` attaches to an in-process :class:`~gpuyard.platform.runtime.Platform`
(the harness's :class:`~gpuyard.testing.cluster.Cluster` does it unless told not to): it wraps
the scheduler loop's `execute`, so once the decisions of each cycle are written it checks the
safety invariants of :mod:`gpuyard.platform.invariants` (no device, CPU, memory or port
over-allocated, versions monotonic, ...), and liveness at most every `LIVENESS_EVERY` virtual
seconds. When the harness has let the virtual clock run
everything due (`advance`, `run_until`, `submit`, `inject`, ...), it checks every invariant,
the settled ones too (owners alive, gangs at their minimum, quota within runtime), and liveness:
no job stays unplaced for more than 3 scheduling cycles and 5 virtual seconds while it fits now
(`gpuyard.scheduler.liveness`).

A violation is recorded, never raised inside the platform (that would only crash and restart
the scheduler); the harness raises it as an AssertionError at its next call, or when the
cluster stops. A test that breaks the store on purpose opts out with the
`gpuyard_no_invariants` marker (or `Cluster.launch(..., check_invariants=False)`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gpuyard.platform.invariants import InvariantChecker, Violation
from gpuyard.platform.runtime import Platform
from gpuyard.scheduler.decisions import Decision
from gpuyard.scheduler.running import SchedulerLoop

__all__ = ["MARKER", "InvariantViolation", "InvariantWatch", "checks_enabled", "set_checks_enabled"]

MARKER = "gpuyard_no_invariants"

_enabled = True  # the current test's default; the plugin sets it from the marker
LIVENESS_EVERY = 2.0
"""Virtual seconds between the liveness checks after cycles (a fresh scheduler each: not every
cycle); well under the rule's 5 s, so a job stuck past it is seen."""


def checks_enabled() -> bool:
    """Whether a cluster started now checks invariants by default (no opt-out marker)."""
    return _enabled


def set_checks_enabled(value: bool) -> None:
    global _enabled
    _enabled = value


class InvariantViolation(AssertionError):
    """The platform broke an invariant; the message lists each violation and when it was seen."""


class InvariantWatch:
    """Checks a platform's store after each scheduling cycle and on demand; see the module docstring."""

    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self.checker = InvariantChecker()
        self.violations: list[tuple[str, Violation]] = []
        self.cycles = 0
        self.cycle_versions = True
        """Whether the check after each cycle scans every object's version too (a long soak on a
        big cluster turns it off; the checks when time settles always do)."""
        self.raise_liveness = True
        """Whether a liveness violation fails the test (a soak that reports them turns it off;
        they are recorded all the same)."""
        self._reported = 0
        self._seen: set[tuple[str, str]] = set()
        self._live_at = float("-inf")  # when liveness was last checked (virtual seconds)
        self._wrapped: list[SchedulerLoop] = []
        for component in platform.components:
            owner = getattr(component.run, "__self__", None)
            if isinstance(owner, SchedulerLoop):
                self._wrap(owner)

    @property
    def attached(self) -> bool:
        """Whether a scheduler loop was found (its cycles are checked)."""
        return bool(self._wrapped)

    def _wrap(self, loop: SchedulerLoop) -> None:
        execute: Callable[[list[Decision]], Awaitable[None]] = loop.execute
        depth = 0

        async def checked(decisions: list[Decision]) -> None:
            nonlocal depth
            depth += 1
            try:
                await execute(decisions)
            finally:
                depth -= 1
            if depth == 0:
                self.cycles += 1
                self.check(
                    when=f"after scheduling cycle {self.cycles}", settled=False, versions=self.cycle_versions
                )
                if self.platform.clock.now() - self._live_at >= LIVENESS_EVERY:
                    self._liveness(when=f"after scheduling cycle {self.cycles}")

        setattr(loop, "execute", checked)  # noqa: B010 - an instance attribute shadows the method
        self._wrapped.append(loop)

    def check(self, *, when: str, settled: bool = True, versions: bool = True) -> list[Violation]:
        """Check now; record (once each) and return the violations found (liveness too when
        `settled`)."""
        found = self.checker.check(self.platform.store, settled=settled, versions=versions)
        self._record(when, found)
        if settled:
            found += self._liveness(when=when)
        return found

    def _liveness(self, *, when: str) -> list[Violation]:
        if not self._wrapped:
            return []
        state = self._wrapped[0].state
        clock = self.platform.clock
        self._live_at = clock.now()
        try:
            found = self.checker.check_liveness(
                self.platform.store,
                profile=state.profile,
                port_range=state.cache.port_range,
                cycle=self.cycles,
                now=self._live_at,
                utcnow=clock.utcnow(),
                claims=list(state.claims.holds.by_owner.values()),
            )
        except Exception:  # a test that breaks the scheduler on purpose breaks its fresh copy too
            return []
        self._record(when, found)
        return found

    def _record(self, when: str, found: list[Violation]) -> None:
        for v in found:
            key = (v.invariant, v.message)
            if key not in self._seen:
                self._seen.add(key)
                self.violations.append((when, v))

    def take(self) -> list[tuple[str, Violation]]:
        """The violations seen so far, handed over (not raised later)."""
        out, self.violations, self._reported = self.violations, [], 0
        return out

    def raise_new(self) -> None:
        """Raise InvariantViolation for the violations not yet raised."""
        __tracebackhide__ = True
        fresh = self.violations[self._reported :]
        self._reported = len(self.violations)
        if not self.raise_liveness:
            fresh = [(when, v) for when, v in fresh if v.family != "liveness"]
        if not fresh:
            return
        lines = [f"  {when}: {v}" for when, v in fresh]
        raise InvariantViolation(f"{len(fresh)} invariant violation(s):\n" + "\n".join(lines))

    def summary(self) -> dict[str, Any]:
        return {"cycles": self.cycles, "violations": [v.to_dict() for _, v in self.violations]}
