"""gpuyard's pytest plugin: test your job files, quotas and placement expectations on a fake cluster.

Active when gpuyard is installed (entry point `pytest11: gpuyard = gpuyard.testing`), or with
`pytest_plugins = ["gpuyard.testing"]` in a top-level `conftest.py` (both at once are fine).

    async def test_quad(gpuyard_cluster):
        c = await gpuyard_cluster(nodes=[("dgx1-v100", 2)], quotas="quotas.yaml")
        job = await c.submit("jobs/train.yaml")
        await c.run_until(job, "Running", timeout=120)
        c.assert_on_model(job, "V100")
        c.assert_nvlink_connected(job)

The fixture starts a whole platform in memory (fake cluster, job operator, scheduler) on a
virtual clock, with no network and no port, and stops it after the test. A scenario, manifest
or policy the validators reject fails the test with the validator's message (which file, which
document, which field), not a traceback from inside gpuyard. See docs/testing-your-jobs.md.

`fake_apiserver` starts a test Kubernetes API server instead, `kube_control_plane` the real control
plane built by `make k8s-bin` (docs/kubernetes-testing.md).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from gpuyard.testing.apiserver.fixture import RunningApiServer, fake_apiserver
from gpuyard.testing.checking import MARKER, InvariantViolation, set_checks_enabled
from gpuyard.testing.cluster import FAULTS, Cluster
from gpuyard.testing.controlplane.fixture import kube_control_plane
from gpuyard.testing.inputs import BadInput, nodes_scenario
from gpuyard.testing.observing import Explanation, JobPlacement, PodPlacement

__all__ = [
    "FAULTS",
    "BadInput",
    "Cluster",
    "ClusterFactory",
    "Explanation",
    "InvariantViolation",
    "JobPlacement",
    "PodPlacement",
    "RunningApiServer",
    "fake_apiserver",
    "gpuyard_cluster",
    "kube_control_plane",
    "nodes_scenario",
]

ClusterFactory = Callable[..., Awaitable[Cluster]]

# The names this module may be registered under: the entry point's and the module's own.
_PLUGIN_NAMES = ("gpuyard", __name__)


class _Alias:
    """Holds the other plugin name, so a second registration of this module is a no-op."""


def pytest_plugin_registered(plugin: object, plugin_name: str, manager: pytest.PytestPluginManager) -> None:
    """Installed (entry point `gpuyard`) *and* named in a conftest (`gpuyard.testing`): pluggy
    refuses one module under two names, so the first registration reserves the other name."""
    if plugin is not sys.modules[__name__]:
        return
    for name in _PLUGIN_NAMES:
        if name != plugin_name and manager.get_plugin(name) is None and not manager.is_blocked(name):
            manager.register(_Alias(), name)


def _fail(message: str) -> None:
    __tracebackhide__ = True
    pytest.fail(message, pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}: clusters started by this test do not check gpuyard's invariants "
        "(for tests that break the store on purpose)",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    """Bad input in a user's fixture: the validator's message, no traceback. Also sets whether
    the test's clusters check invariants (off with the `gpuyard_no_invariants` marker)."""
    set_checks_enabled(item.get_closest_marker(MARKER) is None)
    try:
        return (yield)
    except BadInput as exc:
        message = str(exc)
    _fail(message)  # outside the except block: no "during handling" chain in the report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """Bad input in a test body (`submit`, `inject`): the validator's message, no traceback."""
    try:
        return (yield)
    except BadInput as exc:
        message = str(exc)
    _fail(message)  # outside the except block: no "during handling" chain in the report


def _async_fixture(fn: Callable[[], AsyncIterator[ClusterFactory]]) -> object:
    """pytest-asyncio's fixture decorator, or pytest's where pytest-asyncio is not installed
    (the entry point must not break pytest without it)."""
    try:
        from pytest_asyncio import fixture
    except ImportError:  # pragma: no cover
        return pytest.fixture(fn)
    return fixture(fn)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Any:
    try:
        return (yield)
    finally:
        set_checks_enabled(True)


@_async_fixture
async def gpuyard_cluster() -> AsyncIterator[ClusterFactory]:
    """A factory: `await gpuyard_cluster(scenario_or_None, nodes=..., quotas=..., ...)` -> Cluster.

    Takes the arguments of :meth:`Cluster.launch`; every cluster it started is stopped after
    the test.
    """
    started: list[Cluster] = []

    async def start(scenario: Any = None, **kwargs: Any) -> Cluster:
        __tracebackhide__ = True
        message = ""
        try:
            cluster = await Cluster.launch(scenario, **kwargs)
        except BadInput as exc:
            message = str(exc)
        else:
            started.append(cluster)
            return cluster
        _fail(message)
        raise AssertionError(message)  # pragma: no cover - _fail raises

    try:
        yield start
    finally:
        for cluster in reversed(started):
            await cluster.stop()
