"""The process: a `Platform` built from settings that runs every component under one TaskGroup.

Start-up order: validate config and backend settings (the factory in `platform/backends.py`
checks `backend.kind` and the fake cluster's scenario; nothing is written before all are valid),
open the journal and reload what it holds, build the backend (its writer becomes `ctx.writer`,
the one write path) and the components, then run them all as supervised tasks. A component
that crashes is logged and restarted with backoff (tenacity: 0.2 s doubling to 30 s, back to
the start after a healthy minute); a fatal component's crash stops the platform; a component
that returns is logged and left stopped. `stop()` (SIGINT/SIGTERM in `serve`) cancels
everything, flushes the journal and returns within a few seconds with no task left running.

Components come from each package's `components(ctx)`: runnables and reconcilers
(`gpuyard.state.components`), each saying whether it `needs_leader` (today all of them do: the
operator's and the scheduler's components all write).

Kubernetes mode (`backend.kind: kubernetes`): there is no journal (the API server is the store
of record; the store is the backend's informer cache). Where the backend has a `leadership`
(several replicas, one Lease), the backend, metrics and HTTP API run on every replica, and the
components that need the lead start once this replica leads; a replica that loses the lead
stops (as kube-scheduler exits) and is restarted as a standby, so a reconciler never writes
from a stale view. On every backend the components that need the lead start only once the
backend has synced (every informer listed; the fake cluster loaded), so no
reconciler places or creates from a partial cache. While this replica does not lead, the HTTP API's
mutating routes answer 503 naming the leader; reads and the dashboard work. `/readyz` is ready
once the backend has synced and while it is healthy (every watch open).
"""

from __future__ import annotations

import asyncio
import cProfile
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_never

from gpuyard.devices.scenarios import Scenario
from gpuyard.platform.api.app import make_app
from gpuyard.platform.api.connections import GuardedRunner
from gpuyard.platform.api.errors import error_response
from gpuyard.platform.backends import build_backend, plan_backend
from gpuyard.platform.cluster_metrics import register_cluster_metrics
from gpuyard.platform.metrics import CoreMetrics
from gpuyard.state.clock import Clock, RealClock, VirtualClock
from gpuyard.state.components import ComponentFactory, Reconciler, Runnable
from gpuyard.state.config import Settings
from gpuyard.state.context import Context
from gpuyard.state.journal import Journal
from gpuyard.state.kinds import register_kinds
from gpuyard.state.store import Store, tune_gc
from gpuyard.state.workqueues import ControllerRunner
from gpuyard.state.writing import Writer

__all__ = ["Component", "Platform", "supervise"]

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class Component:
    """A named long-running coroutine factory, as the runtime supervises it."""

    name: str
    run: Callable[[], Awaitable[Any]]
    restart: bool = True
    needs_leader: bool = False  # runs only while this replica leads (components that write)


class _Backoff:
    """tenacity wait: 0.2 s doubling up to `max_backoff`, from the start again after a run
    longer than `healthy_after` seconds (a component that crashes once a day restarts at once)."""

    def __init__(self, *, max_backoff: float, healthy_after: float, now: Callable[[], float]) -> None:
        self.max_backoff = max_backoff
        self.healthy_after = healthy_after
        self.now = now
        self.failures = 0
        self.started = now()  # when the current run began

    def __call__(self, state: RetryCallState) -> float:
        ran = self.now() - self.started
        self.failures = 0 if ran > self.healthy_after else self.failures + 1
        return min(self.max_backoff, 0.1 * 2.0**self.failures)


async def supervise(
    component: Component,
    *,
    clock: Clock,
    max_backoff: float = 30.0,
    healthy_after: float = 60.0,
    now: Callable[[], float] = time.monotonic,
) -> None:
    """Run a component; on an unexpected exception log it and restart with backoff.

    A component with `restart=False` is fatal: its exception ends the platform. Backoff waits
    on `clock`; how long a run lasted is measured with `now` (real time by default).
    """
    if not component.restart:
        await component.run()  # a fatal component (the HTTP listener) stops the platform
        log.info("component.exited", component=component.name)
        return
    backoff = _Backoff(max_backoff=max_backoff, healthy_after=healthy_after, now=now)

    def crashed(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        delay = state.next_action.sleep if state.next_action is not None else 0.0
        log.error("component.crashed", component=component.name, restart_in=round(delay, 2), exc_info=exc)

    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(Exception),  # never CancelledError: cancelling stops it
        wait=backoff,
        stop=stop_never,
        sleep=clock.sleep,
        before_sleep=crashed,
        reraise=True,
    ):
        with attempt:
            backoff.started = now()
            await component.run()
    log.info("component.exited", component=component.name)


