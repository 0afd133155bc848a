"""ResourceClass (`gpuyard.io/v1alpha1`): GPU types selected by device properties.

Filled in by the scheduler; `RESOURCE_CLASS_KINDS` lists the model classes the store must know.
"""

from __future__ import annotations

from gpuyard.apis.meta import Resource

RESOURCE_CLASS_KINDS: list[type[Resource]] = []
