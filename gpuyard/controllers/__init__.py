"""The unified job operator: one engine plus one small plugin per job kind (`workloads/`).

Each reconcile pass observes what a job owns (`observing.py`), plans the next step as plain data
(`planning.py`, pure) and applies it through the writer (`applying.py`); `reconciling.py` ties the
three together. Entry point for the runtime: `components(ctx)` returns the reconcilers to run
through `ControllerRunner`: :class:`JobReconciler`, watching every job kind, their pods,
reservations and PodGroups, and :class:`JobEventCleaner` (`eventcleaning.py`), which deletes the
Events of jobs that are gone, and :class:`CronReconciler` (`cronrunning.py`), which creates the
jobs of KubeDL's Crons on schedule. All write as the operator (`state.ownership.OPERATOR`).
KubeDL's models: :class:`ModelVersionCreator` (`modelversioning.py`) leaves a succeeded job's
ModelVersion, :class:`ModelVersionReconciler` (`imagebuilding.py`) its Model and image build; :class:`CacheReconciler` (`datasetcaching.py`) a job's dataset cache.
"""

from __future__ import annotations

from gpuyard.controllers.cronrunning import CronReconciler
from gpuyard.controllers.datasetcaching import CacheReconciler
from gpuyard.controllers.eventcleaning import JobEventCleaner
from gpuyard.controllers.imagebuilding import ModelVersionReconciler
from gpuyard.controllers.jobaddons import addon_reconcilers
from gpuyard.controllers.modelversioning import ModelVersionCreator
from gpuyard.controllers.reconciling import JobReconciler
from gpuyard.state.components import Reconciler, Runnable
from gpuyard.state.context import Context

__all__ = ["CronReconciler", "JobEventCleaner", "JobReconciler", "components"]


def _models(ctx: Context) -> list[Runnable | Reconciler]:
    return [
        ModelVersionCreator(ctx),
        ModelVersionReconciler(ctx),
        CacheReconciler(ctx),
        *addon_reconcilers(ctx),
    ]


def components(ctx: Context) -> list[Runnable | Reconciler]:
    """The job operator's reconcilers, for `gpuyard.platform.runtime`."""
    return [*_models(ctx), JobReconciler(ctx), JobEventCleaner(ctx), CronReconciler(ctx)]