def _component_factories() -> list[ComponentFactory]:
    """Packages that contribute components: each exposes `components(ctx)`, a list of
    runnables and reconcilers (`gpuyard.state.components`)."""
    from gpuyard.controllers import components as operator_components
    from gpuyard.scheduler import components as scheduler_components

    return [operator_components, scheduler_components]


def _leader_middleware(not_leader: Callable[[], str | None]) -> Any:
    """503 (JSON error body) for mutating requests while this replica does not lead."""

    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            why = not_leader()
            if why is not None:
                return error_response(503, why)
        response: web.StreamResponse = await handler(request)
        return response

    return middleware


class Platform:
    """Everything gpuyard runs in one process, over one backend."""

    def __init__(
        self,
        settings: Settings,
        *,
        scenario: Scenario | None = None,
        clock: Clock | None = None,
        serve_http: bool = True,
        drive_clock: bool | None = None,
    ) -> None:
        """`drive_clock`: run a virtual clock automatically (default: when serving HTTP);
        tests and simulations leave it off and move time with `advance` / `run_until`."""
        self.settings = settings
        # 1. validate everything before anything is written
        plan = plan_backend(settings, scenario=scenario)
        self.clock: Clock = clock or (VirtualClock() if settings.backend.clock == "virtual" else RealClock())
        store = Store(now=self.clock.utcnow)
        register_kinds(store)
        self.ctx = Context(store=store, clock=self.clock, settings=settings)
        # 2. the journal, only now
        self.journal: Journal | None = None
        if settings.backend.data_dir and plan.kind != "kubernetes":
            data_dir = Path(settings.backend.data_dir)
            data_dir.mkdir(parents=True, exist_ok=True)
            self.journal = Journal(data_dir / "journal.db")
            loaded = self.journal.load_into(store)
            store.attach_journal(self.journal)
            self.ctx.journal = self.journal
            log.info(
                "journal.loaded",
                path=str(self.journal.path),
                objects=loaded,
                resource_version=store.resource_version,
            )
        tune_gc()
        self.backend = build_backend(self.ctx, plan)  # also ctx.backend and ctx.writer
        self.metrics = CoreMetrics(self.ctx.registry, store)
        register_cluster_metrics(self.ctx.registry, store)
        self.serve_http = serve_http
        self.drive_clock = serve_http if drive_clock is None else drive_clock
        self.components: list[Component] = self._build_components()
        self._stop = asyncio.Event()
        self.site: web.TCPSite | None = None
        self.serving = asyncio.Event()  # set once the HTTP server listens
        self.lost_leadership = False  # set when this replica led and lost the lead (it then stops)

    @property
    def store(self) -> Store:
        return self.ctx.store

    @property
    def writer(self) -> Writer:
        """The one write path (the backend's writer)."""
        return self.backend.writer

    def _build_components(self) -> list[Component]:
        components = [Component("backend", self.backend.run)]
        journal = self.journal
        if journal is not None:
            components.append(
                Component("journal", lambda: journal.run(interval=self.settings.backend.journal_interval))
            )
        if isinstance(self.clock, VirtualClock) and self.drive_clock:
            components.append(Component("virtual-clock", self.clock.run))
        components.append(Component("metrics", self.metrics.run))
        for factory in _component_factories():
            components.extend(self._as_component(item) for item in factory(self.ctx))
        return components

    def _as_component(self, item: Runnable | Reconciler) -> Component:
        """A reconciler runs through a `ControllerRunner`, a runnable as it is; either runs only
        while this replica leads when it `needs_leader`."""
        if isinstance(item, Reconciler):
            runner = ControllerRunner(item, store=self.ctx.store, clock=self.clock, metrics=self.metrics)
            return Component(item.name, runner.run, needs_leader=item.needs_leader)
        return Component(item.name, item.run, needs_leader=item.needs_leader)

    def add_component(self, item: Runnable | Reconciler) -> None:
        """Add a runnable or a reconciler before `run()` (tests and embedders)."""
        self.components.append(self._as_component(item))

    def ready(self) -> bool:
        return self.backend.synced.is_set() and self.backend.healthy()

    def not_leader(self) -> str | None:
        """Why this replica must not take writes now (None: it leads, or there is one replica)."""
        leadership = self.backend.leadership
        if leadership is None or leadership.is_leader():
            return None
        return f"not the leader; the leader is {leadership.holder or 'not elected yet'}"

    async def _serve_http(self) -> None:
        app = make_app(self.ctx, ready=self.ready)
        app.middlewares.append(_leader_middleware(self.not_leader))
        runner = GuardedRunner(  # slow clients cut off, open connections per address capped
            app, server=self.settings.server, handle_signals=False, access_log=None, shutdown_timeout=1.0
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.settings.server.host, self.settings.server.port)
            await site.start()
            self.site = site
            self.serving.set()
            log.info("http.listening", url=self.url)
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    @property
    def url(self) -> str:
        host, port = self.settings.server.host, self.settings.server.port
        if self.site is not None and self.site._server is not None:  # the bound port when 0 was asked
            sockets = getattr(self.site._server, "sockets", None) or []
            if sockets:
                port = sockets[0].getsockname()[1]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self._stop.set()

    async def _lead(self, components: list[Component]) -> None:
        """Wait for the backend's first full sync (no reconciler decides from a partial cache, as
        client-go's controllers wait for their caches), then, where the backend elects a leader,
        to lead; run the leader-only components until the lead is lost, then stop the platform (a
        process that lost the lease never writes from its old view again)."""
        await self.backend.synced.wait()
        leadership = self.backend.leadership
        if leadership is None:
            async with asyncio.TaskGroup() as tg:
                for c in components:
                    tg.create_task(supervise(c, clock=self.clock), name=c.name)
            return
        await leadership.wait_leading()
        log.info("leader.started", components=[c.name for c in components])
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(supervise(c, clock=self.clock), name=c.name) for c in components]
            await leadership.wait_lost()
            for t in tasks:
                t.cancel()
        log.error("leader.lost_stopping")
        self.lost_leadership = True
        self.stop()

    async def run(self) -> None:
        """Run every component until `stop()`; then cancel them all and flush the journal."""
        comps = [c for c in self.components if not c.needs_leader]
        led = [c for c in self.components if c.needs_leader]
        if self.serve_http:
            comps.append(Component("http", self._serve_http, restart=False))
        if led:
            comps.append(Component("leader", lambda: self._lead(led), restart=False))
        _diagnose_loop(comps)
        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(supervise(c, clock=self.clock), name=c.name) for c in comps]
                await self._stop.wait()
                for t in tasks:
                    t.cancel()
        finally:
            self.ctx.store.close()
            if self.journal is not None:
                self.journal.close(issued=self.store.resource_version)
            log.info("platform.stopped")


