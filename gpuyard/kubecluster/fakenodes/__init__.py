"""`gpuyard fake-nodes`: fake GPU nodes and their kubelets on any Kubernetes API server.

:func:`connect` opens the API client the nodes speak through, loading the kubeconfig exactly as
the Kubernetes backend does (`gpuyard.kubecluster.client.load_configuration`: the given file, else
`$KUBECONFIG`, else the in-cluster service account, else `~/.kube/config`).
"""

from kubernetes_asyncio.client import ApiClient

from gpuyard.kubecluster.client import load_configuration
from gpuyard.kubecluster.fakenodes.kubelets import FakeNodes
from gpuyard.kubecluster.fakenodes.kubeletserver import KubeletEndpoint

__all__ = ["FakeNodes", "KubeletEndpoint", "connect"]


async def connect(kubeconfig: str | None, *, context: str | None = None) -> ApiClient:
    """An API client for the cluster of `kubeconfig` (its `context`, else the current one); raises
    :class:`~gpuyard.kubecluster.client.ApiError` naming the file when it cannot be loaded."""
    conf = await load_configuration(kubeconfig=kubeconfig, context=context, what="--kubeconfig")
    return ApiClient(configuration=conf)
