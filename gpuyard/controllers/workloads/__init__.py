"""Workload plugins: one small module per job kind, registered in `registry.py`."""

from gpuyard.controllers.workloads.base import JobView, PodOutcome, Wiring, WorkloadPlugin
from gpuyard.controllers.workloads.registry import PLUGINS, plugin_for, register

__all__ = ["PLUGINS", "JobView", "PodOutcome", "Wiring", "WorkloadPlugin", "plugin_for", "register"]
