"""Which plugin handles which job kind: one registration per kind.

`plugin_for(kind)` is what the engine asks; `register(plugin)` is the one line a new kind adds
(see docs/adding-a-workload.md). Registering a kind the API does not declare is an error, so a
plugin can never be reached for objects the store cannot hold.
"""

from __future__ import annotations

from gpuyard.apis.jobkinds import KIND_INFO
from gpuyard.controllers.workloads.base import WorkloadPlugin
from gpuyard.controllers.workloads.elasticdl import ElasticDLPlugin
from gpuyard.controllers.workloads.jax import JAXPlugin
from gpuyard.controllers.workloads.mars import MarsPlugin
from gpuyard.controllers.workloads.mpi import MPIPlugin
from gpuyard.controllers.workloads.paddle import PaddlePlugin
from gpuyard.controllers.workloads.pytorch import PyTorchPlugin
from gpuyard.controllers.workloads.tensorflow import TensorFlowPlugin
from gpuyard.controllers.workloads.xdl import XDLPlugin
from gpuyard.controllers.workloads.xgboost import XGBoostPlugin

__all__ = ["PLUGINS", "UnknownWorkload", "plugin_for", "register"]

PLUGINS: dict[str, WorkloadPlugin] = {}


class UnknownWorkload(LookupError):
    """No plugin is registered for a job kind."""


def register(plugin: WorkloadPlugin) -> WorkloadPlugin:
    if plugin.kind not in KIND_INFO:
        raise ValueError(
            f"{type(plugin).__name__}: kind {plugin.kind!r} is not declared in gpuyard.apis.jobs.KIND_INFO"
        )
    PLUGINS[plugin.kind] = plugin
    return plugin


def plugin_for(kind: str) -> WorkloadPlugin:
    try:
        return PLUGINS[kind]
    except KeyError:
        raise UnknownWorkload(
            f"no workload plugin for kind {kind!r}; registered: {', '.join(sorted(PLUGINS))}"
        ) from None


for _plugin in (
    TensorFlowPlugin(),
    PyTorchPlugin(),
    XGBoostPlugin(),
    MPIPlugin(),
    MarsPlugin(),
    JAXPlugin(),
    PaddlePlugin(),
    XDLPlugin(),
    ElasticDLPlugin(),
):
    register(_plugin)
