"""Which kinds the store knows, and which of them are journaled (platform-owned).

Other packages add their kinds here as they land (jobs, quotas, queues, resource classes,
node topologies); the store needs only the model class of each.
"""

from __future__ import annotations

from gpuyard.apis.addons import ADDON_KINDS
from gpuyard.apis.caches import CACHE_KINDS
from gpuyard.apis.core import ConfigMap, Event, Node, Pod, Service
from gpuyard.apis.crons import CRON_KINDS
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.disruption import PDB_KINDS
from gpuyard.apis.gangs import GangPodGroup
from gpuyard.apis.jobkinds import JOB_KINDS
from gpuyard.apis.meta import Resource
from gpuyard.apis.models import MODEL_KINDS
from gpuyard.apis.priorityclasses import PRIORITY_CLASS_KINDS
from gpuyard.apis.quotakinds import QUOTA_KINDS
from gpuyard.apis.resourceclasses import RESOURCE_CLASS_KINDS
from gpuyard.apis.scheduling import PodGroup, Reservation
from gpuyard.state.store import Store

__all__ = ["CORE_KINDS", "JOURNALED_KINDS", "register_kinds"]

# Kinds the platform owns in fake mode: a restart must find them again.
JOURNALED_KINDS: list[type[Resource]] = [
    Node,
    NodeTopology,
    Pod,
    PodGroup,
    Reservation,
    GangPodGroup,  # delegate mode: the gang scheduler's PodGroup (apis/gangs.py)
    *JOB_KINDS,
    *RESOURCE_CLASS_KINDS,
    *PRIORITY_CLASS_KINDS,
    *(cls for cls, _ in QUOTA_KINDS),
    *(cls for cls, _ in PDB_KINDS),
    *MODEL_KINDS,  # KubeDL's Model and ModelVersion
    *CRON_KINDS,
]
# Kinds that are rebuilt from the others or are only informational.
CORE_KINDS: list[type[Resource]] = [*CACHE_KINDS, ConfigMap, Service, Event, *ADDON_KINDS]


def register_kinds(store: Store, *, extra: list[tuple[type[Resource], bool]] | None = None) -> None:
    for cls in JOURNALED_KINDS:
        store.register(cls, journaled=True)
    for cls in CORE_KINDS:
        store.register(cls)
    for cls, journaled in extra or []:
        store.register(cls, journaled=journaled)