def _diagnose_loop(comps: list[Component]) -> None:
    """Opt-in diagnosis of event-loop stalls, for load work (environment switches).

    `GPUYARD_SLOW_CALLBACK_MS=N`: asyncio debug mode, logging every callback that holds the loop
    for more than N ms (the `asyncio` logger names it). `GPUYARD_PROFILE=path`: cProfile of the
    loop thread, written to `path` every 2 s (a SIGKILLed server still leaves one behind).
    `GPUYARD_SLOW_GC_MS=N`: log every garbage collection that takes more than N ms.
    """
    gc_s = _seconds_from_env("GPUYARD_SLOW_GC_MS")
    if gc_s is not None:
        _log_slow_gc(gc_s)
    slow_s = _seconds_from_env("GPUYARD_SLOW_CALLBACK_MS")
    if slow_s is not None:
        loop = asyncio.get_running_loop()
        loop.set_debug(True)
        loop.slow_callback_duration = slow_s
        asyncio_log = logging.getLogger("asyncio")
        asyncio_log.setLevel(logging.WARNING)
        asyncio_log.addHandler(logging.StreamHandler())
    path = os.environ.get("GPUYARD_PROFILE")
    if path:
        profiler = cProfile.Profile()
        profiler.enable()

        async def dump() -> None:
            while True:
                await asyncio.sleep(2)
                profiler.dump_stats(path)  # stops the profiler: start it again
                profiler.enable()

        comps.append(Component("profile", dump, restart=False))


def _seconds_from_env(name: str) -> float | None:
    """A millisecond count from environment variable `name`, in seconds; None when unset."""
    raw = os.environ.get(name)
    if not raw:
        return None
    try:
        ms = float(raw)
    except ValueError:
        ms = -1.0
    if not ms >= 0:
        raise ValueError(f"{name}={raw!r}: expected a number of milliseconds >= 0")
    return ms / 1000


def _log_slow_gc(threshold: float) -> None:
    import gc

    started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        took = time.perf_counter() - started[0]
        if took > threshold:
            log.warning(
                "gc.slow",
                generation=info["generation"],
                ms=round(took * 1000, 1),
                collected=info["collected"],
            )

    gc.callbacks.append(on_gc)
