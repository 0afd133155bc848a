"""Fixtures for the job operator's unit tests: an operator + tiny scheduler on a virtual clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest_asyncio

from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.scheduling import PodGroup
from gpuyard.controllers.observing import observe
from gpuyard.controllers.reconciling import JobReconciler, quiet
from gpuyard.state.clock import VirtualClock
from gpuyard.state.context import Context
from gpuyard.state.workqueues import ControllerRunner, ObjectKey
from tests.builders import make_node
from tests.unit.controllers.fakes import ScriptedBackend, TinyScheduler


class CheckedReconciler(JobReconciler):
    """The job operator, planning every pass it skips as settled anyway: the test fails if that
    plan would have written anything (the skip would have lost a write)."""

    def settled(self, key: ObjectKey, job: TrainingJob) -> bool:
        if not super().settled(key, job):
            return False
        observed = observe(self.store, job)
        decided = self.plan(job, observed)
        assert not decided.status and not decided.report.events and quiet(decided, observed), (
            f"{key}: skipped as settled, but planning it again writes {decided}"
        )
        self.checked += 1
        return True

    checked = 0


@dataclass
class OperatorEnv:
    ctx: Context
    backend: ScriptedBackend
    scheduler: TinyScheduler
    operator: CheckedReconciler

    @property
    def store(self):  # type: ignore[no-untyped-def]
        return self.ctx.store

    @property
    def clock(self) -> VirtualClock:
        assert isinstance(self.ctx.clock, VirtualClock)
        return self.ctx.clock

    async def settle(self, seconds: float = 0.01) -> None:
        await self.clock.advance(seconds)

    def submit(self, job: TrainingJob) -> TrainingJob:
        return self.store.create(job)

    def job(self, ns: str, name: str) -> TrainingJob:
        from gpuyard.apis.jobkinds import find_job

        found = find_job(self.store, ns, name)
        assert found is not None, f"job {ns}/{name} not found"
        return found

    def pods(self, ns: str) -> dict[str, object]:
        return {p.metadata.name: p for p in self.store.list("Pod", namespace=ns)}

    def pod_group(self, ns: str, name: str) -> PodGroup | None:
        return self.store.get("PodGroup", ns, name)  # type: ignore[return-value]

    def reservations(self, ns: str) -> dict[str, object]:
        return {r.metadata.name: r for r in self.store.list("Reservation", namespace=ns)}

    def events(self, ns: str, name: str) -> list[tuple[str, str]]:
        return [
            (e.reason, e.message)
            for e in self.store.list("Event", namespace=ns)
            if e.involved_object.get("name") == name
        ]  # type: ignore[attr-defined]


@pytest_asyncio.fixture
async def env() -> AsyncIterator[OperatorEnv]:
    ctx = Context.for_tests()
    for name in ("node-a", "node-b", "node-c"):
        ctx.store.create(make_node(name, gpus=8))
    backend = ScriptedBackend(ctx.store)
    ctx.backend = backend
    ctx.writer = backend.writer
    operator = CheckedReconciler(ctx)
    scheduler = TinyScheduler(ctx.store)
    runners = [
        ControllerRunner(operator, store=ctx.store, clock=ctx.clock),
        ControllerRunner(scheduler, store=ctx.store, clock=ctx.clock),
    ]
    tasks = [asyncio.create_task(r.run(), name=r.reconciler.name) for r in runners]
    try:
        yield OperatorEnv(ctx, backend, scheduler, operator)
        # ownership: the operator never writes Reservations, PodGroup status or pod status
        assert not backend.writer.foreign_writes()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        ctx.store.close()
