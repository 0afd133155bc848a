"""`gpuyard fake-nodes`: fake GPU nodes and their kubelets on any Kubernetes API server."""

from gpuyard.kubecluster.fakenodes.kubelets import FakeNodes, connect

__all__ = ["FakeNodes", "connect"]
