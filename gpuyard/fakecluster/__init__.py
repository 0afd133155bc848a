"""The in-memory fake cluster: scenario nodes, a simulated kubelet on the clock, fault injection.

The embedded default backend, used by `gpuyard demo`, simulations and users' test suites. Only
the backend factory (`gpuyard.platform.backends`) builds it; everything else sees the
`ClusterBackend` protocol. The scenario it runs is described in `gpuyard.devices.scenarios`.
"""

from gpuyard.fakecluster.cluster import FakeCluster

__all__ = ["FakeCluster"]
