"""The real Kubernetes control plane for tests and `gpuyard control-plane`: binaries built by
`make k8s-bin` (`binaries`), certificates (`certs`), the processes (`running.ControlPlane`) and the
pytest fixture (`fixture.kube_control_plane`). See docs/kubernetes-testing.md.

Only `binaries` is imported here: `running` and `certs` need `cryptography` (the `kubernetes`
extra), which gpuyard's pytest plugin must not require.
"""

from gpuyard.testing.controlplane.binaries import (
    KUBE_VERSION,
    Binaries,
    BinariesMissing,
    default_bin_dir,
    find_binaries,
)

__all__ = ["KUBE_VERSION", "Binaries", "BinariesMissing", "default_bin_dir", "find_binaries"]
