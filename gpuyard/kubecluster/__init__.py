"""The Kubernetes backend: gpuyard over a real (or test) Kubernetes API server.

The only package that imports `kubernetes_asyncio`; only the backend factory
(`gpuyard.platform.backends`) builds it. `client.py` is the REST layer, `informing.py` keeps
the store (the cache) current by LIST + WATCH, `writing.py` is the write path (create + bind,
PUT, status PATCH, DELETE), `nodes.py` the node model (foreign pods' capacity, topology, lost
nodes), `leading.py` the Lease election, and `cluster.py` the `ClusterBackend` that runs them.
"""

from gpuyard.kubecluster.cluster import KubeCluster

__all__ = ["KubeCluster"]
