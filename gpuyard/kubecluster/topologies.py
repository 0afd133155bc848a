"""The node agent's NodeTopology, written straight to a Kubernetes API server (`gpuyard agent --kubeconfig`).

On a cluster the NodeTopology custom resource is the node's device inventory: the agent owns it (one
writer per node), gpuyard's informers read it. :class:`KubeTopologySink` is the agent's
:class:`~gpuyard.devices.agent.running.TopologySink` for that: it creates the object, or replaces it
with the stored resourceVersion (a 409 from a concurrent write is read again and retried once), and
turns every failure into a :class:`~gpuyard.devices.agent.running.SinkError` naming the server, so
the agent logs one line and retries with its backoff. Its writes carry the agent's identity
(`fieldManager: gpuyard-node-agent`, `state.ownership.NODE_AGENT`). Reached through
`platform.backends`.
"""

from __future__ import annotations

from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.resources import resource_for
from gpuyard.devices.agent.running import SinkError
from gpuyard.kubecluster.client import ApiError, KubeClient
from gpuyard.state.ownership import NODE_AGENT
from gpuyard.state.store import AlreadyExists, Conflict, NotFound
from gpuyard.state.writing import acting_as

__all__ = ["KubeTopologySink"]

RESOURCE = resource_for("NodeTopology")


class KubeTopologySink:
    """Create or replace this node's NodeTopology on the API server (module docstring)."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client

    @classmethod
    async def connect(cls, *, kubeconfig: str | None, context: str | None = None) -> KubeTopologySink:
        return cls(await KubeClient.connect(kubeconfig=kubeconfig, context=context))

    async def put(self, topology: NodeTopology) -> None:
        with acting_as(NODE_AGENT):
            await self._put(topology)

    async def _put(self, topology: NodeTopology) -> None:
        body = topology.to_dict()
        body["metadata"] = {
            "name": topology.metadata.name,
            "labels": dict(topology.metadata.labels),
            "annotations": dict(topology.metadata.annotations),
        }
        try:
            for _ in range(2):  # a concurrent write (409) is read again once
                try:
                    current = await self.client.get(RESOURCE, "", topology.metadata.name)
                except NotFound:
                    try:
                        await self.client.create(RESOURCE, body)
                        return
                    except AlreadyExists:
                        continue
                    except NotFound:  # the collection itself is missing
                        raise SinkError(
                            f"{self.client.host}: the {RESOURCE.crd_name} CRD is not installed "
                            "(gpuyard install --print --crds-only | kubectl apply -f -)"
                        ) from None
                body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                try:
                    await self.client.replace(RESOURCE, body)
                    return
                except Conflict:
                    continue
            raise SinkError(f"{self.client.host}: NodeTopology/{topology.metadata.name} kept changing (409)")
        except ApiError as exc:
            raise SinkError(
                f"{self.client.host}: writing NodeTopology/{topology.metadata.name}: {exc}"
            ) from exc

    async def aclose(self) -> None:
        await self.client.close()
