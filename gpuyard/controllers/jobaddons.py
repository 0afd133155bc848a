"""The reconcilers of what a job has beside its pods, for `components(ctx)`.

:class:`~gpuyard.controllers.tensorboards.TensorboardReconciler` (KubeDL's Tensorboard of a job),
:class:`~gpuyard.controllers.marsweb.MarsWebReconciler` (a MarsJob's web UI Ingresses) and
:class:`~gpuyard.controllers.autoscalers.ElasticAutoscalerReconciler` (a PyTorchJob's
HorizontalPodAutoscaler). All write as the operator (`state.ownership.OPERATOR`).
"""

from __future__ import annotations

from gpuyard.controllers.autoscalers import ElasticAutoscalerReconciler
from gpuyard.controllers.marsweb import MarsWebReconciler
from gpuyard.controllers.tensorboards import TensorboardReconciler
from gpuyard.state.components import Reconciler
from gpuyard.state.context import Context

__all__ = ["addon_reconcilers"]


def addon_reconcilers(ctx: Context) -> list[Reconciler]:
    return [TensorboardReconciler(ctx), MarsWebReconciler(ctx), ElasticAutoscalerReconciler(ctx)]
