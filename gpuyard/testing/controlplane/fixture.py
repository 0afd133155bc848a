"""The pytest fixture `kube_control_plane`: one real control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler) for the whole test session, with an audit log.

    def test_version(kube_control_plane):
        subprocess.run(["kubectl", "--kubeconfig", kube_control_plane.admin_kubeconfig, "version"])

Without the binaries (`make k8s-bin`) the tests that use it are skipped, saying why; with
`GPUYARD_REQUIRE_CONTROL_PLANE=1` (CI) they fail instead, so a missing build never passes unnoticed.
Registered by gpuyard's pytest plugin (`gpuyard.testing`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from gpuyard.testing.controlplane.binaries import BinariesMissing, find_binaries

if TYPE_CHECKING:
    from gpuyard.testing.controlplane.running import ControlPlane

__all__ = ["kube_control_plane", "require_binaries"]

REQUIRE = "GPUYARD_REQUIRE_CONTROL_PLANE"


def require_binaries() -> None:
    """Skip the calling test (fail it under `GPUYARD_REQUIRE_CONTROL_PLANE=1`) when the real control
    plane's binaries are not built."""
    try:
        find_binaries()
    except BinariesMissing as exc:
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"{REQUIRE}=1 but {exc}", pytrace=False)
        pytest.skip(f"real control plane: {exc}")


@pytest.fixture(scope="session")
def kube_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A running real control plane, shared by the session. Nodes stay Ready without heartbeats for
    10 minutes (a test that needs the node lifecycle controller's eviction starts its own with
    short `Timings`)."""
    require_binaries()
    from gpuyard.testing.controlplane.running import ControlPlane, Timings  # needs `cryptography`

    plane = ControlPlane(
        data_dir=tmp_path_factory.mktemp("control-plane"),
        timings=Timings(node_monitor_grace_period=600, not_ready_toleration=300, unreachable_toleration=300),
        audit=True,
    )
    with plane:
        yield plane
