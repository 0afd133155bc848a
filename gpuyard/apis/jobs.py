"""Training job kinds (KubeDL `training.kubedl.io/v1alpha1` and Kubeflow `kubeflow.org/v1`).

Filled in by the job operator; `JOB_KINDS` lists every job model class the store must know.
"""

from __future__ import annotations

from gpuyard.apis.meta import Resource

JOB_KINDS: list[type[Resource]] = []
